/* What one layout costs: memory per GPU by category and time per step by
 * part, from theory/'s formulas and a cluster's figures.
 *
 * The time model (all per step, on the slowest pipeline stage):
 *   compute   a micro-batch's forward over a rank's layers takes tF = its
 *             FLOPs / (peak x efficiency), the input-gradient half of the
 *             backward tB (the layers' matrices once more, attention's core
 *             twice), the weight-gradient half tW (the matrices once more);
 *             recomputation adds its forward to tB
 *   TP        4 collectives per layer and micro-batch (6 with full
 *             recomputation), each an all-reduce's ring time over the TP
 *             group's link, not hidden: they sit between matrix products
 *   PP        one message per chunk boundary per micro-batch each way (the
 *             activation, split over the TP ranks as Megatron does), on the
 *             critical path of every slot
 *   bubble    theory/'s th_bubble_time for the schedule with those times
 *   DP        the gradient's all-reduce (ZeRO 1-2: reduce-scatter + all-gather,
 *             the same bytes; ZeRO 3 also gathers the parameters twice per
 *             micro-batch) over the DP group's link, minus the overlapped share
 *   optimizer 28 bytes of memory traffic per parameter of the rank's shard
 *   CP        context parallelism as a ring over zig-zag chunks (lab07's
 *             default; Llama 3 all-gathers K and V instead, the same forward
 *             bytes): per layer and micro-batch theory's th_cp_layer_traffic
 *             over the CP group's link, of which only what the attention
 *             core's compute cannot hide is on the critical path (the ring's
 *             condition: a block's compute >= its message)
 *   EP        per MoE layer and micro-batch two all-to-alls forward
 *             (dispatch, combine) and two backward, theory's
 *             th_ep_layer_traffic under uniform routing; the bytes bound for
 *             other nodes go over the NIC, the rest over NVLink, at the same
 *             time; one latency per all-to-all (its sends run at once); the
 *             share --ep-overlap says is hidden (DeepSeek-V3's DualPipe runs
 *             one micro-batch's all-to-all during another's compute: 1)
 * Rank order (Megatron's): TP fastest, then CP, then DP, then PP; the EP
 * group is ep consecutive ranks of the DP x CP group (stride t), so EP must
 * divide the routed experts and cp x dp; the expert-data-parallel group, the
 * ranks holding the same experts, is cp x dp / ep.
 * A link's collective over n ranks: 2(n-1) x latency + ring bytes / bandwidth. */
#ifndef PLAN3D_COST_H
#define PLAN3D_COST_H
#include "presets.h"
#include "theory.h"

typedef struct training {
    long global_batch;       /* sequences per step */
    precision precision;
    int zero_stage;          /* 0..3 over the DP group */
    double dp_overlap;       /* 0..1: the share of DP traffic hidden behind the backward */
    double ep_overlap;       /* 0..1: the share of EP all-to-all hidden behind other micro-batches' compute
                              * (DeepSeek-V3's DualPipe hides it all; a plain schedule none) */
    double headroom;         /* 0..1: memory kept free (CUDA context, NCCL buffers, fragmentation) */
    int split_ends;          /* the layers cut as th_stage_layers_ends does (Llama 3's balanced pipeline:
                              * the embedding and the head take a layer's place); 0: th_stage_layers */
    int ep_per_node;         /* EP's dispatch sends a token's row once to each node it reaches and forwards it
                              * inside (DeepEP); 0: a copy per choice (Megatron's all-to-all dispatcher, lab08).
                              * A model with node-limited routing (route_max_nodes) is sent per node either way */
    int recompute_modules;   /* TH_RECOMPUTE_NORMS | TH_RECOMPUTE_EXPERT_ACT beside recompute none or selective
                              * (Megatron-Core's --recompute-modules layernorm moe_act): their outputs are not
                              * kept; elementwise, so no time is charged for them */
} training;

/* "none", "norm", "act", "norm,act": the flag's spelling (the TSV's after a "+"). */
const char *recompute_modules_text(int modules);
/* The spelling back: 0 and the bits in *modules, or -1 for anything else. */
int recompute_modules_parse(const char *text, int *modules);

typedef struct layout {
    int tp, pp, dp;
    int cp;                  /* context-parallel degree: each rank holds T / cp of every sequence */
    int ep;                  /* expert-parallel degree (1 for a dense model): E / ep experts a rank */
    int micro_batch;         /* b: sequences per micro-batch */
    int micro_batches;       /* m = global batch / (d b) */
    th_schedule schedule;
    int vp;                  /* chunks per rank (interleaved); 1 otherwise */
    int sp;                  /* sequence parallelism */
    recompute_mode recompute;
} layout;

