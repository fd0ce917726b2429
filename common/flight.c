/* The flight recorder, the watchdog and --check-collectives (flight.h says
 * what each does; docs/hangs.md is the lesson).
 *
 * Cost when nothing goes wrong: one ring slot filled per operation (a few
 * stores, a clock read comm takes anyway, an uncontended mutex), one clock
 * read per sleep of polite_wait, and a thread that wakes every 0.1 s to look
 * for one file. docs/hangs.md has the measurement.
 *
 * Threads: the main thread records and, on MPI, watches its own waits. The
 * watchdog thread makes no MPI call but MPI_Abort, and that only to end a job
 * nobody else ends (or on NCCL, where the main thread is stuck in CUDA): MPICH
 * lets any thread abort, which MPI_THREAD_SINGLE does not promise. The ring and
 * the registry of groups are read by the thread under `lock`. */
#define _GNU_SOURCE /* nanosleep, gethostname, strdup */
#include "flight.h"
#include "comm.h"
#include "device.h"
#include "paths.h"
#include "precision.h"
#include "textbuf.h"
#include "trace.h"
#include "wait.h"
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef PL_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

int flight_records = 64;
double flight_hang_timeout = FLIGHT_DEFAULT_TIMEOUT;
int flight_check_collectives = 0;

/* Seconds the rank that stops waits for the others' records before it ends
 * the job: they look for the request every 0.1 s and write a few kB. */
#define GRACE_S 3.0
/* Peers whose per-peer all-to-all counts a record keeps (larger groups: none). */
#define A2A_PEERS 16

static const char *kind_names[FL_NKINDS] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall",
                                            "alltoallv", "barrier", "allreduce_host", "send", "recv", "isend",
                                            "irecv"};
const char *flight_kind_name(flight_kind k) { return k < FL_NKINDS ? kind_names[k] : "?"; }

static int is_collective(flight_kind k) { return k <= FL_ALLREDUCE_HOST; }
static int is_send(flight_kind k) { return k == FL_SEND || k == FL_ISEND; }
static int is_p2p(flight_kind k) { return k >= FL_SEND; }

/* ---- state ------------------------------------------------------------------ */

/* What a stream of calls (a group's collectives, the messages to or from one
 * peer) did at each place of this step and of the last: a hash of each call.
 * A call that differs from the last step's at its place is the sign of a rank
 * that took another path. Kept apart from the ring, which may hold less than
 * a step (lab06's default model makes ~130 TP collectives a step). */
typedef struct step_pattern {
    int step;              /* the step `now` describes */
    int prev_known;        /* prev describes step - 1, whole */
    unsigned *now, *prev;
    long n_now, n_prev, cap_now, cap_prev;
} step_pattern;

typedef struct flight_group {
    int id, rank, size, alive;
    int *members;          /* world ranks, in group order */
    char axis[16];         /* the parallel dimension it spans ("dp", "tp", ...); "" unnamed */
    long collectives;      /* the next collective's sequence number */
    long *sent, *recvd;    /* per group rank: the next message's number each way */
    step_pattern coll;     /* the collectives' */
    step_pattern *p2p;     /* [2 * size]: sends to, then receives from, each group rank */
    comm *c;               /* NULL once freed */
} flight_group;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int started;
static int world_rank = -1, world_size = 0;
static char *out_dir;             /* <out>/flight */
static char job[32];              /* the same on every rank: names the stop request */
static flight_group **groups;     /* every group this rank was asked to make, by id */
static int n_groups;

static flight_op *ring;           /* flight_records slots, op id % K */
static long (*ring_counts)[2][A2A_PEERS]; /* alltoallv's counts, beside its slot */
static long next_id;

/* What the main thread waits in now (valid: a blocking op, a comm_wait or a check). */
static struct {
    int valid, checking;
    flight_op op;
    double since;
} pending;

/* polite_wait's latest look (flight_watch): a wait outside comm's operations
 * (run.c's agreement at a step's end) is named by it, having no pending op */
static volatile double watch_since, watch_seen;

/* Whether the main thread is in a polite_wait with no recorded operation pending. */
static int in_outside_wait(void) { return !pending.valid && watch_seen > 0 && now_seconds() - watch_seen < 1.0; }

void flight_unwatch(void) { watch_seen = 0; }

static atomic_int stopping;       /* 1 once this rank's record is being written */
static double stop_time;
/* --check-collectives found a difference: this rank is gathering the group's calls to
 * write its own line, so the watchdog leaves a stop request to it (a faster member's
 * request otherwise wins the race and this rank only says "another rank stopped") */
static _Atomic double own_stop_since;

static struct {
    flight_fault kind;
    int rank, step, fired;
    char text[640];               /* what was done, for the record */
    flight_op op;                 /* the operation it touched, as it was called */
    long op_id;                   /* the record of that operation as it ran (-1: none: skipped, or order) */
    int awaiting_op;              /* the next flight_begin is that operation */
} fault;

static long check_count;
static double check_seconds;
static char *stop_line;           /* the line printed (the record repeats it) */

void flight_set_out(const char *out) {
    free(out_dir);
    out_dir = path_join(out && out[0] ? out : "runs", "flight");
}

static const char *flight_dir(void) {
    if (!out_dir) flight_set_out("runs");
    return out_dir;
}

/* ---- words --------------------------------------------------------------------- */

/* "dp group {0,2,4,6}": the axis, when the lab named it, and the world ranks */
static void group_text(const flight_group *g, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "%s%sgroup {", g && g->axis[0] ? g->axis : "", g && g->axis[0] ? " " : "");
    for (int i = 0; g && i < g->size && at < len; i++) {
        if (i == 12 && g->size > 14) {
            at += (size_t)snprintf(buf + at, len - at, ",...,%d} (%d ranks)", g->members[g->size - 1], g->size);
            return;
        }
        at += (size_t)snprintf(buf + at, len - at, i ? ",%d" : "%d", g->members[i]);
    }
    if (at < len) snprintf(buf + at, len - at, "}");
}

static flight_group *group_of(int id) { return id >= 0 && id < n_groups ? groups[id] : NULL; }

static int world_of(const flight_group *g, int r) { return g && r >= 0 && r < g->size ? g->members[r] : r; }

static size_t op_value_bytes(const flight_op *op) { return comm_type_bytes(op->type); }

