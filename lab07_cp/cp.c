#include "cp.h"
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "trace.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TAG_KV = 71, TAG_DKV = 72 };

/* rows of `width` values from a buffer with row stride ld_src to one with
 * ld_dst (k|v is 2C contiguous at offset C of each qkv row) */
static void copy_rows(void *dst, long ld_dst, const void *src, long ld_src, long rows, long width) {
    for (long r = 0; r < rows; r++) mem_copy(value_at(dst, r * ld_dst), value_at(src, r * ld_src), (size_t)width * value_bytes());
}

/* This thread's CPU seconds: a rank's own work, which wall-clock time
 * overstates when more ranks than cores take turns (the per-rank chart). */
static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Rank r's global positions, on the device: the causal mask of its block. */
static const int *positions_of(const cp_hooks *h, int r) { return h->pos_dev + (long)r * h->T; }

/* One block of keys (from rank src, k|v rows of 2C at kv) for our queries:
 * the first straight into (out, lse), the others merged in. */
static void forward_block(cp_hooks *h, void *out, float *lse, const void *qkv, const void *kv, int src, int first,
                          int heads, int HS) {
    const int C = heads * HS, T = h->T;
    const void *k = kv, *v = value_at(kv, C);
    const int *q_pos = positions_of(h, h->rank), *k_pos = positions_of(h, src);
    int ev = trace_begin(CP_BLOCK_OP, TRACE_COMPUTE, -1, NULL); /* the ring's compute per message: cp_ring_hiding */
    const double t0 = thread_seconds();
    if (first) {
        KP->attention_block_forward(out, lse, qkv, k, v, 3 * C, 2 * C, q_pos, k_pos, h->B, T, T, heads, HS);
    } else {
        KP->attention_block_forward(h->out2, h->lse2, qkv, k, v, 3 * C, 2 * C, q_pos, k_pos, h->B, T, T, heads, HS);
        KP->attention_merge(out, lse, h->out2, h->lse2, h->B, T, heads, HS);
    }
    h->attention_cpu_seconds += thread_seconds() - t0;
    trace_end(ev);
    h->scores += attention_unmasked_scores(h->pos_host + (long)h->rank * T, T, h->pos_host + (long)src * T, T);
}

/* Post this step's exchange: `send` to the next rank, `recv` from the previous. */
static void ring_post(cp_hooks *h, const void *send, void *recv, long n, int tag, comm_request r[2]) {
    comm_group_begin(h->cp);
    comm_isend(h->cp, send, n, COMM_VALUES, (h->rank + 1) % h->N, tag, &r[0]);
    comm_irecv(h->cp, recv, n, COMM_VALUES, (h->rank + h->N - 1) % h->N, tag, &r[1]);
    comm_group_end(h->cp);
}
static void ring_wait(comm_request r[2]) {
    comm_wait(&r[0]);
    comm_wait(&r[1]);
}

/* ---- Ulysses: an all-to-all swaps the sequence split for a head split ------------
 * Seq side [B][T][ld]: this rank's T positions, all heads, `parts` column
 * groups of C (q|k|v: 3; the output: 1) at stride ld. Head side [B][N T][parts
 * Cn]: every position (rank j's T at rows j T.., so the positions are pos_dev
 * in order), this rank's heads, Cn = C/N columns per group. The all-to-all's
 * block for rank j: our positions, j's heads. */
static void ulysses_to_heads(cp_hooks *h, void *heads_side, const void *seq, long ld, int parts, int C) {
    const long N = h->N, rows = (long)h->B * h->T, Cn = C / N, w = parts * Cn, run = h->T * w;
    int ev = trace_begin("a2a_pack", TRACE_COMPUTE, -1, NULL);
    for (long j = 0; j < N; j++)
        for (int p = 0; p < parts; p++)
            copy_rows(value_at(h->a2a_send, j * rows * w + p * Cn), w, value_at(seq, p * C + j * Cn), ld, rows, Cn);
    trace_end(ev);
    comm_alltoall(h->cp, h->a2a_send, h->a2a_recv, rows * w, COMM_VALUES);
    ev = trace_begin("a2a_unpack", TRACE_COMPUTE, -1, NULL);
    for (long j = 0; j < N; j++) /* from rank j: its positions of every row */
        for (long b = 0; b < h->B; b++)
            mem_copy(value_at(heads_side, (b * N + j) * run), value_at(h->a2a_recv, (j * h->B + b) * run),
                     (size_t)run * value_bytes());
    trace_end(ev);
}

