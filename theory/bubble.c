/* Pipeline schedules: bubble and activations in flight (theory.h). */
#include "theory.h"
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

static double min_d(double a, double b) { return a < b ? a : b; }

double th_bubble_unit(th_schedule s, int p, int m, int v) {
    /* one slot each for F, B and W; GPipe and 1F1B run B and W as one backward */
    const double tW = s == TH_SCHED_ZB_H1 || s == TH_SCHED_ZB_V ? 1 : 0;
    const double idle = th_bubble_time(s, p, m, v, 1, 1, tW);
    return idle / th_pipeline_step_time(s, p, m, v, 1, 1, tW);
}

double th_bubble_time(th_schedule s, int p, int m, int v, double tF, double tB, double tW) {
    (void)m;
    const double gaps = p - 1;
    switch (s) {
    case TH_SCHED_INTERLEAVED: return gaps * (tF + tB + tW) / (v > 0 ? v : 1);
    case TH_SCHED_ZB_H1: return gaps * (tF + tB - tW > 0 ? tF + tB - tW : 0);
    case TH_SCHED_ZB_V: return gaps * (tF + tB - 2 * tW > 0 ? tF + tB - 2 * tW : 0) / 2;
    default: return gaps * (tF + tB + tW);
    }
}

double th_pipeline_step_time(th_schedule s, int p, int m, int v, double tF, double tB, double tW) {
    return m * (tF + tB + tW) + th_bubble_time(s, p, m, v, tF, tB, tW);
}

double th_acts_in_flight(th_schedule s, int p, int stage, int m, int v) {
    switch (s) {
    case TH_SCHED_GPIPE: return m;
    case TH_SCHED_INTERLEAVED: {
        const double chunks = v > 0 ? v : 1;
        return min_d(m * chunks, 2.0 * (p - stage - 1) + (chunks - 1) * p + 1) / chunks;
    }
    case TH_SCHED_ZB_V: return min_d(m, p);
    default: return min_d(m, p - stage); /* 1f1b, zb-h1 */
    }
}
