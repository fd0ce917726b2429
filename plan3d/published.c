/* plan3d --published FILE: the planner against published large runs. Each
 * row fixes what its source says (model, GPUs, TP x PP x DP, batch, ...) and
 * leaves the rest ("-") to the search; the fastest layout that fits is the
 * prediction, in the FLOPs the source counts. */
#define _POSIX_C_SOURCE 200809L /* getline, fdopen */
#include "published.h"
#include "paths.h"
#include "plan.h"
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ID, MODEL, CLUSTER, GPUS, INTER, TP, PP, DP, CP, EP, SEQ, BATCH, MB, SCHED, RECOMP, SP, ZERO, OVERLAP, EP_OVERLAP, EP_DISPATCH, FLOPS, REPORTED,
       TOKENS, PARAMS, UNMODELLED, SPLIT, MEMORY_GAP, SOURCE, VERIFIED, COLUMNS };

/* The line's cells (the first COLUMNS into cols); returns how many it has. */
static int split_tabs(char *line, char **cols) {
    line[strcspn(line, "\r\n")] = 0;
    for (int n = 0;; n++) {
        if (n < COLUMNS) cols[n] = line;
        char *tab = strchr(line, '\t');
        if (!tab) return n + 1;
        *tab = 0;
        line = tab + 1;
    }
}

static const char *const column_names[COLUMNS] = {
    "id", "model", "cluster", "gpus", "inter_gbs", "tp", "pp", "dp", "cp", "ep", "seq", "global_batch", "micro_batch", "schedule",
    "recompute", "sp", "zero", "dp_overlap", "ep_overlap", "ep_dispatch", "flops", "reported", "batch_tokens", "params_b", "unmodelled",
    "split", "memory_gap", "source", "verified"};

/* What a row's reported figure counts (the flops column): hardware FLOPs (with
 * recomputation's extra forward), model FLOPs (without), tokens per second, or
 * model FLOPs with attention's causal half (th_causal_flops_per_token:
 * Megatron-Core's count in its MoE recipes). */
enum { KIND_HW, KIND_MODEL, KIND_TOKENS, KIND_CAUSAL };
static const char *const kind_names[] = {"hw", "model", "tokens", "causal"};

/* A row, every cell checked: the file is the user's to extend. */
typedef struct row {
    char *c[COLUMNS];
    const model_preset *mp;
    th_model m;              /* the preset's, at the row's sequence length */
    cluster cl;
    training tr;
    constraints k;
    int kind;                /* KIND_* */
    double reported;         /* per GPU: TFLOP/s, or tokens/s for KIND_TOKENS */
    double batch_tokens;     /* the source's tokens per batch (0: not given) */
    double params_b;         /* the source's parameter count, billions (0: not given) */
} row;

/* Names the cell's line and column and what it must be; returns 0. */
static int bad_cell(const char *path, int lineno, int col, const char *value, const char *rule) {
    fprintf(stderr, "error: %s line %d, column %d (%s): '%.40s' %s\n", path, lineno, col + 1, column_names[col], value,
            rule);
    return 0;
}

/* A whole number in [lo, hi], or "-" (0: left to plan3d) where dash_ok. */
static int cell_count(const char *path, int lineno, row *w, int col, long lo, long hi, int dash_ok, long *out) {
    const char *v = w->c[col];
    char *end, rule[96];
    if (dash_ok && !strcmp(v, "-")) { *out = 0; return 1; }
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end != v && !*end && !errno && x >= lo && x <= hi) { *out = x; return 1; }
    snprintf(rule, sizeof rule, "must be a whole number from %ld to %ld%s", lo, hi, dash_ok ? ", or - (plan3d's choice)" : "");
    return bad_cell(path, lineno, col, v, rule);
}

/* A number in [lo, hi] (lo_open: above lo). */
static int cell_number(const char *path, int lineno, row *w, int col, double lo, int lo_open, double hi, double *out) {
    const char *v = w->c[col];
    char *end, rule[96];
    double x = strtod(v, &end);
    if (end != v && !*end && isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi) { *out = x; return 1; }
    snprintf(rule, sizeof rule, lo_open ? "must be a number above %g, at most %g" : "must be a number from %g to %g", lo, hi);
    return bad_cell(path, lineno, col, v, rule);
}

/* A number above 0 and at most hi, with an optional K or M (thousands,
 * millions: "16M", as sources round), or "-" (0: the source does not say). */
