/* Mixture of experts: the MLP of every layer becomes E experts (each an MLP of
 * M hidden units: fc [M,C] -> GELU -> fc-proj [C,M], M the dense MLP's 4C or
 * --expert-width's, gpt_mlp_width) and a router W_r [E,C] that sends each
 * token to k of them (--experts E, --top-k k).
 *
 * Router (fp32 in both precisions): p = softmax(ln2 W_r^T) over the E experts;
 * the k largest, ties to the lower expert index, in descending order; gates
 * g_j = p_j / (p_1 + .. + p_k). With k = 1 that renormalised gate would be 1
 * whatever p is, and the router would get no gradient from the loss: top-1
 * uses the probability itself as the gate (Switch Transformer's choice), so
 * the output y = p_e E_e(x) still moves p.
 *
 * Capacity (--capacity-factor F > 0): each expert takes at most
 * ceil(k T F / E) tokens of each sequence, taken in position order (a token's
 * choices in their order); the rest are dropped: a dropped choice adds
 * nothing, the residual carries the token. Per sequence, so which choices
 * drop never depends on how the batch is split over ranks.
 *
 * Slots: the kept (token, choice) pairs, sorted by expert, then by token (its
 * position in the block), so every sum has one order whatever the layout.
 *
 * Aux loss (Switch, eq. 4, per sequence): E sum_e f_e P_e, f_e the share of
 * the sequence's k T choices that picked e (before dropping), P_e the mean of
 * p_e over the sequence; 1 under uniform routing. The training loss adds
 * a / L times its sum over the L layers, averaged over sequences (so a
 * uniform router adds exactly a, --aux-loss-coef). f is a count, so only P
 * carries a gradient: d/dp_{t,e} = a E f_e / (L T B_global).
 *
 * DeepSeek-V3's routing (--router sigmoid, --balance bias):
 * - sigmoid: scores s = sigmoid(ln2 W_r^T), each in (0,1) on its own (an
 *   expert's score does not fall because another's rises); top-k on s, gates
 *   g_j = s_j / (s_1 + .. + s_k), top-1 s itself (as above); probs holds s.
 *   The aux loss's P uses s / sum_e s (V3's sequence-wise loss), so a uniform
 *   router still adds exactly a.
 * - bias: a per-layer, per-expert b_e added to the scores for the top-k choice
 *   only (the gates stay the scores'). No gradient reaches it (the choice is a
 *   step function of it); after each optimizer step the run moves it by
 *   gamma sign(mean load - load_e) on the load summed over every rank
 *   (run_experts_report), so it is the same on every rank and layout, and
 *   the loss has no aux term (a = 0). The top-k margin is then the biased
 *   scores'.
 * - node-limited routing (--route-groups G, --route-max-groups M): the E
 *   experts in G groups of E/G consecutive ones (a group stands for a node of
 *   EP ranks); each group is scored by the sum of its two best selection
 *   scores (its best alone when it holds one), a token keeps its M best
 *   groups (the lower index on ties) and top-k chooses among their experts
 *   only, so its tokens reach at most M nodes. The gates are unchanged (the
 *   chosen scores', normalised): the groups decide which, not how much.
 * - shared experts (--shared-experts S, DeepSeek-MoE): S experts of width M
 *   that every token runs at gate 1, outside the routing (no choice, no
 *   capacity, no aux loss, no bias): y = shared(x) + sum_j g_j E_j(x). They
 *   are one MLP of S M units in their own tensors, run on the N positions by
 *   the experts' own forward and backward (moe_shared_*). */
#ifndef PL_MOE_H
#define PL_MOE_H
#include "comm.h"
#include "model.h"

/* What the forward keeps of one layer (inside layer_acts.moe), N positions. */
typedef struct moe_state {
    float *probs;   /* [N,E] the router's softmax (sigmoid: its scores) */
    int *choice;    /* [N,k] chosen experts, descending p (+ bias) */
    float *gate;    /* [N,k] their gates */
    int *slot;      /* [N,k] slot of each choice, -1 dropped */
    int *count;     /* [E] kept slots per expert */
    int *first;     /* [E] first slot of each expert */
    float *freq;    /* [B,E] f of each sequence */
    float *stats;   /* layer_acts.moe_stats, kept in every --recompute mode: [0] the sum over
                     * the block's sequences of E sum_e f P; [1] dropped choices; [2] slots;
                     * [3] the top-k margin (below); [4 + e] choices of expert e (before dropping);
                     * [4 + E] the most groups one token reached, [5 + E] their sum over the
                     * tokens (node-limited routing; 0 without) */
    void *xs, *ys;  /* [kN,C] the slots' inputs (ln2 rows) and the experts' outputs */
    /* --shared-experts S: their MLP on the N positions (S M units), NULL without */
    void *shared_fch, *shared_gelu; /* [N, S M] */
    void *shared_ys;                /* [N, C], added by moe_combine at gate 1 */
} moe_state;

