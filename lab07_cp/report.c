/* lab07's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "jsonval.h"
#include "predict.h"
#include "trace.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lab07_check(run_ctx *ctx, void *lab) {
    lab07 *c = lab;
    c->N = c->cp_degree > 0 ? c->cp_degree : ctx->size;
    c->dp = ctx->size % c->N ? 1 : ctx->size / c->N;
    c->cp_layout = strcmp(c->layout_name, "contiguous") ? TH_CP_ZIGZAG : TH_CP_CONTIGUOUS;
    c->algo = !strcmp(c->algo_name, "allgather") ? TH_CP_ALLGATHER
              : !strcmp(c->algo_name, "ulysses") ? TH_CP_ULYSSES : TH_CP_RING;
    /* the layout's rules (a dense MLP; --cp, --batch, --seq and, Ulysses, --heads dividing as the layout cuts
     * them): theory/rules.c's, the same plan3d --check applies to this lab's records */
    th_run asked = lab_run_config(ctx);
    asked.cp = c->N;
    asked.cp_algo = c->algo;
    asked.cp_layout = c->cp_layout;
    char rule[256];
    run_check(ctx, !th_run_broken_rule(&asked, TH_NAMES_FLAGS, rule, sizeof rule), "%s", rule);
}

void lab07_predict(const run_ctx *ctx, void *lab, th_run *need) {
    (void)ctx;
    const lab07 *c = lab;
    /* theory/predict.h's needs of this run (lab07's part in theory/context.c), the position tables included */
    need->dp = c->dp;
    need->cp = c->N;
    need->cp_algo = c->algo;
    need->cp_layout = c->cp_layout;
}

/* --recompute runs each attention forward again, its K/V exchange too */
static double attention_forwards(const run_ctx *ctx) { return ctx->model.recompute == RECOMPUTE_NONE ? 1 : 2; }

/* the K/V traffic of one layer per rank per step (theory/context.c) */
static th_cp_traffic layer_traffic(const run_ctx *ctx, const lab07 *c) {
    return th_cp_layer_traffic(c->algo, c->N, ctx->opt.batch / c->dp, ctx->opt.seq, ctx->opt.d_model,
                               ctx->opt.d_model, (double)value_bytes());
}

void lab07_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab07 *c = lab;
    /* the traffic per rank per step: K/V per layer (theory/context.c; --recompute
     * runs each attention forward again, its ring too) + the gradients' all-reduce */
    const th_cp_traffic tf = layer_traffic(ctx, c);
    const double forwards = attention_forwards(ctx);
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    /* the record counts a point-to-point message at both ends (send and recv), a collective once */
    const double ends = c->algo == TH_CP_RING ? 2 : 1;
    r->comm_formula_bytes = ends * ctx->opt.layers * (forwards * tf.fwd_sent + tf.bwd_sent) +
                            th_dp_traffic((double)value_bytes() * (double)g.total, ctx->size, 1).ring;
    snprintf(c->layout, sizeof c->layout, "cp=%d dp=%d %s %s", c->N, c->dp, c->algo_name, c->layout_name);
    snprintf(c->comm_formula_text, sizeof c->comm_formula_text, "%sL x K/V per layer (theory/context.c, %s)%s + ring "
             "all-reduce 2(R-1)/R x gradient bytes over all R ranks", ends > 1 ? "2 ends x " : "", c->algo_name,
             forwards > 1 ? ", the forward's twice (--recompute)" : "");
    r->layout = c->layout;
    r->comm_formula = c->comm_formula_text;
}

/* --dry-run --max-memory-mb: the largest --seq whose predicted peak per rank
 * fits, at this run's CP degree, then at cp = 1, 2, 4, 8 as one CP group of
 * their own (dp = 1, the same global batch): T grows about linearly with the
 * group, less the model states every rank holds whole. */
