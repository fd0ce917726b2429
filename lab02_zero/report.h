/* lab02's state, shared by main.c (which sets it up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it; the
 * ZeRO table's figures are zero_report.h's). */
#ifndef LAB02_REPORT_H
#define LAB02_REPORT_H
#include "lab_main.h"
#include "zero.h"
#include "zero_report.h"

typedef struct lab02 {
    int zero_stage; /* the flags */
    double bucket_mb;
    int rows; /* this rank's rows of the global batch */
    gpt_layout g;
    comm world;
    zero_state zero;
    gpt_acts acts;
    gpt_grad_scratch scratch;
    int *tokens, *targets;
    zero_figures fig; /* the stage's formulas beside the measurement (report, print) */
    char layout[48];
} lab02;

void lab02_check(run_ctx *ctx, void *lab);
void lab02_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab02_plan(const run_ctx *ctx, void *lab, run_report *r);
void lab02_dry_run(run_ctx *ctx, void *lab, th_run *need, run_report *r);
double lab02_evaluate(run_ctx *ctx, void *lab);
void lab02_report(run_ctx *ctx, void *lab, lab_report *r);
void lab02_print(run_ctx *ctx, void *lab);

#endif
