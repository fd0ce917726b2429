/* lab04_1f1b: pipeline parallelism with micro-batches, GPipe and 1F1B.
 *
 * The stages are lab03's (stage.c: the same layer split, the same forward and
 * backward of one micro-batch with its sends and receives). What changes is the
 * schedule: the global batch is cut into m micro-batches of B/m rows, so while
 * stage r works on micro-batch i, stage r+1 can already work on i-1. The
 * gradients of all m micro-batches accumulate (each backward weighs its loss by
 * 1/(B x T), so the sum is the whole batch's gradient) and there is one
 * optimizer step per global batch: the loss curve is still lab01's.
 *
 * --schedule gpipe runs all forwards, then all backwards; --schedule 1f1b
 * (schedule.c) alternates them after a short warm-up. Both idle for p-1 slots
 * out of m+p-1: the bubble (p-1)/(m+p-1). 1F1B keeps at most min(m, p-r)
 * micro-batches of activations on stage r instead of all m.
 *
 * What to look at: the bubble per rank against (p-1)/(m+p-1) as m grows; the
 * timeline in Perfetto (runs/lab04_1f1b_pp_4_m_8_1f1b_trace.json), where the
 * two schedules' orders are plain to see; the "pipeline stages" lines, the
 * activation peak per stage (measured by the allocator) against the formula. */
#include "checkpoint.h"
#include "comm.h"
#include "device.h"
#include "model.h"
#include "run.h"
#include "schedule.h"
#include "stage.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int micro_batches = 8;
    const char *schedule = "1f1b";
    flag_spec flags[] = {
        {"--micro-batches", FLAG_INT, &micro_batches,
         "cut the global batch into this many micro-batches (must divide --batch)", 1, NULL},
        {"--schedule", FLAG_STRING, &schedule,
         "gpipe: all forwards, then all backwards; 1f1b: one forward, one backward", 0, "1f1b|gpipe"},
    };
    lab_info lab = {"lab04_1f1b", "pipeline parallelism with micro-batches: lab03's stages under "
                    "the GPipe or the 1F1B schedule, one optimizer step per global batch", flags, 2};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    run_check(&ctx, stage_split_possible(ctx.opt.layers, ctx.size),
              "--layers %d cannot be split into %d pipeline stages: every stage needs at least one "
              "layer (give more --layers or run fewer ranks)", ctx.opt.layers, ctx.size);
    run_check(&ctx, ctx.opt.batch % micro_batches == 0,
              "--batch %d is not divisible by --micro-batches %d", ctx.opt.batch, micro_batches);
    run_setup(&ctx);

    comm pipe;
    comm_init(&pipe, MPI_COMM_WORLD, ctx.backend);
    gpt_layout g;
    gpt_layout_init(&g, &ctx.model);
    pipeline_stage st;
    stage_init(&st, &pipe, &g, &ctx.data, (uint64_t)ctx.opt.seed, ctx.opt.batch, micro_batches);
    ckpt_view view; /* this stage's layers: local [0, n) is global [begin, end) */
    ckpt_view_range(&view, st.params, st.adam_m, st.adam_v, st.begin, st.end);
    const int first = ckpt_resume(&ctx, &view);
    const int p = pipe.size, m = micro_batches;
    const schedule_kind kind = schedule_parse(schedule);
    const double theory = schedule_bubble_theory(p, m);
    if (ctx.rank == 0)
        printf("pipeline: %d stage%s, %d micro-batch%s of %d rows, schedule %s | bubble theory "
               "(p-1)/(m+p-1) = %.3f\n", p, p == 1 ? "" : "s", m, m == 1 ? "" : "es", st.rows,
               schedule_name(kind), theory);

    for (int i = 0; i < ctx.opt.steps; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        stage_step_begin(&st, step);
        schedule_run(&st, kind, m);
        double loss = stage_optimizer_step(&st, &ctx.adamw, ctx.opt.clip);
        char bubble[64];
        run_step_end(&ctx, i, loss, stage_bubble_text(&st, theory, bubble));
        ckpt_step_done(&ctx, &view, step + 1);
    }
    double eval_loss = -1;
    if (ctx.opt.eval) {
        eval_loss = stage_evaluate(&st, &ctx.data, ctx.opt.batch, ctx.opt.seq);
        ckpt_print_eval(&ctx, eval_loss);
    }

    char *stages_json = stage_report_json(&st, schedule_acts_in_flight(kind, p, pipe.rank, m),
                                          schedule_acts_formula(kind));
    size_t json_len = strlen(stages_json) + 128;
    char *extra_json = malloc(json_len);
    if (!extra_json) die("out of host memory");
    snprintf(extra_json, json_len, "\"micro_batches\":%d,\"schedule\":\"%s\",%s", m, schedule_name(kind),
             stages_json);
    char layout[48];
    snprintf(layout, sizeof layout, "pp=%d m=%d %s", p, m, schedule_name(kind));
    /* The same bytes as lab03, in m messages of B/m rows instead of one. */
    int boundaries = p == 1 ? 0 : p == 2 ? 1 : 2;
    double boundary_bytes = (double)ctx.opt.batch * ctx.opt.seq * ctx.opt.d_model * sizeof(float);
    char *record = ckpt_record_json(&ctx, &view, eval_loss, extra_json);
    run_report report = {.layout = layout, .comms = {&pipe}, .n_comms = 1, .params = g.total,
                         .comm_formula_bytes = boundaries * 2 * boundary_bytes,
                         .comm_formula = "busiest stage: boundaries x (activation + gradient) "
                                         "x B x T x C x 4 bytes",
                         .bubble_theory = theory, .extra_json = record};
    run_finish(&ctx, &report);
    free(record);
    ckpt_view_free(&view);

    free(extra_json);
    free(stages_json);
    stage_free(&st);
    comm_free(&pipe);
    MPI_Finalize();
    return 0;
}
