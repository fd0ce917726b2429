/* The search: every layout of a model on a cluster, those that fit, the best. */
#ifndef PLAN3D_PLAN_H
#define PLAN3D_PLAN_H
#include "cost.h"
#include <stdio.h>

/* What the user fixed; 0 (or -1 for the enums and flags) leaves it to the search. */
typedef struct constraints {
    int tp, pp, dp, micro_batch, vp;
    int schedule;            /* th_schedule, -1: any */
    int sp;                  /* 0, 1, -1: any */
    int recompute;           /* recompute_mode, -1: any */
    int tp_across_nodes;     /* allow t > GPUs per node */
    int cp, ep;              /* context- and expert-parallel degrees, 0: search (ep: 1 for a dense model) */
} constraints;

typedef struct plan_result {
    estimate *all;           /* every valid layout costed, fitting or not, best first */
    int n, n_fit;
    long rejected_shape;     /* combinations that cannot divide the model or batch */
    long layouts;            /* the valid layouts: n, or more when the search was bounded */
    long splits, splits_costed; /* t x cp x p x d (x ep) splits of the GPUs; those costed (the last one in part, if bounded) */
    double work;             /* of costing every valid layout, in plan.c's units */
    int bounded;             /* the work was over plan.c's cap: only the most promising splits were costed */
} plan_result;

/* Enumerates, estimates and sorts: fitting layouts by step time (then memory),
 * then the ones that do not fit by how far over they are. Every valid layout
 * when that is about a second's work; beyond, the most promising splits of the
 * GPUs until then (plan.c says which), with r->bounded set. */
void plan_search(const th_model *m, const cluster *c, const training *tr, const constraints *k, plan_result *r);
void plan_free(plan_result *r);

/* Console output. */
void plan_print_header(FILE *f, const char *model_name, const th_model *m, const cluster *c, const training *tr);
void plan_print_table(FILE *f, const plan_result *r, int top);
/* One line when the search was bounded: how much was left out and how to narrow it; nothing otherwise. */
void plan_print_bound(FILE *f, const plan_result *r);
void plan_print_winner(FILE *f, const estimate *e, const cluster *c);
/* Why the winner's CP and EP where the search chose them: the best layout
 * without them, what it needs or takes. */
void plan_print_why(FILE *f, const plan_result *r, const constraints *k);
void plan_print_explain(FILE *f, const plan_result *r);
/* The table for plots: every layout and which one won. */
int plan_write_json(const char *path, const char *model_name, const th_model *m, const cluster *c,
                    const training *tr, const plan_result *r);

/* "tp=8 pp=4 dp=2 b=1 m=64 interleaved v=2 sp selective"; cp=N and ep=N where above 1 */
const char *layout_text(const layout *l, char *buf, int len);

#endif