static void ulysses_to_seq(cp_hooks *h, void *seq, long ld, const void *heads_side, int parts, int C) {
    const long N = h->N, rows = (long)h->B * h->T, Cn = C / N, w = parts * Cn, run = h->T * w;
    int ev = trace_begin("a2a_pack", TRACE_COMPUTE, -1, NULL);
    for (long j = 0; j < N; j++) /* to rank j: its positions of every row */
        for (long b = 0; b < h->B; b++)
            mem_copy(value_at(h->a2a_send, (j * h->B + b) * run), value_at(heads_side, (b * N + j) * run),
                     (size_t)run * value_bytes());
    trace_end(ev);
    comm_alltoall(h->cp, h->a2a_send, h->a2a_recv, rows * w, COMM_VALUES);
    ev = trace_begin("a2a_unpack", TRACE_COMPUTE, -1, NULL);
    for (long j = 0; j < N; j++) /* from rank j: our positions, its heads */
        for (int p = 0; p < parts; p++)
            copy_rows(value_at(seq, p * C + j * Cn), ld, value_at(h->a2a_recv, j * rows * w + p * Cn), w, rows, Cn);
    trace_end(ev);
}

/* What a Ulysses layer keeps in its att slot (gpt_part.att_row = cp_att_row):
 * the log-sum-exp [B,heads/N,N T] fp32, then the head-split q|k|v [B,N T,3 Cn]
 * and output [B,N T,Cn] its backward reads; the same shapes in the scratch's
 * datt hold their gradients. */
typedef struct { float *lse; void *qkv, *out; } ulysses_slot;
static ulysses_slot ulysses_slot_of(const cp_hooks *h, const void *att, int heads, int HS) {
    const long all = (long)h->B * h->N * h->T, Cn = (long)heads / h->N * HS;
    const long lse_values = (long)h->B * heads * h->T * (long)(sizeof(float) / value_bytes());
    void *qkv = value_at((void *)(uintptr_t)att, lse_values);
    return (ulysses_slot){(float *)(uintptr_t)att, qkv, value_at(qkv, all * 3 * Cn)};
}

static void ulysses_forward(cp_hooks *h, void *atty, void *att, const void *qkv, int heads, int HS) {
    const int C = heads * HS, Cn = C / h->N, all = h->N * h->T;
    const ulysses_slot u = ulysses_slot_of(h, att, heads, HS);
    ulysses_to_heads(h, u.qkv, qkv, 3 * C, 3, C);
    int ev = trace_begin(CP_BLOCK_OP, TRACE_COMPUTE, -1, NULL);
    const double t0 = thread_seconds();
    KP->attention_block_forward(u.out, u.lse, u.qkv, value_at(u.qkv, Cn), value_at(u.qkv, 2 * Cn), 3 * Cn, 3 * Cn,
                                h->pos_dev, h->pos_dev, h->B, all, all, heads / h->N, HS);
    h->attention_cpu_seconds += thread_seconds() - t0;
    trace_end(ev);
    ulysses_to_seq(h, atty, C, u.out, 1, C);
    h->scores = attention_unmasked_scores(h->pos_host, all, h->pos_host, all);
}

static void ulysses_backward(cp_hooks *h, void *dqkv, void *datt, const void *datty, const void *att, int heads,
                             int HS) {
    const int C = heads * HS, Cn = C / h->N, all = h->N * h->T;
    const ulysses_slot u = ulysses_slot_of(h, att, heads, HS), d = ulysses_slot_of(h, datt, heads, HS);
    void *dout = d.qkv, *dqkv_h = value_at(d.qkv, (long)h->B * all * Cn);
    ulysses_to_heads(h, dout, datty, C, 1, C);
    mem_zero(dqkv_h, (size_t)h->B * all * 3 * Cn * value_bytes());
    int ev = trace_begin(CP_BLOCK_BWD_OP, TRACE_COMPUTE, -1, NULL);
    const double t0 = thread_seconds();
    KP->attention_block_backward(dqkv_h, value_at(dqkv_h, Cn), value_at(dqkv_h, 2 * Cn), dout, u.out, u.lse, u.qkv,
                                 value_at(u.qkv, Cn), value_at(u.qkv, 2 * Cn), 3 * Cn, 3 * Cn, h->pos_dev, h->pos_dev,
                                 h->B, all, all, heads / h->N, HS);
    h->attention_cpu_seconds += thread_seconds() - t0;
    trace_end(ev);
    ulysses_to_seq(h, dqkv, 3 * C, dqkv_h, 3, C);
}

