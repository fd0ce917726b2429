/* ZeRO: data parallelism that stops storing the training state N times.
 *
 * Every rank still runs the whole model on its own rows of the batch, as in
 * lab01. What changes is who stores what (shards.h: rank r owns chunk r of
 * every unit of the flat layout):
 *
 *   stage 1  optimizer state sharded. Gradients are reduce-scattered instead of
 *            all-reduced: each rank receives the summed gradient of its own
 *            chunks only, runs AdamW there, and an all-gather hands everyone
 *            the updated parameters.
 *   stage 2  + gradients sharded. A rank keeps the gradient of its chunks and
 *            one bucket: the backward writes a unit's gradient into the
 *            bucket, the bucket is reduce-scattered into the shard, and the
 *            next unit reuses it. The full gradient never exists.
 *   stage 3  + parameters sharded. A rank keeps its chunks of the parameters;
 *            a unit (one block) is all-gathered just before its forward, and
 *            again just before its backward, into one buffer that the next
 *            gather reuses (released).
 *
 * The reduce-scatter plus all-gather moves exactly what DP's all-reduce moves
 * (a ring all-reduce *is* those two); stage 3 gathers twice, about 1.5x.
 * Gradient clipping needs the norm of the whole gradient, which no rank holds:
 * each sums the squares of its chunks and the ranks add their sums. */
#ifndef LAB02_ZERO_H
#define LAB02_ZERO_H
#include "checkpoint.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "shards.h"
#include <stdint.h>

typedef struct zero_state {
    int stage;
    const gpt_layout *g;
    comm *dp;             /* the data-parallel group: every rank */
    shard_plan plan;
    /* the model's values (precision.h: fp32, or bf16) */
    void *params;         /* stages 1-2: a full buffer; stage 3: the one gathered unit */
    void *param_shard;    /* stage 3 only (stages 1-2: this rank's chunks live inside params) */
    void *grads;          /* stage 1: a full buffer; stages 2-3: the one bucket */
    void *grad_shard;     /* stages 2-3 only (stage 1: inside grads) */
    /* fp32 */
    float *master;        /* bf16 only: this rank's chunks of the fp32 weights AdamW updates (a shard,
                           * optimizer state); NULL in fp32, where AdamW updates the parameters */
    float *adam_m, *adam_v; /* shards, every stage */
    int gathered_unit;    /* stage 3: the unit whose parameters `params` holds, -1 none */
    grad_norm norm;       /* the owned chunks' squared norm, summed on the device */
} zero_state;

/* Allocates every buffer of the stage and initialises the parameters: the full
 * buffer on every rank (stages 1-2), only this rank's chunks (stage 3). Unit
 * size: bucket_mb as lab01's --bucket-mb for stages 1-2 (stage 1: 0 is one
 * unit, the whole model; stage 2: 0 is one block per unit); one block per unit
 * in stage 3. */
void zero_init(zero_state *z, const gpt_layout *g, comm *dp, int stage, double bucket_mb, uint64_t seed);
/* That unit size in elements (shard_plan_init's unit_elems). */
long zero_unit_elems(int stage, double bucket_mb);
void zero_free(zero_state *z);

/* Forward of the whole model on this rank's rows, block by block. */
void zero_forward(zero_state *z, gpt_acts *a);
/* Backward from the loss, head to embedding; each unit's gradient is
 * reduce-scattered (summed over the ranks) as soon as its lowest block is
 * done. dloss: 1 / tokens of the GLOBAL batch, so the sum is the mean. */
void zero_backward(zero_state *z, gpt_acts *a, gpt_grad_scratch *s, float dloss);
/* Clip by the global norm, AdamW on this rank's chunks, and (stages 1-2)
 * all-gather the updated parameters. t is the 1-based step. */
/* Returns the whole gradient's norm before clipping. */
double zero_optimizer_step(zero_state *z, const adamw_config *cfg, int t, float max_norm);

/* What this rank holds, for checkpoints: the parameters of every unit (stages
 * 1-2) or only its chunks (stage 3), and its chunks of the AdamW moments. In
 * bf16 the fp32 master weights are the parameters saved: its chunks in every
 * stage. */
void zero_checkpoint_view(const zero_state *z, ckpt_view *v);
/* After a bf16 run resumed its master chunks: round them into the parameters
 * and (stages 1-2) gather the whole model, as after an optimizer step; that
 * gather is set-up, left out of the traffic counts. Nothing in fp32. */
void zero_params_from_master(zero_state *z);

#endif
