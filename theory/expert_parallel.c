/* Expert parallelism (lab08): what uniform routing predicts (its all-to-all
 * bytes are th_ep_layer_traffic, in traffic.c beside the other collectives). */
#include "predict.h"
#include "theory.h"
#include <math.h>
#include <stdlib.h>

double th_ep_cross_node_copies(long top_k, long max_nodes, int nodes) {
    if (nodes <= 1) return 0;
    const double remote = (double)(nodes - 1) / nodes, k = (double)top_k;
    if (max_nodes <= 0) return k * remote;
    return fmin(fmin((double)max_nodes, k), (double)nodes) * remote;
}

double th_ep_tokens_per_expert_uniform(long tokens, int top_k, int experts) {
    return (double)top_k * (double)tokens / experts;
}

double th_expert_capacity(int top_k, double tokens, double capacity_factor, int experts) {
    if (capacity_factor <= 0 || experts <= 0) return tokens;
    const double x = top_k * tokens * capacity_factor / experts, nearest = round(x);
    const double slots = fabs(x - nearest) <= 1e-9 * nearest ? nearest : ceil(x);
    return fmin(slots, tokens);
}

double th_ep_received_rows_bound_over(long rows, long positions, long seq, int top_k, int experts, int N,
                                      double capacity_factor) {
    const double El = experts / N, P = (double)positions, k = top_k;
    const double cap = th_expert_capacity(top_k, (double)seq, capacity_factor, experts); /* per expert and sequence */
    return (double)N * (double)rows * fmin(El * fmin(cap, P), k * P);
}

double th_ep_received_rows_bound(long rows, long seq, int top_k, int experts, int N, double capacity_factor) {
    return th_ep_received_rows_bound_over(rows, seq, seq, top_k, experts, N, capacity_factor);
}

/* A layer's fch and GELU pieces as lab01's layers carve them, k N slots'
 * rows each; lab08's layers leave them empty (the experts' hidden rows are
 * the received rows' buffers). */
static double slot_hidden_bytes(const th_model *m, long rows, double v) {
    return 2 * th_pad64(v * (double)rows * (double)m->seq * (double)m->top_k * th_expert_width(m));
}

/* lab01's scratch of the k N slots (dfch, and dGELU, whose room then holds the slots' input gradients
 * [k N, C]: th_course_scratch_bytes), which lab08's layers leave empty too */
static double slot_scratch_bytes(const th_model *m, long rows, double v) {
    const double slots = (double)rows * (double)m->seq * (double)m->top_k, Fe = th_expert_width(m);
    return th_pad64(v * slots * Fe) + th_pad64(v * slots * fmax(Fe, (double)m->d_model));
}

/* lab01's layers [lo, hi) less the slots' hidden pieces the hook keeps (not carved
 * under --recompute full either way), and one received row's bytes in a layer
 * (xr, yr [r,C], fch, GELU [r,F]: each its own allocation) */
static double ep_layers_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows) {
    const double course = th_course_acts_bytes(m, o, lo, hi, rows); /* with the router state, stats */
    if (course < 0 || m->experts <= 0) return -1;
    const double v = th_param_bytes(o->precision);
    return course - (o->recompute != RECOMPUTE_FULL ? th_moe_layers(m, lo, hi) * slot_hidden_bytes(m, rows, v) : 0);
}
static double received_row_bytes(const th_model *m, const th_opts *o) {
    return (2 * (double)m->d_model + 2 * th_expert_width(m)) * th_param_bytes(o->precision);
}

double th_ep_stage_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows, double received) {
    const double layers = ep_layers_bytes(m, o, lo, hi, rows);
    return layers < 0 ? -1 : layers + th_moe_layers(m, lo, hi) * fmax(received, 1) * received_row_bytes(m, o);
}

double th_ep_acts_change_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows, double received) {
    const double ep = th_ep_stage_acts_bytes(m, o, lo, hi, rows, received);
    return ep < 0 ? -1 : ep - th_course_acts_bytes(m, o, lo, hi, rows);
}

double th_ep_scratch_bytes(const th_model *m, const th_opts *o, long rows) {
    const double v = th_param_bytes(o->precision), course = th_course_scratch_bytes(m, o, rows);
    if (course < 0 || m->experts <= 0) return -1;
    return course - slot_scratch_bytes(m, rows, v) - (o->recompute == RECOMPUTE_FULL ? slot_hidden_bytes(m, rows, v) : 0);
}

double th_ep_hook_scratch_bytes(const th_model *m, const th_opts *o, double received) {
    const double v = th_param_bytes(o->precision), C = (double)m->d_model, F = th_expert_width(m);
    return fmax(received, 1) * (C + F + fmax(F, C)) * v; /* dyr, dfch, dGELU then the rows' input gradients */
}

double th_ep_acts_bytes(const th_model *m, const th_opts *o, long rows, const double *received) {
    double bytes = ep_layers_bytes(m, o, 0, (int)m->layers, rows);
    if (bytes < 0) return -1;
    for (int l = 0; l < m->layers; l++) bytes += fmax(received[l], 1) * received_row_bytes(m, o);
    return bytes;
}

double th_ep_dropless_rows(long rows, long seq, int top_k, int experts, int N, double skew) {
    const double uniform = (double)top_k * (double)rows * (double)seq;
    return fmin(ceil(skew * uniform), th_ep_received_rows_bound(rows, seq, top_k, experts, N, 0));
}

