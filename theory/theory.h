/* The formulas of the course, in one place: what the labs print beside their
 * measurements and what plan3d uses to lay out a 70B model on a cluster.
 *
 * Every figure a lab prints as "formula" or "theory" (model-state bytes per
 * ZeRO stage, activation bytes per micro-batch, bytes per collective, the
 * pipeline bubble) is one of these functions, and plan3d calls the same
 * functions for its predictions. So a formula that a test holds equal to the
 * allocator's or the communicator's count on a small run is the code that
 * predicts the big one.
 *
 * Why a folder of its own: common/ knows nothing about parallel strategies
 * (DESIGN.md), and these formulas are about nothing else; and placing them in
 * lab06_3d/, the lab that composes every technique, would make lab01..lab05
 * depend on a later lab, which the design forbids (a lab uses earlier labs'
 * code, never the other way round). theory/ sits beside common/: pure
 * functions of numbers (no MPI, no device, no training buffers), linked by
 * every lab and by plan3d.
 *
 * Two kinds of formula live here, kept apart:
 *   exact     the course's own model (common/model.c) in fp32 or bf16 mixed
 *             precision (--precision), to the byte: what the tests compare
 *             with the allocator and the communicator;
 *   published the forms of the literature for what the labs do not run yet
 *             (16-bit activations with sequence parallelism and selective or
 *             full recomputation, Korthikanti et al. 2022, Table 2), which
 *             plan3d uses for real models. Mixed precision's 2 + 2 + 12 bytes
 *             per parameter (Rajbhandari et al. 2020, the ZeRO paper) is both:
 *             the labs' bf16 allocates exactly that.
 * The options struct th_opts carries what selects between them and can grow:
 * sequence parallelism and recomputation run in the labs, so their exact
 * forms are among the exact functions too. */
#ifndef PL_THEORY_H
#define PL_THEORY_H
#include "kinds.h" /* the enums theory/ shares with common/ and the labs: nothing else of common/ */

/* common/model.c's carve() and the allocator: every piece starts 64-byte
 * aligned, so each exact byte form rounds its pieces up to 64. */
static inline double th_pad64(double bytes) {
    /* from 2^62 on every double is a multiple of 64 already, and (long long) would overflow (labs'
     * memory check: --seq 1000000000 makes a T^2 of 10^18 x rows x heads) */
    return bytes >= 0x1p62 ? bytes : (double)(((long long)bytes + 63) / 64 * 64);
}

/* ---- the model ---------------------------------------------------------------------- */

/* A decoder-only transformer. The course's model (th_course_model) is GPT-2's
 * shape: learned positions, LayerNorm and linear biases, a 4C GELU MLP, an
 * untied head. Real models differ in ways that change the counts, so the
 * fields say how. */
typedef struct th_model {
    long vocab, seq, layers, d_model, heads;
    long kv_heads;         /* heads of K and V (grouped-query attention); = heads: none */
    long ffn;              /* the MLP's hidden width (4 d_model in GPT) */
    int gated_mlp;         /* SwiGLU (Llama): gate, up and down matrices, not fc and proj */
    int biases;            /* LayerNorm and linear biases (GPT); 0: RMSNorm, no biases (Llama) */
    int learned_positions; /* a [seq, d_model] position table (GPT); 0: rotary or ALiBi */
    int tied_head;         /* the head reuses the token embedding (GPT-3, BLOOM) */
    long experts, top_k;   /* mixture of experts: every MLP is `experts` MLPs and a router
                            * [experts, d_model] sending each token to top_k; 0: dense */
    /* DeepSeek's fine-grained MoE: each routed expert ffn_expert wide (0: ffn;
     * the labs' --expert-width), shared_experts more of that width that every
     * token runs (the labs' --shared-experts: one MLP of shared_experts x
     * ffn_expert units, one output bias), and the first dense_layers layers keep
     * a dense MLP ffn wide (plan3d's presets; the labs leave it 0). */
    long ffn_expert, shared_experts, dense_layers;
    /* node-limited routing (DeepSeek-V3: 4): a token's routed experts on at
     * most this many nodes, its row sent once to each and forwarded inside
     * (th_ep_cross_node_copies); 0: no limit, a copy per choice (lab08) */
    long route_max_nodes;
    /* dropout in the layers (GPT, Megatron's GPT, BLOOM as plan3d's presets
     * take them): its masks are among the published activations (Korthikanti
     * et al. 2022: 2 sbh a layer, sbh after the embedding); 0: none (Llama,
     * Mixtral, DeepSeek-V3), as the course's exact formulas assume */
    int dropout;
    /* each head's width where it is not d_model / heads (Qwen3: 64 heads of 128
     * over d_model 4096, so Q is 8192 wide and the projection 8192 -> 4096);
     * 0: d_model / heads, as every lab's model (its records do not carry it) */
    long head_dim;
} th_model;

/* A routed expert's hidden units: ffn_expert, or ffn when 0. */
double th_expert_width(const th_model *m);
/* The columns of Q (heads x head width) and of K and of V (kv_heads x head width). */
double th_attn_width(const th_model *m);
double th_kv_width(const th_model *m);

/* The course's model: vocab 256, wpe, biases, 4C MLP, untied head. */
th_model th_course_model(long vocab, long seq, long layers, long d_model, long heads);

/* ---- options: the precision and parallelism a formula assumes ------------------------- */

/* precision (PREC_FP32, PREC_BF16) and recompute_mode: common/kinds.h's, the labs' own */

