/* Collectives and point-to-point over MPI or NCCL, on device buffers.
 *
 * Every call names the type of its n elements, as NCCL and MPI do
 * (comm_type, kinds.h): COMM_VALUES for the model's values in the run's
 * precision (precision.h: fp32 or bf16; a bf16 sum is added in fp32 pair by
 * pair and stays bf16 on the wire, 2 bytes a value, comm.c says how), or a
 * fixed type (lab08's token counts travel as COMM_INT32). The counts, the
 * trace and the flight records ("42368 x bf16", "4 x int32") follow the type.
 *
 * NCCL when every rank has a GPU of its own; MPI otherwise. With MPI and CUDA
 * together, device buffers are staged through pinned host memory (Debian's
 * MPICH is not CUDA-aware, and NCCL refuses two ranks on one GPU).
 *
 * Waiting on MPI is polite when ranks outnumber cores: a nonblocking request is
 * tested in a ~50 us spin, then between sleeps that back off from 20 us to
 * 0.2 ms, so ranks waiting on a 2-core laptop leave the cores to the rank that
 * computes.
 *
 * Every call is counted (calls, payload bytes, seconds) per kind and recorded
 * as a TRACE_COMM event, and kept in the flight recorder (flight.h): the last
 * operations of each rank, which a watchdog (--hang-timeout) writes out when a
 * wait lasts too long, so that plots/hang_report.py can say which rank, group
 * and call disagreed. An MPI error, or a message shorter than its receive,
 * ends the job the same way: the record of every rank, then status 3 (the
 * communicators return MPI's errors to comm instead of aborting inside MPI). */
#ifndef PL_COMM_H
#define PL_COMM_H
#include "kinds.h" /* comm_kind, comm_kind_names, comm_ring_factor */
#include "flight.h"
#include "wait.h" /* polite_wait: comm_init chooses whether waits spin */
#include <mpi.h>
#include <stddef.h>

typedef enum { COMM_MPI = 0, COMM_NCCL = 1 } comm_backend;

typedef struct {
    long calls;     /* comm_sendrecv counts one send and one receive */
    double bytes;   /* payload: the bytes of the buffer the caller passed; for
                     * reduce-scatter and all-gather the whole padded buffer */
    double seconds; /* host time from call to completion (on NCCL only the
                     * time to queue it: the work itself runs on the stream) */
} comm_stat;

typedef struct comm {
    MPI_Comm mpi;
    int rank, size;
    comm_backend backend;
    void *nccl;          /* ncclComm_t when backend == COMM_NCCL */
    void *stream;        /* cudaStream_t NCCL runs on (NULL: the compute stream). A
                          * separate stream is not ordered after the compute stream:
                          * the caller orders them (device_stream_wait). */
    comm_stat stats[COLL_NKINDS];
    struct flight_group *flight; /* its members and operation counters (flight.h) */
} comm;

/* A communicator over all of `world` (duplicated). Collective over world. */
void comm_init(comm *c, MPI_Comm world, comm_backend backend);
/* Sub-groups, like MPI_Comm_split: ranks with the same color form one group,
 * ordered by key (ties by parent rank); a negative color: none (rank -1, size
 * 0). Collective over parent. Same backend as the parent. */
void comm_split(const comm *parent, int color, int key, comm *out);
/* The group of the n parent ranks `members`, in that order (this rank among
 * them): what comm_split builds once every rank's color and key are known,
 * for callers that know the members already (common/mesh.c). Every parent
 * rank calls it, each with its own group's members (NCCL splits the parent). */
void comm_group(const comm *parent, const int *members, int n, comm *out);
/* The ranks of MPI_COMM_WORLD on this host (MPI_COMM_TYPE_SHARED), ordered by
 * world rank: split once per process and kept until MPI_Finalize (run_setup's
 * placement and comm_init's wait policy both ask). Collective over the world
 * on the first call only. */
MPI_Comm comm_world_host(void);
void comm_free(comm *c);
/* Names the parallel dimension c spans ("dp", "tp", "pp", "cp", "ep", "edp"):
 * the flight record and the hang report then say "tp group {2,3}". */
static inline void comm_set_axis(comm *c, const char *axis) { flight_group_axis(c, axis); }

/* Every call below says the type of its n elements (as NCCL and MPI do),
 * COMM_VALUES for the model's; its counts (comm_stat.bytes) are their bytes. */
size_t comm_type_bytes(comm_type t);   /* COMM_VALUES: value_bytes() */
const char *comm_type_name(comm_type t); /* "fp32", "bf16", "int32", "f64" */

/* In place over n elements; average divides the sum by size (COMM_VALUES and COMM_FP32 only). */
void comm_allreduce(comm *c, void *buf, long n, comm_type t, int average);

