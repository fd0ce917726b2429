/* Expert parallelism: lab08's MLP hook (ep.h). */
#include "ep.h"
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "moe.h"
#include "trace.h"
#include <stdlib.h>
#include <string.h>

static int is_expert_tensor(int i) {
    return i == LAYER_FC_W || i == LAYER_FC_B || i == LAYER_FCPROJ_W || i == LAYER_FCPROJ_B;
}

void ep_layout(const gpt_layout *g, int N, int rank, tensor_info *tensors, long *layer_size) {
    (void)rank; /* every rank's block has the same shape; which experts fill it is ep_runs' */
    const long local = g->cfg.experts / N, E = g->cfg.experts;
    long off = 0;
    for (int i = 0; i < LAYER_NTENSORS; i++) {
        tensors[i] = g->layer[i];
        if (is_expert_tensor(i)) tensors[i].rows = g->layer[i].rows / E * local;
        tensors[i].offset = off;
        off += tensors[i].rows * tensors[i].cols;
    }
    *layer_size = off;
}

int ep_runs(const gpt_layout *g, const tensor_info *tensors, long layer_size, int N, int rank, ep_run *runs) {
    const long E = g->cfg.experts, local = E / N;
    int n = 0;
#define RUN(l, gl, len, ex) do { if (runs) runs[n] = (ep_run){l, gl, len, ex}; n++; } while (0)
    RUN(0, 0, g->embed_size, 0);
    for (int l = 0; l < g->cfg.layers; l++) {
        const long lb = g->embed_size + (long)l * layer_size, gb = gpt_layer_offset(g, l);
        /* LayerNorms and attention: the block's first tensors, one run */
        RUN(lb, gb, tensors[LAYER_FC_W].offset, 0);
        for (int i = LAYER_FC_W; i <= LAYER_FCPROJ_B; i++) { /* this rank's experts: a run of each tensor */
            const long per_expert = g->layer[i].rows / E * g->layer[i].cols;
            RUN(lb + tensors[i].offset, gb + g->layer[i].offset + rank * local * per_expert, local * per_expert, 1);
        }
        /* the router and the shared experts (replicated: every rank runs them on its own tokens) */
        RUN(lb + tensors[LAYER_ROUTER_W].offset, gb + g->layer[LAYER_ROUTER_W].offset,
            g->layer_size - g->layer[LAYER_ROUTER_W].offset, 0);
    }
    RUN(g->embed_size + (long)g->cfg.layers * layer_size, gpt_head_offset(g), g->head_size, 0);
#undef RUN
    return n;
}

/* ---- buffers that grow with the step's routing ------------------------------------- */

static void *regrow(void *old, long rows, long width, mem_category cat) {
    mem_free(old);
    return mem_alloc((size_t)(rows > 0 ? rows : 1) * (size_t)width * value_bytes(), cat);
}

static void layer_reserve(ep_hooks *e, ep_layer *ly, long rows) {
    if (ly->xr && rows <= ly->rows_cap) return; /* allocated once even when no row comes */
    const long C = e->hooks.cfg->d_model, M = gpt_mlp_width(e->hooks.cfg);
    ly->xr = regrow(ly->xr, rows, C, MEM_ACTS);
    ly->fch = regrow(ly->fch, rows, M, MEM_ACTS);
    ly->gelu = regrow(ly->gelu, rows, M, MEM_ACTS);
    ly->yr = regrow(ly->yr, rows, C, MEM_ACTS);
    ly->rows_cap = rows;
}

static void stage_reserve(ep_hooks *e, long rows) {
    if (e->stage && rows <= e->stage_cap) return;
    e->stage = regrow(e->stage, rows, e->hooks.cfg->d_model, MEM_COMM);
    e->stage_cap = rows;
}

static void scratch_reserve(ep_hooks *e, long rows) {
    if (e->dyr && rows <= e->scratch_cap) return;
    const long C = e->hooks.cfg->d_model, M = gpt_mlp_width(e->hooks.cfg);
    e->dyr = regrow(e->dyr, rows, C, MEM_WORKSPACE);
    e->dfch = regrow(e->dfch, rows, M, MEM_WORKSPACE);
    e->dgelu = regrow(e->dgelu, rows, M > C ? M : C, MEM_WORKSPACE); /* then the rows' input gradients, C wide */
    e->scratch_cap = rows;
}

/* ---- the exchanges -------------------------------------------------------------- */

