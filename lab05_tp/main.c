/* lab05_tp: tensor parallelism (Megatron-LM style).
 *
 * The t ranks split every layer instead of the batch or the layer stack. In
 * attention each rank computes H/t whole heads (its rows of the QKV matrix:
 * column-parallel) and multiplies them by its columns of the output projection
 * (row-parallel), which gives a partial output of full width; an all-reduce sums
 * the partials. The MLP does the same with 4C/t of its units. So each rank holds
 * 1/t of every block's matrices and does 1/t of their work, and in exchange the
 * ranks all-reduce the B x T x C activation twice per layer forward (after each
 * row-parallel linear: g) and twice backward (the input gradient of each
 * column-parallel linear: f). Embedding, LayerNorms, row-parallel biases and
 * the head are replicated, and every rank trains on the whole batch.
 *
 * What to look at: `loss` (equal to `lab01_dp -n 1`), the summary's all-reduce
 * line (4L calls of B*T*C floats per step, beside the formula) and the
 * "block weights per rank" line (1/t of the block matrices). Then compare the
 * bytes with lab01's: TP's traffic grows with the tokens, DP's with the weights,
 * and TP's sits between layers where nothing can hide it: why TP stays inside a
 * host.
 *
 * --sequence-parallel (sequence_parallel.h): the LayerNorm and residual
 * regions, the embedding and the loss on T/t positions of every sequence per
 * rank; each all-reduce becomes a reduce-scatter and an all-gather of the same
 * bytes, and the replicated tensors' gradients, now partial, are summed over
 * the group after the backward. Look at the summary's traffic lines (the ring
 * bytes equal TP's) and the activations line (the formula beside the peak). */
#include "checkpoint.h"
#include "comm.h"
#include "kernels.h"
#include "mem.h"
#include "model.h"
#include "lab_run.h"
#include "jsonval.h"
#include "run.h"
#include "theory.h"
#include "sequence_parallel.h"
#include "tp.h"
#include "trace.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

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

/* The step's mean loss: the head is replicated, so every rank has the same
 * losses; under sequence parallelism each rank has those of its positions,
 * and the mean over the ranks is the mean over the batch. */
static double mean_loss(const tp_layout *tl, comm *tp, const gpt_acts *acts) {
    double loss = gpt_mean_loss(&tl->g, acts);
    if (tl->seq_parts == 1) return loss;
    comm_allreduce_host(tp, &loss, 1);
    return loss / tp->size;
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
    return mean_loss(h->th->tl, h->tp, h->acts);
}