typedef struct estimate {
    layout l;
    int stage_layers_max;     /* layers of the busiest rank */
    int fullest_stage;        /* the rank whose memory is reported */
    double mem[MEM_NCAT], mem_total, mem_limit; /* bytes per GPU, the fullest rank */
    int fits;
    double tF, tB, tW;        /* one micro-batch on the slowest rank, with its TP and PP traffic */
    double t_compute, t_tp, t_pp, t_bubble, t_dp, t_optim, t_step; /* seconds per step */
    double t_cp, t_ep;        /* exposed CP and EP traffic per step (in the pipeline's slots) */
    double expert_params;     /* routed-expert parameters on the fullest rank */
    double tokens_per_s, model_flops, hw_flops; /* FLOPs per step, all GPUs */
    double mfu;               /* model FLOPs / (step x GPUs x peak) */
    double tp_bytes, pp_bytes, dp_bytes; /* ring bytes per GPU per step */
    double cp_bytes, ep_bytes;           /* bytes sent per GPU per step, CP's ring and EP's all-to-alls */
    double ep_node_bytes;                /* of EP's, those between nodes (th_ep_cross_node_copies) */
    double ep_node_copies;               /* a token's row's copies between nodes per all-to-all */
    long ep_node_limit;                  /* nodes a token's row reaches at most (the model's route_max_nodes, or
                                          * with ep_per_node the EP group's nodes); 0: a copy per choice */
    int ep_node_dispatch;                /* 1: the limit is the dispatch's (ep_per_node), not the model's routing */
} estimate;

/* "" if the layout can run the model on the cluster, else why not (one line
 * naming the flag, for status 2). */
const char *layout_problem(const th_model *m, const cluster *c, const training *tr, const layout *l, char *buf, int len);
/* The same rules without the text: 1 if the layout can run (the search asks
 * this of every combination, most of which fail on the batch's divisors). */
int layout_divides(const th_model *m, const cluster *c, const training *tr, const layout *l);

/* The micro-batches whose activations (and, split schedules, weight-gradient
 * inputs) a rank's chunk holds at its peak: theory's th_chunk_in_flight for
 * every rank r and chunk k, at table[r * v + k]. For the interleaved schedule
 * each entry walks a period of the order (up to p v steps), so the table
 * costs (p v)^2 steps: the search computes it once for all the layouts that
 * share p, m and v. */
typedef struct in_flight { int acts, wgrads; } in_flight;
void in_flight_table(th_schedule s, int p, int m, int v, in_flight *table);

/* table: in_flight_table of the layout's schedule, p, m and v, or NULL (computed here). */
void estimate_layout(const th_model *m, const cluster *c, const training *tr, const layout *l, const in_flight *table,
                     estimate *e);

/* The model states (parameters, gradients, optimizer state) per GPU of the
 * average pipeline rank of a t x cp x p x d (x ep) split: its whole model,
 * split as estimate_layout splits it, over p ranks. No layout of the split
 * holds less on its fullest rank (the states are linear in the parameters,
 * and the stages' parameters add up to at least the whole model's), so a
 * split whose floor is over the memory cannot fit, whatever its micro-batch,
 * schedule, SP or recomputation. */
double model_states_floor(const th_model *m, const training *tr, const layout *l);

/* Where the EP group is carved from. With sequence parallelism (t > 1) every
 * TP rank holds its own T / (t cp) positions, so the experts fold over TP as
 * Megatron-Core does with expert TP 1 (its "MoE parallel folding"): the EP
 * group is ep consecutive ranks of the t x cp x d ranks of a stage, EP x EDP
 * = t x cp x d (Qwen3-235B's recipe: TP 2 x DP 16 = EP 32). Without SP the
 * TP ranks hold the same tokens and EP is carved from the cp x d ranks at one
 * TP coordinate, t apart (the labs' lab09). 1 when the layout folds. */
int ep_folds_tp(const layout *l);
/* The ranks the EP group is carved from: t x cp x d when it folds, else cp x d. */
long ep_source_ranks(const layout *l);
/* The ranks holding the same experts (their states are sharded and their gradients summed over them). */
int expert_data_ranks(const layout *l);

/* A collective's time over n ranks on a link: 2(n-1) latencies + ring bytes / bandwidth. */
double link_time(double ring_bytes, int n, double gbs, double us);

#endif
