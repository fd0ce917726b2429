/* One executor for every schedule of schedule.h: a rank's part of the
 * pipeline, its model chunks, and the loop that runs its list of actions.
 *
 * The chunks: a rank runs v model chunks, each a lab03 pipeline_stage at its
 * virtual stage (schedule_stage_of), with its own layers, activation blocks and
 * backward scratch. Their parameters, gradients and AdamW moments share one
 * flat buffer per kind, chunk after chunk, so the optimizer step, the global
 * gradient norm and a checkpoint see the rank's whole share at once.
 *
 * The messages: every activation that leaves a chunk for the next virtual
 * stage, and every input gradient for the previous one, is a message in a
 * buffer of its own (communication category). Between two chunks of one rank
 * it is only a copy; between ranks it is sent. When it is sent is derived
 * from the lists, identically on every rank: the lists are simulated on unit
 * times, and each message belongs to the "phase" at which its producer runs.
 * A rank runs its actions in order and, after the action of tick t, posts the
 * phase-t messages it sends or receives, all together (one NCCL group), in the
 * same order on both sides. Nothing then waits in a cycle:
 *   - a receive is posted in the phase its data is produced, before the
 *     action that needs it (which starts later), and only that action waits;
 *   - sends never wait (MPI: nonblocking; NCCL: every phase's group holds the
 *     matching receives of the same phase, so it completes once all ranks
 *     have run the actions of that tick, which only need earlier phases).
 * A list that could wait for ever is rejected when it is made (schedule_make
 * simulates it).
 *
 * Timeline events (beside lab03's "forward", "backward" and the step's):
 *   compute  "backward" is the input half where the schedule splits it,
 *            "backward_weight" the weight half (W), "alloc_wgrads"
 *   comm     "recv_act", "recv_grad" (waiting for and taking a message),
 *            "send_act", "send_grad" (posting it), around the communicator's
 *            "isend", "irecv", "wait" */
#ifndef LAB04_EXECUTOR_H
#define LAB04_EXECUTOR_H
#include "checkpoint.h"
#include "run.h"
#include "schedule.h"
#include "stage.h"

typedef struct pipeline_plan pipeline_plan; /* executor.c: a rank's actions and message phases */

typedef struct pipeline_rank {
    comm *pipe;
    schedule sched;          /* every rank's lists */
    schedule eval_sched;     /* their forwards only (--eval) */
    int rank, p, m, v;
    const gpt_layout *g;
    pipeline_stage *chunk;   /* v of them; chunk[c] is virtual stage schedule_stage_of(rank, c) */
    long n;                  /* elements of all chunks: the flat buffers' length */
    long *offset;            /* chunk c's range starts at offset[c] of the flat buffers */
    void *params, *grads;     /* the model's values (precision.h) */
    float *master;            /* the fp32 weights AdamW updates (= params in fp32) */
    float *adam_m, *adam_v;
    /* per chunk and micro-batch: its activations and weight-gradient inputs while in flight */
    gpt_acts **acts;
    gpt_wgrads **wgrads;
    gpt_wgrads **spare_wgrads; /* freed weight-gradient blocks, per chunk, kept for reuse */
    int *n_spare_wgrads;
    long *wgrads_bytes;      /* per chunk, one micro-batch's */
    pipeline_plan *train, *eval;
    void **spare_messages;   /* message buffers not in use, for both plans */
    int n_spare_messages, n_messages_allocated, cap_messages;
    double step_started, other_busy; /* the step's start; compute outside the chunks (optimizer) */
    /* ZeRO-1 (lab06 --zero-stage 1): the optimizer state of the flat buffers cut
     * into opt_shards equal slices of comm_chunk(n, opt_shards) elements (the
     * last one padded), this rank keeping slice opt_shard: adam_m, adam_v (and
     * in bf16 master) hold that slice alone, params and grads are padded to
     * `padded` elements for the reduce-scatter and all-gather. Unsharded:
     * opt_shards 1, the slice [0, n), padded = n. */
    int opt_shards, opt_shard;
    long slice_begin, slice_end, padded;
} pipeline_rank;

/* The flags --schedule NAME, --virtual-stages v (given or not on ctx->argv) on p
 * ranks and m micro-batches (and --capacity-scope rank, which m > 1 would
 * change): records the first rule they break in ctx (run_check) and returns
 * the kind (-1 if the name is unknown). */
