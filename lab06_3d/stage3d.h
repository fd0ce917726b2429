/* What one rank of the 3D grid computes: a pipeline stage (lab03's
 * pipeline_stage, driven by lab04's schedules) whose layers are lab05's
 * tensor-parallel layers, and the optimizer step that closes a step of the grid.
 *
 * The stage's local buffer is lab05's layout cut to the stage's layers:
 *   stage 0:    [ embedding ][ local layers lo..hi-1 ]
 *   middle:     [ local layers lo..hi-1 ]
 *   last stage: [ local layers lo..hi-1 ][ head ]
 * where a local layer holds this TP rank's shards of the block matrices plus
 * the replicated LayerNorms and row-parallel biases. The data-parallel replicas
 * of one (tp, pp) hold the same elements, so lab01's all-reduce runs on the
 * buffer as it is. */
#ifndef LAB06_STAGE3D_H
#define LAB06_STAGE3D_H
#include "grid.h"
#include "optim.h"
#include "stage.h"
#include "tp.h"

typedef struct stage3d {
    const tp_layout *tl; /* this rank's TP shard shapes */
    comm *tp;            /* its TP group */
    stage_model model;   /* the hooks pipeline_stage calls: lab05's tp_* functions */
    grad_norm norm;      /* tp_grad_squares' two sums, on the device */
} stage3d;

/* Fill s->model so that stage_init_model runs tp_range, tp_init_params,
 * tp_acts_alloc, tp_scratch_alloc, tp_forward and tp_backward (after
 * run_setup: it allocates the norm's sums on the device). */
void stage3d_init(stage3d *s, const tp_layout *tl, comm *tp);

/* After the DP all-reduce: clip by the norm of the whole model's gradient, every
 * element counted once, and step AdamW on this rank's part. Collective over the
 * grid. Returns the step's mean loss over the global batch. Adds its compute
 * time to st->busy_seconds. */
double stage3d_optimizer_step(pipeline_stage *st, stage3d *s, process_grid *g, const adamw_config *cfg,
                              double clip);

#endif