static void cp_attention_forward(void *ctx, void *atty, void *att, const void *qkv, int B, int T, int heads, int HS) {
    cp_hooks *h = ctx;
    if (h->algo == TH_CP_ULYSSES) {
        ulysses_forward(h, atty, att, qkv, heads, HS);
        return;
    }
    const int C = heads * HS, N = h->N;
    const long block = (long)B * T * 2 * C;
    float *lse = att; /* the layer's att slot holds the log-sum-exp (gpt_part.att_row) */
    h->scores = 0;
    copy_rows(h->kv[0], 2 * C, value_at(qkv, C), 3 * C, (long)B * T, 2 * C);
    if (h->algo == TH_CP_ALLGATHER) {
        comm_allgather(h->cp, h->kv[0], h->kv_all, block * N, COMM_VALUES);
        for (int s = 0; s < N; s++) { /* the ring's order: the forward's bits are the ring's */
            const int src = (h->rank + N - s) % N;
            forward_block(h, atty, lse, qkv, value_at(h->kv_all, src * block), src, s == 0, heads, HS);
        }
        return;
    }
    comm_request r[2] = {{0}, {0}};
    for (int s = 0; s < N; s++) {
        const int src = (h->rank + N - s) % N, cur = s & 1;
        if (s < N - 1) ring_post(h, h->kv[cur], h->kv[cur ^ 1], block, TAG_KV, r); /* the next block, meanwhile */
        forward_block(h, atty, lse, qkv, h->kv[cur], src, s == 0, heads, HS);
        if (s < N - 1) ring_wait(r);
    }
    comm_request_free(&r[0]);
    comm_request_free(&r[1]);
}

/* dq += (this block's share), and the block's dk|dv rows (2C at dkv) += ours. */
static void backward_block(cp_hooks *h, void *dqkv, void *dkv, const void *datty, const void *atty, const float *lse,
                           const void *qkv, const void *kv, int src, int heads, int HS) {
    const int C = heads * HS, T = h->T;
    int ev = trace_begin(CP_BLOCK_BWD_OP, TRACE_COMPUTE, -1, NULL);
    const double t0 = thread_seconds();
    KP->attention_block_backward(dqkv, dkv, value_at(dkv, C), datty, atty, lse, qkv, kv, value_at(kv, C), 3 * C,
                                 2 * C, positions_of(h, h->rank), positions_of(h, src), h->B, T, T, heads, HS);
    h->attention_cpu_seconds += thread_seconds() - t0;
    trace_end(ev);
}

static void cp_attention_backward(void *ctx, void *dqkv, void *datt, const void *datty, const void *qkv,
                                  const void *att, const void *atty, int B, int T, int heads, int HS) {
    cp_hooks *h = ctx;
    if (h->algo == TH_CP_ULYSSES) {
        ulysses_backward(h, dqkv, datt, datty, att, heads, HS);
        return;
    }
    const int C = heads * HS, N = h->N;
    const long block = (long)B * T * 2 * C;
    const size_t vb = value_bytes();
    const float *lse = att;
    void *mine; /* our own block's complete dk|dv */
    copy_rows(h->kv[0], 2 * C, value_at(qkv, C), 3 * C, (long)B * T, 2 * C);
    if (h->algo == TH_CP_ALLGATHER) { /* K and V again (not kept), then dK and dV home by reduce-scatter */
        comm_allgather(h->cp, h->kv[0], h->kv_all, block * N, COMM_VALUES);
        mem_zero(h->dkv_all, (size_t)(block * N) * vb);
        for (int s = 0; s < N; s++) {
            const int src = (h->rank + N - s) % N;
            backward_block(h, dqkv, value_at(h->dkv_all, src * block), datty, atty, lse, qkv,
                           value_at(h->kv_all, src * block), src, heads, HS);
        }
        comm_reduce_scatter(h->cp, h->dkv_all, h->dkv[0], block * N, COMM_VALUES);
        mine = h->dkv[0];
    } else {
        comm_request r[2] = {{0}, {0}}, d[2] = {{0}, {0}};
        mem_zero(h->dkv[0], (size_t)block * vb);
        for (int s = 0; s < N; s++) {
            const int src = (h->rank + N - s) % N, cur = s & 1;
            if (s < N - 1) ring_post(h, h->kv[cur], h->kv[cur ^ 1], block, TAG_KV, r);
            backward_block(h, dqkv, h->dkv[cur], datty, atty, lse, qkv, h->kv[cur], src, heads, HS);
            if (N > 1) { /* dk|dv, with our share, on to the next rank: after N steps, home */
                ring_post(h, h->dkv[cur], h->dkv[cur ^ 1], block, TAG_DKV, d);
                ring_wait(d);
            }
            if (s < N - 1) ring_wait(r);
        }
        comm_request_free(&r[0]);
        comm_request_free(&r[1]);
        comm_request_free(&d[0]);
        comm_request_free(&d[1]);
        mine = h->dkv[N > 1 ? N & 1 : 0];
    }
    /* dqkv was zeroed by the layer: the k and v columns take our dk|dv */
    copy_rows(value_at(dqkv, C), 3 * C, mine, 2 * C, (long)B * T, 2 * C);
}

