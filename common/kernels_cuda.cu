/* The CUDA twin of kernels_cpu.c: cuBLAS for the matrix products, own kernels
 * for the rest. Semantics, shapes and the accumulation rule are those of
 * kernels.h; this file only says how each is laid out on the GPU.
 *
 * Everything runs on the one stream device_compute_stream() returns, so the
 * order of kernels is the order of calls and nothing here synchronizes except
 * sum_squares (its result goes back to the host; sum_squares_add's stays on
 * the device). Scratch is allocated once, by kernels_cuda_init, never during a
 * step.
 *
 * Row-major tensors and column-major cuBLAS: a row-major matrix X[R, Cc] is,
 * read column-major, the matrix X^T[Cc, R] with leading dimension Cc. Every
 * cuBLAS call below is therefore written for the transposes; each says which
 * row-major product it computes.
 *
 * One source for both precisions (precision.h): every kernel and host function
 * on the model's values is a template over their storage type T, float or
 * __nv_bfloat16, reading through ld() and writing through st<T>(), which for
 * float are nothing at all, so the fp32 instantiations are the fp32 code.
 * bf16 computes in fp32 and rounds each output once (to nearest even); the
 * matrix products are cuBLAS's GemmEx on bf16 with fp32 compute (tensor
 * cores); the scratch of partial sums stays fp32.
 *
 * Gradient sums are deterministic (no atomics), the embedding scatter of
 * encoder_backward included: a tensor-parallel rank recomputes the replicated
 * wte gradient itself, and the ranks must get the same bits (lab05's
 * --check-sync), which atomics adding in a run-dependent order would not give. */
#include <cub/device/device_radix_sort.cuh>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The project's headers are plain C without extern "C" guards. */
extern "C" {
#include "device.h"
#include "kernels.h"
#include "mem.h"
}

/* ---- error checks: print the rank and the failing call, abort the job ----- */

static cudaStream_t stream(void) { return (cudaStream_t)device_compute_stream(); }

/* PL_CUDA_SYNC=1, for debugging: synchronise after every launch and cuBLAS call.
 * A fault inside a kernel (an illegal address, say) otherwise surfaces at the
 * next synchronising call, far from its cause; with this it is reported under
 * the name of the kernel that caused it. Slow: never for measurements. */
static bool sync_each_launch(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("PL_CUDA_SYNC");
        on = v && v[0] && strcmp(v, "0") != 0;
    }
    return on;
}

/* cudaSuccess, or the error of the work queued so far when PL_CUDA_SYNC is on */
static cudaError_t synced(cudaError_t e) {
    if (e == cudaSuccess && sync_each_launch()) e = cudaStreamSynchronize(stream());
    return e;
}

#define CUBLAS_CHECK(call)                                                        \
    do {                                                                          \
        cublasStatus_t s_ = (call);                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                          \
            die("%s: status %d (%s)", #call, (int)s_, cublasGetStatusString(s_)); \
        cudaError_t e_ = synced(cudaSuccess);                                     \
        if (e_ != cudaSuccess) die("%s: %s", #call, cudaGetErrorString(e_));      \
    } while (0)

/* A launch reports bad configurations only through cudaGetLastError; a fault
 * while it runs only at a later synchronisation (see PL_CUDA_SYNC above). */
#define LAUNCH_CHECK(name)                                                        \
    do {                                                                          \
        cudaError_t e_ = synced(cudaGetLastError());                              \
        if (e_ != cudaSuccess) die("kernel %s: %s", name, cudaGetErrorString(e_)); \
    } while (0)

/* One cuBLAS handle, made on first use and kept bound to the compute stream
 * (re-bound if the stream ever changes). Default math mode: full FP32, no TF32, so results match the
 * CPU twin to FP32 rounding. */
static cublasHandle_t cublas(void) {
    static cublasHandle_t handle;
    static cudaStream_t bound;
    static int made;
    if (!made) {
        CUBLAS_CHECK(cublasCreate(&handle));
        made = 1;
        CUBLAS_CHECK(cublasSetStream(handle, stream()));
        bound = stream();
    } else if (bound != stream()) {
        CUBLAS_CHECK(cublasSetStream(handle, stream()));
        bound = stream();
    }
    return handle;
}

/* ---- the two storage types ----------------------------------------------------- */

typedef __nv_bfloat16 bf16;
__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T st(float x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 st<bf16>(float x) { return __float2bfloat16_rn(x); }

/* C (+)= op(A) op(B), column-major as cuBLAS wants; fp32: cublasSgemm, bf16:
 * GemmEx on bf16 with fp32 compute (alpha and beta are floats either way). */
template <typename T> static cudaDataType_t cuda_type(void);
template <> cudaDataType_t cuda_type<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t cuda_type<bf16>(void) { return CUDA_R_16BF; }

template <typename T>
static cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *alpha,
                           const T *A, int lda, const T *B, int ldb, const float *beta, T *C, int ldc) {
    if (sizeof(T) == sizeof(float))
        return cublasSgemm(cublas(), ta, tb, m, n, k, alpha, (const float *)A, lda, (const float *)B, ldb, beta,
                           (float *)C, ldc);
    return cublasGemmEx(cublas(), ta, tb, m, n, k, alpha, A, cuda_type<T>(), lda, B, cuda_type<T>(), ldb, beta, C,
                        cuda_type<T>(), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

template <typename T>
static cublasStatus_t gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const float *alpha, const T *A, int lda, long long sa, const T *B, int ldb,
                                   long long sb, const float *beta, T *C, int ldc, long long sc, int batches) {
    if (sizeof(T) == sizeof(float))
        return cublasSgemmStridedBatched(cublas(), ta, tb, m, n, k, alpha, (const float *)A, lda, sa,
                                         (const float *)B, ldb, sb, beta, (float *)C, ldc, sc, batches);
    return cublasGemmStridedBatchedEx(cublas(), ta, tb, m, n, k, alpha, A, cuda_type<T>(), lda, sa, B,
                                      cuda_type<T>(), ldb, sb, beta, C, cuda_type<T>(), ldc, sc, batches,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* ---- launch shapes ---------------------------------------------------------- */

static constexpr int THREADS = 256, WARP = 32, ROWS_PER_BLOCK = THREADS / WARP;

/* Elementwise kernels loop grid-stride, so N may exceed what one launch covers;
 * the cap keeps the grid well inside its limits for any long N. */
static unsigned elementwise_blocks(long n) {
    long blocks = (n + THREADS - 1) / THREADS;
    return (unsigned)(blocks < (1L << 20) ? blocks : (1L << 20));
}

/* Warp-per-row kernels: 8 rows per block of 256 threads. */
static unsigned warp_row_blocks(long rows) {
    return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = WARP / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = WARP / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum or max over a whole block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. `shared` holds 32 floats. */
template <bool IS_MAX>
__device__ float block_reduce(float x, float *shared) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    x = IS_MAX ? warp_max(x) : warp_sum(x);
    __syncthreads(); /* `shared` may still be read from a previous call */
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < nwarps ? shared[lane] : (IS_MAX ? -INFINITY : 0.0f);
    return IS_MAX ? warp_max(x) : warp_sum(x);
}

/* ---- encoder ---------------------------------------------------------------- */

/* One thread per output element (n, c): consecutive threads read consecutive
 * channels of one embedding row, so loads are coalesced. */
template <typename T>
__global__ void encoder_forward_kernel(T *out, const int *tokens, const T *wte, const T *wpe, int Tn, int C,
                                       long NC) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < NC;
         i += (long)gridDim.x * blockDim.x) {
        long n = i / C;
        int c = (int)(i % C), t = (int)(n % Tn);
        out[i] = st<T>(ld(wte[(long)tokens[n] * C + c]) + ld(wpe[(long)t * C + c]));
    }
}

__global__ void iota_kernel(int *x, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = (int)i;
}

/* Positions sharing a token add into the same dwte row; an atomic add would
 * make the order (and so the bits) differ from run to run and from rank to
 * rank. Instead a stable radix sort of (token, position) pairs lists each
 * token's positions in increasing order, and one block per token sums them in
 * that order, starting from dwte's value: the CPU twin's order, so the two
 * agree bit for bit. O(N) per radix pass plus O(N C) adds; the earlier version
 * had every block scan all earlier tokens, O(N^2). */
static constexpr long TOKEN_SORT_POSITIONS = 1L << 16; /* batch x seq made for: 64 x 1024 */
static struct {
    long capacity;         /* positions the buffers hold */
    int *positions;        /* 0, 1, 2, ...: the values sorted along with the tokens */
    int *sorted_tokens, *sorted_positions;
    void *temp;            /* CUB's scratch */
    size_t temp_bytes;
} token_sort;

/* The sort's scratch for n positions: made by kernels_cuda_init for the labs'
 * sizes, so it grows (once) only for a larger batch x sequence. */
static void token_sort_reserve(long n) {
    size_t bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int *)nullptr, (int *)nullptr,
                                               (const int *)nullptr, (int *)nullptr, (int)n, 0,
                                               (int)(8 * sizeof(int)), stream()));
    if (n <= token_sort.capacity && bytes <= token_sort.temp_bytes) return;
    if (n < token_sort.capacity) n = token_sort.capacity;
    mem_free(token_sort.positions);
    mem_free(token_sort.sorted_tokens);
    mem_free(token_sort.sorted_positions);
    mem_free(token_sort.temp);
    token_sort.positions = (int *)mem_alloc((size_t)n * sizeof(int), MEM_WORKSPACE);
    token_sort.sorted_tokens = (int *)mem_alloc((size_t)n * sizeof(int), MEM_WORKSPACE);
    token_sort.sorted_positions = (int *)mem_alloc((size_t)n * sizeof(int), MEM_WORKSPACE);
    token_sort.temp = mem_alloc(bytes, MEM_WORKSPACE);
    token_sort.temp_bytes = bytes;
    token_sort.capacity = n;
    iota_kernel<<<elementwise_blocks(n), THREADS, 0, stream()>>>(token_sort.positions, n);
    LAUNCH_CHECK("iota");
}

