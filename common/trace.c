/* Per-rank timeline of compute and communication events.
 *
 * Events live in a growable array. On the CPU their times are read from the
 * host clock when trace_begin / trace_end run. On CUDA they are cudaEvents
 * recorded on the event's stream and turned into seconds later (after the GPU
 * has passed them), so the timeline shows when the GPU did the work.
 *
 * CUDA times: cudaEventElapsedTime returns float milliseconds, which after ten
 * minutes of run would only resolve ~60 us. So every step's begin event is an
 * "anchor": its time is chained from the previous anchor (a short, precise
 * interval), and each event is measured from the anchor current when it was
 * recorded. The first anchor is recorded together with a host now_seconds(),
 * which puts GPU times on the same clock as the CPU path. */
#define _POSIX_C_SOURCE 200809L
#include "trace.h"
#include "wait.h"
#include "device.h"
#include "jsonval.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef PL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef struct {
    const char *op;
    trace_kind kind;
    int micro_batch, step;
    int open;        /* begun, not yet ended */
    int resolved;    /* t0, t1 are valid */
    double t0, t1;   /* seconds on the host's monotonic clock */
#ifdef PL_HAVE_CUDA
    cudaEvent_t e0, e1; /* until resolved, on the CUDA path */
    cudaStream_t stream;
    int anchor;
#endif
} event;

typedef struct {
    int step;
    int ended, resolved;
    double t0, t1;
#ifdef PL_HAVE_CUDA
    int anchor;      /* the step's begin event is anchors[anchor] */
    cudaEvent_t e1;
#endif
} step_span;

static int inited;
static int current_step = -1;
/* The open events, innermost last: the flight recorder (flight.h) names a
 * communication after the event it happens in. Deeper nesting is not tracked. */
enum { OPEN_MAX = 16 };
static int open_events[OPEN_MAX], n_open;
static const char *last_compute; /* the op of the compute event that ended last in this step */
static event *events;
static size_t n_events, cap_events, first_unresolved;
static step_span *steps;
static size_t n_steps, cap_steps;

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    p = realloc(p, c * elem);
    if (!p) die("out of host memory for the trace");
    *cap = c;
    return p;
}

#ifdef PL_HAVE_CUDA
typedef struct { cudaEvent_t ev; double t; } anchor;
static anchor *anchors;
static size_t n_anchors, cap_anchors, anchors_resolved;
static cudaEvent_t *pool; /* recorded-and-resolved events, ready for reuse */
static size_t n_pool, cap_pool;

static cudaEvent_t pool_get(void) {
    if (n_pool) return pool[--n_pool];
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e)); /* timing enabled: no DisableTiming flag */
    return e;
}

static void pool_put(cudaEvent_t e) {
    pool = grow(pool, &cap_pool, n_pool + 1, sizeof *pool);
    pool[n_pool++] = e;
}

static cudaStream_t stream_of(void *s) {
    return s ? (cudaStream_t)s : (cudaStream_t)device_compute_stream();
}

/* The first anchor: a GPU event and the host time at which it happened. */
static void ensure_reference(void) {
    if (n_anchors) return;
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    cudaStream_t s = stream_of(NULL);
    CUDA_CHECK(cudaEventRecord(e, s));
    CUDA_CHECK(cudaEventSynchronize(e));
    anchors = grow(anchors, &cap_anchors, 1, sizeof *anchors);
    anchors[0] = (anchor){e, now_seconds()};
    n_anchors = anchors_resolved = 1;
}

static double since_anchor(int a, cudaEvent_t e) {
    float ms = 0;
    CUDA_CHECK(cudaEventSynchronize(e));
    CUDA_CHECK(cudaEventElapsedTime(&ms, anchors[a].ev, e));
    return anchors[a].t + 1e-3 * (double)ms;
}
#endif

/* Turn every finished CUDA event into seconds (no-op on the CPU path). */
static void resolve(void) {
#ifdef PL_HAVE_CUDA
    for (; anchors_resolved < n_anchors; anchors_resolved++) {
        size_t i = anchors_resolved;
        anchors[i].t = since_anchor((int)i - 1, anchors[i].ev);
    }
    size_t keep = n_events;
    for (size_t i = first_unresolved; i < n_events; i++) {
        event *ev = &events[i];
        if (ev->resolved) continue;
        if (ev->open) { if (keep == n_events) keep = i; continue; }
        ev->t1 = since_anchor(ev->anchor, ev->e1); /* e1 done implies e0 done */
        ev->t0 = since_anchor(ev->anchor, ev->e0);
        pool_put(ev->e0);
        pool_put(ev->e1);
        ev->e0 = ev->e1 = NULL;
        ev->resolved = 1;
    }
    first_unresolved = keep;
    for (size_t i = 0; i < n_steps; i++) {
        step_span *s = &steps[i];
        if (!s->ended || s->resolved) continue;
        s->t0 = anchors[s->anchor].t;
        s->t1 = since_anchor(s->anchor, s->e1);
        pool_put(s->e1);
        s->e1 = NULL;
        s->resolved = 1;
    }
#endif
}

