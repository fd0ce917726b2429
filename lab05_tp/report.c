/* lab05's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "jsonval.h"
#include "mem.h"
#include "theory.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void lab05_check(run_ctx *ctx, void *lab) {
    const lab05 *t = lab;
    run_check(ctx, !ctx->opt.experts, "--experts: expert tensor parallelism is not taught (lab01_dp and lab02_zero "
              "take --experts)");
    tp_check_degree(ctx, ctx->size, "-n");
    if (t->sequence_parallel) {
        run_check(ctx, ctx->size >= 2, "--sequence-parallel needs a tensor-parallel degree of at least 2 (-n %d: "
                  "one rank holds the whole sequence anyway)", ctx->size);
        tp_check_sequence_parallel(ctx, ctx->size, "-n");
    }
}

void lab05_predict(const run_ctx *ctx, void *lab, th_run *need) {
    const lab05 *t = lab;
    /* every rank the whole batch, 1/t of every layer */
    need->tp = ctx->size;
    need->dp = 1;
    need->tensor_parallel = 1;
    need->sequence_parallel = t->sequence_parallel;
}

/* The figures the lesson predicts (bytes are vb per value: 4 in fp32, 2 in
 * bf16), by theory/'s formulas (theory.h), the ones plan3d predicts with. */
typedef struct tp_figures {
    th_model tm;
    th_opts opts; /* as it runs */
    double vb;
    double act_bytes;            /* one all-reduce's payload */
    th_traffic tp_traffic;       /* 2L g's + 2L f's (full recomputation: the g's again); SP: each an all-gather +
                                  * a reduce-scatter */
    int collectives;             /* all-reduces, or all-gathers + reduce-scatters */
    int allreduces, per_layer;
    th_traffic partial_traffic;  /* SP: one all-reduce of the replicated tensors' partial gradients */
    double block_full;           /* all block weights, serial model */
    double sharded_full;         /* the 4 matrices + QKV, fc biases */
    double replicated, block_per_rank;
    double acts_formula;         /* this rank's, exact */
    th_acts_parts acts_parts;
    double acts_split_full;      /* activations split per layer, all ranks' */
} tp_figures;

static tp_figures figures(const run_ctx *ctx, int sequence_parallel) {
    const int B = ctx->opt.batch, T = ctx->opt.seq, L = ctx->opt.layers, C = ctx->opt.d_model, t = ctx->size;
    tp_figures f;
    f.tm = th_course_model(ctx->model.vocab, T, L, C, ctx->model.heads);
    f.opts = th_opts_run(t, sequence_parallel, ctx->model.recompute, g_precision == PREC_BF16);
    f.vb = (double)value_bytes();
    f.act_bytes = f.vb * B * T * C;
    f.tp_traffic = th_tp_traffic_run(L, 1, f.act_bytes, &f.opts);
    f.collectives = (int)f.tp_traffic.calls;
    f.allreduces = sequence_parallel ? 0 : f.collectives;
    f.per_layer = ctx->model.recompute == RECOMPUTE_FULL ? 6 : 4;
    f.partial_traffic = th_dp_traffic(f.vb * th_sp_partial_params(&f.tm, 0, L), sequence_parallel ? t : 1, 1);
    const th_params counts = th_param_counts(&f.tm);
    f.block_full = f.vb * L * counts.layer;
    f.sharded_full = f.vb * L * counts.layer_sharded;
    f.replicated = f.vb * (counts.total - L * counts.layer_sharded);
    f.block_per_rank = f.vb * L * (counts.layer - counts.layer_sharded + counts.layer_sharded / t);
    f.acts_formula = th_course_acts_bytes(&f.tm, &f.opts, 0, L, B);
    f.acts_parts = th_course_acts_parts(&f.tm, &f.opts, 0, L, B);
    /* activations split per layer: q,k,v (3NC), attention output (NC), the MLP's
     * two 4C-wide tensors (8NC) and the attention matrix (B*H*T*T) */
    f.acts_split_full = f.vb * L * (12.0 * B * T * C + (double)B * ctx->opt.heads * T * T);
    return f;
}

