/* plan3d --check DIR: each run in DIR/records.jsonl predicted from its own
 * flags, with theory/'s formulas, beside what the run measured.
 *
 *   memory      every category (params, grads, optim, acts, comm, workspace)
 *               on every rank, to the byte: the allocator's peak
 *   traffic     calls and payload bytes per step of every collective kind
 *               (the record's maximum over ranks), exactly
 *   bubble      pipeline labs: 1 - busy/step per rank, from the times below
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
#include "model.h"
#include "shards.h"
#include "stage.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KINDS = TH_NKINDS };

typedef struct rank_pred {
    double mem[CAT_N];
    double calls[KINDS], payload[KINDS];
    double busy;          /* seconds of compute per step (pipelines: for the bubble) */
} rank_pred;

typedef struct run {
    const char *lab, *schedule;
    int ranks, cuda, steps, B, T, L, C, H, m, tp, pp, dp, zero;
    int bf16;           /* config.precision "bf16": 2-byte values, 2 + 2 + 12 model states */
    double vb;          /* bytes of one of the model's values: 4, or 2 in bf16 */
    double bucket_mb;
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

/* ---- the labs, one by one ------------------------------------------------------------ */

/* model states, activations (in flight x one micro-batch) and scratch of one rank */
static void rank_memory(rank_pred *p, const run *r, double params, int t, int lo, int hi, long rows, double in_flight,
                        int receives_grad) {
    const th_opts o = th_opts_precision(t, r->bf16);
    th_states s = th_model_states(params, &o, 0, 1);
    p->mem[CAT_PARAMS] = s.params;
    p->mem[CAT_GRADS] = s.grads;
    p->mem[CAT_OPTIM] = s.optim;
    p->mem[CAT_ACTS] = in_flight * th_course_acts_bytes(&r->model, &o, lo, hi, rows);
    p->mem[CAT_COMM] = receives_grad ? r->vb * rows * r->T * r->C : 0; /* lab03's dout */
    /* lab04's executor (and lab06 through it) keeps a pool of message buffers
     * whose size its lists decide: not predicted here yet. */
    if (!strcmp(r->lab, "lab04_1f1b") || !strcmp(r->lab, "lab06_3d")) p->mem[CAT_COMM] = -1;
    /* lab02 sums the gradient norm in one part on the device, lab05 and lab06 in two */
    const int norm_parts = !strcmp(r->lab, "lab02_zero") ? 1 : !strcmp(r->lab, "lab05_tp") || !strcmp(r->lab, "lab06_3d") ? 2 : 0;
    p->mem[CAT_WORKSPACE] = th_course_scratch_bytes(&r->model, &o, rows) + th_grad_norm_bytes(norm_parts);
    /* On CUDA the kernels add their own scratch (partial sums, and the embedding
     * backward's sort buffers, whose size cub decides at run time): not predicted. */
    if (r->cuda) p->mem[CAT_WORKSPACE] = -1;
}

static void count(rank_pred *p, th_coll k, double calls, double each) {
    p->calls[k] += calls;
    p->payload[k] += calls * each;
}

/* lab01 and lab02: every rank the whole model on B/N rows */
static double predict_data_parallel(const run *r, const timing *tm, rank_pred *pr) {
    const int N = r->ranks;
    const long rows = r->B / N;
    gpt_config cfg = {256, r->T, r->L, r->C, r->H};
    gpt_layout g;
    gpt_layout_init(&g, &cfg);
    const double psi = (double)g.total;
    const int zero = !strcmp(r->lab, "lab02_zero") ? r->zero : 0;
    /* lab01's buckets and lab02's units follow one rule (lab02_zero/shards.h) */
    long bucket = (long)(r->bucket_mb * 1024 * 1024 / r->vb);
    const th_opts opts = th_opts_precision(1, r->bf16);
    const double vb = r->vb;
    long unit = zero == 3 ? 1 : bucket > 0 ? bucket : zero == 2 ? 1 : 0;
    shard_plan plan;
    shard_plan_init(&plan, &g, zero ? N : 1, 0, unit);
    const double full = (double)plan.full_elems, largest = (double)plan.largest_unit_elems;
    const int units = plan.n_units;
    const double embed_unit = (double)(shard_unit_of_block(&plan, -1)->chunk * (zero ? N : 1));
    shard_plan_free(&plan);

    double step = fwd_bwd_seconds(tm, r, 0, r->L, rows, 1);
    for (int q = 0; q < N; q++) {
        rank_pred *p = &pr[q];
        rank_memory(p, r, psi, 1, 0, r->L, rows, 1, 0);
        if (zero) { /* theory.h: the padded buffers, the stage's sharding and its unit buffers */
            th_states s = th_model_states(full, &opts, zero, N), b = th_zero_buffers(largest, &opts, zero);
            p->mem[CAT_PARAMS] = s.params + b.params;
            p->mem[CAT_GRADS] = s.grads + b.grads;
            p->mem[CAT_OPTIM] = s.optim;
            count(p, TH_REDUCE_SCATTER, units, vb * full / units);
            if (zero < 3) count(p, TH_ALLGATHER, units, vb * full / units);
            else { /* each unit gathered for the forward, again for the backward but the embedding's */
                p->calls[TH_ALLGATHER] += 2 * units - 1;
                p->payload[TH_ALLGATHER] += vb * (2 * full - embed_unit);
            }
        } else {
            if (N > 1) count(p, TH_ALLREDUCE, units, vb * psi / units); /* a group of one counts no traffic */
        }
    }
    if (zero) {
        step += units * (zero < 3 ? 2 : 3) * gather_seconds(tm, vb * full / units, N) + adamw_seconds(tm, full / N);
    } else {
        step += units * allreduce_seconds(tm, vb * psi / units, N) + adamw_seconds(tm, psi);
    }
    return step;
}

/* lab03, lab04, lab05, lab06: a t x p x d grid (lab03/04: p = ranks; lab05: t = ranks) */
static double predict_grid(const run *r, const timing *tm, rank_pred *pr, double *bubble_unit) {
    const int t = r->tp, p = r->pp, d = r->dp, m = r->m;
    const long rows = r->B / ((long)d * m);
    const th_schedule s = th_schedule_parse(r->schedule);
    const double act = r->vb * rows * r->T * r->C;
    *bubble_unit = th_bubble_unit(s, p, m, 1);
    double worst_f = 0, worst_b = 0, dp_time = 0, adam_time = 0;
    for (int q = 0; q < r->ranks; q++) {
        const int pp = q / (t * d); /* rank = tp + t (dp + d pp): lab06's grid.h */
        int lo, hi;
        stage_layers(r->L, p, pp, &lo, &hi);
        const th_opts o = th_opts_precision(t, r->bf16);
        const double params = th_stage_params(&r->model, &o, lo, hi);
        rank_pred *x = &pr[q];
        rank_memory(x, r, params, t, lo, hi, rows, th_acts_in_flight(s, p, pp, m, 1), pp < p - 1);
        const int boundaries = (pp > 0) + (pp < p - 1);
        count(x, TH_SEND, (double)m * boundaries, act);
        count(x, TH_RECV, (double)m * boundaries, act);
        const double tp_calls = t > 1 ? 4.0 * (hi - lo) * m : 0;
        count(x, TH_ALLREDUCE, tp_calls, act);
        if (d > 1) count(x, TH_ALLREDUCE, 1, r->vb * params);
        /* time: the stage's compute, with its TP all-reduces inside (traced as compute) */
        double fb = fwd_bwd_seconds(tm, r, lo, hi, rows, t) + 4.0 * (hi - lo) * allreduce_seconds(tm, act, t);
        double msg = p > 1 ? message_seconds(tm, act) : 0;
        worst_f = fmax(worst_f, fb / 3 + msg);
        worst_b = fmax(worst_b, 2 * fb / 3 + msg);
        dp_time = fmax(dp_time, allreduce_seconds(tm, r->vb * params, d));
        adam_time = fmax(adam_time, adamw_seconds(tm, params));
        x->busy = m * fb + adamw_seconds(tm, params);
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

typedef struct tally { int records, exact, mem_checked, mem_exact, bytes_checked, bytes_exact, bubbles, bubbles_close; } tally;

static int check_one(json_t *rec, const timing *tm0, tally *tl, json_t *out) {
    json_t *cfg = json_object_get(rec, "config");
    run r = {.lab = json_string_value(json_object_get(rec, "lab")), .ranks = get_int(rec, "ranks", 0),
             .cuda = !strcmp(str_or(json_object_get(rec, "device"), ""), "cuda"),
             .steps = get_int(cfg, "steps", 0), .B = get_int(cfg, "batch", 0), .T = get_int(cfg, "seq", 0),
             .L = get_int(cfg, "layers", 0), .C = get_int(cfg, "d_model", 0), .H = get_int(cfg, "heads", 0)};
    if (!r.lab || r.ranks < 1 || r.B < 1 || r.T < 1 || r.L < 1 || r.C < 1 || r.H < 1) return 0;
    r.model = th_course_model(256, r.T, r.L, r.C, r.H);
    r.bf16 = !strcmp(str_or(json_object_get(cfg, "precision"), "fp32"), "bf16");
    r.vb = r.bf16 ? 2 : 4;
    r.m = get_int(rec, "micro_batches", 1);
    r.schedule = str_or(json_object_get(rec, "schedule"), "gpipe"); /* lab03: one batch, GPipe's m = 1 */
    if (th_schedule_parse(r.schedule) < 0) return 0;
    json_t *bmb = json_object_get(rec, "bucket_mb");
    r.bucket_mb = json_is_number(bmb) ? json_number_value(bmb) : 0;
    r.zero = get_int(rec, "zero_stage", 0);
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
    rank_pred *pr = calloc((size_t)r.ranks, sizeof *pr);
    if (is_grid) bubble_unit = th_bubble_unit(th_schedule_parse(r.schedule), r.pp, r.m, 1);
    tm.share = 1;
    if (tm.cal && tm.cal->cores > 0) {
        double demand = r.ranks * (1 - bubble_unit);
        if (demand > tm.cal->cores) tm.share = tm.cal->cores / demand;
    }
    double step = is_grid ? predict_grid(&r, &tm, pr, &bubble_unit) : predict_data_parallel(&r, &tm, pr);

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
        for (int q = 0; q < r.ranks; q++) {
            calls = fmax(calls, pr[q].calls[k]);
            payload = fmax(payload, pr[q].payload[k]);
        }
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
    if (tm.cal && json_is_array(measured_bubble))
        for (int q = 0; q < r.ranks; q++) {
            double got = json_number_value(json_array_get(measured_bubble, (size_t)q));
            double want = step > 0 ? 1 - pr[q].busy / step : 0;
            worst_bubble = fmax(worst_bubble, fabs(got - want));
            json_array_append_new(bubbles, json_pack("{s:f,s:f}", "measured", got, "predicted", want));
        }
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
