#include "schedule.h"
#include "device.h"
#include <stdlib.h>
#include <string.h>

static int min_int(int a, int b) { return a < b ? a : b; }

schedule_kind schedule_parse(const char *name) {
    return !strcmp(name, "gpipe") ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
}

const char *schedule_name(schedule_kind kind) { return kind == SCHEDULE_GPIPE ? "gpipe" : "1f1b"; }

int schedule_warmup_forwards(int stages, int stage, int micro_batches) {
    return min_int(stages - stage - 1, micro_batches);
}

int schedule_acts_in_flight(schedule_kind kind, int stages, int stage, int micro_batches) {
    return kind == SCHEDULE_GPIPE ? micro_batches : min_int(micro_batches, stages - stage);
}

const char *schedule_acts_formula(schedule_kind kind) {
    return kind == SCHEDULE_GPIPE ? "m micro-batches (gpipe)" : "min(m, p-r) micro-batches (1f1b)";
}

double schedule_bubble_theory(int stages, int micro_batches) {
    return (double)(stages - 1) / (micro_batches + stages - 1);
}

/* All forwards, then all backwards (in the same order, micro-batch 0 first). */
static void run_gpipe(pipeline_stage *s, gpt_acts *acts, int m) {
    for (int i = 0; i < m; i++) {
        stage_acts_alloc(s, &acts[i], i);
        stage_forward(s, &acts[i], i);
    }
    for (int i = 0; i < m; i++) {
        stage_backward(s, &acts[i], i);
        stage_acts_free(s, &acts[i]);
    }
}

/* Warm-up forwards, the steady one-forward-one-backward, the cool-down backwards.
 *
 * In the steady state a stage's output for micro-batch f goes to the next stage
 * at the same moment as the gradient of micro-batch b comes back from it, and
 * the gradient of b goes to the previous stage as the input of f+1 arrives
 * from it. Each pair is one paired exchange. Posted as two blocking calls, send
 * first, stage r would wait in its send for r+1 to receive while r+1 waits in
 * its own send for r to receive: a deadlock as soon as the messages are too
 * large for MPI to send eagerly (README, exercise 4).
 *
 * A micro-batch's activations are freed right after its backward, before the
 * next input is allocated, so the count in flight never exceeds min(m, p-r). */
static void run_1f1b(pipeline_stage *s, gpt_acts *acts, int m) {
    int warmup = schedule_warmup_forwards(s->count, s->index, m), steady = m - warmup;
    for (int i = 0; i < warmup; i++) {
        stage_acts_alloc(s, &acts[i], i);
        stage_forward(s, &acts[i], i);
    }
    if (steady > 0) {
        stage_acts_alloc(s, &acts[warmup], warmup);
        stage_recv_forward(s, &acts[warmup], warmup);
    }
    for (int i = 0; i < steady; i++) {
        int f = warmup + i, b = i; /* this round's forward and backward micro-batches */
        stage_forward_compute(s, &acts[f], f);
        stage_send_forward_recv_backward(s, &acts[f], f, b);
        const float *dx = stage_backward_compute(s, &acts[b], b);
        stage_acts_free(s, &acts[b]); /* dx lives in the stage's scratch, not in acts[b] */
        if (i == steady - 1) {
            stage_send_backward(s, dx, b);
        } else {
            stage_acts_alloc(s, &acts[f + 1], f + 1);
            stage_send_backward_recv_forward(s, dx, b, &acts[f + 1], f + 1);
        }
    }
    for (int b = steady; b < m; b++) {
        stage_backward(s, &acts[b], b);
        stage_acts_free(s, &acts[b]);
    }
}

void schedule_run(pipeline_stage *s, schedule_kind kind, int micro_batches) {
    /* one slot per micro-batch; only the ones in flight hold an allocation */
    gpt_acts *acts = calloc((size_t)micro_batches, sizeof *acts);
    if (!acts) die("out of host memory");
    if (kind == SCHEDULE_GPIPE) run_gpipe(s, acts, micro_batches);
    else run_1f1b(s, acts, micro_batches);
    free(acts);
}
