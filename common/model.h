/* GPT-2-style decoder: parameter layout, initialisation, and forward/backward
 * of a range of layers.
 *
 * All parameters live in one flat buffer, laid out layer by layer:
 *
 *   [ embedding: wte, wpe ][ layer 0 ][ layer 1 ] ... [ layer L-1 ][ head: lnf_w, lnf_b, head_w ]
 *
 * so a pipeline stage, a ZeRO shard, a gradient bucket or one layer is a
 * contiguous range [begin, end) of offsets. Gradients and the two AdamW
 * moments use the same layout. Each layer block has the same inner layout,
 * so code that runs one layer only needs a pointer to that layer's block.
 *
 * Parameters, gradients and activations are the model's values, in the run's
 * precision (precision.h: fp32, or bf16 with --precision bf16): their buffers
 * are void *, value_bytes() per element, and offsets into them go through
 * value_at(). LayerNorm statistics and the losses are fp32 in both. */
#ifndef PL_MODEL_H
#define PL_MODEL_H
#include "precision.h"
#include <stdint.h>

/* --recompute (every lab): what a layer keeps between its forward and its
 * backward. A memory technique, not a parallel strategy, so it lives here and
 * every lab's layers (lab05's tensor-parallel ones too) follow it.
 *   none       every activation its backward reads (layer_acts below)
 *   selective  all but the attention matrix att [B,NH,T,T], the one term that
 *              grows with T^2: the backward runs attention's forward again from
 *              the kept q, k, v (into the scratch) just before it needs att
 *   full       only its output, the next layer's input: its forward runs again,
 *              into the scratch's one-layer set, just before its backward
 * The recomputed values are the first forward's bit for bit (the same kernels
 * on the same inputs), so every mode trains exactly as none does, at the price
 * of the recomputation: selective the attention core again, full the forward. */
/* recompute_mode, its names and RECOMPUTE_CHOICES: kinds.h (theory/ counts them too) */
int gpt_recompute_parse(const char *name); /* -1 for an unknown name */

typedef struct gpt_config {
    int vocab;    /* 256: byte-level tokens */
    int seq;      /* T, the context length (and the rows of wpe) */
    int layers;   /* L */
    int d_model;  /* C */
    int heads;    /* NH; head size C / NH */
    int recompute; /* recompute_mode: how the layers run, not what they are */
    /* mixture of experts (moe.h; experts 0: the dense MLP): every MLP becomes
     * `experts` MLPs of the same shape and a router picking top_k of them per
     * token, capacity_factor > 0 dropping what overflows ceil(k T F / E) slots
     * per expert and sequence, aux_coef weighting Switch's load-balancing loss */
    int experts, top_k;
    /* a routed expert's hidden width (--expert-width; 0: the dense MLP's 4C):
     * fine-grained experts, narrower and more of them (DeepSeek-MoE) */
    int expert_width;
    /* shared experts (--shared-experts S; DeepSeek-MoE and V3): S more MLPs of
     * that width that every token runs, beside its k routed ones, at gate 1;
     * computed as one MLP of S x width hidden units (the sum of S MLPs is one
     * MLP with their hidden units side by side, their output biases one) */
    int shared_experts;
    /* the flag's value as a double: moe_capacity's ceiling must see the decimal
     * the user wrote (0.1 as a float is 0.100000001, and ceil(1.0000000149) = 2) */
    double capacity_factor;
    float aux_coef;
    /* 1: the capacity counts a rank's own tokens, ceil(k B T F / E) per expert
     * over its B rows, not per sequence: lab08's negative experiment (drops
     * then depend on how the batch is split over ranks) */
    int capacity_per_rank;
    /* DeepSeek-V3's routing (moe.h): 1: scores sigmoid(logits) instead of
     * softmax; route_bias [L][E] (NULL: none): added to the scores for the
     * top-k choice only, moved by the run after each step (--balance bias) */
    int router_sigmoid;
    const float *route_bias;
    /* node-limited routing (moe.h): > 0, the experts in route_groups groups of
     * E/G consecutive ones, each token's from at most route_max_groups of them */
    int route_groups, route_max_groups;
} gpt_config;

/* The hidden width of a layer's MLP: 4C dense, or each routed expert's (expert_width when set) */
long gpt_mlp_width(const gpt_config *c);

