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
#define _POSIX_C_SOURCE 200809L /* getline */
#include "check.h"
#include "comm.h"
#include "cost.h"
#include "predict.h"
#include "model.h"
#include "shards.h"
#include "stage.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KINDS = TH_NKINDS };

typedef struct run {
    const char *lab, *schedule;
    int ranks, cuda, steps, B, T, L, C, H, m, chunks, tp, pp, dp, zero;
    int recompute, sp;       /* --recompute (gpt_recompute), --sequence-parallel */
    double bucket_mb;
    int bf16;           /* config.precision "bf16": 2-byte values, 2 + 2 + 12 model states */
    double vb;          /* bytes of one of the model's values: 4, or 2 in bf16 */
    th_model model;
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
    const th_model *m = &r->model;
    double params = th_stage_params(m, &o, lo, hi) - (lo == 0 ? th_stage_params(m, &o, 0, 0) : 0); /* no lookups */
    double flops = (double)rows * r->T * (6 * params + 12.0 * (hi - lo) * r->T * r->C / t);
    return flops / (calibration_rate(tm->cal, r->C, (double)rows * r->T) * tm->share);
}

static double allreduce_seconds(const timing *tm, double bytes, int n) {
    if (!tm->cal || n <= 1) return 0;
    return link_time(th_ring_factor(TH_ALLREDUCE, n) * bytes, 2 * (n - 1), tm->cal->allreduce_gbs, tm->cal->allreduce_us);
}

static double gather_seconds(const timing *tm, double bytes, int n) { /* a reduce-scatter or an all-gather */
    if (!tm->cal || n <= 1) return 0;
    return link_time(th_ring_factor(TH_ALLGATHER, n) * bytes, n - 1, tm->cal->allreduce_gbs, tm->cal->allreduce_us);
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
    gpt_config cfg = {.vocab = 256, .seq = r->T, .layers = r->L, .d_model = r->C, .heads = r->H, .recompute = r->recompute};
    gpt_layout g;
    gpt_layout_init(&g, &cfg);
    const int N = r->ranks, zero = !strcmp(r->lab, "lab02_zero") ? r->zero : 0;
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

static th_run prediction_input(const run *r) {
    th_run t = {.lab = r->lab, .ranks = r->ranks, .cuda = r->cuda, .batch = r->B, .model = r->model, .tp = r->tp,
                .pp = r->pp, .dp = r->dp, .micro_batches = r->m, .schedule = r->schedule, .chunks = r->chunks,
                .zero_stage = r->zero, .stage_layers = stage_layers, .sequence_parallel = r->sp,
                .recompute = r->recompute, .bf16 = r->bf16};
    if (!strcmp(r->lab, "lab01_dp") || !strcmp(r->lab, "lab02_zero")) {
        t.dp = r->ranks;
        shard_figures(r, &t);
    }
    return t;
}

/* lab01 and lab02: every rank the whole model on B/N rows */
static double time_data_parallel(const run *r, const th_run *in, const timing *tm, double *busy) {
    const int N = r->ranks, zero = !strcmp(r->lab, "lab02_zero") ? r->zero : 0, units = in->units;
    const double psi = th_param_counts(&r->model).total, full = in->full_elems;
    double step = fwd_bwd_seconds(tm, r, 0, r->L, r->B / N, 1);
    if (zero) step += units * (zero < 3 ? 2 : 3) * gather_seconds(tm, r->vb * full / units, N) + adamw_seconds(tm, full / N);
    else step += units * allreduce_seconds(tm, r->vb * psi / units, N) + adamw_seconds(tm, psi);
    for (int q = 0; q < N; q++) busy[q] = 0; /* no bubble to predict */
    return step;
}

/* lab03, lab04, lab05, lab06: a t x p x d grid (lab03/04: p = ranks; lab05: t = ranks) */
static double time_grid(const run *r, const timing *tm, const th_rank_need *need, double *busy) {
    const int t = r->tp, p = r->pp, d = r->dp, m = r->m;
    const long rows = r->B / ((long)d * m);
    const th_schedule s = th_schedule_parse(r->schedule);
    const double act = r->vb * rows * r->T * r->C;
    double worst_f = 0, worst_b = 0, dp_time = 0, adam_time = 0;
    for (int q = 0; q < r->ranks; q++) {
        const int lo = need[q].lo, hi = need[q].hi;
        const double params = need[q].params;
        /* time: the stage's compute, with its TP all-reduces inside (traced as compute) */
        double fb = fwd_bwd_seconds(tm, r, lo, hi, rows, t) + 4.0 * (hi - lo) * allreduce_seconds(tm, act, t);
        const double msg = r->sp && t > 1 ? act / t : act; /* SP: a TP rank's T/t positions */
        double msg_s = p > 1 ? message_seconds(tm, msg) : 0;
        worst_f = fmax(worst_f, fb / 3 + msg_s);
        worst_b = fmax(worst_b, 2 * fb / 3 + msg_s);
        dp_time = fmax(dp_time, allreduce_seconds(tm, r->vb * params, d));
        adam_time = fmax(adam_time, adamw_seconds(tm, params));
        busy[q] = m * fb + adamw_seconds(tm, params);
    }
    return th_pipeline_step_time(s, p, m, 1, worst_f, worst_b, 0) + dp_time + adam_time;
}

/* ---- reading a record ------------------------------------------------------------------ */

static const char *str_or(json_t *v, const char *fallback) {
    return json_is_string(v) ? json_string_value(v) : fallback;
}

static int get_int(json_t *o, const char *key, int fallback) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? (int)json_number_value(v) : fallback;
}

