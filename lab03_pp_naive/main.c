/* lab03_pp_naive: pipeline parallelism, the naive schedule.
 *
 * The model's layers are cut into p contiguous stages, one per rank (p is the
 * rank count; stage.h says how uneven counts split). Stage 0 also embeds the
 * tokens; stage p-1 also runs the final LayerNorm, the head and the loss. Each
 * step, the whole batch goes forward through stage 0, 1, ..., p-1 (each sends
 * its output activations to the next), then backward through p-1, ..., 0 (each
 * sends the gradient of its input back), then every stage steps AdamW on its
 * own layers, clipped by the global gradient norm. Every rank stores only its
 * stage's weights, gradients and optimizer state (about 1/p of lab01's), but
 * only one stage works at any moment: the others wait.
 *
 * What to look at: the bubble, 1 - busy/wall per rank, beside the theory
 * (p-1)/p in the summary's time split; the staircase of forwards then backwards
 * in the timeline (runs/lab03_pp_naive_pp_4_trace.json in Perfetto); the
 * per-rank params/grads/optim memory against lab01's. */
#include "checkpoint.h"
#include "comm.h"
#include "device.h"
#include "lab_run.h"
#include "jsonval.h"
#include "model.h"
#include "run.h"
#include "stage.h"
#include "theory.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    lab_info lab = {"lab03_pp_naive", "pipeline parallelism, naive schedule: the layers cut into "
                    "one stage per rank, the whole batch forward through the stages, then backward",
                    NULL, 0};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    run_check(&ctx, th_stage_split_possible(ctx.opt.layers, ctx.size),
              "--layers %d cannot be split into %d pipeline stages: every stage needs at least one "
              "layer (give more --layers or run fewer ranks)", ctx.opt.layers, ctx.size);
    run_setup(&ctx);
    /* stages without a schedule: the naive order, GPipe with one micro-batch; held against the memory
     * before anything is allocated */
    th_run need = lab_run_config(&ctx);
    need.pp = ctx.size;
    need.dp = 1;
    lab_start(&ctx, &need);

    const int p = ctx.size;
    const double theory = th_bubble_unit(TH_SCHED_GPIPE, p, 1, 1); /* one batch: (p-1)/p */
    char layout[32];
    snprintf(layout, sizeof layout, "pp=%d", p);
    /* Across each boundary go one activation (forward) and one gradient (back),
     * B x T x C values each; the busiest stage (a middle one) has two boundaries. */
    int boundaries = p == 1 ? 0 : p == 2 ? 1 : 2;
    double boundary_bytes = (double)ctx.opt.batch * ctx.opt.seq * ctx.opt.d_model * value_bytes();
    const double comm_formula = th_pp_traffic(boundaries, 1, 1, boundary_bytes).ring;
    char comm_formula_text[96];
    snprintf(comm_formula_text, sizeof comm_formula_text,
             "busiest stage: boundaries x (activation + gradient) x B x T x C x %zu bytes", value_bytes());
    if (ctx.opt.dry_run)
        lab_dry_run_exit(&ctx, &need, (run_report){.layout = layout, .comm_formula_bytes = comm_formula,
                                                   .comm_formula = comm_formula_text, .bubble_theory = theory});

    comm pipe;
    comm_init(&pipe, MPI_COMM_WORLD, ctx.backend);
    comm_set_axis(&pipe, "pp");
    gpt_layout g;
    gpt_layout_init(&g, &ctx.model);
    pipeline_stage st;
    stage_init(&st, &pipe, &g, &ctx.data, (uint64_t)ctx.opt.seed, ctx.opt.batch, 1);
    ckpt_view view; /* this stage's layers: local [0, n) is global [begin, end) */
    ckpt_view_range(&view, st.master, st.adam_m, st.adam_v, st.begin, st.end);
    const int first = ckpt_resume(&ctx, &view);
    params_from_master(st.params, st.master, st.end - st.begin); /* bf16: round what was resumed */
    if (ctx.rank == 0)
        printf("pipeline: %d stage%s, the whole batch at once | bubble theory (p-1)/p = %.3f\n", p,
               p == 1 ? "" : "s", theory);

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        stage_step_begin(&st, step);
        gpt_acts batch; /* the whole batch is one "micro-batch" */
        stage_acts_alloc(&st, &batch, 0);
        stage_forward(&st, &batch, 0);
        stage_backward(&st, &batch, 0);
        stage_acts_free(&st, &batch);
        double grad_norm;
        double loss = stage_optimizer_step(&st, &ctx.adamw, ctx.opt.clip, &grad_norm);
        stage_report_experts(&ctx, &pipe, &st, 1, i); /* each stage's aux loss: its own layers' */
        char bubble[64];
        run_step_end(&ctx, i, loss, grad_norm, stage_bubble_text(&st, theory, bubble));
        ckpt_step_done(&ctx, &view, step + 1);
    }
    const double eval_loss =
        ctx.opt.eval ? ckpt_print_eval(&ctx, stage_evaluate(&st, &ctx.data, ctx.opt.batch, ctx.opt.seq)) : -1;

    char *extra_json = stage_report_json(&st, 1, "1 batch (naive: the whole batch at once)");
    const th_model tm = lab_theory_model(&g.cfg); /* --experts: their buffers too */
    const th_opts opts = stage_opts(&st);
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra_json, "the lab's record members"), 1,
               (run_report){.layout = layout, .comms = {&pipe}, .n_comms = 1, .params = g.total,
                            .comm_formula_bytes = comm_formula, .comm_formula = comm_formula_text,
                            .bubble_theory = theory, .params_held = st.end - st.begin,
                            /* one batch in flight: this stage's block by theory.h */
                            .acts_formula_bytes = th_course_acts_bytes(&tm, &opts, st.lo, st.hi, st.rows)});

    free(extra_json);
    stage_free(&st);
    comm_free(&pipe);
    MPI_Finalize();
    return run_exit_status(&ctx, 0);
}
