/* Context parallelism's formulas (theory.h): which positions a rank holds,
 * the causal scores it computes, and the bytes its attention exchanges. */
#include "predict.h"
#include "theory.h"

/* A CP layer's att slot, bytes: per query row and head of rows x H x T/N the
 * fp32 log-sum-exp, and for Ulysses the head-split q|k|v and output, 4 HS values */
static double att_slot_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo) {
    const double v = th_param_bytes(o->precision), head_size = (double)(m->d_model / m->heads);
    return th_pad64((double)rows * m->heads * (m->seq / N) * (4 + (algo == TH_CP_ULYSSES ? 4 * head_size * v : 0)));
}

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

double th_cp_stage_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows, int N,
                              th_cp_algo algo) {
    th_model local = *m; /* a rank's layers run the course's model on T/N positions */
    local.seq = m->seq / N;
    const th_acts_parts p = th_course_acts_parts(&local, o, lo, hi, rows);
    const int t = o->tp > 1 ? o->tp : 1;
    if (p.other < 0 || m->seq % N || m->heads % t) return -1;
    th_model heads = *m; /* the att slot holds a TP rank's heads/t heads, of the same size */
    heads.heads = m->heads / t;
    heads.d_model = m->d_model / t;
    const double att = att_slot_bytes(&heads, o, rows, N, algo); /* where a one-rank layer keeps [rows,H,T,T] */
    return p.linear + p.other + (o->recompute == RECOMPUTE_NONE ? (double)(hi - lo) * att : 0);
}

double th_cp_acts_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo) {
    return th_cp_stage_acts_bytes(m, o, 0, (int)m->layers, rows, N, algo);
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

/* lab07: N = r->cp ranks per CP group, data parallel over r->ranks / N
 * groups; every rank the whole model and rows = B / dp sequences of T/N
 * positions. Memory as lab07_cp/cp.c allocates (the allocator counts the
 * bytes asked for; the layers' pieces inside one block are 64-byte aligned): the model states of the whole
 * model; th_cp_acts_bytes; comm, the exchange buffers of one [rows,T/N,2C]
 * K|V block each: ring 4 (k|v and dk|dv, double-buffered), allgather those
 * and 2 N more (everyone's K|V and dK|dV), ulysses 2 of [rows,T/N,3C] (the
 * all-to-all's staging); workspace, the layer scratch on T/N positions with
 * the att slot for its datt (and for the recomputed att under --recompute),
 * the positions (T ints), and for ring and allgather one block's output and
 * log-sum-exp before the merge. Traffic per step: the gradients' all-reduce
 * over all ranks; ring, per layer N-1 K|V sends per attention forward
 * (--recompute: two) and 2N-1 in the backward, each as many receives;
 * allgather, per layer a forward all-gather (two with --recompute) and one
 * more and a reduce-scatter in the backward, N blocks each; ulysses' all-to-alls
 * are a kind theory/predict's tables do not have (th_cp_layer_traffic gives
 * their bytes). */
void th_cp_layer_calls(th_cp_algo algo, int N, double block, int forwards, double *calls, double *payload) {
    for (int k = 0; k < COLL_NKINDS; k++) calls[k] = payload[k] = 0;
    if (N < 2) return; /* a group of one moves nothing */
    if (algo == TH_CP_RING) { /* K|V N-1 steps each forward; backward K|V N-1 steps and dK|dV N steps home */
        const double sends = forwards * (N - 1.0) + (N - 1.0) + N;
        calls[COLL_SEND] = calls[COLL_RECV] = sends;
        payload[COLL_SEND] = payload[COLL_RECV] = sends * block;
    } else if (algo == TH_CP_ALLGATHER) { /* K|V gathered each forward and again backward; dK|dV scattered */
        calls[COLL_ALLGATHER] = forwards + 1.0;
        payload[COLL_ALLGATHER] = (forwards + 1.0) * N * block;
        calls[COLL_REDUCE_SCATTER] = 1;
        payload[COLL_REDUCE_SCATTER] = N * block;
    } else { /* Ulysses: q|k|v to the head split and the output back (3 + 1 widths = 2 blocks), each forward;
              * dO there and dq|dk|dv back */
        calls[COLL_ALLTOALL] = 2.0 * (forwards + 1.0);
        payload[COLL_ALLTOALL] = 2.0 * (forwards + 1.0) * block;
    }
}

double th_cp_scratch_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo) {
    const int t = o->tp > 1 ? o->tp : 1;
    th_model local = *m; /* the layer scratch on T/N positions */
    local.seq = m->seq / N;
    th_model heads = *m; /* a TP rank's heads/t heads, of the same size */
    heads.heads = m->heads / t;
    heads.d_model = m->d_model / t;
    /* the scratch's datt, and the recomputation's att, are att slots, not [rows,H/t,T/N,T/N] */
    const double vb = th_param_bytes(o->precision), att_slots = o->recompute ? 2 : 1;
    const double square = th_pad64(vb * (double)rows * heads.heads * local.seq * local.seq);
    return th_course_scratch_bytes(&local, o, rows) + att_slots * (att_slot_bytes(&heads, o, rows, N, algo) - square);
}