int ep_rank_group(const gpt_config *cfg, int N, int p) {
    const int G = cfg->route_groups;
    return G > 1 && N % G == 0 ? p / (N / G) : -1;
}

/* From the routing: the rank's kept choices of experts in another group, and
 * the other groups each token reached; x 2, a layer's exchange out and back */
static void tally_cross_groups(ep_hooks *e, const moe_state *st, int N) {
    const gpt_config *cfg = e->hooks.cfg;
    const int mine = ep_rank_group(cfg, e->N, e->rank), k = cfg->top_k;
    if (mine < 0) return;
    const int per_group = cfg->experts / cfg->route_groups;
    long choices = 0, groups = 0;
    for (long n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            if (st->slot[n * k + j] < 0) continue;
            const int g = st->choice[n * k + j] / per_group;
            if (g == mine) continue;
            choices++;
            int seen = 0; /* the token's row goes to a group once */
            for (int i = 0; i < j && !seen; i++)
                seen = st->slot[n * k + i] >= 0 && st->choice[n * k + i] / per_group == g;
            groups += !seen;
        }
    e->counts.routed_cross += 2.0 * (double)choices;
    e->counts.routed_cross_once += 2.0 * (double)groups;
}

/* Rows of a layer's slots between the ranks: `rows_to[p]` rows from `send`
 * (packed in rank order) to EP rank p, `rows_from[p]` from p into `recv`.
 * Counts what leaves the rank. */
static void exchange_rows(ep_hooks *e, const void *send, const long *rows_to, void *recv, const long *rows_from) {
    const long C = e->hooks.cfg->d_model;
    long *vals = malloc(sizeof(long) * 2 * (size_t)e->N);
    if (!vals) die("out of host memory");
    const int mine = ep_rank_group(e->hooks.cfg, e->N, e->rank);
    for (int p = 0; p < e->N; p++) {
        vals[p] = rows_to[p] * C;
        vals[e->N + p] = rows_from[p] * C;
        if (p == e->rank) e->counts.rows_kept += (double)rows_to[p];
        else e->counts.rows_sent += (double)rows_to[p];
        if (mine >= 0 && ep_rank_group(e->hooks.cfg, e->N, p) != mine) e->counts.rows_cross += (double)rows_to[p];
    }
    const double t0 = MPI_Wtime();
    comm_alltoallv(e->ep, send, vals, NULL, recv, vals + e->N, NULL, COMM_VALUES);
    e->counts.alltoall_seconds += MPI_Wtime() - t0;
    free(vals);
}

/* Between the stage (rows by source rank, then local expert) and the
 * expert-major order (by local expert, then source rank: global token order). */
static void reorder(const ep_hooks *e, const ep_layer *ly, const void *from, void *to, int to_expert_major) {
    const int El = e->local_experts;
    const size_t row = (size_t)e->hooks.cfg->d_model * value_bytes();
    long at = 0;
    for (int src = 0; src < e->N; src++)
        for (int j = 0; j < El; j++) {
            long expert_at = ly->first[j], n = ly->recv[src * El + j];
            for (int s = 0; s < src; s++) expert_at += ly->recv[s * El + j];
            const long a = to_expert_major ? at : expert_at, b = to_expert_major ? expert_at : at;
            memcpy((char *)to + b * row, (const char *)from + a * row, (size_t)n * row);
            at += n;
        }
}

/* rows this rank sends to each EP rank (its slots of that rank's experts), and
 * receives from each (the layer's recv counts) */
static void rows_per_rank(const ep_hooks *e, const ep_layer *ly, const int *count, long *to, long *from) {
    const int El = e->local_experts;
    for (int p = 0; p < e->N; p++) {
        to[p] = from[p] = 0;
        for (int j = 0; j < El; j++) to[p] += count[p * El + j], from[p] += ly->recv[p * El + j];
    }
}

/* The state of la's layer in la's block: claimed by the block's first forward
 * of the layer, kept for its backward (and the block's later micro-batches). */