typedef struct th_opts {
    precision precision;     /* fp32, or bf16 mixed precision (the labs' --precision) */
    int tp;                  /* tensor-parallel degree t (1: none) */
    int vocab_parallel;      /* embedding and head split over t, as Megatron does;
                              * 0: replicated on every TP rank, as lab05 does */
    int sequence_parallel;   /* Megatron's SP: exact for the course (lab05, lab06 --sequence-parallel) */
    recompute_mode recompute; /* --recompute: exact for the course (every lab) */
    int cp;                  /* context-parallel degree (0 or 1: none): the published activations / cp */
    int ep;                  /* expert-parallel degree (0 or 1: none): a rank holds experts / ep */
    int recompute_modules;   /* published only, beside recompute none or selective (the labs: 0):
                              * TH_RECOMPUTE_NORMS | TH_RECOMPUTE_EXPERT_ACT */
} th_opts;

/* Megatron-Core's --recompute-modules layernorm moe_act: the norms' outputs, recomputed from their inputs
 * (kept anyway), and the routed experts' activation function's output, recomputed from its input (fc1's
 * output, kept). Both are elementwise: no matrix product runs again. */
enum { TH_RECOMPUTE_NORMS = 1, TH_RECOMPUTE_EXPERT_ACT = 2 };

/* fp32, t = 1, no SP, no recomputation: a one-rank lab. */
th_opts th_opts_course(int tp);
/* The same in a lab's precision: bf16 = 1 for --precision bf16. */
th_opts th_opts_precision(int tp, int bf16);
/* What a lab runs: its precision, t, SP on or off, --recompute. */
th_opts th_opts_run(int tp, int sequence_parallel, recompute_mode recompute, int bf16);

/* Bytes per parameter and per activation element for a precision. */
double th_param_bytes(precision p);   /* the weights the forward reads: 4 or 2 */
double th_grad_bytes(precision p);    /* 4 or 2 */
double th_optim_bytes(precision p);   /* AdamW: 8 (m, v), or 12 (fp32 master, m, v) */

/* ---- parameters and FLOPs --------------------------------------------------------------- */

typedef struct th_params {
    double embed;           /* token (+ position) embedding */
    double layer;           /* one layer */
    double layer_sharded;   /* of which TP splits over t (the matrices, column-parallel biases;
                             * with experts attention's matrices only: no expert TP) */
    double head;            /* final norm + the head matrix (counted even when tied) */
    double head_matrix;     /* vocab x d_model */
    double total;           /* the model's parameters (a tied head counted once) */
    double layer_active;    /* of one layer, those a token runs: k of the E experts' MLPs (= layer dense) */
    double active;          /* of the model, those a token runs (= total dense) */
    double layer_experts;   /* of one layer, the routed experts' MLPs (what EP splits; 0 dense) */
    double dense_layer;     /* one of the first dense_layers layers (= layer without experts) */
    double dense_layer_sharded; /* of which TP splits (= layer_sharded without experts) */
} th_params;

th_params th_param_counts(const th_model *m);

/* Parameters held by one rank of a pipeline stage running layers [lo, hi) of
 * layers L, TP degree opts->tp: the embedding on the first stage, the head on
 * the last (a tied head's matrix is a second copy when they are different
 * stages), each layer's replicated part whole and its sharded part / t.
 * For the course's model this is lab05's tp_range, and gpt_range at t = 1. */
double th_stage_params(const th_model *m, const th_opts *o, int lo, int hi);
/* Of th_stage_params, the routed experts' parameters, o->ep (EP ranks) holding
 * experts / ep each: their gradients are summed over the expert-data-parallel
 * group (the ranks holding the same experts), not over all the DP ranks. */
double th_stage_expert_params(const th_model *m, const th_opts *o, int lo, int hi);
/* MoE layers among [lo, hi) (the layers past dense_layers; 0 for a dense model). */
int th_moe_layers(const th_model *m, int lo, int hi);

/* Training FLOPs per token, forward and backward: 6 x the parameters of every
 * matrix product (the layers and the head; the embedding is a lookup) plus
 * attention's 12 L T Q (Q = heads x head width: d_model, the course's C,
 * unless a head is wider). For the course's model this is gpt_flops_per_token.
 * With experts a token runs its k experts' MLPs and the router: the active
 * parameters, not the total (Mixtral's 47B total, 13B active). */
double th_flops_per_token(const th_model *m);
/* The same counting only the causal half of attention's scores and their use
 * of V (6 L T Q where th_flops_per_token has 12): Megatron-Core's count since
 * its MoE models (num_floating_point_operations: "only half of the attention
 * matrix is non-zero"), what its recipes' TFLOP/s per GPU report. */
double th_causal_flops_per_token(const th_model *m);
/* The FLOPs recomputation adds per token: full, a second forward of the
 * layers (2 x layer parameters + 4 L T Q); selective, the attention core
 * (4 L T Q). Hardware FLOPs = model FLOPs + these. */
double th_recompute_flops_per_token(const th_model *m, recompute_mode r);

/* ---- model states: parameters, gradients, optimizer state -------------------------------- */

typedef struct th_states { double params, grads, optim; } th_states;