/* The tensors inside one layer block, in order. */
enum {
    LAYER_LN1_W, LAYER_LN1_B, LAYER_QKV_W, LAYER_QKV_B, LAYER_ATTPROJ_W, LAYER_ATTPROJ_B,
    LAYER_LN2_W, LAYER_LN2_B, LAYER_FC_W, LAYER_FC_B, LAYER_FCPROJ_W, LAYER_FCPROJ_B,
    LAYER_ROUTER_W, /* [E,C] with experts, empty (0 rows) in a dense model; with experts
                     * the four MLP tensors hold E experts' stacked by rows, each contiguous */
    /* the shared experts' MLP (S x M hidden units), empty without --shared-experts */
    LAYER_SHARED_FC_W, LAYER_SHARED_FC_B, LAYER_SHARED_FCPROJ_W, LAYER_SHARED_FCPROJ_B,
    LAYER_NTENSORS
};
/* The tensors outside the layers. */
enum { EMBED_WTE, EMBED_WPE, EMBED_NTENSORS };
enum { HEAD_LNF_W, HEAD_LNF_B, HEAD_W, HEAD_NTENSORS };

typedef struct tensor_info {
    const char *name; /* GPT-2 style, e.g. "h.{l}.attn.c_attn.weight" without the layer */
    long offset;      /* inside its block */
    long rows, cols;  /* cols == 1 for vectors */
    int decay;        /* AdamW weight decay applies: matrices only */
} tensor_info;

typedef struct gpt_layout {
    gpt_config cfg;
    tensor_info embed[EMBED_NTENSORS], layer[LAYER_NTENSORS], head[HEAD_NTENSORS];
    long embed_size, layer_size, head_size; /* elements per block */
    long total;                             /* elements in the whole model */
} gpt_layout;

void gpt_layout_init(gpt_layout *g, const gpt_config *cfg);
/* Offsets of the blocks in the flat buffer. */
long gpt_layer_offset(const gpt_layout *g, int layer); /* layer == L gives the head's */
long gpt_head_offset(const gpt_layout *g);
/* The parameter range of layers [lo, hi), with the embedding when lo == 0 and
 * the head when hi == L: what a pipeline stage owns. */
void gpt_range(const gpt_layout *g, int lo, int hi, long *begin, long *end);

/* Visit every tensor overlapping [begin, end): fn(ctx, info, global_offset, layer)
 * with layer -1 for the embedding and L for the head. */
typedef void (*tensor_visitor)(void *ctx, const tensor_info *t, long offset, int layer);
void gpt_for_each_tensor(const gpt_layout *g, long begin, long end, tensor_visitor fn, void *ctx);

/* GPT-2 initialisation of the elements [begin, end) into dst (a device buffer of
 * end - begin floats): N(0, 0.02) for matrices, 0.02 / sqrt(2 L) for the two
 * residual projections, 1 for LayerNorm weights, 0 for biases. Every value is
 * a pure function of (seed, tensor, element index), so any rank can create
 * exactly its slice and every layout starts from bit-identical weights. */
void gpt_init_params(const gpt_layout *g, uint64_t seed, long begin, long end, float *dst);
/* The same values in the run's precision (rounded to bf16 in a bf16 run):
 * what forward and backward read. */
void gpt_init_values(const gpt_layout *g, uint64_t seed, long begin, long end, void *dst);
/* One initial value: element `index` (row-major inside the tensor) of tensor t
 * of `layer` (-1: embedding, L: head; t points into g->embed, g->layer or
 * g->head). A tensor-parallel rank uses it to create exactly its shard. */
float gpt_init_value(const gpt_layout *g, uint64_t seed, int layer, const tensor_info *t, long index);
/* The counter-based normal sample behind it. */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* Activations of layers [lo, hi) for one micro-batch of B rows, in one
 * allocation of the activations category (so in-flight micro-batches are
 * counted by the allocator). */
typedef struct layer_acts {
    void *ln1, *qkv, *atty, *att, *res2, *ln2, *fch, *fch_gelu, *res3; /* res3: the layer output */
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;                  /* fp32 in both precisions */
    void *moe; /* with experts: the router's and the dispatch's state (moe.h); fch and
                * fch_gelu then hold the k N slots of the experts, not N rows */
    float *moe_stats; /* with experts: the layer's aux-loss sum, dropped choices, slots, margin, the
                       * choices per expert [E], the groups reached (most, sum) (moe.h; kept in
                       * every --recompute mode) */
    int layer;        /* the model's layer this set runs (experts: its row of cfg.route_bias) */
    void *moe_kept;   /* with experts, a backward split in B and W: the micro-batch's layer_wgrads.moe,
                       * set by the backward for its MLP hook; NULL otherwise */
} layer_acts;

