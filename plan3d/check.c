/* plan3d --check DIR: each run in DIR/records.jsonl predicted from its own
 * flags, with theory/'s formulas, beside what the run measured.
 *
 *   memory      every category (params, grads, optim, acts, comm, workspace)
 *               on every rank, to the byte: the allocator's peak
 *   traffic     calls and payload bytes per step of every collective kind
 *               (the record's maximum over ranks), exactly
 *   bubble      pipeline labs: 1 - busy/step per rank; one-chunk schedules on
 *               the compute each rank measured (bubbles_from_own_compute),
 *               the others from the times below
 *   step time   the calibrated model rate, AdamW rate and link figures of
 *               this machine (plan3d --calibrate) applied to the run's FLOPs
 *               and bytes; ranks beyond the cores share them
 *
 * The records are read with jansson, the library common/record.c writes them
 * with: one JSON object per line, keys as README.md lists them. */
#define _POSIX_C_SOURCE 200809L /* getline, fdopen */
#include "calibrate.h"
#include "check.h"
#include "comm.h"
#include "cost.h"
#include "jsonval.h"
#include "predict.h"
#include "model.h"
#include "paths.h"
#include "shards.h"
#include "th_run_json.h"
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { KINDS = TH_PREDICTED_KINDS };

typedef struct run {
    /* theory/predict's config: what the record says ran, not which lab ran it
     * (cfg.schedule: the record names one, lab04's executor ran it;
     * cfg.tensor_parallel: the record names a tp, lab05's layers ran) */
    th_run cfg;
    const char *lab, *schedule; /* schedule: the order the pipeline ran (lab03's: gpipe) */
    int T, L, C, H;             /* cfg.model's shape */
    double bucket_mb, step_ms;  /* the record's bucket_mb and step_ms_median */
    double vb;                  /* bytes of one of the model's values: 4, or 2 in bf16 */
    int routing_sized;          /* lab08 without a per-sequence capacity: its received rows' buffers are the routing's */
} run;

typedef struct timing {
    const calibration *cal; /* NULL: no time predictions */
    double share;           /* the share of a core each busy rank gets */
} timing;

/* ---- times on this machine (calibration) ------------------------------------------ */

/* Forward + backward of layers [lo, hi) (+ head) for `rows` sequences at TP t. */
static double fwd_bwd_seconds(const timing *tm, const run *r, int lo, int hi, long rows, int t) {
    if (!tm->cal) return 0;
    const th_opts o = th_opts_course(t);
    const th_model *m = &r->cfg.model;
    double params = th_stage_params(m, &o, lo, hi) - (lo == 0 ? th_stage_params(m, &o, 0, 0) : 0); /* no lookups */
    double flops = (double)rows * r->T * (6 * params + 12.0 * (hi - lo) * r->T * r->C / t);
    return flops / (calibration_rate(tm->cal, r->C, (double)rows * r->T) * tm->share);
}

static double allreduce_seconds(const timing *tm, double bytes, int n) {
    if (!tm->cal || n <= 1) return 0;
    return link_time(comm_ring_factor(COLL_ALLREDUCE, n) * bytes, 2 * (n - 1), tm->cal->allreduce_gbs, tm->cal->allreduce_us);
}

static double gather_seconds(const timing *tm, double bytes, int n) { /* a reduce-scatter or an all-gather */
    if (!tm->cal || n <= 1) return 0;
    return link_time(comm_ring_factor(COLL_ALLGATHER, n) * bytes, n - 1, tm->cal->allreduce_gbs, tm->cal->allreduce_us);
}

static double message_seconds(const timing *tm, double bytes) {
    return tm->cal ? link_time(bytes, 1, tm->cal->p2p_gbs, tm->cal->p2p_us) : 0;
}

static double adamw_seconds(const timing *tm, double params) {
    return tm->cal ? tm->cal->adamw_ns * 1e-9 * params / tm->share : 0;
}

/* ---- the labs, one by one: memory and traffic from theory/predict.h, times here ---------- */

