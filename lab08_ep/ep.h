/* Expert parallelism: the E experts of every MoE layer spread over the N ranks
 * of an EP group, E/N each (rank q holds experts [q E/N, (q+1) E/N)). Every
 * other piece of the layer (attention, LayerNorms, the router) works token by
 * token on the rank's own tokens with replicated weights. The experts are the
 * one place where a token needs weights another rank holds, so the token goes
 * there: this file, lab08's MLP hook in common/model's one layer body
 * (gpt_layer_hooks.mlp_forward / mlp_backward).
 *
 * Forward of one layer (moe.h's pieces around two all-to-alls):
 *   route     moe_route on the rank's tokens: top-k, capacity per sequence,
 *             slots sorted by expert then position (exactly the one-rank run's
 *             decisions: they depend on each sequence only)
 *   counts    alltoall of the slots per expert: each rank learns how many rows
 *             every other rank sends to each of its experts
 *   dispatch  alltoallv of the slots' rows (ln2), rank p getting the rows of
 *             its experts; received rows reordered expert-major, and within an
 *             expert by source rank, which is global token order (the EP
 *             group's ranks hold consecutive rows of the batch), so an expert
 *             sums its tokens in the one-rank run's order
 *   experts   moe_experts_forward on the local experts
 *   return    the outputs back by the reverse alltoallv, into the slot order
 *   combine   moe_combine: the gates times the outputs, in choice order
 * The backward mirrors it: the slots' output gradients travel out like the
 * rows, the experts' backward runs (accumulating the local experts' weight
 * gradients), the input gradients travel back, the router's backward runs
 * locally. Four all-to-alls of rows per layer and step, two of counts. */
#ifndef LAB08_EP_H
#define LAB08_EP_H
#include "comm.h"
#include "model.h"
#include "moe.h"

/* What one layer's forward keeps for its backward on this rank, for one block
 * of activations (lab08 has one; a pipeline stage one per micro-batch in
 * flight). The layer body hands the hook copies of its layer_acts, so the key
 * is the layer and where its routing state lives (la->moe): the block's, or
 * under --recompute full the layer scratch's, where the backward reruns the
 * forward (and its exchanges) before it needs them. */
typedef struct ep_layer {
    const void *owner;            /* la->moe (NULL: not claimed) */
    int layer;                    /* la->layer */
    long rows_cap;                /* rows the four buffers hold (grown when a step needs more) */
    void *xr, *fch, *gelu, *yr;   /* the received slots expert-major: [rows,C], [rows,M], [rows,M], [rows,C] (M: gpt_mlp_width) */
    int *recv;                    /* [N][E/N]: slots from EP rank src for local expert j */
    int *count, *first;           /* [E/N]: slots per local expert, and where they start */
} ep_layer;

/* Summed over the steps (main resets max_expert_rows each step). */
typedef struct ep_counts {
    double rows_sent, rows_kept;  /* token rows that left the rank, and rows it sent itself */
    double count_bytes_sent, count_bytes_kept; /* the count exchanges' bytes: to other ranks, to itself */
    double alltoall_seconds, expert_seconds;   /* wall time in the exchanges and in the experts' matmuls */
    long max_expert_rows;         /* the most slots one local expert ran in one layer's forward */
    /* --route-groups G dividing the EP ranks (a group: a node of N/G ranks): rows the all-to-alls
     * sent to ranks of another group (measured), and from the routing, out and back, the rank's
     * tokens' choices in other groups and the other groups each token reached (a row once per
     * group: DeepSeek-V3's send) */
    double rows_cross, routed_cross, routed_cross_once;
} ep_counts;

typedef struct ep_hooks {
    gpt_layer_hooks hooks;        /* mlp_ctx: this struct; tensors: the local layer block below */
    tensor_info tensors[LAYER_NTENSORS];
    long layer_size;              /* elements of the local layer block */
    comm *ep;                     /* the EP group */
    int N, rank, local_experts, layers;
    ep_layer *layer;              /* one per layer and block, claimed by its first forward */
    int n_layer, layer_cap;       /* claimed, allocated */
    void *stage;                  /* rows in source-rank order, sent or received; grown */
    void *dyr, *dfch, *dgelu;     /* the backward's expert-major scratch; grown */
    long stage_cap, scratch_cap;
    long reserve_rows;            /* > 0: every layer's buffers hold this many rows from the first
                                   * step on (the capacity's bound, ep_received_rows_bound) */
    ep_counts counts;             /* what the all-to-alls moved, from the routing, and the times */
    const moe_split *split;       /* lab09 with CP: the sequences' other positions (moe_route); NULL */
} ep_hooks;

/* The local layout of a layer block: every tensor of g's, the four expert
 * tensors cut to this rank's E/N experts (each a contiguous run of the global
 * tensor). */
void ep_layout(const gpt_layout *g, int N, int rank, tensor_info *tensors, long *layer_size);
/* The runs of the model's flat layout this rank holds, in order: local offset,
 * global offset, length, and whether it is expert weights (summed over the EDP
 * group) or replicated (summed over all ranks). Returns how many; runs may be
 * NULL to count them. */
typedef struct ep_run { long local, global, n; int expert; } ep_run;
int ep_runs(const gpt_layout *g, const tensor_info *tensors, long layer_size, int N, int rank, ep_run *runs);

/* EP rank p's group under --route-groups G when G divides the N ranks (its
 * experts' group: G groups of E/G consecutive experts); -1 otherwise (a
 * rank's experts then span groups: no traffic between groups to count). */
int ep_rank_group(const gpt_config *cfg, int N, int p);
/* The most slot rows one rank can receive per layer when `rows` sequences of
 * each of the N EP ranks are routed, T = cfg->seq positions of each (of
 * `whole`: T, or under CP the sequence's, the capacity being over it): per
 * sequence, min(E/N x min(capacity, T), k T) slots go to one rank's experts (a
 * token picks an expert at most once).
 * With a capacity factor (F > 0) the buffers are sized to it, so the
 * activations do not depend on the routing; 0 under F = 0 (they grow). */
long ep_received_rows_bound(const gpt_config *cfg, int N, long rows, int whole);

void ep_hooks_init(ep_hooks *h, const gpt_layout *g, comm *ep);
/* The most rows layer l's buffers hold, over the blocks (the activations' formula under F = 0). */
long ep_layer_rows_cap(const ep_hooks *h, int layer);
void ep_hooks_free(ep_hooks *h);

#endif
