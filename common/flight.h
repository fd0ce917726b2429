/* The flight recorder, the watchdog and --check-collectives: what a rank was
 * doing when a run stopped moving (docs/hangs.md is the lesson).
 *
 * Every operation of common/comm passes through here. Each rank keeps its last
 * K (--flight-records, default 64) in a ring: the group (which ranks), a
 * sequence number (a group's collectives are numbered in the order they are
 * called, which MPI and NCCL require to be the same on every member; a
 * point-to-point message is numbered per peer and direction), kind, count,
 * value type, root, peer and tag, a label, the step, and the times it was
 * issued and completed. The label is the innermost open trace event
 * (trace_context: "backward", "send_act mb 3", "ep_dispatch"), so no lab
 * names its calls by hand. Each call is also compared, as it is made, with the
 * call at the same place of its stream one step earlier (same_as_last_step):
 * the rank whose call differs is the one that took another path.
 *
 * The watchdog (--hang-timeout S): a wait that lasts S seconds (polite_wait on
 * MPI; on NCCL a GPU operation not finished S seconds after it was queued,
 * which a thread polls) writes this rank's ring to <out>/flight/rank-R.json,
 * prints one line on stderr, asks every other rank to do the same (a file
 * <out>/flight/dump-requested-JOB, which each rank's watchdog thread looks for
 * every 0.1 s: a rank that computes, sleeps or waits outside comm still
 * writes its record), waits up to 3 s for their records, and ends the job
 * with MPI_Abort(MPI_COMM_WORLD, 3). An MPI error in comm, a message that
 * arrives shorter than the receive that was posted, and a mismatch found by
 * --check-collectives end the job the same way. plots/hang_report.py reads
 * the records and names the first disagreement.
 *
 * --check-collectives: before each collective the group compares a hash of
 * (kind, count, value type, root, step); an all-to-all with counts per peer
 * also checks that what each rank sends is what its peer expects. The first
 * mismatch stops the job before the collective runs, with the report's line.
 *
 * PL_FLIGHT_FAULT=KIND:RANK:STEP (test only: it breaks the run on purpose)
 * makes rank RANK, in step STEP (1-based, as the step lines count), do one
 * thing wrong at its first operation that KIND applies to:
 *   skip   a collective is not called at all
 *   count  a collective, or a message sent, carries one value fewer
 *   peer   a message goes to / is received from the next rank of the group
 *   tag    a message's tag is 1000 more (the blocking calls' 0 too)
 *   order  before a collective, the rank enters a barrier of another group it
 *          belongs to: two groups entered in opposite orders
 *   a2a    an all-to-all sends one value more to one peer than it expects (one
 *          fewer where one more would read past the send buffer)
 *   sleep  the rank sleeps 10 S + 30 s before the operation
 * The record says what was injected ("injected"), for the tests; the report
 * does not read it. */
#ifndef PL_FLIGHT_H
#define PL_FLIGHT_H
#include "kinds.h" /* comm_type */

struct comm;

typedef enum {
    FL_ALLREDUCE, FL_REDUCE_SCATTER, FL_ALLGATHER, FL_BROADCAST, FL_ALLTOALL, FL_ALLTOALLV, FL_BARRIER,
    FL_ALLREDUCE_HOST, FL_SEND, FL_RECV, FL_ISEND, FL_IRECV, FL_NKINDS
} flight_kind;

/* One operation as the ring keeps it (comm_request keeps its posting's). */
typedef struct flight_op {
    long id;               /* the rank's operation number, from 0; -1: an empty slot */
    flight_kind kind;
    int group;             /* flight group id: the order of comm_init / comm_split calls */
    long seq;              /* collectives: the group's; point-to-point: per peer and direction */
    long count;            /* values (alltoallv: the values sent) */
    comm_type type;        /* of the count's elements (the run's values, int32 counts, host f64, ...) */
    int root, peer, tag;   /* -1 where they do not apply; peer is the group's rank */
    const char *where;     /* trace_context's op, NULL: none */
    int after;             /* where is the compute event that ended before ("after backward") */
    int mb, step;          /* its micro-batch (-1: none), the step (0-based; -1: outside the steps) */
    double issued, completed; /* now_seconds(); completed 0: not yet */
    long received;         /* receives: values that arrived (-1: not known yet) */
    int queued;            /* NCCL: on the stream, completion not seen yet */
    int same_as_last_step; /* 1: the call at this place of its stream (the group's collectives,
                            * or the messages to / from one peer) one step earlier was this
                            * one; 0: it was not, the rank took another path; -1: not known */
} flight_op;