/* One block per sorted index i, threads over the channels. The block where a
 * token's run of positions starts sums the run; the others return at once. */
template <typename T>
__global__ void encoder_backward_wte_kernel(T *dwte, const T *dout, const int *sorted_tokens,
                                            const int *sorted_positions, int C, int N) {
    int i = blockIdx.x, tok = sorted_tokens[i];
    if (i > 0 && sorted_tokens[i - 1] == tok) return; /* block-uniform: not the run's start */
    /* the run's end: the first index holding a larger token (the keys are sorted) */
    int lo = i + 1, hi = N;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (sorted_tokens[mid] == tok) lo = mid + 1;
        else hi = mid;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = ld(dwte[(long)tok * C + c]);
#pragma unroll 4
        for (int j = i; j < lo; j++) s += ld(dout[(long)sorted_positions[j] * C + c]);
        dwte[(long)tok * C + c] = st<T>(s);
    }
}

/* One thread per dwpe element (t, c), summing over the batch itself: every
 * element has exactly one writer, so no atomics and a fixed order. */
template <typename T>
__global__ void encoder_backward_wpe_kernel(T *dwpe, const T *dout, int B, int Tn, int C) {
    long TC = (long)Tn * C;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < TC;
         i += (long)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += ld(dout[b * TC + i]);
        dwpe[i] = st<T>(ld(dwpe[i]) + s);
    }
}

template <typename V>
static void cuda_encoder_forward(V *out, const int *tokens, const V *wte, const V *wpe, int B, int T, int C) {
    long NC = (long)B * T * C;
    if (NC <= 0) return;
    encoder_forward_kernel<<<elementwise_blocks(NC), THREADS, 0, stream()>>>(out, tokens, wte,
                                                                           wpe, T, C, NC);
    LAUNCH_CHECK("encoder_forward");
}

template <typename V>
static void cuda_encoder_backward(V *dwte, V *dwpe, const V *dout, const int *tokens, int B, int T, int C) {
    long NC = (long)B * T * C;
    if (NC <= 0) return;
    int N = B * T;
    token_sort_reserve(N);
    size_t temp_bytes = token_sort.temp_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(token_sort.temp, temp_bytes, tokens, token_sort.sorted_tokens,
                                               token_sort.positions, token_sort.sorted_positions, N, 0,
                                               (int)(8 * sizeof(int)), stream()));
    LAUNCH_CHECK("encoder_backward_sort (cub::DeviceRadixSort)");
    encoder_backward_wte_kernel<<<(unsigned)N, 128, 0, stream()>>>(dwte, dout, token_sort.sorted_tokens,
                                                                   token_sort.sorted_positions, C, N);
    LAUNCH_CHECK("encoder_backward_wte");
    encoder_backward_wpe_kernel<<<elementwise_blocks((long)T * C), THREADS, 0, stream()>>>(
        dwpe, dout, B, T, C);
    LAUNCH_CHECK("encoder_backward_wpe");
}

/* ---- layernorm -------------------------------------------------------------- */

/* One warp per row: C is a few hundred at most here, so 32 lanes striding over
 * the row read it coalesced, and the mean and variance need only warp
 * shuffles, no shared memory or block barriers. The row is read twice (mean,
 * then variance about the mean) like the CPU twin, from L1. */
template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                                         int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const T *x = inp + (long)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += WARP) s += ld(x[c]);
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float d = ld(x[c]) - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(warp_sum(v) / C + 1e-5f);
    T *o = out + (long)row * C;
    for (int c = lane; c < C; c += WARP) o[c] = st<T>((ld(x[c]) - m) * rs * ld(w[c]) + ld(b[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

/* dinp, one warp per row for the same reason as the forward: the two row means
 * the gradient needs are warp reductions. */
template <typename T>
__global__ void layernorm_backward_inp_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                              const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const T *x = inp + (long)row * C, *dy = dout + (long)row * C;
    float m = mean[row], rs = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float dnorm = ld(w[c]) * ld(dy[c]);
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * (ld(x[c]) - m) * rs;
    }
    float dnorm_mean = warp_sum(dnorm_sum) / C;
    float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
    T *dx = dinp + (long)row * C;
    for (int c = lane; c < C; c += WARP) {
        float norm = (ld(x[c]) - m) * rs;
        dx[c] = st<T>(ld(dx[c]) + (ld(w[c]) * ld(dy[c]) - dnorm_mean - norm * dnorm_norm_mean) * rs);
    }
}

/* ---- column sums: LayerNorm's dw, db and the bias gradients ------------------ */

/* A sum over N rows for each of C channels. A block of 32 x 32 threads owns 32
 * channels: threadIdx.x picks the channel (a warp reads 32 consecutive floats
 * of a row), threadIdx.y strides over rows, and the 32 partial sums per channel
 * meet in shared memory. One block for all rows of its channels would make
 * ceil(C/32) blocks, 4 for C = 128, on a GPU that runs hundreds at once, so
 * the rows are cut into chunks too (blockIdx.y): each block writes its chunk's
 * sums to the scratch, and a second kernel adds the chunks in chunk order into
 * the output. The cut depends only on (N, C), so every run, and every TP rank
 * with the same shapes, gets the same bits. With one chunk (few rows) the
 * block adds into the output itself. */
static constexpr int COLSUM_TARGET_BLOCKS = 264; /* two 1024-thread blocks on each of 132 SMs (H100/H200) */
static constexpr int COLSUM_MIN_ROWS = 128;      /* rows per chunk, at least: 4 per thread row */
static constexpr long COLSUM_SCRATCH_FLOATS = 1L << 16;
static float *colsum_partials; /* COLSUM_SCRATCH_FLOATS: kernels_cuda_init */

/* Rows per chunk for `sums` column sums of C channels over N rows. */
static int column_chunk_rows(int N, int C, int sums) {
    int column_blocks = (C + WARP - 1) / WARP;
    long chunks = (COLSUM_TARGET_BLOCKS + column_blocks - 1) / column_blocks;
    long by_rows = (N + COLSUM_MIN_ROWS - 1) / COLSUM_MIN_ROWS;
    long by_scratch = COLSUM_SCRATCH_FLOATS / ((long)sums * C);
    if (chunks > by_rows) chunks = by_rows;
    if (chunks > by_scratch) chunks = by_scratch;
    if (chunks < 1) chunks = 1;
    return (int)((N + chunks - 1) / chunks);
}

static dim3 column_grid(int N, int C, int rows_per_chunk) {
    return dim3((unsigned)((C + WARP - 1) / WARP), (unsigned)((N + rows_per_chunk - 1) / rows_per_chunk));
}

/* out[c] += sum over chunks k, in order, of partials[k * C + c] */
template <typename T>
__global__ void add_chunk_sums_kernel(T *out, const float *partials, int chunks, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < chunks; k++) s += partials[(long)k * C + c];
        out[c] = st<T>(ld(out[c]) + s);
    }
}

