/* Mixture of experts on one rank (moe.h): the router, top-k, capacity, the
 * experts on their slots, the combine, and their backward. The router and
 * the dispatch are plain host loops in fp32 (small: N x E x C), the experts
 * the run's matmul kernels. */
#include "moe.h"
#include "kernels.h"
#include "device.h"
#include "mem.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static long align64(long n) { return (n + 63) / 64 * 64; }

/* one value of a buffer of values, as float, and back */
static float value_get(const void *b, long i) {
    return g_precision == PREC_BF16 ? float_from_bf16(((const uint16_t *)b)[i]) : ((const float *)b)[i];
}
static void value_set(void *b, long i, float x) {
    if (g_precision == PREC_BF16) ((uint16_t *)b)[i] = bf16_from_float(x);
    else ((float *)b)[i] = x;
}

static long state_layout(moe_state *st, char *raw, const gpt_config *c, long N) {
    if (c->experts <= 0) return 0;
    long E = c->experts, k = c->top_k, C = c->d_model, B = N / c->seq, used = 0;
#define TAKE(field, type, n, size) st->field = (type)(raw ? raw + used : NULL), used += align64((long)(size) * (n))
    TAKE(probs, float *, N * E, 4);
    TAKE(choice, int *, N * k, 4);
    TAKE(gate, float *, N * k, 4);
    TAKE(slot, int *, N * k, 4);
    TAKE(count, int *, E, 4);
    TAKE(first, int *, E, 4);
    TAKE(freq, float *, B * E, 4);
    TAKE(xs, void *, N * k * C, value_bytes());
    TAKE(ys, void *, N * k * C, value_bytes());
    if (c->shared_experts > 0) { /* the shared experts' MLP on the N positions */
        const long SM = (long)c->shared_experts * gpt_mlp_width(c);
        TAKE(shared_fch, void *, N * SM, value_bytes());
        TAKE(shared_gelu, void *, N * SM, value_bytes());
        TAKE(shared_ys, void *, N * C, value_bytes());
    }
#undef TAKE
    return used;
}

long moe_state_bytes(const gpt_config *cfg, long N) {
    moe_state st;
    return state_layout(&st, NULL, cfg, N);
}

moe_state moe_state_view(void *raw, const gpt_config *cfg, long N) {
    moe_state st = {0};
    state_layout(&st, raw, cfg, N);
    return st;
}

static long scratch_layout(moe_scratch *sc, char *raw, const gpt_config *c, long N) {
    if (c->experts <= 0) return 0;
    long E = c->experts, k = c->top_k, C = c->d_model, used = 0;
    sc->dys = raw ? raw + used : NULL, used += align64((long)value_bytes() * N * k * C);
    sc->dgate = (float *)(raw ? raw + used : NULL), used += align64(4 * N * k);
    sc->dp = (float *)(raw ? raw + used : NULL), used += align64(4 * N * E);
    if (c->shared_experts > 0) { /* the shared experts' backward: B's dout kept for W, fc's dout, dGELU */
        const long SM = (long)c->shared_experts * gpt_mlp_width(c), vb = (long)value_bytes();
        sc->shared_dout = raw ? raw + used : NULL, used += align64(vb * N * C);
        sc->shared_dfch = raw ? raw + used : NULL, used += align64(vb * N * SM);
        sc->shared_dgelu = raw ? raw + used : NULL, used += align64(vb * N * (SM > C ? SM : C)); /* then dxs, C wide */
    }
    return used;
}

long moe_scratch_bytes(const gpt_config *cfg, long N) {
    moe_scratch sc;
    return scratch_layout(&sc, NULL, cfg, N);
}

moe_scratch moe_scratch_view(void *raw, const gpt_config *cfg, long N) {
    moe_scratch sc = {0};
    scratch_layout(&sc, raw, cfg, N);
    return sc;
}

long moe_capacity_over(const gpt_config *c, long tokens) {
    if (c->experts <= 0 || c->capacity_factor <= 0) return 0;
    const double x = (double)c->top_k * (double)tokens * c->capacity_factor / c->experts, nearest = round(x);
    const double slots = fabs(x - nearest) <= 1e-9 * nearest ? nearest : ceil(x);
    return slots < (double)tokens ? (long)slots : tokens;
}

