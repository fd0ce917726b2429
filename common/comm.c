/* Collectives and point-to-point over MPI or NCCL (see comm.h).
 *
 * Device buffers hold the model's values (precision.h): fp32, or bf16 in a
 * bf16 run, value_bytes() each. bf16 sums stay bf16 on the wire, 2 bytes a
 * value: NCCL's ncclBfloat16, and on MPI a sum operator of our own
 * (bf16_sum below: each pair added in fp32 and rounded to bf16, which is what
 * NCCL does at each step of its ring). Reducing in fp32 instead (widen, add,
 * round once at the end) would round once rather than at every partial sum,
 * at twice the bytes: the ZeRO paper's count, and this code's, is 2.
 *
 * Accounting, the same on both backends:
 *  - calls:   one per call of a kind (comm_sendrecv counts one send and/or one
 *             receive, for the directions it actually carries).
 *  - bytes:   the caller's buffer: n values (n*4 bytes in fp32, n*2 in bf16)
 *             for allreduce, broadcast, send and recv.
 *             For reduce-scatter and all-gather it is the FULL padded buffer,
 *             chunk*size values, not the shard: that is the volume the caller
 *             hands over, and it is the same on every rank.
 *  - seconds: host wall time from entry to return. On MPI that is the whole
 *             operation. On NCCL the work is queued on a stream and the host
 *             returns at once, so it is only the enqueue time; the trace event
 *             (cudaEvents on that stream) shows the GPU's real duration.
 *
 * Each collective below is written out whole, an NCCL branch and an MPI one,
 * though their frames repeat (check, op_begin, stage to host, wait, op_end):
 * what differs is the part a reader comes for (NCCL's in-place rules, MPI's
 * aliasing rules and staging through pinned host memory when ranks share a
 * GPU), and a generic dispatcher would hide exactly that behind callbacks.
 *
 * Zero-size operations (n == 0) are counted and traced but move nothing: every
 * rank of a collective passes the same n, and a send of 0 floats is matched by a
 * receive of 0 floats, so skipping them on all ranks is consistent. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "comm.h"
#include "device.h"
#include "precision.h"
#include "trace.h"
#include "wait.h"
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#ifdef PL_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#define NCCL_OK(call) do { ncclResult_t r_ = (call); \
    if (r_ != ncclSuccess) die("%s: %s (%s)", #call, ncclGetErrorString(r_), \
                               ncclGetLastError(NULL)); } while (0)
#endif

/* The communicators return MPI's errors (comm_init): a failed call writes the
 * flight records of every rank and ends the job with status 3 (flight.h). */
static MPI_Datatype mpi_type(comm_type t);
#define MPI_OK(call) wait_mpi_check((call), #call)


/* Cores this process may run on (its affinity mask, which mpirun may narrow). */
static int usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* A receive that completed: it must have got the n values it posted. MPI
 * completes a receive of fewer without an error, and a step would then go on
 * with stale values in the rest of the buffer. */
static long received_values(const MPI_Status *st, long n, comm_type t, long flight_id) {
    int got = 0;
    MPI_OK(MPI_Get_count(st, mpi_type(t), &got));
    if (got != n) flight_fail_short(flight_id, got, n);
    return got;
}

/* ---- the values' types ---------------------------------------------------------- */

/* MPI's sum of bf16 values: each pair widened to fp32, added, rounded to bf16. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_from_float(float_from_bf16(a[i]) + float_from_bf16(b[i]));
}

static MPI_Datatype mpi_values(void) { return g_precision == PREC_BF16 ? MPI_UINT16_T : MPI_FLOAT; }

static MPI_Op mpi_sum(void) {
    static MPI_Op bf16_op = MPI_OP_NULL;
    if (g_precision != PREC_BF16) return MPI_SUM;
    if (bf16_op == MPI_OP_NULL) MPI_Op_create(bf16_sum, 1, &bf16_op); /* commutative; kept until exit */
    return bf16_op;
}

/* x /= d for n values of host memory (an average after the sum) */
static void divide_values(void *x, long n, int d) {
    if (g_precision == PREC_BF16) {
        uint16_t *h = x;
        for (long i = 0; i < n; i++) h[i] = bf16_from_float(float_from_bf16(h[i]) / (float)d);
    } else {
        float *h = x;
        for (long i = 0; i < n; i++) h[i] /= (float)d;
    }
}

#ifdef PL_HAVE_CUDA
static ncclDataType_t nccl_values(void) { return g_precision == PREC_BF16 ? ncclBfloat16 : ncclFloat; }
#endif

/* ---- the element types (comm_type: the run's values, or a fixed type) ---------- */

static const char *const type_names[COMM_NTYPES] = {"values", "fp32", "int32", "f64"};

static void check_type(comm_type t) {
    if ((unsigned)t >= COMM_NTYPES) die("comm: element type %d is none of comm_type's", (int)t);
}

size_t comm_type_bytes(comm_type t) {
    check_type(t);
    static const size_t bytes[COMM_NTYPES] = {0, 4, 4, 8};
    return t == COMM_VALUES ? value_bytes() : bytes[t];
}

const char *comm_type_name(comm_type t) {
    check_type(t);
    return t == COMM_VALUES ? precision_name(g_precision) : type_names[t];
}

static MPI_Datatype mpi_type(comm_type t) {
    check_type(t);
    const MPI_Datatype fixed[COMM_NTYPES] = {MPI_DATATYPE_NULL, MPI_FLOAT, MPI_INT32_T, MPI_DOUBLE};
    return t == COMM_VALUES ? mpi_values() : fixed[t];
}

/* bf16 values sum by bf16_sum; every other type by MPI's own */
static MPI_Op mpi_sum_of(comm_type t) { return t == COMM_VALUES ? mpi_sum() : MPI_SUM; }

