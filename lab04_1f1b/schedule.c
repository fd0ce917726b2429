#include "schedule.h"
#include "theory.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[SCHEDULE_KINDS] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};

static int min_int(int a, int b) { return a < b ? a : b; }

/* No device, no MPI here: a failure is a bug in a generator, reported and fatal. */
static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "schedule: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

static void *alloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) fail("out of host memory");
    return p;
}

int schedule_parse(const char *name) {
    for (int k = 0; k < SCHEDULE_KINDS; k++)
        if (!strcmp(name, names[k])) return k;
    return -1;
}

const char *schedule_name(schedule_kind kind) { return names[kind]; }

int schedule_chunks(schedule_kind kind, int v) {
    return kind == SCHEDULE_INTERLEAVED ? v : kind == SCHEDULE_ZB_V ? 2 : 1;
}

long long schedule_messages(int p, int m, int chunks) { return 2LL * p * chunks * m; }

int schedule_splits_backward(schedule_kind kind) { return kind == SCHEDULE_ZB_H1 || kind == SCHEDULE_ZB_V; }

int schedule_check(schedule_kind kind, int p, int m, int v, int v_given, int layers, char *msg, int len) {
    const char *name = names[kind];
    if (v_given && kind != SCHEDULE_INTERLEAVED && !(kind == SCHEDULE_ZB_V && v == 2)) {
        snprintf(msg, (size_t)len, kind == SCHEDULE_ZB_V
                 ? "--virtual-stages %d: --schedule %s always runs 2 chunks per rank"
                 : "--virtual-stages %d: --schedule %s runs one chunk per rank (only interleaved takes --virtual-stages)",
                 v, name);
        return 0;
    }
    if (kind == SCHEDULE_INTERLEAVED && v < 2) {
        snprintf(msg, (size_t)len, "--virtual-stages %d: interleaved needs at least 2 chunks per rank "
                 "(one chunk is --schedule 1f1b)", v);
        return 0;
    }
    /* products in 64 bits: p x v and 2 p v m of flags up to 10^9 overflow an int */
    const int chunks = schedule_chunks(kind, v);
    const long long stages = (long long)p * chunks;
    if (chunks > 1 && layers % stages != 0) {
        snprintf(msg, (size_t)len, "--layers %d is not divisible by %lld virtual stages (%d ranks x %d chunks "
                 "of --schedule %s): every chunk holds the same number of layers", layers, stages, p, chunks, name);
        return 0;
    }
    if (chunks == 1 && layers < p) {
        snprintf(msg, (size_t)len, "--layers %d cannot be split into %d pipeline stages: every stage needs at "
                 "least one layer (give more --layers or run fewer ranks)", layers, p);
        return 0;
    }
    if (kind == SCHEDULE_INTERLEAVED && m % p != 0) {
        snprintf(msg, (size_t)len, "--micro-batches %d: interleaved needs a multiple of the %d pipeline stages "
                 "(micro-batches go round the ranks in groups of p)", m, p);
        return 0;
    }
    if (kind == SCHEDULE_ZB_H1 && m < p) {
        snprintf(msg, (size_t)len, "--micro-batches %d: zb-h1 needs at least as many micro-batches as the %d "
                 "pipeline stages", m, p);
        return 0;
    }
    if (kind == SCHEDULE_ZB_V && m < 2 * p - 1) {
        snprintf(msg, (size_t)len, "--micro-batches %d: zb-v needs at least 2p-1 = %d micro-batches on %d ranks",
                 m, 2 * p - 1, p);
        return 0;
    }
    if (schedule_messages(p, m, chunks) > SCHEDULE_MAX_MESSAGES) {
        snprintf(msg, (size_t)len, "--micro-batches %d x %lld virtual stages (%d ranks x %d chunks): %lld messages "
                 "per step, more than MPI's guaranteed tags allow (one tag per message, at most %d)", m, stages, p, chunks,
                 schedule_messages(p, m, chunks), SCHEDULE_MAX_MESSAGES);
        return 0;
    }
    return 1;
}

/* ---- the generators: one rank's list each ----------------------------------------- */

/* A rank's list under construction, with a counter per (op, chunk): each
 * F, B or W of a chunk takes that chunk's next micro-batch, in order 0, 1, ... */
typedef struct {
    schedule *s;
    int r, n;
    int next[OP_KINDS][2];
} builder;

