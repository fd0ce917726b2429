/* What every lab's main does the same way at its two ends: --dry-run (theory/
 * predict's needs of the run, then common/run's formula lines) and the finish
 * (the record, theory's model-state bytes beside the allocator's, the summary).
 *
 * It lives here, between the labs and the two folders below them, because it
 * joins both: common/ may not include theory/ (it knows no parallel strategy)
 * and theory/ may not include common/ (pure numbers). A lab builds the config
 * from lab_run_config and sets what its flags add (the grid, the schedule, the
 * ZeRO stage, ...); theory/predict decides what to predict from that config. */
#ifndef PL_LAB_RUN_H
#define PL_LAB_RUN_H
#include "checkpoint.h"
#include "predict.h"
#include "run.h"

/* The course model theory/ counts for a run's model: its shape, and with
 * --experts the experts and top-k (every exact formula then counts them). */
th_model lab_theory_model(const gpt_config *c);

/* The config every lab shares (ranks, device, precision, batch, the course
 * model with its experts, --recompute), as a grid of data parallelism over all
 * ranks with one micro-batch and no gradient accumulation: the lab overwrites
 * what its flags change. */
th_run lab_run_config(const run_ctx *ctx);

/* Between run_setup and anything the size of the run: refuses a run that
 * cannot fit, then run_start (--out created, the header printed). `need` is
 * the run's config as --dry-run predicts it, built from the flags alone (in
 * theory/'s doubles: no layout, nothing allocated, so --seq 10^9 or
 * --experts 10^9 overflow nothing on the way here). Each rank's floor, its
 * predicted peak (theory/predict.h: the sum of its categories' peaks, on CUDA
 * the CPU's workspace, which the kernels' own scratch adds to, a category not
 * predicted left out), must fit --max-memory-mb per rank when given, else the
 * machine (run_memory_limit: the ranks of a host together in its memory; on
 * CUDA a rank's share of its GPU). Over it: one line naming the flags that
 * size the largest category, status 2 on every rank, nothing created.
 * --dry-run is refused only when it fits neither the cap nor the machine (a
 * cap plans for another machine; lab07 prints the largest --seq under it) and
 * prints the verdict (lab_dry_run_exit). Collective. */
void lab_start(run_ctx *ctx, const th_run *need);

/* r.comm_formula_bytes = this: the busiest rank's ring bytes of the prediction
 * (lab06, whose formula is the sum of theory's per kind) */
#define DRY_RUN_PREDICTED_RING (-2.0)

/* --dry-run: rank 0 prints theory/predict's needs of `need`, then notes(ctx,
 * lab, need) when given (the lab's lines below the tables), the memory verdict
 * of `need` against lab_start's limits, then run_dry_run_exit's lines of r;
 * every rank exits 0. Collective. */
typedef void lab_dry_run_notes(run_ctx *ctx, void *lab, const th_run *need);
void lab_dry_run_exit(run_ctx *ctx, const th_run *need, run_report r, lab_dry_run_notes *notes, void *lab)
    __attribute__((noreturn));

/* The end of a run: the record (the lab's `members`, a jansson object whose
 * reference this takes, or NULL; then the checkpoint's and --eval's), with
 * `states` theory's model-state bytes per parameter in the run's precision
 * beside the allocator's (a lab holding whole parameters, r.params_held of
 * them; lab02 prints its own), then run_finish and the view freed. Collective. */
void lab_finish(run_ctx *ctx, ckpt_view *view, double eval_loss, struct json_t *members, int states, run_report r);

/* One forward of the lab's model on acts, returning its mean loss. */
typedef double lab_forward_loss(void *arg, gpt_acts *acts);
/* A whole model's forward (arg: a lab_model; hooks NULL: the default ones). */
typedef struct { const gpt_layout *g; const gpt_layer_hooks *hooks; const void *params; } lab_model;
double lab_model_forward_loss(void *model, gpt_acts *acts);

/* --eval's loop, one for every lab: the sum over the held-out batches of
 * batch_loss(arg, heldout, b), the lab's forward of held-out batch b laid out
 * as in training (*batches: their count, the caller's divisor). The traffic of
 * `quiet` (NULL: none) stays out of its counts (comm_quiet), so the record's
 * per-step figures are the training's. */
typedef double lab_batch_loss(void *arg, const dataset *heldout, int b);
double lab_heldout_sum(const dataset *data, int batch, int seq, comm *quiet, lab_batch_loss *batch_loss, void *arg,
                       int *batches);

/* --eval: the mean loss over the held-out batches, this rank forward only on
 * `rows` rows from first_row as in training (micro > 0: micro rows at a time,
 * each loss weighted micro/rows, lab01's --grad-accum), averaged over `world`.
 * The traffic of `quiet` (NULL: none) stays out of its counts, so the record's
 * per-step figures are the training's. Collective. */
double lab_heldout_loss(const run_ctx *ctx, comm *world, comm *quiet, int first_row, int rows, int micro,
                        gpt_acts *acts, int *tokens, int *targets, lab_forward_loss *forward, void *arg);

#endif