static int cell_amount(const char *path, int lineno, row *w, int col, double hi, double *out) {
    const char *v = w->c[col];
    char *end, rule[96];
    if (!strcmp(v, "-")) { *out = 0; return 1; }
    double x = strtod(v, &end);
    if (end != v && (*end == 'K' || *end == 'M')) x *= *end++ == 'K' ? 1e3 : 1e6;
    if (end != v && !*end && isfinite(x) && x > 0 && x <= hi) { *out = x; return 1; }
    snprintf(rule, sizeof rule, "must be a number above 0 (K, M: thousands, millions), at most %g, or - (not given)", hi);
    return bad_cell(path, lineno, col, v, rule);
}

/* One of "a|b|c" (its index), or "-" (-1) where dash_ok. */
static int cell_choice(const char *path, int lineno, row *w, int col, const char *choices, int dash_ok, int *out) {
    const char *v = w->c[col];
    char rule[96];
    if (dash_ok && !strcmp(v, "-")) { *out = -1; return 1; }
    int k = 0;
    for (const char *c = choices; *c; k++) {
        size_t n = strcspn(c, "|");
        if (strlen(v) == n && !strncmp(c, v, n)) { *out = k; return 1; }
        c += n + (c[n] == '|');
    }
    snprintf(rule, sizeof rule, "must be one of %s%s", choices, dash_ok ? " or -" : "");
    return bad_cell(path, lineno, col, v, rule);
}

/* The schedule cell: a schedule or -, and interleaved:V fixes its chunks per rank (Megatron's VPP). */
static int cell_schedule(const char *path, int lineno, row *w, int *sched, int *vp) {
    const char *v = w->c[SCHED], *colon = strchr(v, ':');
    if (!colon) return cell_choice(path, lineno, w, SCHED, "gpipe|1f1b|interleaved|zb-h1|zb-v", 1, sched);
    char *end;
    long n = strtol(colon + 1, &end, 10);
    if (strncmp(v, "interleaved:", 12) || colon[1] < '0' || colon[1] > '9' || *end || n < 2 || n > 64)
        return bad_cell(path, lineno, SCHED, v, "must be a schedule, -, or interleaved:V with V chunks a rank, 2 to 64");
    *sched = TH_SCHED_INTERLEAVED;
    *vp = (int)n;
    return 1;
}

/* The recompute cell: none, selective, full or -, and after a "+" the parts of a layer recomputed beside it
 * (Megatron-Core's --recompute-modules layernorm moe_act: norm, act or norm,act; not with full). */
static int cell_recompute(const char *path, int lineno, row *w, int *recompute, int *modules) {
    char *v = w->c[RECOMP], *plus = strchr(v, '+');
    *modules = 0;
    if (!plus) return cell_choice(path, lineno, w, RECOMP, "none|selective|full", 1, recompute);
    *plus = 0; /* the mode alone, checked as a cell of its own */
    const int ok = cell_choice(path, lineno, w, RECOMP, "none|selective|full", 0, recompute);
    *plus = '+';
    if (!ok) return 0;
    if (recompute_modules_parse(plus + 1, modules) || *modules == 0 || *recompute == RECOMPUTE_FULL)
        return bad_cell(path, lineno, RECOMP, v, "after none+ or selective+ must come norm, act or norm,act (the norms' "
                        "outputs, the experts' activation: Megatron-Core's --recompute-modules layernorm moe_act)");
    if ((*modules & TH_RECOMPUTE_EXPERT_ACT) && w->mp->m.experts <= 0)
        return bad_cell(path, lineno, RECOMP, v, "recomputes the routed experts' activation (act), and the model has none");
    return 1;
}

