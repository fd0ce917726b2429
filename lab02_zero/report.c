/* lab02's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "theory.h"
#include <math.h>
#include <stdio.h>

void lab02_check(run_ctx *ctx, void *lab) {
    const lab02 *d = lab;
    run_check(ctx, d->zero_stage <= 3, "--zero-stage must be 1, 2 or 3, got %d", d->zero_stage);
    run_check(ctx, d->zero_stage < 3 || d->bucket_mb == 0,
              "--bucket-mb %g does not apply to --zero-stage 3 (it gathers and reduces one block at a time)",
              d->bucket_mb);
    run_check(ctx, ctx->opt.batch % ctx->size == 0, "--batch %d is not divisible by the %d ranks", ctx->opt.batch,
              ctx->size);
}

/* The shard plan (the layout's) is not made yet, so its padding is left out and its largest unit is the
 * largest block (every unit is whole blocks; stage 1 without buckets: one unit, the model). */
void lab02_predict(const run_ctx *ctx, void *lab, th_run *need) {
    (void)ctx;
    const lab02 *d = lab;
    need->zero_stage = d->zero_stage;
    const th_params counts = th_param_counts(&need->model);
    need->units = 1;
    need->full_elems = need->embed_unit_elems = counts.total;
    need->largest_unit_elems = zero_unit_elems(d->zero_stage, d->bucket_mb) == 0
                                   ? counts.total : fmax(counts.embed, fmax(counts.layer, counts.head));
}

/* The formulas come from the stage's shard plan: --dry-run's (lab02_dry_run) or
 * the run's own (lab02_report). */
void lab02_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab02 *d = lab;
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    snprintf(d->layout, sizeof d->layout, d->bucket_mb > 0 ? "zero%d dp=%d bucket=%gMiB" : "zero%d dp=%d",
             d->zero_stage, ctx->size, d->bucket_mb);
    r->layout = d->layout;
}

/* --dry-run: the stage's shard plan, which zero_init makes, without its buffers.
 * Its exact figures (padding included) replace predict's in the needs printed and
 * judged, and its traffic is the formula's. */
void lab02_dry_run(run_ctx *ctx, void *lab, th_run *need, run_report *r) {
    lab02 *d = lab;
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    shard_plan plan;
    shard_plan_init(&plan, &g, ctx->size, 0, zero_unit_elems(d->zero_stage, d->bucket_mb));
    zero_figures_of_plan(&g, &plan, d->zero_stage, &d->fig); /* the formula's text lives in the lab's state */
    need->units = plan.n_units;
    need->full_elems = (double)plan.full_elems;
    need->largest_unit_elems = (double)plan.largest_unit_elems;
    need->embed_unit_elems = (double)(shard_unit_of_block(&plan, -1)->chunk * ctx->size);
    shard_plan_free(&plan);
    r->comm_formula_bytes = d->fig.comm_formula;
    r->comm_formula = d->fig.comm_formula_text;
}

/* --eval's forward (lab_heldout_loss keeps its stage-3 gathers out of the traffic counts) */
static double forward_loss(void *zero, gpt_acts *acts) {
    zero_forward(zero, acts);
    return gpt_mean_loss(((zero_state *)zero)->g, acts);
}

double lab02_evaluate(run_ctx *ctx, void *lab) {
    lab02 *d = lab;
    return lab_heldout_loss(ctx, d->zero.dp, d->zero.dp, d->zero.dp->rank * d->rows, d->rows, 0, &d->acts,
                            d->tokens, d->targets, forward_loss, &d->zero);
}

void lab02_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab02 *d = lab;
    zero_figures_compute(&d->zero, &d->fig);
    zero_record_members(&d->zero, &d->fig, d->bucket_mb, r->record);
    const th_model tm = lab_theory_model(&d->g.cfg); /* --experts: FLOPs of the active parameters, their buffers */
    const th_opts opts = th_opts_run(1, 0, ctx->model.recompute, g_precision == PREC_BF16);
    r->run.comms[0] = &d->world;
    r->run.n_comms = 1;
    r->run.params = d->g.total;
    r->run.comm_formula_bytes = d->fig.comm_formula;
    r->run.comm_formula = d->fig.comm_formula_text;
    r->run.acts_formula_bytes = th_course_acts_bytes(&tm, &opts, 0, d->g.cfg.layers, d->rows);
    r->model_states = 0; /* the ZeRO table after the summary is its own (lab02_print) */
}

void lab02_print(run_ctx *ctx, void *lab) {
    lab02 *d = lab;
    zero_print_summary(&d->zero, &d->fig, ctx->steps_done);
}
