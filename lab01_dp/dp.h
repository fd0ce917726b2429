/* Data parallelism's one communication step: make every rank's gradient the
 * average of all ranks' gradients, so every rank takes the same optimizer step
 * and the replicas never drift apart.
 *
 * With buckets, gradients are all-reduced in pieces of about bucket_mb MiB as
 * soon as the backward pass has finished them (the head's first, the
 * embedding's last), instead of in one piece after the backward. On a GPU with
 * NCCL the pieces run on a second stream, overlapping the rest of the backward. */
#ifndef LAB01_DP_H
#define LAB01_DP_H
#include "comm.h"

typedef struct dp_grad_sync {
    comm *dp;            /* the data-parallel group */
    void *grads;         /* gradient buffer (the model's values); element 0 is model offset `begin` */
    long begin, end;     /* the range this buffer covers */
    long bucket_elems;   /* 0: one all-reduce after the backward */
    long pending_lo;     /* [pending_lo, pending_hi) is ready but not yet reduced */
    long pending_hi;
    void *comm_stream;   /* CUDA + NCCL: the stream buckets are reduced on */
} dp_grad_sync;

void dp_sync_init(dp_grad_sync *s, comm *dp, void *grads, long begin, long end, double bucket_mb);
/* The gpt_backward hook (pass NULL for it when not bucketing). */
void dp_grads_ready(void *sync, long begin, long end);
/* After the backward: reduce what is left and wait until every bucket is done. */
void dp_sync_finish(dp_grad_sync *s);

/* --check-sync: 1 if every rank of dp holds bit-identical params[0, n) (device
 * memory, fp32: the weights the optimizer updates, of which a bf16 run's
 * values are a rounding; a hash of each rank's bytes, compared). With `print`, rank 0 of dp
 * prints the hash, or every rank's on a mismatch. Collective over dp. */
int dp_replicas_identical(comm *dp, const float *params, long n, int print);

#endif
