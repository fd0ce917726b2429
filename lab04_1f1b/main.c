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
#include "checkpoint.h"
#include "comm.h"
#include "device.h"
#include "lab_run.h"
#include "jsonval.h"
#include "executor.h"
#include "model.h"
#include "run.h"
#include "schedule.h"
#include "textbuf.h"
#include "theory.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int micro_batches = 8, virtual_stages = 2, print_schedule = 0;
    const char *schedule_arg = "1f1b";
    flag_spec flags[] = {
        {"--micro-batches", FLAG_INT, &micro_batches,
         "cut the global batch into this many micro-batches (must divide --batch)", 1, NULL},
        {"--schedule", FLAG_STRING, &schedule_arg,
         "gpipe: all forwards, then all backwards; 1f1b: one forward, one backward; interleaved: 1f1b over "
         "--virtual-stages chunks per rank; zb-h1, zb-v: the backward split, weight gradients fill the bubble",
         0, SCHEDULE_CHOICES},
        {"--virtual-stages", FLAG_INT, &virtual_stages,
         "model chunks per rank for --schedule interleaved (--layers must divide by ranks x chunks)", 1, NULL},
        {"--print-schedule", FLAG_BOOL, &print_schedule,
         "print every rank's list of actions (F, B, W of micro-batch.chunk) and exit", 0, NULL},
    };
    lab_info lab = {"lab04_1f1b", "pipeline parallelism with micro-batches: lab03's stages under a schedule "
                    "(a list of actions per rank), one optimizer step per global batch", flags, 4};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    const int p = ctx.size, m = micro_batches;
    const int kind = pipeline_check_flags(&ctx, argc, argv, schedule_arg, p, m, virtual_stages);
    run_check(&ctx, ctx.opt.batch % m == 0, "--batch %d is not divisible by --micro-batches %d", ctx.opt.batch, m);
    if (print_schedule) {
        run_agree_or_exit(ctx.error);
        if (ctx.rank == 0) {
            schedule s;
            schedule_make(&s, kind, p, m, virtual_stages);
            schedule_print(&s);
            schedule_free(&s);
        }
        MPI_Finalize();
        return 0;
    }
    run_setup(&ctx);
    const int v = schedule_chunks(kind, virtual_stages);
    /* held against the memory before anything is allocated; the executor's message buffers are decided by
     * its lists (not predicted: left out of the floor) */
    th_run need = lab_run_config(&ctx);
    need.pp = p;
    need.dp = 1;
    need.micro_batches = m;
    need.schedule = schedule_name(kind);
    need.chunks = v;
    lab_start(&ctx, &need);

    const double theory = schedule_bubble_textbook(kind, p, m, v);
    char layout[64];
    if (kind == SCHEDULE_INTERLEAVED) snprintf(layout, sizeof layout, "pp=%d m=%d %s v=%d", p, m, schedule_name(kind), v);
    else snprintf(layout, sizeof layout, "pp=%d m=%d %s", p, m, schedule_name(kind));
    /* Across each of the busiest rank's boundaries to another rank go m
     * activations one way and m gradients the other, B/m x T x C values each
     * (the links counted on the lists, which are the same on every rank). */
    int links = 0;
    schedule lists;
    schedule_make(&lists, kind, p, m, virtual_stages);
    for (int r = 0; r < p; r++) {
        int l = schedule_remote_links(&lists, r);
        if (l > links) links = l;
    }
    schedule_free(&lists);
    double boundary_bytes = (double)ctx.opt.batch * ctx.opt.seq * ctx.opt.d_model * value_bytes();
    const double comm_formula = links * 2 * boundary_bytes;
    char comm_formula_text[112];
    snprintf(comm_formula_text, sizeof comm_formula_text, "busiest rank: boundaries to other ranks x (activations + "
             "gradients) x B x T x C x %zu bytes", value_bytes());
    if (ctx.opt.dry_run)
        lab_dry_run_exit(&ctx, &need, (run_report){.layout = layout, .comm_formula_bytes = comm_formula,
                                                   .comm_formula = comm_formula_text, .bubble_theory = theory});

    comm pipe;
    comm_init(&pipe, MPI_COMM_WORLD, ctx.backend);
    comm_set_axis(&pipe, "pp");
    gpt_layout g;
    gpt_layout_init(&g, &ctx.model);
    pipeline_rank pr;
    pipeline_init(&pr, &pipe, &g, NULL, &ctx.data, (uint64_t)ctx.opt.seed, 0, ctx.opt.batch, kind, m,
                  virtual_stages);
    ckpt_view view; /* this rank's chunks: one run of the model's layout each */
    pipeline_checkpoint_view(&pr, &view);
    const int first = ckpt_resume(&ctx, &view);
    params_from_master(pr.params, pr.master, pr.n); /* bf16: round what was resumed */
    if (ctx.rank == 0)
        printf("pipeline: %d rank%s x %d chunk%s, %d micro-batch%s of %d rows, schedule %s | bubble theory "
               "(unit times) %s = %.3f\n", p, p == 1 ? "" : "s", v, v == 1 ? "" : "s", m, m == 1 ? "" : "es",
               pr.chunk[0].rows, schedule_name(kind), schedule_bubble_textbook_text(kind), theory);

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        pipeline_step_begin(&pr, step);
        pipeline_run(&pr);
        double grad_norm;
        double loss = pipeline_optimizer_step(&pr, &ctx.adamw, ctx.opt.clip, &grad_norm);
        stage_report_experts(&ctx, &pipe, pr.chunk, pr.v, i); /* each chunk's aux loss: its own layers' */
        char bubble[64];
        run_step_end(&ctx, i, loss, grad_norm, pipeline_bubble_text(&pr, theory, bubble));
        ckpt_step_done(&ctx, &view, step + 1);
    }
    const double eval_loss =
        ctx.opt.eval ? ckpt_print_eval(&ctx, pipeline_evaluate(&pr, &ctx.data, ctx.opt.batch, ctx.opt.seq)) : -1;

    /* The theory beside the measurement: each schedule's formula on the
     * measured times of one micro-batch (the mean over the ranks). */
    double t[3];
    pipeline_measured_times(&pr, ctx.steps_done > 1 ? 1 : 0, t);
    const int split = pr.sched.split;
    const double t_b = split ? t[1] : t[1] / 2, t_w = split ? t[2] : t[1] / 2; /* unsplit: B + W as one */
    const double formula = schedule_bubble_formula(&pr.sched, t[0], t_b, t_w);
    if (ctx.rank == 0) {
        printf("schedule %s: one micro-batch per rank's share, mean over ranks: t_F %.2f ms, ", schedule_name(kind),
               1e3 * t[0]);
        if (split) printf("t_B %.2f ms (input half), t_W %.2f ms (weight half)\n", 1e3 * t[1], 1e3 * t[2]);
        else printf("t_B %.2f ms (the whole backward)\n", 1e3 * t[1]);
        printf("  bubble by the formula, %s, on these times: %.3f | textbook, unit times: %s = %.3f\n",
               schedule_bubble_formula_text(kind), formula, schedule_bubble_textbook_text(kind), theory);
        fflush(stdout);
    }

    char *stages_json = pipeline_report_json(&pr);
    textbuf extra = {0};
    textbuf_printf(&extra, "\"micro_batches\":%d,\"schedule\":\"%s\",\"t_forward_s\":%.6g,\"t_backward_s\":%.6g,"
                   "\"t_weight_s\":%.6g,\"bubble_formula\":%.6g,\"bubble_formula_text\":\"%s\",%s", m,
                   schedule_name(kind), t[0], t[1], t[2], formula, schedule_bubble_formula_text(kind), stages_json);
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra.s, "the lab's record members"), 1,
               (run_report){.layout = layout, .comms = {&pipe}, .n_comms = 1, .params = g.total,
                            .comm_formula_bytes = comm_formula, .comm_formula = comm_formula_text,
                            .bubble_theory = theory, .params_held = pr.n,
                            /* the schedule's blocks in flight x their bytes by theory.h */
                            .acts_formula_bytes = pipeline_acts_formula_bytes(&pr)});

    free(extra.s);
    free(stages_json);
    pipeline_free(&pr);
    comm_free(&pipe);
    MPI_Finalize();
    return run_exit_status(&ctx, 0);
}