static void human_bytes(double b, char *buf, size_t len) {
    if (b >= 1e9) snprintf(buf, len, "%.1f GB", b / 1e9);
    else if (b >= 1e6) snprintf(buf, len, "%.1f MB", b / 1e6);
    else if (b >= 1e3) snprintf(buf, len, "%.1f kB", b / 1e3);
    else snprintf(buf, len, "%.0f B", b);
}

static void label_text(const flight_op *op, char *buf, size_t len) {
    if (!op->where) snprintf(buf, len, "%s", "");
    else if (op->after) snprintf(buf, len, "after %s", op->where);
    else if (op->mb >= 0) snprintf(buf, len, "%s mb %d", op->where, op->mb);
    else snprintf(buf, len, "%s", op->where);
}

/* "allreduce #7 of group {0,1,2,3} (backward, step 3, 1.2 MB fp32)"; p2p
 * names the peer's world rank and the tag. The report prints the same words. */
static void describe(const flight_op *op, char *buf, size_t len) {
    const flight_group *g = group_of(op->group);
    char gt[160], label[64], size[32], peer[48] = "";
    group_text(g, gt, sizeof gt);
    label_text(op, label, sizeof label);
    human_bytes((double)op->count * (double)op_value_bytes(op), size, sizeof size);
    if (is_p2p(op->kind))
        snprintf(peer, sizeof peer, " %s rank %d", is_send(op->kind) ? "to" : "from", world_of(g, op->peer));
    char step[24] = "";
    if (op->step >= 0) snprintf(step, sizeof step, "step %d, ", op->step + 1);
    char tag[24] = "";
    if (is_p2p(op->kind)) snprintf(tag, sizeof tag, ", tag %d", op->tag);
    snprintf(buf, len, "%s #%ld%s of %s (%s%s%s%ld x %s = %s%s)", flight_kind_name(op->kind), op->seq, peer, gt,
             label, label[0] ? ", " : "", step, op->count, comm_type_name(op->type), size, tag);
}

/* ---- groups ---------------------------------------------------------------------- */

static void stop_request_path(char *buf, size_t len) { snprintf(buf, len, "%s/dump-requested-%s", flight_dir(), job); }
static void record_path(int rank, char *buf, size_t len) { snprintf(buf, len, "%s/rank-%d.json", flight_dir(), rank); }

/* Records of an earlier run in the same --out would count as this run's. */
static void remove_old_records(void) {
    DIR *d = opendir(flight_dir());
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if ((!strncmp(e->d_name, "rank-", 5) && n > 5 && !strcmp(e->d_name + n - 5, ".json")) ||
            !strncmp(e->d_name, "dump-requested-", 15)) {
            char *p = path_join(flight_dir(), e->d_name);
            unlink(p);
            free(p);
        }
    }
    closedir(d);
}

static void parse_fault(void);
static void start_watchdog(void);

static void start(comm *c) {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    /* c is the first communicator (the labs' world); its rank 0 clears out the
     * records of an earlier run and names the job, so that a stop request an
     * earlier run left is not this one's */
    if (c->rank == 0) remove_old_records();
    unsigned long long id = ((unsigned long long)getpid() << 32) ^ (unsigned long long)(now_seconds() * 1e6);
    MPI_Bcast(&id, 1, MPI_UNSIGNED_LONG_LONG, 0, c->mpi);
    snprintf(job, sizeof job, "%llx", id);
    if (flight_records > 0) {
        ring = malloc(sizeof *ring * (size_t)flight_records);
        ring_counts = malloc(sizeof *ring_counts * (size_t)flight_records);
        if (!ring || !ring_counts) die("out of host memory for the flight recorder");
        for (int i = 0; i < flight_records; i++) ring[i].id = -1;
    }
    parse_fault();
    started = 1;
    static const wait_watcher watcher = {flight_watch, flight_unwatch, flight_fail};
    wait_set_watcher(&watcher); /* every polite_wait's age, and MPI's errors, come here */
    start_watchdog();
}

void flight_group_init(comm *c) {
    if (!started) start(c);
    flight_group *g = calloc(1, sizeof *g);
    if (!g) die("out of host memory");
    g->coll.step = -2; /* no step yet */
    g->id = n_groups;
    g->rank = c->rank;
    g->size = c->size;
    if (c->mpi != MPI_COMM_NULL) {
        MPI_Group mine, world;
        MPI_Comm_group(c->mpi, &mine);
        MPI_Comm_group(MPI_COMM_WORLD, &world);
        int *local = malloc(sizeof(int) * (size_t)c->size);
        g->members = malloc(sizeof(int) * (size_t)c->size);
        g->sent = calloc((size_t)c->size, sizeof(long));
        g->recvd = calloc((size_t)c->size, sizeof(long));
        g->p2p = calloc(2 * (size_t)c->size, sizeof *g->p2p);
        if (!local || !g->members || !g->sent || !g->recvd || !g->p2p) die("out of host memory");
        for (int i = 0; i < 2 * c->size; i++) g->p2p[i].step = -2;
        for (int i = 0; i < c->size; i++) local[i] = i;
        MPI_Group_translate_ranks(mine, c->size, local, world, g->members);
        free(local);
        MPI_Group_free(&mine);
        MPI_Group_free(&world);
        g->alive = 1;
        g->c = c;
    }
    pthread_mutex_lock(&lock);
    flight_group **grown = realloc(groups, sizeof *groups * (size_t)(n_groups + 1));
    if (!grown) die("out of host memory");
    groups = grown;
    groups[n_groups++] = g; /* also a rank left out: ids stay the same on every rank */
    pthread_mutex_unlock(&lock);
    c->flight = g;
}

void flight_group_axis(struct comm *c, const char *axis) {
    if (c->flight) snprintf(c->flight->axis, sizeof c->flight->axis, "%s", axis);
}

void flight_group_free(comm *c) {
    if (!c->flight) return;
    pthread_mutex_lock(&lock);
    c->flight->alive = 0;
    c->flight->c = NULL; /* kept for the records that name it */
    pthread_mutex_unlock(&lock);
    c->flight = NULL;
}

/* ---- the last step's pattern ------------------------------------------------------ */

static int first_step_seen = -1; /* the first step any operation of this rank ran in */