template <typename T>
static void add_chunk_sums(T *out, const float *partials, int chunks, int C, const char *name) {
    add_chunk_sums_kernel<<<(unsigned)((C + THREADS - 1) / THREADS), THREADS, 0, stream()>>>(out, partials,
                                                                                         chunks, C);
    LAUNCH_CHECK(name);
}

/* The sum of the 32 thread rows of a block's column, in row order (thread row 0
 * returns it; the others return garbage). */
__device__ float column_block_sum(float s, float (*shared)[WARP + 1]) {
    shared[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0)
        for (int y = 1; y < (int)blockDim.y; y++) s += shared[y][threadIdx.x];
    return s;
}

/* dw[c] += sum_n dout[n,c] xhat[n,c], db[c] += sum_n dout[n,c], over this block's
 * chunk of rows; with several chunks, into partials[chunk][c] and
 * partials[chunks + chunk][c] instead. */
template <typename T>
__global__ void layernorm_backward_params_kernel(T *dw, T *db, float *partials, const T *dout, const T *inp,
                                                 const float *mean, const float *rstd, int N, int C,
                                                 int rows_per_chunk) {
    __shared__ float sdw[WARP][WARP + 1], sdb[WARP][WARP + 1];
    int c = blockIdx.x * WARP + threadIdx.x;
    int lo = blockIdx.y * rows_per_chunk, hi = min(N, lo + rows_per_chunk);
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (int n = lo + threadIdx.y; n < hi; n += blockDim.y) {
            float dy = ld(dout[(long)n * C + c]);
            sw += dy * (ld(inp[(long)n * C + c]) - mean[n]) * rstd[n];
            sb += dy;
        }
    }
    sw = column_block_sum(sw, sdw);
    sb = column_block_sum(sb, sdb);
    if (threadIdx.y == 0 && c < C) {
        if (gridDim.y == 1) {
            dw[c] = st<T>(ld(dw[c]) + sw);
            db[c] = st<T>(ld(db[c]) + sb);
        } else {
            partials[(long)blockIdx.y * C + c] = sw;
            partials[(long)(gridDim.y + blockIdx.y) * C + c] = sb;
        }
    }
}

template <typename V>
static void cuda_layernorm_forward(V *out, float *mean, float *rstd, const V *inp, const V *w, const V *b, int N,
                                   int C) {
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<<<warp_row_blocks(N), THREADS, 0, stream()>>>(out, mean, rstd, inp,
                                                                          w, b, N, C);
    LAUNCH_CHECK("layernorm_forward");
}

template <typename V>
static void cuda_layernorm_backward(V *dinp, V *dw, V *db, const V *dout, const V *inp, const V *w,
                                    const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (dinp) { /* NULL: the weight half alone (cuda_layernorm_backward_weight) */
        layernorm_backward_inp_kernel<<<warp_row_blocks(N), THREADS, 0, stream()>>>(
            dinp, dout, inp, w, mean, rstd, N, C);
        LAUNCH_CHECK("layernorm_backward_inp");
    }
    if (!dw) return; /* NULL: the input half alone */
    int rows = column_chunk_rows(N, C, 2);
    dim3 grid = column_grid(N, C, rows);
    layernorm_backward_params_kernel<<<grid, dim3(WARP, WARP), 0, stream()>>>(
        dw, db, colsum_partials, dout, inp, mean, rstd, N, C, rows);
    LAUNCH_CHECK("layernorm_backward_params");
    if (grid.y > 1) {
        add_chunk_sums(dw, colsum_partials, (int)grid.y, C, "layernorm_backward_dw_chunks");
        add_chunk_sums(db, colsum_partials + (long)grid.y * C, (int)grid.y, C, "layernorm_backward_db_chunks");
    }
}

/* ---- matmul ----------------------------------------------------------------- */

/* out[N,OC] += bias, one thread per element: the bias row is tiny and stays in
 * cache, the output is read and written coalesced. */
template <typename T>
__global__ void add_bias_kernel(T *out, const T *bias, int OC, long NOC) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < NOC;
         i += (long)gridDim.x * blockDim.x)
        out[i] = st<T>(ld(out[i]) + ld(bias[i % OC]));
}

/* dbias[OC] += column sums of dout[N,OC] over this block's chunk of rows (or
 * into partials[chunk][oc] with several chunks): the column sums above. */
template <typename T>
__global__ void bias_backward_kernel(T *dbias, float *partials, const T *dout, int N, int OC, int rows_per_chunk) {
    __shared__ float shared[WARP][WARP + 1];
    int oc = blockIdx.x * WARP + threadIdx.x;
    int lo = blockIdx.y * rows_per_chunk, hi = min(N, lo + rows_per_chunk);
    float s = 0.0f;
    if (oc < OC)
        for (int n = lo + threadIdx.y; n < hi; n += blockDim.y) s += ld(dout[(long)n * OC + oc]);
    s = column_block_sum(s, shared);
    if (threadIdx.y == 0 && oc < OC) {
        if (gridDim.y == 1) dbias[oc] = st<T>(ld(dbias[oc]) + s);
        else partials[(long)blockIdx.y * OC + oc] = s;
    }
}

template <typename V>
static void cuda_matmul_forward(V *out, const V *inp, const V *w, const V *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (IC <= 0) { /* an empty sum; cuBLAS would reject lda = 0 */
        CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(V), stream()));
    } else {
        /* out[N,OC] = inp @ w^T:  out^T[OC,N] = (w^T[IC,OC])^T * inp^T[IC,N] */
        CUBLAS_CHECK(gemm<V>(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, w, IC, inp, IC, &zero, out, OC));
    }
    if (bias) {
        long NOC = (long)N * OC;
        add_bias_kernel<<<elementwise_blocks(NOC), THREADS, 0, stream()>>>(out, bias, OC, NOC);
        LAUNCH_CHECK("add_bias");
    }
}

