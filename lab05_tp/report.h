/* lab05's state, shared by main.c (which sets it up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB05_REPORT_H
#define LAB05_REPORT_H
#include "lab_main.h"
#include "tp.h"

typedef struct lab05 {
    int check_sync, sequence_parallel; /* the flags */
    comm tp;
    tp_layout tl;
    tp_hooks th; /* the Megatron layer: common/model's layer with lab05's f, g and row-parallel bias */
    model_states ms;
    gpt_acts acts;
    gpt_grad_scratch scratch;
    long partial;          /* SP: the replicated tensors' partial gradients, packed for one all-reduce */
    void *partial_staging; /* (0 and NULL without SP) */
    grad_norm norm;        /* tp_grad_squares' two sums, on the device */
    int *tokens, *targets;
    int in_sync; /* --check-sync's verdict */
    char layout[48];
    char comm_formula_text[200];
} lab05;

/* The step's mean loss (main.c; --eval's too). */
double lab05_mean_loss(const tp_layout *tl, comm *tp, const gpt_acts *acts);

void lab05_check(run_ctx *ctx, void *lab);
void lab05_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab05_plan(const run_ctx *ctx, void *lab, run_report *r);
/* start's header line: the heads, MLP units and block weights a rank holds */
void lab05_print_split(const run_ctx *ctx, const lab05 *t);
double lab05_evaluate(run_ctx *ctx, void *lab);
int lab05_verify(run_ctx *ctx, void *lab);
void lab05_report(run_ctx *ctx, void *lab, lab_report *r);
void lab05_print(run_ctx *ctx, void *lab);

#endif