void cp_hooks_init(cp_hooks *h, const gpt_layout *g, comm *cp, th_cp_algo algo, th_cp_layout layout, int B) {
    memset(h, 0, sizeof *h);
    h->hooks = gpt_default_hooks(g);
    h->hooks.attention_ctx = h; /* CP's slot: the attention core */
    h->hooks.attention_forward = cp_attention_forward;
    h->hooks.attention_backward = cp_attention_backward;
    h->cp = cp;
    h->algo = algo;
    h->N = cp->size;
    h->rank = cp->rank;
    h->B = B;
    h->T = g->cfg.seq / cp->size;
    h->cp_width = g->cfg.d_model;
    const long C = g->cfg.d_model, n = (long)h->N * h->T, block = (long)B * h->T * 2 * C;
    const size_t vb = value_bytes();
    h->pos_host = malloc(sizeof(int) * (size_t)n);
    if (!h->pos_host) die("out of host memory");
    for (int r = 0; r < h->N; r++)
        for (int i = 0; i < h->T; i++)
            h->pos_host[(long)r * h->T + i] = (int)th_cp_position(g->cfg.seq, h->N, r, i, layout);
    h->pos_dev = mem_alloc(sizeof(int) * (size_t)n, MEM_WORKSPACE);
    mem_to_device(h->pos_dev, h->pos_host, sizeof(int) * (size_t)n);
    for (int i = 0; algo != TH_CP_ULYSSES && i < 2; i++) {
        h->kv[i] = mem_alloc((size_t)block * vb, MEM_COMM);
        h->dkv[i] = mem_alloc((size_t)block * vb, MEM_COMM);
    }
    if (algo == TH_CP_ULYSSES) { /* the all-to-all's staging: q|k|v, the widest it carries */
        h->a2a_send = mem_alloc((size_t)(block / 2 * 3) * vb, MEM_COMM);
        h->a2a_recv = mem_alloc((size_t)(block / 2 * 3) * vb, MEM_COMM);
        return; /* attention runs as one block over every position: no merge */
    }
    if (algo == TH_CP_ALLGATHER) {
        h->kv_all = mem_alloc((size_t)(block * h->N) * vb, MEM_COMM);
        h->dkv_all = mem_alloc((size_t)(block * h->N) * vb, MEM_COMM);
    }
    h->out2 = mem_alloc((size_t)B * h->T * C * vb, MEM_WORKSPACE);
    h->lse2 = mem_alloc(sizeof(float) * (size_t)B * h->T * g->cfg.heads, MEM_WORKSPACE);
}

void cp_hooks_free(cp_hooks *h) {
    for (int i = 0; i < 2; i++) {
        mem_free(h->kv[i]);
        mem_free(h->dkv[i]);
    }
    mem_free(h->a2a_send);
    mem_free(h->a2a_recv);
    mem_free(h->kv_all);
    mem_free(h->dkv_all);
    mem_free(h->out2);
    mem_free(h->lse2);
    mem_free(h->pos_dev);
    free(h->pos_host);
    memset(h, 0, sizeof *h);
}

const int *cp_positions(const cp_hooks *h) { return h->pos_host + (long)h->rank * h->T; }

/* per query row and head of the rank's B x heads x T: the log-sum-exp (one
 * fp32), and for Ulysses the head-split q, k, v and output, 4 HS values (B N T
 * rows of 4 C/N = B T rows of 4 C) */
int cp_att_row(th_cp_algo algo, int head_size) {
    const int lse = (int)(sizeof(float) / value_bytes());
    return algo == TH_CP_ULYSSES ? lse + 4 * head_size : lse;
}

double cp_ring_message_seconds(cp_hooks *h, int reps) {
    if (h->algo != TH_CP_RING || h->N < 2) return 0;
    const long block = (long)h->B * h->T * 2 * h->cp_width;
    double t[16];
    if (reps > 16) reps = 16;
    for (int i = -1; i < reps; i++) { /* the first: warm-up */
        comm_request r[2] = {{0}, {0}};
        MPI_Barrier(h->cp->mpi);
        const double t0 = now_seconds();
        ring_post(h, h->kv[0], h->kv[1], block, TAG_KV, r);
        ring_wait(r);
        comm_request_free(&r[0]);
        comm_request_free(&r[1]);
        if (i >= 0) t[i] = now_seconds() - t0;
    }
    for (int i = 1; i < reps; i++) /* the median: insertion sort of a few */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            const double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[reps / 2];
}