double th_cp_hooks_bytes(const th_model *m, const th_opts *o, long rows, int N, th_cp_algo algo) {
    const int t = o->tp > 1 ? o->tp : 1;
    const double vb = th_param_bytes(o->precision), Tl = (double)(m->seq / N);
    return 4.0 * (double)m->seq + (algo == TH_CP_ULYSSES ? 0 : vb * (double)rows * Tl * (double)(m->d_model / t) +
                                                                4.0 * (double)rows * Tl * (double)(m->heads / t));
}

void th_cp_predict(const th_run *r, th_rank_need *need) {
    const int N = r->cp, dp = r->ranks / N; /* th_predict_run calls it for cp > 0 */
    const th_cp_algo algo = (th_cp_algo)r->cp_algo;
    const th_model *m = &r->model;
    const th_opts o = th_opts_run(1, 0, r->recompute, r->bf16);
    const double vb = th_param_bytes(o.precision), psi = th_param_counts(m).total, L = (double)m->layers;
    const long rows = r->batch / dp, Tl = m->seq / N;
    const double block = vb * (double)rows * (double)Tl * 2.0 * (double)m->d_model, forwards = r->recompute ? 2 : 1;
    const double workspace = th_cp_scratch_bytes(m, &o, rows, N, algo) + th_cp_hooks_bytes(m, &o, rows, N, algo);
    const th_states s = th_model_states(psi, &o, 0, 1);
    for (int q = 0; q < r->ranks; q++) {
        th_rank_need *x = &need[q];
        *x = (th_rank_need){.dp = q / N, .lo = 0, .hi = (int)m->layers, .rows = rows, .params = psi, .acts_in_flight = 1};
        x->mem[MEM_PARAMS] = s.params;
        x->mem[MEM_GRADS] = s.grads;
        x->mem[MEM_OPTIM] = s.optim;
        x->mem[MEM_ACTS] = th_cp_acts_bytes(m, &o, rows, N, algo);
        x->mem[MEM_COMM] = algo == TH_CP_ULYSSES ? 2 * 1.5 * block : (4 + (algo == TH_CP_ALLGATHER ? 2 * N : 0)) * block;
        x->mem[MEM_WORKSPACE] = r->cuda ? -1 : workspace;
        if (r->ranks > 1) {
            x->calls[COLL_ALLREDUCE] = 1;
            x->payload[COLL_ALLREDUCE] = vb * psi;
            x->ring[COLL_ALLREDUCE] = vb * psi * comm_ring_factor(COLL_ALLREDUCE, r->ranks);
        }
        if (N < 2 || algo == TH_CP_ULYSSES) continue; /* Ulysses' all-to-alls: a kind predict's tables do not have */
        double calls[COLL_NKINDS], payload[COLL_NKINDS];
        th_cp_layer_calls(algo, N, block, (int)forwards, calls, payload);
        for (int k = 0; k < TH_PREDICTED_KINDS; k++)
            if (calls[k] > 0) {
                x->calls[k] = L * calls[k];
                x->payload[k] = L * payload[k];
                x->ring[k] = x->payload[k] * comm_ring_factor((comm_kind)k, N);
            }
    }
}
