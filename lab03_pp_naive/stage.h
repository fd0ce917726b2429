/* A pipeline stage: one rank's contiguous run of layers, and the two things it
 * does with a micro-batch: a forward (receive the input from the previous stage,
 * run the layers, send the output on) and a backward (receive the gradient of
 * the output from the next stage, run the layers backwards, send the gradient
 * of the input back).
 *
 * Every exchange is one paired comm_sendrecv, so a send and a receive that two
 * neighbours post at the same moment can never wait on each other. lab04 runs
 * the same stages (one per model chunk of a rank, as "virtual stages") and the
 * same compute, under its own schedules, which post their messages themselves.
 *
 * Timeline events (the CSV and the Chrome trace):
 *   compute  "forward", "backward", "alloc_acts" (micro-batch index),
 *            "zero_grads", "grad_norm", "optimizer"
 *   comm     "recv_act", "send_act", "recv_grad", "send_grad" (micro-batch index),
 *            each around the communicator's own "send"/"recv"/"sendrecv" event */
#ifndef LAB03_STAGE_H
#define LAB03_STAGE_H
#include "experts_metrics.h"
#include "comm.h"
#include "data.h"
#include "model.h"
#include "optim.h"
#include "run.h"
#include "theory.h"
#include <jansson.h>
#include <stdint.h>

/* How the layers are cut into stages: theory.h's th_stage_layers (a pure
 * rule, below the labs, shared with theory's predictions and plan3d). */

/* The model code a stage runs: common/model's layer with a hook table, on a
 * buffer whose layer blocks are layer.layer_size long, each block computing
 * `part` of its layer (gpt_part: its heads, MLP units and slice of the
 * positions). lab03 and lab04 give none (stage_init): the full-width model of
 * common/ (gpt_default_hooks, the whole layer). A later lab gives its own
 * hooks, part and initialisation of its slice of the weights. */
typedef struct stage_model {
    gpt_layer_hooks layer;
    gpt_part part;
    void *ctx;                                                                 /* handed to init_params */
    void (*init_params)(void *ctx, uint64_t seed, int lo, int hi, float *dst); /* fp32, the range's values */
    /* Context parallelism (lab09): the blocks hold cfg.seq positions of every
     * row, these global ones (NULL: all, in order), of data rows of data_seq
     * (0: cfg.seq); cp ranks split each sequence and cp_algo's attention keeps
     * its log-sum-exp where a whole layer keeps its attention matrix
     * (theory.h th_cp_stage_acts_bytes). 0 and NULL: no CP. */
    const int *positions;
    int data_seq, cp, cp_algo;
} stage_model;

/* Where a stage sits in the pipeline. lab03's stage r of p is virtual stage r
 * of p with neighbours r-1 and r+1 and buffers of its own. lab04 runs several
 * virtual stages per rank (its interleaved and V schedules): stage `index` of
 * `count` runs the layers th_stage_layers(L, count, index), its neighbours may be
 * any rank of the pipe (this one included), and the rank's stages share one
 * flat buffer per kind, each stage a range of it. */
typedef struct stage_place {
    int index, count;  /* this virtual stage, of how many */
    int prev, next;    /* ranks of the neighbouring stages; -1 at the ends */
    void *params, *grads;            /* the model's values; NULL: allocate its own */
    float *adam_m, *adam_v, *master; /* master: the fp32 weights (= params in fp32) */
} stage_place;

typedef struct pipeline_stage {
    comm *pipe;             /* rank r of this communicator is stage r */
    int index, count;       /* this stage r, and the number of stages p */
    int prev, next;         /* the neighbours' ranks; -1 at the ends of the pipe */
    int owns_buffers;       /* params .. adam_v were allocated here (stage_place's NULL) */
    int lo, hi;             /* the layers [lo, hi) this stage runs */
    const gpt_layout *g;
    stage_model model;      /* what it runs (a copy; common/'s full-width model by default) */
    long begin, end;        /* its parameter range gpt_range_with(lo, hi) */
    void *params, *grads;   /* end - begin values each (precision.h) */
    float *master;          /* the fp32 weights AdamW updates: params itself in fp32 */
    float *adam_m, *adam_v; /* end - begin floats each */
    gpt_grad_scratch scratch;
    void *dout;             /* the gradient of the output, received from the next stage */
    long boundary_values;   /* rows x positions x C model values: what crosses a stage boundary */
    int rows;               /* rows of one micro-batch */
    int first_row;          /* this pipeline's first row of the global batch (0 without DP) */
    float dloss;            /* 1 / (batch x T): every micro-batch's loss weight, so the
                             * accumulated gradient is that of the pipeline's batch mean */
    const dataset *data;
    uint64_t seed;
    int step;
    int *tokens, *targets;  /* host rows of the current micro-batch */
    double loss_sum;        /* last stage: sum over this step's micro-batches of their mean */
    int micro_batches;
    long acts_bytes;        /* one micro-batch's activations on this stage */
    gpt_acts *spare_acts;   /* blocks of finished micro-batches, kept for reuse */
    int n_spare_acts;
    double busy_seconds;    /* host time in compute this step (the step line's bubble) */
    double step_started;    /* host clock at stage_step_begin */
    /* --experts: this step's sums over micro-batches of each one's aux loss (its
     * layers' share) and dropped choices, and the choices per (global) layer and expert */
    run_experts_tally moe;
} pipeline_stage;

/* Collective over pipe. Creates this stage's slice of the initial weights
 * (the same values lab01 starts from), its gradients and AdamW moments. */