static unsigned call_hash(const flight_op *op) {
    unsigned long long h = 1469598103934665603ULL;
    /* an all-to-all's counts follow the routing, which changes step to step */
    const long long parts[] = {op->kind, op->kind == FL_ALLTOALL || op->kind == FL_ALLTOALLV ? 0 : op->count,
                               op->type, op->root, op->tag, (long long)(uintptr_t)op->where, op->after, op->mb};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (int b = 0; b < 8; b++) {
            h ^= (unsigned long long)(parts[i] >> (8 * b)) & 0xff;
            h *= 1099511628211ULL;
        }
    return (unsigned)(h ^ (h >> 32));
}

static step_pattern *pattern_of(flight_group *g, flight_kind kind, int peer) {
    if (is_collective(kind)) return &g->coll;
    if (!g->p2p || peer < 0 || peer >= g->size) return NULL;
    return &g->p2p[(is_send(kind) ? 0 : g->size) + peer];
}

/* Whether step - 1 of this stream is known whole when `step` starts: it ran in
 * step - 1, or it made no call then while the rank was already in the steps. */
static int last_step_known(const step_pattern *p, int step) {
    return step == p->step + 1 || (p->step < step - 1 && first_step_seen >= 0 && first_step_seen <= step - 1);
}

/* 1: the call at the next place of p in `step` was h one step earlier; 0: it was
 * not (or there was none); -1: not known. */
static int pattern_compare(const step_pattern *p, int step, unsigned h) {
    if (!p || step < 1) return -1;
    if (step == p->step)
        return !p->prev_known ? -1 : p->n_now < p->n_prev && p->prev[p->n_now] == h;
    if (!last_step_known(p, step)) return -1;
    return step == p->step + 1 && p->n_now > 0 && p->now[0] == h;
}

static void pattern_append(step_pattern *p, int step, unsigned h) {
    if (!p || step < 0) return;
    if (step != p->step) {
        p->prev_known = last_step_known(p, step);
        if (step == p->step + 1) { /* now becomes the last step */
            unsigned *t = p->prev;
            long c = p->cap_prev;
            p->prev = p->now, p->cap_prev = p->cap_now, p->n_prev = p->n_now;
            p->now = t, p->cap_now = c;
        } else {
            p->n_prev = 0;
        }
        p->n_now = 0;
        p->step = step;
    }
    if (p->n_now == p->cap_now) {
        long cap = p->cap_now ? 2 * p->cap_now : 64;
        unsigned *grown = realloc(p->now, sizeof *grown * (size_t)cap);
        if (!grown) die("out of host memory for the flight recorder");
        p->now = grown;
        p->cap_now = cap;
    }
    p->now[p->n_now++] = h;
}

/* ---- the ring -------------------------------------------------------------------- */

long flight_begin(comm *c, flight_kind kind, comm_type type, long count, int root, int peer, int tag, const long *send_counts,
                  const long *recv_counts, flight_op *out) {
    flight_group *g = c->flight;
    if (!g) {
        if (out) *out = (flight_op){.id = -1};
        return -1;
    }
    long seq;
    if (is_collective(kind)) seq = g->collectives++;
    else if (is_send(kind)) seq = g->sent[peer]++;
    else seq = g->recvd[peer]++;
    int mb, step;
    const char *after, *where = trace_context(&mb, &step, &after);
    const double t = now_seconds();
    pthread_mutex_lock(&lock);
    const long id = next_id++;
    if (fault.awaiting_op) {
        fault.op_id = id;
        fault.awaiting_op = 0;
    }
    flight_op op = {.id = id, .kind = kind, .group = g->id, .seq = seq, .count = count, .type = type,
                    .root = root, .peer = peer, .tag = tag, .where = where ? where : after, .after = !where && after,
                    .mb = mb, .step = step, .issued = t, .received = -1};
    /* the call against the last step's at its place (the patterns are the main thread's) */
    const unsigned h = call_hash(&op);
    step_pattern *pat = pattern_of(g, kind, peer);
    op.same_as_last_step = pattern_compare(pat, step, h);
    pattern_append(pat, step, h);
    if (step >= 0 && first_step_seen < 0) first_step_seen = step;
    if (ring) {
        const long slot = id % flight_records;
        ring[slot] = op;
        if (send_counts && recv_counts && g->size <= A2A_PEERS)
            for (int j = 0; j < g->size; j++) {
                ring_counts[slot][0][j] = send_counts[j];
                ring_counts[slot][1][j] = recv_counts[j];
            }
    }
    if (kind != FL_ISEND && kind != FL_IRECV) { /* the rank waits in it until flight_end */
        pending.op = op;
        pending.since = t;
        pending.checking = 0;
        pending.valid = 1;
    }
    pthread_mutex_unlock(&lock);
    if (out) *out = op;
    return id;
}

void flight_end(long id, long received) {
    if (id < 0) return;
    const double t = now_seconds();
    pthread_mutex_lock(&lock);
    if (ring && ring[id % flight_records].id == id) {
        flight_op *op = &ring[id % flight_records];
        op->completed = t;
        op->received = received;
    }
    if (pending.valid && pending.op.id == id) pending.valid = 0;
    pthread_mutex_unlock(&lock);
}

void flight_copy(long id, flight_op *out) {
    memset(out, 0, sizeof *out);
    out->id = -1;
    if (id < 0 || !ring) return;
    pthread_mutex_lock(&lock);
    if (ring[id % flight_records].id == id) *out = ring[id % flight_records];
    pthread_mutex_unlock(&lock);
}

void flight_wait_begin(const flight_op *posted) {
    if (!started || posted->id < 0) return;
    int mb, step;
    const char *after, *where = trace_context(&mb, &step, &after);
    pthread_mutex_lock(&lock);
    pending.op = *posted;
    /* a receive posted early (lab04 posts a step's receives at its start) is
     * named where the rank waits for it ("recv_act mb 3"), when that is an event */
    if (where) {
        pending.op.where = where;
        pending.op.after = 0;
        pending.op.mb = mb;
        if (ring && ring[posted->id % flight_records].id == posted->id) {
            ring[posted->id % flight_records].where = where;
            ring[posted->id % flight_records].after = 0;
            ring[posted->id % flight_records].mb = mb;
        }
    }
    pending.since = now_seconds();
    pending.checking = 0;
    pending.valid = 1;
    pthread_mutex_unlock(&lock);
}

