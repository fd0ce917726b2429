/* The course's kinds: one enum per concept that common/ runs, theory/ predicts
 * and the labs print (collectives, memory categories, recomputation, precision),
 * with their names and the one rule a kind of collective carries.
 *
 * Why here, and alone: common/ counts these kinds (comm.h, mem.h, model.h,
 * precision.h) and theory/ computes with them, but theory/ may not include the
 * rest of common/ (pure numbers, docs/architecture.md). This header is the one
 * both include: it includes nothing, holds no state and calls nothing, so
 * theory/ stays free of MPI, devices and buffers. Before it, theory.h kept a
 * copy of each enum and the labs cast between the two. */
#ifndef PL_KINDS_H
#define PL_KINDS_H

/* A table of names a file may not read: defined in every file that includes
 * this header, without a warning where unused. */
#define PL_NAMES static const char *const __attribute__((unused))

/* Collectives and point-to-point, as comm.h counts them (calls, payload bytes,
 * seconds) and the record lists them. */
typedef enum {
    COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALLGATHER, COLL_BROADCAST,
    COLL_SEND, COLL_RECV, COLL_BARRIER, COLL_ALLTOALL,
    COLL_NKINDS
} comm_kind;
PL_NAMES comm_kind_names[COLL_NKINDS] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                         "send", "recv", "barrier", "alltoall"};

/* The element type of a message, as NCCL's and MPI's datatypes name it:
 * COMM_VALUES the model's values in the run's precision (fp32, or bf16 in a
 * bf16 run: precision.h), the others fixed whatever the precision (lab08's
 * token counts are int32, the host's sums of losses and norms f64).
 * comm_type_bytes (comm.h) gives a value's bytes. */
typedef enum { COMM_VALUES, COMM_FP32, COMM_INT32, COMM_F64, COMM_NTYPES } comm_type;

/* The bytes one rank moves per payload byte under the ring algorithm (what
 * NCCL and MPICH use for large messages): an all-reduce is a reduce-scatter
 * plus an all-gather, each (n-1)/n of the buffer; point-to-point, 1; an
 * all-to-all of even blocks, all but the rank's own block, (n-1)/n; a barrier
 * and any kind in a group of one (n <= 1), 0. */
static inline double comm_ring_factor(comm_kind kind, int n) {
    if (n <= 1) return 0;
    switch (kind) {
    case COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case COLL_REDUCE_SCATTER:
    case COLL_ALLGATHER:
    case COLL_ALLTOALL: return (double)(n - 1) / n;
    case COLL_BROADCAST:
    case COLL_SEND:
    case COLL_RECV: return 1;
    default: return 0;
    }
}

/* What the allocator counts (mem.h): the categories of every buffer. */
typedef enum {
    MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_ACTS, MEM_COMM, MEM_WORKSPACE, MEM_NCAT
} mem_category;
PL_NAMES mem_category_names[MEM_NCAT] = {"params", "grads", "optim", "acts", "comm", "workspace"};

/* --recompute (model.h says what each keeps and runs again). */
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_MODES } recompute_mode;
#define RECOMPUTE_CHOICES "none|selective|full"
PL_NAMES recompute_names[RECOMPUTE_MODES] = {"none", "selective", "full"};

/* --precision (precision.h): fp32, or bf16 mixed precision. */
typedef enum { PREC_FP32 = 0, PREC_BF16 = 1 } precision;

#endif