/* Sharded collectives over n values in chunks of comm_chunk(n, size): rank r owns
 * [r*chunk, min(n, (r+1)*chunk)). `full` must hold chunk*size values (the tail
 * past n is padding; its contents are ignored / left unspecified).
 *   reduce_scatter: shard[0..chunk) = sum over ranks of full[r*chunk ..]
 *   allgather:      full[r*chunk ..] = shard of rank r, for every r */
long comm_chunk(long n, int size);
void comm_reduce_scatter(comm *c, const void *full, void *shard, long n, comm_type t);
void comm_allgather(comm *c, const void *shard, void *full, long n, comm_type t);

/* All-to-all: block j of `send` goes to rank j, and rank j's block for this
 * rank lands in block j of `recv` (blocks in rank order, the own one copied).
 *   comm_alltoall:  every block n values; send and recv hold size*n values.
 *   comm_alltoallv: send_counts[j] values from send_offsets[j] go to rank j,
 *                   recv_counts[j] values from rank j land at recv_offsets[j]
 *                   (values, not bytes; offsets NULL: the blocks packed in
 *                   rank order). Rank i's send_counts[j] must equal rank j's
 *                   recv_counts[i]; counts may be zero (lab08's experts that
 *                   got no tokens).
 * send and recv must not overlap. Counted as kind "alltoall": the payload is
 * the send buffer's values, the own block included (the buffer handed over,
 * as for all-gather). What leaves the rank is that less its own block:
 * (n-1)/n of it for even blocks (Ulysses), the record's ring column. */
void comm_alltoall(comm *c, const void *send, void *recv, long n, comm_type t);
void comm_alltoallv(comm *c, const void *send, const long *send_counts, const long *send_offsets,
                    void *recv, const long *recv_counts, const long *recv_offsets, comm_type t);

/* Sum n doubles of host memory over the group, in place (losses, norms, counts). */
void comm_allreduce_host(comm *c, double *x, int n);

void comm_broadcast(comm *c, void *buf, long n, comm_type t, int root);

/* Send and/or receive at once, paired so that two neighbours exchanging never
 * deadlock: pass send_n = 0 (or dst < 0) to only receive, recv_n = 0 (or src < 0)
 * to only send. */
void comm_sendrecv(comm *c, const void *send, long send_n, int dst,
                   void *recv, long recv_n, int src, comm_type t);
void comm_send(comm *c, const void *buf, long n, comm_type t, int dst);
void comm_recv(comm *c, void *buf, long n, comm_type t, int src);

/* Nonblocking point-to-point, for lab04's schedule executor, which posts a
 * receive when its schedule says the data will be sent (often long before
 * an action needs it) and waits only when the action does.
 *   comm_isend / comm_irecv post; comm_test / comm_wait complete: after them
 *   the send buffer may be reused, the receive buffer read.
 * tag tells messages between the same two ranks apart on MPI (0 is the
 * blocking calls' above). NCCL has no tags: it matches the sends and receives
 * between two ranks in the order they are posted, so both sides must post
 * them in the same order, and operations that must progress together (a
 * rank that sends to and receives from its neighbours at one point) go
 * between comm_group_begin and comm_group_end (no-ops on MPI). NCCL works on
 * c->stream, so its requests are complete for everything queued on that
 * stream afterwards, and comm_wait only orders the compute stream after it.
 * With MPI and device buffers, each request stages through its own host
 * buffer (kept for the request's next use; comm_request_free releases it).
 * Counted like comm_send / comm_recv (a receive's seconds include its wait). */
typedef struct comm_request {
    comm *c;
    int active;          /* posted and not yet completed */
    int is_recv;
    MPI_Request mpi;
    void *dev;           /* a staged receive: where the data goes when it completes */
    size_t bytes;
    void *host;          /* staging buffer (MPI with device buffers) */
    size_t host_cap;
    int host_pinned;
    long n;              /* the elements posted: a receive must get them all */
    comm_type type;      /* their type */
    flight_op posted;    /* the posting as the flight recorder saw it: what comm_wait waits for */
} comm_request;
void comm_group_begin(comm *c);
void comm_group_end(comm *c);
void comm_isend(comm *c, const void *buf, long n, comm_type t, int dst, int tag, comm_request *r);
void comm_irecv(comm *c, void *buf, long n, comm_type t, int src, int tag, comm_request *r);
int comm_test(comm_request *r); /* 1 when complete (or never posted), without waiting */
void comm_wait(comm_request *r);
void comm_request_free(comm_request *r);

void comm_barrier(comm *c);


void comm_reset_stats(comm *c);
/* Work that is not a training step (the held-out evaluation, a checkpoint's
 * gathers, a timing probe) keeps its collectives out of c's statistics, so the
 * record's per-step figures are the training's:
 *     comm_quiet q = comm_quiet_begin(c);  ...  comm_quiet_end(&q);
 * c may be NULL (nothing kept). */
typedef struct { comm *c; comm_stat kept[COLL_NKINDS]; } comm_quiet;
comm_quiet comm_quiet_begin(comm *c);
void comm_quiet_end(const comm_quiet *q);

#endif