template <typename V>
static void cuda_matmul_backward(V *dinp, V *dw, V *dbias, const V *dout, const V *inp, const V *w, int N, int IC,
                                 int OC) {
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f;
    if (dinp && IC > 0) /* dinp[N,IC] += dout @ w:  dinp^T[IC,N] += w^T[IC,OC] * dout^T[OC,N] */
        CUBLAS_CHECK(gemm<V>(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, w, IC, dout, OC, &one, dinp, IC));
    /* dw[OC,IC] += dout^T @ inp:  dw^T[IC,OC] += inp^T[IC,N] * (dout^T[OC,N])^T
     * (dw NULL: the input half alone, cuda_matmul_backward_input) */
    if (dw && IC > 0)
        CUBLAS_CHECK(gemm<V>(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout, OC, &one, dw, IC));
    if (dbias) {
        int rows = column_chunk_rows(N, OC, 1);
        dim3 grid = column_grid(N, OC, rows);
        bias_backward_kernel<<<grid, dim3(WARP, WARP), 0, stream()>>>(dbias, colsum_partials, dout, N, OC,
                                                                      rows);
        LAUNCH_CHECK("bias_backward");
        if (grid.y > 1) add_chunk_sums(dbias, colsum_partials, (int)grid.y, OC, "bias_backward_chunks");
    }
}

/* ---- attention -------------------------------------------------------------- */

/* In place on att[B,NH,T,T], which holds the scaled scores q.k: row t becomes
 * the softmax over its first t+1 entries, and the rest of the row zero (the
 * causal mask). One warp per row: T is at most a few hundred here, lanes stride
 * over the row, max and sum are warp shuffles. */
template <typename V>
__global__ void causal_softmax_kernel(V *att, int T, long rows) {
    long row = blockIdx.x * (long)ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = (int)(row % T);
    V *a = att + row * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += WARP) m = fmaxf(m, ld(a[j]));
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= t; j += WARP) s += expf(ld(a[j]) - m);
    float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < T; j += WARP) a[j] = st<V>(j <= t ? expf(ld(a[j]) - m) * inv : 0.0f);
}

/* In place on datt[B,NH,T,T]: the gradient through the softmax,
 * dpre[j] = att[j] (datt[j] - sum_i att[i] datt[i]), zero above the diagonal.
 * One warp per row, like the forward. */
template <typename V>
__global__ void causal_softmax_backward_kernel(V *datt, const V *att, int T, long rows) {
    long row = blockIdx.x * (long)ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = (int)(row % T);
    V *d = datt + row * T;
    const V *a = att + row * T;
    float s = 0.0f;
    for (int j = lane; j <= t; j += WARP) s += ld(a[j]) * ld(d[j]);
    s = warp_sum(s);
    for (int j = lane; j < T; j += WARP) d[j] = st<V>(j <= t ? ld(a[j]) * (ld(d[j]) - s) : 0.0f);
}

/* Products per (batch, head) run as one strided-batched cuBLAS call per head,
 * batched over B: inside a qkv row, heads sit HS apart, while batches sit
 * T*3C apart, so (b, h) has no single stride but b alone does. q, k and v of
 * head h are T x HS row-major blocks with row stride 3C (lda = 3C), read
 * column-major as HS x T blocks. att is [B,NH,T,T], so head h of batch b is at
 * (b*NH + h)*T*T and the batch stride is NH*T*T. */
typedef struct {
    int T, C3, C; /* C3 = 3C, the row stride of qkv; C the row stride of out */
    long long qkv_batch, att_batch, out_batch;
} attention_layout;

static attention_layout layout_of(int B, int T, int NH, int HS) {
    (void)B;
    attention_layout L;
    L.T = T;
    L.C = NH * HS;
    L.C3 = 3 * L.C;
    L.qkv_batch = (long long)T * L.C3;
    L.att_batch = (long long)NH * T * T;
    L.out_batch = (long long)T * L.C;
    return L;
}

template <typename V>
static void cuda_attention_forward(V *out, V *att, const V *qkv, int B, int T, int NH, int HS) {
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    attention_layout L = layout_of(B, T, NH, HS);
    const float scale = 1.0f / sqrtf((float)HS), zero = 0.0f, one = 1.0f;
    for (int h = 0; h < NH; h++) {
        const V *q = qkv + h * HS, *k = qkv + L.C + h * HS;
        V *a = att + (long)h * T * T;
        /* pre[T,T] = q k^T * scale:  pre^T = k * q^T, with k read as (k^T)^T */
        CUBLAS_CHECK(gemm_batched<V>(CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, &scale,
                                               k, L.C3, L.qkv_batch, q, L.C3, L.qkv_batch, &zero,
                                               a, T, L.att_batch, B));
    }
    long rows = (long)B * NH * T;
    causal_softmax_kernel<<<warp_row_blocks(rows), THREADS, 0, stream()>>>(att, T, rows);
    LAUNCH_CHECK("causal_softmax");
    for (int h = 0; h < NH; h++) {
        const V *v = qkv + 2 * L.C + h * HS;
        const V *a = att + (long)h * T * T;
        /* out_h[T,HS] = att @ v:  out_h^T[HS,T] = v^T[HS,T] * att^T[T,T] */
        CUBLAS_CHECK(gemm_batched<V>(CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, &one,
                                               v, L.C3, L.qkv_batch, a, T, L.att_batch, &zero,
                                               out + h * HS, L.C, L.out_batch, B));
    }
}

template <typename V>
static void cuda_attention_backward(V *dqkv, V *datt, const V *dout, const V *qkv, const V *att, int B, int T,
                                    int NH, int HS) {
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    attention_layout L = layout_of(B, T, NH, HS);
    const float scale = 1.0f / sqrtf((float)HS), zero = 0.0f, one = 1.0f;
    for (int h = 0; h < NH; h++) {
        const V *v = qkv + 2 * L.C + h * HS, *dy = dout + h * HS;
        const V *a = att + (long)h * T * T;
        V *da = datt + (long)h * T * T, *dv = dqkv + 2 * L.C + h * HS;
        /* datt[T,T] = dout_h @ v^T:  datt^T = v * dout_h^T, v read as (v^T)^T */
        CUBLAS_CHECK(gemm_batched<V>(CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, &one,
                                               v, L.C3, L.qkv_batch, dy, L.C, L.out_batch, &zero,
                                               da, T, L.att_batch, B));
        /* dv[T,HS] += att^T @ dout_h:  dv^T[HS,T] += dout_h^T[HS,T] * (att^T)^T */
        CUBLAS_CHECK(gemm_batched<V>(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, &one,
                                               dy, L.C, L.out_batch, a, T, L.att_batch, &one, dv,
                                               L.C3, L.qkv_batch, B));
    }
    long rows = (long)B * NH * T;
    causal_softmax_backward_kernel<<<warp_row_blocks(rows), THREADS, 0, stream()>>>(datt, att, T,
                                                                                   rows);
    LAUNCH_CHECK("causal_softmax_backward");
    for (int h = 0; h < NH; h++) {
        const V *q = qkv + h * HS, *k = qkv + L.C + h * HS;
        const V *dpre = datt + (long)h * T * T;
        V *dq = dqkv + h * HS, *dk = dqkv + L.C + h * HS;
        /* dq[T,HS] += dpre @ k * scale:  dq^T[HS,T] += k^T[HS,T] * dpre^T[T,T] */
        CUBLAS_CHECK(gemm_batched<V>(CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T,
                                               &scale, k, L.C3, L.qkv_batch, dpre, T, L.att_batch,
                                               &one, dq, L.C3, L.qkv_batch, B));
        /* dk[T,HS] += dpre^T @ q * scale:  dk^T[HS,T] += q^T[HS,T] * (dpre^T)^T */
        CUBLAS_CHECK(gemm_batched<V>(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T,
                                               &scale, q, L.C3, L.qkv_batch, dpre, T, L.att_batch,
                                               &one, dk, L.C3, L.qkv_batch, B));
    }
}

