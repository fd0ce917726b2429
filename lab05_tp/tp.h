/* Megatron-style tensor parallelism: every layer's matrices split over the t
 * ranks of a TP group, so each rank holds 1/t of every block's weights and does
 * 1/t of its matrix work.
 *
 *   column-parallel linear  Y_r = X W_r^T      W split by OUTPUT rows: rank r gets
 *                                              its own columns of Y, nothing to sum
 *   row-parallel linear     Y = sum_r X_r W_r^T W split by INPUT columns: rank r holds
 *                                              a partial Y of full width; the sum
 *                                              over ranks (all-reduce) is Y
 *
 * A sublayer is one column-parallel linear followed by one row-parallel linear,
 * with only per-column work between them (attention of whole heads, GELU), so
 * the split columns never need to be put back together:
 *
 *   attention: x -> LN1 -> f -> QKV (column: this rank's heads' q, k, v rows)
 *                 -> attention over H/t heads -> out-proj (row) -> g -> + bias + x
 *   MLP:       x -> LN2 -> f -> fc (column: 4C/t units) -> GELU
 *                 -> fc-proj (row) -> g -> + bias + x
 *
 *   f: identity forward, all-reduce of the input gradient backward (each rank's
 *      column shard contributes a partial dX; the full dX is their sum)
 *   g: all-reduce of the partial outputs forward, identity backward (the output
 *      gradient is already full width and identical on every rank)
 *
 * Two all-reduces per layer forward (the g's), two backward (the f's), each of
 * the B*T*C activation. Everything outside the blocks' matrices is replicated
 * (embedding, LayerNorms, the row-parallel biases, the head): every rank computes
 * the same full-width values from identical inputs, so their gradients come out
 * identical on every rank without any communication.
 *
 * The local parameter buffer has the shape of the full model's, with the layer
 * blocks shrunk to their shards:
 *
 *   [ embedding ][ local layer 0 ] ... [ local layer L-1 ][ head ]
 *
 * so a pipeline stage of a 3D grid is again a contiguous range (tp_range).
 * Gradients and AdamW moments use the same layout. Parameters, gradients and
 * activations are the model's values (precision.h: void *, fp32 or bf16), and
 * so are the all-reduces of f and g: bf16 activations on the wire in bf16.
 *
 * --sequence-parallel splits what TP leaves whole along the sequence:
 * sequence_parallel.h. --recompute works here as in common/model (it is
 * common/model's layer), and a recomputed forward runs its collectives again. */
#ifndef LAB05_TP_H
#define LAB05_TP_H
#include "checkpoint.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "run.h"

typedef struct tp_layout {
    gpt_layout g;          /* the full model this is a shard of */
    int degree, rank;      /* t, and this rank's place in the TP group */
    int heads;             /* H/t attention heads computed here */
    int width;             /* C/t: this rank's columns of q, k, v and of the attention output */
    int hidden;            /* 4C/t: this rank's MLP units */
    tensor_info layer[LAYER_NTENSORS]; /* shard shapes, offsets inside the local block */
    int sharded[LAYER_NTENSORS];       /* 1: split over the group; 0: replicated */
    long layer_size;       /* elements of one local layer block */
    long total;            /* elements of the local buffer: embedding + L local blocks + head */
    int seq_parts;         /* sequence parallelism: the residual stream in t slices of the
                            * sequence (tp_layout_sequence_parallel); 1: whole (TP alone, or t = 1) */
} tp_layout;

/* The rule for splitting: t must divide the heads (whole heads per rank), the
 * MLP width 4C and C. Records a run_check error naming the flag; `degree_flag`
 * says where t came from ("-n" for lab05, "--tp" for lab06). */
void tp_check_degree(run_ctx *ctx, int t, const char *degree_flag);

void tp_layout_init(tp_layout *tl, const gpt_config *cfg, int degree, int rank);
/* Turn sequence parallelism on (after tp_layout_init): the T/t positions of
 * every sequence this rank holds outside the TP regions. At t = 1 it changes
 * nothing. The sequence must divide by t (tp_check_sequence_parallel). */
void tp_layout_sequence_parallel(tp_layout *tl, int on);
/* The rule for --sequence-parallel: --seq divisible by the degree. */
void tp_check_sequence_parallel(run_ctx *ctx, int t, const char *degree_flag);
/* The part of every layer this rank computes, for common/model's allocators. */
gpt_part tp_part(const tp_layout *tl);
long tp_layer_offset(const tp_layout *tl, int layer); /* layer == L gives the head's */
long tp_head_offset(const tp_layout *tl);
/* Local range of layers [lo, hi), with the embedding when lo == 0 and the head
 * when hi == L (what a pipeline stage owns), like gpt_range. */
void tp_range(const tp_layout *tl, int lo, int hi, long *begin, long *end);
/* Where element `local_index` of this rank's shard of layer tensor `which` sits
 * in the full tensor (row-major index): what ties a shard to the serial model. */
long tp_global_index(const tp_layout *tl, int which, long local_index);