/* The row of `line` (a data row, not a comment or the header): 1, or 0 after one line saying what is wrong. */
static int read_row(char *line, const char *path, int lineno, row *w) {
    int n = split_tabs(line, w->c);
    if (n != COLUMNS) {
        fprintf(stderr, "error: %s line %d: %d columns, %d expected (tab-separated)\n", path, lineno, n, COLUMNS);
        return 0;
    }
    w->mp = find_model(w->c[MODEL]);
    if (!w->mp) return bad_cell(path, lineno, MODEL, w->c[MODEL], "is not a model preset (plan3d --help lists them)");
    const cluster *cp = find_cluster(w->c[CLUSTER]);
    if (!cp) return bad_cell(path, lineno, CLUSTER, w->c[CLUSTER], "is not a cluster preset (plan3d --help lists them)");
    w->cl = *cp;
    long gpus, tp, pp, dp, cpd, ep, seq, batch, mb, zero;
    int sched, recompute, modules, sp, flops, split, dispatch, vp = 0;
    double overlap, ep_overlap;
    if (!cell_count(path, lineno, w, GPUS, 1, 1000000, 0, &gpus) ||
        (strcmp(w->c[INTER], "-") && !cell_number(path, lineno, w, INTER, 0, 1, 1e6, &w->cl.inter_gbs)) ||
        !cell_count(path, lineno, w, TP, 1, gpus, 1, &tp) || !cell_count(path, lineno, w, PP, 1, gpus, 1, &pp) ||
        !cell_count(path, lineno, w, DP, 1, gpus, 1, &dp) || !cell_count(path, lineno, w, CP, 1, gpus, 1, &cpd) ||
        !cell_count(path, lineno, w, EP, 1, gpus, 1, &ep) ||
        !cell_count(path, lineno, w, SEQ, 1, 10000000, 1, &seq) ||
        !cell_count(path, lineno, w, BATCH, 1, 1000000000, 0, &batch) ||
        !cell_count(path, lineno, w, MB, 1, batch, 1, &mb) ||
        !cell_schedule(path, lineno, w, &sched, &vp) ||
        !cell_recompute(path, lineno, w, &recompute, &modules) ||
        !cell_choice(path, lineno, w, SP, "off|on", 1, &sp) || !cell_count(path, lineno, w, ZERO, 0, 3, 0, &zero) ||
        !cell_number(path, lineno, w, OVERLAP, 0, 0, 1, &overlap) ||
        !cell_number(path, lineno, w, EP_OVERLAP, 0, 0, 1, &ep_overlap) ||
        !cell_choice(path, lineno, w, EP_DISPATCH, "per-choice|per-node", 1, &dispatch) ||
        !cell_choice(path, lineno, w, FLOPS, "hw|model|tokens|causal", 0, &flops) ||
        !cell_number(path, lineno, w, REPORTED, 0, 1, 1e9, &w->reported) ||
        !cell_amount(path, lineno, w, TOKENS, 1e15, &w->batch_tokens) ||
        !cell_amount(path, lineno, w, PARAMS, 1e6, &w->params_b) ||
        !cell_choice(path, lineno, w, SPLIT, "equal|ends", 0, &split))
        return 0;
    w->kind = flops;
    w->m = w->mp->m;
    if (seq) w->m.seq = seq;
    w->cl.gpus = (int)gpus;
    if (w->cl.gpus_per_node > w->cl.gpus) w->cl.gpus_per_node = w->cl.gpus;
    w->tr = (training){batch, PREC_BF16, (int)zero, overlap, ep_overlap, 0.1, split, dispatch == 1, modules};
    w->k = (constraints){(int)tp, (int)pp, (int)dp, (int)mb, vp, sched, sp, recompute, 0, (int)cpd, (int)ep};
    return 1;
}

/* Each data row of the open file: fn(row, ...) in order; 0, or 2 after the first bad row's line. */
typedef int (*row_fn)(const row *w, const char *path, int lineno, void *ctx);
static int for_each_row(FILE *f, const char *path, row_fn fn, void *ctx, int *rows) {
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, status = 0;
    *rows = 0;
    rewind(f);
    while (status == 0 && getline(&line, &cap, f) > 0) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n' || !strncmp(line, "id\t", 3)) continue;
        row w;
        if (!read_row(line, path, lineno, &w)) status = 2;
        else if (fn) status = fn(&w, path, lineno, ctx);
        *rows += status == 0;
    }
    free(line);
    return status;
}

/* Tolerances of the consistency check: sources round their tokens per batch
 * (Llama 3's "16M" is 2048 x 8192 = 16.8M) and their parameter counts
 * (DeepSeek-V3's 671B; plan3d's shape 672.1B). */
#define TOKENS_WITHIN 0.05
#define PARAMS_WITHIN 0.01

/* The row against itself, before anything is predicted: "" if it is
 * consistent, else the first contradiction, one line in buf:
 *   GPUs = TP x CP x PP x DP (where the row gives all four; the ones it
 *          gives must divide the GPUs otherwise), EP inside DP x CP (with
 *          SP inside TP x DP x CP: folded, cost.h's ep_folds_tp);
 *   tokens per batch = sequence x global batch (where the source gives both);
 *   the preset's parameters, counted from its shape, = the source's. */
