/* Device memory with categories and peak tracking.
 *
 * Every buffer of parameters, gradients, optimizer state, activations,
 * communication staging and scratch goes through mem_alloc, so the figures a
 * lab prints are counted by the allocator, not computed from formulas. */
#ifndef PL_MEM_H
#define PL_MEM_H
#include "kinds.h" /* mem_category, mem_category_names */
#include <stddef.h>

/* Zero-initialised buffer on the current device (g_device). Aborts on failure. */
void *mem_alloc(size_t bytes, mem_category cat);
void mem_free(void *p); /* NULL is fine */

size_t mem_current(mem_category cat);
size_t mem_peak(mem_category cat);
size_t mem_peak_total(void); /* peak of the sum over categories */
void mem_reset_peaks(void);  /* peaks := current (tests) */
/* The peaks of every category and of the total (MEM_NCAT + 1 values), and putting
 * them back: what runs between the two (--sample's one-rank model) is left out
 * of the training's figures. */
void mem_peaks_get(size_t peaks[MEM_NCAT + 1]);
void mem_peaks_set(const size_t peaks[MEM_NCAT + 1]);

/* Copies and fills on the current device (host <-> device where it is a GPU). */
void mem_zero(void *dev, size_t bytes);
void mem_copy(void *dst_dev, const void *src_dev, size_t bytes);
void mem_to_host(void *host, const void *dev, size_t bytes);
void mem_to_device(void *dev, const void *host, size_t bytes);

/* The CUDA driver's view (bytes free/total on the GPU); 0 on the CPU. */
int mem_driver_info(size_t *free_bytes, size_t *total_bytes);

#endif
