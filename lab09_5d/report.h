/* lab09's state, shared by main.c (which sets the mesh up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB09_REPORT_H
#define LAB09_REPORT_H
#include "cp.h"
#include "dp.h"
#include "executor.h"
#include "experts.h"
#include "grid.h"
#include "lab_main.h"
#include "report3d.h"
#include "stage3d.h"
#include "tp.h"

enum { AXIS_TP, AXIS_CP, AXIS_PP, AXIS_DP, AXES }; /* the flags' order: omitted ones take 2 in this order */
/* the groups whose traffic a run with experts reports (lab06's table, report3d, for the dense grid) */
enum { XG_TP, XG_CP, XG_SEQ, XG_PP, XG_DP, XG_STAGE, XG_EP, XG_EDP, XG_GROUPS };

typedef struct lab09 {
    int deg[AXES]; /* the flags: --tp, --cp, --pp, --dp (grid_defaults_axes' until given), then the run's degrees */
    int ep, micro_batches, virtual_stages, check_sync, zero_stage, sequence_parallel;
    const char *schedule_arg, *layout_name, *algo_name;
    int experts; /* --experts: lab08's experts in the MLP slot */
    int kind, v; /* the schedule, its chunks per rank */
    th_cp_layout cp_layout;
    th_cp_algo algo;
    process_grid grid;
    tp_layout tl;
    gpt_layout heads_view; /* CP's attention: this TP rank's heads of all T positions */
    gpt_layout local;      /* the stages' layout: a CP rank's T/c positions, wpe's T rows whole */
    stage3d s3;
    cp_hooks ch;
    grid_experts gx;
    moe_split split;              /* --experts with --cp or --tp: the routing's whole sequences over the sequence group */
    int *seq_positions;           /* --experts at t x c > 1: the sequence group's ranks' positions, rank by rank */
    comm self;                    /* --experts at e = 1: each rank an EP group of its own */
    comm *ep_group, *edp_group;
    stage_model model;
    pipeline_rank pr;
    dp_grad_sync dp_sync;
    double theory; /* the schedule's textbook bubble */
    int in_sync;   /* --check-sync's verdict */
    report3d rep;
    group_traffic *experts_traffic; /* --experts, rank 0: every rank's XG_GROUPS groups, measured and formula */
    double experts_formula_ring;    /* their formulas' ring bytes, the busiest rank per kind, summed */
    char layout[128];
    char states_text[64];
} lab09;

void lab09_flag_defaults(int ranks, void *lab);
void lab09_check(run_ctx *ctx, void *lab);
void lab09_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab09_plan(const run_ctx *ctx, void *lab, run_report *r);
void lab09_print_mesh(const run_ctx *ctx, const lab09 *s);
double lab09_evaluate(run_ctx *ctx, void *lab);
int lab09_verify(run_ctx *ctx, void *lab);
void lab09_report(run_ctx *ctx, void *lab, lab_report *r);
void lab09_print(run_ctx *ctx, void *lab);

#endif