/* an average after the sum: of values, or of fp32 */
static void divide(void *x, long n, int d, comm_type t) {
    if (t == COMM_VALUES) divide_values(x, n, d);
    else if (t == COMM_FP32) for (long i = 0; i < n; i++) ((float *)x)[i] /= (float)d;
    else die("comm_allreduce: an average of %s elements", comm_type_name(t));
}

/* element k of a buffer of type t */
static void *elem_at(const void *buf, long k, comm_type t) { return (char *)(uintptr_t)buf + (size_t)k * comm_type_bytes(t); }

#ifdef PL_HAVE_CUDA
static ncclDataType_t nccl_type(comm_type t) {
    check_type(t);
    const ncclDataType_t fixed[COMM_NTYPES] = {ncclFloat, ncclFloat, ncclInt32, ncclFloat64};
    return t == COMM_VALUES ? nccl_values() : fixed[t];
}
#endif

/* ---- helpers ---------------------------------------------------------------- */

long comm_chunk(long n, int size) { return size > 0 ? (n + size - 1) / size : 0; }

static int mpi_count(long n, const char *what) {
    if (n < 0 || n > INT_MAX) die("%s: %ld elements do not fit an MPI count", what, n);
    return (int)n;
}

static void check_member(const comm *c, const char *what) {
    if (c->size <= 0 || c->mpi == MPI_COMM_NULL)
        die("%s on a communicator this rank is not part of", what);
}

static void check_rank(const comm *c, int r, const char *what) {
    if (r < 0 || r >= c->size) die("%s: rank %d outside a group of %d", what, r, c->size);
}

static int overlaps(const void *a, size_t abytes, const void *b, size_t bbytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return abytes && bbytes && x < y + bbytes && y < x + abytes;
}

/* Stats, the trace event and the flight record of one call (kind FL_NKINDS:
 * the caller records it itself). */
typedef struct { comm *c; int handle; double t0; long flight; } op_scope;

static op_scope op_begin(comm *c, const char *name, flight_kind kind, comm_type t, long count, int root) {
    /* Only NCCL runs on c->stream; MPI's staging copies use the compute stream. */
    void *stream = c->backend == COMM_NCCL ? c->stream : NULL;
    long id = kind < FL_NKINDS ? flight_begin(c, kind, t, count, root, -1, -1, NULL, NULL, NULL) : -1;
    return (op_scope){c, trace_begin(name, TRACE_COMM, -1, stream), now_seconds(), id};
}

#ifdef PL_HAVE_CUDA
static void *nccl_stream_of(const comm *c);
#endif

/* On NCCL the call only queued the work: the flight recorder's thread sees it finish. */
static void flight_done(const comm *c, long id, long received) {
    flight_end(id, received);
#ifdef PL_HAVE_CUDA
    if (c->backend == COMM_NCCL) flight_nccl_queued(id, id, nccl_stream_of(c));
#else
    (void)c;
#endif
}

static void op_end(op_scope s, comm_kind k, double bytes) {
    s.c->stats[k].calls++;
    s.c->stats[k].bytes += bytes;
    s.c->stats[k].seconds += now_seconds() - s.t0;
    flight_done(s.c, s.flight, -1);
    trace_end(s.handle);
}

/* ---- host staging (MPI with device buffers, or aliasing on the CPU) ----------- */

/* Two host buffers, grown as needed and kept. With CUDA they are pinned
 * (cudaMallocHost), so copies run at full speed and asynchronously. They are
 * not counted by mem_alloc, which counts device memory only. */
typedef struct { void *p; size_t bytes; int pinned; } host_buf;
static host_buf stage_buf[2];

static void *stage(int which, size_t bytes) {
    host_buf *b = &stage_buf[which];
#ifdef PL_HAVE_CUDA
    int want_pinned = g_device == DEVICE_CUDA;
#else
    int want_pinned = 0;
#endif
    if (b->p && b->bytes >= bytes && b->pinned == want_pinned) return b->p;
    size_t grown = b->bytes * 2 > bytes ? b->bytes * 2 : bytes;
    if (b->p) {
#ifdef PL_HAVE_CUDA
        if (b->pinned) CUDA_CHECK(cudaFreeHost(b->p));
        else
#endif
            free(b->p);
    }
    b->p = NULL;
#ifdef PL_HAVE_CUDA
    if (want_pinned) CUDA_CHECK(cudaMallocHost(&b->p, grown));
    else
#endif
        b->p = malloc(grown);
    if (!b->p) die("out of host memory for a %zu-byte communication buffer", grown);
    b->bytes = grown;
    b->pinned = want_pinned;
    return b->p;
}

/* Device buffers that MPI must carry go through the staging buffers. */
static int staged(const comm *c) { return c->backend == COMM_MPI && g_device == DEVICE_CUDA; }

#ifdef PL_HAVE_CUDA
static cudaStream_t compute_stream(void) { return (cudaStream_t)device_compute_stream(); }
static cudaStream_t nccl_stream(const comm *c) {
    return c->stream ? (cudaStream_t)c->stream : compute_stream();
}
static void *nccl_stream_of(const comm *c) { return (void *)nccl_stream(c); }
#endif

/* Before MPI touches a staging buffer or device data: the kernels that produce
 * the data, and the last call's copy out of the staging buffer, are done. */
static void stage_enter(void) {
#ifdef PL_HAVE_CUDA
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
#endif
}

static void stage_out(void *host, const void *dev, size_t bytes) {
#ifdef PL_HAVE_CUDA
    CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, compute_stream()));
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
#else
    (void)host; (void)dev; (void)bytes;
#endif
}

/* No synchronisation: later kernels are ordered after the copy on the compute
 * stream, and the next staged call synchronises before reusing the buffer. */
static void stage_in(void *dev, const void *host, size_t bytes) {
#ifdef PL_HAVE_CUDA
    CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, compute_stream()));
#else
    (void)dev; (void)host; (void)bytes;
#endif
}