typedef struct gpt_acts {
    int B, lo, hi;
    int seq, seq_first;    /* positions of each row held outside the layers' insides: all T
                            * from 0, or a sequence-parallel rank's T/t from part x T/t */
    const int *positions;  /* host, seq: the global position of each of the block's positions
                            * (context parallelism: a rank's chunks; the embedding's wpe rows and
                            * gpt_acts_set_batch's columns); NULL: seq_first, seq_first + 1, ... */
    int *tokens, *targets; /* device, B*seq each: tokens on the first stage, targets on the last */
    void *x_in;            /* [B,seq,C] input of layer lo: the embedding output or what was received */
    layer_acts *layer;     /* hi - lo of them; under --recompute full only their res3 */
    void *lnf, *logits, *probs;                /* last stage only, B*seq positions */
    float *lnf_mean, *lnf_rstd, *losses;       /* last stage only; fp32 */
    void *block;           /* the one allocation */
    long bytes;
    long att_bytes, layer_bytes; /* of which the layers' att pieces (the T^2 term), and their
                                  * other pieces; the rest (x_in, tokens, the head's) is not per layer */
    struct gpt_grad_scratch *scratch; /* gpt_acts_bind: where the forward puts what it does not keep */
} gpt_acts;

void gpt_acts_alloc(gpt_acts *a, const gpt_layout *g, int lo, int hi, int B);
void gpt_acts_free(gpt_acts *a);
/* The output of the range: the last layer's res3 ([B,T,C]), what a stage sends on. */
void *gpt_acts_output(const gpt_acts *a);

/* Scratch for the backward of one stage, reused by every micro-batch
 * (workspace category), and the one-layer set where --recompute puts what the
 * layers do not keep: selective, work.att; full, every piece of work (the
 * forward computes there, and the backward recomputes there). With sequence
 * parallelism (lab05) also the staging of its collectives: seq_full [B,T,C],
 * seq_packed [B,T,C] (the same rows, rank by rank) and seq_shard [B,T/t,C]. */
typedef struct gpt_grad_scratch {
    void *dres, *dln, *dqkv, *datty, *datt, *dfch, *dfch_gelu, *dlogits;
    layer_acts work;
    void *seq_full, *seq_packed, *seq_shard;
    void *moe;   /* with experts: the backward's dispatch buffers (moe.h) */
    float dloss; /* the backward's weight of one position in the loss (the aux loss's gradient scales by it) */
    void *block;
} gpt_grad_scratch;
void gpt_scratch_alloc(gpt_grad_scratch *s, const gpt_layout *g, int B);
void gpt_scratch_free(gpt_grad_scratch *s);
/* The forward of a block needs its stage's scratch under --recompute
 * selective and full (and sequence parallelism): bind them once, after both
 * are allocated. A forward that needs it and finds none ends the job. */
void gpt_acts_bind(gpt_acts *a, gpt_grad_scratch *s);
/* Copy one batch's tokens and targets ([B,T] each, host) into the block: the
 * first stage's tokens, the last stage's targets, only the positions it holds. */
void gpt_acts_set_batch(gpt_acts *a, const int *tokens, const int *targets, int T);

/* The part of every layer a block computes (lab05's tensor parallelism): its
 * heads and MLP units, and, with sequence parallelism, which of seq_parts
 * equal slices of every sequence's positions it holds outside the
 * tensor-parallel regions (the residual stream, the LayerNorms, the embedding
 * and the loss): positions [seq_part x T/seq_parts, (seq_part + 1) x T/seq_parts).
 * The inputs of the column-parallel matmuls (ln1, ln2) and everything between
 * them and the row-parallel ones stay whole along the sequence. common/'s own
 * layers run whole blocks only (seq_parts 1); lab05 runs the rest. */
