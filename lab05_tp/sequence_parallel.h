/* Sequence parallelism (Korthikanti et al. 2022): tensor parallelism with the
 * regions it leaves whole split along the sequence.
 *
 * TP splits the matrices, and what lies between them (the LayerNorms, the
 * residual adds, the embedding and the loss) is computed whole, the same, on
 * every rank of the group: there the activations are not split at all. SP
 * splits them: outside the tensor-parallel regions each of the t ranks holds
 * T/t positions of every sequence, so those activations and that work are 1/t
 * per rank. TP's f and g become
 *
 *   before a column-parallel linear   all-gather along the sequence: the t
 *                                     slices [B,T/t,C] into the whole [B,T,C]
 *                                     (backward: reduce-scatter of its gradient)
 *   after a row-parallel linear       reduce-scatter along the sequence: the t
 *                                     partial [B,T,C] sums into this rank's
 *                                     slice (backward: all-gather of its gradient)
 *
 * so a layer moves 2 all-gathers and 2 reduce-scatters each way where TP moves
 * 2 all-reduces, and a ring all-reduce IS a reduce-scatter then an all-gather:
 * the bytes per step are TP's, to the byte.
 *
 *   x_r -> LN1 -> all-gather -> QKV (column) -> attention -> out-proj (row)
 *       -> reduce-scatter -> + bias + x_r -> LN2 -> all-gather -> fc (column)
 *       -> GELU -> fc-proj (row) -> reduce-scatter -> + bias + res2_r
 *
 * The layout. Activations are [B,T,C] row-major, so "T/t positions of every
 * sequence" is B runs of T/t x C floats, not one contiguous piece, while
 * comm_allgather and comm_reduce_scatter work on equal contiguous chunks, rank
 * after rank. A rank keeps its slice as [B,T/t,C] (contiguous: exactly one
 * chunk), and the whole-sequence side of each collective goes through
 * scratch->seq_packed, the same rows in rank-major order [t][B][T/t][C], whose
 * chunk r is rank r's slice: packing and unpacking are t x B copies of
 * T/t x C floats. (Megatron's activations are [T,B,C], sequence first, where
 * a slice of the sequence is contiguous and nothing is packed. Splitting
 * lab05's B x T token axis into t contiguous chunks would need no packing
 * either, but it is not T/t positions of every sequence unless B = 1.)
 *
 * Kept for the backward: the all-gathered LayerNorm outputs ln1, ln2 [B,T,C]
 * (the inputs of the column-parallel matmuls, whose weight gradients read them
 * whole), so the backward gathers nothing twice and the bytes stay TP's.
 * Megatron keeps only the slice and all-gathers it again in the backward (one
 * all-gather more per column-parallel linear, overlapped with the input
 * gradient's GEMM), which is why its Table 2 divides those two by t too.
 *
 * What becomes partial. Everything computed on T/t positions gives its weights
 * a gradient from those positions only: LN1, LN2, and, since each rank embeds
 * its own positions (its tokens, its rows of wpe) and computes the loss of its
 * own positions (final LayerNorm, logits 1/t, no collective at either end),
 * the embedding and the head. After the backward these replicated tensors'
 * gradients are summed over the TP group: sp_sum_partial_grads, one
 * all-reduce. The row-parallel biases are not partial: rank 0 adds them
 * before the reduce-scatter, as in TP, and their gradient comes from the
 * all-gathered output gradient, the same on every rank. (Megatron adds them
 * after the reduce-scatter, on the slice, and sums them too.) */
#ifndef LAB05_SEQUENCE_PARALLEL_H
#define LAB05_SEQUENCE_PARALLEL_H
#include "tp.h"

/* whole [B,T,C] <- every rank's slice [B,T/t,C]; staged through s->seq_packed */
void sp_allgather(const tp_layout *tl, comm *tp, const void *slice, void *whole, gpt_grad_scratch *s, int B);
/* this rank's slice [B,T/t,C] <- the sum over the ranks of their whole [B,T,C] */
void sp_reduce_scatter(const tp_layout *tl, comm *tp, const void *whole, void *slice, gpt_grad_scratch *s, int B);

/* The region hooks of tp_hooks under sequence parallelism: f and g as the
 * all-gathers and reduce-scatters above. The rest of the layer is TP's, with
 * x, res2, res3, the LayerNorm statistics and the residual gradient s->dres on
 * this rank's slice (common/model's layer does that when a->seq < T). */
void sp_hooks(gpt_layer_hooks *h);

/* The elements of layers [lo, hi) (+ embedding, head as tp_range) whose
 * gradients are partial (theory.h's th_sp_partial_params), and their sum over
 * the TP group: packed into `staging` (that many values, communication
 * category), one all-reduce, unpacked. grads as tp_range(lo, hi). */
long sp_partial_elems(const tp_layout *tl, int lo, int hi);
void sp_sum_partial_grads(const tp_layout *tl, comm *tp, int lo, int hi, void *grads, void *staging);

#endif
