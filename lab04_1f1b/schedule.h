/* Pipeline schedules: in which order one stage runs the forwards and
 * backwards of the m micro-batches of a step.
 *
 * GPipe: all m forwards, then all m backwards. Every stage holds the
 * activations of all m micro-batches at the turn.
 *
 * 1F1B (PipeDream-flush, as in Megatron-LM): stage r of p first runs
 * warmup = min(p - r - 1, m) forwards, then alternates one forward and one
 * backward (m - warmup times), then runs the warmup remaining backwards. A
 * micro-batch's activations are freed by its backward, so stage r never holds
 * more than min(m, p - r) of them.
 *
 * Both leave the same idle time per stage: p - 1 slots of (forward + backward)
 * out of m + p - 1, the bubble (p-1)/(m+p-1). 1F1B buys memory, not speed. */
#ifndef LAB04_SCHEDULE_H
#define LAB04_SCHEDULE_H
#include "stage.h"

typedef enum { SCHEDULE_GPIPE, SCHEDULE_1F1B } schedule_kind;

/* "gpipe" or "1f1b" (what --schedule accepts). */
schedule_kind schedule_parse(const char *name);
const char *schedule_name(schedule_kind kind);

/* Run the forwards and backwards of one step's m micro-batches on stage s
 * (gradients accumulate in s->grads; the optimizer step is the caller's). */
void schedule_run(pipeline_stage *s, schedule_kind kind, int micro_batches);

/* The formulas the measurements are compared with. */
int schedule_warmup_forwards(int stages, int stage, int micro_batches); /* 1F1B's warm-up */
int schedule_acts_in_flight(schedule_kind kind, int stages, int stage, int micro_batches);
const char *schedule_acts_formula(schedule_kind kind);
double schedule_bubble_theory(int stages, int micro_batches);

#endif