static void print_max_seq(const th_run *run, th_cp_layout layout, double cap_mb, int cuda) {
    const double cap = cap_mb * 1048576.0;
    const long per_chunk = layout == TH_CP_ZIGZAG ? 2 : 1;
    const long mine = th_cp_max_seq(run, per_chunk * run->cp, cap);
    printf("largest --seq that fits %g MiB per rank at cp=%d: %ld (a multiple of %ld)%s\n", cap_mb, run->cp, mine,
           per_chunk * run->cp, cuda ? "; the CPU's figures: on CUDA the kernels' own scratch comes on top" : "");
    printf("  with the global batch of %ld in one group of cp ranks (dp=1):", run->batch);
    for (int n = 1, shown = 0; n <= 8; n *= 2) {
        th_run group = *run;
        group.ranks = group.cp = n;
        group.dp = 1;
        if (run->cp_algo == TH_CP_ULYSSES && run->model.heads % n) continue; /* heads/N heads each */
        printf("%s cp=%d %ld", shown++ ? " |" : "", n, th_cp_max_seq(&group, per_chunk * n, cap));
    }
    printf("\n");
}

/* Below theory/predict.h's tables (lab07's part in theory/context.c): Ulysses' all-to-alls, a kind the
 * tables do not have, and under a cap the largest --seq that fits. Rank 0. */
void lab07_dry_run_notes(run_ctx *ctx, void *lab, const th_run *need) {
    const lab07 *c = lab;
    const int N = c->N;
    if (c->algo == TH_CP_ULYSSES && N > 1) { /* a kind predict's tables do not have */
        const th_cp_traffic tf = layer_traffic(ctx, c);
        const double forwards = attention_forwards(ctx);
        printf("  and alltoall %.0f calls, payload %.0f per rank per step (theory/context.c)\n",
               2 * ctx->opt.layers * (forwards + 1), /* q|k|v and out each forward, dO and dq|dk|dv back */
               (forwards * tf.fwd_sent + tf.bwd_sent) * N / (N - 1) * ctx->opt.layers);
    }
    /* on the CPU's figures (on CUDA the kernels' own scratch comes on top: the cap is then a floor) */
    th_run capped = *need;
    capped.cuda = 0;
    if (ctx->opt.max_memory_mb > 0)
        print_max_seq(&capped, c->cp_layout, ctx->opt.max_memory_mb, ctx->device == DEVICE_CUDA);
}

/* The chunk map: rank r's positions as runs "a-b". */
static void print_chunks(const int *pos, int n, int rank) {
    printf("  cp rank %d holds positions", rank);
    for (int i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && pos[j] == pos[j - 1] + 1; j++) {}
        printf(" %d-%d", pos[i], pos[j - 1]);
    }
    printf("\n");
}

