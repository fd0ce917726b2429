/* Where a step's time goes, by kernel kind: GEMM, attention, LayerNorm, ...
 *
 * With PL_KERNEL_TIMES=1 in the environment, precision_use wraps the kernel
 * table KP in one that brackets every call with a trace event named after
 * its kind ("kernel gemm", ...). The run's summary then prints milliseconds
 * per step by kind (the measured steps, rank 0), the record holds them as
 * kernel_ms_per_step, and the trace shows each call inside forward and
 * backward. Off by default: a run without it calls the kernels directly, so
 * timing costs nothing there. On CUDA the events are the trace's CUDA events,
 * so the times are the GPU's. */
#ifndef PL_KERNEL_TIMES_H
#define PL_KERNEL_TIMES_H
#include "kernels.h"

/* the kinds: kernels.h (KERNEL_GEMM, ...), where each kernel on values names its own */
extern const char *const kernel_kind_names[KERNEL_NKINDS]; /* "gemm", "attention", ... */

int kernel_times_enabled(void); /* PL_KERNEL_TIMES is set and not "0" */
/* `inner` itself when timing is off, else a table that times each call and
 * passes it on to inner. */
const value_kernels *kernel_times_wrap(const value_kernels *inner);
/* This rank's seconds inside each kind's calls over steps >= first_measured. */
void kernel_times_seconds(int first_measured, double seconds[KERNEL_NKINDS]);

#endif