static void emit_mb(builder *b, schedule_op op, int mb, int chunk) {
    int cap = 3 * b->s->m * b->s->v;
    if (b->n >= cap) fail("%s: rank %d has more than %d actions", names[b->s->kind], b->r, cap);
    b->s->rank[b->r][b->n++] = (schedule_action){op, mb, chunk};
}

static void emit(builder *b, schedule_op op, int chunk) {
    int mb = b->next[op][chunk]++;
    if (mb >= b->s->m) fail("%s: rank %d runs a %c of chunk %d past the last micro-batch", names[b->s->kind], b->r,
                            "FBW"[op], chunk);
    emit_mb(b, op, mb, chunk);
}

static int done(const builder *b, schedule_op op, int chunk) { return b->next[op][chunk]; }

static void make_gpipe(builder *b) {
    for (int i = 0; i < b->s->m; i++) emit(b, OP_F, 0);
    for (int i = 0; i < b->s->m; i++) emit(b, OP_B, 0);
}

/* Warm-up forwards, then one forward and one backward in turn, then the cool-down. */
static void make_1f1b(builder *b) {
    int p = b->s->p, m = b->s->m, warmup = min_int(p - b->r - 1, m);
    for (int i = 0; i < warmup; i++) emit(b, OP_F, 0);
    for (int i = 0; i < m - warmup; i++) {
        emit(b, OP_F, 0);
        emit(b, OP_B, 0);
    }
    for (int i = 0; i < warmup; i++) emit(b, OP_B, 0);
}

/* Megatron-LM's interleaved 1F1B. The rank's k-th forward: k = g p v + j takes
 * micro-batch g p + j mod p on chunk j / p, so micro-batches go through chunk
 * 0 in groups of p, then the same group through chunk 1, and so on; the k-th
 * backward takes the same micro-batch on chunk v - 1 - j / p (backwards run
 * the chunks in reverse). */
static void interleaved_action(const schedule *s, int k, int backward, int *mb, int *chunk) {
    int p = s->p, v = s->v, group = k / (p * v), j = k % (p * v);
    *mb = group * p + j % p;
    *chunk = backward ? v - 1 - j / p : j / p;
}

static void make_interleaved(builder *b) {
    const schedule *s = b->s;
    int p = s->p, total = s->m * s->v, mb, chunk;
    /* 2(p-r-1): a micro-batch must pass the later ranks and come back before
     * this rank's first backward; (v-1) p: the other chunks' first group. With
     * m = p there is no steady state: all forwards first, as Megatron does. */
    int warmup = s->m == p ? total : min_int(total, 2 * (p - b->r - 1) + (s->v - 1) * p);
    for (int k = 0; k < warmup; k++) {
        interleaved_action(s, k, 0, &mb, &chunk);
        emit_mb(b, OP_F, mb, chunk);
    }
    for (int k = 0; k < total - warmup; k++) {
        interleaved_action(s, warmup + k, 0, &mb, &chunk);
        emit_mb(b, OP_F, mb, chunk);
        interleaved_action(s, k, 1, &mb, &chunk);
        emit_mb(b, OP_B, mb, chunk);
    }
    for (int k = total - warmup; k < total; k++) {
        interleaved_action(s, k, 1, &mb, &chunk);
        emit_mb(b, OP_B, mb, chunk);
    }
}

/* 1F1B's order with B split from W. The B's go back at once, which is what
 * shortens the pipeline's drain; stage r then keeps r W's pending through the
 * steady state (so it holds at most p micro-batches, 1F1B's stage 0) and runs
 * them in the cool-down, one after each B, where it would otherwise wait for
 * the next B to come down from the later stages. */
static void make_zb_h1(builder *b) {
    int p = b->s->p, m = b->s->m, r = b->r, warmup = min_int(p - r - 1, m);
    for (int i = 0; i < warmup; i++) emit(b, OP_F, 0);
    for (int i = 0; i < m - warmup; i++) {
        emit(b, OP_F, 0);
        emit(b, OP_B, 0);
        while (done(b, OP_B, 0) - done(b, OP_W, 0) > r) emit(b, OP_W, 0);
    }
    for (int i = 0; i < warmup; i++) {
        emit(b, OP_B, 0);
        emit(b, OP_W, 0);
    }
    while (done(b, OP_W, 0) < m) emit(b, OP_W, 0);
}