int pipeline_check_flags(run_ctx *ctx, const char *name, int p, int m, int v);

/* Collective over pipe (p = its size). Makes the schedule (kind, p, m, v),
 * the rank's chunks with this rank's slice of the initial weights, and the
 * plans. This pipeline trains on rows [first_row, first_row + batch) of every
 * step's global batch, in m micro-batches. model NULL: the full-width model;
 * otherwise it must outlive the pipeline, and split schedules need its
 * backward_input hooks. (kind, p, m, v, layers) must pass schedule_check. */
void pipeline_init(pipeline_rank *pr, comm *pipe, const gpt_layout *g, const stage_model *model,
                   const dataset *data, uint64_t seed, int first_row, int batch, schedule_kind kind, int m, int v);
/* pipeline_init with the optimizer state sharded over opt_shards ranks, this
 * one keeping slice opt_shard (the fields above); 1, 0: pipeline_init. The
 * optimizer step and checkpoint view of a sharded rank are the caller's
 * (lab06's stage3d.c): the chunks' adam_m, adam_v and master are NULL.
 * opt_shards PIPELINE_STATES_ELSEWHERE: the caller shards the state its own
 * way (lab09's experts: two groups): opt_shards 0, no moments allocated
 * (adam_m, adam_v NULL), master the whole fp32 initial weights (fp32: the
 * parameters; bf16: a MEM_WORKSPACE copy the caller frees once it kept its
 * slices); the caller sets master, adam_m and adam_v to its own buffers
 * (MEM_OPTIM), which pipeline_free frees. */
#define PIPELINE_STATES_ELSEWHERE (-1)
void pipeline_init_sharded(pipeline_rank *pr, comm *pipe, const gpt_layout *g, const stage_model *model,
                           const dataset *data, uint64_t seed, int first_row, int batch, schedule_kind kind, int m,
                           int v, int opt_shards, int opt_shard);
/* The fp32 weights AdamW updates for the rank's slice (pr->master in bf16
 * sharded, else master + slice_begin), and its length. */
float *pipeline_slice_master(const pipeline_rank *pr);
void pipeline_free(pipeline_rank *pr);

/* A step: zero the gradients, then run this rank's list (gradients accumulate). */
void pipeline_step_begin(pipeline_rank *pr, int step);
void pipeline_run(pipeline_rank *pr);
/* The sum of the step's micro-batch mean losses on this rank (non-zero only
 * where the last virtual stage is). */
double pipeline_loss_sum(const pipeline_rank *pr);
/* Host seconds in compute since pipeline_step_begin (the step line's bubble). */
double pipeline_busy_seconds(const pipeline_rank *pr);
const char *pipeline_bubble_text(const pipeline_rank *pr, double theory, char buf[64]);

/* Full-width model: clip by the global gradient norm, every chunk of every
 * rank counted (*grad_norm: that norm before clipping), step AdamW on each
 * chunk, return the step's mean loss. Collective over pipe. */
double pipeline_optimizer_step(pipeline_rank *pr, const adamw_config *cfg, double clip, double *grad_norm);

/* Full-width model: the checkpoint view of the rank's chunks (one run each). */
void pipeline_checkpoint_view(pipeline_rank *pr, ckpt_view *v);

/* --eval: the held-out loss, the forwards of every micro-batch of every
 * held-out batch through the virtual stages in the schedule's own order.
 * Traffic stays out of the stats. Collective over pipe. */
double pipeline_evaluate(pipeline_rank *pr, const dataset *data, int batch, int seq);

/* Collective over pipe. t_F, t_B, t_W: the mean over the ranks of one
 * micro-batch's forward, backward (its input half where split) and weight
 * half on a rank's whole share of the layers, from the trace's measured steps
 * (t_W 0 where the schedule does not split: t_B is then the whole backward). */
void pipeline_measured_times(const pipeline_rank *pr, int first_measured, double t[3]);

/* Collective over pipe. Every rank's chunks (virtual stage, layers), their
 * activation and weight-gradient blocks per micro-batch and in flight at the
 * peak (schedule_in_flight), and the measured activation peak per rank, set as
 * members of the run record `record` (a jansson object); rank 0 also prints them. */
void pipeline_report_json(const pipeline_rank *pr, json_t *record);
/* This rank's activation peak by the schedule: sum over chunks of blocks in
 * flight x their bytes. */
double pipeline_acts_formula_bytes(const pipeline_rank *pr);

#endif
