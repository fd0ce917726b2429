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
#include "report.h"
#include "schedule.h"
#include <stdint.h>

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab06 *s = lab;
    const int d = s->dims.dp, share = ctx->opt.batch / d;
    grid_init(&s->grid, s->dims, ctx->backend);
    s->grid_record = grid_describe(&s->grid, ctx->opt.layers, ctx);

    /* This rank: TP shard tp of the layers of stage pp, for replica dp, which
     * trains on rows [dp x B/d, (dp+1) x B/d) of every global batch. */
    tp_layout_init(&s->tl, &ctx->model, s->dims.tp, s->grid.me.tp);
    tp_layout_sequence_parallel(&s->tl, s->sequence_parallel);
    stage3d_init(&s->s3, &s->tl, s->grid.tp);
    /* lab04: this rank's chunks of the pipeline, TP layers inside;
     * ZeRO-1: the optimizer state of 1/d of the buffer, the slice of this replica */
    pipeline_init_sharded(&s->pr, s->grid.pipe, &s->tl.g, &s->s3.model, &ctx->data, (uint64_t)ctx->opt.seed,
                          s->grid.me.dp * share, share, s->kind, s->micro_batches, s->virtual_stages,
                          s->zero_stage ? d : 1, s->grid.me.dp);
    stage3d_alloc_partials(&s->s3, &s->pr);
    /* Each micro-batch's loss weight is 1/(B/d x T) (st.dloss): a replica's
     * gradient is that of its own rows' mean, and the DP all-reduce AVERAGES the
     * replicas, as lab01 does: the mean over the whole global batch. */
    if (!s->zero_stage) dp_sync_init(&s->dp_sync, s->grid.dp, s->pr.grads, 0, s->pr.n, 0); /* the rank's chunks */
    /* lab05's view over lab04's stage: this TP shard of this stage's layers,
     * replicated tensors whole. The d replicas hold the same elements; the
     * lowest rank of them saves them, and on resume every replica loads them. */
    stage3d_checkpoint_view(&s->pr, &s->tl, view);
}

static void start(run_ctx *ctx, void *lab) {
    lab06 *s = lab;
    stage3d_params_from_master(&s->pr, &s->grid); /* bf16: round what was resumed (ZeRO-1: and gather it) */
    s->theory = schedule_bubble_textbook(s->kind, s->dims.pp, s->micro_batches, s->pr.v);
    lab06_print_grid(ctx, s);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    (void)i;
    lab06 *s = lab;
    pipeline_step_begin(&s->pr, step);
    pipeline_run(&s->pr); /* lab04: the schedule's lists, TP layers inside */
    /* lab01: after the flush, average the replicas */
    if (s->dims.dp > 1 && !s->zero_stage) dp_sync_finish(&s->dp_sync);
    out->loss = stage3d_optimizer_step(&s->pr, &s->s3, &s->grid, &ctx->adamw, ctx->opt.clip,
                                       &out->grad_norm); /* ZeRO-1: RS, AG */
    out->note = pipeline_bubble_text(&s->pr, s->theory, out->text);
}

static void done(void *lab) {
    lab06 *s = lab;
    report3d_free(&s->rep);
    json_decref(s->grid_record);
    pipeline_free(&s->pr);
    stage3d_free(&s->s3);
    grid_free(&s->grid);
}

int main(int argc, char **argv) {
    lab06 lab = {.micro_batches = 4, .virtual_stages = 2, .schedule_arg = "1f1b"};
    flag_spec flags[] = {
        {"--tp", FLAG_INT, &lab.flag_dims.tp, "tensor-parallel degree t, ranks per TP group (omitted: 2 if the ranks "
         "allow)", 1, NULL},
        {"--pp", FLAG_INT, &lab.flag_dims.pp, "pipeline stages p (omitted: 2 if the ranks --tp leaves allow)", 1, NULL},
        {"--dp", FLAG_INT, &lab.flag_dims.dp, "data-parallel replicas d (omitted: the ranks left); t x p x d = ranks",
         1, NULL},
        {"--micro-batches", FLAG_INT, &lab.micro_batches,
         "micro-batches per replica and step (must divide --batch / --dp)", 1, NULL},
        {"--schedule", FLAG_STRING, &lab.schedule_arg,
         "lab04's pipeline schedules: gpipe, 1f1b, interleaved (--virtual-stages chunks per rank), zb-h1, zb-v",
         0, SCHEDULE_CHOICES},
        {"--virtual-stages", FLAG_INT, &lab.virtual_stages,
         "model chunks per rank for --schedule interleaved (--layers must divide by --pp x chunks)", 1, NULL},
        {"--check-sync", FLAG_BOOL, &lab.check_sync,
         "verify at the end that the data-parallel replicas hold bit-identical weights (exit 1 if not)", 0, NULL},
        {"--sequence-parallel", FLAG_BOOL, &lab.sequence_parallel,
         "lab05's sequence parallelism in every TP group (needs --tp >= 2; --seq divisible by --tp); pipeline "
         "messages then carry each TP rank's T/t positions", 0, NULL},
        {"--zero-stage", FLAG_INT, &lab.zero_stage,
         "0: every DP replica keeps its rank's whole optimizer state; 1: ZeRO-1, the optimizer state (AdamW moments, "
         "bf16's master weights) sharded over the DP group (needs --dp >= 2)", 0, NULL},
    };
    const lab_def def = {
        .info = {"lab06_3d", "3D parallelism: tensor-parallel layers (lab05) in pipeline stages (lab04), "
                 "the pipeline replicated with a data-parallel gradient all-reduce (lab01)", flags,
                 (int)(sizeof flags / sizeof flags[0])},
        .defaults = lab06_flag_defaults, .check = lab06_check, .predict = lab06_predict, .plan = lab06_plan, .dry_run = lab06_dry_run,
        .setup = setup, .start = start, .step = step, .evaluate = lab06_evaluate, .verify = lab06_verify,
        .report = lab06_report, .print = lab06_print, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