static double evaluate(const run_ctx *ctx, const tp_hooks *th, comm *tp, const void *params, gpt_acts *acts,
                       int *tokens, int *targets) {
    heldout_forward h = {th, tp, params, acts, ctx->opt.batch, ctx->opt.seq, tokens, targets};
    int batches;
    const double sum = lab_heldout_sum(&ctx->data, ctx->opt.batch, ctx->opt.seq, tp, heldout_batch_loss, &h, &batches);
    return sum / batches;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int check_sync = 0, sequence_parallel = 0;
    flag_spec flags[] = {
        {"--check-sync", FLAG_BOOL, &check_sync,
         "verify at the end that the replicated tensors are bit-identical on all ranks (exit 1 if not)", 0, NULL},
        {"--sequence-parallel", FLAG_BOOL, &sequence_parallel,
         "sequence parallelism: outside the TP regions (LayerNorms, residuals, embedding, loss) each rank holds "
         "T/t positions of every sequence; all-gather and reduce-scatter instead of TP's all-reduces (t >= 2)", 0,
         NULL},
    };
    lab_info lab = {"lab05_tp", "tensor parallelism: every layer's matrices split over the ranks "
                    "(the TP degree is the rank count), activations all-reduced twice per layer each way",
                    flags, 2};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    run_check(&ctx, !ctx.opt.experts, "--experts: expert tensor parallelism is not taught (lab01_dp and lab02_zero "
              "take --experts)");
    tp_check_degree(&ctx, ctx.size, "-n");
    if (sequence_parallel) {
        run_check(&ctx, ctx.size >= 2, "--sequence-parallel needs a tensor-parallel degree of at least 2 (-n %d: "
                  "one rank holds the whole sequence anyway)", ctx.size);
        tp_check_sequence_parallel(&ctx, ctx.size, "-n");
    }
    run_setup(&ctx);
    /* every rank the whole batch, 1/t of every layer; held against the memory before anything is allocated */
    th_run need = lab_run_config(&ctx);
    need.tp = ctx.size;
    need.dp = 1;
    need.tensor_parallel = 1;
    need.sequence_parallel = sequence_parallel;
    lab_start(&ctx, &need);

    const int B = ctx.opt.batch, T = ctx.opt.seq, L = ctx.opt.layers, C = ctx.opt.d_model;
    /* The figures the lesson predicts (bytes are vb per value: 4 in fp32, 2 in
     * bf16), by theory/'s formulas (theory.h), the ones plan3d predicts with. */
    const th_model tm = th_course_model(ctx.model.vocab, T, L, C, ctx.model.heads);
    const th_opts opts = th_opts_run(ctx.size, sequence_parallel, ctx.model.recompute, g_precision == PREC_BF16); /* as it runs */
    const double vb = (double)value_bytes();
    const double act_bytes = vb * B * T * C;                  /* one all-reduce's payload */
    /* 2L g's + 2L f's (full recomputation: the g's again); SP: each an all-gather + a reduce-scatter */
    const th_traffic tp_traffic = th_tp_traffic_run(L, 1, act_bytes, &opts);
    const int collectives = (int)tp_traffic.calls;            /* all-reduces, or all-gathers + reduce-scatters */
    const int allreduces = sequence_parallel ? 0 : collectives;
    const int per_layer = ctx.model.recompute == RECOMPUTE_FULL ? 6 : 4;
    /* SP: one all-reduce of the replicated tensors' partial gradients */
    const th_traffic partial_traffic =
        th_dp_traffic(vb * th_sp_partial_params(&tm, 0, L), sequence_parallel ? ctx.size : 1, 1);
    char layout[48], formula[200];
    const char *values = g_precision == PREC_BF16 ? "bf16 values" : "floats";
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    snprintf(layout, sizeof layout, "tp=%d%s", ctx.size, sequence_parallel ? " sp" : "");
    if (sequence_parallel)
        snprintf(formula, sizeof formula, "%dL all-gathers + %dL reduce-scatters of B*T*C %s, ring (t-1)/t each "
                 "(= TP's all-reduces), + 1 all-reduce of the partial gradients", per_layer, per_layer, values);
    else snprintf(formula, sizeof formula, "%dL all-reduces of B*T*C %s, ring 2(t-1)/t x %d L B T C", per_layer,
                  values, (int)vb * per_layer);
    if (ctx.opt.dry_run)
        lab_dry_run_exit(&ctx, &need, (run_report){.layout = layout,
                                                   .comm_formula_bytes = tp_traffic.ring + partial_traffic.ring,
                                                   .comm_formula = formula, .bubble_theory = -1});
    comm tp;
    comm_init(&tp, MPI_COMM_WORLD, ctx.backend);
    comm_set_axis(&tp, "tp");
    tp_layout tl;
    tp_layout_init(&tl, &ctx.model, tp.size, tp.rank);
    tp_layout_sequence_parallel(&tl, sequence_parallel);
    tp_hooks th; /* the Megatron layer: common/model's layer with lab05's f, g and row-parallel bias */
    tp_hooks_init(&th, &tl, &tp);
    const long P = tl.total; /* this rank's parameters: replicated + its shards */
    model_states ms; /* the model's values (precision.h), the fp32 weights AdamW updates and its moments */
    model_states_alloc(&ms, P);
    tp_init_params(&tl, (uint64_t)ctx.opt.seed, 0, L, ms.master);
    ckpt_view view; /* replicated tensors whole, this rank's shards piece by piece */
    ckpt_view_init(&view, ms.master, P, ms.adam_m, ms.adam_v, P);
    tp_checkpoint_hold(&tl, 0, L, &view);
    const int first = ckpt_resume(&ctx, &view);
    params_from_master(ms.params, ms.master, P);
    gpt_acts acts;
    tp_acts_alloc(&acts, &tl, 0, L, B); /* the whole batch: TP does not split it */
    gpt_grad_scratch scratch;
    tp_scratch_alloc(&scratch, &tl, B);
    gpt_acts_bind(&acts, &scratch); /* --recompute and SP put what they do not keep there */
    /* SP: the partial gradients of the replicated tensors, packed for one all-reduce */
    const long partial = tl.seq_parts > 1 ? sp_partial_elems(&tl, 0, L) : 0;
    void *partial_staging = partial ? mem_alloc((size_t)partial * value_bytes(), MEM_COMM) : NULL;
    grad_norm norm; /* tp_grad_squares' two sums, on the device */
    grad_norm_init(&norm, 2);
    int *tokens = malloc(sizeof(int) * (size_t)B * T), *targets = malloc(sizeof(int) * (size_t)B * T);

    const th_params counts = th_param_counts(&tm);
    const double block_full = vb * L * counts.layer;          /* all block weights, serial model */
    const double sharded_full = vb * L * counts.layer_sharded; /* the 4 matrices + QKV, fc biases */
    const double replicated = vb * (counts.total - L * counts.layer_sharded);
    const double block_per_rank = vb * L * (counts.layer - counts.layer_sharded + counts.layer_sharded / tp.size);
    const double acts_formula = th_course_acts_bytes(&tm, &opts, 0, L, B); /* this rank's, exact */
    const th_acts_parts acts_parts = th_course_acts_parts(&tm, &opts, 0, L, B);
    /* activations split per layer: q,k,v (3NC), attention output (NC), the MLP's
     * two 4C-wide tensors (8NC) and the attention matrix (B*H*T*T) */
    const double acts_split_full = vb * L * (12.0 * B * T * C + (double)B * ctx.opt.heads * T * T);
    if (tp.rank == 0) {
        char a[16], b[16], c[16];
        printf("tensor parallel: t=%d | per rank %d of %d heads, %d of %d MLP units | block weights %sB "
               "of %sB per rank | replicated %sB\n", tp.size, tl.heads, ctx.opt.heads, tl.hidden, 4 * C,
               human(block_per_rank, a), human(block_full, b), human(replicated, c));
        fflush(stdout);
    }

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        /* every rank the same, whole global batch */
        data_batch(&ctx.data, (uint64_t)ctx.opt.seed, step, 0, B, T, tokens, targets);
        gpt_acts_set_batch(&acts, tokens, targets, T); /* SP: the T/t positions of every row this rank holds */
        mem_zero(ms.grads, (size_t)P * value_bytes());

        gpt_forward_with(&tl.g, &th.hooks, ms.params, &acts);
        gpt_backward_with(&tl.g, &th.hooks, ms.params, ms.grads, &acts, &scratch, NULL, 1.0f / ((float)B * T), NULL, NULL);
        /* SP: the LayerNorms, embedding and head saw this rank's positions only:
         * their gradients are partial until summed over the group */
        if (partial) sp_sum_partial_grads(&tl, &tp, 0, L, ms.grads, partial_staging);

        /* Clip by the norm of the WHOLE model's gradient, each element counted
         * once: the shards' squares are summed over the ranks, the replicated
         * tensors' (identical everywhere) are added once. That is exactly the
         * serial model's norm, so clipping matches lab01 -n 1. */
        int ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
        double sharded_sq, replicated_sq;
        tp_grad_squares(&tl, &norm, 0, L, ms.grads, &sharded_sq, &replicated_sq);
        comm_allreduce_host(&tp, &sharded_sq, 1);
        float scale = clip_scale(sharded_sq + replicated_sq, (float)ctx.opt.clip);
        tp_adamw_step(&tl, &ctx.adamw, 0, L, ms.master, ms.grads, ms.adam_m, ms.adam_v, step + 1, scale);
        params_from_master(ms.params, ms.master, P);
        trace_end(ev);

        run_step_end(&ctx, i, mean_loss(&tl, &tp, &acts), sqrt(sharded_sq + replicated_sq), NULL);
        ckpt_step_done(&ctx, &view, step + 1);
    }
    const double eval_loss =
        ctx.opt.eval ? ckpt_print_eval(&ctx, evaluate(&ctx, &th, &tp, ms.params, &acts, tokens, targets)) : -1;

    int in_sync = check_sync ? check_replicas_identical(&tp, &tl, ms.master) : 1; /* bf16: ms.params are their rounding */
    const double steps = ctx.steps_done;
    double measured_calls = (double)tp.stats[COLL_ALLREDUCE].calls / steps;
    double measured_bytes = tp.stats[COLL_ALLREDUCE].bytes / steps;
    char extra[2048];
    snprintf(extra, sizeof extra,
             "\"tp\":%d,\"heads_per_rank\":%d,\"mlp_units_per_rank\":%d,\"sequence_parallel\":%s,"
             "\"allreduce_calls_per_step_formula\":%.0f,\"allreduce_bytes_per_step_formula\":%.0f,"
             "\"allgather_calls_per_step_formula\":%.0f,\"reduce_scatter_calls_per_step_formula\":%.0f,"
             "\"tp_ring_bytes_per_step_formula\":%.0f,\"partial_grad_bytes_formula\":%.0f,"
             "\"allreduce_bytes_each\":%.0f,"
             "\"param_bytes_per_rank_formula\":%.0f,\"replicated_param_bytes\":%.0f,"
             "\"block_param_bytes_full\":%.0f,\"block_param_bytes_per_rank\":%.0f,"
             "\"block_sharded_bytes_full\":%.0f,\"block_sharded_bytes_per_rank\":%.0f,"
             "\"acts_split_bytes_full\":%.0f,\"acts_split_bytes_per_rank\":%.0f,"
             "\"replicated_identical\":%s,"
             "\"acts_block_bytes_by_kind\":{\"quadratic\":%ld,\"linear\":%ld,\"other\":%ld},"
             "\"acts_bytes_by_kind_formula\":{\"quadratic\":%.0f,\"linear\":%.0f,\"other\":%.0f},"
             "\"flops_per_token_formula\":%.0f,\"recompute_flops_per_token_formula\":%.0f",
             tp.size, tl.heads, tl.hidden, tl.seq_parts > 1 ? "true" : "false",
             allreduces ? (double)allreduces : partial_traffic.calls,
             allreduces ? allreduces * act_bytes : partial_traffic.payload,
             tl.seq_parts > 1 ? collectives / 2.0 : 0.0, tl.seq_parts > 1 ? collectives / 2.0 : 0.0, tp_traffic.ring,
             partial_traffic.payload, act_bytes,
             vb * th_stage_params(&tm, &opts, 0, L), replicated, block_full, block_per_rank, sharded_full, vb * tp_sharded_elems(&tl),
             acts_split_full, acts_split_full / tp.size, check_sync ? (in_sync ? "true" : "false") : "null",
             acts.att_bytes, acts.layer_bytes, acts.bytes - acts.att_bytes - acts.layer_bytes, acts_parts.quadratic,
             acts_parts.linear, acts_parts.other, th_flops_per_token(&tm), th_recompute_flops_per_token(&tm, opts.recompute));
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra, "the lab's record members"), 1,
               (run_report){.layout = layout, .comms = {&tp}, .n_comms = 1, .params = tl.g.total,
                            .comm_formula_bytes = tp_traffic.ring + partial_traffic.ring, .comm_formula = formula,
                            .bubble_theory = -1, .acts_formula_bytes = acts_formula, .params_held = P});
    if (tp.rank == 0) {
        char a[16], b[16], c[16], d[16], e[16];
        if (tl.seq_parts == 1) {
            printf("  tensor parallel all-reduces per step: %.0f measured, %dL = %d by the formula | "
                   "%sB payload measured, %dL x B*T*C x %.0f = %sB\n",
                   measured_calls, per_layer, allreduces, human(measured_bytes, a), per_layer, vb,
                   human(allreduces * act_bytes, b));
        } else {
            const comm_stat *ag = &tp.stats[COLL_ALLGATHER], *rs = &tp.stats[COLL_REDUCE_SCATTER];
            const double ring = comm_ring_factor(COLL_ALLGATHER, tp.size) * (ag->bytes + rs->bytes) / steps;
            const th_opts tp_alone = th_opts_run(tp.size, 0, ctx.model.recompute, g_precision == PREC_BF16);
            printf("  sequence parallel per step: %.0f all-gathers + %.0f reduce-scatters measured, %dL + %dL = "
                   "%d + %d by the formula | ring %sB measured = %sB, TP's %dL all-reduces (2(t-1)/t x %dL x "
                   "B*T*C x %.0f)\n", ag->calls / steps, rs->calls / steps, per_layer, per_layer, collectives / 2,
                   collectives / 2, human(ring, a), human(th_tp_traffic_run(L, 1, act_bytes, &tp_alone).ring, b),
                   per_layer, per_layer, vb);
            printf("  partial gradients (LayerNorms, embedding, head: %ld %s): %.0f all-reduce of %sB per step "
                   "measured, formula %sB\n", partial, values, measured_calls, human(measured_bytes, a),
                   human(partial_traffic.payload, b));
        }
        printf("  block weights per rank: %sB = 6C x L replicated (%sB) + 1/%d of the %sB split (matrices, QKV/fc biases); "
               "serial %sB\n", human(block_per_rank, a), human(vb * L * 6 * C, b), tp.size,
               human(sharded_full, c), human(block_full, d));
        if (tl.seq_parts == 1 && ctx.model.recompute == RECOMPUTE_NONE)
            printf("  activations per rank: %sB measured, %sB by the formula (theory.h); the split ones (q,k,v, heads, "
                   "MLP units) are 1/%d of %sB\n", human((double)mem_peak(MEM_ACTS), a), human(acts_formula, c),
                   tp.size, human(acts_split_full, b));
        else /* SP or recomputation: what is split and what is kept differs, so by kind */
            printf("  activations per rank: %sB measured, %sB by the formula (theory.h): the layers' T^2 term %sB + "
                   "their other pieces %sB + not per layer (x_in, tokens, the head's) %sB\n",
                   human((double)mem_peak(MEM_ACTS), a), human(acts_formula, c), human(acts_parts.quadratic, b),
                   human(acts_parts.linear, d), human(acts_parts.other, e));
    }

    free(tokens);
    free(targets);
    gpt_scratch_free(&scratch);
    gpt_acts_free(&acts);
    mem_free(partial_staging);
    grad_norm_free(&norm);
    model_states_free(&ms);
    comm_free(&tp);
    MPI_Finalize();
    return run_exit_status(&ctx, in_sync ? 0 : 1);
}