/* ---- attention over blocks (kernels.h: context parallelism) ---------------
 * One warp per query row (the forward and dq) or per key row (dk and dv): the
 * lanes hold the head's HS values, up to HEAD_PER_LANE each, in registers,
 * and every dot product is a warp sum. The online softmax runs key by key.
 * Plain rather than fast (no shared-memory tiles, no tensor cores: the
 * blocks of a course's sequences are short), deterministic (each output
 * element is written by one warp, no atomics), and the same arithmetic as
 * the CPU twin up to the order of the sums. The dk/dv warps recompute
 * D = rowsum(dout out) per query instead of keeping it: no scratch. */
#define HEAD_PER_LANE 8 /* head sizes up to 256 */

struct block_row { long b; int h, t; long bh; };
__device__ __forceinline__ block_row block_row_of(long row, int T, int NH) {
    block_row r;
    r.t = (int)(row % T);
    r.bh = row / T;
    r.h = (int)(r.bh % NH);
    r.b = r.bh / NH;
    return r;
}

template <typename V>
__device__ __forceinline__ void load_head(float *x, const V *p, int lane, int HS) {
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) {
        int d = lane + u * WARP;
        x[u] = d < HS ? ld(p[d]) : 0.0f;
    }
}

template <typename V>
__device__ __forceinline__ float head_dot(const float *x, const V *p, int lane, int HS) {
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) {
        int d = lane + u * WARP;
        if (d < HS) s += x[u] * ld(p[d]);
    }
    return warp_sum(s);
}

/* dot product of two head rows in memory */
template <typename V>
__device__ __forceinline__ float warp_dot(const V *a, const V *b, int lane, int HS) {
    float s = 0.0f;
    for (int d = lane; d < HS; d += WARP) s += ld(a[d]) * ld(b[d]);
    return warp_sum(s);
}

template <typename V>
__global__ void attention_block_forward_kernel(V *out, float *lse, const V *q, const V *k, const V *v, int ldq,
                                               int ldkv, const int *q_pos, const int *k_pos, int Tq, int Tk, int NH,
                                               int HS, float scale, long rows) {
    long row = blockIdx.x * (long)ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    block_row r = block_row_of(row, Tq, NH);
    float qv[HEAD_PER_LANE], acc[HEAD_PER_LANE];
    load_head(qv, q + (r.b * Tq + r.t) * (long)ldq + r.h * HS, lane, HS);
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) acc[u] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < Tk; j++) {
        if (q_pos && k_pos[j] > q_pos[r.t]) continue;
        const long kv = (r.b * Tk + j) * (long)ldkv + r.h * HS;
        float s = head_dot(qv, k + kv, lane, HS) * scale;
        float mnew = fmaxf(m, s), corr = expf(m - mnew), p = expf(s - mnew); /* expf(-inf) = 0 */
        l = l * corr + p;
#pragma unroll
        for (int u = 0; u < HEAD_PER_LANE; u++) {
            int d = lane + u * WARP;
            if (d < HS) acc[u] = acc[u] * corr + p * ld(v[kv + d]);
        }
        m = mnew;
    }
    V *o = out + (r.b * Tq + r.t) * (long)(NH * HS) + r.h * HS;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) {
        int d = lane + u * WARP;
        if (d < HS) o[d] = st<V>(acc[u] * inv);
    }
    if (lane == 0) lse[r.bh * Tq + r.t] = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* dq of one query row: sum over its visible keys of dS k, dS = P (dP - D) */
template <typename V>
__global__ void attention_block_backward_dq_kernel(V *dq, const V *dout, const V *out, const float *lse, const V *q,
                                                   const V *k, const V *v, int ldq, int ldkv, const int *q_pos,
                                                   const int *k_pos, int Tq, int Tk, int NH, int HS, float scale,
                                                   long rows) {
    long row = blockIdx.x * (long)ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    block_row r = block_row_of(row, Tq, NH);
    const float li = lse[r.bh * Tq + r.t];
    if (li == -INFINITY) return; /* the query sees no key at all (the whole warp leaves) */
    const long qo = (r.b * Tq + r.t) * (long)ldq + r.h * HS, oo = (r.b * Tq + r.t) * (long)(NH * HS) + r.h * HS;
    float qv[HEAD_PER_LANE], gv[HEAD_PER_LANE], acc[HEAD_PER_LANE];
    load_head(qv, q + qo, lane, HS);
    load_head(gv, dout + oo, lane, HS);
    const float D = head_dot(gv, out + oo, lane, HS);
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) acc[u] = 0.0f;
    for (int j = 0; j < Tk; j++) {
        if (q_pos && k_pos[j] > q_pos[r.t]) continue;
        const long kv = (r.b * Tk + j) * (long)ldkv + r.h * HS;
        float p = expf(head_dot(qv, k + kv, lane, HS) * scale - li);
        float ds = p * (head_dot(gv, v + kv, lane, HS) - D);
#pragma unroll
        for (int u = 0; u < HEAD_PER_LANE; u++) {
            int d = lane + u * WARP;
            if (d < HS) acc[u] += ds * ld(k[kv + d]);
        }
    }
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) {
        int d = lane + u * WARP;
        if (d < HS) dq[qo + d] = st<V>(ld(dq[qo + d]) + scale * acc[u]);
    }
}