long moe_capacity(const gpt_config *c) { return moe_capacity_over(c, c->seq); }

/* ---- the router and the dispatch ------------------------------------------------ */

const float *moe_layer_bias(const gpt_config *cfg, int layer) {
    return cfg->experts > 0 && cfg->route_bias ? cfg->route_bias + (long)layer * cfg->experts : NULL;
}

/* P of the aux loss for one token: the softmax's p itself; sigmoid scores
 * normalised over the E experts (DeepSeek-V3's sequence-wise balance loss), so
 * a uniform router still gives exactly a */
static float aux_share(const gpt_config *cfg, const float *p, int e, float ssum) {
    return cfg->router_sigmoid ? p[e] / ssum : p[e];
}

/* The per-sequence pass of moe_route reads each sequence's positions in
 * order. Whole sequences: this rank's. Split over a CP group (moe_split):
 * every rank's P shares and choices, gathered (an fp32 and an int32
 * all-gather over the group), walked in whole-sequence order, so f, P, the
 * aux loss and which choices drop are the one-rank run's, bit for bit. */
typedef struct sequence_view {
    int whole, T, k, E;
    long N;         /* this rank's positions, B x T */
    float *share;   /* [N,E] this rank's P shares; split: [c][N,E], every rank's */
    int *choice;    /* split: [c][N,k], every rank's choices; NULL: whole sequences */
    int *rank, *at; /* split: [whole] the CP rank holding each position, and its index there */
    int me;
} sequence_view;

static sequence_view sequence_view_gather(const gpt_config *cfg, const moe_state *st, const moe_split *split, int B) {
    const int E = cfg->experts, k = cfg->top_k, T = cfg->seq, c = split ? split->group->size : 1;
    sequence_view v = {.whole = split ? split->whole : T, .T = T, .k = k, .E = E, .N = (long)B * T};
    const long N = v.N;
    v.share = malloc(sizeof(float) * (size_t)(c * N * E));
    if (!v.share) die("out of host memory for the routing's sequences");
    v.me = split ? split->group->rank : 0;
    float *mine = v.share + v.me * N * E; /* this rank's block, at its place of the gathered buffer */
    for (long n = 0; n < N; n++) { /* each token's P share (the aux loss's mean is over its sequence) */
        const float *p = st->probs + n * E;
        float ssum = 0;
        if (cfg->router_sigmoid)
            for (int e = 0; e < E; e++) ssum += p[e];
        for (int e = 0; e < E; e++) mine[n * E + e] = aux_share(cfg, p, e, ssum);
    }
    if (!split) return v;
    v.choice = malloc(sizeof(int) * (size_t)(c * N * k));
    v.rank = malloc(sizeof(int) * 2 * (size_t)v.whole);
    if (!v.choice || !v.rank) die("out of host memory for the routing's sequences");
    v.at = v.rank + v.whole;
    for (int r = 0; r < c; r++)
        for (int i = 0; i < T; i++) v.rank[split->positions[r * T + i]] = r, v.at[split->positions[r * T + i]] = i;
    memcpy(v.choice + v.me * N * k, st->choice, sizeof(int) * (size_t)(N * k));
    comm_allgather(split->group, mine, v.share, c * N * E, COMM_FP32);
    comm_allgather(split->group, v.choice + v.me * N * k, v.choice, c * N * k, COMM_INT32);
    return v;
}

/* Position t of sequence b: its P shares, *choice its choices, *n its index in this rank's block (-1: another
 * rank's) */
static const float *sequence_view_at(const sequence_view *v, const moe_state *st, int b, int t, long *n,
                                     const int **choice) {
    if (!v->choice) {
        *n = (long)b * v->T + t;
        *choice = st->choice + *n * v->k;
        return v->share + *n * v->E;
    }
    const int r = v->rank[t];
    const long i = (long)b * v->T + v->at[t];
    *n = r == v->me ? i : -1;
    *choice = v->choice + ((long)r * v->N + i) * v->k;
    return v->share + ((long)r * v->N + i) * v->E;
}

