/* Pipeline schedules as data: for every rank, the list of what it computes, in
 * order. An action is F (forward), B (backward) or W (weight gradient) of one
 * micro-batch on one of the rank's model chunks. Where a schedule splits the
 * backward, B is only its input half (the gradient the previous stage waits
 * for) and W the weight half (which nobody waits for until the optimizer
 * step); elsewhere B is the whole backward and there is no W.
 *
 * Everything here is a pure function of (schedule, p, m, v): no MPI, no device.
 * Every rank makes the lists of all ranks (they are small), so each knows what
 * its neighbours will send and when; executor.c runs the lists.
 *
 * The schedules (p ranks, m micro-batches, v chunks per rank):
 *
 *   gpipe        all m forwards, then all m backwards (Huang et al. 2019).
 *   1f1b         stage r: min(p-r-1, m) warm-up forwards, then one forward and
 *                one backward in turn, then the remaining backwards
 *                (PipeDream-flush; Narayanan et al. 2021).
 *   interleaved  v chunks per rank of L/(pv) layers each; chunk c of rank r is
 *                virtual stage c p + r, so a micro-batch visits every rank v
 *                times. Megatron-LM's order: forwards go round the ranks in
 *                groups of p micro-batches, chunk by chunk; the warm-up is
 *                2(p-r-1) + (v-1)p forwards (all m v when m = p), then one
 *                forward and one backward in turn. Needs m a multiple of p.
 *   zb-h1        1f1b with the backward split (Qi et al. 2024, "Zero Bubble
 *                Pipeline Parallelism"): B goes on at once, and stage r keeps up
 *                to r W's pending, which fill the cool-down that B's quicker
 *                return would leave idle. Needs m >= p.
 *   zb-v         two chunks per rank in a V: rank r holds virtual stages r and
 *                2p-1-r, so a micro-batch goes down the ranks and back up, and
 *                the loss is on rank 0. The backward split, with W's filling
 *                the gaps. Needs m >= 2p-1.
 *
 * The formulas these lists promise (the bubble on unit times and on measured
 * t_F, t_B, t_W, the activation blocks each chunk holds at its peak) are
 * theory/'s (theory.h, "pipeline schedules"), the functions lab06 and plan3d
 * print too; the functions below call them. tests/test_theory.c holds them
 * equal to these lists: the blocks counted on the lists, the bubble simulated. */
#ifndef LAB04_SCHEDULE_H
#define LAB04_SCHEDULE_H
#include "theory.h"

/* theory.h's enum, the one of this concept (theory's formulas take it as it
 * is, no cast), under the names lab04's code reads */
typedef th_schedule schedule_kind;
#define SCHEDULE_GPIPE TH_SCHED_GPIPE
#define SCHEDULE_1F1B TH_SCHED_1F1B
#define SCHEDULE_INTERLEAVED TH_SCHED_INTERLEAVED
#define SCHEDULE_ZB_H1 TH_SCHED_ZB_H1
#define SCHEDULE_ZB_V TH_SCHED_ZB_V
#define SCHEDULE_KINDS TH_NSCHED

/* What --schedule accepts, in the order of schedule_kind. */
#define SCHEDULE_CHOICES "gpipe|1f1b|interleaved|zb-h1|zb-v"

typedef enum { OP_F, OP_B, OP_W, OP_KINDS } schedule_op;

typedef struct schedule_action {
    schedule_op op;
    int mb;    /* micro-batch, 0 .. m-1 */
    int chunk; /* the rank's model chunk, 0 .. v-1 */
} schedule_action;

typedef struct schedule {
    schedule_kind kind;
    int p, m, v;             /* ranks, micro-batches, chunks per rank (p v virtual stages) */
    int split;               /* 1: B is the input half, and every (mb, chunk) also has a W */
    int forward_only;        /* only F's (schedule_forward_only: an evaluation pass) */
    int *count;              /* count[r]: actions of rank r */
    schedule_action **rank;  /* rank[r][i], i < count[r] */
} schedule;

/* Name <-> kind; schedule_parse returns -1 for an unknown name. */
int schedule_parse(const char *name);
const char *schedule_name(schedule_kind kind);
/* Chunks per rank: v for interleaved, 2 for zb-v, else 1. */
int schedule_chunks(schedule_kind kind, int v);
int schedule_splits_backward(schedule_kind kind);