void lab07_print_layout(const run_ctx *ctx, const lab07 *c) {
    const int N = c->N, T = ctx->opt.seq, Tl = T / N, chunks = c->cp_layout == TH_CP_ZIGZAG ? 2 * N : N;
    if (c->world.rank == 0) {
        printf("context parallel: cp=%d x dp=%d | %s, %s | %d of %d positions per rank, %d chunks of %d\n", N, c->dp,
               c->algo_name, c->layout_name, Tl, T, chunks, T / chunks);
        fflush(stdout);
    }
    for (int r = 0; r < N; r++) { /* the map, from the ranks of the first group */
        if (c->world.rank == r) {
            print_chunks(cp_positions(&c->ch), Tl, r);
            fflush(stdout);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

/* What the steps measured, before --eval's forwards add their attention
 * kernels to the trace and the CPU time. Collective. */
void lab07_trained(run_ctx *ctx, void *lab) {
    lab07 *c = lab;
    const int N = c->N, rows = c->rows, C = ctx->opt.d_model, T = ctx->opt.seq;
    /* the ring's hiding condition from this run's measurements: the block
     * attention's FLOP rate (its trace events over the measured steps; every
     * forward has N blocks of the same total scores) and one K/V block's
     * exchange timed after training (its bytes kept out of the counts) */
    if (c->algo == TH_CP_RING && N > 1) {
        const double vb = (double)value_bytes();
        const comm_quiet q = comm_quiet_begin(&c->cp);
        const double message = cp_ring_message_seconds(&c->ch, 9);
        comm_quiet_end(&q);
        int blocks = 0;
        const double seconds = trace_op_seconds(CP_BLOCK_OP, ctx->steps_done > 1 ? 1 : 0, &blocks);
        const double flops = (double)blocks / N * 4.0 * rows * C * (double)c->ch.scores;
        c->rate_bw[0] = seconds > 0 ? flops / seconds : 0;
        c->rate_bw[1] = message > 0 ? (double)rows * (T / N) * 2 * C * vb / message : 0;
        comm_allreduce_host(&c->world, c->rate_bw, 2); /* the ranks' mean */
        c->rate_bw[0] /= c->world.size;
        c->rate_bw[1] /= c->world.size;
        c->hiding = th_cp_ring_hiding_of(rows, T, N, C, vb, th_cp_rank_scores(T, N, 0, c->cp_layout, c->algo),
                                         c->rate_bw[0], c->rate_bw[1]);
    }

    /* each rank's attention kernels (the blocks, forward and backward) per step:
     * contiguous chunks leave the last rank the most to do */
    const int first_measured = ctx->steps_done > 1 ? 1 : 0;
    const double measured_steps = ctx->steps_done > first_measured ? ctx->steps_done - first_measured : 1;
    /* on the CPU, the thread's CPU time: wall-clock time would count the turns
     * ranks take on shared cores; on CUDA, the trace's GPU times */
    double attention_seconds = ctx->device == DEVICE_CUDA
        ? (trace_op_seconds(CP_BLOCK_OP, first_measured, NULL) + trace_op_seconds(CP_BLOCK_BWD_OP, first_measured, NULL))
        : c->ch.attention_cpu_seconds - c->first_step_attention;
    attention_seconds /= measured_steps;
    c->attention_per_rank = calloc((size_t)c->cp.size, sizeof(double));
    MPI_Allgather(&attention_seconds, 1, MPI_DOUBLE, c->attention_per_rank, 1, MPI_DOUBLE, c->cp.mpi);
}

double lab07_evaluate(run_ctx *ctx, void *lab) {
    lab07 *c = lab;
    return lab_heldout_loss(ctx, &c->world, &c->cp, c->dp_rank * c->rows, c->rows, 0, &c->acts, c->tokens,
                            c->targets, lab_model_forward_loss, &(lab_model){&c->local, &c->ch.hooks, c->ms.params});
}

/* the K/V (Ulysses: all-to-all) bytes a rank sent per layer per step, measured */
static double measured_bytes_per_layer(const run_ctx *ctx, const lab07 *c) {
    const comm_kind sent_kind = c->algo == TH_CP_RING      ? COLL_SEND
                                : c->algo == TH_CP_ULYSSES ? COLL_ALLTOALL : COLL_ALLGATHER;
    const double steps = ctx->steps_done > 0 ? ctx->steps_done : 1;
    double cp_bytes =
        c->cp.stats[sent_kind].bytes + (c->algo == TH_CP_ALLGATHER ? c->cp.stats[COLL_REDUCE_SCATTER].bytes : 0);
    if (c->algo != TH_CP_RING) cp_bytes *= (c->N - 1.0) / c->N; /* what leaves the rank (the own block stays) */
    return cp_bytes / steps / ctx->opt.layers;
}

static double formula_bytes_per_layer(const run_ctx *ctx, const lab07 *c) {
    const th_cp_traffic tf = layer_traffic(ctx, c);
    return attention_forwards(ctx) * tf.fwd_sent + tf.bwd_sent;
}

void lab07_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab07 *c = lab;
    const int N = c->N, T = ctx->opt.seq;
    /* per sequence and head of the model: Ulysses's rank counted every score of
     * its heads/N heads, 1/N of that per head of the model */
    c->scores = calloc((size_t)c->cp.size, sizeof(double));
    double mine = (double)c->ch.scores / (c->algo == TH_CP_ULYSSES ? N : 1);
    MPI_Allgather(&mine, 1, MPI_DOUBLE, c->scores, 1, MPI_DOUBLE, c->cp.mpi);
    const th_model tm = th_course_model(c->g.cfg.vocab, T, ctx->opt.layers, ctx->opt.d_model, c->g.cfg.heads);
    const th_opts topts = th_opts_run(1, 0, ctx->model.recompute, g_precision == PREC_BF16);
    double *scores_formula = malloc(sizeof(double) * (size_t)N);
    if (!scores_formula) die("out of host memory");
    for (int q = 0; q < N; q++) scores_formula[q] = th_cp_rank_scores(T, N, q, c->cp_layout, c->algo);

    json_t *m = r->record;
    jsonval_set(m, "cp", json_integer(N));
    jsonval_set(m, "dp", json_integer(c->dp));
    jsonval_set(m, "cp_algo", jsonval_text(c->algo_name));
    jsonval_set(m, "cp_layout", jsonval_text(c->layout_name));
    jsonval_set(m, "max_memory_mb", jsonval_figure(ctx->opt.max_memory_mb));
    jsonval_set(m, "cp_bytes_per_layer", jsonval_integer(measured_bytes_per_layer(ctx, c)));
    jsonval_set(m, "cp_bytes_per_layer_formula", jsonval_integer(formula_bytes_per_layer(ctx, c)));
    jsonval_set(m, "scores_per_rank", jsonval_figures(c->scores, N));
    jsonval_set(m, "scores_per_rank_formula", jsonval_figures(scores_formula, N));
    jsonval_set(m, "attention_seconds_per_rank", jsonval_numbers(c->attention_per_rank, N));
    if (c->algo == TH_CP_RING && N > 1) {
        jsonval_set(m, "ring_flops_per_s", jsonval_number(c->rate_bw[0]));
        jsonval_set(m, "ring_bytes_per_s", jsonval_number(c->rate_bw[1]));
        jsonval_set(m, "ring_block_seconds", jsonval_number(c->hiding.block_seconds));
        jsonval_set(m, "ring_message_seconds", jsonval_number(c->hiding.message_seconds));
        jsonval_set(m, "ring_hidden", json_boolean(c->hiding.hidden));
    }
    free(scores_formula);
    r->run.comms[0] = &c->world;
    r->run.comms[1] = &c->cp;
    r->run.n_comms = 2;
    r->run.params = r->run.params_held = c->g.total;
    r->run.acts_formula_bytes = th_cp_acts_bytes(&tm, &topts, c->rows, N, c->algo);
}

void lab07_print(run_ctx *ctx, void *lab) {
    const lab07 *c = lab;
    if (c->world.rank != 0) return;
    const int N = c->N, T = ctx->opt.seq;
    const th_cp_traffic tf = layer_traffic(ctx, c);
    const int ulysses = c->algo == TH_CP_ULYSSES;
    char a[16], b[16], d[16], e[16];
    printf("  unmasked causal scores per sequence and head, counted | formula (theory/context.c):");
    for (int r = 0; r < N; r++) printf(" %.15g|%.15g", c->scores[r], th_cp_rank_scores(T, N, r, c->cp_layout, c->algo));
    printf("\n  attention kernels per step (forward + backward blocks; CPU: thread time), ms per rank:");
    for (int r = 0; r < N; r++) printf(" %.2f", 1e3 * c->attention_per_rank[r]);
    printf("\n  %s traffic per layer per rank: %sB sent measured, %sB by the formula (forward %sB + backward "
           "%sB%s)\n", ulysses ? "all-to-all" : "K/V", human(measured_bytes_per_layer(ctx, c), a),
           human(formula_bytes_per_layer(ctx, c), b), human(tf.fwd_sent, d), human(tf.bwd_sent, e),
           attention_forwards(ctx) > 1 ? ", the forward twice: --recompute" : "");
    printf("  activations per rank: theory/context.c's th_cp_acts_bytes above (the layers' T x T attention "
           "matrix replaced by the log-sum-exp%s)\n", ulysses ? " and the head-split q|k|v and output" : "");
    if (c->algo == TH_CP_RING && N > 1)
        printf("  ring hiding (theory/context.c): a block's attention %.3g ms (%sFLOP/s measured) %s its K/V "
               "message %.3g ms (%sB/s measured point-to-point): %s; hidden from T/N >= rate x %g B / bandwidth "
               "= %.0f positions per rank (this run: %d)\n", 1e3 * c->hiding.block_seconds, human(c->rate_bw[0], d),
               c->hiding.hidden ? ">=" : "<", 1e3 * c->hiding.message_seconds, human(c->rate_bw[1], e),
               c->hiding.hidden ? "met" : "not met", (double)value_bytes(), c->hiding.positions_needed, T / N);
}