void flight_wait_end(void) {
    pthread_mutex_lock(&lock);
    pending.valid = 0;
    pthread_mutex_unlock(&lock);
}

/* ---- the record ---------------------------------------------------------------------- */

static void json_op(textbuf *b, const flight_op *op, const long (*counts)[A2A_PEERS], double wall) {
    const flight_group *g = group_of(op->group);
    char label[64];
    label_text(op, label, sizeof label);
    textbuf_printf(b, "{\"id\":%ld,\"kind\":\"%s\",\"group\":%d,\"seq\":%ld,\"count\":%ld,\"type\":\"%s\","
                   "\"bytes\":%.0f,\"root\":%d,\"peer\":%d,\"peer_world\":%d,\"tag\":%d,\"label\":",
                   op->id, flight_kind_name(op->kind), op->group, op->seq, op->count,
                   comm_type_name(op->type), (double)op->count * (double)op_value_bytes(op),
                   op->root, op->peer, is_p2p(op->kind) ? world_of(g, op->peer) : -1, op->tag);
    textbuf_json_string(b, label);
    textbuf_printf(b, ",\"where\":");
    if (op->where) textbuf_json_string(b, op->where);
    else textbuf_printf(b, "null");
    textbuf_printf(b, ",\"mb\":%d,\"step\":%d,\"issued_s\":%.6f,\"completed_s\":", op->mb, op->step, op->issued + wall);
    if (op->completed > 0) textbuf_printf(b, "%.6f", op->completed + wall);
    else textbuf_printf(b, "null");
    if (op->received >= 0) textbuf_printf(b, ",\"received\":%ld", op->received);
    if (op->queued) textbuf_printf(b, ",\"queued_on_gpu\":true");
    textbuf_printf(b, ",\"same_as_last_step\":%s",
                   op->same_as_last_step < 0 ? "null" : op->same_as_last_step ? "true" : "false");
    if (counts && g) {
        for (int d = 0; d < 2; d++) {
            textbuf_printf(b, d ? ",\"recv_counts\":[" : ",\"send_counts\":[");
            for (int j = 0; j < g->size; j++) textbuf_printf(b, j ? ",%ld" : "%ld", counts[d][j]);
            textbuf_printf(b, "]");
        }
    }
    textbuf_printf(b, "}");
}

/* Seconds to add to now_seconds() for the wall clock, so the report can lay
 * ranks of one host (and of hosts whose clocks agree) on one time line. */
static double wall_offset(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - now_seconds();
}

/* This rank's record, written whole to a temporary name and renamed, so a
 * reader never sees half of it. extra: more members ("\"k\":v," ...) or NULL. */
static void write_record(const char *reason, const char *line, const char *extra) {
    const double wall = wall_offset(), now = now_seconds();
    textbuf b = {0};
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    pthread_mutex_lock(&lock);
    /* the step: the latest operation's (the thread may not read the trace, which the main thread grows) */
    int step = pending.valid ? pending.op.step : -1;
    if (!pending.valid && ring && next_id > 0 && ring[(next_id - 1) % flight_records].id == next_id - 1)
        step = ring[(next_id - 1) % flight_records].step;
    textbuf_printf(&b, "{\"format\":\"parallel-labs flight record 1\",\"rank\":%d,\"world_size\":%d,\"host\":",
                   world_rank, world_size);
    textbuf_json_string(&b, host);
    textbuf_printf(&b, ",\"pid\":%d,\"job\":\"%s\",\"reason\":\"%s\",\"line\":", (int)getpid(), job, reason);
    textbuf_json_string(&b, line);
    textbuf_printf(&b, ",\"hang_timeout_s\":%g,\"records_kept\":%d,\"check_collectives\":%s,\"dumped_at_s\":%.6f,"
                   "\"step\":%d,\"ops_issued\":%ld,", flight_hang_timeout, flight_records,
                   flight_check_collectives ? "true" : "false", now + wall, step, next_id);
    if (extra) textbuf_printf(&b, "%s", extra);
    textbuf_printf(&b, "\"pending\":");
    if (pending.valid) {
        json_op(&b, &pending.op, NULL, wall);
        b.len--; /* reopen the object: how long it waited, and whether in a check */
        b.s[b.len] = 0;
        textbuf_printf(&b, ",\"waiting_since_s\":%.6f,\"in_check\":%s}", pending.since + wall,
                       pending.checking ? "true" : "false");
    } else {
        textbuf_printf(&b, "null");
        if (in_outside_wait()) textbuf_printf(&b, ",\"outside_wait_since_s\":%.6f", watch_since + wall);
    }
    if (fault.fired) {
        textbuf_printf(&b, ",\"injected\":{\"fault\":\"%s\",\"text\":",
                       (const char *[]){"none", "skip", "count", "peer", "tag", "order", "a2a", "sleep"}[fault.kind]);
        textbuf_json_string(&b, fault.text);
        textbuf_printf(&b, ",\"op\":");
        /* the operation as it ran (its label may name the wait), else as it was called */
        const int kept = fault.op_id >= 0 && ring && ring[fault.op_id % flight_records].id == fault.op_id;
        json_op(&b, kept ? &ring[fault.op_id % flight_records] : &fault.op, NULL, wall);
        textbuf_printf(&b, "}");
    }
    textbuf_printf(&b, ",\"groups\":[");
    for (int i = 0; i < n_groups; i++) {
        const flight_group *g = groups[i];
        textbuf_printf(&b, "%s{\"id\":%d,\"axis\":\"%s\",\"rank\":%d,\"size\":%d,\"alive\":%s,\"members\":[",
                       i ? "," : "", g->id, g->axis, g->rank, g->size, g->alive ? "true" : "false");
        for (int j = 0; g->members && j < g->size; j++) textbuf_printf(&b, j ? ",%d" : "%d", g->members[j]);
        textbuf_printf(&b, "],\"collectives\":%ld,\"sent\":[", g->collectives);
        for (int j = 0; g->sent && j < g->size; j++) textbuf_printf(&b, j ? ",%ld" : "%ld", g->sent[j]);
        textbuf_printf(&b, "],\"received\":[");
        for (int j = 0; g->recvd && j < g->size; j++) textbuf_printf(&b, j ? ",%ld" : "%ld", g->recvd[j]);
        textbuf_printf(&b, "]}");
    }
    textbuf_printf(&b, "],\"ops\":[");
    const long first = ring && next_id > flight_records ? next_id - flight_records : 0;
    for (long id = first; ring && id < next_id; id++) {
        const long slot = id % flight_records;
        if (ring[slot].id != id) continue;
        if (id > first) textbuf_printf(&b, ",");
        json_op(&b, &ring[slot], ring[slot].kind == FL_ALLTOALLV || ring[slot].kind == FL_ALLTOALL
                                     ? (const long (*)[A2A_PEERS])ring_counts[slot] : NULL, wall);
    }
    textbuf_printf(&b, "]}\n");
    pthread_mutex_unlock(&lock);

    path_make_folder(flight_dir());
    char path[4200], tmp[4300];
    record_path(world_rank, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(b.s, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
        fprintf(stderr, "rank %d: cannot write the flight record %s: %s\n", world_rank, path, strerror(errno));
    free(b.s);
}

/* ---- stopping the job -------------------------------------------------------------- */

/* The one line of this rank, in one write so lines of ranks do not mix. */
static void say(const char *line) {
    fflush(stdout);
    size_t len = strlen(line);
    char *msg = malloc(len + 2);
    if (!msg) return;
    memcpy(msg, line, len);
    msg[len] = '\n';
    for (size_t at = 0; at < len + 1;) {
        ssize_t w = write(STDERR_FILENO, msg + at, len + 1 - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    free(msg);
}

/* The first to stop writes this rank's record; 0 when it was done already. */
static int claim_record(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&stopping, &expected, 1)) return 0;
    stop_time = now_seconds();
    return 1;
}

static void request_all_records(void) {
    path_make_folder(flight_dir());
    char path[4200];
    stop_request_path(path, sizeof path);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "rank %d\n", world_rank);
        fclose(f);
    }
}

