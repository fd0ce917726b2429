/* lab06_3d: 3D parallelism, tensor x pipeline x data.
 *
 * The three techniques of the course at once, on a grid of t x p x d ranks
 * (--tp, --pp, --dp; grid.h). Every layer's matrices are split over the t ranks
 * of a TP group (lab05: two all-reduces per layer each way); the layers are cut
 * into p pipeline stages run under any of lab04's schedules with m
 * micro-batches (lab03's stages in lab04's executor, computing with lab05's
 * layers through the stage's model hooks: stage3d.c); and that whole pipeline is replicated d
 * times, each replica taking B/d rows of the global batch, with lab01's
 * gradient all-reduce across the replicas once the pipeline has flushed. The
 * optimizer step clips by the norm of the whole model, every element counted
 * once, so every layout reproduces `lab01_dp -n 1`.
 *
 * Ranks are numbered TP fastest, then DP, then PP, so a TP group, whose
 * all-reduces sit between every two matrix products, is consecutive ranks on
 * one host; pipeline neighbours, which exchange one activation per micro-batch,
 * can afford a slower link; DP, one all-reduce per step, spans the rest.
 *
 * What to look at: the grid map printed at start (which rank holds which
 * (tp, pp, dp) on which host); the losses, equal to `lab01_dp -n 1`; the
 * "3D traffic" lines after the summary, one per group kind beside its formula;
 * the bubble per rank beside (p-1)/(m+p-1); memory per rank.
 *
 * --zero-stage 1 composes lab02's ZeRO-1 over each DP group (as Megatron's
 * distributed optimizer and DeepSeek-V3 do): the DP all-reduce becomes a
 * reduce-scatter, each replica keeps the AdamW state of 1/d of its rank's
 * buffer and updates that slice, and an all-gather hands the replicas the
 * updated parameters (stage3d_optimizer_step); the summary's "ZeRO-1" lines give
 * each rank's optimizer bytes beside K x elements / d.
 *
 * Checkpoints (--save, --resume) hold whole tensors, so a rank's view is its
 * TP shard of its stage's layers (lab05's tp_checkpoint_hold over the stage's
 * range) and a file saved at one grid resumes at any other, or in any lab. */