static void sequence_view_free(sequence_view *v) {
    free(v->share);
    free(v->choice);
    free(v->rank);
}

void moe_route(const gpt_config *cfg, const tensor_info *tensors, const void *lp, const void *ln2, const float *bias,
               const moe_split *split, moe_state *st, int N) {
    const int E = cfg->experts, k = cfg->top_k, C = cfg->d_model, T = cfg->seq, B = N / T;
    const void *wr = value_at(lp, tensors[LAYER_ROUTER_W].offset);
    /* per (whole) sequence, or (--capacity-scope rank) over the B rows this call routes */
    const long cap = moe_capacity_over(cfg, cfg->capacity_per_rank ? N : split ? split->whole : T);
    double aux = 0;
    long dropped = 0;
    float margin = -1; /* the smallest p_(k) - p_(k+1) over the tokens; -1: k = E, no (k+1)-th */
    float *select_scores = bias ? malloc((size_t)E * sizeof(float)) : NULL;
    /* node-limited routing: G groups of E/G experts, a token's experts from its M best groups */
    const int G = cfg->route_groups, M = cfg->route_max_groups, per_group = G > 0 ? E / G : E;
    float *group_score = G > 0 ? malloc((size_t)G * sizeof(float)) : NULL;
    unsigned char *allowed = G > 0 ? malloc((size_t)E + (size_t)G) : NULL, *group_taken = allowed ? allowed + E : NULL;
    if (G > 0 && (!group_score || !allowed)) die("out of host memory for the routing groups");
    int groups_most = 0;
    double groups_sum = 0;
    for (int n = 0; n < N; n++) {
        float *p = st->probs + (long)n * E, mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) {
            float z = 0;
            for (int c = 0; c < C; c++) z += value_get(ln2, (long)n * C + c) * value_get(wr, (long)e * C + c);
            p[e] = z;
            mx = z > mx ? z : mx;
        }
        if (cfg->router_sigmoid) {
            for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
        } else {
            for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
            for (int e = 0; e < E; e++) p[e] /= sum;
        }
        /* what top-k ranks: the scores, plus the bias when balancing by bias (the choice only:
         * the gates below are the scores') */
        float *sel = bias ? select_scores : p;
        if (bias)
            for (int e = 0; e < E; e++) sel[e] = p[e] + bias[e];
        /* node-limited (DeepSeek-V3): each group scored by the sum of its two best selection
         * scores (its best alone when it holds one expert), the M best groups kept (the lower
         * index on ties); top-k then chooses among their experts only */
        float group_gap = INFINITY; /* the M-th kept group's score less the best group left out */
        if (G > 0) {
            for (int g = 0; g < G; g++) {
                float first = -INFINITY, second = -INFINITY;
                for (int e = g * per_group; e < (g + 1) * per_group; e++) {
                    if (sel[e] > first) second = first, first = sel[e];
                    else if (sel[e] > second) second = sel[e];
                }
                group_score[g] = per_group > 1 ? first + second : first;
            }
            memset(allowed, 0, (size_t)E + (size_t)G);
            int last = -1;
            for (int m = 0; m < M; m++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!group_taken[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
                group_taken[best] = 1, last = best;
                memset(allowed + best * per_group, 1, (size_t)per_group);
            }
            for (int g = 0; g < G; g++)
                if (!group_taken[g] && group_score[last] - group_score[g] < group_gap) group_gap = group_score[last] - group_score[g];
        }
        /* top-k: the largest not yet chosen, the lower index on ties */
        int *ch = st->choice + (long)n * k;
        float z = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = allowed && !allowed[e];
                for (int i = 0; i < j; i++) taken |= ch[i] == e;
                if (!taken && (best < 0 || sel[e] > sel[best])) best = e;
            }
            ch[j] = best;
            z += p[best];
        }
        for (int j = 0; j < k; j++) st->gate[(long)n * k + j] = k == 1 ? p[ch[j]] : p[ch[j]] / z;
        if (G > 0) { /* the groups (nodes) this token reached: at most M by the rule above */
            int reached = 0;
            for (int j = 0; j < k; j++) {
                int seen = 0;
                for (int i = 0; i < j; i++) seen |= ch[i] / per_group == ch[j] / per_group;
                reached += !seen;
            }
            groups_most = reached > groups_most ? reached : groups_most;
            groups_sum += reached;
        }
        /* how near this token came to another choice: its k-th score less the best one not
         * chosen (node-limited: among the kept groups' experts, or the kept groups' last
         * score less the best group left out, whichever is smaller; read only: it decides
         * nothing, moe.h) */
        float next = -INFINITY;
        for (int e = 0; e < E; e++) {
            int taken = allowed && !allowed[e];
            for (int i = 0; i < k; i++) taken |= ch[i] == e;
            if (!taken && sel[e] > next) next = sel[e];
        }
        const float gap = fminf(next > -INFINITY ? sel[ch[k - 1]] - next : INFINITY, group_gap);
        if (gap < INFINITY && (margin < 0 || gap < margin)) margin = gap;
    }
    /* capacity per sequence, in position order; f and P for the aux loss */
    int *used = calloc((size_t)E, sizeof(int));
    for (int e = 0; e < E; e++) st->stats[4 + e] = 0;
    double *mean_p = calloc((size_t)E, sizeof(double));
    memset(st->count, 0, (size_t)E * sizeof(int));
    sequence_view sv = sequence_view_gather(cfg, st, split, B);
    const int W = sv.whole;
    for (int b = 0; b < B; b++) {
        float *f = st->freq + (long)b * E;
        if (!cfg->capacity_per_rank || b == 0) memset(used, 0, (size_t)E * sizeof(int));
        memset(f, 0, (size_t)E * sizeof(float));
        for (int e = 0; e < E; e++) mean_p[e] = 0;
        for (int t = 0; t < W; t++) {
            long n; /* this rank's position, -1: another CP rank's */
            const int *choice;
            const float *share = sequence_view_at(&sv, st, b, t, &n, &choice);
            for (int e = 0; e < E; e++) mean_p[e] += share[e];
            for (int j = 0; j < k; j++) {
                int e = choice[j];
                f[e] += 1.0f;
                if (n < 0) { /* another rank's token: it takes the sequence's capacity, nothing here */
                    if (!cfg->capacity_per_rank) used[e] += !cap || used[e] < cap;
                    continue;
                }
                st->stats[4 + e] += 1.0f;
                int keep = !cap || used[e] < cap;
                used[e] += keep;
                st->slot[n * k + j] = keep ? 0 : -1;
                if (keep) st->count[e]++;
                else dropped++;
            }
        }
        double seq_aux = 0;
        for (int e = 0; e < E; e++) {
            f[e] /= (float)(k * W);
            seq_aux += (double)f[e] * (mean_p[e] / W);
        }
        aux += E * seq_aux;
    }
    sequence_view_free(&sv);
    /* slots: by expert, then by position */
    int total = 0;
    for (int e = 0; e < E; e++) st->first[e] = total, total += st->count[e];
    memset(used, 0, (size_t)E * sizeof(int));
    const size_t row = (size_t)C * value_bytes();
    for (long n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            long i = n * k + j;
            if (st->slot[i] < 0) continue;
            int e = st->choice[i];
            st->slot[i] = st->first[e] + used[e]++;
            memcpy(value_at(st->xs, (long)st->slot[i] * C), value_at(ln2, n * C), row);
        }
    st->stats[0] = (float)aux;
    st->stats[1] = (float)dropped;
    st->stats[2] = (float)total;
    st->stats[3] = margin;
    st->stats[4 + E] = (float)groups_most; /* 0 without groups */
    st->stats[5 + E] = (float)groups_sum;
    free(used);
    free(mean_p);
    free(select_scores);
    free(group_score);
    free(allowed);
}