static ep_layer *layer_of(ep_hooks *e, const layer_acts *la) {
    for (int i = 0; i < e->n_layer; i++)
        if (e->layer[i].owner == la->moe && e->layer[i].layer == la->layer) return &e->layer[i];
    if (e->n_layer == e->layer_cap) {
        const int cap = 2 * e->layer_cap;
        ep_layer *grown = realloc(e->layer, sizeof(ep_layer) * (size_t)cap);
        if (!grown) die("out of host memory");
        memset(grown + e->layer_cap, 0, sizeof(ep_layer) * (size_t)(cap - e->layer_cap));
        e->layer = grown;
        e->layer_cap = cap;
    }
    ep_layer *ly = &e->layer[e->n_layer++];
    ly->owner = la->moe;
    ly->layer = la->layer;
    ly->recv = calloc((size_t)e->N * e->local_experts, sizeof(int)); /* each rank's counts for my experts */
    ly->count = calloc((size_t)e->local_experts, sizeof(int));
    ly->first = calloc((size_t)e->local_experts, sizeof(int));
    if (!ly->recv || !ly->count || !ly->first) die("out of host memory");
    return ly;
}

long ep_layer_rows_cap(const ep_hooks *h, int layer) {
    long most = 0;
    for (int i = 0; i < h->n_layer; i++)
        if (h->layer[i].layer == layer && h->layer[i].rows_cap > most) most = h->layer[i].rows_cap;
    return most;
}

static void ep_mlp_forward(const gpt_layer_hooks *h, const void *lp, const layer_acts *la, void *out, int N) {
    ep_hooks *e = h->mlp_ctx;
    const gpt_config *cfg = h->cfg;
    const int El = e->local_experts, k = cfg->top_k, C = cfg->d_model;
    ep_layer *ly = layer_of(e, la); /* the layer the model runs, in this block: its own exchange buffers */
    moe_state st = moe_state_view(la->moe, cfg, N);
    st.stats = la->moe_stats;
    moe_route(cfg, h->tensors, lp, la->ln2, moe_layer_bias(cfg, la->layer), e->split, &st, N); /* the one-rank run's decisions: per sequence */
    tally_cross_groups(e, &st, N);
    /* counts first: how many rows each rank will send to each of my experts */
    int ev = trace_begin("ep_counts", TRACE_COMM, -1, NULL);
    double t0 = MPI_Wtime();
    comm_alltoall(e->ep, st.count, ly->recv, El, COMM_INT32); /* El counts to each rank */
    e->counts.alltoall_seconds += MPI_Wtime() - t0;
    e->counts.count_bytes_sent += (double)(e->N - 1) * El * sizeof(int);
    e->counts.count_bytes_kept += (double)El * sizeof(int);
    trace_end(ev);
    long total = 0;
    for (int j = 0; j < El; j++) {
        ly->first[j] = (int)total, ly->count[j] = 0;
        for (int src = 0; src < e->N; src++) ly->count[j] += ly->recv[src * El + j];
        total += ly->count[j];
        if (ly->count[j] > e->counts.max_expert_rows) e->counts.max_expert_rows = ly->count[j];
    }
    layer_reserve(e, ly, total > e->reserve_rows ? total : e->reserve_rows);
    const long stage_rows = total > (long)k * N ? total : (long)k * N;
    stage_reserve(e, stage_rows > e->reserve_rows ? stage_rows : e->reserve_rows);
    long *to = malloc(sizeof(long) * 2 * (size_t)e->N);
    if (!to) die("out of host memory");
    long *from = to + e->N;
    rows_per_rank(e, ly, st.count, to, from);
    ev = trace_begin("ep_dispatch", TRACE_COMM, -1, NULL);
    exchange_rows(e, st.xs, to, e->stage, from); /* st.xs: sorted by expert, so packed by rank */
    trace_end(ev);
    reorder(e, ly, e->stage, ly->xr, 1);
    ev = trace_begin("experts", TRACE_COMPUTE, -1, NULL);
    t0 = MPI_Wtime();
    moe_experts_forward(h->tensors, lp, 0, El, ly->count, ly->first, ly->xr, ly->fch, ly->gelu, ly->yr);
    e->counts.expert_seconds += MPI_Wtime() - t0;
    trace_end(ev);
    reorder(e, ly, ly->yr, e->stage, 0);
    ev = trace_begin("ep_return", TRACE_COMM, -1, NULL);
    exchange_rows(e, e->stage, from, st.ys, to); /* back where each slot came from */
    trace_end(ev);
    free(to);
    moe_shared_forward(h->tensors, lp, la->ln2, &st, N); /* every token's shared experts, here */
    moe_combine(&st, k, C, st.ys, out, N);
}

