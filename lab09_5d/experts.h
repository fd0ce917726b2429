/* lab08's experts on lab09's grid: the MLP slot of every layer is lab08's EP
 * hook (its all-to-alls over an EP group carved from the stage's t x c x d
 * ranks, common/mesh.h), in lab03's pipeline stages, beside lab05's TP linears
 * and regions and lab07's attention.
 *
 * A rank's buffer holds its layout (lab08's ep_layout: E/e experts a layer;
 * at t > 1 attention's matrices cut to the rank's heads as lab05 cuts them),
 * so the stage's model code, checkpoint view and optimizer step go by runs:
 * each a piece of the global layout this rank holds, of one of three kinds:
 *   replicated  LayerNorms, attention's output bias, router, shared experts,
 *               embedding, head: the same on all t x c x d ranks of the stage
 *   expert      the rank's E/e experts: the same on its EDP group (the ranks
 *               at the same place of every EP block)
 *   TP-sharded  attention's q|k|v and output matrices (t > 1): the same on
 *               the c x d replicas of its (tp, pp)
 *
 * Experts with TP need sequence parallelism (as Megatron's MoE layers do):
 * outside attention a TP rank holds T/(c t) positions of each of its rows,
 * and the MLP slot takes them as they are (gpt_layer_hooks.mlp_on_shard): the
 * all-to-all sends each rank's own tokens, no TP region around the experts.
 * The routing decides over whole sequences through the t x c ranks that hold
 * their positions (moe_split over the mesh's sequence group).
 *
 * The gradient: every micro-batch's loss weight is 1/(B/d x T/c), the mean of
 * a replica's positions. A replicated tensor's gradient on a rank is that of
 * its own positions (partial under SP), so it is summed over the whole stage;
 * a TP-sharded one saw all of its CP rank's positions (attention gathers
 * them), summed over the c x d replicas; an expert's gathered every token of
 * its EP group through the all-to-all, summed over its EDP group. Each is then
 * c x d x the global batch's mean gradient, and the 1/(c d) rides in the norm
 * and AdamW's gradient scale. */
#ifndef LAB09_EXPERTS_H
#define LAB09_EXPERTS_H
#include "checkpoint.h"
#include "comm.h"
#include "ep.h"
#include "executor.h"
#include "optim.h"
#include "stage.h"
#include "tp.h"

/* Each kind of run is summed over its group; --zero-stage 1: the rank's
 * elements of each kind (its runs in buffer order, packed) cut into slices
 * over that kind's group (lab06's ZeRO-1 once
 * per kind): a rank keeps the moments, and in bf16 the fp32 master weights,
 * of its slices alone. */
enum { RUNS_REPLICATED, RUNS_EXPERT, RUNS_TP_SHARDED, RUN_KINDS };
typedef struct grid_run { long local, global, n; int kind; } grid_run;
typedef struct run_piece { long local, global, n, packed; int chunk; } run_piece;
typedef struct expert_shards {
    run_piece *pieces[RUN_KINDS]; /* the rank's runs cut at chunk ends, packed one kind after another */
    int n_pieces[RUN_KINDS];
    long n[RUN_KINDS], slice[RUN_KINDS]; /* packed elements; comm_chunk(n, group size) */
    long kept[RUN_KINDS];                /* where each kind's slice starts in master, adam_m, adam_v */
    comm *group[RUN_KINDS];              /* where each kind is summed (set at init): the stage, EDP, the replicas */
    void *staging[RUN_KINDS];            /* slice x group size values: the packed gradient, then parameters */
} expert_shards;

typedef struct grid_experts {
    gpt_layout g;       /* the whole model's layout: the runs' global offsets */
    gpt_config route;   /* the routing's: seq = a rank's positions of each sequence (T/c, under SP T/(c t)) */
    ep_hooks eh;        /* lab08's MLP slot and the local layer block */
    tp_hooks th;        /* t > 1: lab05's linears and regions, in the same layer */
    const tp_layout *tl;
    grid_run *runs;     /* this rank's runs of the global layout */
    int n_runs;
    comm *replicas;       /* the c x d ranks (sh.group: where each kind is summed) */
    grad_norm norm;       /* the device's three sums of squares, one per kind */
    int zero;             /* --zero-stage 1: the optimizer state in shards */
    expert_shards sh;
} grid_experts;

/* The slot over ep (its EP group), rows per micro-batch of `positions` each
 * (cfg->seq, or a CP rank's T/c with split its CP group's: moe_route then
 * decides over whole sequences), beside tl's TP layer (t = 1: none) over tp
 * (stage: the t x c x d ranks of the stage; tl sequence-parallel at t > 1,
 * split then the sequence group's): its buffers sized to the capacity's bound
 * when --capacity-factor is given. */
void grid_experts_init(grid_experts *x, const gpt_config *cfg, int positions, const moe_split *split, comm *ep,
                       comm *edp, comm *replicas, long rows, const tp_layout *tl, comm *tp, comm *stage);
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
/* After the flush: the runs' gradients summed, each kind over its group
 * (ZeRO-1: reduce-scattered into the slices), clipped by the whole model's
 * norm (every element once), AdamW on every run (ZeRO-1: on the slices, then
 * all-gathered); returns the step's mean loss, *grad_norm the norm before
 * clipping. Collective over the pipeline, stage, replicas, EP, EDP and TP groups. */
double grid_experts_optimizer_step(pipeline_rank *pr, grid_experts *x, comm *pipe, const adamw_config *cfg,
                                   double clip, double *grad_norm);

#endif