/* The messages of one step, an activation and a gradient per micro-batch and
 * virtual stage (2 p v m, in 64 bits): each has its own MPI tag, id + 1
 * (executor.c), and MPI promises tags up to 32767 (MPI_TAG_UB's least value). */
#define SCHEDULE_MAX_MESSAGES 32766
long long schedule_messages(int p, int m, int chunks);

/* Whether (kind, p, m, v, layers) can be run; if not, writes one line naming
 * the flag and the rule into msg and returns 0. v_given: --virtual-stages was
 * on the command line (only interleaved takes it; zb-v accepts only 2). */
int schedule_check(schedule_kind kind, int p, int m, int v, int v_given, int layers, char *msg, int len);

/* The lists (kind, p, m, v already checked). v is ignored unless interleaved. */
void schedule_make(schedule *s, schedule_kind kind, int p, int m, int v);
void schedule_free(schedule *s);

/* The same lists with only their F's, in the same order: a forward-only pass
 * (--eval) that keeps each rank's order, which stays valid without the
 * backwards. */
void schedule_forward_only(const schedule *s, schedule *out);

/* Where the virtual stages sit (theory.h's th_chunk_stage, th_stage_place):
 * chunk c of rank r is stage schedule_stage_of; stage s is chunk *chunk of
 * rank *rank. Stage 0 embeds, stage p v - 1 has the loss. */
int schedule_stage_of(const schedule *s, int rank, int chunk);
void schedule_place(const schedule *s, int stage, int *rank, int *chunk);
int schedule_stages(const schedule *s); /* p v */
/* How many of rank's chunks' boundaries lead to another rank: each carries m
 * activations one way and m gradients the other per step (1f1b: 1 at the ends
 * of the pipe, 2 between; interleaved about 2v; zb-v about 4, its turn at rank
 * p-1 stays on the rank). */
int schedule_remote_links(const schedule *s, int rank);

/* Each rank runs its list in order; an action starts when its rank is free and
 * its inputs are there: F(mb) of stage s after F(mb) of stage s-1, B(mb) of s
 * after B(mb) of s+1 (the last stage: after its own F), W after its own B.
 * Times are a rank's whole share (an action on one of v chunks takes t / v;
 * an unsplit B takes (t_B + t_W) / v); sends are free. Returns the makespan,
 * and when start is not NULL, start[r][i] of every action (caller frees each
 * row and start). Dies if an action is missing, repeated, or waits for ever. */
double schedule_simulate(const schedule *s, double t_f, double t_b, double t_w, double ***start);
/* 1 - work / makespan of that simulation: the bubble of every rank (all do the same work). */
double schedule_simulated_bubble(const schedule *s, double t_f, double t_b, double t_w);

/* The bubble fraction by theory/'s formula (th_bubble_time) on the given
 * times, or, for zb-v on times where it has no closed form, the simulation of
 * its lists; and the formula as text. */
double schedule_bubble_formula(const schedule *s, double t_f, double t_b, double t_w);
const char *schedule_bubble_formula_text(schedule_kind kind);
/* The textbook figure, on unit times (t_F = t_B = t_W): theory's th_bubble_unit,
 * (p-1)/(m+p-1), (p-1)/(v m+p-1), (p-1)/(3m+p-1), (p-1)/(6m+p-1); and as text. */
double schedule_bubble_textbook(schedule_kind kind, int p, int m, int v);
const char *schedule_bubble_textbook_text(schedule_kind kind);

/* Activation blocks a chunk holds at its peak (theory's th_chunk_in_flight):
 * acts, the micro-batches whose F has run and whose backward (W where split)
 * has not; wgrads, those whose B has run and W not (the weight-gradient
 * inputs, 0 where the schedule does not split). Each chunk keeps its own
 * blocks, so a rank's activation peak is the sum over its chunks of acts x one
 * micro-batch's activations + wgrads x one micro-batch's weight-gradient inputs. */
void schedule_in_flight(const schedule *s, int rank, int chunk, int *acts, int *wgrads);

/* One action as text: "F3", "B3", "W3", with ".c" for the chunk when v > 1. */
void schedule_action_text(const schedule *s, schedule_action a, char *buf, int len);
/* --print-schedule: a header line, one line per rank ("rank 0 (stages 0 4): F0 ..."),
 * the unit-time makespan and bubble beside the textbook figure, and the
 * activation blocks in flight per rank and chunk. */
void schedule_print(const schedule *s);

#endif