typedef struct gpt_part {
    int heads, mlp_width, seq_parts, seq_part;
    int att_row; /* values per query row kept as att: 0 means T (the attention matrix); a
                  * context-parallel rank keeps there only the row's fp32 log-sum-exp */
} gpt_part;
void gpt_acts_alloc_part(gpt_acts *a, const gpt_layout *g, int lo, int hi, int B, const gpt_part *p);
void gpt_scratch_alloc_part(gpt_grad_scratch *s, const gpt_layout *g, int B, const gpt_part *p);

/* Forward of layers [a->lo, a->hi) on `params`, the flat buffer holding the
 * range gpt_range(lo, hi) (params[0] is element `begin` of the model).
 * The first stage embeds a->tokens (x_in is ignored); others read a->x_in.
 * The last stage also computes a->losses[B*T] from a->targets.
 * Returns nothing; losses stay on the device. */
void gpt_forward(const gpt_layout *g, const void *params, gpt_acts *a);

/* Called by gpt_backward whenever the gradients of [begin, end) are final for
 * this micro-batch (blocks finish from the head down to the embedding), so a
 * data-parallel lab can start reducing them while the rest of the backward runs. */
typedef void (*grads_ready_fn)(void *ctx, long begin, long end);

/* Backward of the same range, accumulating into `grads` (same indexing as
 * params). dloss is each position's weight in the loss (1 / tokens averaged
 * over). The last stage starts from the loss; others from dout ([B,T,C], the
 * gradient of the range's output). Returns the gradient of x_in (inside s;
 * valid until the next backward), NULL on the first stage. */
void *gpt_backward(const gpt_layout *g, const void *params, void *grads, gpt_acts *a,
                   gpt_grad_scratch *s, const void *dout, float dloss,
                   grads_ready_fn ready, void *ready_ctx);

/* The pieces gpt_forward and gpt_backward are made of, for labs that hold
 * parameters or gradients per layer rather than per range (ZeRO-2/3 gathers a
 * layer's weights just before using it). Each takes a pointer to its own block
 * (the embedding's, a layer's, the head's), not to the flat range.
 * Backward: the head's sets s->dres to the gradient of the last layer's output;
 * a layer's turns s->dres from the gradient of its output into that of its
 * input; the embedding's consumes s->dres. Gradients are accumulated. */
void gpt_embed_forward(const gpt_layout *g, const void *embed_params, gpt_acts *a);
void gpt_layer_forward(const gpt_layout *g, const void *layer_params, gpt_acts *a, int layer);
void gpt_head_forward(const gpt_layout *g, const void *head_params, gpt_acts *a);
void gpt_head_backward(const gpt_layout *g, const void *head_params, void *head_grads,
                       gpt_acts *a, gpt_grad_scratch *s, float dloss);
void gpt_layer_backward(const gpt_layout *g, const void *layer_params, void *layer_grads,
                        gpt_acts *a, int layer, gpt_grad_scratch *s);
void gpt_embed_backward(const gpt_layout *g, void *embed_grads, gpt_acts *a, gpt_grad_scratch *s);

/* ---- the backward in two halves (lab04's zero-bubble schedules) -----------------
 * B, the input half: the gradient of the range's input, which the previous
 * pipeline stage waits for. W, the weight half: the gradients of the weights,
 * which nobody waits for until the optimizer step, so a schedule may run it
 * later, in what would otherwise be idle time. B then W gives exactly
 * gpt_backward's gradients (the same kernels on the same values).
 *
 * What W needs from B: the gradient at the output of every matmul and
 * LayerNorm of the range (the "dout" of their weight gradients). B leaves them
 * in a gpt_wgrads block, one per micro-batch, which lives from B until W; the
 * inputs of those matmuls and LayerNorms are in the micro-batch's gpt_acts,
 * which must therefore also live until W (not only until B). Both blocks are
 * in the activations category, so a schedule's deferred W's show in its
 * activation peak. */
typedef struct layer_wgrads {
    void *dres3; /* [B,T,C] gradient of the layer's output: fc-proj's dout */
    void *dfch;  /* [B,T,4C] fc's dout (through GELU); with experts the k N slots' [k N, M] */
    void *dln2;  /* [B,T,C] LN2's dout */
    void *dres2; /* [B,T,C] gradient of res2: att-proj's dout */
    void *dqkv;  /* [B,T,3C] qkv's dout */
    void *dln1;  /* [B,T,C] LN1's dout */
    void *moe;   /* with experts: the slots' dys (fc-proj's dout) and the router's d logits
                  * (a moe_scratch, moe.h); empty without */
    layer_acts kept; /* --recompute full: what W reads of the layer (ln1, atty, res2, ln2,
                      * fch_gelu, the LayerNorm statistics; with experts the router's and
                      * dispatch's state), written there by B's recomputation, since the
                      * layer itself keeps only its output */
} layer_wgrads;

