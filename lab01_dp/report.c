/* lab01's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "jsonval.h"
#include "mem.h"
#include "theory.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lab01_check(run_ctx *ctx, void *lab) {
    const lab01 *d = lab;
    run_check(ctx, ctx->opt.batch % ctx->size == 0, "--batch %d is not divisible by the %d ranks", ctx->opt.batch,
              ctx->size);
    run_check(ctx, ctx->opt.batch % ctx->size != 0 || (ctx->opt.batch / ctx->size) % d->grad_accum == 0,
              "--grad-accum %d does not divide the %d rows per rank (--batch %d / %d ranks)", d->grad_accum,
              ctx->opt.batch / (ctx->size > 0 ? ctx->size : 1), ctx->opt.batch, ctx->size);
    run_check_rank_capacity(ctx, d->grad_accum, "--grad-accum");
}

void lab01_predict(const run_ctx *ctx, void *lab, th_run *need) {
    (void)ctx;
    const lab01 *d = lab;
    need->units = d->bucket_mb > 0 ? 0 : 1; /* buckets decide the calls at run time, not the bytes */
    need->grad_accum = d->grad_accum; /* a micro-batch's activations; the all-reduce once a step all the same */
    need->full_elems = need->largest_unit_elems = th_param_counts(&need->model).total;
}

void lab01_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab01 *d = lab;
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    int at = snprintf(d->layout, sizeof d->layout, d->bucket_mb > 0 ? "dp=%d bucket=%gMiB" : "dp=%d", ctx->size,
                      d->bucket_mb);
    if (d->grad_accum > 1) snprintf(d->layout + at, sizeof d->layout - (size_t)at, " accum=%d", d->grad_accum);
    snprintf(d->comm_formula_text, sizeof d->comm_formula_text, "ring all-reduce 2(N-1)/N x gradient bytes");
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    r->layout = d->layout;
    r->comm_formula_bytes = th_dp_traffic((double)g.total * value_bytes(), ctx->size, 1).ring;
    r->comm_formula = d->comm_formula_text;
}

double lab01_evaluate(run_ctx *ctx, void *lab) {
    lab01 *d = lab;
    return lab_heldout_loss(ctx, &d->world, NULL, d->world.rank * d->rows, d->rows, d->micro, &d->acts, d->tokens,
                            d->targets, lab_model_forward_loss, &(lab_model){&d->g, NULL, d->ms.params});
}

static void write_weights(const char *path, const float *params, long n) {
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) die("out of host memory");
    mem_to_host(host, params, (size_t)n * sizeof(float));
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(host, sizeof(float), (size_t)n, f) != (size_t)n || fclose(f) != 0)
        die("--dump-weights %s: cannot write: %s", path, strerror(errno));
    free(host);
}

int lab01_verify(run_ctx *ctx, void *lab) {
    (void)ctx;
    lab01 *d = lab;
    d->in_sync = d->check_sync ? dp_replicas_identical(&d->world, d->ms.master, d->g.total, 1) : 1;
    if (d->dump_weights && d->world.rank == 0) write_weights(d->dump_weights, d->ms.master, d->g.total);
    return d->in_sync;
}

void lab01_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab01 *d = lab;
    /* the activations of B/N rows by theory.h's exact formula, beside the allocator's peak;
     * the FLOPs a token costs, and what --recompute adds to them */
    const th_model tm = lab_theory_model(&d->g.cfg); /* --experts: FLOPs of the active parameters, their buffers */
    const th_opts opts = th_opts_run(1, 0, ctx->model.recompute, g_precision == PREC_BF16);
    jsonval_set(r->record, "bucket_mb", jsonval_figure(d->bucket_mb));
    jsonval_set(r->record, "grad_accum", json_integer(d->grad_accum));
    jsonval_set(r->record, "replicas_identical", d->check_sync ? json_boolean(d->in_sync) : json_null());
    jsonval_set(r->record, "flops_per_token_formula", jsonval_integer(th_flops_per_token(&tm)));
    jsonval_set(r->record, "recompute_flops_per_token_formula",
                jsonval_integer(th_recompute_flops_per_token(&tm, opts.recompute)));
    r->run.comms[0] = &d->world;
    r->run.n_comms = 1;
    r->run.params = r->run.params_held = d->g.total;
    r->run.acts_formula_bytes = th_course_acts_bytes(&tm, &opts, 0, d->g.cfg.layers, d->micro);
}