static int all_records_written(void) {
    char path[4200];
    for (int r = 0; r < world_size; r++) {
        record_path(r, path, sizeof path);
        if (access(path, F_OK) != 0) return 0;
    }
    return 1;
}

static void sleep_seconds(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void __attribute__((noreturn)) end_job(void) {
    const double t0 = now_seconds();
    while (!all_records_written() && now_seconds() - t0 < GRACE_S) sleep_seconds(0.05);
    /* mpirun may stop forwarding output once it hears of the abort (device.c's die) */
    sleep_seconds(0.15);
    MPI_Abort(MPI_COMM_WORLD, 3);
    _exit(3);
}

/* What this rank is doing, for its line: "waits 2.0 s in ..." or outside comm. */
static void state_text(char *buf, size_t len) {
    char d[512];
    pthread_mutex_lock(&lock);
    if (pending.valid) {
        describe(&pending.op, d, sizeof d);
        snprintf(buf, len, "waits %.1f s in %s%s", now_seconds() - pending.since,
                 pending.checking ? "--check-collectives' check before " : "", d);
    } else {
        const flight_op *last = NULL;
        for (long id = next_id - 1; ring && id >= 0 && id >= next_id - flight_records; id--)
            if (ring[id % flight_records].id == id && ring[id % flight_records].completed > 0) {
                last = &ring[id % flight_records];
                break;
            }
        if (in_outside_wait()) {
            snprintf(buf, len, "waits %.1f s in an MPI wait outside common/comm's operations (run.c's agreement at "
                     "a step's end, or the run's closing gathers)", now_seconds() - watch_since);
        } else if (last) {
            describe(last, d, sizeof d);
            snprintf(buf, len, "is in no communication: its last, %s, ended %.1f s ago", d,
                     now_seconds() - last->completed);
        } else {
            snprintf(buf, len, "is in no communication of common/comm (an MPI wait elsewhere, or computing)");
        }
    }
    pthread_mutex_unlock(&lock);
}

static void stop_now(const char *reason, const char *what, const char *extra) __attribute__((noreturn));
static void stop_now(const char *reason, const char *what, const char *extra) {
    request_all_records();
    if (claim_record()) {
        char path[4200];
        record_path(world_rank, path, sizeof path);
        size_t n = strlen(what) + strlen(path) + 64;
        stop_line = malloc(n);
        if (stop_line) snprintf(stop_line, n, "rank %d: %s; flight record %s", world_rank, what, path);
        write_record(reason, stop_line ? stop_line : what, extra);
        say(stop_line ? stop_line : what);
    }
    end_job();
}

void flight_watch(double since) {
    if (!started) return;
    if (atomic_load_explicit(&stopping, memory_order_relaxed)) end_job(); /* another rank asked: record written */
    const double now = now_seconds();
    watch_since = since;
    watch_seen = now;
    if (flight_hang_timeout > 0 && now - since >= flight_hang_timeout) {
        char state[700], what[800];
        state_text(state, sizeof state);
        snprintf(what, sizeof what, "hang: --hang-timeout %g s passed: this rank %s", flight_hang_timeout, state);
        stop_now("timeout", what, NULL);
    }
}

void flight_fail(const char *fmt, ...) {
    char what[1200];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(what, sizeof what, "error: ");
    vsnprintf(what + n, sizeof what - (size_t)n, fmt, ap);
    va_end(ap);
    if (!started) die("%s", what + n);
    char extra[1400];
    textbuf e = {0};
    textbuf_printf(&e, "\"error\":");
    textbuf_json_string(&e, what + n);
    textbuf_printf(&e, ",");
    snprintf(extra, sizeof extra, "%s", e.s);
    free(e.s);
    stop_now("error", what, extra);
}

void flight_fail_short(long id, long got, long posted) {
    flight_op op;
    flight_copy(id, &op);
    char d[512] = "a receive";
    if (op.id >= 0) describe(&op, d, sizeof d);
    flight_fail("%s got %ld values where %ld were posted: the sender sent another count", d, got, posted);
}

/* ---- the watchdog thread ------------------------------------------------------------ */

#ifdef PL_HAVE_CUDA
static cudaEvent_t *slot_events; /* per ring slot: recorded after its NCCL op */
static int watch_device = -1;

void flight_nccl_queued(long first, long last, void *stream) {
    if (!ring || first < 0) return;
    pthread_mutex_lock(&lock);
    if (!slot_events) {
        slot_events = calloc((size_t)flight_records, sizeof *slot_events);
        if (!slot_events) die("out of host memory");
    }
    for (long id = first > next_id - flight_records ? first : next_id - flight_records; id <= last; id++) {
        const long slot = id % flight_records;
        if (ring[slot].id != id) continue;
        if (!slot_events[slot]) CUDA_CHECK(cudaEventCreateWithFlags(&slot_events[slot], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(slot_events[slot], (cudaStream_t)stream));
        ring[slot].queued = 1;
        ring[slot].completed = 0;
    }
    pthread_mutex_unlock(&lock);
}

/* NCCL's operations run on the GPU while the host goes on (or blocks in a
 * CUDA synchronisation, where polite_wait never runs): the thread sees them
 * finish, asks NCCL for asynchronous errors (a peer that failed), and ends the
 * job when one has not finished --hang-timeout after it was queued. Not
 * ncclCommAbort: MPI_Abort ends the processes, which frees the GPUs; PyTorch
 * aborts the communicator because it keeps the process to raise an exception.
 * Compile-checked only: no GPU ran this. */
static void nccl_poll(void) {
    char what[900] = "";
    pthread_mutex_lock(&lock);
    for (long id = next_id - flight_records > 0 ? next_id - flight_records : 0; slot_events && id < next_id; id++) {
        flight_op *op = &ring[id % flight_records];
        if (op->id != id || !op->queued) continue;
        cudaError_t e = cudaEventQuery(slot_events[id % flight_records]);
        if (e == cudaSuccess) {
            op->queued = 0;
            op->completed = now_seconds();
        } else if (e != cudaErrorNotReady) {
            snprintf(what, sizeof what, "error: CUDA: %s after an NCCL operation", cudaGetErrorString(e));
            break;
        } else if (flight_hang_timeout > 0 && now_seconds() - op->issued >= flight_hang_timeout && !what[0]) {
            char d[512];
            describe(op, d, sizeof d);
            pending.op = *op; /* the record's "pending": the GPU waits in it */
            pending.since = op->issued;
            pending.valid = 1;
            snprintf(what, sizeof what, "hang: --hang-timeout %g s passed: the GPU has not finished %s",
                     flight_hang_timeout, d);
        }
    }
    for (int i = 0; i < n_groups && !what[0]; i++) {
        if (!groups[i]->alive || !groups[i]->c || !groups[i]->c->nccl) continue;
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError((ncclComm_t)groups[i]->c->nccl, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
            char gt[160];
            group_text(groups[i], gt, sizeof gt);
            snprintf(what, sizeof what, "error: NCCL in %s: %s", gt, ncclGetErrorString(async));
        }
    }
    pthread_mutex_unlock(&lock);
    if (what[0]) stop_now(strncmp(what, "hang", 4) ? "error" : "timeout", what, NULL);
}
#else
void flight_nccl_queued(long first, long last, void *stream) {
    (void)first; (void)last; (void)stream;
}
#endif

static void *watchdog(void *arg) {
    (void)arg;
#ifdef PL_HAVE_CUDA
    if (watch_device >= 0) cudaSetDevice(watch_device);
#endif
    char request[4200];
    stop_request_path(request, sizeof request);
    for (;;) {
        sleep_seconds(0.1);
        if (atomic_load(&stopping)) {
            /* this rank's record is written; whoever asked ends the job. If nobody does
             * (that rank died first), end it here. */
            if (now_seconds() - stop_time > GRACE_S + 10) {
                MPI_Abort(MPI_COMM_WORLD, 3);
                _exit(3);
            }
            continue;
        }
        struct stat st;
        if (stat(request, &st) == 0) {
            const double own = atomic_load(&own_stop_since);
            if (own > 0 && now_seconds() - own < GRACE_S) continue;
            if (claim_record()) {
                char state[700], what[5000], path[4200];
                state_text(state, sizeof state);
                record_path(world_rank, path, sizeof path);
                snprintf(what, sizeof what, "rank %d: stopped: another rank stopped the job; this rank %s; flight "
                         "record %s", world_rank, state, path);
                write_record("requested", what, NULL);
                say(what);
            }
            continue;
        }
#ifdef PL_HAVE_CUDA
        if (g_device == DEVICE_CUDA) nccl_poll();
#endif
    }
    return NULL;
}

static void start_watchdog(void) {
    if (flight_hang_timeout <= 0) return;
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) cudaGetDevice(&watch_device);
#endif
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, watchdog, NULL) != 0) die("cannot start the watchdog thread");
    pthread_attr_destroy(&attr);
}

