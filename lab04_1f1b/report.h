/* lab04's state, shared by main.c (which sets it up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB04_REPORT_H
#define LAB04_REPORT_H
#include "executor.h"
#include "lab_main.h"

typedef struct lab04 {
    int micro_batches, virtual_stages, print_schedule; /* the flags */
    const char *schedule_arg;
    int kind;             /* the schedule (schedule_kind) --schedule names */
    int chunks;           /* v: the model chunks per rank it runs */
    double bubble_theory; /* the textbook's, on unit times */
    comm pipe;
    gpt_layout g;
    pipeline_rank pr;
    char layout[64];
    char comm_formula_text[112];
} lab04;

void lab04_check(run_ctx *ctx, void *lab);
void lab04_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab04_plan(const run_ctx *ctx, void *lab, run_report *r);
double lab04_evaluate(run_ctx *ctx, void *lab);
void lab04_report(run_ctx *ctx, void *lab, lab_report *r);

#endif
