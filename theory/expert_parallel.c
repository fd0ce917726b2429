/* Expert parallelism (lab08): what uniform routing predicts (its all-to-all
 * bytes are th_ep_layer_traffic, in traffic.c beside the other collectives). */
#include "theory.h"
#include <math.h>

double th_ep_tokens_per_expert_uniform(long tokens, int top_k, int experts) {
    return (double)top_k * (double)tokens / experts;
}

double th_ep_received_rows_bound(long rows, long seq, int top_k, int experts, int N, double capacity_factor) {
    const double El = experts / N, T = (double)seq, k = top_k;
    /* capacity per expert and sequence, as common/moe.c's moe_capacity; none: T (a token picks an expert once) */
    double cap = capacity_factor > 0 ? ceil(k * T * capacity_factor / experts) : T;
    if (cap > T) cap = T;
    return (double)N * (double)rows * fmin(El * cap, k * T);
}

static double pad64(double bytes) { return (double)(((long long)bytes + 63) / 64 * 64); }

/* common/moe.c's moe_state for N positions: probs [N,E], choice, gate, slot
 * [N,k], count, first [E], freq [rows,E] (fp32 / ints), xs, ys [N k, C] values */
static double moe_state_bytes_of(const th_model *m, double rows, double v) {
    const double N = rows * (double)m->seq, E = (double)m->experts, k = (double)m->top_k;
    return pad64(4 * N * E) + 3 * pad64(4 * N * k) + 2 * pad64(4 * E) + pad64(4 * rows * E) +
           2 * pad64(v * N * k * (double)m->d_model);
}

double th_ep_acts_bytes(const th_model *m, const th_opts *o, long rows, const double *received) {
    const double dense = th_course_acts_bytes(m, o, 0, (int)m->layers, rows);
    if (dense < 0 || m->experts <= 0) return -1;
    const double v = th_param_bytes(o->precision), N = (double)rows * (double)m->seq, L = (double)m->layers;
    double bytes = dense;
    if (o->recompute != TH_RECOMPUTE_FULL) /* the layer's fch and GELU pieces are empty; the router's state kept */
        bytes += L * (moe_state_bytes_of(m, (double)rows, v) - 2 * pad64(v * N * (double)m->ffn));
    bytes += L * pad64(4 * (4 + (double)m->experts)); /* the aux-loss statistics, kept under every mode */
    for (int l = 0; l < m->layers; l++) /* xr [r,C], fch, gelu [r,ffn], yr [r,C]: each its own allocation */
        bytes += fmax(received[l], 1) * (2 * (double)m->d_model + 2 * (double)m->ffn) * v;
    return bytes;
}