void lab05_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab05 *t = lab;
    const tp_figures f = figures(ctx, t->sequence_parallel);
    const char *values = g_precision == PREC_BF16 ? "bf16 values" : "floats";
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    snprintf(t->layout, sizeof t->layout, "tp=%d%s", ctx->size, t->sequence_parallel ? " sp" : "");
    if (t->sequence_parallel)
        snprintf(t->comm_formula_text, sizeof t->comm_formula_text, "%dL all-gathers + %dL reduce-scatters of "
                 "B*T*C %s, ring (t-1)/t each (= TP's all-reduces), + 1 all-reduce of the partial gradients",
                 f.per_layer, f.per_layer, values);
    else snprintf(t->comm_formula_text, sizeof t->comm_formula_text, "%dL all-reduces of B*T*C %s, ring 2(t-1)/t x "
                  "%d L B T C", f.per_layer, values, (int)f.vb * f.per_layer);
    r->layout = t->layout;
    r->comm_formula_bytes = f.tp_traffic.ring + f.partial_traffic.ring;
    r->comm_formula = t->comm_formula_text;
}

void lab05_print_split(const run_ctx *ctx, const lab05 *t) {
    if (t->tp.rank != 0) return;
    const tp_figures f = figures(ctx, t->sequence_parallel);
    char a[16], b[16], c[16];
    printf("tensor parallel: t=%d | per rank %d of %d heads, %d of %d MLP units | block weights %sB "
           "of %sB per rank | replicated %sB\n", t->tp.size, t->tl.heads, ctx->opt.heads, t->tl.hidden,
           4 * ctx->opt.d_model, human(f.block_per_rank, a), human(f.block_full, b), human(f.replicated, c));
    fflush(stdout);
}

/* --eval: the mean loss over the held-out batches, forward only, every rank on
 * the whole batch as in training. Its all-reduces stay out of the traffic
 * counts, so the record's per-step figures are the training's. */
typedef struct {
    const tp_hooks *th;
    comm *tp;
    const void *params;
    gpt_acts *acts;
    int B, T, *tokens, *targets;
} heldout_forward;

static double heldout_batch_loss(void *arg, const dataset *heldout, int b) {
    const heldout_forward *h = arg;
    data_batch(heldout, 0, b, 0, h->B, h->T, h->tokens, h->targets);
    gpt_acts_set_batch(h->acts, h->tokens, h->targets, h->T); /* SP: this rank's positions */
    gpt_forward_with(&h->th->tl->g, &h->th->hooks, h->params, h->acts);
    return lab05_mean_loss(h->th->tl, h->tp, h->acts);
}

double lab05_evaluate(run_ctx *ctx, void *lab) {
    lab05 *t = lab;
    heldout_forward h = {&t->th, &t->tp, t->ms.params, &t->acts, ctx->opt.batch, ctx->opt.seq, t->tokens, t->targets};
    int batches;
    const double sum =
        lab_heldout_sum(&ctx->data, ctx->opt.batch, ctx->opt.seq, &t->tp, heldout_batch_loss, &h, &batches);
    return sum / batches;
}

static uint64_t fnv1a(uint64_t h, const float *x, long n) {
    const unsigned char *p = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* A hash of the replicated tensors (embedding, LayerNorms, row-parallel biases,
 * head): these must stay bit-identical on every TP rank. */
static uint64_t replicated_hash(const tp_layout *tl, const float *params) {
    float *host = malloc((size_t)tl->total * sizeof(float));
    if (!host) die("out of host memory");
    mem_to_host(host, params, (size_t)tl->total * sizeof(float));
    uint64_t h = fnv1a(1469598103934665603ULL, host, tl->g.embed_size);
    for (int l = 0; l < tl->g.cfg.layers; l++)
        for (int i = 0; i < LAYER_NTENSORS; i++)
            if (!tl->sharded[i])
                h = fnv1a(h, host + tp_layer_offset(tl, l) + tl->layer[i].offset, tl->layer[i].rows * tl->layer[i].cols);
    h = fnv1a(h, host + tp_head_offset(tl), tl->g.head_size);
    free(host);
    return h;
}

/* Returns 1 if every rank holds the same replicated tensors. Collective. */
static int check_replicas_identical(comm *tp, const tp_layout *tl, const float *params) {
    uint64_t mine = replicated_hash(tl, params), *all = malloc(sizeof(uint64_t) * (size_t)tp->size);
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, tp->mpi);
    int same = 1;
    for (int r = 1; r < tp->size; r++) same &= all[r] == all[0];
    if (tp->rank == 0)
        printf("check-sync: replicated tensors %s the %d ranks\n",
               same ? "bit-identical on all of" : "DIFFER between", tp->size);
    free(all);
    return same;
}