void stage_init(pipeline_stage *s, comm *pipe, const gpt_layout *g, const dataset *data,
                uint64_t seed, int global_batch, int micro_batches);
/* The same with other model code (NULL: common/'s; copied, but what its hooks'
 * ctx points to must outlive the stage) and a share of the global batch: this pipeline trains on rows
 * [first_row, first_row + batch) of every step's global batch (a data-parallel
 * replica's share), cut into micro_batches. stage_init is
 * stage_init_model(.., NULL, .., 0, global_batch, ..). */
void stage_init_model(pipeline_stage *s, comm *pipe, const gpt_layout *g, const stage_model *model,
                      const dataset *data, uint64_t seed, int first_row, int batch, int micro_batches);
/* The same at any place (stage_init_model is this with lab03's place). The
 * caller's buffers, when given, hold at least the stage's range (gpt_range_with
 * of its layers) and outlive the stage. */
void stage_init_placed(pipeline_stage *s, comm *pipe, const gpt_layout *g, const stage_model *model,
                       const dataset *data, uint64_t seed, int first_row, int batch, int micro_batches,
                       const stage_place *place);
void stage_free(pipeline_stage *s);

/* Start a step: zero the gradients (they accumulate over micro-batches). */
void stage_step_begin(pipeline_stage *s, int step);

/* One micro-batch's activations, in the activations category; free it after
 * its backward. Freed blocks are kept and reused by later micro-batches, and a
 * new one is allocated only when all kept ones are in use, so the allocator's
 * peak counts the most micro-batches ever in flight at once. */
void stage_acts_alloc(pipeline_stage *s, gpt_acts *a, int mb);
void stage_acts_free(pipeline_stage *s, gpt_acts *a);

/* Compute only. The forward loads the micro-batch's tokens (first stage) and
 * targets (last stage) and, on the last stage, adds its mean loss to loss_sum.
 * The backward starts from the loss (last stage) or from s->dout, and returns
 * the gradient of the stage's input (valid until the next backward; NULL on the
 * first stage). */
void stage_forward_compute(pipeline_stage *s, gpt_acts *a, int mb);
const void *stage_backward_compute(pipeline_stage *s, gpt_acts *a, int mb);

/* Exchanges with the neighbours (each a no-op at the end of the pipe where
 * there is no neighbour in that direction). */
void stage_recv_forward(pipeline_stage *s, gpt_acts *a, int mb);         /* a->x_in <- prev */
void stage_send_forward(pipeline_stage *s, const gpt_acts *a, int mb);   /* output -> next */
void stage_recv_backward(pipeline_stage *s, int mb);                     /* s->dout <- next */
void stage_send_backward(pipeline_stage *s, const void *dx, int mb);     /* dx -> prev */

/* A whole forward / backward of one micro-batch: receive, compute, send. */
void stage_forward(pipeline_stage *s, gpt_acts *a, int mb);
void stage_backward(pipeline_stage *s, gpt_acts *a, int mb);

/* End of a step, after every micro-batch's backward (full-width model only:
 * lab06 steps its tensor-parallel stages itself). Collective over pipe:
 * clips with the GLOBAL gradient norm (each stage's sum of squares summed over
 * the stages), steps AdamW on this stage's range, and returns the step's mean
 * loss (computed on the last stage, shared with all); *grad_norm gets that
 * global norm before clipping. */
double stage_optimizer_step(pipeline_stage *s, const adamw_config *cfg, double clip, double *grad_norm);

/* The options theory.h's formulas take for this stage's blocks: the
 * precision, the split of its layers' heads and positions (the model's part;
 * whole for common/'s), --recompute. */
th_opts stage_opts(const pipeline_stage *s);
/* theory.h's exact bytes of one micro-batch's activation block of this stage
 * (th_course_acts_bytes; under context parallelism th_cp_stage_acts_bytes). */
double stage_acts_formula_bytes(const pipeline_stage *s);

/* --experts: the step's aux loss (the mean over micro-batches, every stage's
 * layers summed over pipe) and dropped choices into ctx, and after the last
 * step the choices per layer and expert: run_experts_report of the n stages'
 * tallies (this rank's; lab04's chunks). Collective over pipe. */
void stage_report_experts(run_ctx *ctx, comm *pipe, const pipeline_stage *stages, int n, int step);
/* Collective over pipe. The stages' layers, activation bytes per micro-batch,
 * the schedule's activation count per stage (in_flight_formula, this stage's)
 * and the measured peaks, set as members of the run record `record` (a jansson
 * object: "stage_layers": [[0,2],...], ...); rank 0 also prints them. */
void stage_report_json(pipeline_stage *s, json_t *record, int in_flight_formula, const char *formula_text);
/* The record's lists of the figures such a report gathers, one row of fields
 * per stage (or chunk): [x[0], x[stride], ..., x[(n-1) stride]] as integers, and
 * `rows` of those lists, row r starting at x[r row_stride]. */
json_t *stage_record_integers(const double *x, int n, int stride);
json_t *stage_record_rows(const double *x, int rows, int row_stride, int n, int stride);

/* The step line's "bubble rank 0 x (theory y)": 1 - busy/wall on this rank's
 * host clock since stage_step_begin; NULL on CUDA, where the host clock does
 * not see the work. buf holds the text. */
const char *stage_bubble_text(const pipeline_stage *s, double theory, char buf[64]);

/* --eval: the held-out loss, the stage forward over the held-out batches of
 * `data` (no backward), collective over the pipe. Traffic stays out of the
 * stats, so the record's per-step figures remain the training's. */
double stage_evaluate(pipeline_stage *st, const dataset *data, int batch, int seq);

#endif
