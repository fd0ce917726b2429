/* cuBLAS, loaded by the first CUDA matmul, not when a lab starts.
 *
 * Linked the usual way, libcublas (and libcublasLt with it) is loaded and
 * initialised in every process of a CUDA build, CPU runs and `--help`
 * included: perf on `lab01_dp --help` put 36 % of its 0.5 s of CPU inside
 * libcublasLt and most of the rest in the page faults it causes (0.08 s
 * without it), for every rank of every run, which made a CUDA build's test
 * suite several times slower than a CPU build's. The kernels use the seven
 * functions below; each finds its twin in the library once, on first use. */
#include "device.h"
#include <cublas_v2.h>
#include <dlfcn.h>

static void *cublas_symbol(const char *name) {
    static void *library;
    if (!library) {
        /* the library CMake found, else the loader's search (LD_LIBRARY_PATH, the system's paths) */
        const char *names[] = {PL_CUBLAS_LIBRARY, PL_CUBLAS_SONAME};
        for (int i = 0; i < 2 && !library; i++) library = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (!library) die("cannot load cuBLAS (%s or %s): %s", PL_CUBLAS_LIBRARY, PL_CUBLAS_SONAME, dlerror());
    }
    void *f = dlsym(library, name);
    if (!f) die("cuBLAS (%s) has no %s: %s", PL_CUBLAS_LIBRARY, name, dlerror());
    return f;
}

/* ret name(params) { return twin args; }, the twin looked up once */
#define FORWARD(ret, name, params, args)                          \
    ret CUBLASWINAPI name params {                                \
        static ret(*twin) params;                                 \
        if (!twin) *(void **)&twin = cublas_symbol(#name);        \
        return twin args;                                         \
    }

FORWARD(cublasStatus_t, cublasCreate_v2, (cublasHandle_t *handle), (handle))
FORWARD(cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
FORWARD(const char *, cublasGetStatusString, (cublasStatus_t status), (status))
FORWARD(cublasStatus_t, cublasSgemm_v2,
        (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *alpha,
         const float *A, int lda, const float *B, int ldb, const float *beta, float *C, int ldc),
        (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
FORWARD(cublasStatus_t, cublasGemmEx,
        (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
         const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt, int ldb, const void *beta, void *C,
         cudaDataType Ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo),
        (h, ta, tb, m, n, k, alpha, A, At, lda, B, Bt, ldb, beta, C, Ct, ldc, compute, algo))
FORWARD(cublasStatus_t, cublasSgemmStridedBatched,
        (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *alpha,
         const float *A, int lda, long long sa, const float *B, int ldb, long long sb, const float *beta, float *C,
         int ldc, long long sc, int batches),
        (h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batches))
FORWARD(cublasStatus_t, cublasGemmStridedBatchedEx,
        (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
         const void *A, cudaDataType At, int lda, long long sa, const void *B, cudaDataType Bt, int ldb, long long sb,
         const void *beta, void *C, cudaDataType Ct, int ldc, long long sc, int batches, cublasComputeType_t compute,
         cublasGemmAlgo_t algo),
        (h, ta, tb, m, n, k, alpha, A, At, lda, sa, B, Bt, ldb, sb, beta, C, Ct, ldc, sc, batches, compute, algo))