void trace_init(MPI_Comm world) {
    (void)world; /* events carry no rank: trace_write learns it from its gather */
    trace_reset();
    inited = 1;
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) ensure_reference();
#endif
}

static void push_open(int handle) {
    if (n_open < OPEN_MAX) open_events[n_open++] = handle;
}

static void pop_open(int handle) {
    for (int i = n_open; i-- > 0;)
        if (open_events[i] == handle) {
            memmove(open_events + i, open_events + i + 1, sizeof(int) * (size_t)(n_open - i - 1));
            n_open--;
            return;
        }
}

int trace_begin(const char *op, trace_kind kind, int micro_batch, void *stream) {
    if (!inited) return -1;
    events = grow(events, &cap_events, n_events + 1, sizeof *events);
    event *ev = &events[n_events];
    *ev = (event){.op = op, .kind = kind, .micro_batch = micro_batch,
                  .step = current_step, .open = 1};
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        ensure_reference();
        ev->stream = stream_of(stream);
        ev->anchor = (int)n_anchors - 1;
        ev->e0 = pool_get();
        CUDA_CHECK(cudaEventRecord(ev->e0, ev->stream));
        push_open((int)n_events);
        return (int)n_events++;
    }
#endif
    (void)stream;
    ev->t0 = now_seconds();
    push_open((int)n_events);
    return (int)n_events++;
}

const char *trace_context(int *micro_batch, int *step, const char **after) {
    *step = current_step;
    *micro_batch = -1;
    *after = n_open ? NULL : last_compute;
    if (!n_open) return NULL;
    const event *ev = &events[open_events[n_open - 1]];
    *micro_batch = ev->micro_batch;
    return ev->op;
}

void trace_end(int handle) {
    if (handle < 0 || (size_t)handle >= n_events || !events[handle].open) return;
    event *ev = &events[handle];
    pop_open(handle);
    if (ev->kind == TRACE_COMPUTE) last_compute = ev->op;
#ifdef PL_HAVE_CUDA
    if (ev->e0) {
        ev->e1 = pool_get();
        CUDA_CHECK(cudaEventRecord(ev->e1, ev->stream));
        ev->open = 0;
        return;
    }
#endif
    ev->t1 = now_seconds();
    ev->open = 0;
    ev->resolved = 1;
}

void trace_step_begin(int step) {
    current_step = step;
    last_compute = NULL;
    if (!inited) return;
    steps = grow(steps, &cap_steps, n_steps + 1, sizeof *steps);
    step_span *s = &steps[n_steps++];
    *s = (step_span){.step = step};
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        ensure_reference();
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e)); /* anchors are kept, not pooled */
        CUDA_CHECK(cudaEventRecord(e, stream_of(NULL)));
        anchors = grow(anchors, &cap_anchors, n_anchors + 1, sizeof *anchors);
        anchors[n_anchors] = (anchor){e, 0};
        s->anchor = (int)n_anchors++;
        return;
    }
#endif
    s->t0 = now_seconds();
}

void trace_step_end(int step) {
    current_step = -1;
    if (!inited) return;
    step_span *s = NULL;
    for (size_t i = n_steps; i-- > 0;)
        if (steps[i].step == step && !steps[i].ended) { s = &steps[i]; break; }
    if (!s) return; /* no matching trace_step_begin: nothing to close */
    s->ended = 1;
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        s->e1 = pool_get();
        CUDA_CHECK(cudaEventRecord(s->e1, stream_of(NULL)));
        /* Resolving here waits for the GPU to finish the step; the pending
         * events (and their pooled cudaEvents) never pile up beyond a step. */
        resolve();
        return;
    }
#endif
    s->t1 = now_seconds();
    s->resolved = 1;
}

typedef struct { double a, b; } interval;

static int by_start(const void *x, const void *y) {
    double a = ((const interval *)x)->a, b = ((const interval *)y)->a;
    return (a > b) - (a < b);
}

/* Seconds covered by the union of the intervals (sorts them in place). */
static double union_length(interval *v, size_t n) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, by_start);
    double total = 0, a = v[0].a, b = v[0].b;
    for (size_t i = 1; i < n; i++) {
        if (v[i].a > b) { total += b - a; a = v[i].a; b = v[i].b; }
        else if (v[i].b > b) b = v[i].b;
    }
    return total + (b - a);
}