/* expert e's four tensors inside a layer block: fc holds M rows of each
 * expert (its hidden units: fc-proj's columns), fc-proj C (from the shapes,
 * not from E: a block may hold only some of the experts, lab08's); NULL where
 * the pass has no such block (W has no parameters, B writes no gradients) */
static void *expert_tensor(const tensor_info *t, const void *lp, int which, int e) {
    const long C = t[LAYER_FC_W].cols, M = t[LAYER_FCPROJ_W].cols;
    const long rows = which == LAYER_FC_W || which == LAYER_FC_B ? M : C;
    return lp ? value_at(lp, t[which].offset + (long)e * rows * t[which].cols) : NULL;
}

void moe_experts_forward(const tensor_info *t, const void *lp, int e0, int n, const int *count, const int *first,
                         const void *xs, void *fch, void *gelu, void *ys) {
    const int C = (int)t[LAYER_FC_W].cols, M = (int)t[LAYER_FCPROJ_W].cols;
    for (int e = e0; e < e0 + n; e++) {
        if (!count[e]) continue;
        long at = first[e];
        KP->matmul_forward(value_at(fch, at * M), value_at(xs, at * C), expert_tensor(t, lp, LAYER_FC_W, e),
                           expert_tensor(t, lp, LAYER_FC_B, e), count[e], C, M);
        KP->gelu_forward(value_at(gelu, at * M), value_at(fch, at * M), (long)count[e] * M);
        KP->matmul_forward(value_at(ys, at * C), value_at(gelu, at * M), expert_tensor(t, lp, LAYER_FCPROJ_W, e),
                           expert_tensor(t, lp, LAYER_FCPROJ_B, e), count[e], M, C);
    }
}