/* dk and dv of one key row: over the queries that see it, dk += dS q, dv += P dout */
template <typename V>
__global__ void attention_block_backward_dkv_kernel(V *dk, V *dv, const V *dout, const V *out, const float *lse,
                                                    const V *q, const V *k, const V *v, int ldq, int ldkv,
                                                    const int *q_pos, const int *k_pos, int Tq, int Tk, int NH,
                                                    int HS, float scale, long rows) {
    long row = blockIdx.x * (long)ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    block_row r = block_row_of(row, Tk, NH); /* r.t: the key */
    const long kv = (r.b * Tk + r.t) * (long)ldkv + r.h * HS;
    float kr[HEAD_PER_LANE], vr[HEAD_PER_LANE], dka[HEAD_PER_LANE], dva[HEAD_PER_LANE];
    load_head(kr, k + kv, lane, HS);
    load_head(vr, v + kv, lane, HS);
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) dka[u] = dva[u] = 0.0f;
    for (int i = 0; i < Tq; i++) {
        if (q_pos && k_pos[r.t] > q_pos[i]) continue;
        const float li = lse[r.bh * Tq + i];
        if (li == -INFINITY) continue;
        const long qo = (r.b * Tq + i) * (long)ldq + r.h * HS, oo = (r.b * Tq + i) * (long)(NH * HS) + r.h * HS;
        float p = expf(head_dot(kr, q + qo, lane, HS) * scale - li);
        float ds = p * (head_dot(vr, dout + oo, lane, HS) - warp_dot(dout + oo, out + oo, lane, HS));
#pragma unroll
        for (int u = 0; u < HEAD_PER_LANE; u++) {
            int d = lane + u * WARP;
            if (d < HS) {
                dka[u] += ds * ld(q[qo + d]);
                dva[u] += p * ld(dout[oo + d]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < HEAD_PER_LANE; u++) {
        int d = lane + u * WARP;
        if (d < HS) {
            dk[kv + d] = st<V>(ld(dk[kv + d]) + scale * dka[u]);
            dv[kv + d] = st<V>(ld(dv[kv + d]) + dva[u]);
        }
    }
}

/* one thread per (batch row, head, position): the pair's weights, then its HS values */
template <typename V>
__global__ void attention_merge_kernel(V *out, float *lse, const V *out2, const float *lse2, int T, int NH, int HS,
                                       long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    block_row r = block_row_of(i, T, NH);
    const float a = lse[i], c = lse2[i];
    if (c == -INFINITY) return;
    float wa = 0.0f, wc = 1.0f;
    if (a == -INFINITY) {
        lse[i] = c;
    } else {
        float mx = fmaxf(a, c), ea = expf(a - mx), ec = expf(c - mx), sum = ea + ec;
        wa = ea / sum;
        wc = ec / sum;
        lse[i] = mx + logf(sum);
    }
    const long o = (r.b * T + r.t) * (long)(NH * HS) + r.h * HS;
    for (int d = 0; d < HS; d++) out[o + d] = st<V>(wa * ld(out[o + d]) + wc * ld(out2[o + d]));
}

static void check_head_size(int HS, const char *what) {
    if (HS > WARP * HEAD_PER_LANE) die("%s: head size %d above the CUDA kernel's %d", what, HS, WARP * HEAD_PER_LANE);
}

template <typename V>
static void cuda_attention_block_forward(V *out, float *lse, const V *q, const V *k, const V *v, int ldq, int ldkv,
                                         const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH, int HS) {
    if (B <= 0 || Tq <= 0 || NH <= 0 || HS <= 0) return;
    check_head_size(HS, "attention_block_forward");
    long rows = (long)B * NH * Tq;
    attention_block_forward_kernel<<<warp_row_blocks(rows), THREADS, 0, stream()>>>(
        out, lse, q, k, v, ldq, ldkv, q_pos, k_pos, Tq, Tk, NH, HS, 1.0f / sqrtf((float)HS), rows);
    LAUNCH_CHECK("attention_block_forward");
}

template <typename V>
static void cuda_attention_block_backward(V *dq, V *dk, V *dv, const V *dout, const V *out, const float *lse,
                                          const V *q, const V *k, const V *v, int ldq, int ldkv, const int *q_pos,
                                          const int *k_pos, int B, int Tq, int Tk, int NH, int HS) {
    if (B <= 0 || Tq <= 0 || Tk <= 0 || NH <= 0 || HS <= 0) return;
    check_head_size(HS, "attention_block_backward");
    const float scale = 1.0f / sqrtf((float)HS);
    long rows = (long)B * NH * Tq;
    attention_block_backward_dq_kernel<<<warp_row_blocks(rows), THREADS, 0, stream()>>>(
        dq, dout, out, lse, q, k, v, ldq, ldkv, q_pos, k_pos, Tq, Tk, NH, HS, scale, rows);
    LAUNCH_CHECK("attention_block_backward_dq");
    rows = (long)B * NH * Tk;
    attention_block_backward_dkv_kernel<<<warp_row_blocks(rows), THREADS, 0, stream()>>>(
        dk, dv, dout, out, lse, q, k, v, ldq, ldkv, q_pos, k_pos, Tq, Tk, NH, HS, scale, rows);
    LAUNCH_CHECK("attention_block_backward_dkv");
}

template <typename V>
static void cuda_attention_merge(V *out, float *lse, const V *out2, const float *lse2, int B, int T, int NH, int HS) {
    long n = (long)B * NH * T;
    if (n <= 0 || HS <= 0) return;
    attention_merge_kernel<<<(unsigned)((n + THREADS - 1) / THREADS), THREADS, 0, stream()>>>(out, lse, out2, lse2, T,
                                                                                            NH, HS, n);
    LAUNCH_CHECK("attention_merge");
}

/* ---- elementwise: one thread per element, grid-stride --------------------- */

/* GELU as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same function
 * as 0.5 x (1 + tanh(u)) without the cancellation 1 + tanh(u) suffers for large
 * negative x, and the same formula as the CPU twin. exp's argument is capped
 * at 80 so the sigmoid stays a normal float. */
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

template <typename T>
__global__ void gelu_forward_kernel(T *out, const T *inp, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x) {
        float x = ld(inp[i]);
        float u2 = fminf(-2.0f * GELU_K * (x + GELU_A * x * x * x), 80.0f);
        out[i] = st<T>(x / (1.0f + expf(u2)));
    }
}

/* d/dx [x s(2u)] = s + 2 x s (1 - s) u'(x), with s = sigmoid(2u) */
template <typename T>
__global__ void gelu_backward_kernel(T *dinp, const T *dout, const T *inp, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x) {
        float x = ld(inp[i]), x2 = x * x;
        float u2 = fminf(-2.0f * GELU_K * (x + GELU_A * x2 * x), 80.0f);
        float s = 1.0f / (1.0f + expf(u2));
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x2);
        dinp[i] = st<T>(ld(dinp[i]) + (s + 2.0f * x * s * (1.0f - s) * du) * ld(dout[i]));
    }
}

template <typename T>
__global__ void add_kernel(T *out, const T *a, const T *b, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        out[i] = st<T>(ld(a[i]) + ld(b[i]));
}

template <typename T>
__global__ void accumulate_kernel(T *dst, const T *src, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        dst[i] = st<T>(ld(dst[i]) + ld(src[i]));
}

template <typename T>
__global__ void scale_kernel(T *x, float s, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        x[i] = st<T>(ld(x[i]) * s);
}

template <typename V>
static void cuda_gelu_forward(V *out, const V *inp, long N) {
    if (N <= 0) return;
    gelu_forward_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(out, inp, N);
    LAUNCH_CHECK("gelu_forward");
}

template <typename V>
static void cuda_gelu_backward(V *dinp, const V *dout, const V *inp, long N) {
    if (N <= 0) return;
    gelu_backward_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(dinp, dout, inp, N);
    LAUNCH_CHECK("gelu_backward");
}

template <typename V>
static void cuda_add(V *out, const V *a, const V *b, long N) {
    if (N <= 0) return;
    add_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(out, a, b, N);
    LAUNCH_CHECK("add");
}

template <typename V>
static void cuda_accumulate(V *dst, const V *src, long N) {
    if (N <= 0) return;
    accumulate_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(dst, src, N);
    LAUNCH_CHECK("accumulate");
}

template <typename V>
static void cuda_scale(V *x, float s, long N) {
    if (N <= 0) return;
    scale_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(x, s, N);
    LAUNCH_CHECK("scale");
}

/* ---- cross-entropy ---------------------------------------------------------- */

/* One block of 256 threads per row: V is 256 in the labs (one logit per
 * thread), any V works because threads stride over the row. Max and sum are
 * block reductions. The loss is log(sum) - (logit - max), the same value as
 * -log(prob) but finite even where the probability underflows. */
template <typename T>
__global__ void crossentropy_forward_kernel(float *losses, T *probs, const T *logits, const int *targets, int V) {
    __shared__ float shared[WARP];
    long row = blockIdx.x;
    const T *l = logits + row * V;
    T *p = probs + row * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, ld(l[j]));
    m = block_reduce<true>(m, shared);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(ld(l[j]) - m);
    s = block_reduce<false>(s, shared);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] = st<T>(expf(ld(l[j]) - m) * inv);
    if (threadIdx.x == 0) losses[row] = logf(s) - (ld(l[targets[row]]) - m);
}

/* Elementwise over N*V: each dlogit depends only on its own prob (and whether
 * it is the target), so no row structure is needed. Overwrites dlogits. */
template <typename T>
__global__ void crossentropy_backward_kernel(T *dlogits, const T *probs, const int *targets, float dloss, int V,
                                             long NV) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < NV;
         i += (long)gridDim.x * blockDim.x) {
        long n = i / V;
        int v = (int)(i % V);
        dlogits[i] = st<T>((ld(probs[i]) - (v == targets[n] ? 1.0f : 0.0f)) * dloss);
    }
}

template <typename T>
static void cuda_crossentropy_forward(float *losses, T *probs, const T *logits, const int *targets, int N, int V) {
    if (N <= 0 || V <= 0) return;
    crossentropy_forward_kernel<<<N, THREADS, 0, stream()>>>(losses, probs, logits, targets, V);
    LAUNCH_CHECK("crossentropy_forward");
}

template <typename T>
static void cuda_crossentropy_backward(T *dlogits, const T *probs, const int *targets, float dloss, int N, int V) {
    long NV = (long)N * V;
    if (NV <= 0) return;
    crossentropy_backward_kernel<<<elementwise_blocks(NV), THREADS, 0, stream()>>>(
        dlogits, probs, targets, dloss, V, NV);
    LAUNCH_CHECK("crossentropy_backward");
}

