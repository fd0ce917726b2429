/* Which elements of the model a rank holds, and their gather (shard_map.h). */
#include "shard_map.h"
#include "device.h"
#include "mem.h"
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

void ckpt_map_add(ckpt_map *m, long local, long global, long n) {
    if (n <= 0) return;
    ckpt_run *last = m->n ? &m->runs[m->n - 1] : NULL;
    if (last && last->local + last->n == local && last->global + last->n == global) {
        last->n += n; /* one run per contiguous piece, however the lab listed it */
        return;
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 16;
        m->runs = realloc(m->runs, (size_t)m->cap * sizeof *m->runs);
        if (!m->runs) die("out of host memory");
    }
    m->runs[m->n++] = (ckpt_run){local, global, n};
}

void ckpt_view_init(ckpt_view *v, float *params, long params_len, float *adam_m, float *adam_v,
                    long moments_len) {
    *v = (ckpt_view){.params = params, .adam_m = adam_m, .adam_v = adam_v,
                     .params_len = params_len, .moments_len = moments_len};
}

static void hold(ckpt_map *m, long len, long local, long global, long n, const char *what) {
    if (local < 0 || global < 0 || local + n > len)
        die("checkpoint view: %s run [%ld, %ld) lies outside the %ld-element buffer", what, local, local + n, len);
    ckpt_map_add(m, local, global, n);
}
void ckpt_hold_params(ckpt_view *v, long local, long global, long n) {
    hold(&v->params_at, v->params_len, local, global, n, "params");
}
void ckpt_hold_moments(ckpt_view *v, long local, long global, long n) {
    hold(&v->moments_at, v->moments_len, local, global, n, "moments");
}
void ckpt_hold(ckpt_view *v, long local, long global, long n) {
    ckpt_hold_params(v, local, global, n);
    ckpt_hold_moments(v, local, global, n);
}

void ckpt_view_range(ckpt_view *v, float *params, float *adam_m, float *adam_v, long begin, long end) {
    ckpt_view_init(v, params, end - begin, adam_m, adam_v, end - begin);
    ckpt_hold(v, 0, begin, end - begin);
}

void ckpt_view_free(ckpt_view *v) {
    free(v->params_at.runs);
    free(v->moments_at.runs);
    memset(v, 0, sizeof *v);
}

/* Every rank's runs of one map, so each can tell which of its elements a lower
 * rank saves already: an element goes into the file from the LOWEST rank that
 * holds it (replicas are identical; this sends each element once). */
void shard_runs_allgather(const ckpt_map *m, int size, shard_runs *a) {
    _Static_assert(sizeof(ckpt_run) == 3 * sizeof(long), "ckpt_run travels as 3 longs");
    a->count = malloc(sizeof(int) * (size_t)size);
    a->first = malloc(sizeof(int) * (size_t)size);
    int *longs = malloc(sizeof(int) * (size_t)size), *displs = malloc(sizeof(int) * (size_t)size);
    if (!a->count || !a->first || !longs || !displs) die("out of host memory");
    int mine = 3 * m->n, total = 0;
    MPI_Allgather(&mine, 1, MPI_INT, longs, 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) {
        displs[r] = total;
        a->count[r] = longs[r] / 3;
        a->first[r] = total / 3;
        total += longs[r];
    }
    a->runs = malloc(sizeof(long) * (size_t)(total + 1));
    if (!a->runs) die("out of host memory");
    MPI_Allgatherv(m->runs, mine, MPI_LONG, a->runs, longs, displs, MPI_LONG, MPI_COMM_WORLD);
    free(longs);
    free(displs);
}

void shard_runs_free(shard_runs *a) {
    free(a->runs);
    free(a->count);
    free(a->first);
}

/* The local indices of the elements this rank must send: those of its runs
 * that no lower rank holds. Returns how many; *sel is malloc'd. */