/* ---- set-up --------------------------------------------------------------------- */

#ifdef PL_HAVE_CUDA
static void nccl_create(comm *c) {
    if (g_device != DEVICE_CUDA) die("the NCCL backend needs the CUDA device");
    ncclUniqueId id;
    if (c->rank == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Request req;
    MPI_OK(MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi, &req));
    polite_wait(&req);
    ncclComm_t nc;
    NCCL_OK(ncclCommInitRank(&nc, c->size, id, c->rank));
    c->nccl = nc;
}
#endif

void comm_init(comm *c, MPI_Comm world, comm_backend backend) {
    memset(c, 0, sizeof *c);
    c->backend = backend;
    MPI_OK(MPI_Comm_dup(world, &c->mpi));
    MPI_OK(MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN));
    MPI_OK(MPI_Comm_rank(c->mpi, &c->rank));
    MPI_OK(MPI_Comm_size(c->mpi, &c->size));
    int on_host, all_spare;
    if (world == MPI_COMM_WORLD) MPI_OK(MPI_Comm_size(comm_world_host(), &on_host));
    else {
        MPI_Comm host;
        MPI_OK(MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &host));
        MPI_OK(MPI_Comm_size(host, &on_host));
        MPI_OK(MPI_Comm_free(&host));
    }
    int mine = on_host <= usable_cores();
    MPI_OK(MPI_Allreduce(&mine, &all_spare, 1, MPI_INT, MPI_MIN, c->mpi));
    const char *mode = getenv("PL_WAIT"); /* spin | polite: override the choice */
    wait_set_spin(mode && !strcmp(mode, "spin") ? 1 : mode && !strcmp(mode, "polite") ? 0 : all_spare);
    if (backend == COMM_NCCL) {
#ifdef PL_HAVE_CUDA
        nccl_create(c);
#else
        die("this build has no NCCL support");
#endif
    }
    flight_group_init(c);
}

/* Once: MPICH 4.0's MPI_Comm_split_type(SHARED) is three splits inside, 250 ms a call at 8 ranks on 2 cores. */
MPI_Comm comm_world_host(void) {
    static MPI_Comm host = MPI_COMM_NULL;
    if (host == MPI_COMM_NULL) {
        int rank;
        MPI_OK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
        MPI_OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host));
    }
    return host;
}

/* A member of a group being formed: its key, then its parent rank. */
static int by_key_then_rank(const void *a, const void *b) {
    const int *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* MPI_Comm_create_group over the members alone: with ranks oversubscribed on few cores (8 on 2 here), MPICH
 * 4.0's MPI_Comm_split, collective over the whole parent, waited 72 ms a call, an all-gather of the colors
 * and this 34 ms, this alone 5 ms (tests/ run hundreds of such set-ups). */
static MPI_Comm create_group(MPI_Comm parent, const int *members, int n) {
    MPI_Group everyone, group;
    MPI_Comm out;
    MPI_OK(MPI_Comm_group(parent, &everyone));
    MPI_OK(MPI_Group_incl(everyone, n, members, &group));
    MPI_OK(MPI_Comm_create_group(parent, group, 0, &out));
    MPI_OK(MPI_Group_free(&group));
    MPI_OK(MPI_Group_free(&everyone));
    return out;
}

/* The parts comm_split and comm_group share: the communicator's numbers, NCCL's split of the parent (color:
 * the group's first parent rank, key: the place in it), the flight recorder's group. */
static void finish_group(const comm *parent, int color, int key, comm *out) {
    if (out->mpi == MPI_COMM_NULL) {
        out->rank = -1;
        out->size = 0;
    } else {
        MPI_OK(MPI_Comm_set_errhandler(out->mpi, MPI_ERRORS_RETURN));
        MPI_OK(MPI_Comm_rank(out->mpi, &out->rank));
        MPI_OK(MPI_Comm_size(out->mpi, &out->size));
    }
#ifdef PL_HAVE_CUDA
    if (parent->backend == COMM_NCCL) {
        ncclComm_t nc = NULL;
        NCCL_OK(ncclCommSplit((ncclComm_t)parent->nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, NULL));
        out->nccl = nc;
    }
#else
    (void)parent, (void)color, (void)key;
#endif
    flight_group_init(out); /* a rank left out too: the groups' ids agree on every rank */
}

void comm_split(const comm *parent, int color, int key, comm *out) {
    memset(out, 0, sizeof *out);
    out->backend = parent->backend;
    out->stream = parent->stream;
    out->mpi = MPI_COMM_NULL;
    int mine[2] = {color, key}, *all = malloc(sizeof(int) * 4 * (size_t)parent->size);
    if (!all) die("out of host memory");
    MPI_OK(MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, parent->mpi));
    if (color >= 0) { /* MPI_Comm_split's order: by key, ties by parent rank */
        int (*members)[2] = (int (*)[2])(all + 2 * parent->size), n = 0;
        for (int r = 0; r < parent->size; r++)
            if (all[2 * r] == color) {
                members[n][0] = all[2 * r + 1];
                members[n++][1] = r;
            }
        qsort(members, (size_t)n, sizeof *members, by_key_then_rank);
        for (int i = 0; i < n; i++) all[i] = members[i][1]; /* the colors and keys are read: reuse their room */
        out->mpi = create_group(parent->mpi, all, n);
    }
    free(all);
    finish_group(parent, color, key, out);
}

void comm_group(const comm *parent, const int *members, int n, comm *out) {
    memset(out, 0, sizeof *out);
    out->backend = parent->backend;
    out->stream = parent->stream;
    int place = 0;
    while (place < n && members[place] != parent->rank) place++;
    if (place == n) die("comm_group: rank %d is not among the %d members given", parent->rank, n);
    out->mpi = create_group(parent->mpi, members, n);
    finish_group(parent, members[0], place, out);
}

