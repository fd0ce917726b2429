/* A lab run predicted from its flags alone: what every rank will allocate,
 * category by category, and move per step, collective kind by kind.
 *
 * One piece of code for two readers: plan3d --check holds it against what a
 * run measured (its record), and every lab's --dry-run prints it before a job
 * is queued on a cluster. The figures are theory.h's exact forms for the
 * course's fp32 model (th_model_states, th_course_acts_bytes,
 * th_course_scratch_bytes, th_dp_traffic, th_tp_traffic, th_pp_traffic, the
 * schedules' activations in flight), put together as each lab allocates and
 * communicates; where a lab's figure is decided at run time, the prediction
 * says "not predicted" (< 0) instead of guessing:
 *   - lab04's executor (and lab06 through it) keeps a pool of message buffers
 *     whose size its lists decide (the comm category);
 *   - on CUDA the kernels add their own scratch (the workspace category).
 * Schedules with several model chunks per rank (interleaved, zb-v) are
 * predicted chunk by chunk, placed by th_chunk_stage (the rule lab04 runs),
 * with the weight-gradient inputs the split schedules (zb-h1, zb-v) keep.
 * What the caller knows better is passed in: lab02's shard plan (the
 * padding and units ZeRO's collectives move, lab02_zero/shards.h), so
 * theory/ stays free of any lab's code. Pure numbers, like the rest of
 * theory/. A lab's --dry-run reaches it through labs/lab_run.h. */
#ifndef PL_PREDICT_H
#define PL_PREDICT_H
#include "theory.h"
#include <stdio.h>

/* The kinds a prediction counts: comm_kind's up to the barrier (a
 * synchronisation, no payload; the all-to-all after it is not predicted yet). */
enum { TH_PREDICTED_KINDS = COLL_BARRIER };

typedef struct th_run {
    /* What to predict comes from this config (the run record's), never from
     * a lab's name: the grid, the schedule, the ZeRO stage and the layers'
     * kind decide it. */
    int ranks;
    int cuda;               /* kernels on CUDA: their scratch is not predicted */
    int bf16;               /* --precision bf16: 2-byte values, 2 + 2 + 12 model states */
    long batch;             /* the global batch, in sequences */
    th_model model;
    int tp, pp, dp;         /* the grid: lab01/02 dp = ranks, lab03/04 pp = ranks, lab05 tp = ranks */
    int micro_batches;      /* per replica and step (pipelines; 1 elsewhere) */
    /* lab01's --grad-accum K: data parallelism alone (no pipeline, no TP) running
     * each replica's B/N rows as K micro-batches of B/(N K), one after another,
     * into one gradient, all-reduced once a step: the activations and scratch
     * are one micro-batch's, the traffic is K = 1's. 0 or 1: none */
    int grad_accum;
    /* the schedule lab04's executor runs (th_schedule_names; its message
     * buffers are a pool its lists size, not predicted); NULL: no executor
     * (lab03's stages run the naive order themselves, GPipe at m = 1, and keep
     * the gradient they receive; or no pipeline at all) */
    const char *schedule;
    int chunks;             /* interleaved's model chunks per rank (--virtual-stages; 0: its default 2) */
    /* ZeRO: lab02 1..3, the model states sharded over dp; lab06 0 or 1 (ZeRO-1
     * over each DP group); 0: none */
    int zero_stage;
    /* the layers are lab05's tensor-parallel ones (lab05, lab06), at any tp
     * (1 included): the gradient norm is summed in two parts on the device */
    int tensor_parallel;
    /* data parallelism without a pipeline or TP (lab01, lab02): the units whose
     * collectives move the gradient (lab02's shard plan: units 1 and full =
     * the parameters without buckets); units 0: not known (lab01's buckets,
     * counted at run time) */
    int units;
    double full_elems, largest_unit_elems, embed_unit_elems;
    /* --sequence-parallel (lab05, lab06 with tp > 1) and --recompute (every
     * lab: recompute_mode) */
    int sequence_parallel, recompute;
    /* ranks per context-parallel group: > 0, the layers are lab07's, attention
     * split over cp ranks (1 included) by --cp-algo (th_cp_algo); 0: none.
     * cp_layout (th_cp_layout, --cp-layout): the chunks each sequence is cut
     * into, which only the rules depend on (th_run_broken_rule) */
    int cp, cp_algo, cp_layout;
    /* > 0: the MLPs are lab08's experts over ep ranks; --capacity-factor (0: none);
     * model.experts and model.top_k give the routing. ep 0 with model.experts
     * > 0: every rank holds all the experts (lab01-lab04's --experts), which
     * the exact formulas count; its buffers hold every slot, so F is not needed */
    int ep;
    double capacity_factor;
} th_run;