trace_summary trace_summarize(int first_measured) {
    trace_summary sum = {0, 0, 0, 0, 0};
    resolve();
    for (size_t i = 0; i < n_steps; i++) {
        const step_span *s = &steps[i];
        if (!s->resolved || s->step < first_measured) continue;
        sum.wall += s->t1 - s->t0;
        sum.steps++;
    }
    interval *v = malloc((n_events ? n_events : 1) * sizeof *v);
    if (!v) die("out of host memory for the trace summary");
    double covered[3]; /* seconds inside compute events, inside comm events, inside either */
    for (int which = 0; which < 3; which++) {
        size_t n = 0;
        for (size_t i = 0; i < n_events; i++) {
            const event *ev = &events[i];
            if (!ev->resolved || (which < 2 && (int)ev->kind != (which ? TRACE_COMM : TRACE_COMPUTE))) continue;
            if (ev->step < 0 || ev->step < first_measured) continue;
            v[n++] = (interval){ev->t0, ev->t1};
        }
        covered[which] = union_length(v, n);
    }
    free(v);
    sum.busy = covered[0];
    sum.comm = covered[1];
    sum.compute = covered[2] - covered[1]; /* a second inside both (a nested all-reduce) is comm's */
    return sum;
}

double trace_op_seconds(const char *op, int first_measured, int *count) {
    resolve();
    double total = 0;
    int n = 0;
    for (size_t i = 0; i < n_events; i++) {
        const event *ev = &events[i];
        if (!ev->resolved || ev->step < 0 || ev->step < first_measured || strcmp(ev->op, op)) continue;
        total += ev->t1 - ev->t0;
        n++;
    }
    if (count) *count = n;
    return total;
}

/* What travels to rank 0: fixed size, so one MPI_BYTE Gatherv carries it. */
typedef struct {
    double t0, t1;
    int micro_batch, step, kind;
    char op[24];
} packed_event;

static void write_csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n\r")) { fputs(s, f); return; }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static FILE *open_for_writing(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write %s: %s", path, strerror(errno));
    return f;
}

static void close_written(FILE *f, const char *path) {
    /* A full disk shows up here, not at fprintf. */
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) die("cannot write %s: %s", path, strerror(errno));
}

static const char *kind_name(int kind) { return kind == TRACE_COMM ? "comm" : "compute"; }

/* Seconds as microseconds rounded to the nanosecond (Chrome trace times are us). */
static json_t *microseconds(double seconds) { return jsonval_number(round(1e9 * seconds) / 1e3); }

/* One event of the traceEvents array (a comma before all but the first); takes ev. */
static void write_event(FILE *f, json_t *ev, long index, const char *path) {
    if (!ev) die("out of host memory writing %s", path);
    if (index) fputs(",\n", f);
    /* 15 digits: times rounded to the nanosecond print as such, not as 17-digit noise */
    if (json_dumpf(ev, f, JSON_COMPACT | JSON_REAL_PRECISION(15)) != 0) die("cannot write %s: %s", path, strerror(errno));
    json_decref(ev);
}