/* ---- sum of squares --------------------------------------------------------- */

/* A fixed grid of at most SUMSQ_BLOCKS blocks, each reducing its grid-stride
 * share into one double partial; then one warp adds the partials, lane l those
 * at l, l+32, ... in order, and the lanes meet in a fixed shuffle tree. The
 * grid depends only on N, so the result is the same bit for bit on every run
 * (an atomic add of the partials would not be). Both kernels run on the
 * compute stream, so consecutive calls take turns with the one partials
 * buffer, and nothing waits for the GPU: the caller copies the sums once. */
static constexpr int SUMSQ_BLOCKS = 1024;
static double *sumsq_partials; /* SUMSQ_BLOCKS doubles: kernels_cuda_init */
static double *sumsq_result;   /* one double, for sum_squares' answer */

template <typename T>
__global__ void sum_squares_kernel(double *partials, const T *x, long N) {
    __shared__ double shared[THREADS];
    double s = 0.0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        s += (double)ld(x[i]) * (double)ld(x[i]);
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

/* One warp: acc[0] += the sum of partials[0..n). */
__global__ void add_partials_kernel(double *acc, const double *partials, int n) {
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += WARP) s += partials[i];
    for (int o = WARP / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) acc[0] += s;
}

template <typename V>
static void cuda_sum_squares_add(double *acc, const V *x, long N) {
    if (N <= 0) return;
    long want = (N + THREADS - 1) / THREADS;
    int blocks = (int)(want < SUMSQ_BLOCKS ? want : SUMSQ_BLOCKS);
    sum_squares_kernel<<<blocks, THREADS, 0, stream()>>>(sumsq_partials, x, N);
    LAUNCH_CHECK("sum_squares");
    add_partials_kernel<<<1, WARP, 0, stream()>>>(acc, sumsq_partials, blocks);
    LAUNCH_CHECK("sum_squares_add");
}

/* The same sum, returned to the host: one copy, which waits for the stream. */
template <typename V>
static double cuda_sum_squares(const V *x, long N) {
    if (N <= 0) return 0.0;
    CUDA_CHECK(cudaMemsetAsync(sumsq_result, 0, sizeof(double), stream()));
    cuda_sum_squares_add(sumsq_result, x, N);
    double host;
    CUDA_CHECK(cudaMemcpyAsync(&host, sumsq_result, sizeof(double), cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    return host;
}

/* ---- AdamW ------------------------------------------------------------------ */

/* One thread per parameter; the bias corrections are the same for all, so the
 * host computes them once (as their inverses, like the CPU twin). */
template <typename T>
__global__ void adamw_kernel(float *p, const T *g, float *m, float *v, long N, float lr, float beta1, float beta2,
                             float eps, float wd, float ibc1, float ibc2, float grad_scale) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x) {
        float gi = ld(g[i]) * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * ((mi * ibc1) / (sqrtf(vi * ibc2) + eps) + wd * p[i]);
    }
}

template <typename V>
static void cuda_adamw(float *p, const V *g, float *m, float *v, long N, float lr, float beta1, float beta2,
                       float eps, float wd, int t, float grad_scale) {
    if (N <= 0) return;
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    adamw_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(
        p, g, m, v, N, lr, beta1, beta2, eps, wd, 1.0f / bc1, 1.0f / bc2, grad_scale);
    LAUNCH_CHECK("adamw");
}

/* ---- the backward in two halves (kernels.h): the fused kernels with one half off */

template <typename V>
static void cuda_matmul_backward_input(V *dinp, const V *dout, const V *w, int N, int IC, int OC) {
    cuda_matmul_backward<V>(dinp, NULL, NULL, dout, NULL, w, N, IC, OC);
}

template <typename V>
static void cuda_matmul_backward_weight(V *dw, V *dbias, const V *dout, const V *inp, int N, int IC, int OC) {
    cuda_matmul_backward<V>(NULL, dw, dbias, dout, inp, NULL, N, IC, OC);
}

template <typename V>
static void cuda_layernorm_backward_input(V *dinp, const V *dout, const V *inp, const V *w, const float *mean,
                                          const float *rstd, int N, int C) {
    cuda_layernorm_backward<V>(dinp, NULL, NULL, dout, inp, w, mean, rstd, N, C);
}

template <typename V>
static void cuda_layernorm_backward_weight(V *dw, V *db, const V *dout, const V *inp, const float *mean,
                                           const float *rstd, int N, int C) {
    cuda_layernorm_backward<V>(NULL, dw, db, dout, inp, NULL, mean, rstd, N, C);
}

/* ---- bf16 only: the rounding of the master weights, and back ------------------ */

