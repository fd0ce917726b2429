/* Every lab's --dry-run (dry_run.h). */
#include "dry_run.h"
#include "device.h"
#include "precision.h"

th_run lab_run_config(const run_ctx *ctx) {
    const gpt_config *m = &ctx->model;
    return (th_run){.ranks = ctx->size, .cuda = ctx->device == DEVICE_CUDA, .bf16 = g_precision == PREC_BF16,
                    .batch = ctx->opt.batch, .model = th_course_model(m->vocab, m->seq, m->layers, m->d_model, m->heads),
                    .tp = 1, .pp = 1, .dp = ctx->size, .micro_batches = 1, .recompute = m->recompute};
}

void lab_dry_run_exit(run_ctx *ctx, const th_run *need, run_report r) {
    double ring = -1;
    if (need && ctx->rank == 0) ring = th_print_prediction(stdout, need, 32);
    if (r.comm_formula_bytes == DRY_RUN_PREDICTED_RING) r.comm_formula_bytes = ring;
    run_dry_run_exit(ctx, &r);
}
