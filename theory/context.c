/* Context parallelism's formulas (theory.h): which positions a rank holds,
 * the causal scores it computes, and the bytes its attention exchanges. */
#include "theory.h"

long th_cp_position(long T, int N, int rank, long i, th_cp_layout layout) {
    if (layout == TH_CP_CONTIGUOUS) return (long)rank * (T / N) + i;
    const long s = T / (2L * N);
    return i < s ? (long)rank * s + i : (2L * N - 1 - rank) * s + (i - s);
}

/* A chunk of s positions starting at c s meets the c s keys before it whole
 * and itself as a triangle: s (c s) + s (s+1) / 2. Zig-zag's chunks r and
 * 2N-1-r add up to c = 2N-1 whatever r is. */
double th_cp_causal_scores(long T, int N, int rank, th_cp_layout layout) {
    if (layout == TH_CP_CONTIGUOUS) {
        const double s = (double)(T / N);
        return s * s * rank + s * (s + 1) / 2;
    }
    const double s = (double)(T / (2L * N));
    return s * s * (2.0 * N - 1) + s * (s + 1);
}

double th_cp_rank_scores(long T, int N, int rank, th_cp_layout layout, th_cp_algo algo) {
    if (algo == TH_CP_ULYSSES) return (double)T * (double)(T + 1) / 2 / N; /* all T of heads/N heads */
    return th_cp_causal_scores(T, N, rank, layout);
}

th_cp_traffic th_cp_layer_traffic(th_cp_algo algo, int N, long rows, long T, long d_model, long kv_dim,
                                  double value_bytes) {
    th_cp_traffic t = {0, 0, 0, 0};
    if (N <= 1) return t;
    const double local = (double)rows * (double)(T / N) * value_bytes;
    const double b = local * (double)kv_dim, q = local * (double)d_model, n1 = N - 1;
    switch (algo) {
    case TH_CP_RING:
        t.fwd_sent = 2 * n1 * b;
        t.bwd_sent = 2 * n1 * b + 2.0 * N * b;
        break;
    case TH_CP_ALLGATHER:
        t.fwd_sent = 2 * n1 * b;
        t.bwd_sent = 4 * n1 * b;
        break;
    case TH_CP_ULYSSES:
        t.fwd_sent = t.bwd_sent = n1 / N * (2 * q + 2 * b);
        break;
    }
    t.fwd_recv = t.fwd_sent;
    t.bwd_recv = t.bwd_sent;
    return t;
}

double th_cp_acts_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo) {
    th_model local = *m; /* a rank's layers run the course's model on T/N positions */
    local.seq = m->seq / N;
    const th_acts_parts p = th_course_acts_parts(&local, o, 0, (int)m->layers, rows);
    if (p.other < 0 || m->seq % N) return -1;
    const double v = th_param_bytes(o->precision), head_size = (double)(m->d_model / m->heads);
    /* att [rows,H,T/N] rows of: the log-sum-exp (fp32), and for Ulysses the head-split q|k|v and output */
    const double row = 4 + (algo == TH_CP_ULYSSES ? 4 * head_size * v : 0);
    const double att = (double)(((long long)((double)rows * m->heads * local.seq * row) + 63) / 64 * 64);
    return p.linear + p.other + (o->recompute == TH_RECOMPUTE_NONE ? (double)m->layers * att : 0);
}

th_cp_ring_hiding th_cp_ring_hiding_of(long rows, long T, int N, long d_model, double value_bytes,
                                       double scores_per_rank, double flops_rate, double bandwidth) {
    th_cp_ring_hiding r = {0, 0, 0, 0};
    if (N < 2 || flops_rate <= 0 || bandwidth <= 0) return r;
    /* q k^T and p v: a multiply-add (2 FLOPs) per score and head dimension, each: 4 C per score */
    r.block_seconds = 4.0 * (double)rows * (double)d_model * scores_per_rank / N / flops_rate;
    r.message_seconds = (double)rows * (double)(T / N) * 2.0 * (double)d_model * value_bytes / bandwidth;
    r.positions_needed = flops_rate * value_bytes / bandwidth;
    r.hidden = r.block_seconds >= r.message_seconds;
    return r;
}