static const char *row_check(const row *w, char *buf, int len) {
    const constraints *k = &w->k;
    const long given = (long)(k->tp ? k->tp : 1) * (k->cp ? k->cp : 1) * (k->pp ? k->pp : 1) * (k->dp ? k->dp : 1);
    const int all = k->tp && k->cp && k->pp && k->dp;
    buf[0] = 0;
    if (all ? given != w->cl.gpus : w->cl.gpus % given)
        snprintf(buf, (size_t)len, "tp %d x cp %d x pp %d x dp %d = %ld %s %d GPUs", k->tp, k->cp, k->pp, k->dp, given,
                 all ? "is not" : "does not divide", w->cl.gpus);
    else if (k->ep > 1 && k->dp && k->cp &&
             ep_source_ranks(&(layout){.tp = k->tp, .dp = k->dp, .cp = k->cp, .sp = k->sp == 1}) % k->ep)
        snprintf(buf, (size_t)len, "ep %d is not inside dp %d x cp %d%s", k->ep, k->dp, k->cp,
                 k->sp == 1 && k->tp > 1 ? " x tp (folded with SP)" : "");
    else if (w->batch_tokens > 0 &&
             fabs((double)w->tr.global_batch * w->m.seq / w->batch_tokens - 1) > TOKENS_WITHIN)
        snprintf(buf, (size_t)len, "seq %ld x batch %ld = %.1fM tokens, the source says %.1fM", w->m.seq,
                 w->tr.global_batch, (double)w->tr.global_batch * w->m.seq / 1e6, w->batch_tokens / 1e6);
    else if (w->params_b > 0 && fabs(th_param_counts(&w->m).total / (w->params_b * 1e9) - 1) > PARAMS_WITHIN)
        snprintf(buf, (size_t)len, "the preset's shape has %.1fB parameters, the source says %.1fB",
                 th_param_counts(&w->m).total / 1e9, w->params_b);
    return buf;
}

typedef struct tally {
    int rows, failed, left_out, in_mean;
    double sum_abs, worst;
    char worst_id[64];      /* the row's id (the line it came from is reused) */
    json_t *out;
} tally;

static int predict_row(const row *w, const char *path, int lineno, void *ctx) {
    tally *t = ctx;
    char *const *c = w->c;
    const constraints k = w->k;
    cluster cl = w->cl;
    char why[160];
    t->rows++;
    if (*row_check(w, why, sizeof why)) { /* printed as failing, not predicted, not fixed */
        printf("%-22s %6d %2s %2s %2s %4s %3s | %-6s %8.0f %9s %8s | %7s %7s | FAILS: %s\n", c[ID], cl.gpus, c[TP], c[CP],
               c[PP], c[DP], c[EP], kind_names[w->kind], w->reported, "-", "-", "-", "-", why);
        json_array_append_new(t->out, json_pack("{s:s,s:i,s:s,s:f,s:s,s:s}", "id", c[ID], "gpus", cl.gpus, "convention",
                                             kind_names[w->kind], "reported", w->reported, "check", why, "source",
                                             c[SOURCE]));
        t->failed++;
        return 0;
    }
    plan_result r;
    plan_search(&w->m, &cl, &w->tr, &k, &r);
    /* the fastest that fits; where our memory model says none does (the
     * run did), the fastest of all, marked. The schedules of their time
     * (1F1B or Megatron's interleaving) when the row does not say. */
    int pick = -1;
    for (int i = 0; i < r.n; i++) {
        const estimate *x = &r.all[i];
        if (k.schedule < 0 && x->l.schedule != TH_SCHED_1F1B && x->l.schedule != TH_SCHED_INTERLEAVED) continue;
        if (pick < 0 || (r.n_fit ? x->fits && !r.all[pick].fits : x->t_step < r.all[pick].t_step)) pick = i;
        if (r.n_fit && x->fits) break;
    }
    if (pick < 0) {
        fprintf(stderr, "error: %s line %d: no layout of %d GPUs matches the row (its tp, pp, dp, micro_batch "
                "must divide the GPUs, the layers and the batch)\n", path, lineno, cl.gpus);
        plan_free(&r);
        return 2;
    }
    const estimate *e = &r.all[pick];
    /* both FLOP conventions per GPU; the one the row reports is compared */
    const double model_tf = e->model_flops / e->t_step / cl.gpus / 1e12, hw_tf = e->hw_flops / e->t_step / cl.gpus / 1e12;
    const double tokens = e->tokens_per_s / cl.gpus, causal_tf = tokens * th_causal_flops_per_token(&w->m) / 1e12;
    const double predicted = w->kind == KIND_HW       ? hw_tf
                             : w->kind == KIND_MODEL  ? model_tf
                             : w->kind == KIND_CAUSAL ? causal_tf
                                                      : tokens;
    const double err = predicted / w->reported - 1;
    const int in_mean = !strcmp(c[UNMODELLED], "-");
    char lt[160];
    layout_text(&e->l, lt, sizeof lt);
    if (w->tr.recompute_modules && e->l.recompute != RECOMPUTE_FULL) /* the parts recomputed beside it */
        snprintf(lt + strlen(lt), sizeof lt - strlen(lt), "+%s", recompute_modules_text(w->tr.recompute_modules));
    printf("%-22s %6d %2d %2d %2d %4d %3d | %-6s %8.0f %9.0f %+6.1f%%%s | %7.0f %7.0f | ok | %s (%.1f GiB%s%s)%s%s\n",
           c[ID], cl.gpus, e->l.tp, e->l.cp, e->l.pp, e->l.dp, e->l.ep, kind_names[w->kind], w->reported, predicted,
           100 * err, in_mean ? " " : "*",
           model_tf, hw_tf, lt, e->mem_total / 1073741824.0,
           e->fits ? "" : ", does NOT fit: ", e->fits ? "" : strcmp(c[MEMORY_GAP], "-") ? c[MEMORY_GAP] : "the memory model is off for this row",
           in_mean ? "" : "; not in the mean: ", in_mean ? "" : c[UNMODELLED]);
    json_array_append_new(t->out, json_pack("{s:s,s:i,s:s,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:s,s:b,s:f,s:s,s:b,s:s,s:s}", "id",
                                         c[ID], "gpus", cl.gpus, "convention", kind_names[w->kind], "reported",
                                         w->reported, "predicted", predicted, "predicted_model_tflops", model_tf,
                                         "predicted_hw_tflops", hw_tf, "predicted_tokens_per_s", tokens, "predicted_causal_tflops", causal_tf, "error", err,
                                         "layout", lt, "fits", e->fits, "mem_gib", e->mem_total / 1073741824.0, "check",
                                         "ok", "in_mean", in_mean, "unmodelled", c[UNMODELLED], "source", c[SOURCE]));
    if (in_mean) {
        t->in_mean++;
        t->sum_abs += fabs(err);
        if (fabs(err) > t->worst) {
            t->worst = fabs(err);
            snprintf(t->worst_id, sizeof t->worst_id, "%s", c[ID]);
        }
    } else {
        t->left_out++;
    }
    plan_free(&r);
    return 0;
}