/* The shard plan of lab01's buckets and lab02's units (one rule, lab02_zero/shards.h). */
static void shard_figures(const run *r, th_run *t) {
    gpt_config cfg = {.vocab = 256, .seq = r->T, .layers = r->L, .d_model = r->C, .heads = r->H, .recompute = r->cfg.recompute,
                      .experts = (int)r->cfg.model.experts, .top_k = (int)r->cfg.model.top_k,
                      .expert_width = (int)r->cfg.model.ffn_expert, /* the experts' tensors too */
                      .shared_experts = (int)r->cfg.model.shared_experts};
    gpt_layout g;
    gpt_layout_init(&g, &cfg);
    const int N = r->cfg.ranks, zero = r->cfg.zero_stage;
    long bucket = (long)(r->bucket_mb * 1024 * 1024 / r->vb);
    long unit = zero == 3 ? 1 : bucket > 0 ? bucket : zero == 2 ? 1 : 0;
    shard_plan plan;
    shard_plan_init(&plan, &g, zero ? N : 1, 0, unit);
    t->units = plan.n_units;
    t->full_elems = (double)plan.full_elems;
    t->largest_unit_elems = (double)plan.largest_unit_elems;
    t->embed_unit_elems = (double)(shard_unit_of_block(&plan, -1)->chunk * (zero ? N : 1));
    shard_plan_free(&plan);
}

/* lab01 and lab02: every rank the whole model on B/N rows */
static double time_data_parallel(const run *r, const timing *tm, double *busy) {
    const th_run *in = &r->cfg;
    const int N = r->cfg.ranks, zero = r->cfg.zero_stage, units = in->units;
    const double psi = th_param_counts(&r->cfg.model).total, full = in->full_elems;
    const int accum = in->grad_accum > 1 ? in->grad_accum : 1; /* lab01's micro-batches, one after another */
    double step = accum * fwd_bwd_seconds(tm, r, 0, r->L, r->cfg.batch / N / accum, 1);
    if (zero) step += units * (zero < 3 ? 2 : 3) * gather_seconds(tm, r->vb * full / units, N) + adamw_seconds(tm, full / N);
    else step += units * allreduce_seconds(tm, r->vb * psi / units, N) + adamw_seconds(tm, psi);
    for (int q = 0; q < N; q++) busy[q] = 0; /* no bubble to predict */
    return step;
}

/* lab03, lab04, lab05, lab06: a t x p x d grid (lab03/04: p = ranks; lab05: t = ranks) */
static double time_grid(const run *r, const timing *tm, const th_rank_need *need, double *busy) {
    const int t = r->cfg.tp, p = r->cfg.pp, d = r->cfg.dp, m = r->cfg.micro_batches;
    const long rows = r->cfg.batch / ((long)d * m);
    const th_schedule s = th_schedule_parse(r->schedule);
    const double act = r->vb * rows * r->T * r->C;
    double worst_f = 0, worst_b = 0, dp_time = 0, adam_time = 0;
    for (int q = 0; q < r->cfg.ranks; q++) {
        const int lo = need[q].lo, hi = need[q].hi;
        const double params = need[q].params;
        /* time: the stage's compute, with its TP all-reduces inside (traced as compute) */
        double fb = fwd_bwd_seconds(tm, r, lo, hi, rows, t) + 4.0 * (hi - lo) * allreduce_seconds(tm, act, t);
        const double msg = r->cfg.sequence_parallel && t > 1 ? act / t : act; /* SP: a TP rank's T/t positions */
        double msg_s = p > 1 ? message_seconds(tm, msg) : 0;
        worst_f = fmax(worst_f, fb / 3 + msg_s);
        worst_b = fmax(worst_b, 2 * fb / 3 + msg_s);
        dp_time = fmax(dp_time, allreduce_seconds(tm, r->vb * params, d));
        adam_time = fmax(adam_time, adamw_seconds(tm, params));
        busy[q] = m * fb + adamw_seconds(tm, params);
    }
    return th_pipeline_step_time(s, p, m, 1, worst_f, worst_b, 0) + dp_time + adam_time;
}