/* Bytes per rank for psi parameters held by a data-parallel group of dp
 * ranks under ZeRO stage 0..3 (0: lab01's plain DP, every rank the whole):
 *
 *             parameters        gradients          optimizer
 *   stage 0   P psi             G psi              K psi
 *   stage 1   P psi             G psi              K psi / N
 *   stage 2   P psi             G psi / N          K psi / N
 *   stage 3   P psi / N         G psi / N          K psi / N
 *
 * fp32 (the labs): P = 4, G = 4, K = 8; bf16 mixed precision (ZeRO paper,
 * section 3.1): P = 2, G = 2, K = 12 (fp32 master weights, momentum and
 * variance), 16 bytes in all. For lab02's padded layout pass psi + padding. */
th_states th_model_states(double psi, const th_opts *o, int zero_stage, int dp);
/* The buffers a ZeRO stage adds on top (lab02): stage 3 gathers one unit of
 * unit_elems parameters at a time; stages 2-3 reduce gradients through one
 * bucket of a unit. */
th_states th_zero_buffers(double unit_elems, const th_opts *o, int zero_stage);

/* ---- activations ---------------------------------------------------------------------- */

/* EXACT, the course's model in fp32 or bf16: the bytes common/model.c's
 * gpt_acts_alloc (gpt_acts_alloc_part at t = opts->tp: H/t heads, 4C/t MLP
 * units; the residual stream stays C wide) allocates for layers [lo, hi) of
 * one micro-batch of `rows` sequences, every piece padded to 64 bytes; the
 * model's values 4 or 2 bytes each (th_param_bytes), the means, rstds,
 * losses and token ids 4 in both. With N = rows x T positions inside the
 * tensor-parallel regions and Ns on the residual stream (N/t under sequence
 * parallelism, else N):
 *
 *   each layer   --recompute none:
 *                  ln1, ln2 [N,C] (under SP the all-gathered inputs of the
 *                  column-parallel matmuls, kept whole: no second all-gather
 *                  in the backward); res2, res3 [Ns,C]; 4 means/rstds [Ns];
 *                  qkv [N,3C/t]; atty [N,C/t]; fch, fch_gelu [N,4C/t]
 *                  att [rows,H/t,T,T]              (the T^2 term)
 *                selective: all but att; full: res3 [Ns,C] only (its output,
 *                  the next layer's input)
 *   every stage  x_in [Ns,C]                       (not per layer)
 *   first stage  tokens [Ns]; last stage: targets, losses [Ns], lnf [Ns,C],
 *                its mean and rstd [Ns], logits, probs [Ns,V]
 *   experts      (m->experts, m->top_k: lab01-lab04's --experts, t = 1) fch
 *                and GELU hold the k N slots' rows [k N,4C]; each layer adds
 *                the router's and dispatch's state (th_moe_state_bytes) where
 *                it keeps its pieces (none, selective) and its aux-loss
 *                statistics (th_moe_stats_bytes) under every mode. Fixed by
 *                the batch: the allocator holds every slot whatever the
 *                routing and --capacity-factor.
 *
 * Returns -1 for options the course's model does not run (a model that is
 * not the course's shape, SP with T not divisible by t). */
double th_course_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows);
/* The same bytes by kind (they add up to th_course_acts_bytes): the layers'
 * T^2 term (att), the layers' other pieces (linear in T), and the rest, which
 * is not per layer (x_in, tokens, the head's). All -1 where that returns -1. */
typedef struct th_acts_parts { double quadratic, linear, other; } th_acts_parts;
th_acts_parts th_course_acts_parts(const th_model *m, const th_opts *o, int lo, int hi, long rows);
/* EXACT: the backward scratch (gpt_scratch_alloc_part, workspace category),
 * one per stage, reused by every micro-batch: dres [Ns,C], dln [N,C]; dqkv
 * [N,3C/t]; datty [N,C/t]; datt [rows,H/t,T,T]; dfch, dfch_gelu [N,4C/t];
 * dlogits [Ns,V]; under SP (t > 1) the collectives' staging, 2 x [N,C] +
 * [Ns,C]; and the recomputation's one layer: selective att, full every piece
 * of a layer under none (the forward's intermediates and the backward's
 * recomputation go there, so they are counted once per stage, here, and not
 * per micro-batch in the activations); all values of the precision. With
 * experts dfch, dfch_gelu k N slots' rows, the router's backward
 * (th_moe_scratch_bytes), and under full the layer's router state and
 * statistics. */
double th_course_scratch_bytes(const th_model *m, const th_opts *o, long rows);
/* EXACT: a split backward's weight-gradient block (gpt_wgrads_alloc_part,
 * activations category, per micro-batch from B to W): per layer dres3, dres2
 * [N,C], dln1, dln2 [Ns,C], dfch [N,4C/t], dqkv [N,3C/t], and under
 * --recompute full what W reads of the layer (ln1, ln2 [N,C] + their
 * statistics [Ns], atty [N,C/t], res2 [Ns,C], fch_gelu [N,4C/t]), which B's
 * recomputation leaves there; last stage dlogits [Ns,V], dlnf [Ns,C]; first
 * stage dx [Ns,C]. With experts (lab04's zero-bubble schedules with
 * --experts): fch's pieces k N slots wide, and per layer the slots' dys and the
 * router's d logits (th_moe_scratch_bytes), under full the router's and
 * dispatch's state too (th_moe_state_bytes). */
double th_course_wgrads_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows);
/* Elements whose gradients are partial on each TP rank under sequence
 * parallelism, because they act on its T/t positions only, summed over the TP
 * group by one all-reduce (lab05): the LayerNorms of layers [lo, hi) (4C
 * each), and where the range has them the embedding (V C + T C) and the head
 * (2C + V C). The row-parallel biases are not among them: their gradient comes
 * from the all-gathered output gradient, whole on every rank. */
