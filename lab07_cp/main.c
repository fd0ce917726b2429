/* lab07_cp: context parallelism.
 *
 * The N ranks of a CP group split every sequence: each holds T/N positions of
 * every row through the whole model (embedding, every layer, the loss), with
 * the whole weights. Only attention needs other ranks' positions (a query sees
 * every earlier key): cp.h's attention hook brings them, by a ring of K/V
 * blocks merged with their log-sum-exp (--cp-algo ring), by all-gathering
 * K and V (allgather), or by an all-to-all that hands each rank every
 * position of heads/N heads for attention and back (ulysses). Activations per rank fall to 1/N, the T^2 attention
 * matrix with them: no rank ever holds more than a (T/N) x (T/N) block of it.
 * --cp N (default: every rank) x data parallelism over the rest.
 *
 * What to look at: `loss` (equal to `lab01_dp -n 1`), the chunk map (zig-zag
 * gives each rank two chunks), the unmasked causal scores per rank (equal with
 * zig-zag, 1:3:5:7 with contiguous at N = 4) and the K/V bytes per layer
 * beside theory/context.c's formula, and the activation peak beside lab01's. */
#include "checkpoint.h"
#include "comm.h"
#include "cp.h"
#include "lab_run.h"
#include "jsonval.h"
#include "kernels.h"
#include "mem.h"
#include "model.h"
#include "optim.h"
#include "run.h"
#include "theory.h"
#include "trace.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* The chunk map: rank r's positions as runs "a-b". */
static void print_chunks(const int *pos, int n, int rank) {
    printf("  cp rank %d holds positions", rank);
    for (int i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && pos[j] == pos[j - 1] + 1; j++) {}
        printf(" %d-%d", pos[i], pos[j - 1]);
    }
    printf("\n");
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

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int cp_degree = 0;
    const char *layout_name = "zigzag", *algo_name = "ring";
    flag_spec flags[] = {
        {"--cp", FLAG_INT, &cp_degree,
         "ranks in each context-parallel group (0: all of them); data parallelism over the groups", 0, NULL},
        {"--cp-layout", FLAG_STRING, &layout_name,
         "which positions a rank holds: zigzag (chunks r and 2N-1-r of 2N, balanced causal work) or contiguous "
         "(T/N in a row)", 0, "zigzag|contiguous"},
        {"--cp-algo", FLAG_STRING, &algo_name,
         "how attention sees the other ranks' keys: ring (K/V blocks passed round, merged by log-sum-exp) or "
         "allgather (K and V gathered whole) or ulysses (all-to-all to a head split and back)", 0,
         "ring|allgather|ulysses"},
    };
    lab_info lab = {"lab07_cp", "context parallelism: every sequence split over the ranks of a CP group, "
                    "attention's keys and values brought by a ring or an all-gather, or the heads split by an all-to-all "
                    "(Ulysses); data parallel over the groups",
                    flags, 3};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    const int N = cp_degree > 0 ? cp_degree : ctx.size, dp = ctx.size % N ? 1 : ctx.size / N;
    const th_cp_layout cp_layout = strcmp(layout_name, "contiguous") ? TH_CP_ZIGZAG : TH_CP_CONTIGUOUS;
    const th_cp_algo algo = !strcmp(algo_name, "allgather") ? TH_CP_ALLGATHER
                            : !strcmp(algo_name, "ulysses") ? TH_CP_ULYSSES : TH_CP_RING;
    const int chunks = cp_layout == TH_CP_ZIGZAG ? 2 * N : N;
    /* the layout's rules (a dense MLP; --cp, --batch, --seq and, Ulysses, --heads dividing as the layout cuts
     * them): theory/rules.c's, the same plan3d --check applies to this lab's records */
    th_run asked = lab_run_config(&ctx);
    asked.cp = N;
    asked.cp_algo = algo;
    asked.cp_layout = cp_layout;
    char rule[256];
    run_check(&ctx, !th_run_broken_rule(&asked, TH_NAMES_FLAGS, rule, sizeof rule), "%s", rule);
    run_setup(&ctx);
    /* theory/predict.h's needs of this run (lab07's part in theory/context.c), held against --max-memory-mb
     * (or the machine's memory) before anything is allocated, the position tables included: lab_start */
    th_run need = lab_run_config(&ctx);
    need.dp = dp;
    need.cp = N;
    need.cp_algo = algo;
    need.cp_layout = cp_layout;
    lab_start(&ctx, &need);
    const double max_memory_mb = ctx.opt.max_memory_mb;

    const int B = ctx.opt.batch, T = ctx.opt.seq, L = ctx.opt.layers, C = ctx.opt.d_model;
    const int rows = B / dp, Tl = T / N;
    /* the traffic per rank per step: K/V per layer (theory/context.c; --recompute
     * runs each attention forward again, its ring too) + the gradients' all-reduce */
    const double vb = (double)value_bytes();
    const th_cp_traffic tf = th_cp_layer_traffic(algo, N, rows, T, C, C, vb);
    const double attention_forwards = ctx.model.recompute == RECOMPUTE_NONE ? 1 : 2;
    gpt_layout g, local; /* the model; and the same with the positions a rank's layers run on */
    gpt_layout_init(&g, &ctx.model);
    const long P = g.total;
    /* the record counts a point-to-point message at both ends (send and recv), a collective once */
    const double ends = algo == TH_CP_RING ? 2 : 1;
    const double comm_formula = ends * L * (attention_forwards * tf.fwd_sent + tf.bwd_sent) +
                                th_dp_traffic(vb * (double)P, ctx.size, 1).ring;
    char layout[64], formula_text[160];
    snprintf(layout, sizeof layout, "cp=%d dp=%d %s %s", N, dp, algo_name, layout_name);
    snprintf(formula_text, sizeof formula_text, "%sL x K/V per layer (theory/context.c, %s)%s + ring all-reduce "
             "2(R-1)/R x gradient bytes over all R ranks", ends > 1 ? "2 ends x " : "", algo_name,
             attention_forwards > 1 ? ", the forward's twice (--recompute)" : "");
    if (ctx.opt.dry_run) { /* theory/predict.h (lab07's part in theory/context.c): memory per category, traffic */
        if (ctx.rank == 0) { /* printed here, not by lab_dry_run_exit: Ulysses adds a line below the tables */
            th_print_prediction(stdout, &need, 32);
            if (algo == TH_CP_ULYSSES && N > 1) /* a kind predict's tables do not have */
                printf("  and alltoall %.0f calls, payload %.0f per rank per step (theory/context.c)\n",
                       2 * L * (attention_forwards + 1), /* q|k|v and out each forward, dO and dq|dk|dv back */
                       (attention_forwards * tf.fwd_sent + tf.bwd_sent) * N / (N - 1) * L);
            /* on the CPU's figures (on CUDA the kernels' own scratch comes on top: the cap is then a floor) */
            th_run capped = need;
            capped.cuda = 0;
            if (max_memory_mb > 0) print_max_seq(&capped, cp_layout, max_memory_mb, ctx.device == DEVICE_CUDA);
        }
        lab_dry_run_exit(&ctx, NULL, (run_report){.layout = layout, .comm_formula_bytes = comm_formula,
                                                  .comm_formula = formula_text, .bubble_theory = -1});
    }
    comm world, cp;
    comm_init(&world, MPI_COMM_WORLD, ctx.backend);
    comm_split(&world, world.rank / N, world.rank % N, &cp); /* consecutive ranks share a sequence */
    comm_set_axis(&world, "world");
    comm_set_axis(&cp, "cp");
    const int dp_rank = world.rank / N;
    local = g;
    local.cfg.seq = Tl; /* wpe keeps all T rows: the embedding reads them by global position */
    cp_hooks ch;
    cp_hooks_init(&ch, &g, &cp, algo, cp_layout, rows);
    model_states ms; /* the model's values (precision.h), the fp32 weights AdamW updates and its moments */
    model_states_alloc(&ms, P);
    gpt_init_params(&g, (uint64_t)ctx.opt.seed, 0, P, ms.master); /* the same on every rank */
    ckpt_view view; /* a whole replica */
    ckpt_view_range(&view, ms.master, ms.adam_m, ms.adam_v, 0, P);
    const int first = ckpt_resume(&ctx, &view);
    params_from_master(ms.params, ms.master, P);
    /* a layer keeps its log-sum-exp (fp32, one per query row and head) where
     * the one-rank layer keeps its attention matrix */
    const gpt_part part = {ctx.opt.heads, 4 * C, 1, 0, cp_att_row(algo, C / ctx.opt.heads)};
    gpt_acts acts;
    gpt_acts_alloc_part(&acts, &local, 0, L, rows, &part);
    acts.positions = cp_positions(&ch);
    gpt_grad_scratch scratch;
    gpt_scratch_alloc_part(&scratch, &local, rows, &part);
    gpt_acts_bind(&acts, &scratch);
    int *tokens = malloc(sizeof(int) * (size_t)rows * T), *targets = malloc(sizeof(int) * (size_t)rows * T);
    if (!tokens || !targets) die("out of host memory");

    if (world.rank == 0) {
        printf("context parallel: cp=%d x dp=%d | %s, %s | %d of %d positions per rank, %d chunks of %d\n", N, dp,
               algo_name, layout_name, Tl, T, chunks, T / chunks);
        fflush(stdout);
    }
    for (int r = 0; r < N; r++) { /* the map, from the ranks of the first group */
        if (world.rank == r) {
            print_chunks(cp_positions(&ch), Tl, r);
            fflush(stdout);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }

    double first_step_attention = 0;
    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i;
        run_step_begin(&ctx, i);
        /* this group's rows of the global batch; the rank's positions of them */
        data_batch(&ctx.data, (uint64_t)ctx.opt.seed, step, dp_rank * rows, rows, T, tokens, targets);
        gpt_acts_set_batch(&acts, tokens, targets, T);
        mem_zero(ms.grads, (size_t)P * value_bytes());
        /* forward and backward as compute events, as lab01's: the summary's time split counts the seconds inside
         * them (the K/V exchanges nested in them count as comm) */
        int ev = trace_begin("forward", TRACE_COMPUTE, -1, NULL);
        gpt_forward_with(&local, &ch.hooks, ms.params, &acts);
        trace_end(ev);
        ev = trace_begin("backward", TRACE_COMPUTE, -1, NULL);
        /* every position's weight: 1 / the global token count, so the sum over all ranks is the mean */
        gpt_backward_with(&local, &ch.hooks, ms.params, ms.grads, &acts, &scratch, NULL, 1.0f / ((float)B * T), NULL, NULL);
        trace_end(ev);
        ev = trace_begin("grad_sum", TRACE_COMM, -1, NULL);
        comm_allreduce(&world, ms.grads, P, 0); /* every rank's share of the same weights: summed over DP x CP */
        trace_end(ev);

        ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
        const double grad_squares = KP->sum_squares(ms.grads, P);
        float scale = clip_scale(grad_squares, (float)ctx.opt.clip);
        adamw_step(&g, &ctx.adamw, 0, P, ms.master, ms.grads, ms.adam_m, ms.adam_v, step + 1, scale);
        params_from_master(ms.params, ms.master, P);
        trace_end(ev);

        double loss = gpt_mean_loss(&local, &acts); /* over this rank's rows x T/N positions */
        comm_allreduce_host(&world, &loss, 1);
        run_step_end(&ctx, i, loss / world.size, sqrt(grad_squares), NULL);
        if (i == 0 && ctx.opt.steps > 1) first_step_attention = ch.attention_cpu_seconds; /* warm-up: left out */
        ckpt_step_done(&ctx, &view, step + 1);
    }

    /* the ring's hiding condition from this run's measurements: the block
     * attention's FLOP rate (its trace events over the measured steps; every
     * forward has N blocks of the same total scores) and one K/V block's
     * exchange timed after training (its bytes kept out of the counts) */
    th_cp_ring_hiding hiding = {0, 0, 0, 0};
    double rate_bw[2] = {0, 0};
    if (algo == TH_CP_RING && N > 1) {
        const comm_quiet q = comm_quiet_begin(&cp);
        const double message = cp_ring_message_seconds(&ch, 9);
        comm_quiet_end(&q);
        int blocks = 0;
        const double seconds = trace_op_seconds(CP_BLOCK_OP, ctx.steps_done > 1 ? 1 : 0, &blocks);
        const double flops = (double)blocks / N * 4.0 * rows * C * (double)ch.scores;
        rate_bw[0] = seconds > 0 ? flops / seconds : 0;
        rate_bw[1] = message > 0 ? (double)rows * Tl * 2 * C * vb / message : 0;
        comm_allreduce_host(&world, rate_bw, 2); /* the ranks' mean */
        rate_bw[0] /= world.size;
        rate_bw[1] /= world.size;
        hiding = th_cp_ring_hiding_of(rows, T, N, C, vb, th_cp_rank_scores(T, N, 0, cp_layout, algo), rate_bw[0],
                                      rate_bw[1]);
    }

    /* each rank's attention kernels (the blocks, forward and backward) per step:
     * contiguous chunks leave the last rank the most to do */
    const int first_measured = ctx.steps_done > 1 ? 1 : 0;
    const double measured_steps = ctx.steps_done > first_measured ? ctx.steps_done - first_measured : 1;
    /* on the CPU, the thread's CPU time: wall-clock time would count the turns
     * ranks take on shared cores; on CUDA, the trace's GPU times */
    double attention_seconds = ctx.device == DEVICE_CUDA
        ? (trace_op_seconds(CP_BLOCK_OP, first_measured, NULL) + trace_op_seconds(CP_BLOCK_BWD_OP, first_measured, NULL))
        : ch.attention_cpu_seconds - first_step_attention;
    attention_seconds /= measured_steps;
    double *attention_per_rank = calloc((size_t)cp.size, sizeof(double));
    MPI_Allgather(&attention_seconds, 1, MPI_DOUBLE, attention_per_rank, 1, MPI_DOUBLE, cp.mpi);

    const double eval_loss = ctx.opt.eval ? ckpt_print_eval(&ctx, lab_heldout_loss(&ctx, &world, &cp, dp_rank * rows, rows, 0,
                                                      &acts, tokens, targets, lab_model_forward_loss,
                                                      &(lab_model){&local, &ch.hooks, ms.params})) : -1;

    /* what the summary sets beside the formulas */
    const comm_kind sent_kind = algo == TH_CP_RING ? COLL_SEND : algo == TH_CP_ULYSSES ? COLL_ALLTOALL : COLL_ALLGATHER;
    const double steps = ctx.steps_done > 0 ? ctx.steps_done : 1;
    double cp_bytes = cp.stats[sent_kind].bytes + (algo == TH_CP_ALLGATHER ? cp.stats[COLL_REDUCE_SCATTER].bytes : 0);
    if (algo != TH_CP_RING) cp_bytes *= (N - 1.0) / N; /* what leaves the rank (the own block stays) */
    const double per_layer = cp_bytes / steps / L;
    const double formula = attention_forwards * tf.fwd_sent + tf.bwd_sent;
    /* per sequence and head of the model: Ulysses's rank counted every score of
     * its heads/N heads, 1/N of that per head of the model */
    double *scores = calloc((size_t)cp.size, sizeof(double));
    double mine = (double)ch.scores / (algo == TH_CP_ULYSSES ? N : 1);
    MPI_Allgather(&mine, 1, MPI_DOUBLE, scores, 1, MPI_DOUBLE, cp.mpi);
    const th_model tm = th_course_model(g.cfg.vocab, T, L, C, g.cfg.heads);
    const th_opts topts = th_opts_run(1, 0, ctx.model.recompute, g_precision == PREC_BF16);
    const double acts_formula = th_cp_acts_bytes(&tm, &topts, rows, N, algo);
    char extra[2048];
    int at = snprintf(extra, sizeof extra, "\"cp\":%d,\"dp\":%d,\"cp_algo\":\"%s\",\"cp_layout\":\"%s\",\"max_memory_mb\":%.17g,"
                      "\"cp_bytes_per_layer\":%.0f,\"cp_bytes_per_layer_formula\":%.0f,\"scores_per_rank\":[",
                      N, dp, algo_name, layout_name, max_memory_mb, per_layer, formula);
    for (int r = 0; r < N; r++)
        at += snprintf(extra + at, sizeof extra - (size_t)at, "%s%.15g", r ? "," : "", scores[r]);
    at += snprintf(extra + at, sizeof extra - (size_t)at, "],\"scores_per_rank_formula\":[");
    for (int r = 0; r < N; r++)
        at += snprintf(extra + at, sizeof extra - (size_t)at, "%s%.15g", r ? "," : "",
                       th_cp_rank_scores(T, N, r, cp_layout, algo));
    at += snprintf(extra + at, sizeof extra - (size_t)at, "],\"attention_seconds_per_rank\":[");
    for (int r = 0; r < N; r++)
        at += snprintf(extra + at, sizeof extra - (size_t)at, "%s%.6g", r ? "," : "", attention_per_rank[r]);
    at += snprintf(extra + at, sizeof extra - (size_t)at, "]");
    if (algo == TH_CP_RING && N > 1)
        snprintf(extra + at, sizeof extra - (size_t)at, ",\"ring_flops_per_s\":%.6g,\"ring_bytes_per_s\":%.6g,"
                 "\"ring_block_seconds\":%.6g,\"ring_message_seconds\":%.6g,\"ring_hidden\":%s",
                 rate_bw[0], rate_bw[1], hiding.block_seconds, hiding.message_seconds, hiding.hidden ? "true" : "false");
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra, "the lab's record members"), 1,
               (run_report){.layout = layout, .comms = {&world, &cp}, .n_comms = 2, .params = P,
                            .comm_formula_bytes = comm_formula, .comm_formula = formula_text, .bubble_theory = -1,
                            .params_held = P, .acts_formula_bytes = acts_formula});
    if (world.rank == 0) {
        char a[16], b[16], c[16], d[16];
        printf("  unmasked causal scores per sequence and head, counted | formula (theory/context.c):");
        for (int r = 0; r < N; r++)
            printf(" %.15g|%.15g", scores[r], th_cp_rank_scores(T, N, r, cp_layout, algo));
        printf("\n  attention kernels per step (forward + backward blocks; CPU: thread time), ms per rank:");
        for (int r = 0; r < N; r++) printf(" %.2f", 1e3 * attention_per_rank[r]);
        printf("\n  %s traffic per layer per rank: %sB sent measured, %sB by the formula (forward %sB + backward "
               "%sB%s)\n", algo == TH_CP_ULYSSES ? "all-to-all" : "K/V", human(per_layer, a), human(formula, b), human(tf.fwd_sent, c), human(tf.bwd_sent, d),
               attention_forwards > 1 ? ", the forward twice: --recompute" : "");
        printf("  activations per rank: theory/context.c's th_cp_acts_bytes above (the layers' T x T attention "
               "matrix replaced by the log-sum-exp%s)\n", algo == TH_CP_ULYSSES ? " and the head-split q|k|v and output" : "");
        if (algo == TH_CP_RING && N > 1)
            printf("  ring hiding (theory/context.c): a block's attention %.3g ms (%sFLOP/s measured) %s its K/V "
                   "message %.3g ms (%sB/s measured point-to-point): %s; hidden from T/N >= rate x %g B / bandwidth "
                   "= %.0f positions per rank (this run: %d)\n", 1e3 * hiding.block_seconds, human(rate_bw[0], c),
                   hiding.hidden ? ">=" : "<", 1e3 * hiding.message_seconds, human(rate_bw[1], d),
                   hiding.hidden ? "met" : "not met", vb, hiding.positions_needed, Tl);
    }
    free(scores);
    free(attention_per_rank);
    free(tokens);
    free(targets);
    gpt_scratch_free(&scratch);
    gpt_acts_free(&acts);
    cp_hooks_free(&ch);
    model_states_free(&ms);
    comm_free(&cp);
    comm_free(&world);
    MPI_Finalize();
    return run_exit_status(&ctx, 0);
}
