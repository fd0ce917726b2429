/* Context parallelism: every layer's sequence split over the N ranks of a CP
 * group. Everything in a layer but attention works position by position
 * (LayerNorms, the linears, GELU, the residual adds), so a rank runs it on its
 * own T/N positions with the whole weights and nothing to exchange. Attention
 * is the one place where a query needs the keys and values of every earlier
 * position, and they live on the other ranks: that is this file, lab07's
 * attention hook in common/model's one layer body (gpt_layer_hooks).
 *
 * Which positions (theory.h th_cp_position): contiguous, rank r holds
 * [r T/N, (r+1) T/N); zig-zag, T cut into 2N chunks, rank r holds chunk r and
 * chunk 2N-1-r, so every rank has as many unmasked causal scores as every
 * other. Global positions drive the causal mask (key visible when its
 * position <= the query's), the position embedding and the targets.
 *
 * --cp-algo ring: rank r's K and V travel round the ring, r -> r+1, one block
 * per step, nonblocking and double-buffered (the next block arrives while this
 * one is computed). Each step's block attention gives an output and a
 * log-sum-exp per query row; attention_merge folds it into the running one
 * (the online softmax). Saved for the backward: q, the local k and v (the
 * layer's qkv), the output (atty) and the log-sum-exp (where a one-rank layer
 * keeps its T x T attention matrix). The backward runs the ring again: K and V
 * travel as in the forward, and dK and dV travel behind them, each rank adding
 * its share, N steps, so they arrive home complete.
 *
 * --cp-algo allgather: K and V all-gathered before attention (every rank holds
 * the whole sequence's, N x the memory of one block), the same blocks merged in
 * the ring's order; backward: all-gathered again, dK and dV of every block
 * reduce-scattered to their owners.
 *
 * --cp-algo ulysses (DeepSpeed-Ulysses; Megatron's `a2a`): an all-to-all
 * turns this rank's positions of every head into every position of heads/N
 * heads, attention runs as one rank's would on those heads (one block, the
 * causal mask by the gathered global positions), and a second all-to-all turns
 * the output back. Backward: dO to the head split, dQ, dK, dV back. The layer's
 * att slot keeps the head-split q|k|v and output beside the log-sum-exp, so
 * the backward needs no all-to-all of them again (cp_att_row). */
#ifndef LAB07_CP_H
#define LAB07_CP_H
#include "comm.h"
#include "model.h"
#include "theory.h"

typedef struct cp_hooks {
    gpt_layer_hooks hooks;  /* attention_ctx: this struct */
    comm *cp;               /* the CP group; its ranks in ring order */
    th_cp_algo algo;
    int N, rank, B, T;      /* T: this rank's positions per sequence, seq / N */
    int *pos_host, *pos_dev; /* N x T: every rank's global positions (host and device) */
    void *kv[2], *dkv[2];   /* ring: [B,T,2C] blocks (k|v per row), double-buffered */
    void *kv_all, *dkv_all; /* allgather: N of those blocks */
    void *a2a_send, *a2a_recv; /* ulysses: the all-to-all's staging, [B,T,3C] */
    void *out2;             /* one block's output [B,T,C] before the merge */
    float *lse2;            /* and its log-sum-exp [B,heads,T] */
    long scores;            /* unmasked causal scores of the last forward, per sequence and head */
    int cp_width;           /* C: the width of a K (or V) row */
    double attention_cpu_seconds; /* this thread's CPU time in the attention kernels so far */
} cp_hooks;

/* B rows of `seq` positions over cp's ranks; the buffers at C = d_model. */
void cp_hooks_init(cp_hooks *h, const gpt_layout *g, comm *cp, th_cp_algo algo, th_cp_layout layout, int B);
void cp_hooks_free(cp_hooks *h);
/* The layer's att slot per query row and head (gpt_part.att_row). */
int cp_att_row(th_cp_algo algo, int head_size);
/* The ring's block attention (with its merge), a trace event of its own: the
 * compute that hides one K/V message. */
#define CP_BLOCK_OP "cp_block_fwd"
#define CP_BLOCK_BWD_OP "cp_block_bwd" /* and its backward: the per-rank attention time */
/* The median seconds of one K/V block's ring exchange (send to the next rank,
 * receive from the previous), `reps` times after a warm-up, every rank of the
 * CP group at once: the run's measured point-to-point time for its message
 * size. 0 unless the ring with N > 1. Collective over the CP group. */
double cp_ring_message_seconds(cp_hooks *h, int reps);
/* This rank's global positions: T of them. */
const int *cp_positions(const cp_hooks *h);

#endif