/* ---- reading a record: every value the prediction uses, checked first ------------------ */

/* A record is what a run wrote, but the file may be damaged, hand-edited or not
 * a lab's: every value is checked before anything is predicted, and the first
 * problem is named with its key. The limits are what plan3d's per-rank and
 * per-layer tables hold and what any run of the labs can have been. */
#define RECORDS_MAX_BYTES (1LL << 30) /* records.jsonl: a million runs' records */
static const double MAX_RUN_BYTES = 1125899906842624.0; /* 2^50 = 1 PiB */
static const char *const lab_names[] = {"lab01_dp",  "lab02_zero", "lab03_pp_naive", "lab04_1f1b",
                                        "lab05_tp", "lab06_3d",   "lab07_cp",       "lab08_ep", "lab09_5d"};

static int problem(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int problem(char *why, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return 0;
}

/* obj[key] as a finite number >= lo; absent: fallback, unless fallback < lo. */
static int read_number(json_t *obj, const char *key, double lo, double fallback, double *out, char *why, size_t len) {
    json_t *v = json_object_get(obj, key);
    char text[48];
    if (!v) {
        if (fallback < lo) return problem(why, len, "%s is missing", key);
        *out = fallback;
        return 1;
    }
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x >= lo && isfinite(x))) return problem(why, len, "%s %s: must be a number of at least %g", key, jsonval_shown(v, text, sizeof text), lo);
    *out = x;
    return 1;
}

/* obj[key]: an array of one finite number (>= lo) per rank. */
static int read_per_rank(json_t *obj, const char *prefix, const char *key, int ranks, double lo, char *why, size_t len) {
    json_t *a = json_object_get(obj, key);
    if (!a) return problem(why, len, "%s%s is missing", prefix, key);
    if (!json_is_array(a) || json_array_size(a) != (size_t)ranks)
        return problem(why, len, "%s%s: must be a list of one number per rank (%d), has %s", prefix, key, ranks,
                       json_is_array(a) ? "another length" : "no list");
    for (int q = 0; q < ranks; q++) {
        json_t *v = json_array_get(a, (size_t)q);
        char text[48];
        if (!json_is_number(v) || !(json_number_value(v) >= lo) || !isfinite(json_number_value(v)))
            return problem(why, len, "%s%s[%d] %s: must be a number of at least %g", prefix, key, q,
                           jsonval_shown(v, text, sizeof text), lo);
    }
    return 1;
}

/* obj[key]: an object whose members are collective kinds, each a number >= 0 (absent kinds moved nothing). */
static int read_per_kind(json_t *obj, const char *key, char *why, size_t len) {
    json_t *o = json_object_get(obj, key), *v;
    const char *kind;
    if (!json_is_object(o)) return problem(why, len, o ? "%s: must be an object of collective kinds" : "%s is missing", key);
    json_object_foreach(o, kind, v) {
        char text[48];
        if (!json_is_number(v) || !(json_number_value(v) >= 0) || !isfinite(json_number_value(v)))
            return problem(why, len, "%s.%s %s: must be a number of at least 0", key, kind, jsonval_shown(v, text, sizeof text));
    }
    return 1;
}

/* The record as a run, or 0 with what is wrong in why. What to predict is the
 * record's th_run, the config the lab predicted its own memory and traffic
 * from (labs/th_run_json.h); the lab's name is only printed. */
