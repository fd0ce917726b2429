/* lab01's state, shared by main.c (which sets it up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB01_REPORT_H
#define LAB01_REPORT_H
#include "experts_metrics.h"
#include "dp.h"
#include "lab_main.h"

typedef struct lab01 {
    double bucket_mb; /* the flags */
    int check_sync, grad_accum;
    const char *dump_weights;
    int rows, micro; /* this rank's rows of the global batch; the rows of one accumulation step */
    gpt_layout g;
    comm world;
    model_states ms;
    gpt_acts acts;
    gpt_grad_scratch scratch;
    int *tokens, *targets;
    dp_grad_sync sync;
    run_experts_tally moe; /* --experts: the step's figures, added over the micro-batches */
    int in_sync;           /* --check-sync's verdict */
    char layout[48];
    char comm_formula_text[64];
} lab01;

void lab01_check(run_ctx *ctx, void *lab);
void lab01_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab01_plan(const run_ctx *ctx, void *lab, run_report *r);
double lab01_evaluate(run_ctx *ctx, void *lab);
int lab01_verify(run_ctx *ctx, void *lab);
void lab01_report(run_ctx *ctx, void *lab, lab_report *r);

#endif