/* The V: chunk 0 (stage r) on the way down the ranks, chunk 1 (stage 2p-1-r)
 * on the way back up, so the turn at rank p-1 and the loss at rank 0 need no
 * message in between. Unit times make it tight (the paper's figure 6):
 *  1. 2(p-r)-1 forwards of chunk 0: rank p-1 starts its chunk 1 right after
 *     its first chunk-0 forward; rank r is 2(p-1-r) chunk-steps behind it.
 *  2. r pairs (chunk-1 forward, chunk-0 forward) while chunk 1's first
 *     micro-batch climbs back to rank r.
 *  3. p-r rounds of chunk 1's F, B, W: its first backwards start at rank 0
 *     (the loss) and arrive here in step with these forwards.
 *  4. the steady state: chunk 0's F, B, W then chunk 1's F, B, W, until chunk
 *     1 has run all m forwards (chunk 0's end p-r rounds earlier).
 *  5. the cool-down: r pairs of B's (chunk 0, chunk 1) deferring their W's,
 *     then p-r rounds of chunk 0's B with one deferred W each, then the W's
 *     left: the W's fill the gaps where the last B's climb the pipeline. */
static void make_zb_v(builder *b) {
    int p = b->s->p, m = b->s->m, r = b->r;
    for (int i = 0; i < 2 * (p - r) - 1; i++) emit(b, OP_F, 0);
    for (int i = 0; i < r; i++) {
        emit(b, OP_F, 1);
        emit(b, OP_F, 0);
    }
    for (int i = 0; i < p - r; i++) {
        emit(b, OP_F, 1);
        emit(b, OP_B, 1);
        emit(b, OP_W, 1);
    }
    while (done(b, OP_F, 1) < m) {
        if (done(b, OP_F, 0) < m) emit(b, OP_F, 0); /* chunk 0 is ahead by its warm-up */
        emit(b, OP_B, 0);
        emit(b, OP_W, 0);
        emit(b, OP_F, 1);
        emit(b, OP_B, 1);
        emit(b, OP_W, 1);
    }
    for (int i = 0; i < r; i++) {
        emit(b, OP_B, 0);
        emit(b, OP_B, 1);
    }
    for (int i = 0; i < p - r; i++) {
        emit(b, OP_B, 0);
        emit(b, OP_W, 0);
    }
    while (done(b, OP_W, 1) < m) emit(b, OP_W, 1);
    while (done(b, OP_W, 0) < m) emit(b, OP_W, 0);
}

void schedule_make(schedule *s, schedule_kind kind, int p, int m, int v) {
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->p = p;
    s->m = m;
    s->v = schedule_chunks(kind, v);
    s->split = schedule_splits_backward(kind);
    s->count = alloc((size_t)p, sizeof *s->count);
    s->rank = alloc((size_t)p, sizeof *s->rank);
    for (int r = 0; r < p; r++) {
        s->rank[r] = alloc((size_t)(3 * m * s->v), sizeof **s->rank);
        builder b = {.s = s, .r = r};
        switch (kind) {
        case SCHEDULE_GPIPE: make_gpipe(&b); break;
        case SCHEDULE_1F1B: make_1f1b(&b); break;
        case SCHEDULE_INTERLEAVED: make_interleaved(&b); break;
        case SCHEDULE_ZB_H1: make_zb_h1(&b); break;
        case SCHEDULE_ZB_V: make_zb_v(&b); break;
        default: fail("unknown schedule %d", (int)kind);
        }
        s->count[r] = b.n;
    }
    schedule_simulate(s, 1, 1, 1, NULL); /* dies on a list that is incomplete or waits for ever */
}

void schedule_forward_only(const schedule *s, schedule *out) {
    *out = *s;
    out->forward_only = 1;
    out->count = alloc((size_t)s->p, sizeof *out->count);
    out->rank = alloc((size_t)s->p, sizeof *out->rank);
    for (int r = 0; r < s->p; r++) {
        out->rank[r] = alloc((size_t)s->count[r], sizeof **out->rank);
        for (int i = 0; i < s->count[r]; i++)
            if (s->rank[r][i].op == OP_F) out->rank[r][out->count[r]++] = s->rank[r][i];
    }
}