void comm_free(comm *c) {
    flight_group_free(c);
#ifdef PL_HAVE_CUDA
    if (c->nccl) NCCL_OK(ncclCommDestroy((ncclComm_t)c->nccl));
#endif
    c->nccl = NULL;
    if (c->mpi != MPI_COMM_NULL) MPI_OK(MPI_Comm_free(&c->mpi));
    c->mpi = MPI_COMM_NULL;
    c->rank = -1;
    c->size = 0;
}

void comm_reset_stats(comm *c) { memset(c->stats, 0, sizeof c->stats); }

comm_quiet comm_quiet_begin(comm *c) {
    comm_quiet q = {.c = c};
    if (c) memcpy(q.kept, c->stats, sizeof q.kept);
    return q;
}

void comm_quiet_end(const comm_quiet *q) {
    if (q->c) memcpy(q->c->stats, q->kept, sizeof q->kept);
}

/* ---- collectives ---------------------------------------------------------------- */

void comm_allreduce(comm *c, void *buf, long n, comm_type t, int average) {
    check_member(c, "comm_allreduce");
    const flight_fault fault = flight_fault_here(c, FL_ALLREDUCE, t, n);
    if (fault == FAULT_SKIP) return;
    n -= fault == FAULT_COUNT;
    flight_check(c, FL_ALLREDUCE, t, n, -1, NULL, NULL);
    op_scope s = op_begin(c, comm_kind_names[COLL_ALLREDUCE], FL_ALLREDUCE, t, n, -1);
    size_t bytes = (size_t)n * comm_type_bytes(t);
    if (n > 0) {
#ifdef PL_HAVE_CUDA
        if (c->backend == COMM_NCCL) {
            NCCL_OK(ncclAllReduce(buf, buf, (size_t)n, nccl_type(t), average ? ncclAvg : ncclSum,
                                  (ncclComm_t)c->nccl, nccl_stream(c)));
        } else
#endif
        {
            void *h = buf;
            if (staged(c)) {
                stage_enter();
                h = stage(0, bytes);
                stage_out(h, buf, bytes);
            }
            MPI_Request req;
            MPI_OK(MPI_Iallreduce(MPI_IN_PLACE, h, mpi_count(n, "comm_allreduce"), mpi_type(t),
                                  mpi_sum_of(t), c->mpi, &req));
            polite_wait(&req);
            if (average && c->size > 1) divide(h, n, c->size, t);
            if (staged(c)) stage_in(buf, h, bytes);
        }
    }
    op_end(s, COLL_ALLREDUCE, (double)bytes);
}

void comm_reduce_scatter(comm *c, const void *full, void *shard, long n, comm_type t) {
    check_member(c, "comm_reduce_scatter");
    const flight_fault fault = flight_fault_here(c, FL_REDUCE_SCATTER, t, n);
    if (fault == FAULT_SKIP) return;
    long chunk = comm_chunk(n, c->size) - (fault == FAULT_COUNT);
    flight_check(c, FL_REDUCE_SCATTER, t, chunk * c->size, -1, NULL, NULL);
    op_scope s = op_begin(c, comm_kind_names[COLL_REDUCE_SCATTER], FL_REDUCE_SCATTER, t, chunk * c->size, -1);
    size_t shard_bytes = (size_t)chunk * comm_type_bytes(t);
    size_t full_bytes = shard_bytes * (size_t)c->size;
    if (chunk > 0) {
#ifdef PL_HAVE_CUDA
        if (c->backend == COMM_NCCL) {
            /* NCCL's in-place form is shard == full + rank*chunk; any other overlap
             * would be a race on the GPU. */
            if (shard != elem_at(full, (long)c->rank * chunk, t) &&
                overlaps(shard, shard_bytes, full, full_bytes))
                die("comm_reduce_scatter: shard overlaps full other than at rank*chunk");
            NCCL_OK(ncclReduceScatter(full, shard, (size_t)chunk, nccl_type(t), ncclSum,
                                      (ncclComm_t)c->nccl, nccl_stream(c)));
        } else
#endif
        {
            const void *in = full;
            void *out = shard;
            if (staged(c)) {
                stage_enter();
                void *h = stage(0, full_bytes);
                stage_out(h, full, full_bytes);
                in = h;
                out = stage(1, shard_bytes);
            } else if (overlaps(shard, shard_bytes, full, full_bytes)) {
                /* MPI forbids aliasing, and MPI_IN_PLACE would leave the result at
                 * full[0..chunk), overwriting rank 0's part of the caller's input. */
                out = stage(1, shard_bytes);
            }
            MPI_Request req;
            MPI_OK(MPI_Ireduce_scatter_block(in, out, mpi_count(chunk, "comm_reduce_scatter"),
                                             mpi_type(t), mpi_sum_of(t), c->mpi, &req));
            polite_wait(&req);
            if (staged(c)) stage_in(shard, out, shard_bytes);
            else if (out != shard) memcpy(shard, out, shard_bytes);
        }
    }
    op_end(s, COLL_REDUCE_SCATTER, (double)full_bytes);
}