/* ---- test-only faults ------------------------------------------------------------------ */

static const char *fault_names[] = {"none", "skip", "count", "peer", "tag", "order", "a2a", "sleep"};

static void parse_fault(void) {
    const char *v = getenv("PL_FLIGHT_FAULT");
    if (!v || !v[0]) return;
    char name[16];
    int rank, step;
    if (sscanf(v, "%15[a-z2]:%d:%d", name, &rank, &step) != 3 || rank < 0 || step < 1)
        die("PL_FLIGHT_FAULT=%s: expected KIND:RANK:STEP, e.g. skip:1:3 (test only; see common/flight.h)", v);
    for (int k = 1; k <= FAULT_SLEEP; k++)
        if (!strcmp(name, fault_names[k])) fault.kind = (flight_fault)k;
    if (!fault.kind)
        die("PL_FLIGHT_FAULT=%s: the kind is one of skip|count|peer|tag|order|a2a|sleep", v);
    fault.rank = rank;
    fault.step = step;
}

/* Another live group of more than one rank that this rank belongs to. */
static comm *other_group(const comm *c) {
    for (int i = 0; i < n_groups; i++)
        if (groups[i]->alive && groups[i]->c && groups[i]->c != c && groups[i]->size > 1) return groups[i]->c;
    return NULL;
}