#include "checkpoint.h"
#include "comm.h"
#include "device.h"
#include "dp.h"
#include "executor.h"
#include "grid.h"
#include "model.h"
#include "report3d.h"
#include "lab_run.h"
#include "jsonval.h"
#include "run.h"
#include "schedule.h"
#include "stage.h"
#include "stage3d.h"
#include "theory.h"
#include "tp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int ranks;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const grid_dims defaults = grid_defaults(ranks); /* what --help shows for this rank count */
    int tp = defaults.tp, pp = defaults.pp, dp = defaults.dp, micro_batches = 4, virtual_stages = 2, check_sync = 0;
    int sequence_parallel = 0, zero_stage = 0;
    const char *schedule_arg = "1f1b";
    flag_spec flags[] = {
        {"--tp", FLAG_INT, &tp, "tensor-parallel degree t, ranks per TP group (omitted: 2 if the ranks allow)", 1, NULL},
        {"--pp", FLAG_INT, &pp, "pipeline stages p (omitted: 2 if the ranks --tp leaves allow)", 1, NULL},
        {"--dp", FLAG_INT, &dp, "data-parallel replicas d (omitted: the ranks left); t x p x d = ranks", 1, NULL},
        {"--micro-batches", FLAG_INT, &micro_batches,
         "micro-batches per replica and step (must divide --batch / --dp)", 1, NULL},
        {"--schedule", FLAG_STRING, &schedule_arg,
         "lab04's pipeline schedules: gpipe, 1f1b, interleaved (--virtual-stages chunks per rank), zb-h1, zb-v",
         0, SCHEDULE_CHOICES},
        {"--virtual-stages", FLAG_INT, &virtual_stages,
         "model chunks per rank for --schedule interleaved (--layers must divide by --pp x chunks)", 1, NULL},
        {"--check-sync", FLAG_BOOL, &check_sync,
         "verify at the end that the data-parallel replicas hold bit-identical weights (exit 1 if not)", 0, NULL},
        {"--sequence-parallel", FLAG_BOOL, &sequence_parallel,
         "lab05's sequence parallelism in every TP group (needs --tp >= 2; --seq divisible by --tp); pipeline "
         "messages then carry each TP rank's T/t positions", 0, NULL},
        {"--zero-stage", FLAG_INT, &zero_stage,
         "0: every DP replica keeps its rank's whole optimizer state; 1: ZeRO-1, the optimizer state (AdamW moments, "
         "bf16's master weights) sharded over the DP group (needs --dp >= 2)", 0, NULL},
    };
    lab_info lab = {"lab06_3d", "3D parallelism: tensor-parallel layers (lab05) in pipeline stages (lab04), "
                    "the pipeline replicated with a data-parallel gradient all-reduce (lab01)", flags, (int)(sizeof flags / sizeof flags[0])};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    run_check(&ctx, !ctx.opt.experts, "--experts: expert tensor parallelism is not taught (lab01_dp and lab02_zero "
              "take --experts)");
    const grid_dims dims = grid_choose(&ctx, argc, argv, tp, pp, dp);
    tp_check_degree(&ctx, dims.tp, "--tp");
    if (sequence_parallel) {
        run_check(&ctx, dims.tp >= 2, "--sequence-parallel needs --tp of at least 2 (--tp %d: no TP group to split "
                  "the sequence over)", dims.tp);
        tp_check_sequence_parallel(&ctx, dims.tp, "--tp");
    }
    run_check(&ctx, th_stage_split_possible(ctx.opt.layers, dims.pp),
              "--pp %d is more than --layers %d: every pipeline stage needs at least one layer", dims.pp,
              ctx.opt.layers);
    const int kind = pipeline_check_flags(&ctx, argc, argv, schedule_arg, dims.pp, micro_batches, virtual_stages);
    run_check(&ctx, zero_stage == 0 || zero_stage == 1, "--zero-stage %d: lab06 shards the optimizer state only "
              "(0 or 1); lab02_zero has stages 2 and 3", zero_stage);
    run_check(&ctx, zero_stage == 0 || dims.dp >= 2, "--zero-stage 1 needs --dp of at least 2 (--dp %d: no DP group to "
              "shard the optimizer state over)", dims.dp);
    run_check(&ctx, ctx.opt.batch % ((long)dims.dp * micro_batches) == 0,
              "--batch %d is not divisible by --dp %d x --micro-batches %d (each replica cuts its B/d rows "
              "into micro-batches)", ctx.opt.batch, dims.dp, micro_batches);
    run_setup(&ctx);

    const int t = dims.tp, p = dims.pp, d = dims.dp, m = micro_batches;
    const int v = schedule_chunks(kind, virtual_stages);
    /* theory/predict.h's config of the grid, held against the memory before anything is allocated */
    th_run need = lab_run_config(&ctx);
    need.tp = t;
    need.pp = p;
    need.dp = d;
    need.micro_batches = m;
    need.schedule = schedule_name(kind);
    need.chunks = v;
    need.zero_stage = zero_stage;
    need.tensor_parallel = 1;
    need.sequence_parallel = sequence_parallel;
    lab_start(&ctx, &need);
    char layout[72];
    if (kind == SCHEDULE_INTERLEAVED)
        snprintf(layout, sizeof layout, "tp=%d pp=%d dp=%d m=%d %s v=%d%s%s", t, p, d, m, schedule_name(kind), v,
                 sequence_parallel ? " sp" : "", zero_stage ? " zero1" : "");
    else snprintf(layout, sizeof layout, "tp=%d pp=%d dp=%d m=%d %s%s%s", t, p, d, m, schedule_name(kind),
                  sequence_parallel ? " sp" : "", zero_stage ? " zero1" : "");
    const char *comm_formula_text = "busiest rank: TP + DP all-reduces (ring) + PP sends and receives, the formulas below";
    if (ctx.opt.dry_run) { /* the grid map and its warnings (MPI groups only: no NCCL), then theory/predict.h */
        process_grid grid;
        grid_init(&grid, dims, COMM_MPI);
        free(grid_describe(&grid, ctx.opt.layers, &ctx));
        grid_free(&grid);
        /* the formula: the prediction's ring bytes, as report3d adds up its formulas */
        lab_dry_run_exit(&ctx, &need, (run_report){.layout = layout, .comm_formula_bytes = DRY_RUN_PREDICTED_RING,
                                                   .comm_formula = comm_formula_text,
                                                   .bubble_theory = schedule_bubble_textbook(kind, p, m, v)});
    }

    process_grid grid;
    grid_init(&grid, dims, ctx.backend);
    char *grid_json = grid_describe(&grid, ctx.opt.layers, &ctx);

    /* This rank: TP shard tp of the layers of stage pp, for replica dp, which
     * trains on rows [dp x B/d, (dp+1) x B/d) of every global batch. */
    tp_layout tl;
    tp_layout_init(&tl, &ctx.model, t, grid.me.tp);
    tp_layout_sequence_parallel(&tl, sequence_parallel);
    stage3d s3;
    stage3d_init(&s3, &tl, grid.tp);
    const int share = ctx.opt.batch / d;
    pipeline_rank pr; /* lab04: this rank's chunks of the pipeline, TP layers inside */
    /* ZeRO-1: the optimizer state of 1/d of the buffer, the slice of this replica */
    pipeline_init_sharded(&pr, grid.pipe, &tl.g, &s3.model, &ctx.data, (uint64_t)ctx.opt.seed, grid.me.dp * share,
                          share, kind, m, virtual_stages, zero_stage ? d : 1, grid.me.dp);
    stage3d_alloc_partials(&s3, &pr);
    /* Each micro-batch's loss weight is 1/(B/d x T) (st.dloss): a replica's
     * gradient is that of its own rows' mean, and the DP all-reduce AVERAGES the
     * replicas, as lab01 does: the mean over the whole global batch. */
    dp_grad_sync dp_sync;
    if (!zero_stage) dp_sync_init(&dp_sync, grid.dp, pr.grads, 0, pr.n, 0); /* the rank's chunks, one buffer */
    /* lab05's view over lab04's stage: this TP shard of this stage's layers,
     * replicated tensors whole. The d replicas hold the same elements; the
     * lowest rank of them saves them, and on resume every replica loads them. */
    ckpt_view view;
    stage3d_checkpoint_view(&pr, &tl, &view);
    const int first = ckpt_resume(&ctx, &view);
    stage3d_params_from_master(&pr, &grid); /* bf16: round what was resumed (ZeRO-1: and gather it) */
    const double theory = schedule_bubble_textbook(kind, p, m, pr.v);
    if (ctx.rank == 0) {
        printf("3D: TP t=%d%s (%d of %d heads, %d of %d MLP units per rank) | PP p=%d stages x %d chunk%s, m=%d "
               "micro-batches of %d rows, %s | DP d=%d replicas of %d rows%s | bubble theory %s = %.3f\n",
               t, sequence_parallel ? " + SP [the sequence split by t outside the split matrices: pipeline messages "
               "of T/t positions]" : "", tl.heads, ctx.opt.heads, tl.hidden, 4 * ctx.opt.d_model, p, pr.v,
               pr.v == 1 ? "" : "s", m,
               pr.chunk[0].rows, schedule_name(kind), d, share,
               zero_stage ? " + ZeRO-1 [each keeps the optimizer state of 1/d of its buffer: reduce-scatter, "
                            "AdamW on the slice, all-gather]" : "",
               schedule_bubble_textbook_text(kind), theory);
        fflush(stdout);
    }

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        pipeline_step_begin(&pr, step);
        pipeline_run(&pr);                    /* lab04: the schedule's lists, TP layers inside */
        if (d > 1 && !zero_stage) dp_sync_finish(&dp_sync);  /* lab01: after the flush, average the replicas */
        double grad_norm;
        double loss = stage3d_optimizer_step(&pr, &s3, &grid, &ctx.adamw, ctx.opt.clip, &grad_norm); /* ZeRO-1: RS, AG */
        char bubble[64];
        run_step_end(&ctx, i, loss, grad_norm, pipeline_bubble_text(&pr, theory, bubble));
        ckpt_step_done(&ctx, &view, step + 1);
    }
    const double eval_loss =
        ctx.opt.eval ? ckpt_print_eval(&ctx, stage3d_evaluate(&ctx, &pr, &grid, sequence_parallel, NULL)) : -1;

    /* lab01's check over each DP group (the replicas of one (tp, pp) position), all groups agreeing */
    const int in_sync = check_sync ? stage3d_replicas_identical(&pr, grid.dp) : 1;
    if (check_sync) {
        if (ctx.rank == 0)
            printf("check-sync: the %d data-parallel replicas of every (tp, pp) position %s\n", d,
                   in_sync ? "hold bit-identical weights" : "DIFFER");
    }

    report3d rep;
    report3d_gather(&rep, &grid, &pr, &ctx);
    size_t json_len = strlen(grid_json) + (rep.json ? strlen(rep.json) : 0) + 256;
    char *extra_json = malloc(json_len);
    if (!extra_json) die("out of host memory");
    snprintf(extra_json, json_len, "\"tp\":%d,\"pp\":%d,\"dp\":%d,\"micro_batches\":%d,\"schedule\":\"%s\","
             "\"chunks_per_rank\":%d,\"sequence_parallel\":%s,%s\"replicas_identical\":%s,%s%s%s", t, p,
             d, m, schedule_name(kind), pr.v, sequence_parallel ? "true" : "false",
             zero_stage ? "\"zero_stage\":1," : "", /* absent: 0, the record lab06 always wrote */
             check_sync ? (in_sync ? "true" : "false") : "null", grid_json, rep.json ? "," : "",
             rep.json ? rep.json : "");
    run_report report = {.layout = layout, .comms = {grid.tp, grid.pipe, grid.dp}, .n_comms = 3,
                         .params = tl.g.total, .comm_formula_bytes = rep.formula_ring_bytes,
                         .comm_formula = comm_formula_text, .bubble_theory = theory, .params_held = pr.n,
                         .acts_formula_bytes = pipeline_acts_formula_bytes(&pr)};
    /* ZeRO-1: theory's model states per element with the optimizer's / d (the
     * measured figure adds the last slice's padding, the ZeRO-1 lines below);
     * without it, lab_finish's of a whole replica */
    char states_text[64];
    if (zero_stage) stage3d_zero1_states(&report, states_text, t, d);
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra_json, "the lab's record members"), !zero_stage, report);
    report3d_print(&rep, &grid);

    report3d_free(&rep);
    free(extra_json);
    free(grid_json);
    pipeline_free(&pr);
    stage3d_free(&s3);
    grid_free(&grid);
    MPI_Finalize();
    return run_exit_status(&ctx, in_sync ? 0 : 1);
}