void comm_allgather(comm *c, const void *shard, void *full, long n, comm_type t) {
    check_member(c, "comm_allgather");
    const flight_fault fault = flight_fault_here(c, FL_ALLGATHER, t, n);
    if (fault == FAULT_SKIP) return;
    long chunk = comm_chunk(n, c->size) - (fault == FAULT_COUNT);
    flight_check(c, FL_ALLGATHER, t, chunk * c->size, -1, NULL, NULL);
    op_scope s = op_begin(c, comm_kind_names[COLL_ALLGATHER], FL_ALLGATHER, t, chunk * c->size, -1);
    size_t shard_bytes = (size_t)chunk * comm_type_bytes(t);
    size_t full_bytes = shard_bytes * (size_t)c->size;
    if (chunk > 0) {
        void *mine = elem_at(full, (long)c->rank * chunk, t); /* where this rank's shard goes */
#ifdef PL_HAVE_CUDA
        if (c->backend == COMM_NCCL) {
            /* NCCL's in-place form is shard == full + rank*chunk. */
            if (shard != mine && overlaps(shard, shard_bytes, full, full_bytes))
                die("comm_allgather: shard overlaps full other than at rank*chunk");
            NCCL_OK(ncclAllGather(shard, full, (size_t)chunk, nccl_type(t),
                                  (ncclComm_t)c->nccl, nccl_stream(c)));
        } else
#endif
        {
            /* Put the own shard in place and gather in place: that works whether
             * or not the caller's shard already lives inside full. */
            void *h = full;
            if (staged(c)) {
                stage_enter();
                h = stage(0, full_bytes);
                stage_out(elem_at(h, (long)c->rank * chunk, t), shard, shard_bytes);
            } else if (shard != mine) {
                memmove(mine, shard, shard_bytes);
            }
            MPI_Request req;
            MPI_OK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h,
                                  mpi_count(chunk, "comm_allgather"), mpi_type(t), c->mpi, &req));
            polite_wait(&req);
            if (staged(c)) stage_in(full, h, full_bytes);
        }
    }
    op_end(s, COLL_ALLGATHER, (double)full_bytes);
}

void comm_broadcast(comm *c, void *buf, long n, comm_type t, int root) {
    check_member(c, "comm_broadcast");
    check_rank(c, root, "comm_broadcast root");
    const flight_fault fault = flight_fault_here(c, FL_BROADCAST, t, n);
    if (fault == FAULT_SKIP) return;
    n -= fault == FAULT_COUNT;
    flight_check(c, FL_BROADCAST, t, n, root, NULL, NULL);
    op_scope s = op_begin(c, comm_kind_names[COLL_BROADCAST], FL_BROADCAST, t, n, root);
    size_t bytes = (size_t)n * comm_type_bytes(t);
    if (n > 0) {
#ifdef PL_HAVE_CUDA
        if (c->backend == COMM_NCCL) {
            NCCL_OK(ncclBroadcast(buf, buf, (size_t)n, nccl_type(t), root,
                                  (ncclComm_t)c->nccl, nccl_stream(c)));
        } else
#endif
        {
            void *h = buf;
            if (staged(c)) {
                stage_enter();
                h = stage(0, bytes);
                if (c->rank == root) stage_out(h, buf, bytes);
            }
            MPI_Request req;
            MPI_OK(MPI_Ibcast(h, mpi_count(n, "comm_broadcast"), mpi_type(t), root, c->mpi, &req));
            polite_wait(&req);
            if (staged(c) && c->rank != root) stage_in(buf, h, bytes);
        }
    }
    op_end(s, COLL_BROADCAST, (double)bytes);
}

/* ---- all-to-all ------------------------------------------------------------------ */

/* Both forms in one: counts and offsets per rank, in values. MPI: one
 * MPI_Ialltoall(v) (every rank calls it, even with nothing to send, as a
 * collective must be); with device buffers the send side is staged as one
 * copy of its extent and each received block copied back to its place, so
 * recv's gaps between blocks are left alone. NCCL: a send and a receive per
 * peer inside one group (the own block included, as nccl-tests does), the
 * zero-count ones skipped on both sides alike. */
static void alltoall_blocks(comm *c, const char *name, const void *send, const long *send_counts,
                            const long *send_offsets, void *recv, const long *recv_counts,
                            const long *recv_offsets, long even_n, comm_type t) {
    check_member(c, name);
    const flight_kind kind = even_n >= 0 ? FL_ALLTOALL : FL_ALLTOALLV;
    const flight_fault fault = flight_fault_here(c, kind, t, even_n);
    if (fault == FAULT_SKIP) return;
    const int p = c->size;
    long *off = malloc(sizeof(long) * 3 * (size_t)p);
    if (!off) die("out of host memory");
    long *soff = off, *roff = off + p, *sent = off + 2 * p, send_end = 0, recv_end = 0, send_total = 0;
    for (int j = 0; j < p; j++) {
        if (send_counts[j] < 0 || recv_counts[j] < 0) die("%s: a negative count", name);
        soff[j] = send_offsets ? send_offsets[j] : send_end;
        roff[j] = recv_offsets ? recv_offsets[j] : recv_end;
        if (soff[j] < 0 || roff[j] < 0) die("%s: a negative offset", name);
        if (soff[j] + send_counts[j] > send_end) send_end = soff[j] + send_counts[j];
        if (roff[j] + recv_counts[j] > recv_end) recv_end = roff[j] + recv_counts[j];
        send_total += send_counts[j];
        sent[j] = send_counts[j];
    }
    if (fault == FAULT_A2A) {
        /* one value more to a peer whose block has a value after it in send (the
         * send is only read: nothing outside it is touched), else one fewer */
        int changed = 0;
        for (int j = 0; j < p && !changed; j++)
            if (j != c->rank && soff[j] + sent[j] < send_end) sent[j]++, send_total++, changed = 1;
        for (int j = 0; j < p && !changed; j++)
            if (j != c->rank && sent[j] > 0) sent[j]--, send_total--, changed = 1;
        if (changed) even_n = -1; /* the counts differ now: the v-form */
    }
    const size_t vb = comm_type_bytes(t), send_bytes = (size_t)send_end * vb, recv_bytes = (size_t)recv_end * vb;
    if (overlaps(send, send_bytes, recv, recv_bytes)) die("%s: send and recv overlap", name);
    flight_check(c, kind, t, send_total, -1, sent, recv_counts);
    /* recorded before the trace event opens: its label is the caller's event, not this call's */
    const long flight_id = flight_begin(c, kind, t, send_total, -1, -1, -1, sent, recv_counts, NULL);
    op_scope s = op_begin(c, name, FL_NKINDS, t, 0, -1);
    s.flight = flight_id;
#ifdef PL_HAVE_CUDA
    if (c->backend == COMM_NCCL) {
        ncclComm_t nc = (ncclComm_t)c->nccl;
        cudaStream_t st = nccl_stream(c);
        NCCL_OK(ncclGroupStart());
        for (int j = 0; j < p; j++) {
            if (sent[j] > 0)
                NCCL_OK(ncclSend(elem_at(send, soff[j], t), (size_t)sent[j], nccl_type(t), j, nc, st));
            if (recv_counts[j] > 0)
                NCCL_OK(ncclRecv(elem_at(recv, roff[j], t), (size_t)recv_counts[j], nccl_type(t), j, nc, st));
        }
        NCCL_OK(ncclGroupEnd());
    } else
#endif
    if (even_n == 0) {
        /* every rank passes the same n: all skip alike */
    } else {
        const void *hs = send;
        void *hr = recv;
        if (staged(c)) {
            stage_enter();
            void *h = stage(0, send_bytes ? send_bytes : vb); /* a rank may send nothing */
            stage_out(h, send, send_bytes);
            hs = h;
            hr = stage(1, recv_bytes ? recv_bytes : vb);
        }
        MPI_Request req;
        if (even_n > 0) {
            int n = mpi_count(even_n, name);
            MPI_OK(MPI_Ialltoall(hs, n, mpi_type(t), hr, n, mpi_type(t), c->mpi, &req));
            polite_wait(&req);
        } else {
            int *ints = malloc(sizeof(int) * 4 * (size_t)p);
            if (!ints) die("out of host memory");
            for (int j = 0; j < p; j++) {
                ints[j] = mpi_count(sent[j], name);
                ints[p + j] = mpi_count(soff[j], name);
                ints[2 * p + j] = mpi_count(recv_counts[j], name);
                ints[3 * p + j] = mpi_count(roff[j], name);
            }
            MPI_OK(MPI_Ialltoallv(hs, ints, ints + p, mpi_type(t), hr, ints + 2 * p, ints + 3 * p, mpi_type(t),
                                  c->mpi, &req));
            polite_wait(&req);
            free(ints);
        }
        if (staged(c))
            for (int j = 0; j < p; j++)
                if (recv_counts[j] > 0)
                    stage_in(elem_at(recv, roff[j], t), elem_at(hr, roff[j], t), (size_t)recv_counts[j] * vb);
    }
    free(off);
    op_end(s, COLL_ALLTOALL, (double)send_total * (double)vb);
}