void schedule_free(schedule *s) {
    for (int r = 0; r < s->p; r++) free(s->rank[r]);
    free(s->rank);
    free(s->count);
    memset(s, 0, sizeof *s);
}

/* ---- placement ------------------------------------------------------------------------ */

int schedule_stages(const schedule *s) { return s->p * s->v; }

int schedule_stage_of(const schedule *s, int rank, int chunk) { return th_chunk_stage(s->kind, s->p, rank, chunk); }

void schedule_place(const schedule *s, int stage, int *rank, int *chunk) {
    th_stage_place(s->kind, s->p, stage, rank, chunk);
}

int schedule_remote_links(const schedule *s, int rank) {
    int links = 0, S = schedule_stages(s);
    for (int c = 0; c < s->v; c++) {
        int st = schedule_stage_of(s, rank, c), r, chunk;
        for (int nb = st - 1; nb <= st + 1; nb += 2) {
            if (nb < 0 || nb >= S) continue;
            schedule_place(s, nb, &r, &chunk);
            links += r != rank;
        }
    }
    return links;
}

/* ---- the simulation ---------------------------------------------------------------- */

double schedule_simulate(const schedule *s, double t_f, double t_b, double t_w, double ***start_out) {
    const int S = schedule_stages(s), m = s->m;
    const double dur[OP_KINDS] = {t_f / s->v, (s->split ? t_b : t_b + t_w) / s->v, t_w / s->v};
    /* finish[op][stage][mb], -1 until done */
    double *finish = alloc((size_t)OP_KINDS * S * m, sizeof *finish);
    for (long i = 0; i < (long)OP_KINDS * S * m; i++) finish[i] = -1;
#define FINISH(op, st, mb) finish[((size_t)(op) * S + (size_t)(st)) * m + (size_t)(mb)]
    int *pos = alloc((size_t)s->p, sizeof *pos);
    double *clock = alloc((size_t)s->p, sizeof *clock), **start = NULL;
    if (start_out) {
        start = alloc((size_t)s->p, sizeof *start);
        for (int r = 0; r < s->p; r++) start[r] = alloc((size_t)s->count[r], sizeof **start);
    }
    int left = 0;
    for (int r = 0; r < s->p; r++) left += s->count[r];
    int expected = S * m * (s->forward_only ? 1 : s->split ? 3 : 2);
    if (left != expected) fail("%s: %d actions, expected %d", names[s->kind], left, expected);
    while (left > 0) {
        int progressed = 0;
        for (int r = 0; r < s->p; r++) {
            for (; pos[r] < s->count[r]; pos[r]++) {
                schedule_action a = s->rank[r][pos[r]];
                int st = schedule_stage_of(s, r, a.chunk);
                if (a.mb < 0 || a.mb >= m || a.chunk < 0 || a.chunk >= s->v || (a.op == OP_W && !s->split))
                    fail("%s: rank %d has an impossible action", names[s->kind], r);
                if (FINISH(a.op, st, a.mb) >= 0) fail("%s: rank %d repeats an action", names[s->kind], r);
                double ready = clock[r];
                double deps[2] = {-2, -2}; /* -2: none; -1: not yet done */
                if (a.op == OP_F) {
                    if (st > 0) deps[0] = FINISH(OP_F, st - 1, a.mb);
                } else if (a.op == OP_B) {
                    deps[0] = FINISH(OP_F, st, a.mb);
                    if (st < S - 1) deps[1] = FINISH(OP_B, st + 1, a.mb);
                } else {
                    deps[0] = FINISH(OP_B, st, a.mb);
                }
                if (deps[0] == -1 || deps[1] == -1) break; /* waits for another rank */
                ready = fmax(ready, fmax(deps[0], deps[1]));
                if (start) start[r][pos[r]] = ready;
                clock[r] = FINISH(a.op, st, a.mb) = ready + dur[a.op];
                left--;
                progressed = 1;
            }
        }
        if (!progressed) fail("%s (p %d, m %d, v %d): the lists wait for each other for ever", names[s->kind],
                              s->p, s->m, s->v);
    }
#undef FINISH
    double makespan = 0;
    for (int r = 0; r < s->p; r++) makespan = fmax(makespan, clock[r]);
    free(finish);
    free(pos);
    free(clock);
    if (start_out) *start_out = start;
    return makespan;
}

