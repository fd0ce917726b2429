/* lab03's state, shared by main.c (which sets it up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB03_REPORT_H
#define LAB03_REPORT_H
#include "lab_main.h"
#include "stage.h"

typedef struct lab03 {
    double bubble_theory; /* one batch: (p-1)/p */
    comm pipe;
    gpt_layout g;
    pipeline_stage st;
    char layout[32];
    char comm_formula_text[96];
} lab03;

void lab03_check(run_ctx *ctx, void *lab);
void lab03_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab03_plan(const run_ctx *ctx, void *lab, run_report *r);
double lab03_evaluate(run_ctx *ctx, void *lab);
void lab03_report(run_ctx *ctx, void *lab, lab_report *r);

#endif