int lab05_verify(run_ctx *ctx, void *lab) {
    (void)ctx;
    lab05 *t = lab;
    /* bf16: ms.params are their rounding */
    t->in_sync = t->check_sync ? check_replicas_identical(&t->tp, &t->tl, t->ms.master) : 1;
    return t->in_sync;
}

/* {"quadratic": q, "linear": l, "other": o} */
static json_t *bytes_by_kind(json_t *quadratic, json_t *linear, json_t *other) {
    json_t *o = json_object();
    if (!o) die("out of host memory");
    jsonval_set(o, "quadratic", quadratic);
    jsonval_set(o, "linear", linear);
    jsonval_set(o, "other", other);
    return o;
}

void lab05_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab05 *t = lab;
    const tp_layout *tl = &t->tl;
    const int L = ctx->opt.layers, sp = tl->seq_parts > 1;
    const tp_figures f = figures(ctx, t->sequence_parallel);
    json_t *m = r->record;
    jsonval_set(m, "tp", json_integer(t->tp.size));
    jsonval_set(m, "heads_per_rank", json_integer(tl->heads));
    jsonval_set(m, "mlp_units_per_rank", json_integer(tl->hidden));
    jsonval_set(m, "sequence_parallel", json_boolean(sp));
    jsonval_set(m, "allreduce_calls_per_step_formula",
                jsonval_integer(f.allreduces ? (double)f.allreduces : f.partial_traffic.calls));
    jsonval_set(m, "allreduce_bytes_per_step_formula",
                jsonval_integer(f.allreduces ? f.allreduces * f.act_bytes : f.partial_traffic.payload));
    jsonval_set(m, "allgather_calls_per_step_formula", jsonval_integer(sp ? f.collectives / 2.0 : 0.0));
    jsonval_set(m, "reduce_scatter_calls_per_step_formula", jsonval_integer(sp ? f.collectives / 2.0 : 0.0));
    jsonval_set(m, "tp_ring_bytes_per_step_formula", jsonval_integer(f.tp_traffic.ring));
    jsonval_set(m, "partial_grad_bytes_formula", jsonval_integer(f.partial_traffic.payload));
    jsonval_set(m, "allreduce_bytes_each", jsonval_integer(f.act_bytes));
    jsonval_set(m, "param_bytes_per_rank_formula", jsonval_integer(f.vb * th_stage_params(&f.tm, &f.opts, 0, L)));
    jsonval_set(m, "replicated_param_bytes", jsonval_integer(f.replicated));
    jsonval_set(m, "block_param_bytes_full", jsonval_integer(f.block_full));
    jsonval_set(m, "block_param_bytes_per_rank", jsonval_integer(f.block_per_rank));
    jsonval_set(m, "block_sharded_bytes_full", jsonval_integer(f.sharded_full));
    jsonval_set(m, "block_sharded_bytes_per_rank", jsonval_integer(f.vb * tp_sharded_elems(tl)));
    jsonval_set(m, "acts_split_bytes_full", jsonval_integer(f.acts_split_full));
    jsonval_set(m, "acts_split_bytes_per_rank", jsonval_integer(f.acts_split_full / t->tp.size));
    jsonval_set(m, "replicated_identical", t->check_sync ? json_boolean(t->in_sync) : json_null());
    const gpt_acts *a = &t->acts;
    jsonval_set(m, "acts_block_bytes_by_kind",
                bytes_by_kind(json_integer(a->att_bytes), json_integer(a->layer_bytes),
                              json_integer(a->bytes - a->att_bytes - a->layer_bytes)));
    jsonval_set(m, "acts_bytes_by_kind_formula",
                bytes_by_kind(jsonval_integer(f.acts_parts.quadratic), jsonval_integer(f.acts_parts.linear),
                              jsonval_integer(f.acts_parts.other)));
    jsonval_set(m, "flops_per_token_formula", jsonval_integer(th_flops_per_token(&f.tm)));
    jsonval_set(m, "recompute_flops_per_token_formula",
                jsonval_integer(th_recompute_flops_per_token(&f.tm, f.opts.recompute)));
    r->run.comms[0] = &t->tp;
    r->run.n_comms = 1;
    r->run.params = tl->g.total;
    r->run.params_held = tl->total;
    r->run.acts_formula_bytes = f.acts_formula;
}