#define PUBLISHED_MAX_BYTES (1LL << 20) /* a table of runs; the course's has 13 rows in 8 KB */

int predict_published(const char *path, const char *json_path) {
    char err[PATH_MAX + 200];
    long long size;
    int fd = path_open_input("--published", path, PUBLISHED_MAX_BYTES, &size, err, sizeof err);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        fprintf(stderr, "error: %s\n", fd >= 0 ? strerror(errno) : err);
        if (fd >= 0) close(fd);
        return 2;
    }
    /* every row checked before any is predicted: a bad one stops it before it prints */
    int rows = 0, status = for_each_row(f, path, NULL, NULL, &rows);
    if (status == 0 && rows == 0) {
        fprintf(stderr, "error: --published %s: no rows (a header, comments and no runs)\n", path);
        status = 2;
    }
    if (status) {
        fclose(f);
        return status;
    }
    tally t = {.out = json_array()};
    printf("%-22s %6s %-17s | %-6s %8s %9s %8s | %7s %7s | %s\n", "run", "GPUs", "tp cp pp   dp  ep", "counts",
           "reported", "predicted", "error", "model", "hw", "check | the layout plan3d completes it with (memory per GPU)");
    printf("%-22s %6s %-17s | %-6s %8s %9s %8s | %15s |\n", "", "", "", "", "per GPU", "", "", "TFLOP/s");
    status = for_each_row(f, path, predict_row, &t, &rows);
    fclose(f);
    if (status) {
        json_decref(t.out);
        return status;
    }
    printf("\n%d runs: %d fail the consistency check (not predicted), %d predicted but not in the mean (*: a feature "
           "plan3d does not model)\n%d in the mean: mean |error| %.1f%%, worst %.1f%% (%s)\n", t.rows, t.failed, t.left_out,
           t.in_mean, t.in_mean ? 100 * t.sum_abs / t.in_mean : 0.0, 100 * t.worst, t.in_mean ? t.worst_id : "-");
    if (json_path) {
        json_t *root = json_pack("{s:s,s:i,s:i,s:i,s:f,s:f,s:o}", "file", path, "failed_check", t.failed, "left_out",
                                 t.left_out, "in_mean", t.in_mean, "mean_abs_error",
                                 t.in_mean ? t.sum_abs / t.in_mean : 0.0, "worst_abs_error", t.worst, "runs", t.out);
        status = json_dump_file(root, json_path, JSON_INDENT(1));
        json_decref(root);
        if (status) { fprintf(stderr, "error: --json %s: cannot write\n", json_path); return 1; }
    } else {
        json_decref(t.out);
    }
    return 0;
}