/* The backward's buffers (inside gpt_grad_scratch.moe). A backward split in
 * B and W keeps one per layer and micro-batch instead (layer_wgrads.moe,
 * reached as layer_acts.moe_kept): B writes dys and dp there, W reads them
 * for the experts' fc-proj and the router's weight gradients. */
typedef struct moe_scratch {
    void *dys;    /* [kN,C] gradient of each slot's expert output */
    float *dgate; /* [N,k] */
    float *dp;    /* [N,E] the router's d probabilities, then its d logits */
    /* --shared-experts: the MLP's dout [N,C] (B's, kept for W), fc's dout [N, S M],
     * the dGELU room [N, max(S M, C)] that then holds the positions' gradients */
    void *shared_dout, *shared_dfch, *shared_dgelu;
} moe_scratch;

long moe_state_bytes(const gpt_config *cfg, long N);   /* 0 without experts */
long moe_scratch_bytes(const gpt_config *cfg, long N); /* 0 without experts */
moe_state moe_state_view(void *raw, const gpt_config *cfg, long N);
moe_scratch moe_scratch_view(void *raw, const gpt_config *cfg, long N);

/* ceil(k n F / E) slots per expert over n tokens (a sequence: n = T; with
 * --capacity-scope rank a rank's N positions), at most n: a token picks an
 * expert once, so n slots never drop anything, and a huge F means no limit
 * instead of overflowing an int. 0 with F = 0 (no limit). k n F / E within
 * 1e-9 (relative) of an integer counts as that integer: F is the decimal of
 * the flag, and 2 x 50 x 1.1 / 10 is 11 slots, not the 12 that the double
 * 11.000000000000002 would round up to. theory/'s th_expert_capacity is the
 * same rule (test_theory holds them equal). */
long moe_capacity_over(const gpt_config *cfg, long tokens);
/* per sequence: moe_capacity_over(cfg, cfg->seq) */
long moe_capacity(const gpt_config *cfg);

/* Context parallelism (lab09): every sequence of `whole` positions split
 * over the ranks of `group`, each holding cfg->seq of them (positions: the
 * group's size x cfg->seq global positions, rank by rank). The capacity and
 * the aux loss are per whole sequence, so moe_route gathers the group's
 * choices and P shares (an fp32 and an int32 all-gather a layer) and decides
 * as the one-rank run does; NULL: this rank holds whole sequences. */
typedef struct moe_split {
    comm *group;
    int whole;
    const int *positions;
} moe_split;

/* The MLP hooks of a model with experts (gpt_default_hooks installs them). */
void moe_mlp_forward(const gpt_layer_hooks *h, const void *lp, const layer_acts *la, void *out, int N);
void moe_mlp_backward(const gpt_layer_hooks *h, gpt_pass pass, const void *lp, void *gp, const layer_acts *la,
                      const void *dout, void *dfch, void *dinp, gpt_grad_scratch *s, int N);

/* The pieces of the hooks, for a lab that moves the slots between ranks:
 * route: the router, top-k, capacity and slots of N positions from ln2 into st
 * (and xs gathered; bias: the layer's, moe_layer_bias, or NULL; split: the
 * CP group's, or NULL); experts: experts [e0, e0 + n) of a layer block's tensors
 * h->tensors on their slots (first[] relative to xs, ys, fch, gelu);
 * combine: out = sum of gates x ys in choice order. */
void moe_route(const gpt_config *cfg, const tensor_info *tensors, const void *lp, const void *ln2, const float *bias,
               const moe_split *split, moe_state *st, int N);
