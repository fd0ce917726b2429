/* A lab's --dry-run and finish (lab_run.h). */
#include "lab_run.h"
#include "device.h"
#include "precision.h"
#include <stdlib.h>
#include <string.h>

th_model lab_theory_model(const gpt_config *c) {
    th_model m = th_course_model(c->vocab, c->seq, c->layers, c->d_model, c->heads);
    m.experts = c->experts > 0 ? c->experts : 0;
    m.top_k = c->experts > 0 ? c->top_k : 0;
    return m;
}

th_run lab_run_config(const run_ctx *ctx) {
    const gpt_config *m = &ctx->model;
    return (th_run){.ranks = ctx->size, .cuda = ctx->device == DEVICE_CUDA, .bf16 = g_precision == PREC_BF16,
                    .batch = ctx->opt.batch, .model = lab_theory_model(m), .tp = 1, .pp = 1, .dp = ctx->size,
                    .micro_batches = 1, .grad_accum = 1, .recompute = m->recompute};
}

void lab_dry_run_exit(run_ctx *ctx, const th_run *need, run_report r) {
    double ring = -1;
    if (need && ctx->rank == 0) ring = th_print_prediction(stdout, need, 32);
    if (r.comm_formula_bytes == DRY_RUN_PREDICTED_RING) r.comm_formula_bytes = ring;
    run_dry_run_exit(ctx, &r);
}

void lab_finish(run_ctx *ctx, ckpt_view *view, double eval_loss, const char *extra, int states, run_report r) {
    char *record = ckpt_record_json(ctx, view, eval_loss, extra);
    r.extra_json = record;
    if (states) {
        const th_opts opts = th_opts_precision(1, g_precision == PREC_BF16);
        const th_states per_param = th_model_states(1, &opts, 0, 1);
        r.states_formula[0] = per_param.params;
        r.states_formula[1] = per_param.grads;
        r.states_formula[2] = per_param.optim;
        r.states_formula_text = g_precision == PREC_BF16 ? "2 + 2 + 12" : "4 + 4 + 8";
    }
    run_finish(ctx, &r);
    free(record);
    ckpt_view_free(view);
}

double lab_model_forward_loss(void *model, gpt_acts *acts) {
    const lab_model *m = model;
    if (m->hooks) gpt_forward_with(m->g, m->hooks, m->params, acts);
    else gpt_forward(m->g, m->params, acts);
    return gpt_mean_loss(m->g, acts);
}

double lab_heldout_loss(const run_ctx *ctx, comm *world, comm *quiet, int first_row, int rows, int micro,
                        gpt_acts *acts, int *tokens, int *targets, lab_forward_loss *forward, void *arg) {
    const int T = ctx->opt.seq, n = micro > 0 ? micro : rows;
    dataset heldout;
    int batches = data_heldout(&ctx->data, ctx->opt.batch, T, &heldout);
    comm_stat training[COLL_NKINDS];
    if (quiet) memcpy(training, quiet->stats, sizeof training);
    double sum = 0;
    for (int b = 0; b < batches; b++)
        for (int k = 0; k < rows / n; k++) {
            data_batch(&heldout, 0, b, first_row + k * n, n, T, tokens, targets);
            gpt_acts_set_batch(acts, tokens, targets, T);
            const double loss = forward(arg, acts);
            sum += micro > 0 ? loss * micro / rows : loss;
        }
    comm_allreduce_host(world, &sum, 1);
    if (quiet) memcpy(quiet->stats, training, sizeof training);
    return sum / ((double)batches * world->size);
}