void comm_alltoall(comm *c, const void *send, void *recv, long n, comm_type t) {
    if (n < 0) die("comm_alltoall: %ld values", n);
    long *counts = malloc(sizeof(long) * (size_t)(c->size > 0 ? c->size : 1));
    if (!counts) die("out of host memory");
    for (int j = 0; j < c->size; j++) counts[j] = n;
    alltoall_blocks(c, "alltoall", send, counts, NULL, recv, counts, NULL, n, t);
    free(counts);
}

void comm_alltoallv(comm *c, const void *send, const long *send_counts, const long *send_offsets,
                    void *recv, const long *recv_counts, const long *recv_offsets, comm_type t) {
    alltoall_blocks(c, "alltoallv", send, send_counts, send_offsets, recv, recv_counts, recv_offsets, -1, t);
}

/* ---- point-to-point ----------------------------------------------------------- */

/* Both directions are posted before either is waited on, so neighbours that
 * exchange (a ring, a pipeline's forward and backward edges) cannot deadlock.
 * count_send / count_recv say which kinds this call is counted as. */
static void p2p(comm *c, const void *send, long send_n, int dst, void *recv, long recv_n,
                int src, comm_type t, int count_send, int count_recv) {
    check_member(c, "comm_sendrecv");
    int do_send = send_n > 0 && dst >= 0, do_recv = recv_n > 0 && src >= 0;
    if (do_send) check_rank(c, dst, "comm_send destination");
    if (do_recv) check_rank(c, src, "comm_recv source");
    const char *name = count_send && count_recv ? "sendrecv"
                     : count_send ? comm_kind_names[COLL_SEND] : comm_kind_names[COLL_RECV];
    /* the test-only faults (flight.h) touch the send when there is one */
    const flight_fault fault = do_send || do_recv ? flight_fault_here(c, do_send ? FL_SEND : FL_RECV, t,
                                                                      do_send ? send_n : recv_n) : FAULT_NONE;
    int send_tag = 0, recv_tag = 0;
    send_n -= fault == FAULT_COUNT;
    if (fault == FAULT_PEER) *(do_send ? &dst : &src) = ((do_send ? dst : src) + 1) % c->size;
    if (fault == FAULT_TAG) *(do_send ? &send_tag : &recv_tag) = 1000;
    const long send_id = do_send ? flight_begin(c, FL_SEND, t, send_n, -1, dst, send_tag, NULL, NULL, NULL) : -1;
    const long recv_id = do_recv ? flight_begin(c, FL_RECV, t, recv_n, -1, src, recv_tag, NULL, NULL, NULL) : -1;
    op_scope s = op_begin(c, name, FL_NKINDS, t, 0, -1);
    long received = -1;
    size_t send_bytes = do_send ? (size_t)send_n * comm_type_bytes(t) : 0;
    size_t recv_bytes = do_recv ? (size_t)recv_n * comm_type_bytes(t) : 0;
    if (do_send || do_recv) {
#ifdef PL_HAVE_CUDA
        if (c->backend == COMM_NCCL) {
            ncclComm_t nc = (ncclComm_t)c->nccl;
            cudaStream_t st = nccl_stream(c);
            NCCL_OK(ncclGroupStart());
            if (do_send) NCCL_OK(ncclSend(send, (size_t)send_n, nccl_type(t), dst, nc, st));
            if (do_recv) NCCL_OK(ncclRecv(recv, (size_t)recv_n, nccl_type(t), src, nc, st));
            NCCL_OK(ncclGroupEnd());
        } else
#endif
        {
            const void *hs = send;
            void *hr = recv;
            if (staged(c)) {
                stage_enter();
                if (do_send) {
                    void *h = stage(0, send_bytes);
                    stage_out(h, send, send_bytes);
                    hs = h;
                }
                if (do_recv) hr = stage(1, recv_bytes);
            }
            MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
            MPI_Status st[2];
            if (do_recv)
                MPI_OK(MPI_Irecv(hr, mpi_count(recv_n, "comm_recv"), mpi_type(t), src, recv_tag, c->mpi,
                                 &req[1]));
            if (do_send)
                MPI_OK(MPI_Isend(hs, mpi_count(send_n, "comm_send"), mpi_type(t), dst, send_tag, c->mpi,
                                 &req[0]));
            polite_waitall(2, req, st);
            if (do_recv) received = received_values(&st[1], recv_n, t, recv_id);
            if (staged(c) && do_recv) stage_in(recv, hr, recv_bytes);
        }
    }
    /* One call, two kinds: its time goes to the receive (what the rank waits
     * for) when there is one, so seconds are not counted twice. */
    double dt = now_seconds() - s.t0;
    if (count_send) {
        c->stats[COLL_SEND].calls++;
        c->stats[COLL_SEND].bytes += (double)send_bytes;
        if (!count_recv) c->stats[COLL_SEND].seconds += dt;
    }
    if (count_recv) {
        c->stats[COLL_RECV].calls++;
        c->stats[COLL_RECV].bytes += (double)recv_bytes;
        c->stats[COLL_RECV].seconds += dt;
    }
    flight_done(c, send_id, -1);
    flight_done(c, recv_id, received);
    trace_end(s.handle);
}

