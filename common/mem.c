#include "mem.h"
#include "device.h"
#include <stdlib.h>
#include <string.h>

/* Live allocations, so mem_free knows a buffer's size and category. */
typedef struct { void *p; size_t bytes; mem_category cat; } allocation;
static allocation *live;
static size_t n_live, cap_live;
static size_t current[MEM_NCAT], peak[MEM_NCAT], total_now, total_peak;

void *mem_alloc(size_t bytes, mem_category cat) {
    void *p = NULL;
    size_t padded = bytes ? bytes : 1;
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMalloc(&p, padded));
        /* on the compute stream: a plain cudaMemset goes to the legacy stream,
         * which the (non-blocking) compute stream does not wait for */
        CUDA_CHECK(cudaMemsetAsync(p, 0, padded, (cudaStream_t)device_compute_stream()));
    } else
#endif
    {
        /* 64-byte alignment: whole cache lines, and AVX-512 loads never split */
        padded = (padded + 63) / 64 * 64;
        p = aligned_alloc(64, padded);
        if (!p) die("out of host memory allocating %zu bytes for %s", bytes, mem_category_names[cat]);
        memset(p, 0, padded);
    }
    if (n_live == cap_live) {
        cap_live = cap_live ? 2 * cap_live : 64;
        live = realloc(live, cap_live * sizeof *live);
        if (!live) die("out of host memory");
    }
    live[n_live++] = (allocation){p, bytes, cat};
    current[cat] += bytes;
    if (current[cat] > peak[cat]) peak[cat] = current[cat];
    total_now += bytes;
    if (total_now > total_peak) total_peak = total_now;
    return p;
}

void mem_free(void *p) {
    if (!p) return;
    for (size_t i = n_live; i-- > 0;) {
        if (live[i].p != p) continue;
        current[live[i].cat] -= live[i].bytes;
        total_now -= live[i].bytes;
        live[i] = live[--n_live];
#ifdef PL_HAVE_CUDA
        if (g_device == DEVICE_CUDA) { CUDA_CHECK(cudaFree(p)); return; }
#endif
        free(p);
        return;
    }
    die("mem_free of a pointer mem_alloc did not return");
}

size_t mem_current(mem_category cat) { return current[cat]; }
size_t mem_peak(mem_category cat) { return peak[cat]; }
size_t mem_peak_total(void) { return total_peak; }
void mem_peaks_get(size_t peaks[MEM_NCAT + 1]) {
    for (int c = 0; c < MEM_NCAT; c++) peaks[c] = peak[c];
    peaks[MEM_NCAT] = total_peak;
}
void mem_peaks_set(const size_t peaks[MEM_NCAT + 1]) {
    for (int c = 0; c < MEM_NCAT; c++) peak[c] = peaks[c];
    total_peak = peaks[MEM_NCAT];
}
void mem_reset_peaks(void) {
    for (int c = 0; c < MEM_NCAT; c++) peak[c] = current[c];
    total_peak = total_now;
}

void mem_zero(void *dev, size_t bytes) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemsetAsync(dev, 0, bytes, (cudaStream_t)device_compute_stream()));
        return;
    }
#endif
    memset(dev, 0, bytes);
}

void mem_copy(void *dst, const void *src, size_t bytes) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                (cudaStream_t)device_compute_stream()));
        return;
    }
#endif
    memmove(dst, src, bytes);
}

void mem_to_host(void *host, const void *dev, size_t bytes) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        cudaStream_t s = (cudaStream_t)device_compute_stream();
        CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        return;
    }
#endif
    memcpy(host, dev, bytes);
}

void mem_to_device(void *dev, const void *host, size_t bytes) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        cudaStream_t s = (cudaStream_t)device_compute_stream();
        CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        return;
    }
#endif
    memcpy(dev, host, bytes);
}

int mem_driver_info(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
        return 1;
    }
#endif
    return 0;
}