void trace_write(MPI_Comm world, const char *json_path, const char *csv_path) {
    int rank, size;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    resolve();

    size_t n = 0;
    for (size_t i = 0; i < n_events; i++) n += events[i].resolved;
    if (n * sizeof(packed_event) > (size_t)0x7fffffff) die("trace too large to gather");
    packed_event *mine = calloc(n ? n : 1, sizeof *mine);
    if (!mine) die("out of host memory for the trace");
    for (size_t i = 0, j = 0; i < n_events; i++) {
        const event *ev = &events[i];
        if (!ev->resolved) continue;
        packed_event *p = &mine[j++];
        p->t0 = ev->t0;
        p->t1 = ev->t1;
        p->micro_batch = ev->micro_batch;
        p->step = ev->step;
        p->kind = ev->kind;
        strncpy(p->op, ev->op, sizeof p->op - 1); /* calloc left the terminator */
    }

    int my_bytes = (int)(n * sizeof(packed_event));
    int *bytes = NULL, *displs = NULL;
    packed_event *all = NULL;
    long total = 0;
    if (rank == 0) {
        bytes = malloc((size_t)size * sizeof *bytes);
        displs = malloc((size_t)size * sizeof *displs);
        if (!bytes || !displs) die("out of host memory for the trace");
    }
    /* Nonblocking + polite_wait: ranks that arrive early do not spin a core. */
    MPI_Request req;
    int rc = MPI_Igather(&my_bytes, 1, MPI_INT, bytes, 1, MPI_INT, 0, world, &req);
    if (rc != MPI_SUCCESS) die("MPI_Igather of trace sizes failed");
    polite_wait(&req);
    if (rank == 0) {
        long off = 0;
        for (int r = 0; r < size; r++) {
            displs[r] = (int)off;
            off += bytes[r];
            if (off > 0x7fffffff) die("trace too large to gather");
        }
        total = off / (long)sizeof(packed_event);
        all = malloc(off ? (size_t)off : 1);
        if (!all) die("out of host memory for the trace");
    }
    rc = MPI_Igatherv(mine, my_bytes, MPI_BYTE, all, bytes, displs, MPI_BYTE, 0, world, &req);
    if (rc != MPI_SUCCESS) die("MPI_Igatherv of trace events failed");
    polite_wait(&req);
    free(mine);
    if (rank != 0) return;

    /* Which rank each gathered event came from, and the job's earliest time. */
    int *owner = malloc((total ? (size_t)total : 1) * sizeof *owner);
    if (!owner) die("out of host memory for the trace");
    double origin = 0;
    for (int r = 0; r < size; r++) {
        long first = displs[r] / (long)sizeof(packed_event);
        long count = bytes[r] / (long)sizeof(packed_event);
        for (long i = first; i < first + count; i++) {
            owner[i] = r;
            if (i == 0 || all[i].t0 < origin) origin = all[i].t0;
        }
    }

    if (json_path) {
        /* One event object at a time through jansson (escaping, and numbers it
         * refuses when not finite), so a long run's trace needs no whole tree. */
        FILE *f = open_for_writing(json_path);
        fprintf(f, "{\"traceEvents\":[\n");
        long written = 0;
        for (int r = 0; r < size; r++) {
            char rank_name[32];
            snprintf(rank_name, sizeof rank_name, "rank %d", r);
            json_t *meta[4] = {
                json_pack("{s:s,s:s,s:i,s:i,s:{s:s}}", "name", "process_name", "ph", "M", "pid", r, "tid", 0,
                          "args", "name", rank_name),
                json_pack("{s:s,s:s,s:i,s:i,s:{s:i}}", "name", "process_sort_index", "ph", "M", "pid", r, "tid", 0,
                          "args", "sort_index", r),
                json_pack("{s:s,s:s,s:i,s:i,s:{s:s}}", "name", "thread_name", "ph", "M", "pid", r, "tid", 0,
                          "args", "name", kind_name(0)),
                json_pack("{s:s,s:s,s:i,s:i,s:{s:s}}", "name", "thread_name", "ph", "M", "pid", r, "tid", 1,
                          "args", "name", kind_name(1))};
            for (int k = 0; k < 4; k++) write_event(f, meta[k], written++, json_path);
        }
        for (long i = 0; i < total; i++) {
            const packed_event *p = &all[i];
            json_t *ev = json_pack("{s:o,s:s,s:s,s:i,s:i,s:o,s:o,s:{s:i,s:i}}", "name", jsonval_text(p->op),
                                   "cat", kind_name(p->kind), "ph", "X", "pid", owner[i],
                                   "tid", p->kind == TRACE_COMM ? 1 : 0, "ts", microseconds(p->t0 - origin),
                                   "dur", microseconds(p->t1 - p->t0), "args", "micro_batch", p->micro_batch,
                                   "step", p->step);
            write_event(f, ev, written++, json_path);
        }
        fprintf(f, "\n],\"displayTimeUnit\":\"ms\"}\n");
        close_written(f, json_path);
    }
    if (csv_path) {
        FILE *f = open_for_writing(csv_path);
        fprintf(f, "rank,start_us,end_us,op,kind,micro_batch,step\n");
        for (long i = 0; i < total; i++) {
            const packed_event *p = &all[i];
            fprintf(f, "%d,%.3f,%.3f,", owner[i], 1e6 * (p->t0 - origin), 1e6 * (p->t1 - origin));
            write_csv_field(f, p->op);
            fprintf(f, ",%s,%d,%d\n", kind_name(p->kind), p->micro_batch, p->step);
        }
        close_written(f, csv_path);
    }
    free(owner);
    free(all);
    free(bytes);
    free(displs);
}

void trace_reset(void) {
#ifdef PL_HAVE_CUDA
    /* Recording an event again is legal even if its last record is pending. */
    for (size_t i = 0; i < n_events; i++) {
        if (events[i].e0) pool_put(events[i].e0);
        if (events[i].e1) pool_put(events[i].e1);
    }
    for (size_t i = 0; i < n_steps; i++)
        if (steps[i].e1) pool_put(steps[i].e1);
#endif
    n_events = first_unresolved = 0;
    n_steps = 0;
    n_open = 0;
    last_compute = NULL;
    current_step = -1;
}