double th_sp_partial_params(const th_model *m, int lo, int hi);
/* EXACT: the gradient-norm sums (common/optim.h grad_norm, workspace category):
 * one double per part, kept on the device for the whole run. lab02 keeps one
 * part, lab05 and lab06 two (the sharded and the replicated tensors' squares);
 * lab01, lab03 and lab04 sum on the host and keep none. */
double th_grad_norm_bytes(int parts);

/* PUBLISHED, 16-bit activations (Korthikanti et al. 2022, Table 2), bytes per
 * layer per micro-batch of b sequences, s = seq, h = d_model, a = heads:
 *
 *   no recomputation    sbh (10 + 24/t + 5as/(ht))      SP: sbh (34/t + 5as/(ht))
 *   selective           sbh (10 + 24/t)                 SP: 34 sbh / t
 *   full                2 sbh                           SP: 2 sbh / t
 *
 * generalised from the paper's breakdown to grouped-query attention and other
 * MLP widths (the 24 is 8 of attention, 4 + 4 kv/a with GQA, and 16 of the
 * 4h GELU MLP, 4 F/h; a gated MLP stores 6 F/h). "selective" also stands for
 * flash attention, which keeps no s x s scores either. The 10 holds the two
 * dropout masks (1 + 1) and the 5as/h the scores' mask (1 of 5): a model
 * without dropout (m->dropout 0: Llama 3) keeps 8 and 4as/h, and no mask
 * after the embedding. o->recompute_modules (not under full): NORMS drops the
 * norms' outputs, the inputs of QKV and of the MLP (2 + 2 of the 10); EXPERT_ACT
 * drops the routed experts' activation output (2 F/h of their 6, or of 4). */
double th_published_layer_acts_bytes(const th_model *m, const th_opts *o, long b);
/* Layers [lo, hi) of one micro-batch, with Megatron's extras (its
 * theoretical_memory_usage.py): the first stage's embedding output (sbh bytes)
 * and the last stage's final norm output (2 sbh) and fp32 logits (4 sbV / t). */
double th_published_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long b);
/* Context parallelism (o->cp = N) splits every layer's sequence: each rank
 * keeps the activations of its T/N positions, the s x s scores as (s/N) x s,
 * so both functions divide by N (Llama 3's CP, section 3.3.2). With experts a
 * token's MLP activations are those of its k routed and shared experts, each
 * ffn_expert wide, plus the dispatched copy of its input k times (2 k h bytes)
 * and the router's fp32 probabilities (4 E); the first dense_layers keep ffn. */

/* ---- traffic ---------------------------------------------------------------------------- */

/* The kinds (comm_kind) and the bytes one rank moves per payload byte
 * (comm_ring_factor): common/kinds.h, as the communicator counts them. */

/* One rank's traffic of one kind per step. */
typedef struct th_traffic { double calls, payload, ring; } th_traffic;

/* lab01: one all-reduce of the gradient (grad_bytes) over dp ranks, ring
 * 2(N-1)/N x grad_bytes; buckets change the calls, not the bytes. */
th_traffic th_dp_traffic(double grad_bytes, int dp, int calls);
/* lab02: ZeRO stages 1-2 reduce-scatter the gradient and all-gather the
 * parameters, 2(N-1)/N x bytes (DP's all-reduce); stage 3 gathers them for
 * the forward and again for the backward, 3(N-1)/N. psi_bytes: the padded
 * buffer the collectives move. Payload and ring of both kinds together. */
th_traffic th_zero_traffic(double psi_bytes, int dp, int zero_stage);
/* lab05: 4 all-reduces per layer and micro-batch (2 g's forward, 2 f's
 * backward) of one activation (act_bytes, rows x T x C x 4), ring 2(t-1)/t;
 * none for t = 1. With sequence parallelism each becomes an all-gather and a
 * reduce-scatter of the same buffer: twice the calls, the same ring bytes. */
th_traffic th_tp_traffic(int layers, int micro_batches, int tp, double act_bytes, int sequence_parallel);
/* lab05 and lab06 as they run, o->tp ranks: th_tp_traffic, and under
 * --recompute full the forward's collectives once more (the layer's forward
 * runs again before its backward, all-reduces or all-gathers and
 * reduce-scatters included): 6 per layer instead of 4. */
th_traffic th_tp_traffic_run(int layers, int micro_batches, double act_bytes, const th_opts *o);
/* lab03/04: per stage boundary and micro-batch, one activation forward and
 * one gradient back, each counted as a send on one side and a receive on the
 * other: 2 x boundaries x m messages of act_bytes per rank (sends plus
 * receives); chunks v > 1 (interleaved) cross v times as many boundaries. */
th_traffic th_pp_traffic(int boundaries, int micro_batches, int chunks, double act_bytes);

/* ---- context parallelism (lab07): every layer's sequence over N ranks ---------------------- */

/* Which positions a rank holds. contiguous: rank r holds [r T/N, (r+1) T/N).
 * zig-zag: T cut into 2N chunks of s = T/(2N), rank r holds chunk r and then
 * chunk 2N-1-r, so under the causal mask every rank has as many scores to
 * compute as every other (TransformerEngine's and Llama 3's load balance). */
typedef enum { TH_CP_CONTIGUOUS, TH_CP_ZIGZAG } th_cp_layout;
/* The global position of rank r's i-th position, 0 <= i < T/N (T divisible
 * by N, by 2N for zig-zag). */
