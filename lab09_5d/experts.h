/* lab08's experts on lab09's grid: the MLP slot of every layer is lab08's EP
 * hook (its all-to-alls over an EP group carved from the c x d replicas,
 * common/mesh.h), in lab03's pipeline stages.
 *
 * A rank's buffer holds its layout (lab08's ep_layout: E/e experts a layer),
 * so the stage's model code, checkpoint view and optimizer step go by lab08's
 * runs: each a piece of the global layout this rank holds, replicated
 * (attention, router, LayerNorms, embedding, head: the same on all c x d
 * replicas of the stage) or expert weights (the same on the EDP group: the
 * replicas at the same place of every EP block).
 *
 * The gradient: every micro-batch's loss weight is 1/(B/d x T), a replica's
 * own rows' mean. Replicated runs are summed over the d replicas, an
 * expert's over its EDP group, having already gathered every token of its EP
 * group through the all-to-all: both are then d x the global batch's mean
 * gradient, and the 1/d rides in the norm and AdamW's gradient scale. */
#ifndef LAB09_EXPERTS_H
#define LAB09_EXPERTS_H
#include "checkpoint.h"
#include "comm.h"
#include "ep.h"
#include "executor.h"
#include "optim.h"
#include "stage.h"

typedef struct grid_experts {
    gpt_layout g;       /* the whole model's layout: the runs' global offsets */
    ep_hooks eh;        /* lab08's MLP slot and the local layer block */
    ep_run *runs;       /* this rank's runs of the global layout (lab08's ep_runs) */
    int n_runs;
    comm *edp, *replicas; /* where expert and replicated runs are summed */
    grad_norm norm;       /* the device's two sums of squares: replicated, experts */
} grid_experts;

/* The slot over ep (its EP group), rows per micro-batch of `positions` each
 * (cfg->seq, or a CP rank's T/c with split its CP group's: moe_route then
 * decides over whole sequences): its buffers sized to the capacity's bound
 * when --capacity-factor is given. */
void grid_experts_init(grid_experts *x, const gpt_config *cfg, int positions, const moe_split *split, comm *ep,
                       comm *edp, comm *replicas, long rows);
void grid_experts_free(grid_experts *x);
/* The stage model: lab08's hooks (the EP MLP in common/'s layer), the part
 * whose MLP pieces live in the hook, and each run's initial values (lab01's). */
stage_model grid_experts_model(grid_experts *x);
/* The checkpoint view of the rank's chunks: every run at its global offset. */
void grid_experts_checkpoint_view(const pipeline_rank *pr, const grid_experts *x, ckpt_view *v);
/* After the flush: the runs' gradients summed (replicated over the replicas,
 * experts over EDP), clipped by the whole model's norm (every element once),
 * AdamW on every run; returns the step's mean loss, *grad_norm the norm
 * before clipping. Collective over the pipeline, replicas and EDP groups. */
double grid_experts_optimizer_step(pipeline_rank *pr, grid_experts *x, comm *pipe, const adamw_config *cfg,
                                   double clip, double *grad_norm);

#endif
