/* The timing wrapper around KP (kernel_times.h): every call becomes a trace
 * event named after its kernel kind. */
#include "kernel_times.h"
#include "trace.h"
#include <stdlib.h>
#include <string.h>

const char *const kernel_kind_names[KERNEL_NKINDS] = {
    "gemm", "attention", "layernorm", "gelu", "softmax/loss", "optimizer", "conversions", "residual", "embedding"};
/* the trace's op names (stored by pointer, so literals) */
static const char *const kind_op[KERNEL_NKINDS] = {
    "kernel gemm", "kernel attention", "kernel layernorm", "kernel gelu", "kernel softmax/loss",
    "kernel optimizer", "kernel conversions", "kernel residual", "kernel embedding"};

int kernel_times_enabled(void) {
    const char *e = getenv("PL_KERNEL_TIMES");
    return e && *e && strcmp(e, "0");
}

void kernel_times_seconds(int first_measured, double seconds[KERNEL_NKINDS]) {
    for (int k = 0; k < KERNEL_NKINDS; k++) seconds[k] = trace_op_seconds(kind_op[k], first_measured, NULL);
}

static const value_kernels *in; /* the table the timed calls go to */

static void end_event(const int *ev) { trace_end(*ev); }

/* t_<name>: one trace event of its kind around the call (ended as the call returns) */
#define TIMED_KERNEL(name, kind, ret, params, args)                                                            \
    static ret t_##name params {                                                                               \
        const int ev_ __attribute__((cleanup(end_event))) = trace_begin(kind_op[kind], TRACE_COMPUTE, -1, NULL); \
        KERNEL_RETURN_##ret in->name args;                                                                     \
    }
VALUE_KERNELS(TIMED_KERNEL)
#undef TIMED_KERNEL

static value_kernels timed;

const value_kernels *kernel_times_wrap(const value_kernels *inner) {
    if (!kernel_times_enabled()) return inner;
    in = inner;
    /* a copy first: an entry added to the table later and not listed here
     * still runs (untimed, so its time shows as "other"); the test
     * kernels_every_one_timed (tests/test_kernel_times.c) fails on such an entry */
    timed = *inner;
#define TIME_ENTRY(name, kind, ret, params, args) timed.name = t_##name;
    VALUE_KERNELS(TIME_ENTRY)
#undef TIME_ENTRY
    return &timed;
}