void lab05_print(run_ctx *ctx, void *lab) {
    lab05 *t = lab;
    if (t->tp.rank != 0) return;
    const tp_figures f = figures(ctx, t->sequence_parallel);
    const comm *tp = &t->tp;
    const double steps = ctx->steps_done, vb = f.vb;
    const double measured_calls = (double)tp->stats[COLL_ALLREDUCE].calls / steps;
    const double measured_bytes = tp->stats[COLL_ALLREDUCE].bytes / steps;
    const int L = ctx->opt.layers, per_layer = f.per_layer;
    char a[16], b[16], c[16], d[16], e[16];
    if (t->tl.seq_parts == 1) {
        printf("  tensor parallel all-reduces per step: %.0f measured, %dL = %d by the formula | "
               "%sB payload measured, %dL x B*T*C x %.0f = %sB\n",
               measured_calls, per_layer, f.allreduces, human(measured_bytes, a), per_layer, vb,
               human(f.allreduces * f.act_bytes, b));
    } else {
        const comm_stat *ag = &tp->stats[COLL_ALLGATHER], *rs = &tp->stats[COLL_REDUCE_SCATTER];
        const double ring = comm_ring_factor(COLL_ALLGATHER, tp->size) * (ag->bytes + rs->bytes) / steps;
        const th_opts tp_alone = th_opts_run(tp->size, 0, ctx->model.recompute, g_precision == PREC_BF16);
        printf("  sequence parallel per step: %.0f all-gathers + %.0f reduce-scatters measured, %dL + %dL = "
               "%d + %d by the formula | ring %sB measured = %sB, TP's %dL all-reduces (2(t-1)/t x %dL x "
               "B*T*C x %.0f)\n", ag->calls / steps, rs->calls / steps, per_layer, per_layer, f.collectives / 2,
               f.collectives / 2, human(ring, a), human(th_tp_traffic_run(L, 1, f.act_bytes, &tp_alone).ring, b),
               per_layer, per_layer, vb);
        printf("  partial gradients (LayerNorms, embedding, head: %ld %s): %.0f all-reduce of %sB per step "
               "measured, formula %sB\n", t->partial, g_precision == PREC_BF16 ? "bf16 values" : "floats",
               measured_calls, human(measured_bytes, a), human(f.partial_traffic.payload, b));
    }
    printf("  block weights per rank: %sB = 6C x L replicated (%sB) + 1/%d of the %sB split (matrices, QKV/fc biases); "
           "serial %sB\n", human(f.block_per_rank, a), human(vb * L * 6 * ctx->opt.d_model, b), tp->size,
           human(f.sharded_full, c), human(f.block_full, d));
    if (t->tl.seq_parts == 1 && ctx->model.recompute == RECOMPUTE_NONE)
        printf("  activations per rank: %sB measured, %sB by the formula (theory.h); the split ones (q,k,v, heads, "
               "MLP units) are 1/%d of %sB\n", human((double)mem_peak(MEM_ACTS), a), human(f.acts_formula, c),
               tp->size, human(f.acts_split_full, b));
    else /* SP or recomputation: what is split and what is kept differs, so by kind */
        printf("  activations per rank: %sB measured, %sB by the formula (theory.h): the layers' T^2 term %sB + "
               "their other pieces %sB + not per layer (x_in, tokens, the head's) %sB\n",
               human((double)mem_peak(MEM_ACTS), a), human(f.acts_formula, c), human(f.acts_parts.quadratic, b),
               human(f.acts_parts.linear, d), human(f.acts_parts.other, e));
}
