/* lab04's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "jsonval.h"
#include "theory.h"
#include <stdio.h>
#include <stdlib.h>

/* --print-schedule: every rank's list of actions, printed instead of a run */
static void print_schedule_and_exit(run_ctx *ctx, const lab04 *d) {
    run_agree_or_exit(ctx->error);
    if (ctx->rank == 0) {
        schedule s;
        schedule_make(&s, d->kind, ctx->size, d->micro_batches, d->virtual_stages);
        schedule_print(&s);
        schedule_free(&s);
    }
    MPI_Finalize();
    exit(0);
}

void lab04_check(run_ctx *ctx, void *lab) {
    lab04 *d = lab;
    const int m = d->micro_batches;
    d->kind = pipeline_check_flags(ctx, d->schedule_arg, ctx->size, m, d->virtual_stages);
    run_check(ctx, ctx->opt.batch % m == 0, "--batch %d is not divisible by --micro-batches %d", ctx->opt.batch, m);
    if (d->print_schedule) print_schedule_and_exit(ctx, d); /* before run_setup, as a check would stop the run */
}

/* The executor's message buffers are decided by its lists (not predicted: left out of the floor). */
void lab04_predict(const run_ctx *ctx, void *lab, th_run *need) {
    lab04 *d = lab;
    d->chunks = schedule_chunks(d->kind, d->virtual_stages);
    need->pp = ctx->size;
    need->dp = 1;
    need->micro_batches = d->micro_batches;
    need->schedule = schedule_name(d->kind);
    need->chunks = d->chunks;
}

void lab04_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab04 *d = lab;
    const int p = ctx->size, m = d->micro_batches, v = d->chunks;
    d->bubble_theory = schedule_bubble_textbook(d->kind, p, m, v);
    if (d->kind == SCHEDULE_INTERLEAVED)
        snprintf(d->layout, sizeof d->layout, "pp=%d m=%d %s v=%d", p, m, schedule_name(d->kind), v);
    else snprintf(d->layout, sizeof d->layout, "pp=%d m=%d %s", p, m, schedule_name(d->kind));
    /* Across each of the busiest rank's boundaries to another rank go m
     * activations one way and m gradients the other, B/m x T x C values each
     * (the links counted on the lists, which are the same on every rank). */
    int links = 0;
    schedule lists;
    schedule_make(&lists, d->kind, p, m, d->virtual_stages);
    for (int q = 0; q < p; q++) {
        int l = schedule_remote_links(&lists, q);
        if (l > links) links = l;
    }
    schedule_free(&lists);
    double boundary_bytes = (double)ctx->opt.batch * ctx->opt.seq * ctx->opt.d_model * value_bytes();
    snprintf(d->comm_formula_text, sizeof d->comm_formula_text, "busiest rank: boundaries to other ranks x "
             "(activations + gradients) x B x T x C x %zu bytes", value_bytes());
    r->layout = d->layout;
    r->comm_formula_bytes = links * 2 * boundary_bytes;
    r->comm_formula = d->comm_formula_text;
    r->bubble_theory = d->bubble_theory;
}

double lab04_evaluate(run_ctx *ctx, void *lab) {
    lab04 *d = lab;
    return pipeline_evaluate(&d->pr, &ctx->data, ctx->opt.batch, ctx->opt.seq);
}

void lab04_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab04 *d = lab;
    const int kind = d->kind;
    /* The theory beside the measurement: each schedule's formula on the
     * measured times of one micro-batch (the mean over the ranks). */
    double t[3];
    pipeline_measured_times(&d->pr, ctx->steps_done > 1 ? 1 : 0, t);
    const int split = d->pr.sched.split;
    const double t_b = split ? t[1] : t[1] / 2, t_w = split ? t[2] : t[1] / 2; /* unsplit: B + W as one */
    const double formula = schedule_bubble_formula(&d->pr.sched, t[0], t_b, t_w);
    if (ctx->rank == 0) {
        printf("schedule %s: one micro-batch per rank's share, mean over ranks: t_F %.2f ms, ", schedule_name(kind),
               1e3 * t[0]);
        if (split) printf("t_B %.2f ms (input half), t_W %.2f ms (weight half)\n", 1e3 * t[1], 1e3 * t[2]);
        else printf("t_B %.2f ms (the whole backward)\n", 1e3 * t[1]);
        printf("  bubble by the formula, %s, on these times: %.3f | textbook, unit times: %s = %.3f\n",
               schedule_bubble_formula_text(kind), formula, schedule_bubble_textbook_text(kind), d->bubble_theory);
        fflush(stdout);
    }

    jsonval_set(r->record, "micro_batches", json_integer(d->micro_batches));
    jsonval_set(r->record, "schedule", jsonval_text(schedule_name(kind)));
    jsonval_set(r->record, "t_forward_s", jsonval_number(t[0]));
    jsonval_set(r->record, "t_backward_s", jsonval_number(t[1]));
    jsonval_set(r->record, "t_weight_s", jsonval_number(t[2]));
    jsonval_set(r->record, "bubble_formula", jsonval_number(formula));
    jsonval_set(r->record, "bubble_formula_text", jsonval_text(schedule_bubble_formula_text(kind)));
    pipeline_report_json(&d->pr, r->record);
    r->run.comms[0] = &d->pipe;
    r->run.n_comms = 1;
    r->run.params = d->g.total;
    r->run.params_held = d->pr.n;
    /* the schedule's blocks in flight x their bytes by theory.h */
    r->run.acts_formula_bytes = pipeline_acts_formula_bytes(&d->pr);
}