typedef struct th_rank_need {
    int tp, pp, dp;          /* the rank's coordinate (rank = tp + t (dp + d pp)) */
    int cp;                  /* lab09: its CP rank (rank = tp + t (cp + c (dp + d pp))); 0 elsewhere */
    int lo, hi;              /* its layers */
    long rows;               /* sequences of one micro-batch */
    double params;           /* parameters it holds (elements) */
    double acts_in_flight;   /* micro-batches of activations at its peak */
    double mem[MEM_NCAT];     /* peak bytes per category; < 0: not predicted */
    /* per step, by kind: calls, payload bytes, ring bytes (calls < 0: not predicted) */
    double calls[TH_PREDICTED_KINDS], payload[TH_PREDICTED_KINDS], ring[TH_PREDICTED_KINDS];
} th_rank_need;

/* lab07's part (theory/context.c). */
void th_cp_predict(const th_run *r, th_rank_need *need);
/* The largest T, a multiple of `step` (lab07's chunks: 2 cp zig-zag, cp
 * contiguous), whose th_predicted_peak_bytes is <= cap_bytes (predict.c): r at model.seq
 * = T, searched (the peak grows with T), not a formula of its own. 0: not
 * even T = step fits; -1: the peak is not predicted (the workspace on CUDA). */
long th_cp_max_seq(const th_run *r, long step, double cap_bytes);
/* lab08's part (theory/expert_parallel.c). Its all-to-alls are a kind the
 * tables do not have: th_ep_alltoall_per_step gives their calls and payload. */
void th_ep_predict(const th_run *r, th_rank_need *need);
/* payload: under uniform routing (the return rows k N_tok); payload_max: the
 * return rows at th_ep_received_rows_bound. Both count the dispatched slots
 * undropped. */
typedef struct th_ep_alltoall { double calls, payload, payload_max; } th_ep_alltoall;
th_ep_alltoall th_ep_alltoall_per_step(const th_run *r);
/* The rules a run's layout must keep, the checks lab07 and lab08 make of
 * their flags before anything runs (theory/rules.c), for both readers: a lab
 * refuses its flags with them, plan3d --check a record no lab could have
 * written. With cp > 0 (lab07's layers): a dense MLP, cp dividing the ranks,
 * the batch divisible by the ranks / cp data-parallel groups, the sequence by
 * the chunks of cp_layout (zig-zag 2 cp, contiguous cp), the heads by cp under
 * Ulysses; with ep > 0 (lab08's): experts >= 1, ep dividing the ranks and the
 * experts, the batch divisible by the ranks. NULL if r keeps them all; else buf,
 * the first broken one in the labs' order as one line "NAME VALUE: rule",
 * naming the numbers as `names` says. */
typedef enum { TH_NAMES_FLAGS, TH_NAMES_RECORD } th_names; /* "--seq 30: ...", or "th_run.model.seq 30: ..." */
const char *th_run_broken_rule(const th_run *r, th_names names, char *buf, int len);

/* Fills need[0 .. r->ranks). Returns 0. */
int th_predict_run(const th_run *r, th_rank_need *need);

/* The run's peak memory per rank: per rank the sum of the categories' peaks
 * (the allocator's peak of the total is at most this), the maximum over ranks;
 * < 0: some category not predicted. */
double th_predicted_peak_bytes(const th_run *r);

/* What a lab's --dry-run prints: th_predict_run's memory per rank by category
 * (exact bytes; a row per rank, the first `max_rows`, then the maximum over
 * ranks, the summary's "peak memory (max over ranks)") and traffic per rank per
 * step. Returns the busiest rank's ring bytes per step as a lab's summary adds
 * up the measured ones (per kind the maximum over ranks, summed over kinds);
 * < 0: some kind not predicted on some rank, or no memory to predict in. */
double th_print_prediction(FILE *f, const th_run *r, int max_rows);

#endif
