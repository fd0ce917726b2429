#include "dp.h"
#include "device.h"
#include "mem.h"
#include "precision.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void dp_sync_init(dp_grad_sync *s, comm *dp, void *grads, long begin, long end, double bucket_mb) {
    *s = (dp_grad_sync){.dp = dp, .grads = grads, .begin = begin, .end = end,
                        .bucket_elems = (long)(bucket_mb * 1024 * 1024 / value_bytes()),
                        .pending_lo = end, .pending_hi = end};
    if (s->bucket_elems > 0 && dp->backend == COMM_NCCL) {
        s->comm_stream = device_stream_create();
        dp->stream = s->comm_stream;
    }
}

static void reduce_pending(dp_grad_sync *s) {
    long n = s->pending_hi - s->pending_lo;
    if (n <= 0) return;
    /* the bucket's gradients are written by kernels queued on the compute
     * stream: the communication stream must not start before them */
    if (s->comm_stream) device_stream_wait(s->comm_stream, device_compute_stream());
    comm_allreduce(s->dp, value_at(s->grads, s->pending_lo - s->begin), n, COMM_VALUES, 1);
    s->pending_hi = s->pending_lo;
}

void dp_grads_ready(void *vs, long begin, long end) {
    dp_grad_sync *s = vs;
    /* the backward finishes blocks from the top of the layout down, so each
     * ready range extends the pending one downwards */
    if (end != s->pending_lo) die("dp_grads_ready: ranges out of order (%ld..%ld after %ld)", begin, end, s->pending_lo);
    s->pending_lo = begin;
    if (s->pending_hi - s->pending_lo >= s->bucket_elems) reduce_pending(s);
}

void dp_sync_finish(dp_grad_sync *s) {
    if (s->bucket_elems <= 0) s->pending_lo = s->begin; /* no buckets: everything at once */
    reduce_pending(s);
    if (s->comm_stream) device_stream_wait(device_compute_stream(), s->comm_stream);
    s->pending_lo = s->pending_hi = s->end;
}

/* ---- --check-sync ------------------------------------------------------------------- */

/* FNV-1a over the weights' bytes: equal hashes on all ranks <=> identical replicas. */
static uint64_t weights_hash(const float *params, long n) {
    unsigned char *host = malloc((size_t)n * sizeof(float));
    if (!host) die("out of host memory");
    mem_to_host(host, params, (size_t)n * sizeof(float));
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ host[i]) * 1099511628211ULL;
    free(host);
    return h;
}

int dp_replicas_identical(comm *dp, const float *params, long n, int print) {
    uint64_t mine = weights_hash(params, n), *all = malloc(sizeof(uint64_t) * (size_t)dp->size);
    if (!all) die("out of host memory");
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, dp->mpi);
    int same = 1;
    for (int r = 1; r < dp->size; r++) same &= all[r] == all[0];
    if (print && dp->rank == 0) {
        if (same) printf("check-sync: weights bit-identical on all %d ranks (hash %016llx)\n",
                         dp->size, (unsigned long long)all[0]);
        else
            for (int r = 0; r < dp->size; r++)
                printf("check-sync: MISMATCH rank %d hash %016llx\n", r, (unsigned long long)all[r]);
    }
    free(all);
    return same;
}
