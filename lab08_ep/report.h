/* lab08's state, shared by main.c (which sets it up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB08_REPORT_H
#define LAB08_REPORT_H
#include "ep.h"
#include "lab_main.h"

typedef struct lab08 {
    int ep_degree; /* the flag */
    int N, dp;     /* the EP degree (--ep, 0: every rank) and expert data parallelism over the groups */
    int rows;      /* this rank's rows of the global batch */
    gpt_layout g;  /* the model; a rank's buffer holds its layout (ep.h): E/N experts per layer */
    comm world, ep, edp;
    ep_hooks eh;
    long P; /* this rank's elements */
    int n_runs;
    ep_run *runs; /* the runs of the global layout this rank holds */
    model_states ms;
    gpt_acts acts;
    gpt_grad_scratch scratch;
    int *tokens, *targets;
    /* the busiest expert's rows of each step (any rank, layer): the load the plots draw over the steps */
    long *max_rows_per_step;
    /* the smallest top-k margin each step routed on (moe_min_margin, min over layers and ranks; -1: k = E) */
    float *margin_per_step;
    long max_rows; /* the last step's busiest expert, over all ranks */
    /* --route-groups dividing the EP ranks, summed by lab08_step_figures: the rows between groups
     * (ep_counts' rows_cross, routed_cross, routed_cross_once) over the ranks and steps, each step's
     * bytes (the ranks' mean: a row per choice, once per group), and this rank's counts at the last
     * step's end */
    double cross_rows[3], *cross_per_step, *cross_once_per_step, cross_seen[3];
    /* dropless (F = 0): the busiest layer's received rows on any rank over the uniform k N_tok, and
     * theory's activations with every layer at that skew, at 1 and at the bound (lab08_report) */
    double skew, acts_at_skew, acts_uniform, acts_bound;
    char layout[64];
} lab08;

void lab08_check(run_ctx *ctx, void *lab);
void lab08_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab08_plan(const run_ctx *ctx, void *lab, run_report *r);
void lab08_dry_run_notes(run_ctx *ctx, void *lab, const th_run *need);
/* start's header lines (the grid, the experts per rank, the capacity, the groups), and room for the
 * figures every step keeps (lab08_step_figures) */
void lab08_start_figures(const run_ctx *ctx, lab08 *e);
/* After the step's forward: its busiest expert and its top-k margin, kept for the record; the margin on
 * the step line (out->note). Collective. */
void lab08_step_figures(lab08 *e, int i, lab_step *out);
void lab08_free_figures(lab08 *e);
double lab08_evaluate(run_ctx *ctx, void *lab);
void lab08_report(run_ctx *ctx, void *lab, lab_report *r);
void lab08_print(run_ctx *ctx, void *lab);

#endif