static int read_run(json_t *rec, run *r, char *why, size_t len) {
    memset(r, 0, sizeof *r);
    char text[48];
    if (!json_is_object(rec)) return problem(why, len, "a record must be a JSON object, not %s", jsonval_shown(rec, text, sizeof text));
    json_t *lab = json_object_get(rec, "lab");
    if (!lab) return problem(why, len, "lab is missing");
    for (size_t i = 0; !r->lab && json_is_string(lab) && i < sizeof lab_names / sizeof lab_names[0]; i++)
        if (!strcmp(json_string_value(lab), lab_names[i])) r->lab = lab_names[i];
    if (!r->lab)
        return problem(why, len, "lab %s: not a lab plan3d checks (lab01_dp, lab02_zero, lab03_pp_naive, lab04_1f1b, "
                       "lab05_tp, lab06_3d, lab07_cp, lab08_ep, lab09_5d)", jsonval_shown(lab, text, sizeof text));
    if (!th_run_from_json(json_object_get(rec, "th_run"), &r->cfg, why, len)) return 0;
    th_run *c = &r->cfg;
    const th_model *m = &c->model;
    const long ranks = c->ranks, B = c->batch, T = m->seq, L = m->layers, C = m->d_model, H = m->heads;
    const long tp = c->tp, pp = c->pp, dp = c->dp, cp = c->cp, mb = c->micro_batches;
    if (C % H) return problem(why, len, "th_run.model.heads %ld does not divide th_run.model.d_model %ld", H, C);
    r->T = (int)T; r->L = (int)L; r->C = (int)C; r->H = (int)H;
    r->vb = c->bf16 ? 2 : 4;
    if (m->experts && (m->top_k < 1 || m->top_k > m->experts))
        return problem(why, len, "th_run.model.experts %ld, th_run.model.top_k %ld: top_k must be from 1 to the experts",
                       m->experts, m->top_k);
    /* what the run held: its model states (the experts' included) and one layer's activations of the whole
     * batch, with the T x T scores */
    double bytes = 16 * th_param_counts(m).total + 4.0 * B * T * (16.0 * C + (double)H * T + 256);
    if (!(bytes <= MAX_RUN_BYTES))
        return problem(why, len, "th_run: a model and batch of about %.3g bytes (batch %ld, seq %ld, layers %ld, d_model "
                       "%ld, experts %ld), more than any run of the labs holds (limit 2^50 bytes)", bytes, B, T, L, C,
                       m->experts);
    /* the rules the labs refuse their flags by (lab07's and lab08's layouts): a record breaking one was not a run */
    char rule[256];
    if (th_run_broken_rule(c, TH_NAMES_RECORD, rule, sizeof rule)) return problem(why, len, "%s", rule);
    /* the layout: the grid's ranks (context parallelism: its groups of cp; lab08's experts: its EP groups x
     * their expert data parallelism, every rank its own rows) */
    const int experts_alone = c->ep > 0 && !c->tensor_parallel;
    const long grid = experts_alone ? dp * c->ep : tp * pp * dp * (cp ? cp : 1), rows_ranks = experts_alone ? ranks : dp;
    if (grid != ranks && experts_alone)
        return problem(why, len, "th_run: dp %ld x ep %d is not ranks %ld", dp, c->ep, ranks);
    if (grid != ranks)
        return problem(why, len, "th_run: tp %ld x pp %ld x dp %ld%s is not ranks %ld", tp, pp, dp, cp ? " x cp" : "",
                       ranks);
    if (H % tp) return problem(why, len, "th_run.model.heads %ld is not divisible by the %ld TP ranks", H, tp);
    const long accum = c->grad_accum > 1 ? c->grad_accum : 1;
    if (B % (rows_ranks * mb))
        return problem(why, len, "th_run.batch %ld is not divisible by %ld data-parallel ranks x %ld micro-batches", B,
                       rows_ranks, mb);
    if (B % (rows_ranks * accum))
        return problem(why, len, "th_run.grad_accum %ld does not divide the %ld rows of each of the %ld ranks "
                       "(th_run.batch %ld)", accum, B / rows_ranks, rows_ranks, B);
    if (c->schedule) { /* an executor's pipeline: its chunks, and the layers they split */
        const th_schedule sched = (th_schedule)th_schedule_parse(c->schedule);
        const long chunks = c->chunks > 0 ? c->chunks : 1, want = th_schedule_chunks(sched, (int)chunks);
        if (chunks != want || (sched == TH_SCHED_INTERLEAVED && chunks < 2))
            return problem(why, len, "th_run.chunks %ld: schedule %s runs %s", chunks, c->schedule,
                           sched == TH_SCHED_INTERLEAVED ? "at least 2" : want == 2 ? "2" : "1");
        if (pp * chunks > L || (chunks > 1 && L % (pp * chunks)))
            return problem(why, len, "th_run.model.layers %ld cannot be split into %ld stages x %ld chunks", L, pp, chunks);
    } else if (pp > L) {
        return problem(why, len, "th_run.model.layers %ld cannot be split into %ld stages", L, pp);
    }
    if (c->sequence_parallel && tp > 1 && T % tp)
        return problem(why, len, "th_run.model.seq %ld is not divisible by the %ld TP ranks (sequence_parallel)", T, tp);
    r->schedule = c->schedule ? c->schedule : th_schedule_names[TH_SCHED_GPIPE]; /* lab03's order: GPipe at m = 1 */
    /* lab08's received rows without a per-sequence capacity: the routing's, which the prediction bounds */
    r->routing_sized = c->ep > 0 && c->capacity_factor == 0;
    if (!read_number(rec, "bucket_mb", 0, 0, &r->bucket_mb, why, len) ||
        !read_number(rec, "step_ms_median", 0, -1, &r->step_ms, why, len))
        return 0;
    if (r->bucket_mb * 1024 * 1024 / r->vb > 1e15) return problem(why, len, "bucket_mb %g: more than any model", r->bucket_mb);

    /* the measurements compared with the prediction */
    json_t *mem = json_object_get(rec, "mem_peak_bytes_per_rank");
    if (!json_is_object(mem)) return problem(why, len, mem ? "mem_peak_bytes_per_rank: must be an object" : "mem_peak_bytes_per_rank is missing");
    for (int k = 0; k < MEM_NCAT; k++)
        if (!read_per_rank(mem, "mem_peak_bytes_per_rank.", mem_category_names[k], r->cfg.ranks, 0, why, len)) return 0;
    if (!read_per_kind(rec, "comm_calls_per_step", why, len) || !read_per_kind(rec, "comm_bytes_per_step", why, len))
        return 0;
    json_t *bubble = json_object_get(rec, "bubble");
    if (bubble && !json_is_null(bubble) &&
        (!json_is_object(bubble) || !read_per_rank(bubble, "bubble.", "measured", r->cfg.ranks, -INFINITY, why, len)))
        return json_is_object(bubble) ? 0 : problem(why, len, "bubble: must be an object or null");
    return 1;
}

