/* Per-rank timeline of compute and communication, for the bubble figures and
 * for the Chrome trace / CSV Gantt chart.
 *
 * On the CPU an event's times are wall-clock; on CUDA they come from CUDA
 * events recorded on the event's stream, so they show when the GPU worked,
 * not when the host queued the work. */
#ifndef PL_TRACE_H
#define PL_TRACE_H
#include <mpi.h>

typedef enum { TRACE_COMPUTE = 0, TRACE_COMM = 1 } trace_kind;

/* Start recording for this rank. */
void trace_init(MPI_Comm world);
/* op must be a string literal (stored by pointer, at most 23 characters are
 * written out). micro_batch -1 when it does not apply. stream is the cudaStream_t
 * the work goes to (NULL: the compute stream; ignored on the CPU).
 * Returns a handle for trace_end. */
int trace_begin(const char *op, trace_kind kind, int micro_batch, void *stream);
void trace_end(int handle);
/* The innermost open event's op (NULL: none open) and micro-batch, the step
 * being run (-1: outside trace_step_begin/end), and when no event is open the
 * compute event this step ended last (*after; NULL: none), so that the flight
 * recorder (flight.h) can name a communication after the code it happens in
 * ("backward", "send_act mb 3", "after backward"). */
const char *trace_context(int *micro_batch, int *step, const char **after);

/* Bracket optimizer step `step` (0-based); steps before `first_measured` are
 * warm-up and do not count in the fractions. */
void trace_step_begin(int step);
void trace_step_end(int step);

/* Over the measured steps of this rank: seconds of wall time; `busy`, seconds
 * inside compute events (a blocking collective nested in one included: the
 * pipeline's bubble is 1 - busy/wall); and each second counted once: `comm`,
 * inside communication events, `compute`, inside compute events but outside
 * every communication event, so compute + comm <= wall (overlapping events of
 * one kind are merged). */
typedef struct { double wall, compute, comm; int steps; double busy; } trace_summary;
trace_summary trace_summarize(int first_measured);

/* Seconds inside this rank's events named `op` over the measured steps, and
 * how many there were (e.g. the forwards, to time one micro-batch's). */
double trace_op_seconds(const char *op, int first_measured, int *count);

/* Collective over `world`: gathers every rank's events to rank 0, which writes
 * a Chrome trace (JSON, opens in Perfetto) and a CSV timeline with columns
 * rank,start_us,end_us,op,kind,micro_batch,step. Times are relative to the
 * earliest event of the job. Either path may be NULL to skip that file. */
void trace_write(MPI_Comm world, const char *json_path, const char *csv_path);

/* Drop all events (tests). */
void trace_reset(void);

#endif