flight_fault flight_fault_here(comm *c, flight_kind kind, comm_type type, long count) {
    if (!fault.kind || fault.fired || world_rank != fault.rank || !c->flight || c->size <= 1) return FAULT_NONE;
    int mb, step;
    const char *after, *where = trace_context(&mb, &step, &after);
    if (step + 1 != fault.step) return FAULT_NONE;
    int ok = 0;
    comm *other = NULL;
    switch (fault.kind) {
    case FAULT_SKIP: ok = is_collective(kind); break;
    case FAULT_COUNT:
        ok = count > 1 && (is_send(kind) || (is_collective(kind) && kind != FL_ALLTOALL && kind != FL_ALLTOALLV &&
                                             kind != FL_BARRIER));
        break;
    case FAULT_PEER:
    case FAULT_TAG: ok = is_p2p(kind); break;
    case FAULT_ORDER: ok = is_collective(kind) && (other = other_group(c)) != NULL; break;
    case FAULT_A2A: ok = kind == FL_ALLTOALL || kind == FL_ALLTOALLV; break;
    case FAULT_SLEEP: ok = 1; break;
    default: break;
    }
    if (!ok) return FAULT_NONE;
    fault.fired = 1;
    fault.op_id = -1;
    fault.awaiting_op = fault.kind != FAULT_SKIP && fault.kind != FAULT_ORDER;
    flight_group *g = c->flight;
    fault.op = (flight_op){.id = -1, .kind = kind, .group = g->id, .count = count, .type = type,
                           .root = -1, .peer = -1, .tag = -1, .where = where ? where : after, .after = !where && after,
                           .mb = mb, .step = step, .received = -1, .same_as_last_step = -1,
                           .seq = is_collective(kind) ? g->collectives : -1};
    char d[512];
    describe(&fault.op, d, sizeof d);
    snprintf(fault.text, sizeof fault.text, "%s at %s", fault_names[fault.kind], d);
    if (fault.kind == FAULT_ORDER) comm_barrier(other); /* never returns: the others are in c's collective */
    if (fault.kind == FAULT_SLEEP)
        sleep_seconds(10 * (flight_hang_timeout > 0 ? flight_hang_timeout : 3) + 30);
    return fault.kind;
}

/* ---- --check-collectives ------------------------------------------------------------ */

typedef struct {
    int kind, type, root, step, mb, deviates; /* deviates: 1 yes, 0 no, -1 not known */
    long long count, seq;
    int bad_from;                 /* alltoall: a peer whose count for this rank is not the one expected, -1: none */
    long long bad_sent, bad_expected;
    char label[48];               /* label_text's */
} check_desc;

static unsigned long long fnv(unsigned long long h, long long x) {
    for (int i = 0; i < 8; i++) {
        h ^= (unsigned long long)(x >> (8 * i)) & 0xff;
        h *= 1099511628211ULL;
    }
    return h;
}

static void signature_text(const check_desc *d, const flight_group *g, char *buf, size_t len) {
    flight_op op = {.kind = (flight_kind)d->kind, .group = g->id, .seq = d->seq, .count = d->count, .type = (comm_type)d->type,
                    .root = d->root, .peer = -1, .mb = d->mb, .step = d->step};
    const char *label = d->label;
    char size[32], step[24] = "";
    human_bytes((double)op.count * (double)op_value_bytes(&op), size, sizeof size);
    if (op.step >= 0) snprintf(step, sizeof step, "step %d, ", op.step + 1);
    char root[24] = "";
    if (op.kind == FL_BROADCAST) snprintf(root, sizeof root, ", root %d", world_of(g, op.root));
    snprintf(buf, len, "%s #%lld (%s%s%s%lld x %s = %s%s)", flight_kind_name(op.kind), d->seq, label,
             label[0] ? ", " : "", step, d->count, comm_type_name(op.type), size, root);
}

static int same_signature(const check_desc *a, const check_desc *b) {
    return a->kind == b->kind && a->type == b->type && a->count == b->count && a->root == b->root && a->step == b->step;
}

/* "ranks 0, 2, 3" / "rank 1" */
static void ranks_text(const flight_group *g, const int *in, char *buf, size_t len) {
    int n = 0;
    for (int r = 0; r < g->size; r++) n += in[r];
    size_t at = (size_t)snprintf(buf, len, n == 1 ? "rank " : "ranks ");
    for (int r = 0, k = 0; r < g->size && at < len; r++)
        if (in[r]) at += (size_t)snprintf(buf + at, len - at, k++ ? ", %d" : "%d", g->members[r]);
}

