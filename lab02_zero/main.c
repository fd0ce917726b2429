/* lab02_zero: ZeRO, data parallelism without the redundant copies.
 *
 * As in lab01, every rank runs the whole model on its own rows of the global
 * batch. But lab01 keeps the parameters, the gradient and both AdamW moments
 * (16 bytes per parameter) on every rank, N identical copies. ZeRO gives each
 * rank 1/N of the flat parameter range and keeps on it only what that share
 * needs:
 *   --zero-stage 1  the optimizer state is sharded (8 of the 16 bytes, / N);
 *   --zero-stage 2  the gradient too (the backward reduce-scatters it bucket by
 *                   bucket, so the full gradient never exists);
 *   --zero-stage 3  the parameters too (a layer is all-gathered just before
 *                   its forward and again before its backward).
 * The loss curve is lab01's (the tests hold every stage and rank count to
 * `lab01_dp -n 1`); stages 1 and 2 move exactly lab01's bytes, stage 3 1.5x.
 *
 * What to look at: the "ZeRO stage" table after the summary, bytes per rank
 * measured by the allocator = the formula + named buffers + padding, and the
 * traffic per step beside its formula. */
#include "experts_metrics.h"
#include "report.h"
#include "mem.h"
#include <stdint.h>
#include <stdlib.h>

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab02 *d = lab;
    d->rows = ctx->opt.batch / ctx->size;
    gpt_layout_init(&d->g, &ctx->model);
    comm_init(&d->world, MPI_COMM_WORLD, ctx->backend);
    comm_set_axis(&d->world, "dp");
    zero_init(&d->zero, &d->g, &d->world, d->zero_stage, d->bucket_mb, (uint64_t)ctx->opt.seed);
    zero_checkpoint_view(&d->zero, view);
}

static void start(run_ctx *ctx, void *lab) {
    lab02 *d = lab;
    const int T = ctx->opt.seq, rows = d->rows;
    zero_params_from_master(&d->zero); /* bf16: the resumed master weights rounded and gathered */
    gpt_acts_alloc(&d->acts, &d->g, 0, d->g.cfg.layers, rows);
    gpt_scratch_alloc(&d->scratch, &d->g, rows);
    gpt_acts_bind(&d->acts, &d->scratch); /* --recompute: what the layers do not keep goes there */
    d->tokens = malloc(sizeof(int) * (size_t)rows * T);
    d->targets = malloc(sizeof(int) * (size_t)rows * T);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    lab02 *d = lab;
    const int T = ctx->opt.seq, rows = d->rows;
    /* this rank's rows of the global batch */
    data_batch(&ctx->data, (uint64_t)ctx->opt.seed, step, d->world.rank * rows, rows, T, d->tokens, d->targets);
    mem_to_device(d->acts.tokens, d->tokens, sizeof(int) * (size_t)rows * T);
    mem_to_device(d->acts.targets, d->targets, sizeof(int) * (size_t)rows * T);

    zero_forward(&d->zero, &d->acts);
    /* weight 1 / (global tokens): the reduce-scatter sums over the ranks,
     * and the sum of the ranks' shares of the mean is the mean */
    zero_backward(&d->zero, &d->acts, &d->scratch, 1.0f / ((float)ctx->opt.batch * T));
    out->grad_norm = zero_optimizer_step(&d->zero, &ctx->adamw, step + 1, (float)ctx->opt.clip);

    double loss = gpt_mean_loss(&d->g, &d->acts);
    comm_allreduce_host(&d->world, &loss, 1);
    run_experts_step(ctx, &d->world, &d->g, &d->acts, i);
    out->loss = loss / d->world.size;
}

static void done(void *lab) {
    lab02 *d = lab;
    free(d->tokens);
    free(d->targets);
    gpt_scratch_free(&d->scratch);
    gpt_acts_free(&d->acts);
    zero_free(&d->zero);
    comm_free(&d->world);
}

int main(int argc, char **argv) {
    lab02 lab = {.zero_stage = 1};
    flag_spec flags[] = {
        {"--zero-stage", FLAG_INT, &lab.zero_stage,
         "what is sharded: 1 optimizer state, 2 + gradients, 3 + parameters", 1, NULL},
        {"--bucket-mb", FLAG_FLOAT, &lab.bucket_mb,
         "stages 1-2: reduce-scatter gradients in buckets of whole blocks of about this many MiB as the "
         "backward finishes them (0: stage 1 all at once, stage 2 one block at a time)", 0, NULL},
    };
    const lab_def def = {
        .info = {"lab02_zero", "ZeRO: data parallelism with the optimizer state (stage 1), the gradients "
                 "(2) and the parameters (3) sharded over the ranks", flags, 2},
        .check = lab02_check, .predict = lab02_predict, .plan = lab02_plan, .dry_run = lab02_dry_run,
        .setup = setup, .start = start, .step = step, .evaluate = lab02_evaluate, .report = lab02_report,
        .print = lab02_print, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
