#define _POSIX_C_SOURCE 200809L
#include "device.h"
#include "kernels.h"
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef PL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

device_kind g_device = DEVICE_CPU;
const kernels *K = &kernels_cpu;

#ifdef PL_HAVE_CUDA
static cudaStream_t compute_stream;

const char *device_fault_hint(cudaError_t e) {
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorMisalignedAddress ||
           e == cudaErrorIllegalInstruction || e == cudaErrorAssert
               ? " (a kernel's fault: PL_CUDA_SYNC=1 names the kernel)" : "";
}
#endif

int device_gpu_count(void) {
#ifdef PL_HAVE_CUDA
    int n = 0;
    /* Without a driver this returns cudaErrorInsufficientDriver and leaves n
     * untouched, so the return code is what tells. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky error */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

int device_gpu_uuid(int gpu_index, unsigned char uuid[16]) {
#ifdef PL_HAVE_CUDA
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, gpu_index) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    memcpy(uuid, prop.uuid.bytes, 16);
    return 0;
#else
    (void)gpu_index;
    memset(uuid, 0, 16);
    return -1;
#endif
}

double device_gpu_memory_bytes(int gpu_index) {
#ifdef PL_HAVE_CUDA
    struct cudaDeviceProp prop;
    if (gpu_index < 0 || cudaGetDeviceProperties(&prop, gpu_index) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (double)prop.totalGlobalMem;
#else
    (void)gpu_index;
    return 0;
#endif
}

/* A cgroup's memory limit in bytes from its file ("max" or a huge v1 figure: none). */
static double cgroup_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char text[64] = "";
    const int got = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    if (!got || !strncmp(text, "max", 3)) return 0;
    char *end;
    const double bytes = strtod(text, &end);
    return end != text && bytes > 0 && bytes < 0x1p62 ? bytes : 0; /* v1 writes ~2^63 for none */
}

double device_host_memory_bytes(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double bytes = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    /* a container sees the host's memory in sysconf, its own limit only here (v2, then v1) */
    const char *limits[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (int i = 0; i < 2; i++) {
        const double limit = cgroup_limit(limits[i]);
        if (limit > 0 && (bytes <= 0 || limit < bytes)) bytes = limit;
    }
    return bytes;
}

void device_use(device_kind kind, int gpu_index) {
    g_device = kind;
    K = &kernels_cpu;
#ifdef PL_HAVE_CUDA
    if (kind == DEVICE_CUDA) {
        cudaError_t e = cudaSetDevice(gpu_index);
        if (e != cudaSuccess) die("cudaSetDevice(%d): %s", gpu_index, cudaGetErrorString(e));
        if (!compute_stream) { /* one per process, kept for its lifetime */
            e = cudaStreamCreateWithFlags(&compute_stream, cudaStreamNonBlocking);
            if (e != cudaSuccess) die("cudaStreamCreate: %s", cudaGetErrorString(e));
        }
        K = &kernels_cuda;
        kernels_cuda_init(); /* the kernels' fixed scratch, with the device */
    }
#else
    (void)gpu_index;
    if (kind == DEVICE_CUDA) die("this build has no CUDA support");
#endif
}

void *device_compute_stream(void) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) return compute_stream;
#endif
    return NULL;
}

void *device_stream_create(void) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        cudaStream_t s;
        cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (e != cudaSuccess) die("cudaStreamCreate: %s", cudaGetErrorString(e));
        return s;
    }
#endif
    return NULL;
}

void device_stream_wait(void *waiter, void *waitee) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA && waiter != waitee) {
        cudaEvent_t ev;
        cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(ev, (cudaStream_t)waitee);
        if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)waiter, ev, 0);
        if (e != cudaSuccess) die("device_stream_wait: %s", cudaGetErrorString(e));
        cudaEventDestroy(ev); /* released once the wait has been satisfied */
        return;
    }
#endif
    (void)waiter;
    (void)waitee;
}

void device_synchronize(void) {
#ifdef PL_HAVE_CUDA
    if (g_device == DEVICE_CUDA) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) /* a fault of some earlier kernel: PL_CUDA_SYNC=1 finds which */
            die("cudaDeviceSynchronize: %s (PL_CUDA_SYNC=1 names the failing kernel)", cudaGetErrorString(e));
    }
#endif
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void die(const char *fmt, ...) {
    int rank = -1, inited = 0;
    MPI_Initialized(&inited);
    if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* one write, so lines of other ranks cannot land inside the message */
    char head[32], fallback[1024];
    int n = snprintf(head, sizeof head, "rank %d: error: ", rank);
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *msg = k >= 0 ? malloc((size_t)n + (size_t)k + 2) : NULL; /* paths may be long */
    size_t cap = msg ? (size_t)n + (size_t)k + 2 : sizeof fallback;
    if (!msg) msg = fallback;
    memcpy(msg, head, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(msg + n, cap - (size_t)n - 1, fmt, ap);
    va_end(ap);
    strcat(msg, "\n");
    fflush(stdout); /* the step lines before the error, then the error */
    for (size_t at = 0, len = strlen(msg); at < len;) {
        ssize_t w = write(STDERR_FILENO, msg + at, len - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    /* MPI_Abort ends every rank of the job, so nobody waits for this one; but
     * mpirun may stop forwarding output the moment it hears of the abort, and
     * the line is still in the pipe to it. 150 ms lets it arrive first. */
    if (inited) {
        nanosleep(&(struct timespec){0, 150 * 1000 * 1000}, NULL);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    exit(1);
}