static double rank_value(json_t *rec, const char *group, const char *key, int rank) {
    return json_number_value(json_array_get(json_object_get(json_object_get(rec, group), key), (size_t)rank));
}

/* The bubble each rank of a one-chunk pipeline (naive, GPipe, 1F1B) should see
 * given the compute this run measured on every rank, or NULL for the other
 * schedules. The cores of a shared machine differ in speed from run to run
 * (one rank computes 30 % slower in one run and not the next), so a bubble
 * predicted from a calibration misses by as much; what the executor must
 * reproduce is the schedule's bubble on the ranks' own times. With c_q the
 * share of the step rank q computed (1 - its measured bubble) and m
 * micro-batches, the slowest stage k sets the pace and the others' fill and
 * drain add one micro-batch each: step = max_k c_k + sum_{q != k} c_q / m
 * (exact for p = 2; m = 1 is the naive pipeline's sum). Predicted bubble of
 * rank q: 1 - c_q / step. An executor that idles where the schedule would not
 * makes the measured bubbles larger than these. */
static double *bubbles_from_own_compute(const run *r, json_t *measured_bubble) {
    const int s = th_schedule_parse(r->schedule);
    if ((s != TH_SCHED_GPIPE && s != TH_SCHED_1F1B) || r->cfg.tp != 1 || r->cfg.dp != 1 || r->cfg.pp != r->cfg.ranks ||
        json_array_size(measured_bubble) != (size_t)r->cfg.ranks)
        return NULL;
    double *c = calloc((size_t)r->cfg.ranks, sizeof *c), total = 0, step = 0;
    if (!c) return NULL;
    for (int q = 0; q < r->cfg.ranks; q++) total += c[q] = 1 - json_number_value(json_array_get(measured_bubble, (size_t)q));
    for (int k = 0; k < r->cfg.ranks; k++) step = fmax(step, c[k] + (total - c[k]) / r->cfg.micro_batches);
    for (int q = 0; q < r->cfg.ranks; q++) c[q] = 1 - c[q] / step;
    return c;
}