typedef struct gpt_wgrads {
    int B, lo, hi;
    layer_wgrads *layer;  /* hi - lo of them */
    void *dlogits, *dlnf; /* last stage: the head's matmul and LN_f douts */
    void *dx;             /* first stage: the gradient of the embedding's output */
    void *block;          /* the one allocation (activations category) */
    long bytes;
} gpt_wgrads;

void gpt_wgrads_alloc(gpt_wgrads *w, const gpt_layout *g, int lo, int hi, int B);
void gpt_wgrads_alloc_part(gpt_wgrads *w, const gpt_layout *g, int lo, int hi, int B, const gpt_part *p);
void gpt_wgrads_free(gpt_wgrads *w);
/* B of the range: gpt_backward without any weight gradient, filling w; returns
 * the gradient of x_in (inside s, valid until the next backward), NULL on the
 * first stage. */
void *gpt_backward_input(const gpt_layout *g, const void *params, gpt_acts *a, gpt_grad_scratch *s,
                         gpt_wgrads *w, const void *dout, float dloss);
/* W of the range: accumulates every weight gradient from a and w. */
void gpt_backward_weight(const gpt_layout *g, void *grads, const gpt_acts *a, const gpt_wgrads *w);
/* ---- one layer, with parallelism plugged in ------------------------------------
 * The layer is written once (model.c): its forward, its input half B and its
 * weight half W; the fused backward runs every op's B then its W. At the
 * points where a parallelism changes the layer it calls a hook:
 *
 *   x -> LN1 -> enter -> column(qkv) -> attention -> row(attn-proj) -> exit -> + x = res2
 *   res2 -> LN2 -> enter -> mlp: column(fc) -> GELU -> row(fc-proj) -> exit -> + res2 = res3
 *
 * enter/exit bound the region where the positions are whole and the widths
 * a rank's share: the residual stream outside may hold only a slice of every
 * sequence's positions (a->seq of T). gpt_default_hooks gives the one-rank
 * operations (plain matmuls, identity regions, common/'s attention and MLP);
 * lab05 keeps its own table (tensor and sequence parallelism) and a later
 * parallelism replaces attention (context) or the MLP (experts). */
typedef enum { GPT_PASS_FUSED, GPT_PASS_INPUT, GPT_PASS_WEIGHT } gpt_pass; /* B and W; B alone; W alone */

typedef struct gpt_layer_hooks gpt_layer_hooks;
/* out[N,OC] = inp[N,IC] W^T + b, W [OC,IC] at this rank's shape */
typedef void (*gpt_linear_fwd)(void *ctx, void *out, const void *inp, const void *w, const void *b, int N, int IC,
                               int OC);
/* the pass's gradients, accumulated: dinp (B), dw and db (W); the others are NULL */
typedef void (*gpt_linear_bwd)(void *ctx, gpt_pass pass, void *dinp, void *dw, void *db, const void *dout,
                               const void *inp, const void *w, int N, int IC, int OC);
/* from -> to, `whole` = B x T x C values on the whole-sequence side; may
 * change `from` (an all-reduce in place) and use s's staging */