long th_cp_position(long T, int N, int rank, long i, th_cp_layout layout);
/* EXACT: the causal scores rank r computes per sequence and head, the (query,
 * key) pairs with key position <= query position over its queries and all T
 * keys (kernels.h's attention_unmasked_scores, summed over the blocks):
 *   contiguous  s^2 r + s (s+1) / 2,   s = T/N
 *   zig-zag     s^2 (2N-1) + s (s+1),  s = T/(2N), the same on every rank
 * T = 64, N = 4: 136, 392, 648, 904 contiguous; 520 each zig-zag (of 2080). */
double th_cp_causal_scores(long T, int N, int rank, th_cp_layout layout);

typedef enum { TH_CP_RING, TH_CP_ALLGATHER, TH_CP_ULYSSES } th_cp_algo;
/* EXACT: the same per head of the model for an algorithm: ring and allgather
 * th_cp_causal_scores; ulysses, every rank all T (T+1) / 2 scores of its
 * heads/N heads, T (T+1) / (2N) per head of the model on every rank, whatever
 * the layout. */
double th_cp_rank_scores(long T, int N, int rank, th_cp_layout layout, th_cp_algo algo);
/* Bytes one rank sends and receives for one layer's attention and one
 * micro-batch of `rows` sequences, the sequence T over N ranks, queries and
 * outputs d_model wide, keys and values kv_dim wide (d_model without
 * grouped-query attention), value_bytes each. With b = rows (T/N) kv_dim
 * value_bytes (one rank's K, or V) and q = rows (T/N) d_model value_bytes:
 *   ring       forward  K and V travel N-1 steps:            2 (N-1) b
 *              backward K and V again, N-1 steps, and dK and dV
 *                       N steps (the last one home):          2 (N-1) b + 2 N b
 *   allgather  forward  all-gather K and V (ring algorithm):   2 (N-1) b
 *              backward all-gather them again (they are not kept) and
 *                       reduce-scatter dK and dV:             4 (N-1) b
 *   ulysses    forward  all-to-all Q, K, V to a head split, the output
 *                       back to a sequence split:             (N-1)/N (2q + 2b)
 *              backward the same for dO and dQ, dK, dV:       (N-1)/N (2q + 2b)
 * Every exchange is symmetric: received = sent. All 0 for N = 1. */
typedef struct th_cp_traffic { double fwd_sent, fwd_recv, bwd_sent, bwd_recv; } th_cp_traffic;
th_cp_traffic th_cp_layer_traffic(th_cp_algo algo, int N, long rows, long T, long d_model, long kv_dim,
                                  double value_bytes);

/* EXACT: the activations one rank of a CP group allocates for one micro-batch
 * of `rows` sequences (lab07: gpt_acts_alloc_part over all layers): the
 * course's layers (th_course_acts_bytes) on T/N positions, except that where a
 * one-rank layer keeps its attention matrix [rows,H,T,T] a CP layer keeps per
 * query row and head its fp32 log-sum-exp, and under Ulysses also the
 * head-split q, k, v and output (4 HS more values: every position of H/N
 * heads, lab07's cp_att_row); nothing there under --recompute selective or full.
 * Every piece is per position: 1/N of one rank's for ring and allgather.
 * -1 where th_course_acts_bytes is, or T not divisible by N. */
double th_cp_acts_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo);
/* EXACT: one layer's CP collectives on one rank per micro-batch, by kind
 * (common/kinds.h, as the communicator counts them: a point-to-point message at
 * both ends): calls[k] and payload[k] bytes, block = one [rows,T/N,2 width]
 * K|V block's bytes (width: the rank's heads x head size), `forwards` 2 under
 * --recompute. ring: sends and receives of forwards(N-1) + (N-1) + N blocks;
 * allgather: forwards + 1 all-gathers of N blocks, 1 reduce-scatter of N;
 * ulysses: 2(forwards + 1) all-to-alls carrying 2 blocks' bytes each pass. */
void th_cp_layer_calls(th_cp_algo algo, int N, double block, int forwards, double *calls, double *payload);
/* EXACT: the workspace of one CP rank (lab07; lab09 at o's TP degree, heads/t
 * per rank): th_cp_scratch_bytes, one stage's layer scratch on T/N positions
 * with att slots where a whole layer's scratch keeps [rows,H,T,T] (its datt;
 * and the recomputed att under --recompute); th_cp_hooks_bytes, the attention
 * hook's own, once per rank: the positions (T ints), and for ring and
 * allgather one block's output and log-sum-exp. */
double th_cp_scratch_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo);
double th_cp_hooks_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo);
/* The same for the layers [lo, hi) of a pipeline stage (the embedding with
 * layer 0, the head with the last), at o's TP degree (lab09: each TP rank's
 * att slot holds its heads/t heads). */
double th_cp_stage_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows, int N,
                              th_cp_algo algo);

/* The ring's condition for hiding its messages: while one K/V block is
 * computed on, the next travels, so the ring costs no time beyond its compute
 * when a block's attention takes at least as long as its message:
 *   block_seconds   = 4 C x (the rank's scores per sequence and head) / N
 *                     x rows / flops_rate  (q k^T and p v, 2 FLOPs a multiply-add)
 *   message_seconds = rows (T/N) 2C value_bytes / bandwidth  (one K|V block)
 * With zig-zag a block averages (T/N)^2 / 2 scores, so the condition reads
 * T/N >= flops_rate x value_bytes / bandwidth = positions_needed: the
 * positions per rank must outgrow the machine's FLOPs per byte of link. An
 * H100 at 400 TFLOP/s in bf16 over 400 GB/s NVLink needs ~2,000 positions per
 * rank, over 50 GB/s InfiniBand ~16,000. hidden: block >= message. All 0 for
 * N < 2 or a rate or bandwidth not > 0. */