static double rank_value(json_t *rec, const char *group, const char *key, int rank) {
    json_t *a = json_object_get(json_object_get(rec, group), key);
    json_t *v = json_array_get(a, (size_t)rank);
    return json_is_number(v) ? json_number_value(v) : -1;
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
    if ((s != TH_SCHED_GPIPE && s != TH_SCHED_1F1B) || r->tp != 1 || r->dp != 1 || r->pp != r->ranks ||
        json_array_size(measured_bubble) != (size_t)r->ranks)
        return NULL;
    double *c = calloc((size_t)r->ranks, sizeof *c), total = 0, step = 0;
    for (int q = 0; q < r->ranks; q++) total += c[q] = 1 - json_number_value(json_array_get(measured_bubble, (size_t)q));
    for (int k = 0; k < r->ranks; k++) step = fmax(step, c[k] + (total - c[k]) / r->m);
    for (int q = 0; q < r->ranks; q++) c[q] = 1 - c[q] / step;
    return c;
}

typedef struct tally { int records, exact, mem_checked, mem_exact, bytes_checked, bytes_exact, bubbles, bubbles_close; } tally;

static int check_one(json_t *rec, const timing *tm0, tally *tl, json_t *out) {
    json_t *cfg = json_object_get(rec, "config");
    run r = {.lab = json_string_value(json_object_get(rec, "lab")), .ranks = get_int(rec, "ranks", 0),
             .cuda = !strcmp(str_or(json_object_get(rec, "device"), ""), "cuda"),
             .steps = get_int(cfg, "steps", 0), .B = get_int(cfg, "batch", 0), .T = get_int(cfg, "seq", 0),
             .L = get_int(cfg, "layers", 0), .C = get_int(cfg, "d_model", 0), .H = get_int(cfg, "heads", 0)};
    if (!r.lab || r.ranks < 1 || r.B < 1 || r.T < 1 || r.L < 1 || r.C < 1 || r.H < 1) return 0;
    r.model = th_course_model(256, r.T, r.L, r.C, r.H);
    r.m = get_int(rec, "micro_batches", 1);
    r.chunks = get_int(rec, "chunks_per_rank", 1); /* lab04, lab06: the model chunks of a rank */
    r.schedule = str_or(json_object_get(rec, "schedule"), "gpipe"); /* lab03: one batch, GPipe's m = 1 */
    if (th_schedule_parse(r.schedule) < 0) return 0;
    json_t *bmb = json_object_get(rec, "bucket_mb");
    r.bucket_mb = json_is_number(bmb) ? json_number_value(bmb) : 0;
    r.zero = get_int(rec, "zero_stage", 0);
    r.recompute = gpt_recompute_parse(str_or(json_object_get(cfg, "recompute"), "none"));
    if (r.recompute < 0) return 0;
    r.sp = json_is_true(json_object_get(rec, "sequence_parallel"));
    r.bf16 = !strcmp(str_or(json_object_get(cfg, "precision"), "fp32"), "bf16");
    r.vb = r.bf16 ? 2 : 4;
    r.tp = 1; r.pp = 1; r.dp = 1;
    if (!strcmp(r.lab, "lab03_pp_naive") || !strcmp(r.lab, "lab04_1f1b")) r.pp = r.ranks;
    else if (!strcmp(r.lab, "lab05_tp")) r.tp = r.ranks;
    else if (!strcmp(r.lab, "lab06_3d")) {
        r.tp = get_int(rec, "tp", 1); r.pp = get_int(rec, "pp", 1); r.dp = get_int(rec, "dp", 1);
    } else if (strcmp(r.lab, "lab01_dp") && strcmp(r.lab, "lab02_zero")) return 0;
    int is_grid = strcmp(r.lab, "lab01_dp") && strcmp(r.lab, "lab02_zero");

    /* ranks beyond the cores share them, in proportion to how busy they are */
    timing tm = *tm0;
    double bubble_unit = 0;
    th_rank_need *pr = calloc((size_t)r.ranks, sizeof *pr);
    double *busy = calloc((size_t)r.ranks, sizeof *busy);
    const th_run in = prediction_input(&r);
    th_predict_run(&in, pr);
    if (is_grid) bubble_unit = th_bubble_unit(th_schedule_parse(r.schedule), r.pp, r.m, 1);
    tm.share = 1;
    if (tm.cal && tm.cal->cores > 0) {
        double demand = r.ranks * (1 - bubble_unit);
        if (demand > tm.cal->cores) tm.share = tm.cal->cores / demand;
    }
    double step = is_grid ? time_grid(&r, &tm, pr, busy) : time_data_parallel(&r, &in, &tm, busy);

    /* memory: every category on every rank */
    int mem_n = 0, mem_ok = 0;
    char first_bad[200] = "";
    for (int q = 0; q < r.ranks; q++)
        for (int k = 0; k < CAT_N; k++) {
            double got = rank_value(rec, "mem_peak_bytes_per_rank", cat_names[k], q);
            if (pr[q].mem[k] < 0) continue; /* not predicted */
            mem_n++;
            if (got == pr[q].mem[k]) mem_ok++;
            else if (!first_bad[0])
                snprintf(first_bad, sizeof first_bad, "rank %d %s: measured %.0f, predicted %.0f", q, cat_names[k], got,
                         pr[q].mem[k]);
        }
    /* traffic: per kind, the maximum over ranks, per step */
    int bytes_n = 0, bytes_ok = 0;
    json_t *calls_rec = json_object_get(rec, "comm_calls_per_step"), *bytes_rec = json_object_get(rec, "comm_bytes_per_step");
    json_t *kinds = json_object();
    for (int k = 0; k < KINDS; k++) {
        double calls = 0, payload = 0;
        int predicted = 1;
        for (int q = 0; q < r.ranks; q++) {
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
    double measured_ms = json_number_value(json_object_get(rec, "step_ms_median"));
    json_t *bubbles = json_array();
    double worst_bubble = 0;
    json_t *measured_bubble = json_object_get(json_object_get(rec, "bubble"), "measured");
    double *own = bubbles_from_own_compute(&r, measured_bubble);
    if (tm.cal && json_is_array(measured_bubble))
        for (int q = 0; q < r.ranks; q++) {
            double got = json_number_value(json_array_get(measured_bubble, (size_t)q));
            double want = own ? own[q] : step > 0 ? 1 - busy[q] / step : 0;
            worst_bubble = fmax(worst_bubble, fabs(got - want));
            json_array_append_new(bubbles, json_pack("{s:f,s:f}", "measured", got, "predicted", want));
        }
    free(own);
    const char *layout = str_or(json_object_get(rec, "layout"), "");
    int exact = mem_ok == mem_n && bytes_ok == bytes_n;
    printf("%-15s %-26s %d rank%s | memory %d/%d exact | traffic %d/%d kinds exact", r.lab, layout, r.ranks,
           r.ranks == 1 ? " " : "s", mem_ok, mem_n, bytes_ok, bytes_n);
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
                                         layout, "ranks", r.ranks, "exact", exact, "mem_checked", mem_n, "mem_exact",
                                         mem_ok, "kinds_checked", bytes_n, "kinds_exact", bytes_ok, "traffic", kinds,
                                         "step_ms", measured_ms, "step_ms_predicted", 1e3 * step, "bubble", bubbles,
                                         "bubble_worst_error", worst_bubble, "core_share", tm.share));
    free(pr);
    free(busy);
    return 1;
}