/* The E routing biases of a layer (cfg->route_bias's row), NULL without them */
const float *moe_layer_bias(const gpt_config *cfg, int layer);
void moe_experts_forward(const tensor_info *tensors, const void *lp, int e0, int n, const int *count,
                         const int *first, const void *xs, void *fch, void *gelu, void *ys);
/* dys -> dxs (written into dgelu's room after use), accumulating the experts'
 * gradients. pass: GPT_PASS_INPUT (gp NULL) writes dfch (fc's dout) and dxs
 * only; GPT_PASS_WEIGHT (lp, dgelu, dxs unused) reads dys, gelu, dfch and xs
 * for the gradients alone, each the same sum as the fused pass's */
void moe_experts_backward(gpt_pass pass, const tensor_info *tensors, const void *lp, void *gp, int e0, int n,
                          const int *count, const int *first, const void *xs, const void *fch, const void *gelu,
                          const void *dys, void *dfch, void *dgelu, void **dxs);

/* The shared experts (--shared-experts; nothing without): forward on the N
 * positions' ln2 into st->shared_*, and its backward (dout: the MLP's output
 * gradient, gate 1), whose input gradient is added to dinp (after the router's
 * backward wrote it); W reads B's dout from sc. Every rank runs them on its
 * own positions: in lab08 they are replicated, not spread over the EP ranks. */
void moe_shared_forward(const tensor_info *tensors, const void *lp, const void *ln2, moe_state *st, int N);
void moe_shared_backward(gpt_pass pass, const tensor_info *tensors, const void *lp, void *gp, const void *ln2,
                         const moe_state *st, const moe_scratch *sc, const void *dout, void *dinp, int N);

/* combine: out[n] = (the shared experts' output +) the sum over n's kept choices, in choice order, of gate x ys[slot]
 * (ys: the slots' expert outputs, in st's slot order) */
void moe_combine(const moe_state *st, int k, int C, const void *ys, void *out, int N);
/* its backward: dys[slot] = gate x dout[n], and sc->dgate (the gates' gradients) */
void moe_combine_backward(const moe_state *st, moe_scratch *sc, int k, int C, const void *ys, const void *dout,
                          void *dys, int N);
/* the rest of the backward, from dxs (the slots' input gradients, st's slot
 * order): through the gates and the aux loss (weight dloss of a position) to
 * the router's softmax (its d logits into sc->dp); dinp = the slots' gradients
 * in choice order + the router's; the router's weight gradient accumulated
 * into gp. GPT_PASS_INPUT: all but the weight gradient; GPT_PASS_WEIGHT: the
 * weight gradient alone, from B's sc->dp and ln2 */
void moe_router_backward(const gpt_layer_hooks *h, gpt_pass pass, const void *lp, void *gp, const void *ln2,
                         const moe_state *st, const moe_scratch *sc, const void *dxs, void *dinp, float dloss, int N);

/* The aux loss of a block's layers: a / L x sum over them of the per-layer
 * sums, / B (its sequences); 0 without experts. And the dropped choices. */
double moe_aux_loss(const gpt_layout *g, const gpt_acts *a);
long moe_dropped(const gpt_layout *g, const gpt_acts *a);
/* The top-k margin of a block's layers: the smallest, over their tokens, of
 * p_(k) - p_(k+1), the token's k-th largest router probability less the
 * (k+1)-th (stats[3], computed by moe_route). Top-k is a discontinuous
 * function of the probabilities: a change of the logits smaller than this gap
 * (another summation order in another layout, rounding) cannot change a
 * choice, a larger one can. It is read, never used: no computation depends on
 * it. -1 when k = E (every expert chosen: no (k+1)-th) or without experts.
 * Node-limited routing adds a second discontinuity, which groups are kept:
 * the margin is then the smaller of the experts' gap (within the kept groups)
 * and the M-th kept group's score less the best group left out. */
float moe_min_margin(const gpt_layout *g, const gpt_acts *a);
/* Node-limited routing: over a block's layers, the most groups one token's
 * experts came from (at most route_max_groups) and the sum over the layers'
 * tokens of the groups each reached; 0 and 0 without groups. */
void moe_groups_reached(const gpt_layout *g, const gpt_acts *a, double *most, double *sum);
/* Choices per expert (before dropping) of the block's layers: counts[l E + e]
 * for its layer lo + l. */
void moe_expert_choices(const gpt_layout *g, const gpt_acts *a, double *counts);

#endif