typedef struct th_cp_ring_hiding { double block_seconds, message_seconds, positions_needed; int hidden; } th_cp_ring_hiding;
th_cp_ring_hiding th_cp_ring_hiding_of(long rows, long T, int N, long d_model, double value_bytes,
                                       double scores_per_rank, double flops_rate, double bandwidth);

/* ---- expert parallelism (lab08, plan3d): the experts over N ranks --------------------------- */

/* Bytes one rank sends per MoE layer and micro-batch when its tokens tokens
 * each go to top_k experts spread evenly over N ranks, routing uniform:
 * every all-to-all moves k tokens x d_model values of each token, of which
 * (N-1)/N leave the rank; the forward dispatches and combines (2), the
 * backward sends the gradients both ways (2):
 *   forward  2 k tokens d_model value_bytes (N-1)/N,  backward the same,
 * 4 k N_tok C b (N-1)/N in all (issue 25). Received = sent. 0 for N = 1. */
th_cp_traffic th_ep_layer_traffic(int N, double tokens, long top_k, long d_model, double value_bytes);
/* lab09's experts beside CP: each MoE layer's routing walks whole sequences,
 * so every forward gathers each CP rank's router probabilities [N,E] (fp32)
 * and choices [N,k] (int32) over the CP group, N the tokens a rank routes per
 * micro-batch (common/moe.h moe_split). `routed`: forwards x MoE layers x
 * micro-batches per step. 2 routed all-gathers, each[0] = 4 cp N E and
 * each[1] = 4 cp N k bytes a call, ring (cp-1)/cp; nothing for cp = 1. */
th_traffic th_ep_routing_gathers(double routed, int cp, double tokens, long experts, long top_k, double each[2]);
/* lab08's all-to-alls over `passes` MoE layers x micro-batches: 3 a forward
 * (the counts, the dispatch, the combine; `forwards` 2 under --recompute
 * full) and 2 a backward (the gradients both ways). */
double th_ep_alltoall_calls(double passes, int forwards);
/* lab09's experts: a rank's elements of layers [lo, hi) by kind of run
 * (lab09_5d/experts.h), added to elems: [0] replicated (th_stage_params less
 * the others), [1] experts (th_stage_expert_params; o->ep: E/e experts a
 * layer on a rank), [2] TP-sharded (o->tp > 1: attention's matrices / t). */
enum { TH_EP_REPLICATED, TH_EP_EXPERTS, TH_EP_TP_SHARDED, TH_EP_KINDS };
void th_ep_stage_elements(const th_model *m, const th_opts *o, int lo, int hi, double elems[TH_EP_KINDS]);
/* lab09's experts, the gradient's sums over layers [lo, hi) per step (its
 * runs): the replicated runs (the embedding where lo = 0, each layer's
 * attention part (at t > 1 two: the LayerNorm before it, its output bias with
 * the next LayerNorm) and its router with any shared experts, the head where
 * hi = m->layers) each all-reduced over `stage` ranks (t x c x d: at t = 1 the
 * replicas); each layer's four expert tensors over the EDP group; at t > 1
 * each layer's TP-sharded pieces at once over the c x d replicas.
 * sums[kind] as th_ep_stage_elements orders them. */
void th_ep_grad_sums(const th_model *m, const th_opts *o, int lo, int hi, double value_bytes, int stage, int edp,
                     int replicas, th_traffic sums[TH_EP_KINDS]);
/* lab09's experts under ZeRO-1: one kind of run (elems elements, packed and
 * padded to ceil(elems/group) x group, *slice the rank's share) reduce-scattered
 * and all-gathered over its group: th_zero_traffic of the padded buffer, 2
 * calls; nothing for a group of one. */
th_traffic th_ep_zero_traffic(double elems, int group, double value_bytes, double *slice);
/* Copies of one token's row that cross nodes in one all-to-all (dispatch or
 * combine) of an EP group spread over `nodes` nodes, routing uniform. Each
 * choice sent on its own (lab08; max_nodes 0): k (nodes-1)/nodes. Node-limited
 * (DeepSeek-V3, section 3.2.2: at most M = 4 nodes a token, the row sent once
 * to each node over InfiniBand, then to its experts there over NVLink): the
 * token reaches at most min(M, k, nodes) nodes, each another than its own with
 * probability (nodes-1)/nodes. V3 (k 8, M 4, EP 64 over 8 nodes): 3.5 copies
 * instead of 7. 0 inside one node. */
double th_ep_cross_node_copies(long top_k, long max_nodes, int nodes);
/* Tokens per expert under uniform routing: k tokens / E of the tokens the
 * expert's EP group holds (the mean; the max is what capacity bounds). */
double th_ep_tokens_per_expert_uniform(long tokens, int top_k, int experts);
/* Slots per expert over `tokens` tokens (a sequence, or --capacity-scope
 * rank's rows): ceil(k tokens F / E), at most `tokens` (a token picks an
 * expert once: more slots drop nothing, and a huge F is no limit); a product
 * within 1e-9 of an integer is that integer (F is the flag's decimal: 2 x 50 x
 * 1.1 / 10 is 11 slots). `tokens` with F <= 0 (no limit). The same rule as
 * common/moe.c's moe_capacity_over (test_theory holds them equal). */
