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
#include "report.h"
#include <stdint.h>
#include <stdio.h>

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab03 *d = lab;
    comm_init(&d->pipe, MPI_COMM_WORLD, ctx->backend);
    comm_set_axis(&d->pipe, "pp");
    gpt_layout_init(&d->g, &ctx->model);
    stage_init(&d->st, &d->pipe, &d->g, &ctx->data, (uint64_t)ctx->opt.seed, ctx->opt.batch, 1);
    /* this stage's layers: local [0, n) is global [begin, end) */
    ckpt_view_range(view, d->st.master, d->st.adam_m, d->st.adam_v, d->st.begin, d->st.end);
}

static void start(run_ctx *ctx, void *lab) {
    lab03 *d = lab;
    const int p = ctx->size;
    params_from_master(d->st.params, d->st.master, d->st.end - d->st.begin); /* bf16: round what was resumed */
    if (ctx->rank == 0)
        printf("pipeline: %d stage%s, the whole batch at once | bubble theory (p-1)/p = %.3f\n", p,
               p == 1 ? "" : "s", d->bubble_theory);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    lab03 *d = lab;
    pipeline_stage *st = &d->st;
    stage_step_begin(st, step);
    gpt_acts batch; /* the whole batch is one "micro-batch" */
    stage_acts_alloc(st, &batch, 0);
    stage_forward(st, &batch, 0);
    stage_backward(st, &batch, 0);
    stage_acts_free(st, &batch);
    out->loss = stage_optimizer_step(st, &ctx->adamw, ctx->opt.clip, &out->grad_norm);
    stage_report_experts(ctx, &d->pipe, st, 1, i); /* each stage's aux loss: its own layers' */
    out->note = stage_bubble_text(st, d->bubble_theory, out->text);
}

static void done(void *lab) {
    lab03 *d = lab;
    stage_free(&d->st);
    comm_free(&d->pipe);
}

int main(int argc, char **argv) {
    lab03 lab = {0};
    const lab_def def = {
        .info = {"lab03_pp_naive", "pipeline parallelism, naive schedule: the layers cut into "
                 "one stage per rank, the whole batch forward through the stages, then backward", NULL, 0},
        .check = lab03_check, .predict = lab03_predict, .plan = lab03_plan, .setup = setup, .start = start,
        .step = step, .evaluate = lab03_evaluate, .report = lab03_report, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