typedef void (*gpt_region_fn)(void *ctx, void *from, void *to, long whole, int B, gpt_grad_scratch *s);
struct gpt_layer_hooks {
    /* Each slot has its own state, so that one parallelism's slot can sit beside
     * another's in the same layer (TP's linears and regions with CP's attention,
     * with EP's MLP); each hook gets its slot's context back. */
    void *linear_ctx;           /* column_ and row_forward/backward's */
    void *region_ctx;           /* enter_ and exit_forward/backward's */
    void *attention_ctx;        /* attention_forward/backward's */
    void *mlp_ctx;              /* mlp_forward/backward's (they get h: h->mlp_ctx) */
    const gpt_config *cfg;      /* the model's (the experts' hooks read k, F, a) */
    const tensor_info *tensors; /* a layer block's tensors at this rank's shapes */
    long layer_size;            /* elements of one such block */
    int trace;                  /* trace the compute between the region hooks as events of its own */
    /* 1: on a split residual stream (sequence parallelism) the MLP slot runs on
     * the rank's own positions, no region around it: experts beside TP and SP
     * (lab09), whose all-to-all takes each rank's tokens as they are, as
     * Megatron's MoE layer takes the sequence-parallel shard. No change when
     * the stream is whole. */
    int mlp_on_shard;
    gpt_linear_fwd column_forward, row_forward;
    gpt_linear_bwd column_backward, row_backward;
    gpt_region_fn enter_forward;  /* residual stream [B,seq,C] -> whole [B,T,C] (f; SP: all-gather) */
    gpt_region_fn enter_backward; /* whole gradient [B,T,C] -> [B,seq,C] (f: all-reduce; SP: reduce-scatter) */
    gpt_region_fn exit_forward;   /* whole [B,T,C] -> [B,seq,C] (g: all-reduce; SP: reduce-scatter) */
    gpt_region_fn exit_backward;  /* [B,seq,C] gradient -> whole (g: identity; SP: all-gather) */
    /* the attention core, atty = softmax(q k^T) v over `heads` heads of size HS */
    void (*attention_forward)(void *ctx, void *atty, void *att, const void *qkv, int B, int T, int heads, int HS);
    /* atty: the forward's output (a blockwise backward's D = rowsum(datty * atty)) */
    void (*attention_backward)(void *ctx, void *dqkv, void *datt, const void *datty, const void *qkv,
                               const void *att, const void *atty, int B, int T, int heads, int HS);
    /* the MLP from la->ln2 (whole) to out (before exit); its backward from dout to dinp
     * (before enter), through dfch; lp, gp: the layer's parameter and gradient blocks */
    void (*mlp_forward)(const gpt_layer_hooks *h, const void *lp, const layer_acts *la, void *out, int N);
    void (*mlp_backward)(const gpt_layer_hooks *h, gpt_pass pass, const void *lp, void *gp, const layer_acts *la,
                         const void *dout, void *dfch, void *dinp, gpt_grad_scratch *s, int N);
};
gpt_layer_hooks gpt_default_hooks(const gpt_layout *g);
/* The whole layer (all heads and MLP units, every position): what
 * gpt_acts_alloc allocates. */
gpt_part gpt_whole_part(const gpt_layout *g);
/* gpt_range over a buffer whose layer blocks are h->layer_size long. */
void gpt_range_with(const gpt_layout *g, const gpt_layer_hooks *h, int lo, int hi, long *begin, long *end);
/* The identity region: copies when from and to differ. */
void gpt_region_identity(void *ctx, void *from, void *to, long whole, int B, gpt_grad_scratch *s);

/* gpt_forward, gpt_backward, gpt_backward_input and gpt_backward_weight over a
 * buffer whose layer blocks are h->layer_size long (the embedding and head
 * the model's), every layer through h. gpt_forward(..) is
 * gpt_forward_with(.., &gpt_default_hooks(g), ..). */
void gpt_forward_with(const gpt_layout *g, const gpt_layer_hooks *h, const void *params, gpt_acts *a);
void *gpt_backward_with(const gpt_layout *g, const gpt_layer_hooks *h, const void *params, void *grads,
                        gpt_acts *a, gpt_grad_scratch *s, const void *dout, float dloss, grads_ready_fn ready,
                        void *ready_ctx);
void *gpt_backward_input_with(const gpt_layout *g, const gpt_layer_hooks *h, const void *params, gpt_acts *a,
                              gpt_grad_scratch *s, gpt_wgrads *w, const void *dout, float dloss);
void gpt_backward_weight_with(const gpt_layout *g, const gpt_layer_hooks *h, void *grads, const gpt_acts *a,
                              const gpt_wgrads *w);

/* The mean of a->losses (the block's B*seq positions), read back to the host,
 * plus, with experts, the aux loss of the block's layers (moe_aux_loss). */
double gpt_mean_loss(const gpt_layout *g, const gpt_acts *a);

/* FLOPs of one training step (forward + backward) per token, 6 x parameters as
 * the usual estimate, plus attention's own 12 L T C. */
double gpt_flops_per_token(const gpt_layout *g);

#endif