void comm_sendrecv(comm *c, const void *send, long send_n, int dst,
                   void *recv, long recv_n, int src, comm_type t) {
    int do_send = send_n > 0 && dst >= 0, do_recv = recv_n > 0 && src >= 0;
    if (!do_send && !do_recv) return; /* nothing asked: nothing counted */
    p2p(c, send, send_n, dst, recv, recv_n, src, t, do_send, do_recv);
}

void comm_send(comm *c, const void *buf, long n, comm_type t, int dst) {
    p2p(c, buf, n, dst, NULL, 0, -1, t, 1, 0);
}

void comm_recv(comm *c, void *buf, long n, comm_type t, int src) {
    p2p(c, NULL, 0, -1, buf, n, src, t, 0, 1);
}

/* ---- nonblocking point-to-point ------------------------------------------------ */

/* NCCL launches a group's operations at its end: the flight recorder marks
 * them queued then (flight_nccl_queued), not when they are posted. */
#ifdef PL_HAVE_CUDA
static int nccl_group_depth;
static long nccl_group_first = -1, nccl_group_last = -1;
#endif

void comm_group_begin(comm *c) {
#ifdef PL_HAVE_CUDA
    if (c->backend == COMM_NCCL) {
        NCCL_OK(ncclGroupStart());
        if (nccl_group_depth++ == 0) nccl_group_first = nccl_group_last = -1;
    }
#else
    (void)c;
#endif
}

void comm_group_end(comm *c) {
#ifdef PL_HAVE_CUDA
    if (c->backend == COMM_NCCL) {
        NCCL_OK(ncclGroupEnd());
        if (--nccl_group_depth == 0 && nccl_group_first >= 0)
            flight_nccl_queued(nccl_group_first, nccl_group_last, nccl_stream_of(c));
    }
#else
    (void)c;
#endif
}

/* The request's own staging buffer, grown as needed (pinned with CUDA). */
static void *request_host(comm_request *r, size_t bytes) {
    if (r->host && r->host_cap >= bytes) return r->host;
    comm_request_free(r);
#ifdef PL_HAVE_CUDA
    CUDA_CHECK(cudaMallocHost(&r->host, bytes));
    r->host_pinned = 1;
#else
    r->host = malloc(bytes);
#endif
    if (!r->host) die("out of host memory for a %zu-byte message", bytes);
    r->host_cap = bytes;
    return r->host;
}

static void post(comm *c, const void *send, void *recv, long n, comm_type t, int peer, int tag, comm_request *r) {
    int is_recv = recv != NULL;
    check_member(c, is_recv ? "comm_irecv" : "comm_isend");
    check_rank(c, peer, is_recv ? "comm_irecv source" : "comm_isend destination");
    if (r->active) die("comm_%s: the request is still in use", is_recv ? "irecv" : "isend");
    if (tag <= 0) die("comm_%s: tag %d (0 belongs to the blocking calls)", is_recv ? "irecv" : "isend", tag);
    const flight_fault fault = flight_fault_here(c, is_recv ? FL_IRECV : FL_ISEND, t, n);
    n -= fault == FAULT_COUNT;
    if (fault == FAULT_PEER) peer = (peer + 1) % c->size;
    if (fault == FAULT_TAG) tag += 1000;
    const long id = flight_begin(c, is_recv ? FL_IRECV : FL_ISEND, t, n, -1, peer, tag, NULL, NULL, &r->posted);
    op_scope sc = op_begin(c, is_recv ? "irecv" : "isend", FL_NKINDS, t, 0, -1);
    r->n = n;
    r->type = t;
    size_t bytes = (size_t)n * comm_type_bytes(t);
    r->c = c;
    r->is_recv = is_recv;
    r->mpi = MPI_REQUEST_NULL;
    r->dev = NULL;
    r->bytes = bytes;
    r->active = n > 0;
    if (n > 0) {
#ifdef PL_HAVE_CUDA
        if (c->backend == COMM_NCCL) {
            ncclComm_t nc = (ncclComm_t)c->nccl;
            if (is_recv) NCCL_OK(ncclRecv(recv, (size_t)n, nccl_type(t), peer, nc, nccl_stream(c)));
            else NCCL_OK(ncclSend(send, (size_t)n, nccl_type(t), peer, nc, nccl_stream(c)));
            if (nccl_group_depth == 0) flight_nccl_queued(id, id, nccl_stream_of(c));
            else {
                if (nccl_group_first < 0) nccl_group_first = id;
                nccl_group_last = id;
            }
        } else
#endif
        {
            int count = mpi_count(n, is_recv ? "comm_irecv" : "comm_isend");
            if (staged(c)) {
                void *h = request_host(r, bytes);
                if (is_recv) {
                    r->dev = recv;
                    MPI_OK(MPI_Irecv(h, count, mpi_type(t), peer, tag, c->mpi, &r->mpi));
                } else {
                    stage_enter();
                    stage_out(h, send, bytes);
                    MPI_OK(MPI_Isend(h, count, mpi_type(t), peer, tag, c->mpi, &r->mpi));
                }
            } else if (is_recv) {
                MPI_OK(MPI_Irecv(recv, count, mpi_type(t), peer, tag, c->mpi, &r->mpi));
            } else {
                MPI_OK(MPI_Isend(send, count, mpi_type(t), peer, tag, c->mpi, &r->mpi));
            }
        }
    } else {
        flight_end(id, 0); /* nothing to move: both sides skip it alike */
    }
    op_end(sc, is_recv ? COLL_RECV : COLL_SEND, (double)bytes);
}