/* one expert matmul's backward in the pass: both halves in one call (the
 * fused backward's kernel), the input gradient alone, or the weight's */
static void matmul_backward_pass(gpt_pass pass, void *dinp, void *dw, void *db, const void *dout, const void *inp,
                                 const void *w, int N, int IC, int OC) {
    if (pass == GPT_PASS_FUSED) KP->matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
    else if (pass == GPT_PASS_INPUT) KP->matmul_backward_input(dinp, dout, w, N, IC, OC);
    else KP->matmul_backward_weight(dw, db, dout, inp, N, IC, OC);
}

void moe_experts_backward(gpt_pass pass, const tensor_info *t, const void *lp, void *gp, int e0, int n,
                          const int *count, const int *first, const void *xs, const void *fch, const void *gelu,
                          const void *dys, void *dfch, void *dgelu, void **dxs) {
    const int C = (int)t[LAYER_FC_W].cols, M = (int)t[LAYER_FCPROJ_W].cols, input = pass != GPT_PASS_WEIGHT;
    const size_t vb = value_bytes();
    long slots = 0;
    for (int e = e0; e < e0 + n; e++) slots += count[e];
    long base = n ? first[e0] : 0;
    if (input) {
        mem_zero(value_at(dgelu, base * M), (size_t)slots * M * vb);
        mem_zero(value_at(dfch, base * M), (size_t)slots * M * vb);
    }
    for (int e = e0; e < e0 + n; e++) {
        if (!count[e]) continue;
        long at = first[e];
        matmul_backward_pass(pass, input ? value_at(dgelu, at * M) : NULL, expert_tensor(t, gp, LAYER_FCPROJ_W, e),
                             expert_tensor(t, gp, LAYER_FCPROJ_B, e), value_at(dys, at * C), value_at(gelu, at * M),
                             expert_tensor(t, lp, LAYER_FCPROJ_W, e), count[e], M, C);
        if (input)
            KP->gelu_backward(value_at(dfch, at * M), value_at(dgelu, at * M), value_at(fch, at * M),
                              (long)count[e] * M);
    }
    /* the gradient of the slots' inputs goes where dgelu was */
    if (input) {
        *dxs = dgelu;
        mem_zero(value_at(dgelu, base * C), (size_t)slots * C * vb);
    }
    for (int e = e0; e < e0 + n; e++) {
        if (!count[e]) continue;
        long at = first[e];
        matmul_backward_pass(pass, input ? value_at(dgelu, at * C) : NULL, expert_tensor(t, gp, LAYER_FC_W, e),
                             expert_tensor(t, gp, LAYER_FC_B, e), value_at(dfch, at * M), value_at(xs, at * C),
                             expert_tensor(t, lp, LAYER_FC_W, e), count[e], C, M);
    }
}

