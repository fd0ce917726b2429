/* lab04_1f1b: pipeline schedules, as data: GPipe, 1F1B, interleaved 1F1B and
 * the zero-bubble schedules ZB-H1 and ZB-V.
 *
 * The stages are lab03's (stage.c: the same layer split, the same forward and
 * backward of one micro-batch). What changes is the schedule: the global batch
 * is cut into m micro-batches of B/m rows, so while stage r works on
 * micro-batch i, stage r+1 can already work on i-1. The gradients of all m
 * micro-batches accumulate (each backward weighs its loss by 1/(B x T), so the
 * sum is the whole batch's gradient) and there is one optimizer step per
 * global batch: the loss curve is still lab01's, whatever the schedule.
 *
 * A schedule is a list of actions per rank (schedule.c: F, B, W of a
 * micro-batch on one of the rank's model chunks), made by a pure function and
 * printed by --print-schedule; one executor (executor.c) runs any list.
 * gpipe and 1f1b idle p-1 slots of a micro-batch's forward and backward out
 * of m+p-1; interleaved (--virtual-stages v chunks per rank) cuts that by v at
 * v times the messages; zb-h1 and zb-v split the backward into B (the input
 * gradient, which the previous stage waits for) and W (the weight gradient,
 * which can wait) and fill the idle slots with W's.
 *
 * What to look at: the bubble per rank against each schedule's formula,
 * evaluated on the measured t_F, t_B, t_W (the "schedule" lines at the end)
 * and against the unit-time textbook figure; the timeline in Perfetto
 * (runs/lab04_1f1b_pp_4_m_8_zb-h1_trace.json), where each schedule's order is
 * plain to see; the "pipeline ranks" lines, the activation peak per rank
 * (measured by the allocator) against the schedule's blocks in flight. */
#include "report.h"
#include <stdint.h>
#include <stdio.h>

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab04 *d = lab;
    comm_init(&d->pipe, MPI_COMM_WORLD, ctx->backend);
    comm_set_axis(&d->pipe, "pp");
    gpt_layout_init(&d->g, &ctx->model);
    pipeline_init(&d->pr, &d->pipe, &d->g, NULL, &ctx->data, (uint64_t)ctx->opt.seed, 0, ctx->opt.batch, d->kind,
                  d->micro_batches, d->virtual_stages);
    pipeline_checkpoint_view(&d->pr, view); /* this rank's chunks: one run of the model's layout each */
}

static void start(run_ctx *ctx, void *lab) {
    lab04 *d = lab;
    const int p = ctx->size, m = d->micro_batches, v = d->chunks;
    params_from_master(d->pr.params, d->pr.master, d->pr.n); /* bf16: round what was resumed */
    if (ctx->rank == 0)
        printf("pipeline: %d rank%s x %d chunk%s, %d micro-batch%s of %d rows, schedule %s | bubble theory "
               "(unit times) %s = %.3f\n", p, p == 1 ? "" : "s", v, v == 1 ? "" : "s", m, m == 1 ? "" : "es",
               d->pr.chunk[0].rows, schedule_name(d->kind), schedule_bubble_textbook_text(d->kind), d->bubble_theory);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    lab04 *d = lab;
    pipeline_step_begin(&d->pr, step);
    pipeline_run(&d->pr);
    out->loss = pipeline_optimizer_step(&d->pr, &ctx->adamw, ctx->opt.clip, &out->grad_norm);
    stage_report_experts(ctx, &d->pipe, d->pr.chunk, d->pr.v, i); /* each chunk's aux loss: its own layers' */
    out->note = pipeline_bubble_text(&d->pr, d->bubble_theory, out->text);
}

static void done(void *lab) {
    lab04 *d = lab;
    pipeline_free(&d->pr);
    comm_free(&d->pipe);
}

int main(int argc, char **argv) {
    lab04 lab = {.micro_batches = 8, .virtual_stages = 2, .schedule_arg = "1f1b"};
    flag_spec flags[] = {
        {"--micro-batches", FLAG_INT, &lab.micro_batches,
         "cut the global batch into this many micro-batches (must divide --batch)", 1, NULL},
        {"--schedule", FLAG_STRING, &lab.schedule_arg,
         "gpipe: all forwards, then all backwards; 1f1b: one forward, one backward; interleaved: 1f1b over "
         "--virtual-stages chunks per rank; zb-h1, zb-v: the backward split, weight gradients fill the bubble",
         0, SCHEDULE_CHOICES},
        {"--virtual-stages", FLAG_INT, &lab.virtual_stages,
         "model chunks per rank for --schedule interleaved (--layers must divide by ranks x chunks)", 1, NULL},
        {"--print-schedule", FLAG_BOOL, &lab.print_schedule,
         "print every rank's list of actions (F, B, W of micro-batch.chunk) and exit", 0, NULL},
    };
    const lab_def def = {
        .info = {"lab04_1f1b", "pipeline parallelism with micro-batches: lab03's stages under a schedule "
                 "(a list of actions per rank), one optimizer step per global batch", flags, 4},
        .check = lab04_check, .predict = lab04_predict, .plan = lab04_plan, .setup = setup, .start = start,
        .step = step, .evaluate = lab04_evaluate, .report = lab04_report, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