static void __attribute__((noreturn)) check_failed(comm *c, check_desc *mine) {
    flight_group *g = c->flight;
    check_desc *all = malloc(sizeof *all * (size_t)g->size);
    int *blamed = calloc((size_t)g->size, sizeof(int)), *cls = calloc((size_t)g->size, sizeof(int));
    if (!all || !blamed || !cls) die("out of host memory");
    MPI_Request req;
    MPI_Iallgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, c->mpi, &req);
    polite_wait(&req);
    char gt[160], line[1500];
    group_text(g, gt, sizeof gt);
    int receiver = -1;
    for (int r = 0; r < g->size && receiver < 0; r++)
        if (all[r].bad_from >= 0) receiver = r;
    if (receiver >= 0) {
        const check_desc *d = &all[receiver];
        char sig[300];
        signature_text(&all[d->bad_from], g, sig, sizeof sig);
        snprintf(line, sizeof line, "%s: in %s rank %d sends %lld value%s to rank %d, which expects %lld "
                 "(found by --check-collectives before the call)", gt, sig, g->members[d->bad_from], d->bad_sent,
                 d->bad_sent == 1 ? "" : "s", g->members[receiver], d->bad_expected);
    } else {
        /* classes of equal calls; the rank that left its last step's path, else the smaller class */
        int n_cls = 0, deviating = 0, known = 1;
        for (int r = 0; r < g->size; r++) {
            cls[r] = -1;
            for (int q = 0; q < r && cls[r] < 0; q++)
                if (same_signature(&all[q], &all[r])) cls[r] = cls[q];
            if (cls[r] < 0) cls[r] = n_cls++;
            deviating += all[r].deviates == 1;
            known &= all[r].deviates >= 0;
        }
        int blamed_cls = -1;
        if (known && deviating > 0 && deviating < g->size) {
            for (int r = 0; r < g->size; r++) blamed[r] = all[r].deviates == 1;
        } else {
            int *size = calloc((size_t)n_cls, sizeof(int)), smallest = -1, ties = 0;
            for (int r = 0; r < g->size; r++) size[cls[r]]++;
            for (int k = 0; k < n_cls; k++)
                if (smallest < 0 || size[k] < size[smallest]) { smallest = k; ties = 0; }
                else if (size[k] == size[smallest]) ties++;
            if (!ties) blamed_cls = smallest;
            for (int r = 0; r < g->size; r++) blamed[r] = cls[r] == blamed_cls;
            free(size);
        }
        /* the others first, then the blamed, each class once */
        size_t at = (size_t)snprintf(line, sizeof line, "%s:", gt);
        int *in = calloc((size_t)g->size, sizeof(int)), first = 1;
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < n_cls; k++) {
                int any = 0;
                for (int r = 0; r < g->size; r++) {
                    in[r] = cls[r] == k && blamed[r] == pass;
                    any |= in[r];
                }
                if (!any) continue;
                int lead = 0;
                while (!in[lead]) lead++;
                char who[200], sig[300];
                ranks_text(g, in, who, sizeof who);
                signature_text(&all[lead], g, sig, sizeof sig);
                int n = 0;
                for (int r = 0; r < g->size; r++) n += in[r];
                at += (size_t)snprintf(line + at, sizeof line - at, "%s %s %s in %s", first ? "" : ";", who,
                                       n == 1 ? "is" : "are", sig);
                first = 0;
            }
        int n_blamed = 0, lead = -1;
        for (int r = 0; r < g->size; r++)
            if (blamed[r]) { n_blamed++; if (lead < 0) lead = r; }
        if (n_blamed && at < sizeof line) {
            for (int r = 0; r < g->size; r++) in[r] = blamed[r];
            char who[200];
            ranks_text(g, in, who, sizeof who);
            if (known && deviating > 0 && deviating < g->size)
                at += (size_t)snprintf(line + at, sizeof line - at, " - %s took another path at step %d", who,
                                       all[lead].step + 1);
            else
                at += (size_t)snprintf(line + at, sizeof line - at, " - %s differ%s from the rest", who,
                                       n_blamed == 1 ? "s" : "");
        }
        if (at < sizeof line)
            snprintf(line + at, sizeof line - at, " (found by --check-collectives before the call)");
        free(in);
    }
    /* every member writes its record; the group's first rank prints the report's line */
    textbuf e = {0};
    textbuf_printf(&e, "\"check\":");
    textbuf_json_string(&e, line);
    textbuf_printf(&e, ",");
    char what[1700];
    if (g->rank == 0) snprintf(what, sizeof what, "check-collectives: %s", line);
    else snprintf(what, sizeof what, "check-collectives: the calls of %s differ (rank %d's line says how)", gt,
                  g->members[0]);
    free(all);
    free(blamed);
    free(cls);
    stop_now("check-collectives", what, e.s);
}

void flight_check(comm *c, flight_kind kind, comm_type type, long count, int root, const long *send_counts, const long *recv_counts) {
    if (!flight_check_collectives || !c->flight || c->size <= 1) return;
    const double t0 = now_seconds();
    flight_group *g = c->flight;
    const int a2a = kind == FL_ALLTOALL || kind == FL_ALLTOALLV;
    int mb, step;
    const char *after, *where = trace_context(&mb, &step, &after);
    check_desc mine = {.kind = kind, .type = type, .root = root, .step = step, .mb = mb,
                       .count = count, .seq = g->collectives, .bad_from = -1};
    flight_op now = {.id = -1, .kind = kind, .group = g->id, .seq = g->collectives, .count = count,
                     .type = type, .root = root, .peer = -1, .tag = -1, .where = where ? where : after,
                     .after = !where && after, .mb = mb, .step = step, .received = -1};
    label_text(&now, mine.label, sizeof mine.label);
    const int same = pattern_compare(&g->coll, step, call_hash(&now));
    mine.deviates = same < 0 ? -1 : !same;
    now.same_as_last_step = same;
    pthread_mutex_lock(&lock);
    pending.op = now;
    pending.since = t0;
    pending.checking = 1;
    pending.valid = 1;
    pthread_mutex_unlock(&lock);
    /* all-to-alls: the kind is one (the even form is the v-form with equal counts) and
     * the counts differ by rank; they are checked pair by pair below */
    unsigned long long h = 1469598103934665603ULL;
    h = fnv(h, a2a ? FL_ALLTOALLV : kind);
    h = fnv(h, a2a ? 0 : count);
    h = fnv(h, mine.type);
    h = fnv(h, root);
    h = fnv(h, step);
    long long v[2] = {(long long)(h >> 2), -(long long)(h >> 2)}, m[2];
    MPI_Request req;
    MPI_Iallreduce(v, m, 2, MPI_LONG_LONG, MPI_MAX, c->mpi, &req);
    polite_wait(&req);
    int bad = m[0] != -m[1];
    if (!bad && a2a) {
        long long *mine_sent = malloc(sizeof(long long) * 2 * (size_t)g->size), *theirs = mine_sent + g->size;
        if (!mine_sent) die("out of host memory");
        for (int j = 0; j < g->size; j++) mine_sent[j] = send_counts ? send_counts[j] : count;
        MPI_Ialltoall(mine_sent, 1, MPI_LONG_LONG, theirs, 1, MPI_LONG_LONG, c->mpi, &req);
        polite_wait(&req);
        for (int j = 0; j < g->size && mine.bad_from < 0; j++) {
            long long expected = recv_counts ? recv_counts[j] : count;
            if (theirs[j] != expected) {
                mine.bad_from = j;
                mine.bad_sent = theirs[j];
                mine.bad_expected = expected;
            }
        }
        free(mine_sent);
        int any = mine.bad_from >= 0, anywhere = 0;
        MPI_Iallreduce(&any, &anywhere, 1, MPI_INT, MPI_MAX, c->mpi, &req);
        polite_wait(&req);
        bad = anywhere;
        if (bad) mine.count = send_counts ? 0 : count;
        if (bad && send_counts)
            for (int j = 0; j < g->size; j++) mine.count += send_counts[j];
    }
    if (bad) {
        atomic_store(&own_stop_since, now_seconds());
        check_failed(c, &mine);
    }
    flight_wait_end();
    check_count++;
    check_seconds += now_seconds() - t0;
}

void flight_check_cost(long *checks, double *seconds) {
    *checks = check_count;
    *seconds = check_seconds;
}
