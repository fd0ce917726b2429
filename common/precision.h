/* The precision of the model's values: fp32, or bf16 mixed precision.
 *
 * "Values" are the numbers forward and backward work on: the weights they
 * read, the activations, and the gradients of both. In an fp32 run they are
 * floats. In a bf16 run (--precision bf16) they are bfloat16, stored in 2
 * bytes: float's sign, its 8-bit exponent (so the same range) and the top 7
 * bits of its 23-bit fraction (so about 3 significant digits). What stays
 * fp32 in both: the weights the optimizer updates (a bf16 run keeps an fp32
 * master copy, and rounds it into the bf16 weights after every step), the
 * two AdamW moments, and inside every kernel the arithmetic itself (matrix
 * products accumulate in fp32; LayerNorm statistics, softmax, the loss and
 * the gradient-norm sums are fp32).
 *
 * Bytes per parameter of model state, as the ZeRO paper counts them (section
 * 3.1): fp32 4 + 4 + 8 (weights, gradients, AdamW moments); bf16 2 + 2 + 12
 * (bf16 weights, bf16 gradients, fp32 master weights + moments). The master
 * copy is optimizer state (mem category "optim"): only the optimizer reads
 * it, and ZeRO shards it with the moments. Gradients are bf16 from the
 * backward to the optimizer: accumulated in bf16 across micro-batches, and
 * summed across ranks in bf16 (comm.h), the ZeRO paper's 2 bytes, not
 * Megatron's fp32 "main gradients" (4).
 *
 * The run's precision is a global, like the device (device.h): buffers of
 * values are void *, their size is value_bytes() per element, and KP
 * (kernels.h) is the kernel table for them. */
#ifndef PL_PRECISION_H
#define PL_PRECISION_H
#include "kinds.h" /* precision */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern precision g_precision; /* the run's; PREC_FP32 until precision_use */

/* Select the precision (and the kernel table KP for it on the current device;
 * device_use calls it again when the device changes). */
void precision_use(precision p);
const char *precision_name(precision p);       /* "fp32", "bf16" */
int precision_parse(const char *name, precision *p); /* 0, or -1 for an unknown name */

/* Bytes of one value: 4 or 2. */
static inline size_t value_bytes(void) { return g_precision == PREC_BF16 ? 2 : 4; }
/* Element i of a buffer of values. */
static inline void *value_at(const void *base, long i) {
    return (char *)(uintptr_t)base + (size_t)i * value_bytes();
}

/* The fp32 weights the optimizer updates, for `params` (n values): params
 * itself in an fp32 run, else a buffer of its own (category optim, zeroed).
 * A lab initialises (or loads) the master weights, then rounds them into
 * params with params_from_master. master_free frees what master_alloc
 * allocated. */
float *master_alloc(void *params, long n);
void master_free(float *master, void *params);
/* After the optimizer updated the master weights: params = bf16(master) (a
 * no-op when they are the same buffer, the fp32 run). */
void params_from_master(void *params, const float *master, long n);

/* bfloat16 on the host: round to nearest even (NaN stays NaN), and back. */
static inline uint16_t bf16_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* a quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float float_from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