static void ep_mlp_backward(const gpt_layer_hooks *h, gpt_pass pass, const void *lp, void *gp, const layer_acts *la,
                            const void *dout, void *dfch, void *dinp, gpt_grad_scratch *s, int N) {
    (void)dfch;
    if (pass != GPT_PASS_FUSED) die("lab08: the backward in two halves (B, W) is not written for experts");
    ep_hooks *e = h->mlp_ctx;
    const gpt_config *cfg = h->cfg;
    const int El = e->local_experts, k = cfg->top_k, C = cfg->d_model;
    const ep_layer *ly = layer_of(e, la); /* claimed by the block's forward */
    moe_state st = moe_state_view(la->moe, cfg, N);
    moe_scratch sc = moe_scratch_view(s->moe, cfg, N);
    moe_combine_backward(&st, &sc, k, C, st.ys, dout, sc.dys, N);
    tally_cross_groups(e, &st, N);
    long total = 0;
    for (int j = 0; j < El; j++) total += ly->count[j];
    scratch_reserve(e, total > e->reserve_rows ? total : e->reserve_rows);
    long *to = malloc(sizeof(long) * 2 * (size_t)e->N);
    if (!to) die("out of host memory");
    long *from = to + e->N;
    rows_per_rank(e, ly, st.count, to, from);
    /* the slots' output gradients travel as their rows did */
    int ev = trace_begin("ep_dispatch", TRACE_COMM, -1, NULL);
    exchange_rows(e, sc.dys, to, e->stage, from);
    trace_end(ev);
    reorder(e, ly, e->stage, e->dyr, 1);
    void *dxr;
    ev = trace_begin("experts", TRACE_COMPUTE, -1, NULL);
    const double t0 = MPI_Wtime();
    moe_experts_backward(GPT_PASS_FUSED, h->tensors, lp, gp, 0, El, ly->count, ly->first, ly->xr, ly->fch, ly->gelu,
                         e->dyr, e->dfch, e->dgelu, &dxr);
    e->counts.expert_seconds += MPI_Wtime() - t0;
    trace_end(ev);
    reorder(e, ly, dxr, e->stage, 0);
    ev = trace_begin("ep_return", TRACE_COMM, -1, NULL);
    exchange_rows(e, e->stage, from, sc.dys, to); /* the slots' input gradients, home (sc.dys is spent) */
    trace_end(ev);
    free(to);
    moe_router_backward(h, GPT_PASS_FUSED, lp, gp, la->ln2, &st, &sc, sc.dys, dinp, s->dloss, N);
    moe_shared_backward(GPT_PASS_FUSED, h->tensors, lp, gp, la->ln2, &st, &sc, dout, dinp, N);
}

long ep_received_rows_bound(const gpt_config *cfg, int N, long rows, int whole) {
    const long cap = moe_capacity_over(cfg, whole), T = cfg->seq, El = cfg->experts / N, k = cfg->top_k;
    if (cap <= 0 || cfg->capacity_per_rank) return 0; /* per rank: the routing decides, as under F = 0 */
    const long per_expert = cap < T ? cap : T; /* a token picks an expert once: at most T of a source's T */
    return (long)N * rows * (El * per_expert < k * T ? El * per_expert : k * T);
}

void ep_hooks_init(ep_hooks *h, const gpt_layout *g, comm *ep) {
    memset(h, 0, sizeof *h);
    h->ep = ep;
    h->N = ep->size;
    h->rank = ep->rank;
    h->local_experts = g->cfg.experts / ep->size;
    h->layers = g->cfg.layers;
    ep_layout(g, h->N, h->rank, h->tensors, &h->layer_size);
    h->hooks = gpt_default_hooks(g);
    h->hooks.mlp_ctx = h; /* EP's slot: the MLP */
    h->hooks.tensors = h->tensors;
    h->hooks.layer_size = h->layer_size;
    h->hooks.mlp_forward = ep_mlp_forward;
    h->hooks.mlp_backward = ep_mlp_backward;
    h->layer_cap = h->layers > 0 ? h->layers : 1; /* one block: every layer's state claimed once */
    h->layer = calloc((size_t)h->layer_cap, sizeof(ep_layer));
    if (!h->layer) die("out of host memory");
}

void ep_hooks_free(ep_hooks *h) {
    for (int l = 0; l < h->n_layer; l++) {
        ep_layer *ly = &h->layer[l];
        mem_free(ly->xr), mem_free(ly->fch), mem_free(ly->gelu), mem_free(ly->yr);
        free(ly->recv), free(ly->count), free(ly->first);
    }
    free(h->layer);
    mem_free(h->stage), mem_free(h->dyr), mem_free(h->dfch), mem_free(h->dgelu);
}