/* ---- the shared experts ------------------------------------------------------------ */

/* The shared experts' tensors in an expert's places: moe_experts_* then run them
 * as one expert of S M hidden units on all N positions (count N, first 0). */
static void shared_as_expert(const tensor_info *t, tensor_info *sh) {
    memcpy(sh, t, sizeof(tensor_info) * LAYER_NTENSORS);
    sh[LAYER_FC_W] = t[LAYER_SHARED_FC_W];
    sh[LAYER_FC_B] = t[LAYER_SHARED_FC_B];
    sh[LAYER_FCPROJ_W] = t[LAYER_SHARED_FCPROJ_W];
    sh[LAYER_FCPROJ_B] = t[LAYER_SHARED_FCPROJ_B];
}

void moe_shared_forward(const tensor_info *t, const void *lp, const void *ln2, moe_state *st, int N) {
    if (t[LAYER_SHARED_FC_W].rows == 0) return;
    tensor_info sh[LAYER_NTENSORS];
    shared_as_expert(t, sh);
    const int count = N, first = 0;
    moe_experts_forward(sh, lp, 0, 1, &count, &first, ln2, st->shared_fch, st->shared_gelu, st->shared_ys);
}

void moe_shared_backward(gpt_pass pass, const tensor_info *t, const void *lp, void *gp, const void *ln2,
                         const moe_state *st, const moe_scratch *sc, const void *dout, void *dinp, int N) {
    if (t[LAYER_SHARED_FC_W].rows == 0) return;
    tensor_info sh[LAYER_NTENSORS];
    shared_as_expert(t, sh);
    const long C = t[LAYER_FC_W].cols;
    const size_t bytes = (size_t)N * C * value_bytes();
    /* gate 1: the output's gradient is the MLP's; a split keeps B's for W */
    if (pass == GPT_PASS_INPUT) mem_copy(sc->shared_dout, dout, bytes);
    const void *dys = pass == GPT_PASS_WEIGHT ? sc->shared_dout : dout;
    const int count = N, first = 0;
    void *dxs = NULL;
    moe_experts_backward(pass, sh, lp, gp, 0, 1, &count, &first, ln2, st->shared_fch, st->shared_gelu, dys,
                         sc->shared_dfch, sc->shared_dgelu, &dxs);
    if (pass == GPT_PASS_WEIGHT) return;
    for (long i = 0; i < (long)N * C; i++) value_set(dinp, i, value_get(dinp, i) + value_get(dxs, i));
}

/* ---- the hooks -------------------------------------------------------------------- */

void moe_mlp_forward(const gpt_layer_hooks *h, const void *lp, const layer_acts *la, void *out, int N) {
    const gpt_config *cfg = h->cfg;
    const int E = cfg->experts, k = cfg->top_k, C = cfg->d_model;
    moe_state st = moe_state_view(la->moe, cfg, N);
    st.stats = la->moe_stats;
    moe_route(cfg, h->tensors, lp, la->ln2, moe_layer_bias(cfg, la->layer), NULL, &st, N);
    moe_experts_forward(h->tensors, lp, 0, E, st.count, st.first, st.xs, la->fch, la->fch_gelu, st.ys);
    moe_shared_forward(h->tensors, lp, la->ln2, &st, N);
    moe_combine(&st, k, C, st.ys, out, N);
}

void moe_combine(const moe_state *st, int k, int C, const void *ys, void *out, int N) {
    float *acc = malloc((size_t)C * sizeof(float));
    for (long n = 0; n < N; n++) {
        memset(acc, 0, (size_t)C * sizeof(float));
        if (st->shared_ys) /* the shared experts first, at gate 1 */
            for (int c = 0; c < C; c++) acc[c] = value_get(st->shared_ys, n * C + c);
        for (int j = 0; j < k; j++) {
            int s = st->slot[n * k + j];
            if (s < 0) continue;
            float gt = st->gate[n * k + j];
            for (int c = 0; c < C; c++) acc[c] += gt * value_get(ys, (long)s * C + c);
        }
        for (int c = 0; c < C; c++) value_set(out, n * C + c, acc[c]);
    }
    free(acc);
}

