/* lab07's state, shared by main.c (which sets it up and steps it) and
 * report.c (which checks its flags, predicts its needs and reports it). */
#ifndef LAB07_REPORT_H
#define LAB07_REPORT_H
#include "cp.h"
#include "lab_main.h"

typedef struct lab07 {
    int cp_degree; /* the flags */
    const char *layout_name, *algo_name;
    int N, dp; /* the CP degree (--cp, 0: every rank) and data parallelism over the groups */
    th_cp_layout cp_layout;
    th_cp_algo algo;
    int rows, dp_rank; /* this group's rows of the global batch, and which group */
    gpt_layout g, local; /* the model; and the same with the positions a rank's layers run on */
    comm world, cp;
    cp_hooks ch;
    model_states ms;
    gpt_acts acts;
    gpt_grad_scratch scratch;
    int *tokens, *targets;
    double first_step_attention; /* the warm-up step's attention CPU seconds, left out */
    /* what training measured (lab07_trained, after the steps, before --eval adds to it) */
    double *attention_per_rank; /* the CP group's attention kernels per step, seconds */
    double rate_bw[2];          /* the ring's block attention FLOP/s and point-to-point bytes/s */
    th_cp_ring_hiding hiding;
    double *scores; /* the CP group's unmasked causal scores per sequence and head of the model */
    char layout[64];
    char comm_formula_text[160];
} lab07;

void lab07_check(run_ctx *ctx, void *lab);
void lab07_predict(const run_ctx *ctx, void *lab, th_run *need);
void lab07_plan(const run_ctx *ctx, void *lab, run_report *r);
void lab07_dry_run_notes(run_ctx *ctx, void *lab, const th_run *need);
/* start's header lines: the grid and the chunk map. Collective. */
void lab07_print_layout(const run_ctx *ctx, const lab07 *c);
void lab07_trained(run_ctx *ctx, void *lab);
double lab07_evaluate(run_ctx *ctx, void *lab);
void lab07_report(run_ctx *ctx, void *lab, lab_report *r);
void lab07_print(run_ctx *ctx, void *lab);

#endif