double th_expert_capacity(int top_k, double tokens, double capacity_factor, int experts);
/* The most slot rows one EP rank receives per MoE layer and step, `rows`
 * sequences on each of the N ranks: per sequence at most min(cap, T) slots go
 * to each of its E/N experts (cap = th_expert_capacity over T, the capacity per
 * expert and sequence; a token picks an expert once, so T without capacity, F = 0:
 * the capacity-free bound) and k T in all. lab08 sizes its received-row
 * buffers to this when F > 0. */
double th_ep_received_rows_bound(long rows, long seq, int top_k, int experts, int N, double capacity_factor);
/* The same when each source rank holds `positions` of every sequence of `seq`
 * (lab09 with CP: T/c): the capacity is over the whole sequence, a source's
 * share of one expert at most min(cap, positions), k positions in all. */
double th_ep_received_rows_bound_over(long rows, long positions, long seq, int top_k, int experts, int N,
                                      double capacity_factor);
/* EXACT: common/moe.c's router and dispatch state of one layer for `rows`
 * sequences (moe_state_bytes: probs [N,E], choice, gate, slot [N,k], count,
 * first [E], freq [rows,E], xs, ys [N k, C]; with S shared experts their
 * fch, GELU [N, S ffn_expert] and output [N,C]) and its backward's buffers
 * (moe_scratch_bytes: dys [N k, C], dgate [N,k], dp [N,E]; shared: dout
 * [N,C], dfch [N, S ffn_expert], dGELU [N, max(S ffn_expert, C)]), v bytes a value. */
double th_moe_state_bytes(const th_model *m, double rows, double v);
double th_moe_scratch_bytes(const th_model *m, double rows, double v);
/* EXACT: a layer's routing statistics (layer_acts.moe_stats: 6 + E floats,
 * kept under every --recompute mode); 0 without experts. */
double th_moe_stats_bytes(const th_model *m);
/* EXACT: one lab08 rank's activations (MEM_ACTS) for `rows` sequences, m the
 * course's model with experts and top_k set: th_course_acts_bytes (lab01's
 * layers with experts: the router state, not kept under --recompute full, and
 * the statistics, always) without each layer's fch and GELU pieces [k N,ffn]
 * (the experts' hidden rows live in the hook), plus the rows
 * received[l] layer l's buffers hold (at least 1): xr, yr [r,C], fch, GELU
 * [r,ffn]. With F > 0 received[l] is th_ep_received_rows_bound for every
 * layer; with F = 0 the most rows the run routed to the rank in that layer.
 * -1 where th_course_acts_bytes is, or without experts. */
double th_ep_acts_bytes(const th_model *m, const th_opts *o, long rows, const double *received);
/* The same for one pipeline block of layers [lo, hi) (lab09's experts: each
 * block in flight claims its own received-row buffers), every layer at
 * `received` rows; and the scratch of such a block's layers (lab01's, without
 * the slots' pieces the hook keeps) and of the hook's backward (dyr [r,C],
 * dfch [r,F], dGELU [r, max(F, C)], one set per rank). -1 as th_ep_acts_bytes. */
double th_ep_stage_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows, double received);
/* What the experts change in such a block: th_ep_stage_acts_bytes less
 * th_course_acts_bytes (the slots' hidden pieces out, the received rows in),
 * so that a block whose other pieces differ (lab09's CP attention slots) adds
 * it to its own: m the block's model (seq: the positions a rank holds). */
double th_ep_acts_change_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows, double received);
double th_ep_scratch_bytes(const th_model *m, const th_opts *o, long rows);
double th_ep_hook_scratch_bytes(const th_model *m, const th_opts *o, double received);
/* Dropless routing (F = 0: every choice computed, Megatron's "dropless" MoE):
 * no capacity bounds what a rank's experts receive, so their buffers grow with
 * the load's skew s, the rank's received rows in a layer over the uniform k
 * N_tok (s = 1: uniform routing): s k N_tok rows, at most the capacity-free
 * bound (th_ep_received_rows_bound at F = 0: every token of the EP group to
 * the rank's experts). th_ep_dropless_acts_bytes: lab08's activations with
 * every layer at that skew (th_ep_acts_bytes; exact where each layer received
 * that many, so for a run it bounds what its busiest layer's skew costs). */
double th_ep_dropless_rows(long rows, long seq, int top_k, int experts, int N, double skew);
double th_ep_dropless_acts_bytes(const th_model *m, const th_opts *o, long rows, int N, double skew);

/* ---- pipeline schedules ------------------------------------------------------------------- */

typedef enum {
    TH_SCHED_GPIPE, TH_SCHED_1F1B, TH_SCHED_INTERLEAVED, TH_SCHED_ZB_H1, TH_SCHED_ZB_V, TH_NSCHED
} th_schedule;
extern const char *const th_schedule_names[TH_NSCHED]; /* "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v" */
/* -1 for an unknown name. */
int th_schedule_parse(const char *name);
/* Model chunks per rank a schedule runs: v for interleaved, 2 for ZB-V, else 1. */
int th_schedule_chunks(th_schedule s, int v);

/* ---- the pipeline's pure rules (lab03/lab04/lab06 run them, predict and plan3d count them) ----
 * How L layers are cut into S (virtual) stages: contiguous runs, as equal as
 * possible. With L = q S + s, every stage gets q layers and the LAST s stages
 * one more (the early stages of a 1F1B pipeline keep the most micro-batches of
 * activations, so they get the shorter runs). The first stage also holds the
 * embedding, the last the final LayerNorm, head and loss.
 * Example: L = 10, S = 4 -> layers [0,2) [2,4) [4,7) [7,10).
 * Every stage needs at least one layer: S > L cannot be split. */