long shard_select_mine(const shard_runs *a, int rank, long P, long **sel) {
    unsigned char *covered = calloc((size_t)P + 1, 1);
    long held = 0;
    for (int i = 0; i < a->count[rank]; i++) held += a->runs[a->first[rank] + i].n;
    *sel = malloc(sizeof(long) * (size_t)(held + 1));
    if (!covered || !*sel) die("out of host memory");
    for (int q = 0; q < rank; q++)
        for (int i = 0; i < a->count[q]; i++) {
            const ckpt_run *r = &a->runs[a->first[q] + i];
            memset(covered + r->global, 1, (size_t)r->n);
        }
    long k = 0;
    for (int i = 0; i < a->count[rank]; i++) {
        const ckpt_run *r = &a->runs[a->first[rank] + i];
        if (r->global + r->n > P) die("checkpoint view: global run [%ld, %ld) beyond the model's %ld", r->global,
                                      r->global + r->n, P);
        for (long j = 0; j < r->n; j++)
            if (!covered[r->global + j]) {
                covered[r->global + j] = 1;
                (*sel)[k++] = r->local + j;
            }
    }
    free(covered);
    return k;
}

/* Rank 0: put every rank's packed elements where they belong, replaying the
 * same lowest-rank-wins walk the senders made. sections: 1 (params) or 2 (m, v). */
void shard_unpack(const shard_runs *a, int size, long P, const float *recv, const int *displs,
                   const long *counts, int sections, float *const *full, const char *what) {
    unsigned char *covered = calloc((size_t)P + 1, 1);
    if (!covered) die("out of host memory");
    long filled = 0;
    for (int q = 0; q < size; q++) {
        long k = 0;
        for (int i = 0; i < a->count[q]; i++) {
            const ckpt_run *r = &a->runs[a->first[q] + i];
            for (long j = 0; j < r->n; j++) {
                long g = r->global + j;
                if (covered[g]) continue;
                covered[g] = 1;
                for (int s = 0; s < sections; s++) full[s][g] = recv[displs[q] + s * counts[q] + k];
                k++;
            }
        }
        filled += k;
    }
    free(covered);
    if (filled != P) die("checkpoint: the ranks hold %ld of the %ld %s elements (a lab's view misses some)",
                         filled, P, what);
}

float *shard_host_copy(const float *dev, long n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!h) die("out of host memory saving a checkpoint");
    if (n > 0) mem_to_host(h, dev, (size_t)n * sizeof(float));
    return h;
}

float *ckpt_gather_params(ckpt_view *v, long P) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    shard_runs pa;
    shard_runs_allgather(&v->params_at, size, &pa);
    long *sel, n = shard_select_mine(&pa, rank, P, &sel);
    float *held = shard_host_copy(v->params, v->params_len), *send = malloc(sizeof(float) * (size_t)(n + 1));
    if (!send) die("out of host memory");
    for (long k = 0; k < n; k++) send[k] = held[sel[k]];
    free(held);
    free(sel);
    long *counts = rank == 0 ? malloc(sizeof(long) * (size_t)size) : NULL;
    MPI_Gather(&n, 1, MPI_LONG, counts, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    int *recv_counts = NULL, *displs = NULL;
    float *recv = NULL, *full = NULL;
    if (rank == 0) {
        recv_counts = malloc(sizeof(int) * (size_t)size);
        displs = malloc(sizeof(int) * (size_t)size);
        full = malloc(sizeof(float) * (size_t)(P + 1));
        recv = malloc(sizeof(float) * (size_t)(P + 1));
        if (!recv_counts || !displs || !full || !recv) die("out of host memory");
        long total = 0;
        for (int q = 0; q < size; q++) {
            recv_counts[q] = (int)counts[q];
            displs[q] = (int)total;
            total += counts[q];
        }
    }
    MPI_Gatherv(send, (int)n, MPI_FLOAT, recv, recv_counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        float *params_full[1] = {full};
        shard_unpack(&pa, size, P, recv, displs, counts, 1, params_full, "parameter");
    }
    free(send); free(counts); free(recv_counts); free(displs); free(recv);
    shard_runs_free(&pa);
    return full;
}