/* The settings: shared flags (common/run.c binds them). */
extern int flight_records;          /* --flight-records K: operations kept (0: no recorder) */
extern double flight_hang_timeout;  /* --hang-timeout S (0: no watchdog) */
extern int flight_check_collectives; /* --check-collectives */
#define FLIGHT_DEFAULT_TIMEOUT 600.0 /* ten minutes: NCCL's and PyTorch's default */
void flight_set_out(const char *out); /* --out: the records go to <out>/flight */

/* A communicator's group: its members, counters and place in the registry.
 * Collective over the communicator (c->mpi set; c->mpi may be MPI_COMM_NULL
 * for a rank comm_split left out, which must still call it). The first call
 * starts the recorder, the watchdog thread and reads PL_FLIGHT_FAULT. */
void flight_group_init(struct comm *c);
void flight_group_free(struct comm *c);
/* Names the parallel dimension c spans ("dp", "tp", "pp", "cp", "ep", "edp"): records and
 * reports then say "tp group {2,3}" (comm_set_axis). */
void flight_group_axis(struct comm *c, const char *axis);

/* Record an operation about to start; returns its id (-1 with no recorder)
 * and, when `out` is not NULL, the record (comm_request keeps it). counts:
 * alltoallv's send and receive counts per group rank, else NULL. A blocking
 * call is what this rank waits in until flight_end. */
long flight_begin(struct comm *c, flight_kind kind, comm_type type, long count, int root, int peer, int tag,
                  const long *send_counts, const long *recv_counts, flight_op *out);
/* Completed (on NCCL: queued; flight_nccl_queued follows). received: the
 * values a receive got, -1 otherwise. */
void flight_end(long id, long received);
/* The record of op id, or id -1 when the ring no longer holds it. */
void flight_copy(long id, flight_op *out);
/* comm_wait: the rank now waits for the posted op until flight_wait_end. */
void flight_wait_begin(const flight_op *posted);
void flight_wait_end(void);
/* NCCL: ops first..last were queued on stream; the watchdog thread sees them finish. */
void flight_nccl_queued(long first, long last, void *stream);

/* polite_wait's loop, the wait having begun at `since`: ends the job (does not
 * return) when the wait passed --hang-timeout or another rank stopped. */
void flight_watch(double since);
/* The wait flight_watch looked at is over. */
void flight_unwatch(void);
/* Stop the job for a communication error (an MPI error, a short message):
 * this rank's record and line, the others' records, status 3. */
void flight_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* A receive (op id) that got fewer values than posted: MPI completes it
 * without an error, and the step would go on with stale values. */
void flight_fail_short(long id, long got, long posted) __attribute__((noreturn));

/* The test-only fault for this call (flight.h's top), FAULT_NONE nearly always. */
typedef enum { FAULT_NONE, FAULT_SKIP, FAULT_COUNT, FAULT_PEER, FAULT_TAG, FAULT_ORDER, FAULT_A2A, FAULT_SLEEP } flight_fault;
flight_fault flight_fault_here(struct comm *c, flight_kind kind, comm_type type, long count);

/* --check-collectives, before a collective (no-op when off). */
void flight_check(struct comm *c, flight_kind kind, comm_type type, long count, int root, const long *send_counts,
                  const long *recv_counts);
/* What --check-collectives cost this rank: checks made and their seconds. */
void flight_check_cost(long *checks, double *seconds);

const char *flight_kind_name(flight_kind k);

#endif
