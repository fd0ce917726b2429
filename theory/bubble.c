/* Pipeline schedules: bubble and activations in flight (theory.h). */
#include "theory.h"
#include <math.h>
#include <string.h>

const char *const th_schedule_names[TH_NSCHED] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};

int th_schedule_parse(const char *name) {
    for (int s = 0; s < TH_NSCHED; s++)
        if (!strcmp(name, th_schedule_names[s])) return s;
    return -1;
}

int th_schedule_chunks(th_schedule s, int v) {
    return s == TH_SCHED_INTERLEAVED ? (v > 0 ? v : 1) : s == TH_SCHED_ZB_V ? 2 : 1;
}

static int splits(th_schedule s) { return s == TH_SCHED_ZB_H1 || s == TH_SCHED_ZB_V; }
static int min_i(int a, int b) { return a < b ? a : b; }
static int max_i(int a, int b) { return a > b ? a : b; }

double th_bubble_time(th_schedule s, int p, int m, int v, double tF, double tB, double tW) {
    (void)m;
    const double gaps = p - 1;
    switch (s) {
    case TH_SCHED_INTERLEAVED: return gaps * (tF + tB + tW) / (v > 0 ? v : 1);
    case TH_SCHED_ZB_H1: return gaps * fmax(fmax(tF, tB), tF + tB - tW);
    case TH_SCHED_ZB_V: return gaps * fmax(tB - tW, tB / 2);
    default: return gaps * (tF + tB + tW);
    }
}

int th_bubble_time_exact(th_schedule s, double tF, double tB, double tW) {
    return s != TH_SCHED_ZB_V || (tW <= tF && tF <= tB);
}

double th_pipeline_step_time(th_schedule s, int p, int m, int v, double tF, double tB, double tW) {
    return m * (tF + tB + tW) + th_bubble_time(s, p, m, v, tF, tB, tW);
}

double th_bubble_unit(th_schedule s, int p, int m, int v) {
    /* one slot each for F, B and W; GPipe and 1F1B run B and W as one backward */
    const double idle = th_bubble_time(s, p, m, th_schedule_chunks(s, v), 1, 1, 1);
    return idle / (idle + 3.0 * m);
}

const char *th_bubble_unit_text(th_schedule s) {
    switch (s) {
    case TH_SCHED_INTERLEAVED: return "(p-1)/(vm+p-1)";
    case TH_SCHED_ZB_H1: return "(p-1)/(3m+p-1)";
    case TH_SCHED_ZB_V: return "(p-1)/(6m+p-1)";
    default: return "(p-1)/(m+p-1)";
    }
}

const char *th_bubble_time_text(th_schedule s) {
    switch (s) {
    case TH_SCHED_INTERLEAVED: return "(p-1)(tF+tB+tW)/v";
    case TH_SCHED_ZB_H1: return "(p-1)max(tF,tB,tF+tB-tW)";
    case TH_SCHED_ZB_V: return "(p-1)max(tB-tW,tB/2)";
    default: return "(p-1)(tF+tB+tW)";
    }
}

/* Interleaved 1F1B in Megatron-LM's order: the rank's k-th forward is on
 * chunk (k mod p v) / p, its k-th backward on chunk v - 1 - (k mod p v) / p
 * (micro-batches go round in groups of p, chunk by chunk, and come back in
 * reverse). How many of the first n forwards (or backwards) are on chunk c: */
static int on_chunk(int n, int p, int v, int c) {
    return n / (p * v) * p + min_i(max_i(n % (p * v) - c * p, 0), p);
}

/* After `warmup` forwards the rank runs one forward and one backward in turn;
 * chunk c's blocks peak just before one of those backwards: with the first
 * warmup + 1 + i forwards and the first i backwards done, for some i. The
 * difference repeats with period p v, so one period (or the steady state, if
 * shorter) holds the largest. */
static int interleaved_peak(int p, int m, int v, int rank, int c) {
    const int total = m * v;
    const int warmup = m == p ? total : min_i(total, 2 * (p - rank - 1) + (v - 1) * p);
    if (warmup >= total) return m; /* all forwards first: every micro-batch of every chunk */
    int peak = 0;
    for (int i = 0; i < min_i(p * v, total - warmup); i++)
        peak = max_i(peak, on_chunk(warmup + 1 + i, p, v, c) - on_chunk(i, p, v, v - 1 - c));
    return peak;
}

void th_chunk_in_flight(th_schedule s, int p, int m, int v, int rank, int chunk, int *acts, int *wgrads) {
    int a, w = 0;
    switch (s) {
    case TH_SCHED_GPIPE: a = m; break;
    case TH_SCHED_INTERLEAVED: a = interleaved_peak(p, m, v, rank, chunk); break;
    case TH_SCHED_ZB_H1: a = p; w = rank + 1; break;
    case TH_SCHED_ZB_V:
        a = chunk == 0 ? min_i(m, 2 * p - rank) : rank + 1;
        w = chunk == 0 ? rank + 1 : max_i(1, rank);
        break;
    default: a = min_i(m, p - rank); break; /* 1f1b */
    }
    *acts = a;
    *wgrads = splits(s) ? w : 0;
}

double th_acts_in_flight(th_schedule s, int p, int stage, int m, int v) {
    const int chunks = th_schedule_chunks(s, v);
    double sum = 0;
    for (int c = 0; c < chunks; c++) {
        int a, w;
        th_chunk_in_flight(s, p, m, chunks, stage, c, &a, &w);
        sum += a;
    }
    return sum / chunks;
}

/* ---- the pipeline's pure rules --------------------------------------------------------- */

int th_stage_split_possible(int layers, int stages) { return stages >= 1 && stages <= layers; }

void th_stage_layers(int layers, int stages, int stage, int *lo, int *hi) {
    int q = layers / stages, extra = layers % stages;
    int first_long = stages - extra; /* stages from here on run q + 1 layers */
    *lo = stage * q + (stage > first_long ? stage - first_long : 0);
    *hi = *lo + q + (stage >= first_long ? 1 : 0);
}

int th_stage_split_ends_possible(int layers, int stages) { return stages >= 1 && stages <= layers + 2; }

void th_stage_layers_ends(int layers, int stages, int stage, int *lo, int *hi) {
    if (stages == 1) { *lo = 0; *hi = layers; return; }
    int slo, shi; /* the stage's slots of layers + 2: slot 0 the embedding, slot layers + 1 the head */
    th_stage_layers(layers + 2, stages, stage, &slo, &shi);
    *lo = slo > 0 ? slo - 1 : 0;
    *hi = shi - 1 < layers ? shi - 1 : layers;
}

int th_chunk_stage(th_schedule s, int p, int rank, int chunk) {
    if (s == TH_SCHED_ZB_V) return chunk == 0 ? rank : 2 * p - 1 - rank;
    return chunk * p + rank;
}

void th_stage_place(th_schedule s, int p, int stage, int *rank, int *chunk) {
    if (s == TH_SCHED_ZB_V) {
        *chunk = stage < p ? 0 : 1;
        *rank = stage < p ? stage : 2 * p - 1 - stage;
    } else {
        *chunk = stage / p;
        *rank = stage % p;
    }
}