void moe_mlp_backward(const gpt_layer_hooks *h, gpt_pass pass, const void *lp, void *gp, const layer_acts *la,
                      const void *dout, void *dfch, void *dinp, gpt_grad_scratch *s, int N) {
    const gpt_config *cfg = h->cfg;
    const int E = cfg->experts, k = cfg->top_k, C = cfg->d_model;
    moe_state st = moe_state_view(la->moe, cfg, N);
    /* split: the slots' dys and the router's d logits live from B until W in
     * the micro-batch's la->moe_kept; fc's dout (through GELU) in dfch, as the
     * dense MLP's */
    moe_scratch sc = moe_scratch_view(pass == GPT_PASS_FUSED ? s->moe : la->moe_kept, cfg, N);
    void *dxs = NULL;
    if (pass != GPT_PASS_WEIGHT) moe_combine_backward(&st, &sc, k, C, st.ys, dout, sc.dys, N);
    moe_experts_backward(pass, h->tensors, lp, gp, 0, E, st.count, st.first, st.xs, la->fch, la->fch_gelu, sc.dys,
                         dfch, s->dfch_gelu, &dxs);
    moe_router_backward(h, pass, lp, gp, la->ln2, &st, &sc, dxs, dinp, s->dloss, N);
    moe_shared_backward(pass, h->tensors, lp, gp, la->ln2, &st, &sc, dout, dinp, N);
}

void moe_combine_backward(const moe_state *st, moe_scratch *sc, int k, int C, const void *ys, const void *dout,
                          void *dys, int N) {
    for (long n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            long i = n * k + j;
            int sl = st->slot[i];
            float dg = 0;
            if (sl >= 0)
                for (int c = 0; c < C; c++) {
                    float d = value_get(dout, n * C + c);
                    dg += d * value_get(ys, (long)sl * C + c);
                    value_set(dys, (long)sl * C + c, st->gate[i] * d);
                }
            sc->dgate[i] = dg;
        }
}

