/* plan3d --published FILE: the planner against published large runs. Each
 * row fixes what its source says (model, GPUs, TP x PP x DP, batch, ...) and
 * leaves the rest ("-") to the search; the fastest layout that fits is the
 * prediction, in the FLOPs the source counts. */
#define _POSIX_C_SOURCE 200809L /* getline, strtok_r */
#include "check.h"
#include "plan.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ID, MODEL, CLUSTER, GPUS, INTER, TP, PP, DP, BATCH, MB, SCHED, RECOMP, SP, ZERO, OVERLAP, FLOPS, TFLOPS, SOURCE,
       VERIFIED, COLUMNS };

static int split_tabs(char *line, char **cols) {
    int n = 0;
    line[strcspn(line, "\r\n")] = 0;
    for (char *c = line; n < COLUMNS; n++) {
        cols[n] = c;
        char *tab = strchr(c, '\t');
        if (!tab) { n++; break; }
        *tab = 0;
        c = tab + 1;
    }
    return n;
}

static int num(const char *s) { return strcmp(s, "-") ? atoi(s) : 0; }

int predict_published(const char *path, const char *json_path) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "error: --published %s: cannot read the file\n", path); return 2; }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, rows = 0, within = 0;
    double sum_abs = 0, worst = 0;
    json_t *out = json_array();
    printf("%-17s %6s %-14s | %9s %9s %7s | %s\n", "run", "GPUs", "tp pp dp", "reported", "predicted", "error",
           "the layout plan3d completes it with (memory per GPU)");
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n' || !strncmp(line, "id\t", 3)) continue;
        char *c[COLUMNS];
        if (split_tabs(line, c) != COLUMNS) {
            fprintf(stderr, "error: %s line %d: %d columns expected\n", path, lineno, COLUMNS);
            return 2;
        }
        const model_preset *mp = find_model(c[MODEL]);
        const cluster *cp = find_cluster(c[CLUSTER]);
        if (!mp || !cp) { fprintf(stderr, "error: %s line %d: unknown preset %s\n", path, lineno, mp ? c[CLUSTER] : c[MODEL]); return 2; }
        cluster cl = *cp;
        cl.gpus = atoi(c[GPUS]);
        if (strcmp(c[INTER], "-")) cl.inter_gbs = atof(c[INTER]);
        training tr = {atol(c[BATCH]), TH_BF16, atoi(c[ZERO]), atof(c[OVERLAP]), 0.1};
        constraints k = {num(c[TP]), num(c[PP]), num(c[DP]), num(c[MB]), 0,
                         strcmp(c[SCHED], "-") ? th_schedule_parse(c[SCHED]) : -1,
                         !strcmp(c[SP], "-") ? -1 : !strcmp(c[SP], "on"),
                         !strcmp(c[RECOMP], "-") ? -1 : !strcmp(c[RECOMP], "none") ? 0 : !strcmp(c[RECOMP], "selective") ? 1 : 2, 0};
        if (k.schedule < 0 && strcmp(c[SCHED], "-")) { fprintf(stderr, "error: %s line %d: schedule %s\n", path, lineno, c[SCHED]); return 2; }
        /* the schedules of their time: 1F1B or Megatron's interleaving when the row does not say */
        plan_result r;
        plan_search(&mp->m, &cl, &tr, &k, &r);
        /* the fastest that fits; where our memory model says none does (the
         * run did), the fastest of all, marked */
        int pick = -1;
        for (int i = 0; i < r.n; i++) {
            const estimate *x = &r.all[i];
            if (k.schedule < 0 && x->l.schedule != TH_SCHED_1F1B && x->l.schedule != TH_SCHED_INTERLEAVED) continue;
            if (pick < 0 || (r.n_fit ? x->fits && !r.all[pick].fits : x->t_step < r.all[pick].t_step)) pick = i;
            if (r.n_fit && x->fits) break;
        }
        if (pick < 0) { fprintf(stderr, "error: %s line %d: no layout matches the row\n", path, lineno); return 2; }
        const estimate *e = &r.all[pick];
        double flops = !strcmp(c[FLOPS], "hw") ? e->hw_flops : e->model_flops;
        double predicted = flops / e->t_step / cl.gpus / 1e12, reported = atof(c[TFLOPS]);
        double err = predicted / reported - 1;
        char lt[160];
        printf("%-17s %6d %2d %3d %4d   | %9.0f %9.0f %+6.1f%% | %s (%.1f GiB%s)\n", c[ID], cl.gpus, e->l.tp, e->l.pp, e->l.dp,
               reported, predicted, 100 * err, layout_text(&e->l, lt, sizeof lt), e->mem_total / 1073741824.0,
               e->fits ? "" : ", does NOT fit: the memory model is off for this row");
        json_array_append_new(out, json_pack("{s:s,s:i,s:f,s:f,s:f,s:s,s:b,s:f,s:s}", "id", c[ID], "gpus", cl.gpus,
                                             "reported_tflops", reported, "predicted_tflops", predicted, "error", err,
                                             "layout", lt, "fits", e->fits, "mem_gib", e->mem_total / 1073741824.0,
                                             "source", c[SOURCE]));
        rows++;
        within += fabs(err) <= 0.25;
        sum_abs += fabs(err);
        worst = fmax(worst, fabs(err));
        plan_free(&r);
    }
    free(line);
    fclose(f);
    if (!rows) { fprintf(stderr, "error: --published %s: no rows\n", path); return 2; }
    printf("\n%d runs: mean |error| %.1f%%, worst %.1f%%, %d within 25%%\n", rows, 100 * sum_abs / rows, 100 * worst, within);
    if (json_path) {
        json_t *root = json_pack("{s:s,s:o}", "file", path, "runs", out);
        if (json_dump_file(root, json_path, JSON_INDENT(1))) { fprintf(stderr, "error: --json %s: cannot write\n", json_path); return 2; }
        json_decref(root);
    } else {
        json_decref(out);
    }
    return 0;
}
