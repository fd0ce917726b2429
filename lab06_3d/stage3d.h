/* What one rank of the 3D grid computes: its pipeline chunks (lab04's
 * pipeline_rank of lab03's stages, run by lab04's executor under any of its
 * schedules) whose layers are lab05's tensor-parallel layers, and the
 * optimizer step that closes a step of the grid.
 *
 * Each chunk's part of the local buffer is lab05's layout cut to its layers
 * (one chunk per rank except under interleaved and zb-v):
 *   stage 0:    [ embedding ][ local layers lo..hi-1 ]
 *   middle:     [ local layers lo..hi-1 ]
 *   last stage: [ local layers lo..hi-1 ][ head ]
 * where a local layer holds this TP rank's shards of the block matrices plus
 * the replicated LayerNorms and row-parallel biases. The data-parallel replicas
 * of one (tp, pp) hold the same elements, so lab01's all-reduce runs on the
 * buffer as it is. */
#ifndef LAB06_STAGE3D_H
#define LAB06_STAGE3D_H
#include "executor.h"
#include "grid.h"
#include "lab_main.h"
#include "optim.h"
#include "stage.h"
#include "tp.h"

typedef struct stage3d {
    const tp_layout *tl; /* this rank's TP shard shapes */
    comm *tp;            /* its TP group */
    tp_hooks layer;      /* lab05's layer: common/model's with the TP (and SP) hooks */
    stage_model model;   /* the hooks pipeline_stage calls: lab05's layout and layer */
    grad_norm norm;      /* tp_grad_squares' two sums, on the device */
    void *partial_staging;  /* --sequence-parallel: the partial gradients of a chunk, packed */
} stage3d;

/* Fill s->model so that the stages run lab05's layer (common/model's with
 * the TP hooks, s->layer) at lab05's part, from tp_init_params (after
 * run_setup: it allocates the norm's sums on the device). s must not move
 * afterwards: the hooks point to it. */
void stage3d_init(stage3d *s, const tp_layout *tl, comm *tp);
/* After pipeline_init, with sequence parallelism: the staging of the largest
 * chunk's partial gradients (communication category). */
void stage3d_alloc_partials(stage3d *s, const pipeline_rank *pr);
void stage3d_free(stage3d *s);

/* The step's end, collective over the grid. With sequence parallelism first
 * sum the partial gradients over the TP group (sp_sum_partial_grads, chunk by
 * chunk); clip by the norm of the whole model's gradient, every element counted
 * once, and step AdamW; returns the step's mean loss over the global batch.
 * Unsharded (pipeline_init) it follows the DP all-reduce and steps the rank's
 * chunks. Under ZeRO-1 (pipeline_init_sharded over the DP group) it replaces
 * that all-reduce: the gradients are reduce-scattered over DP (each replica
 * keeps the sum of its slice), the norm's squares of the slices are summed
 * over DP too, AdamW steps the slice, and the parameters are all-gathered.
 * *grad_norm: the norm of the mean gradient before clipping (lab01's). */
double stage3d_optimizer_step(pipeline_rank *pr, stage3d *s, process_grid *g, const adamw_config *cfg,
                              double clip, double *grad_norm);
/* After a resume (or at start): the parameters from the fp32 weights (bf16
 * rounding; sharded, then all-gathered over DP, left out of the traffic). */
void stage3d_params_from_master(pipeline_rank *pr, process_grid *g);

/* --eval: lab04's pipeline_evaluate (the pipeline forward on the held-out
 * batches, no backward), each replica on its own rows of every held-out batch
 * (the stages' first_row), as in training; averaged over the grid's DP group
 * (lab09: the c x d replicas), that is the mean over the whole batch, lab01's;
 * under SP each TP rank's loss is that of its positions, so averaged over TP
 * too. The forward's TP all-reduces, CP exchanges (g->cp) and the traffic of
 * `quiet` (lab09's EP group; NULL: none) stay out of the traffic counts, so
 * the record's per-step figures are the training's. */
double stage3d_evaluate(const run_ctx *ctx, pipeline_rank *pr, process_grid *g, int sequence_parallel, comm *quiet);
/* --check-sync: lab01's check over each group of ranks that hold the same
 * buffer (lab06: the DP replicas of one (tp, pp) position; lab09 with experts:
 * an EDP group), all groups agreeing; 1 when they hold bit-identical weights.
 * ZeRO-1 in bf16: no replica holds the whole master, so the parameters' bytes,
 * read as floats, are compared. Collective over the world. */
int stage3d_replicas_identical(const pipeline_rank *pr, comm *replicas);
/* ZeRO-1 over d replicas: theory's model states per element with the
 * optimizer's / d into r, in place of lab_finish's of a whole replica (the
 * measured figure adds the last slice's padding, report3d's ZeRO-1 lines);
 * text (64 bytes) holds its "2 + 2 + 12/d". */
void stage3d_zero1_states(lab_report *r, char *text, int t, int d);

/* The checkpoint view of the rank's chunks: lab05's tp_checkpoint_hold of each
 * chunk's layers, moved to where the chunk sits in the rank's buffers; under
 * ZeRO-1 the moments (and in bf16 the master weights) of the slice alone. */
void stage3d_checkpoint_view(pipeline_rank *pr, const tp_layout *tl, ckpt_view *v);

#endif