int check_records(const char *dir, const char *calibration_path, const char *json_path) {
    char path[1024];
    snprintf(path, sizeof path, "%s/records.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "error: --check %s: cannot read %s\n", dir, path); return 2; }
    calibration cal;
    timing tm = {calibration_load(calibration_path, &cal) ? &cal : NULL, 1};
    if (!tm.cal)
        printf("(no calibration in %s: memory and traffic only; mpirun -n 2 ./plan3d --calibrate for times)\n",
               calibration_path);
    tally tl = {0};
    json_t *out = json_array();
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, skipped = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t err;
        json_t *rec = json_loads(line, 0, &err);
        if (!rec) { fprintf(stderr, "error: %s line %d: not JSON (%s)\n", path, lineno, err.text); free(line); fclose(f); return 2; }
        if (!check_one(rec, &tm, &tl, out)) skipped++;
        json_decref(rec);
    }
    free(line);
    fclose(f);
    printf("\n%d run%s checked%s: %d/%d exact (memory %d/%d rank-categories, traffic %d/%d collective kinds)", tl.records,
           tl.records == 1 ? "" : "s", skipped ? " (others skipped: not a lab plan3d knows)" : "", tl.exact, tl.records,
           tl.mem_exact, tl.mem_checked, tl.bytes_exact, tl.bytes_checked);
    if (tl.bubbles) printf("; bubble within 0.05 on %d/%d pipeline runs", tl.bubbles_close, tl.bubbles);
    printf("\n");
    if (json_path) {
        json_t *root = json_pack("{s:s,s:o}", "calibration", tm.cal ? calibration_path : "", "runs", out);
        if (json_dump_file(root, json_path, JSON_INDENT(1))) { fprintf(stderr, "error: --json %s: cannot write\n", json_path); return 2; }
        json_decref(root);
    } else {
        json_decref(out);
    }
    if (tl.records == 0) { fprintf(stderr, "error: --check %s: no lab runs in %s\n", dir, path); return 2; }
    return tl.exact == tl.records ? 0 : 1;
}