void comm_isend(comm *c, const void *buf, long n, comm_type t, int dst, int tag, comm_request *r) {
    post(c, buf, NULL, n, t, dst, tag, r);
}

void comm_irecv(comm *c, void *buf, long n, comm_type t, int src, int tag, comm_request *r) {
    if (n > 0 && !buf) die("comm_irecv: no buffer");
    post(c, NULL, buf, n, t, src, tag, r);
}

/* A completed request: a staged receive's data goes to the device. */
static void finish(comm_request *r) {
    r->active = 0;
    if (r->is_recv && r->dev) {
        stage_in(r->dev, r->host, r->bytes);
        stage_enter(); /* the host buffer may be posted again at once */
    }
}

int comm_test(comm_request *r) {
    if (!r->active) return 1;
    if (r->mpi == MPI_REQUEST_NULL) { /* NCCL: ordered on its stream */
        finish(r);
        return 1;
    }
    int done = 0;
    MPI_Status st;
    MPI_OK(MPI_Test(&r->mpi, &done, &st));
    if (done) {
        flight_end(r->posted.id, r->is_recv ? received_values(&st, r->n, r->type, r->posted.id) : -1);
        finish(r);
    }
    return done;
}

void comm_wait(comm_request *r) {
    if (!r->active) return;
    comm *c = r->c;
    if (r->mpi != MPI_REQUEST_NULL) flight_wait_begin(&r->posted); /* before the trace event: its label */
    op_scope sc = op_begin(c, "wait", FL_NKINDS, r->type, 0, -1);
    if (r->mpi != MPI_REQUEST_NULL) {
        MPI_Status st;
        polite_waitall(1, &r->mpi, &st);
        flight_wait_end();
        flight_end(r->posted.id, r->is_recv ? received_values(&st, r->n, r->type, r->posted.id) : -1);
    }
#ifdef PL_HAVE_CUDA
    else if (c->stream && c->stream != device_compute_stream())
        device_stream_wait(device_compute_stream(), c->stream);
#endif
    finish(r);
    /* the time, not the call: the post counted the call and the bytes */
    c->stats[r->is_recv ? COLL_RECV : COLL_SEND].seconds += now_seconds() - sc.t0;
    trace_end(sc.handle);
}

void comm_request_free(comm_request *r) {
    if (r->active) die("comm_request_free: the request is still in use");
#ifdef PL_HAVE_CUDA
    if (r->host && r->host_pinned) CUDA_CHECK(cudaFreeHost(r->host));
    else
#endif
        free(r->host);
    r->host = NULL;
    r->host_cap = 0;
    r->host_pinned = 0;
}

void comm_barrier(comm *c) {
    check_member(c, "comm_barrier");
    if (flight_fault_here(c, FL_BARRIER, COMM_VALUES, 0) == FAULT_SKIP) return;
    flight_check(c, FL_BARRIER, COMM_VALUES, 0, -1, NULL, NULL);
    op_scope s = op_begin(c, comm_kind_names[COLL_BARRIER], FL_BARRIER, COMM_VALUES, 0, -1);
#ifdef PL_HAVE_CUDA
    /* A barrier means "everything before it is done", device work included. */
    if (g_device == DEVICE_CUDA) {
        CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
        if (c->backend == COMM_NCCL && c->stream)
            CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)c->stream));
    }
#endif
    MPI_Request req;
    MPI_OK(MPI_Ibarrier(c->mpi, &req));
    polite_wait(&req);
    op_end(s, COLL_BARRIER, 0);
}

/* Host bookkeeping (the step's loss, a norm): not counted in the stats or the
 * trace, which describe the training traffic the lessons compare with formulas. */
void comm_allreduce_host(comm *c, double *x, int n) {
    check_member(c, "comm_allreduce_host");
    if (c->size == 1 || n == 0) return;
    const flight_fault fault = flight_fault_here(c, FL_ALLREDUCE_HOST, COMM_F64, n);
    if (fault == FAULT_SKIP) return;
    n -= fault == FAULT_COUNT;
    flight_check(c, FL_ALLREDUCE_HOST, COMM_F64, n, -1, NULL, NULL);
    const long id = flight_begin(c, FL_ALLREDUCE_HOST, COMM_F64, n, -1, -1, -1, NULL, NULL, NULL);
    MPI_Request req;
    MPI_OK(MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, c->mpi, &req));
    polite_wait(&req);
    flight_end(id, -1); /* on the host: done on NCCL too */
}
