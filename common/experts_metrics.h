/* The experts' figures of a step (--experts): what common/moe's routing
 * counted in each micro-batch's block (the aux loss, dropped choices, the
 * choices per expert, the groups tokens reached) added up over the
 * micro-batches and ranks, into the run's per-step record (run_ctx's
 * aux_losses, dropped, expert_load, ...), and --balance bias's step of the
 * routing bias on those sums. Kept out of run.c, which knows no experts. */
#ifndef PL_EXPERTS_METRICS_H
#define PL_EXPERTS_METRICS_H
#include "run.h"

/* --experts: a step's aux loss (already inside its loss; mean over the
 * data-parallel ranks) and its dropped choices (summed), for the record;
 * before run_step_end. */
void run_step_experts(run_ctx *ctx, int step, double aux_loss, double dropped);
/* --experts: the last step's choices per expert of every layer (counts[l E + e],
 * summed over the data-parallel ranks), for the summary and the record. */
void run_experts_load(run_ctx *ctx, const double *counts);
/* --experts: one step's figures added up over its micro-batches (lab01's
 * --grad-accum, lab03/lab04's pipeline stages): the sum of each micro-batch's aux
 * loss, its dropped choices, and its choices per (global) layer and expert,
 * load[l E + e]. Micro-batches of whole sequences make the sums exact: the aux
 * loss and the capacity are per sequence. */
typedef struct run_experts_tally {
    double aux_sum, dropped, *load;
    double groups_most, groups_sum, token_layers; /* node-limited routing: the groups tokens reached */
    int micro_batches; /* how many were added: the aux loss is their mean */
} run_experts_tally;
/* zero the tally for a new step (allocating load the first time); nothing without experts */
void run_experts_tally_begin(run_experts_tally *t, const gpt_config *c);
/* add a micro-batch's block a (its layers [a->lo, a->hi)), after its forward */
void run_experts_tally_add(run_experts_tally *t, const gpt_layout *g, const gpt_acts *a);
void run_experts_tally_free(run_experts_tally *t);
/* The step's figures into ctx (run_step_experts, and after the last step
 * run_experts_load): the n tallies (this rank's stages or chunks) added, each
 * aux loss the mean over its micro-batches, summed over c, the aux loss then
 * divided by `replicas` (the data-parallel ranks in c, whose losses are
 * averaged; 1 when c's ranks hold different layers). Collective over c. */
void run_experts_report(run_ctx *ctx, comm *c, const run_experts_tally *t, int n, int replicas, int step);
/* both for one micro-batch's block a: this step's expert figures summed over
 * world, the aux loss averaged (lab02, lab08) */
void run_experts_step(run_ctx *ctx, comm *world, const gpt_layout *g, const gpt_acts *a, int step);

#endif