double schedule_simulated_bubble(const schedule *s, double t_f, double t_b, double t_w) {
    double work = s->m * (t_f + t_b + t_w);
    return 1 - work / schedule_simulate(s, t_f, t_b, t_w, NULL);
}

/* ---- the formulas: theory/'s, which plan3d and lab06 print too ------------------------ */

_Static_assert((int)SCHEDULE_GPIPE == (int)TH_SCHED_GPIPE && (int)SCHEDULE_1F1B == (int)TH_SCHED_1F1B &&
               (int)SCHEDULE_INTERLEAVED == (int)TH_SCHED_INTERLEAVED && (int)SCHEDULE_ZB_H1 == (int)TH_SCHED_ZB_H1 &&
               (int)SCHEDULE_ZB_V == (int)TH_SCHED_ZB_V, "schedule_kind follows theory.h's th_schedule");

double schedule_bubble_formula(const schedule *s, double t_f, double t_b, double t_w) {
    const th_schedule k = s->kind;
    if (!th_bubble_time_exact(k, t_f, t_b, t_w)) return schedule_simulated_bubble(s, t_f, t_b, t_w);
    double idle = th_bubble_time(k, s->p, s->m, s->v, t_f, t_b, t_w);
    return idle / (idle + s->m * (t_f + t_b + t_w));
}

const char *schedule_bubble_formula_text(schedule_kind kind) {
    static char text[SCHEDULE_KINDS][128];
    if (!text[kind][0])
        snprintf(text[kind], sizeof text[kind], "%s idle per rank%s", th_bubble_time_text(kind),
                 kind == SCHEDULE_ZB_V ? " where tW<=tF<=tB, else its lists simulated" : "");
    return text[kind];
}

double schedule_bubble_textbook(schedule_kind kind, int p, int m, int v) {
    return th_bubble_unit(kind, p, m, v);
}

const char *schedule_bubble_textbook_text(schedule_kind kind) { return th_bubble_unit_text(kind); }

/* ---- memory --------------------------------------------------------------------------- */

void schedule_in_flight(const schedule *s, int rank, int chunk, int *acts, int *wgrads) {
    th_chunk_in_flight(s->kind, s->p, s->m, s->v, rank, chunk, acts, wgrads);
}

/* ---- printing ------------------------------------------------------------------------- */

void schedule_action_text(const schedule *s, schedule_action a, char *buf, int len) {
    const char letter = "FBW"[a.op];
    if (s->v > 1) snprintf(buf, (size_t)len, "%c%d.%d", letter, a.mb, a.chunk);
    else snprintf(buf, (size_t)len, "%c%d", letter, a.mb);
}

void schedule_print(const schedule *s) {
    printf("schedule %s: %d ranks x %d chunk%s (%d virtual stages), %d micro-batches, %s\n", names[s->kind], s->p,
           s->v, s->v == 1 ? "" : "s", schedule_stages(s), s->m,
           s->split ? "backward split: B = input gradient, W = weight gradient"
                    : "B = the whole backward");
    for (int r = 0; r < s->p; r++) {
        printf("rank %d (stage%s", r, s->v == 1 ? "" : "s");
        for (int c = 0; c < s->v; c++) printf(" %d", schedule_stage_of(s, r, c));
        printf("):");
        for (int i = 0; i < s->count[r]; i++) {
            char t[32];
            schedule_action_text(s, s->rank[r][i], t, sizeof t);
            printf(" %s", t);
        }
        printf("\n");
    }
    double makespan = schedule_simulate(s, 1, 1, 1, NULL);
    printf("unit times (tF = tB = tW = 1 per rank's share, sends free): makespan %g, work %d per rank, "
           "bubble %.4f; textbook %s = %.4f\n", makespan, 3 * s->m, 1 - 3.0 * s->m / makespan,
           schedule_bubble_textbook_text(s->kind), schedule_bubble_textbook(s->kind, s->p, s->m, s->v));
    printf("activation blocks at the peak, per chunk (acts + weight-gradient inputs):");
    for (int r = 0; r < s->p; r++) {
        printf(" rank %d", r);
        for (int c = 0; c < s->v; c++) {
            int a, w;
            schedule_in_flight(s, r, c, &a, &w);
            printf("%s%d", c ? "," : " ", a);
            if (s->split) printf("+%d", w);
        }
        printf(r < s->p - 1 ? ";" : "\n");
    }
    fflush(stdout);
}
