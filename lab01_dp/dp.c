#include "dp.h"
#include "device.h"

void dp_sync_init(dp_grad_sync *s, comm *dp, float *grads, long begin, long end, double bucket_mb) {
    *s = (dp_grad_sync){.dp = dp, .grads = grads, .begin = begin, .end = end,
                        .bucket_elems = (long)(bucket_mb * 1024 * 1024 / sizeof(float)),
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
    comm_allreduce(s->dp, s->grads + (s->pending_lo - s->begin), n, 1);
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
