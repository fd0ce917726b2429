/* lab01_dp: data parallelism.
 *
 * Every rank holds the whole model and takes its own rows of the global batch.
 * Each runs forward and backward on its rows, then the ranks all-reduce their
 * gradients and divide by the number of ranks: every rank now holds the
 * gradient of the whole batch and takes the same AdamW step, so the replicas
 * stay identical. The loss curve is the one-rank curve; the throughput grows
 * with the ranks, minus the cost of moving 2(N-1)/N x the gradient bytes per
 * step through the ring all-reduce.
 *
 * What to look at: `loss` in the step lines (equal to `-n 1`), tok/s against
 * `-n 1`, and the communication lines of the summary against the formula.
 * `mpirun -n 1 ./lab01_dp` is the serial baseline every other lab reproduces. */
#include "report.h"
#include "kernels.h"
#include "mem.h"
#include "trace.h"
#include <math.h>
#include <stdlib.h>

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab01 *d = lab;
    d->rows = ctx->opt.batch / ctx->size;
    d->micro = d->rows / d->grad_accum;
    gpt_layout_init(&d->g, &ctx->model);
    comm_init(&d->world, MPI_COMM_WORLD, ctx->backend);
    comm_set_axis(&d->world, "dp");
    /* the values forward and backward use (fp32, or bf16: precision.h) and the
     * fp32 weights AdamW updates: the same buffer in fp32, a master copy in bf16 */
    model_states_alloc(&d->ms, d->g.total);
    gpt_init_params(&d->g, (uint64_t)ctx->opt.seed, 0, d->g.total, d->ms.master); /* the same on every rank */
    ckpt_view_range(view, d->ms.master, d->ms.adam_m, d->ms.adam_v, 0, d->g.total); /* a whole replica */
}

static void start(run_ctx *ctx, void *lab) {
    lab01 *d = lab;
    const int T = ctx->opt.seq, micro = d->micro;
    params_from_master(d->ms.params, d->ms.master, d->g.total); /* bf16: round what was resumed */
    gpt_acts_alloc(&d->acts, &d->g, 0, d->g.cfg.layers, micro);
    gpt_scratch_alloc(&d->scratch, &d->g, micro);
    gpt_acts_bind(&d->acts, &d->scratch); /* --recompute: what the layers do not keep goes there */
    d->tokens = malloc(sizeof(int) * (size_t)micro * T);
    d->targets = malloc(sizeof(int) * (size_t)micro * T);
    dp_sync_init(&d->sync, &d->world, d->ms.grads, 0, d->g.total, d->bucket_mb);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    lab01 *d = lab;
    const gpt_layout *g = &d->g;
    const int T = ctx->opt.seq, rows = d->rows, micro = d->micro, K = d->grad_accum;
    const long P = g->total;
    mem_zero(d->ms.grads, (size_t)P * value_bytes());
    double loss = 0;
    run_experts_tally_begin(&d->moe, &g->cfg);
    for (int k = 0; k < K; k++) { /* this rank's rows of the global batch, micro at a time */
        data_batch(&ctx->data, (uint64_t)ctx->opt.seed, step, d->world.rank * rows + k * micro, micro, T, d->tokens,
                   d->targets);
        mem_to_device(d->acts.tokens, d->tokens, sizeof(int) * (size_t)micro * T);
        mem_to_device(d->acts.targets, d->targets, sizeof(int) * (size_t)micro * T);
        int ev = trace_begin("forward", TRACE_COMPUTE, K > 1 ? k : -1, NULL);
        gpt_forward(g, d->ms.params, &d->acts);
        trace_end(ev);
        /* each micro-batch is whole sequences, and the aux loss and capacity are per sequence:
         * the sums over micro-batches are the whole rows' */
        run_experts_tally_add(&d->moe, g, &d->acts);
        ev = trace_begin("backward", TRACE_COMPUTE, K > 1 ? k : -1, NULL);
        /* each token weighs 1/(rows T) whatever micro-batch it is in: the K backwards add up to the
         * mean over this rank's rows; the all-reduce then averages the ranks. Buckets go out only
         * after the last micro-batch, when the gradients are whole. */
        const int last = k == K - 1;
        gpt_backward(g, d->ms.params, d->ms.grads, &d->acts, &d->scratch, NULL, 1.0f / ((float)rows * T),
                     d->bucket_mb > 0 && last ? dp_grads_ready : NULL, &d->sync);
        trace_end(ev);
        loss += gpt_mean_loss(g, &d->acts) / K;
    }
    dp_sync_finish(&d->sync);

    int ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    const double grad_squares = KP->sum_squares(d->ms.grads, P);
    float scale = clip_scale(grad_squares, (float)ctx->opt.clip);
    adamw_step(g, &ctx->adamw, 0, P, d->ms.master, d->ms.grads, d->ms.adam_m, d->ms.adam_v, step + 1, scale);
    params_from_master(d->ms.params, d->ms.master, P);
    trace_end(ev);

    comm_allreduce_host(&d->world, &loss, 1);
    run_experts_report(ctx, &d->world, &d->moe, 1, d->world.size, i);
    out->loss = loss / d->world.size;
    out->grad_norm = sqrt(grad_squares);
}

static void done(void *lab) {
    lab01 *d = lab;
    free(d->tokens);
    free(d->targets);
    run_experts_tally_free(&d->moe);
    gpt_scratch_free(&d->scratch);
    gpt_acts_free(&d->acts);
    model_states_free(&d->ms);
    comm_free(&d->world);
}

int main(int argc, char **argv) {
    lab01 lab = {.grad_accum = 1};
    flag_spec flags[] = {
        {"--bucket-mb", FLAG_FLOAT, &lab.bucket_mb,
         "all-reduce gradients in buckets of about this many MiB as the backward finishes them "
         "(0: one all-reduce after the backward)", 0, NULL},
        {"--check-sync", FLAG_BOOL, &lab.check_sync,
         "verify at the end that all ranks hold bit-identical weights (exit 1 if not)", 0, NULL},
        {"--dump-weights", FLAG_OUTPUT_FILE, &lab.dump_weights,
         "write the final weights (raw little-endian fp32, layout order) to this file", 0, NULL},
        {"--grad-accum", FLAG_INT, &lab.grad_accum,
         "gradient accumulation: each rank runs its rows in K micro-batches, adding up their gradients "
         "before the one all-reduce and AdamW step (the same loss curve, 1/K of the activations; with --experts the "
         "aux loss, dropped choices and expert loads are added up over the K)", 1, NULL},
    };
    const lab_def def = {
        .info = {"lab01_dp", "data parallelism: the same model on every rank, gradients all-reduced and averaged",
                 flags, 4},
        .check = lab01_check, .predict = lab01_predict, .plan = lab01_plan, .setup = setup, .start = start,
        .step = step, .evaluate = lab01_evaluate, .verify = lab01_verify, .report = lab01_report, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