int th_stage_split_possible(int layers, int stages);
void th_stage_layers(int layers, int stages, int stage, int *lo, int *hi);
/* Llama 3's balanced pipeline (Llama 3 report, section 3.3.2: "we reduce one
 * Transformer layer each from the first and the last stages ... the first
 * model chunk on the first stage has only the embedding, and the last model
 * chunk on the last stage has only output projection and loss"): the
 * embedding and the head each take a layer's place, so L + 2 slots are cut as
 * th_stage_layers cuts them and the first and last stages give one slot each
 * back. 126 layers over 128 stages: 1 layer each, stages 0 and 127 none.
 * Possible for stages <= layers + 2 (a stage may be left with no layer). */
int th_stage_split_ends_possible(int layers, int stages);
void th_stage_layers_ends(int layers, int stages, int stage, int *lo, int *hi);
/* Where the p x chunks virtual stages sit: chunk c of pipeline rank r is
 * stage th_chunk_stage (zb-v's V: r, then 2p-1-r; else Megatron's c p + r,
 * chunk c of every rank before chunk c+1 of any), th_stage_place the inverse. */
int th_chunk_stage(th_schedule s, int p, int rank, int chunk);
void th_stage_place(th_schedule s, int p, int stage, int *rank, int *chunk);

/* The pipeline formulas of lab04's schedules (lab04_1f1b/schedule.h has the
 * lists themselves, its simulator and the tests that hold these equal to them;
 * lab04's summary and record, lab06's and plan3d print these functions).
 *
 * The idle time per rank per step when a micro-batch's forward over the
 * rank's whole share of the layers takes tF, the input-gradient half of its
 * backward tB and the weight-gradient half tW (GPipe and 1F1B run the two
 * halves as one backward, tB + tW; a chunk of v takes 1/v of each):
 *   gpipe, 1f1b   (p-1)(tF + tB + tW)
 *   interleaved   (p-1)(tF + tB + tW) / v
 *   zb-h1         (p-1) max(tF, tB, tF + tB - tW); the paper's (p-1)(tF + tB - tW)
 *                 whenever tW is the smallest (Qi et al. 2024, section 2)
 *   zb-v          (p-1) max(tB - tW, tB / 2) whenever tW <= tF <= tB, the usual
 *                 order (a weight half no longer than the forward, attention's
 *                 backward all in B); on other times lab04's V has no closed
 *                 form (th_bubble_time_exact says when this one holds) and
 *                 lab04 simulates its lists instead.
 * Exact for lab04's lists whenever th_bubble_time_exact: the makespan of the
 * lists on these times, sends free, is m (tF + tB + tW) + this. */
double th_bubble_time(th_schedule s, int p, int m, int v, double tF, double tB, double tW);
int th_bubble_time_exact(th_schedule s, double tF, double tB, double tW);
/* A pipelined step: m (tF + tB + tW) of work plus th_bubble_time. */
double th_pipeline_step_time(th_schedule s, int p, int m, int v, double tF, double tB, double tW);
/* The textbook bubble, the idle fraction of a step on unit times (a forward,
 * an input-gradient half and a weight-gradient half take one slot each):
 *   gpipe, 1f1b   (p-1) / (m + p-1)     (lab03's naive schedule is m = 1: (p-1)/p)
 *   interleaved   (p-1) / (v m + p-1)   (Narayanan et al. 2021: the bubble / v)
 *   zb-h1         (p-1) / (3m + p-1)    (a third of 1F1B's idle time)
 *   zb-v          (p-1) / (6m + p-1)    (half of ZB-H1's: lab04's V idles only
 *                                        while the first micro-batch fills it) */
double th_bubble_unit(th_schedule s, int p, int m, int v);
/* As text: "(p-1)/(m+p-1)" ... */
const char *th_bubble_unit_text(th_schedule s);
/* th_bubble_time as text: "(p-1)(tF+tB+tW)" ... */
const char *th_bubble_time_text(th_schedule s);

/* The activation blocks chunk c (0 .. chunks-1) of pipeline rank r holds at
 * its peak, each chunk its own pool (lab04's executor), counted as the lists
 * of lab04 run:
 *   acts    micro-batches whose forward has run and whose backward (its W
 *           where the schedule splits it) has not: one block of the chunk's
 *           activations each (th_course_acts_bytes)
 *   wgrads  micro-batches whose B has run and whose W has not: one block of
 *           the weight half's inputs each (th_course_wgrads_bytes, above); 0 unless split
 * gpipe m; 1f1b min(m, p-r); zb-h1 p and r+1 (m >= p); zb-v chunk 0
 * min(m, 2p-r) and r+1, chunk 1 r+1 and max(1, r) (m >= 2p-1); interleaved
 * (m a multiple of p): counted on Megatron's order (theory/bubble.c). */
void th_chunk_in_flight(th_schedule s, int p, int m, int v, int rank, int chunk, int *acts, int *wgrads);
/* Activations rank r holds at its peak in units of one micro-batch over all
 * of its layers: the sum over its chunks of th_chunk_in_flight's acts / chunks
 * (chunks of equal layers; plan3d's layouts). */
double th_acts_in_flight(th_schedule s, int p, int stage, int m, int v);

#endif