typedef struct tally { int records, exact, mem_checked, mem_exact, bytes_checked, bytes_exact, bubbles, bubbles_close; } tally;

static void check_one(json_t *rec, const run *rp, const timing *tm0, tally *tl, json_t *out) {
    run r = *rp;
    const int own_part = r.cfg.cp > 0 || r.cfg.ep > 0; /* lab07's and lab08's layers: predicted, not timed */
    /* data parallelism alone (no stages, no executor, no TP layers: th_predict_run's own test) or a grid */
    const int is_grid = !own_part && !(r.cfg.pp == 1 && !r.cfg.schedule && !r.cfg.tensor_parallel);

    /* ranks beyond the cores share them, in proportion to how busy they are */
    timing tm = *tm0;
    double bubble_unit = 0;
    th_rank_need *pr = calloc((size_t)r.cfg.ranks, sizeof *pr);
    double *busy = calloc((size_t)r.cfg.ranks, sizeof *busy);
    if (!pr || !busy) { fprintf(stderr, "error: out of memory for %d ranks\n", r.cfg.ranks); exit(1); }
    if (!own_part && !is_grid) shard_figures(&r, &r.cfg); /* data parallelism's units */
    th_predict_run(&r.cfg, pr);
    /* plan3d's step-time model has no CP or EP part, and no experts' (their router, dispatch and k of E MLPs) */
    if (own_part || r.cfg.model.experts > 0) tm.cal = NULL;
    if (r.routing_sized) /* the prediction there is a bound, not the run's figure */
        for (int q = 0; q < r.cfg.ranks; q++) pr[q].mem[MEM_ACTS] = pr[q].mem[MEM_COMM] = pr[q].mem[MEM_WORKSPACE] = -1;
    if (is_grid) bubble_unit = th_bubble_unit(th_schedule_parse(r.schedule), r.cfg.pp, r.cfg.micro_batches, 1);
    tm.share = 1;
    if (tm.cal && tm.cal->cores > 0) {
        double demand = r.cfg.ranks * (1 - bubble_unit);
        if (demand > tm.cal->cores) tm.share = tm.cal->cores / demand;
    }
    double step = is_grid ? time_grid(&r, &tm, pr, busy) : time_data_parallel(&r, &tm, busy);

    /* memory: every category on every rank */
    int mem_n = 0, mem_ok = 0;
    char first_bad[200] = "";
    for (int q = 0; q < r.cfg.ranks; q++)
        for (int k = 0; k < MEM_NCAT; k++) {
            double got = rank_value(rec, "mem_peak_bytes_per_rank", mem_category_names[k], q);
            if (pr[q].mem[k] < 0) continue; /* not predicted */
            mem_n++;
            if (got == pr[q].mem[k]) mem_ok++;
            else if (!first_bad[0])
                snprintf(first_bad, sizeof first_bad, "rank %d %s: measured %.0f, predicted %.0f", q, mem_category_names[k], got,
                         pr[q].mem[k]);
        }
    /* traffic: per kind, the maximum over ranks, per step */
    int bytes_n = 0, bytes_ok = 0;
    json_t *calls_rec = json_object_get(rec, "comm_calls_per_step"), *bytes_rec = json_object_get(rec, "comm_bytes_per_step");
    json_t *kinds = json_object();
    for (int k = 0; k < KINDS; k++) {
        double calls = 0, payload = 0;
        int predicted = 1;
        for (int q = 0; q < r.cfg.ranks; q++) {
            predicted &= pr[q].calls[k] >= 0 && pr[q].payload[k] >= 0;
            calls = fmax(calls, pr[q].calls[k]);
            payload = fmax(payload, pr[q].payload[k]);
        }
        if (!predicted) continue;
        json_t *mc = json_object_get(calls_rec, comm_kind_names[k]), *mb = json_object_get(bytes_rec, comm_kind_names[k]);
        double got_calls = json_is_number(mc) ? json_number_value(mc) : 0, got_bytes = json_is_number(mb) ? json_number_value(mb) : 0;
        if (calls == 0 && got_calls == 0) continue;
        bytes_n++;
        int ok = fabs(got_calls - calls) < 1e-6 * fmax(1, calls) && got_bytes == round(payload);
        bytes_ok += ok;
        if (!ok && !first_bad[0])
            snprintf(first_bad, sizeof first_bad, "%s: measured %g calls %.0f B, predicted %g calls %.0f B",
                     comm_kind_names[k], got_calls, got_bytes, calls, payload);
        json_object_set_new(kinds, comm_kind_names[k], json_pack("{s:f,s:f,s:f,s:f}", "calls", got_calls, "calls_predicted",
                                                                 calls, "bytes", got_bytes, "bytes_predicted", payload));
    }
    /* bubble and step time */
    double measured_ms = r.step_ms;
    json_t *bubbles = json_array();
    double worst_bubble = 0;
    json_t *measured_bubble = json_object_get(json_object_get(rec, "bubble"), "measured");
    double *own = bubbles_from_own_compute(&r, measured_bubble);
    if (tm.cal && json_is_array(measured_bubble))
        for (int q = 0; q < r.cfg.ranks; q++) {
            double got = json_number_value(json_array_get(measured_bubble, (size_t)q));
            double want = own ? own[q] : step > 0 ? 1 - busy[q] / step : 0;
            worst_bubble = fmax(worst_bubble, fabs(got - want));
            json_array_append_new(bubbles, json_pack("{s:f,s:f}", "measured", got, "predicted", want));
        }
    free(own);
    json_t *layout_value = json_object_get(rec, "layout");
    const char *layout = json_is_string(layout_value) ? json_string_value(layout_value) : "";
    int exact = mem_ok == mem_n && bytes_ok == bytes_n;
    printf("%-15s %-26s %d rank%s | memory %d/%d exact | traffic %d/%d kinds exact", r.lab, layout, r.cfg.ranks,
           r.cfg.ranks == 1 ? " " : "s", mem_ok, mem_n, bytes_ok, bytes_n);
    if (json_array_size(bubbles))
        printf(" | bubble within %.3f (theory %.3f)", worst_bubble, bubble_unit);
    if (tm.cal) printf(" | step %.2f ms, predicted %.2f (measured/predicted %.2f)", measured_ms, 1e3 * step,
                       measured_ms / (1e3 * step));
    printf("%s%s\n", exact ? "" : "\n    MISMATCH ", first_bad);
    tl->records++;
    tl->exact += exact;
    tl->mem_checked += mem_n;
    tl->mem_exact += mem_ok;
    tl->bytes_checked += bytes_n;
    tl->bytes_exact += bytes_ok;
    if (json_array_size(bubbles)) { tl->bubbles++; tl->bubbles_close += worst_bubble <= 0.05; }
    json_array_append_new(out, json_pack("{s:s,s:s,s:i,s:b,s:i,s:i,s:i,s:i,s:o,s:f,s:f,s:o,s:f,s:f}", "lab", r.lab, "layout",
                                         layout, "ranks", r.cfg.ranks, "exact", exact, "mem_checked", mem_n, "mem_exact",
                                         mem_ok, "kinds_checked", bytes_n, "kinds_exact", bytes_ok, "traffic", kinds,
                                         "step_ms", measured_ms, "step_ms_predicted", 1e3 * step, "bubble", bubbles,
                                         "bubble_worst_error", worst_bubble, "core_share", tm.share));
    free(pr);
    free(busy);
}