void moe_router_backward(const gpt_layer_hooks *h, gpt_pass pass, const void *lp, void *gp, const void *ln2,
                         const moe_state *stp, const moe_scratch *scp, const void *dxs, void *dinp, float dloss,
                         int N) {
    const gpt_config *cfg = h->cfg;
    const int E = cfg->experts, k = cfg->top_k, C = cfg->d_model, T = cfg->seq;
    const moe_state st = *stp;
    const moe_scratch sc = *scp;
    if (pass != GPT_PASS_WEIGHT) {
        /* through the gates and the aux loss to the router's probabilities, then its softmax */
        const float aux_scale = cfg->aux_coef * (float)E * dloss / (float)cfg->layers;
        for (long n = 0; n < N; n++) {
            float *dp = sc.dp + n * E, *p = st.probs + n * E;
            const float *f = st.freq + (n / T) * E;
            for (int e = 0; e < E; e++) dp[e] = aux_scale * f[e];
            if (cfg->router_sigmoid && aux_scale != 0) { /* P's share q = s / S: ds_e = (dq_e - sum_j dq_j q_j) / S */
                float ssum = 0, dot = 0;
                for (int e = 0; e < E; e++) ssum += p[e];
                for (int e = 0; e < E; e++) dot += dp[e] * p[e] / ssum;
                for (int e = 0; e < E; e++) dp[e] = (dp[e] - dot) / ssum;
            }
            const int *ch = st.choice + n * k;
            const float *dg = sc.dgate + n * k, *gt = st.gate + n * k;
            if (k == 1) {
                dp[ch[0]] += dg[0];
            } else { /* g_j = p_j / Z: dp_i = (dg_i - sum_j dg_j g_j) / Z */
                float z = 0, dot = 0;
                for (int j = 0; j < k; j++) z += p[ch[j]], dot += dg[j] * gt[j];
                for (int j = 0; j < k; j++) dp[ch[j]] += (dg[j] - dot) / z;
            }
            if (cfg->router_sigmoid) {
                for (int e = 0; e < E; e++) dp[e] *= p[e] * (1.0f - p[e]); /* now d logits */
            } else {
                float pd = 0;
                for (int e = 0; e < E; e++) pd += p[e] * dp[e];
                for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - pd); /* now d logits */
            }
        }
        /* dinp = the kept slots' input gradients in choice order + the router's */
        const void *wr = value_at(lp, h->tensors[LAYER_ROUTER_W].offset);
        float *acc = malloc((size_t)C * sizeof(float));
        for (long n = 0; n < N; n++) {
            memset(acc, 0, (size_t)C * sizeof(float));
            for (int j = 0; j < k; j++) {
                int sl = st.slot[n * k + j];
                if (sl < 0) continue;
                for (int c = 0; c < C; c++) acc[c] += value_get(dxs, (long)sl * C + c);
            }
            for (int e = 0; e < E; e++) {
                float dl = sc.dp[n * E + e];
                for (int c = 0; c < C; c++) acc[c] += dl * value_get(wr, (long)e * C + c);
            }
            for (int c = 0; c < C; c++) value_set(dinp, n * C + c, acc[c]);
        }
        free(acc);
    }
    if (pass == GPT_PASS_INPUT) return;
    /* the router's weight gradient from the d logits (B's, kept until W), summed over positions in order */
    void *dwr = value_at(gp, h->tensors[LAYER_ROUTER_W].offset);
    float *dw = calloc((size_t)E * C, sizeof(float));
    for (long n = 0; n < N; n++)
        for (int e = 0; e < E; e++) {
            float dl = sc.dp[n * E + e];
            for (int c = 0; c < C; c++) dw[(long)e * C + c] += dl * value_get(ln2, n * C + c);
        }
    for (long i = 0; i < (long)E * C; i++) value_set(dwr, i, value_get(dwr, i) + dw[i]);
    free(dw);
}

/* ---- what a block's layers report ----------------------------------------------------- */

double moe_aux_loss(const gpt_layout *g, const gpt_acts *a) {
    const gpt_config *c = &g->cfg;
    if (c->experts <= 0) return 0;
    double sum = 0;
    for (int l = 0; l < a->hi - a->lo; l++) {
        sum += a->layer[l].moe_stats[0];
    }
    return c->aux_coef / c->layers * sum / a->B;
}

void moe_expert_choices(const gpt_layout *g, const gpt_acts *a, double *counts) {
    const gpt_config *c = &g->cfg;
    const long E = c->experts;
    for (int l = 0; l < a->hi - a->lo; l++)
        for (long e = 0; e < E; e++) counts[l * E + e] = a->layer[l].moe_stats[4 + e];
}

float moe_min_margin(const gpt_layout *g, const gpt_acts *a) {
    float margin = -1;
    if (g->cfg.experts <= 0) return margin;
    for (int l = 0; l < a->hi - a->lo; l++) {
        const float m = a->layer[l].moe_stats[3];
        if (m >= 0 && (margin < 0 || m < margin)) margin = m;
    }
    return margin;
}

void moe_groups_reached(const gpt_layout *g, const gpt_acts *a, double *most, double *sum) {
    const long E = g->cfg.experts;
    *most = *sum = 0;
    if (E <= 0) return;
    for (int l = 0; l < a->hi - a->lo; l++) {
        const float *s = a->layer[l].moe_stats;
        *most = s[4 + E] > *most ? s[4 + E] : *most;
        *sum += s[5 + E];
    }
}

long moe_dropped(const gpt_layout *g, const gpt_acts *a) {
    const gpt_config *c = &g->cfg;
    if (c->experts <= 0) return 0;
    long dropped = 0;
    for (int l = 0; l < a->hi - a->lo; l++) dropped += (long)a->layer[l].moe_stats[1];
    return dropped;
}