double th_ep_dropless_acts_bytes(const th_model *m, const th_opts *o, long rows, int N, double skew) {
    if (m->experts <= 0) return -1;
    const double r = th_ep_dropless_rows(rows, m->seq, (int)m->top_k, (int)m->experts, N, skew);
    return th_ep_stage_acts_bytes(m, o, 0, (int)m->layers, rows, r);
}

/* ---- --dry-run (theory/predict.h) ------------------------------------------------------- */

/* What lab08 allocates and moves, from its flags. The received rows' buffers
 * (activations xr, fch, GELU, yr per layer; the backward's dyr, dfch, dGELU,
 * workspace; the exchange's stage, comm) hold th_ep_received_rows_bound rows:
 * exact with a capacity (lab08 sizes them so), the capacity-free bound under
 * F = 0, where the routing decides and the run allocates at most this. */
void th_ep_predict(const th_run *r, th_rank_need *need) {
    const int N = r->ep > 0 ? r->ep : r->ranks, edp = r->ranks / N;
    const th_model *m = &r->model;
    const th_opts o = th_opts_run(1, 0, r->recompute, r->bf16);
    th_opts held = o;
    held.ep = N;
    const double v = th_param_bytes(o.precision), L = (double)m->layers, C = (double)m->d_model;
    const double k = (double)m->top_k;
    const long rows = r->batch / r->ranks;
    const double Npos = (double)rows * (double)m->seq;
    const double psi = th_stage_params(m, &held, 0, (int)m->layers);
    const double experts_held = th_stage_expert_params(m, &held, 0, (int)m->layers);
    const double received = th_ep_received_rows_bound(rows, m->seq, (int)m->top_k, (int)m->experts, N,
                                                      r->capacity_factor);
    /* every layer the same bound: no array of L (a lab's memory check may ask for --layers 10^9) */
    const double acts = th_ep_stage_acts_bytes(m, &o, 0, (int)m->layers, rows, received);
    /* lab01's backward scratch (with the router's backward, and under --recompute full the recomputed
     * layer's router state and statistics) with the layer's MLP pieces empty (dfch, dGELU; under full the
     * recomputed layer's fch, GELU too), and the received rows' dyr [r,C], dfch, dGELU [r,ffn] */
    const double workspace = th_ep_scratch_bytes(m, &o, rows) + th_ep_hook_scratch_bytes(m, &o, received);
    const double stage = fmax(fmax(received, k * Npos), 1) * C * v; /* sent and received rows, by rank */
    const th_states s = th_model_states(psi, &o, 0, 1);
    const double replicated = psi - experts_held;
    for (int q = 0; q < r->ranks; q++) {
        th_rank_need *x = &need[q];
        *x = (th_rank_need){.dp = q / N, .lo = 0, .hi = (int)m->layers, .rows = rows, .params = psi, .acts_in_flight = 1};
        x->mem[MEM_PARAMS] = s.params;
        x->mem[MEM_GRADS] = s.grads;
        x->mem[MEM_OPTIM] = s.optim;
        x->mem[MEM_ACTS] = acts;
        x->mem[MEM_COMM] = stage;
        x->mem[MEM_WORKSPACE] = r->cuda ? -1 : workspace;
        /* the gradients: the replicated runs over every rank (the embedding, each layer's attention part
         * and router, the head: 2 + 2L calls), the expert runs over the EDP group (4 tensors a layer) */
        if (r->ranks > 1) {
            x->calls[COLL_ALLREDUCE] += 2 + 2 * L;
            x->payload[COLL_ALLREDUCE] += v * replicated;
            x->ring[COLL_ALLREDUCE] += v * replicated * comm_ring_factor(COLL_ALLREDUCE, r->ranks);
        }
        if (edp > 1) {
            x->calls[COLL_ALLREDUCE] += 4 * L;
            x->payload[COLL_ALLREDUCE] += v * experts_held;
            x->ring[COLL_ALLREDUCE] += v * experts_held * comm_ring_factor(COLL_ALLREDUCE, edp);
        }
    }
}

/* Per layer: the forward's counts (E/N ints to every EP rank) and two row
 * exchanges, dispatch (the rank's own slots out) and return (the rows its
 * experts ran, back); the backward's two the same way; --recompute full runs
 * the forward's again (selective recomputes attention only). The own block is
 * in the payload, as comm counts it; a group of one moves nothing. The own
 * slots are k N_tok rows with nothing dropped; the rows the experts ran are
 * the routing's: k N_tok under uniform routing (with F = 0 the EP group's mean
 * exactly: every slot is run once), at most th_ep_received_rows_bound. */
th_ep_alltoall th_ep_alltoall_per_step(const th_run *r) {
    const int N = r->ep > 0 ? r->ep : r->ranks;
    th_ep_alltoall a = {0, 0, 0};
    if (N < 2) return a;
    const th_model *m = &r->model;
    const double v = r->bf16 ? 2 : 4, L = (double)m->layers, C = (double)m->d_model;
    const double forwards = r->recompute == RECOMPUTE_FULL ? 2 : 1;
    const long rows = r->batch / r->ranks;
    const double counts = (double)N * (double)(m->experts / N) * 4;
    const double own = (double)rows * (double)m->seq * (double)m->top_k * C * v;
    const double most = th_ep_received_rows_bound(rows, m->seq, (int)m->top_k, (int)m->experts, N,
                                                  r->capacity_factor) * C * v;
    a.calls = th_ep_alltoall_calls(L, (int)forwards);
    a.payload = L * (forwards * (counts + 2 * own) + 2 * own);
    a.payload_max = L * (forwards * (counts + own + most) + own + most);
    return a;
}