__global__ void to_bf16_kernel(bf16 *dst, const float *src, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N; i += (long)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void to_float_kernel(float *dst, const bf16 *src, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N; i += (long)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

static void cuda_to_bf16(void *dst, const float *src, long N) {
    if (N <= 0) return;
    to_bf16_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>((bf16 *)dst, src, N);
    LAUNCH_CHECK("to_bf16");
}

static void cuda_to_float(float *dst, const void *src, long N) {
    if (N <= 0) return;
    to_float_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(dst, (const bf16 *)src, N);
    LAUNCH_CHECK("to_float");
}

/* ---- the table -------------------------------------------------------------- */

/* Designated initializers: standard C++20, and accepted by nvcc and gcc in
 * C++17 mode as well (only -Wpedantic would remark on them). They must follow
 * the order of struct kernels, which the compiler checks. */
extern "C" const kernels kernels_cuda = {
    .name = "cuda",
    .encoder_forward = cuda_encoder_forward<float>,
    .encoder_backward = cuda_encoder_backward<float>,
    .layernorm_forward = cuda_layernorm_forward<float>,
    .layernorm_backward = cuda_layernorm_backward<float>,
    .matmul_forward = cuda_matmul_forward<float>,
    .matmul_backward = cuda_matmul_backward<float>,
    .attention_forward = cuda_attention_forward<float>,
    .attention_backward = cuda_attention_backward<float>,
    .gelu_forward = cuda_gelu_forward<float>,
    .gelu_backward = cuda_gelu_backward<float>,
    .add = cuda_add<float>,
    .accumulate = cuda_accumulate<float>,
    .scale = cuda_scale<float>,
    .crossentropy_forward = cuda_crossentropy_forward<float>,
    .crossentropy_backward = cuda_crossentropy_backward<float>,
    .sum_squares = cuda_sum_squares<float>,
    .adamw = cuda_adamw<float>,
    .sum_squares_add = cuda_sum_squares_add<float>,
    .matmul_backward_input = cuda_matmul_backward_input<float>,
    .matmul_backward_weight = cuda_matmul_backward_weight<float>,
    .layernorm_backward_input = cuda_layernorm_backward_input<float>,
    .layernorm_backward_weight = cuda_layernorm_backward_weight<float>,
    .attention_block_forward = cuda_attention_block_forward<float>,
    .attention_block_backward = cuda_attention_block_backward<float>,
    .attention_merge = cuda_attention_merge<float>,
};

/* The bf16 table (kernels.h, value_kernels): the same templates on __nv_bfloat16,
 * behind the table's void pointers. */
#define VB(p) ((bf16 *)(p))
#define CVB(p) ((const bf16 *)(p))
static void b_encoder_forward(void *out, const int *tokens, const void *wte, const void *wpe, int B, int T, int C) {
    cuda_encoder_forward<bf16>(VB(out), tokens, CVB(wte), CVB(wpe), B, T, C);
}
static void b_encoder_backward(void *dwte, void *dwpe, const void *dout, const int *tokens, int B, int T, int C) {
    cuda_encoder_backward<bf16>(VB(dwte), VB(dwpe), CVB(dout), tokens, B, T, C);
}
static void b_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w, const void *b,
                                int N, int C) {
    cuda_layernorm_forward<bf16>(VB(out), mean, rstd, CVB(inp), CVB(w), CVB(b), N, C);
}
static void b_layernorm_backward(void *dinp, void *dw, void *db, const void *dout, const void *inp, const void *w,
                                 const float *mean, const float *rstd, int N, int C) {
    cuda_layernorm_backward<bf16>(VB(dinp), VB(dw), VB(db), CVB(dout), CVB(inp), CVB(w), mean, rstd, N, C);
}
static void b_matmul_forward(void *out, const void *inp, const void *w, const void *bias, int N, int IC, int OC) {
    cuda_matmul_forward<bf16>(VB(out), CVB(inp), CVB(w), CVB(bias), N, IC, OC);
}
static void b_matmul_backward(void *dinp, void *dw, void *dbias, const void *dout, const void *inp, const void *w,
                              int N, int IC, int OC) {
    cuda_matmul_backward<bf16>(VB(dinp), VB(dw), VB(dbias), CVB(dout), CVB(inp), CVB(w), N, IC, OC);
}
static void b_attention_forward(void *out, void *att, const void *qkv, int B, int T, int NH, int HS) {
    cuda_attention_forward<bf16>(VB(out), VB(att), CVB(qkv), B, T, NH, HS);
}
static void b_attention_backward(void *dqkv, void *datt, const void *dout, const void *qkv, const void *att, int B,
                                 int T, int NH, int HS) {
    cuda_attention_backward<bf16>(VB(dqkv), VB(datt), CVB(dout), CVB(qkv), CVB(att), B, T, NH, HS);
}
static void b_gelu_forward(void *out, const void *inp, long N) { cuda_gelu_forward<bf16>(VB(out), CVB(inp), N); }
static void b_gelu_backward(void *dinp, const void *dout, const void *inp, long N) {
    cuda_gelu_backward<bf16>(VB(dinp), CVB(dout), CVB(inp), N);
}
static void b_add(void *out, const void *a, const void *b, long N) { cuda_add<bf16>(VB(out), CVB(a), CVB(b), N); }
static void b_accumulate(void *dst, const void *src, long N) { cuda_accumulate<bf16>(VB(dst), CVB(src), N); }
static void b_scale(void *x, float s, long N) { cuda_scale<bf16>(VB(x), s, N); }
static void b_crossentropy_forward(float *losses, void *probs, const void *logits, const int *targets, int N, int V) {
    cuda_crossentropy_forward<bf16>(losses, VB(probs), CVB(logits), targets, N, V);
}
static void b_crossentropy_backward(void *dlogits, const void *probs, const int *targets, float dloss, int N, int V) {
    cuda_crossentropy_backward<bf16>(VB(dlogits), CVB(probs), targets, dloss, N, V);
}
static double b_sum_squares(const void *x, long N) { return cuda_sum_squares<bf16>(CVB(x), N); }
static void b_sum_squares_add(double *acc, const void *x, long N) { cuda_sum_squares_add<bf16>(acc, CVB(x), N); }
static void b_adamw(float *p, const void *g, float *m, float *v, long N, float lr, float beta1, float beta2,
                    float eps, float wd, int t, float grad_scale) {
    cuda_adamw<bf16>(p, CVB(g), m, v, N, lr, beta1, beta2, eps, wd, t, grad_scale);
}
static void b_matmul_backward_input(void *dinp, const void *dout, const void *w, int N, int IC, int OC) {
    cuda_matmul_backward_input<bf16>(VB(dinp), CVB(dout), CVB(w), N, IC, OC);
}
static void b_matmul_backward_weight(void *dw, void *dbias, const void *dout, const void *inp, int N, int IC, int OC) {
    cuda_matmul_backward_weight<bf16>(VB(dw), VB(dbias), CVB(dout), CVB(inp), N, IC, OC);
}
static void b_layernorm_backward_input(void *dinp, const void *dout, const void *inp, const void *w,
                                       const float *mean, const float *rstd, int N, int C) {
    cuda_layernorm_backward_input<bf16>(VB(dinp), CVB(dout), CVB(inp), CVB(w), mean, rstd, N, C);
}
static void b_layernorm_backward_weight(void *dw, void *db, const void *dout, const void *inp, const float *mean,
                                        const float *rstd, int N, int C) {
    cuda_layernorm_backward_weight<bf16>(VB(dw), VB(db), CVB(dout), CVB(inp), mean, rstd, N, C);
}

static void b_attention_block_forward(void *out, float *lse, const void *q, const void *k, const void *v, int ldq,
                                      int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                      int HS) {
    cuda_attention_block_forward<bf16>(VB(out), lse, CVB(q), CVB(k), CVB(v), ldq, ldkv, q_pos, k_pos, B, Tq, Tk, NH, HS);
}
static void b_attention_block_backward(void *dq, void *dk, void *dv, const void *dout, const void *out,
                                       const float *lse, const void *q, const void *k, const void *v, int ldq,
                                       int ldkv, const int *q_pos, const int *k_pos, int B, int Tq, int Tk, int NH,
                                       int HS) {
    cuda_attention_block_backward<bf16>(VB(dq), VB(dk), VB(dv), CVB(dout), CVB(out), lse, CVB(q), CVB(k), CVB(v), ldq,
                                        ldkv, q_pos, k_pos, B, Tq, Tk, NH, HS);
}
static void b_attention_merge(void *out, float *lse, const void *out2, const float *lse2, int B, int T, int NH,
                              int HS) {
    cuda_attention_merge<bf16>(VB(out), lse, CVB(out2), lse2, B, T, NH, HS);
}

extern "C" const value_kernels kernels_bf16_cuda = {
    .name = "bf16 cuda",
    .encoder_forward = b_encoder_forward,
    .encoder_backward = b_encoder_backward,
    .layernorm_forward = b_layernorm_forward,
    .layernorm_backward = b_layernorm_backward,
    .matmul_forward = b_matmul_forward,
    .matmul_backward = b_matmul_backward,
    .attention_forward = b_attention_forward,
    .attention_backward = b_attention_backward,
    .gelu_forward = b_gelu_forward,
    .gelu_backward = b_gelu_backward,
    .add = b_add,
    .accumulate = b_accumulate,
    .scale = b_scale,
    .crossentropy_forward = b_crossentropy_forward,
    .crossentropy_backward = b_crossentropy_backward,
    .sum_squares = b_sum_squares,
    .sum_squares_add = b_sum_squares_add,
    .adamw = b_adamw,
    .matmul_backward_input = b_matmul_backward_input,
    .matmul_backward_weight = b_matmul_backward_weight,
    .layernorm_backward_input = b_layernorm_backward_input,
    .layernorm_backward_weight = b_layernorm_backward_weight,
    .attention_block_forward = b_attention_block_forward,
    .attention_block_backward = b_attention_block_backward,
    .attention_merge = b_attention_merge,
    .to_values = cuda_to_bf16,
    .to_floats = cuda_to_float,
};

/* ---- fixed scratch ------------------------------------------------------------ */

extern "C" void kernels_cuda_init(void) {
    if (sumsq_partials) return; /* once per process: one GPU per rank */
    sumsq_partials = (double *)mem_alloc(SUMSQ_BLOCKS * sizeof(double), MEM_WORKSPACE);
    sumsq_result = (double *)mem_alloc(sizeof(double), MEM_WORKSPACE);
    colsum_partials = (float *)mem_alloc(COLSUM_SCRATCH_FLOATS * sizeof(float), MEM_WORKSPACE);
    token_sort_reserve(TOKEN_SORT_POSITIONS);
}