/* For checkpoints: which elements of the full model the local buffer of layers
 * [lo, hi) (as tp_range; element 0 is its begin) holds, params and moments
 * alike. Replicated tensors are whole; a shard is a run per contiguous piece
 * (a block of rows of a column-parallel matrix, a row's slice of a
 * row-parallel one), from tp_global_index. */
void tp_checkpoint_hold(const tp_layout *tl, int lo, int hi, ckpt_view *v);

/* Element counts for the lesson's memory figures (whole model, per rank). */
long tp_replicated_elems(const tp_layout *tl); /* embedding + head + 6C per layer */
long tp_sharded_elems(const tp_layout *tl);    /* this rank's shard of the layer matrices (1/t) */

/* This rank's initial values for layers [lo, hi) (+ embedding/head as tp_range):
 * every element is gpt_init_value of its global index, so the shards of all
 * ranks put together are bit for bit the serial model's initial weights.
 * dst holds the tp_range(lo, hi) elements. */
void tp_init_params(const tp_layout *tl, uint64_t seed, int lo, int hi, float *dst);

/* Activations of layers [lo, hi) for B rows with this rank's widths (qkv 3C/t,
 * attention H/t heads, MLP 4C/t; the residual stream stays full width), in the
 * gpt_acts shape, so gpt_embed_* and gpt_head_* run on it unchanged. Free with
 * gpt_acts_free. */
void tp_acts_alloc(gpt_acts *a, const tp_layout *tl, int lo, int hi, int B);
/* Backward scratch with the same local widths; free with gpt_scratch_free. */
void tp_scratch_alloc(gpt_grad_scratch *s, const tp_layout *tl, int B);

/* ---- the layer: common/model's one body, with this table ------------------------------
 * The Megatron layer is common/model's layer with these hooks (hook -> what it does):
 *   column_forward / _backward   the local GEMM at this rank's output columns (default)
 *   row_forward                  the local GEMM, the bias added by TP rank 0 only
 *   row_backward                 the local GEMM backward (default; the bias gradient on every rank)
 *   enter_forward  (f)           identity            SP: all-gather along the sequence
 *   enter_backward (f)           all-reduce          SP: reduce-scatter
 *   exit_forward   (g)           all-reduce          SP: reduce-scatter
 *   exit_backward  (g)           identity            SP: all-gather
 *   attention, MLP               the defaults over H/t heads and 4C/t units
 * Two all-reduces per layer forward (the g's), two backward (the f's), each of
 * the B*T*C activation. Run the model with gpt_forward_with, gpt_backward_with,
 * gpt_backward_input_with and gpt_backward_weight_with (&th.hooks) on the local
 * buffer (params[0] is local element tp_range(lo, hi).begin); the split
 * backward's input half holds every collective, its weight half none; its w
 * at this rank's widths: tp_wgrads_alloc. The layer's compute between the
 * collectives is traced as compute events of its own, so do not wrap these
 * calls in a compute event if the compute/comm split should stay honest. */
typedef struct tp_hooks {
    gpt_layer_hooks hooks; /* linear_ctx, region_ctx: this struct */
    const tp_layout *tl;
    comm *tp;
} tp_hooks;
/* tl and tp are kept by pointer: they outlive th. */
void tp_hooks_init(tp_hooks *th, const tp_layout *tl, comm *tp);
void tp_wgrads_alloc(gpt_wgrads *w, const tp_layout *tl, int lo, int hi, int B);

/* ---- optimizer and clipping --------------------------------------------------------- */
/* Squares of the range's gradients, split in two: the sharded matrices' (sum
 * them over the TP group: each rank holds different elements) and the
 * replicated tensors' (identical on every rank: count them ONCE, do not sum
 * over the group). The global norm^2 is  sum_over_group(sharded) + replicated.
 * Summed on the device in norm's first two parts, then one copy to the host. */
void tp_grad_squares(const tp_layout *tl, grad_norm *norm, int lo, int hi, const void *grads,
                     double *sharded, double *replicated);
/* AdamW over the range, weight decay on matrices only (as adamw_step), each
 * tensor in its shard shape. Buffers as in tp_forward; params, m and v fp32
 * (params: the master weights in a bf16 run), grads the model's values. */
void tp_adamw_step(const tp_layout *tl, const adamw_config *cfg, int lo, int hi, float *params,
                   const void *grads, float *m, float *v, int t, float grad_scale);

/* The same two over a window [from, to) of the range's local elements (ZeRO-1
 * in lab06: the slice of the buffer whose optimizer state this rank keeps),
 * each tensor cut at the window's ends. grads is the range's buffer (element 0
 * is the range's begin); params, m and v hold the window alone (element 0 is
 * `from`). The whole range, [0, end - begin), is the two above. */
void tp_grad_squares_window(const tp_layout *tl, grad_norm *norm, int lo, int hi, const void *grads, long from,
                            long to, double *sharded, double *replicated);
void tp_adamw_step_window(const tp_layout *tl, const adamw_config *cfg, int lo, int hi, long from, long to,
                          float *params, const void *grads, float *m, float *v, int t, float grad_scale);

#endif