/* Each line of the open records file f as a record and a run, in order:
 * fn(rec, run, ctx) for each; 0, or 2 after one line naming the first
 * line that is not a run plan3d can predict (or not JSON). */
typedef void (*record_fn)(json_t *rec, const run *r, void *ctx);
static int for_each_record(FILE *f, const char *path, record_fn fn, void *ctx, int *records) {
    char *line = NULL, why[300];
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, status = 0;
    *records = 0;
    rewind(f);
    while (status == 0 && (n = getline(&line, &cap, f)) > 0) {
        lineno++;
        json_error_t err;
        run r;
        json_t *rec = json_loadb(line, (size_t)n, 0, &err);
        if (!rec) {
            fprintf(stderr, "error: %s line %d: %s (%s)\n", path, lineno,
                    line[n - 1] != '\n' ? "not JSON, the last line cut short" : "not JSON", err.text);
            status = 2;
        } else if (!read_run(rec, &r, why, sizeof why)) {
            fprintf(stderr, "error: %s line %d: %s\n", path, lineno, why);
            status = 2;
        } else {
            if (fn) fn(rec, &r, ctx);
            ++*records;
        }
        json_decref(rec);
    }
    free(line);
    if (status == 0 && ferror(f)) {
        fprintf(stderr, "error: %s: reading failed\n", path);
        status = 2;
    }
    return status;
}

