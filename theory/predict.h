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
 * predicted chunk by chunk, placed as lab04's schedule_stage_of places them,
 * with the weight-gradient inputs the split schedules (zb-h1, zb-v) keep.
 * What the caller knows better is passed in: lab02's shard plan (the
 * padding and units ZeRO's collectives move, lab02_zero/shards.h) and lab03's
 * rule for splitting layers into stages (stage.h), so theory/ stays free of
 * any lab's code. Pure numbers, like the rest of theory/. */
#ifndef PL_PREDICT_H
#define PL_PREDICT_H
#include "theory.h"
#include <stdio.h>

/* The allocator's categories (common/mem.h), in its order. */
enum { TH_MEM_PARAMS, TH_MEM_GRADS, TH_MEM_OPTIM, TH_MEM_ACTS, TH_MEM_COMM, TH_MEM_WORKSPACE, TH_NMEM };
extern const char *const th_mem_names[TH_NMEM];
/* The communicator's kinds (common/comm.h), in th_coll's order. */
extern const char *const th_coll_names[TH_NKINDS];

typedef struct th_run {
    const char *lab;        /* the program: "lab01_dp" ... "lab06_3d" (the record's "lab") */
    int ranks;
    int cuda;               /* kernels on CUDA: their scratch is not predicted */
    int bf16;               /* --precision bf16: 2-byte values, 2 + 2 + 12 model states */
    long batch;             /* the global batch, in sequences */
    th_model model;
    int tp, pp, dp;         /* the grid: lab01/02 dp = ranks, lab03/04 pp = ranks, lab05 tp = ranks */
    int micro_batches;      /* per replica and step (pipelines; 1 elsewhere) */
    const char *schedule;   /* th_schedule_names; lab03's naive schedule is "gpipe" at m = 1 */
    int chunks;             /* interleaved's model chunks per rank (--virtual-stages; 0: its default 2) */
    int zero_stage;         /* lab02: 1..3; lab06: 0 or 1 (ZeRO-1 over each DP group); 0 elsewhere */
    /* lab01 and lab02: the units whose collectives move the gradient (lab02's
     * shard plan: units 1 and full = the parameters without buckets); units
     * 0: not known (lab01's buckets, counted at run time) */
    int units;
    double full_elems, largest_unit_elems, embed_unit_elems;
    /* --sequence-parallel (lab05, lab06 with tp > 1) and --recompute (every
     * lab; common/model's gpt_recompute: none 0, selective 1, full 2) */
    int sequence_parallel, recompute;
    /* lab07: ranks per context-parallel group (0: all) and --cp-algo (th_cp_algo) */
    int cp, cp_algo;
    /* lab08: ranks per expert-parallel group (0: all) and --capacity-factor (0: none);
     * model.experts and model.top_k give the routing */
    int ep;
    double capacity_factor;
} th_run;

typedef struct th_rank_need {
    int tp, pp, dp;          /* the rank's coordinate (rank = tp + t (dp + d pp)) */
    int lo, hi;              /* its layers */
    long rows;               /* sequences of one micro-batch */
    double params;           /* parameters it holds (elements) */
    double acts_in_flight;   /* micro-batches of activations at its peak */
    double mem[TH_NMEM];     /* peak bytes per category; < 0: not predicted */
    /* per step, by kind: calls, payload bytes, ring bytes (calls < 0: not predicted) */
    double calls[TH_NKINDS], payload[TH_NKINDS], ring[TH_NKINDS];
} th_rank_need;

/* lab07's part (theory/context.c). */
void th_cp_predict(const th_run *r, th_rank_need *need);
/* lab08's part (theory/expert_parallel.c). Its all-to-alls are a kind the
 * tables do not have: th_ep_alltoall_per_step gives their calls and payload. */
void th_ep_predict(const th_run *r, th_rank_need *need);
/* payload: under uniform routing (the return rows k N_tok); payload_max: the
 * return rows at th_ep_received_rows_bound. Both count the dispatched slots
 * undropped. */
typedef struct th_ep_alltoall { double calls, payload, payload_max; } th_ep_alltoall;
th_ep_alltoall th_ep_alltoall_per_step(const th_run *r);
/* Fills need[0 .. r->ranks). Returns 0, or -1 for a lab it does not know. */
int th_predict_run(const th_run *r, th_rank_need *need);

/* The busiest rank's ring bytes per step as a lab's summary adds up the
 * measured ones: per kind, the maximum over ranks, summed over kinds. < 0 if
 * any kind is not predicted on some rank. */
double th_predicted_ring_bytes(const th_run *r, const th_rank_need *need);

/* --dry-run's tables: memory per rank by category (exact bytes; a row per
 * rank, the first `max_rows`, then the maximum over ranks, which the summary
 * prints as "peak memory (max over ranks)") and traffic per rank per step. */
void th_print_needs(FILE *f, const th_run *r, const th_rank_need *need, int max_rows);
/* th_predict_run then th_print_needs: what a lab's --dry-run prints. Returns
 * th_predict_run's status. */
int th_print_prediction(FILE *f, const th_run *r, int max_rows);

#endif
