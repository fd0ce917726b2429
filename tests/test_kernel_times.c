/* Every kernel of the value tables is timed (common/kernel_times.h): with
 * PL_KERNEL_TIMES=1, kernel_times_wrap must replace every function of the
 * table it wraps. A kernel added to value_kernels (common/kernels.h) and not
 * to kernel_times.c would run untimed, its time counted as "other" in every
 * summary: this test names its place in the table. */
#include "device.h"
#include "kernel_times.h"
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*any_fn)(void);

static int check_table(const char *what, const value_kernels *inner) {
    const value_kernels *timed = kernel_times_wrap(inner);
    if (timed == inner) {
        printf("FAIL: %s: kernel_times_wrap returned the table itself with PL_KERNEL_TIMES=1\n", what);
        return 1;
    }
    /* the function pointers follow the name, each the size of any_fn */
    const size_t first = offsetof(value_kernels, encoder_forward), n = (sizeof(value_kernels) - first) / sizeof(any_fn);
    int untimed = 0;
    for (size_t i = 0; i < n; i++) {
        any_fn a, b;
        memcpy(&a, (const char *)inner + first + i * sizeof(any_fn), sizeof a);
        memcpy(&b, (const char *)timed + first + i * sizeof(any_fn), sizeof b);
        if (a && a == b) {
            printf("FAIL: %s: entry %zu of value_kernels (after encoder_forward, %zu bytes in) is not timed: add a "
                   "wrapper in common/kernel_times.c\n", what, i, first + i * sizeof(any_fn));
            untimed++;
        }
    }
    printf("%s: %zu kernels, %d untimed\n", what, n, untimed);
    return untimed;
}

int main(void) {
    setenv("PL_KERNEL_TIMES", "1", 1);
    device_use(DEVICE_CPU, 0);
    int failures = check_table("fp32 values", &kernels_values_fp32) + check_table("bf16 cpu", &kernels_bf16_cpu);
    if (failures) {
        printf("%d kernel(s) untimed\n", failures);
        return 1;
    }
    printf("every kernel is timed\n");
    return 0;
}