typedef struct checking { const timing *tm; tally tl; json_t *out; } checking;
static void check_record(json_t *rec, const run *r, void *ctx) {
    checking *c = ctx;
    check_one(rec, r, c->tm, &c->tl, c->out);
}

int check_records(const char *dir, const char *calibration_path, const char *json_path) {
    char *path = path_join(dir, "records.jsonl"), err[PATH_MAX + 200];
    long long size;
    int fd = path_open_input("--check", path, RECORDS_MAX_BYTES, &size, err, sizeof err);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    calibration cal;
    int status = 0, records = 0, has_cal = 0;
    if (!f) fprintf(stderr, "error: %s\n", fd >= 0 ? strerror(errno) : err);
    else if ((has_cal = calibration_load(calibration_path, &cal, err, sizeof err)) < 0)
        fprintf(stderr, "error: %s\n", err);
    /* every record read and checked before any is predicted: a bad one stops the check before it prints */
    else if ((status = for_each_record(f, path, NULL, NULL, &records)) == 0 && records == 0)
        fprintf(stderr, "error: --check %s: %s holds no records\n", dir, path);
    if (!f || has_cal < 0 || status || records == 0) {
        if (f) fclose(f);
        else if (fd >= 0) close(fd);
        free(path);
        return 2;
    }
    timing tm = {has_cal ? &cal : NULL, 1};
    if (!tm.cal)
        printf("(no calibration in %s: memory and traffic only; mpirun -n 2 ./plan3d --calibrate for times)\n",
               calibration_path);
    checking c = {&tm, {0}, json_array()};
    status = for_each_record(f, path, check_record, &c, &records);
    fclose(f);
    free(path);
    const tally tl = c.tl;
    if (status) { json_decref(c.out); return status; } /* the file changed under plan3d */
    printf("\n%d run%s checked: %d/%d exact (memory %d/%d rank-categories, traffic %d/%d collective kinds)", tl.records,
           tl.records == 1 ? "" : "s", tl.exact, tl.records, tl.mem_exact, tl.mem_checked, tl.bytes_exact,
           tl.bytes_checked);
    if (tl.bubbles) printf("; bubble within 0.05 on %d/%d pipeline runs", tl.bubbles_close, tl.bubbles);
    printf("\n");
    if (json_path) {
        json_t *root = json_pack("{s:s,s:o}", "calibration", tm.cal ? calibration_path : "", "runs", c.out);
        status = json_dump_file(root, json_path, JSON_INDENT(1));
        json_decref(root);
        if (status) { fprintf(stderr, "error: --json %s: cannot write\n", json_path); return 1; }
    } else {
        json_decref(c.out);
    }
    return tl.exact == tl.records ? 0 : 1;
}
