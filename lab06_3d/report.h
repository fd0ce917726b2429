/* lab06's state, shared by main.c (which sets the grid up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB06_REPORT_H
#define LAB06_REPORT_H
#include "dp.h"
#include "executor.h"
#include "grid.h"
#include "lab_main.h"
#include "report3d.h"
#include "stage3d.h"
#include "tp.h"

typedef struct lab06 {
    grid_dims flag_dims; /* the flags: --tp, --pp, --dp (grid_defaults' for the rank count until given) */
    int micro_batches, virtual_stages, check_sync, sequence_parallel, zero_stage;
    const char *schedule_arg;
    grid_dims dims; /* the grid of the run: the given degrees, the omitted ones filled in (grid_choose) */
    int kind, v;    /* the schedule, its chunks per rank */
    process_grid grid;
    json_t *grid_record; /* the grid map's member of the run record */
    tp_layout tl;
    stage3d s3;
    pipeline_rank pr;
    dp_grad_sync dp_sync;
    double theory; /* the schedule's textbook bubble */
    int in_sync;   /* --check-sync's verdict */
    report3d rep;
    char layout[72];
    char states_text[64];
} lab06;

void lab06_flag_defaults(int ranks, void *lab);
void lab06_check(run_ctx *ctx, void *lab);
void lab06_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab06_plan(const run_ctx *ctx, void *lab, run_report *r);
void lab06_dry_run(run_ctx *ctx, void *lab, th_run *need, run_report *r);
void lab06_print_grid(const run_ctx *ctx, const lab06 *s);
double lab06_evaluate(run_ctx *ctx, void *lab);
int lab06_verify(run_ctx *ctx, void *lab);
void lab06_report(run_ctx *ctx, void *lab, lab_report *r);
void lab06_print(run_ctx *ctx, void *lab);

#endif
