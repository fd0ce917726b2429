/* lab03's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "theory.h"
#include <stdio.h>

void lab03_check(run_ctx *ctx, void *lab) {
    (void)lab;
    run_check(ctx, th_stage_split_possible(ctx->opt.layers, ctx->size),
              "--layers %d cannot be split into %d pipeline stages: every stage needs at least one "
              "layer (give more --layers or run fewer ranks)", ctx->opt.layers, ctx->size);
}

/* stages without a schedule: the naive order, GPipe with one micro-batch */
void lab03_predict(const run_ctx *ctx, void *lab, th_run *need) {
    (void)lab;
    need->pp = ctx->size;
    need->dp = 1;
}

void lab03_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab03 *d = lab;
    const int p = ctx->size;
    d->bubble_theory = th_bubble_unit(TH_SCHED_GPIPE, p, 1, 1); /* one batch: (p-1)/p */
    snprintf(d->layout, sizeof d->layout, "pp=%d", p);
    /* Across each boundary go one activation (forward) and one gradient (back),
     * B x T x C values each; the busiest stage (a middle one) has two boundaries. */
    int boundaries = p == 1 ? 0 : p == 2 ? 1 : 2;
    double boundary_bytes = (double)ctx->opt.batch * ctx->opt.seq * ctx->opt.d_model * value_bytes();
    snprintf(d->comm_formula_text, sizeof d->comm_formula_text,
             "busiest stage: boundaries x (activation + gradient) x B x T x C x %zu bytes", value_bytes());
    r->layout = d->layout;
    r->comm_formula_bytes = th_pp_traffic(boundaries, 1, 1, boundary_bytes).ring;
    r->comm_formula = d->comm_formula_text;
    r->bubble_theory = d->bubble_theory;
}

double lab03_evaluate(run_ctx *ctx, void *lab) {
    lab03 *d = lab;
    return stage_evaluate(&d->st, &ctx->data, ctx->opt.batch, ctx->opt.seq);
}

void lab03_report(run_ctx *ctx, void *lab, lab_report *r) {
    (void)ctx;
    lab03 *d = lab;
    stage_report_json(&d->st, r->record, 1, "1 batch (naive: the whole batch at once)");
    const th_model tm = lab_theory_model(&d->g.cfg); /* --experts: their buffers too */
    const th_opts opts = stage_opts(&d->st);
    r->run.comms[0] = &d->pipe;
    r->run.n_comms = 1;
    r->run.params = d->g.total;
    r->run.params_held = d->st.end - d->st.begin;
    /* one batch in flight: this stage's block by theory.h */
    r->run.acts_formula_bytes = th_course_acts_bytes(&tm, &opts, d->st.lo, d->st.hi, d->st.rows);
}
