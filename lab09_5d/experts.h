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

/* --zero-stage 1: the rank's replicated elements (its runs in buffer order,
 * packed) cut into slices over the replicas, its expert elements over the
 * EDP group (lab06's ZeRO-1 once per kind of run): a rank keeps the moments,
 * and in bf16 the fp32 master weights, of its two slices alone. */
enum { RUNS_REPLICATED, RUNS_EXPERT, RUN_KINDS };
typedef struct run_piece { long local, global, n, packed; int chunk; } run_piece;
typedef struct expert_shards {
    run_piece *pieces[RUN_KINDS]; /* the rank's runs cut at chunk ends, packed one kind after another */
    int n_pieces[RUN_KINDS];
    long n[RUN_KINDS], slice[RUN_KINDS]; /* packed elements; comm_chunk(n, group size) */
    long kept[RUN_KINDS];                /* where each kind's slice starts in master, adam_m, adam_v */
    comm *group[RUN_KINDS];              /* the replicas, the EDP group */
    void *staging[RUN_KINDS];            /* slice x group size values: the packed gradient, then parameters */
} expert_shards;

typedef struct grid_experts {
    gpt_layout g;       /* the whole model's layout: the runs' global offsets */
    ep_hooks eh;        /* lab08's MLP slot and the local layer block */
    ep_run *runs;       /* this rank's runs of the global layout (lab08's ep_runs) */
    int n_runs;
    comm *edp, *replicas; /* where expert and replicated runs are summed */
    grad_norm norm;       /* the device's two sums of squares: replicated, experts */
    int zero;             /* --zero-stage 1: the optimizer state in shards */
    expert_shards sh;
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
/* --zero-stage 1, after pipeline_init_sharded(.., PIPELINE_STATES_ELSEWHERE):
 * the two kinds' slices, their moments and master weights (bf16: kept from
 * the pipeline's initial copy, which is freed), the staging buffers. */
void grid_experts_zero_init(pipeline_rank *pr, grid_experts *x);
/* The parameters from the master weights (the start, a resume): unsharded
 * every element; under ZeRO-1 the slices', all-gathered. */
void grid_experts_params_from_master(pipeline_rank *pr, grid_experts *x);
/* The checkpoint view of the rank's chunks: every run at its global offset
 * (ZeRO-1: the parameters so, the moments and bf16 master of the slices). */
void grid_experts_checkpoint_view(const pipeline_rank *pr, const grid_experts *x, ckpt_view *v);
/* After the flush: the runs' gradients summed (replicated over the replicas,
 * experts over EDP; ZeRO-1: reduce-scattered into the slices), clipped by the
 * whole model's norm (every element once), AdamW on every run (ZeRO-1: on the
 * slices, then all-gathered); returns the step's mean loss, *grad_norm the
 * norm before clipping. Collective over the pipeline, replicas and EDP groups. */
double grid_experts_optimizer_step(pipeline_rank *pr, grid_experts *x, comm *pipe, const adamw_config *cfg,
                                   double clip, double *grad_norm);

#endif
