/* The run's precision (precision.h) and the fp32 kernel table on values. */
#include "precision.h"
#include "device.h"
#include "kernels.h"
#include "kernel_times.h"
#include "mem.h"
#include <string.h>

precision g_precision = PREC_FP32;
const value_kernels *KP = &kernels_values_fp32;

void precision_use(precision p) {
    g_precision = p;
    const value_kernels *table = &kernels_bf16_cpu;
    if (p == PREC_FP32) table = &kernels_values_fp32;
#ifdef PL_HAVE_CUDA
    else if (g_device == DEVICE_CUDA) table = &kernels_bf16_cuda;
#endif
    KP = kernel_times_wrap(table); /* table itself unless PL_KERNEL_TIMES is set */
}

const char *precision_name(precision p) { return p == PREC_BF16 ? "bf16" : "fp32"; }

int precision_parse(const char *name, precision *p) {
    if (!strcmp(name, "fp32")) *p = PREC_FP32;
    else if (!strcmp(name, "bf16")) *p = PREC_BF16;
    else return -1;
    return 0;
}

float *master_alloc(void *params, long n) {
    if (g_precision == PREC_FP32) return params;
    return mem_alloc((size_t)n * sizeof(float), MEM_OPTIM);
}

void master_free(float *master, void *params) {
    if ((void *)master != params) mem_free(master);
}

void params_from_master(void *params, const float *master, long n) { KP->to_values(params, master, n); }

/* ---- fp32: K's kernels, every call passed on as it is ------------------------------
 * The value table takes void * (a value is a float or a bf16), the fp32 table
 * float *; calling one through a pointer of the other's type is undefined in
 * C, so each entry is a one-line wrapper. K is read at each call, not copied:
 * it is the device's table (CPU or CUDA), chosen at run time. */

/* f32_<name>: K's kernel of the same name */
#define FORWARD_TO_K(name, kind, ret, params, args) \
    static ret f32_##name params { KERNEL_RETURN_##ret K->name args; }
VALUE_KERNELS_OF_K(FORWARD_TO_K)
#undef FORWARD_TO_K
static void f32_to_values(void *dst, const float *src, long N) {
    if (dst != (const void *)src) mem_copy(dst, src, (size_t)N * sizeof(float));
}
static void f32_to_floats(float *dst, const void *src, long N) {
    if ((void *)dst != src) mem_copy(dst, src, (size_t)N * sizeof(float));
}

const value_kernels kernels_values_fp32 = {
    .name = "fp32",
#define FP32_ENTRY(name, kind, ret, params, args) .name = f32_##name,
    VALUE_KERNELS(FP32_ENTRY)
#undef FP32_ENTRY
};
