/* Which machine the kernels run on, chosen once at start-up.
 *
 * The same binary runs on CPUs and GPUs: CUDA support is compiled in when the
 * toolkit exists (PL_HAVE_CUDA), and used only when a driver and a GPU exist. */
#ifndef PL_DEVICE_H
#define PL_DEVICE_H

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } device_kind;

extern device_kind g_device; /* the kind in use; DEVICE_CPU until device_use */

/* Number of GPUs this process can use: 0 without a CUDA build, a driver or a GPU. */
int device_gpu_count(void);
/* The 16-byte UUID of visible GPU `gpu_index`: what tells two ranks whether they
 * share a GPU, whatever CUDA_VISIBLE_DEVICES each was given. 0 on success. */
int device_gpu_uuid(int gpu_index, unsigned char uuid[16]);
/* Bytes of memory of visible GPU `gpu_index` (its total, as the driver reports
 * it; no context is created); 0 without a CUDA build, a driver or that GPU. */
double device_gpu_memory_bytes(int gpu_index);
/* Bytes of memory the host has for this process and its neighbours: physical
 * memory, or the limit of the cgroup it runs in when that is lower; 0: unknown. */
double device_host_memory_bytes(void);
/* Select the kind (and for CUDA the GPU index); also selects the kernel table K. */
void device_use(device_kind kind, int gpu_index);
/* Wait until all queued device work is done (no-op on the CPU). */
void device_synchronize(void);
/* The CUDA stream all kernels run on (a cudaStream_t), NULL on the CPU. */
void *device_compute_stream(void);
/* Another CUDA stream (NULL on the CPU), for communication that overlaps compute. */
void *device_stream_create(void);
/* Work queued on `waiter` from now on starts only after all work queued so far
 * on `waitee` is done (an event between the two streams; no-op on the CPU). */
void device_stream_wait(void *waiter, void *waitee);
/* Wall-clock seconds from a monotonic clock. */
double now_seconds(void);
/* Print "rank R: what failed" to stderr and abort the whole MPI job. */
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#ifdef PL_HAVE_CUDA
#include <cuda_runtime.h>
/* The one check of a CUDA runtime call: an error ends the job naming the call.
 * A fault inside a kernel surfaces at a later call, far from its cause: the
 * hint says so (PL_CUDA_SYNC=1 makes the kernel report it under its own name). */
const char *device_fault_hint(cudaError_t e);
#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) die("%s: %s%s", #call, cudaGetErrorString(e_), device_fault_hint(e_)); \
    } while (0)
#endif

#endif
