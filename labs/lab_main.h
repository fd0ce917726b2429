/* The lab skeleton: what every lab does in the same order, once, so that a
 * lab's main.c holds only what its technique adds. A lab is a table of its
 * parts (lab_def) over its own state, and lab_main runs them:
 *
 *   defaults  the lab's flag defaults that depend on the rank count (--help prints them)
 *   parse the flags (the shared ones and the lab's)
 *   check     the lab's own rules for its flags (run_check)      -> status 2 on every rank
 *   run_setup the device, the comm, the data, the outputs
 *   predict   what the run needs by theory/ (a th_run), from the flags alone;
 *             lab_start refuses it when it cannot fit, before anything is allocated
 *   plan      the layout's name and the formulas the summary prints beside the measurement
 *   --dry-run: dry_run (the lab's lines above theory's prediction, what only it
 *             knows exactly), theory's prediction of the need, dry_run_notes (lines
 *             below the prediction's tables), the memory verdict, then exit 0
 *   setup     communicators, the model's shards, the checkpoint's view of them
 *             (then --resume reads into that view)
 *   start     what needs the resumed weights (bf16's rounding of them, the buffers, a header line)
 *   step      one optimizer step, between run_step_begin and run_step_end (then --save-every)
 *   trained   what the steps measured, read before --eval's forwards add to the clocks
 *   evaluate  --eval's held-out loss
 *   verify    --check-sync and the like: 0 makes the run exit 1
 *   report    the record's lab members and the summary's figures (the lab's report.c)
 *   print     lines after the summary (report.c)
 *   done      frees what setup and start allocated
 *
 * A hook the lab leaves NULL is skipped. Every hook gets the run and the lab's
 * state (`lab`, whose flags point into it). */
#ifndef PL_LAB_MAIN_H
#define PL_LAB_MAIN_H
#include "lab_run.h"
#include <jansson.h>

/* What one step hands back to the step line. */
typedef struct lab_step {
    double loss;      /* the global batch's mean loss, the same on every rank that prints it */
    double grad_norm; /* the whole model's gradient norm before clipping */
    const char *note; /* the step line's tail (the bubble, the top-k margin), or NULL */
    char text[96];    /* room for the note */
} lab_step;

/* What the end of the run reports: the summary's figures and the record's members. */
typedef struct lab_report {
    run_report run;   /* plan fills the layout and formulas; report adds comms, params, acts formula */
    json_t *record;   /* the lab's members of the run record: an empty object report sets members on */
    int model_states; /* 1 (the default): theory's bytes per parameter beside the allocator's (lab_finish) */
} lab_report;

typedef struct lab_def {
    lab_info info; /* name, one-line summary, the lab's flags */
    void (*defaults)(int ranks, void *lab); /* after MPI_Init, before the flags are parsed */
    void (*check)(run_ctx *ctx, void *lab); /* ctx->argc, ctx->argv: the command line */
    void (*predict)(const run_ctx *ctx, void *lab, th_run *need); /* need: lab_run_config's on entry */
    void (*plan)(const run_ctx *ctx, void *lab, run_report *r);
    /* --dry-run, before theory's prediction is printed: the lab's lines above it (lab06's grid map) and
     * what the lab knows more exactly than predict did (lab02's shard plan: need's units, r's traffic) */
    void (*dry_run)(run_ctx *ctx, void *lab, th_run *need, run_report *r);
    /* --dry-run, rank 0, below the prediction's tables (lab07's Ulysses all-to-all, lab08's) */
    void (*dry_run_notes)(run_ctx *ctx, void *lab, const th_run *need);
    void (*setup)(run_ctx *ctx, void *lab, ckpt_view *view);
    void (*start)(run_ctx *ctx, void *lab);
    /* i: this run's step (0 first), step: the global one (a resume counts on: the batch and AdamW's t) */
    void (*step)(run_ctx *ctx, void *lab, int i, int step, lab_step *out);
    void (*trained)(run_ctx *ctx, void *lab);
    double (*evaluate)(run_ctx *ctx, void *lab);
    int (*verify)(run_ctx *ctx, void *lab);
    void (*report)(run_ctx *ctx, void *lab, lab_report *r);
    void (*print)(run_ctx *ctx, void *lab);
    void (*done)(void *lab);
} lab_def;

/* Runs the lab from MPI_Init to MPI_Finalize; returns main's exit status (0,
 * 1 when verify failed, 128 + the signal when interrupted: run_exit_status). */
int lab_main(int argc, char **argv, const lab_def *def, void *lab);

#endif
