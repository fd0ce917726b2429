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
 * Gradient sums are deterministic (no atomics), the embedding scatter of
 * encoder_backward included: a tensor-parallel rank recomputes the replicated
 * wte gradient itself, and the ranks must get the same bits (lab05's
 * --check-sync), which atomics adding in a run-dependent order would not give. */
#include <cub/device/device_radix_sort.cuh>
#include <cublas_v2.h>
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

#define CUDA_CHECK(call)                                                          \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) die("%s: %s", #call, cudaGetErrorString(e_));      \
    } while (0)

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
__global__ void encoder_forward_kernel(float *out, const int *tokens, const float *wte,
                                       const float *wpe, int T, int C, long NC) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < NC;
         i += (long)gridDim.x * blockDim.x) {
        long n = i / C;
        int c = (int)(i % C), t = (int)(n % T);
        out[i] = wte[(long)tokens[n] * C + c] + wpe[(long)t * C + c];
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
__global__ void encoder_backward_wte_kernel(float *dwte, const float *dout, const int *sorted_tokens,
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
        float s = dwte[(long)tok * C + c];
#pragma unroll 4
        for (int j = i; j < lo; j++) s += dout[(long)sorted_positions[j] * C + c];
        dwte[(long)tok * C + c] = s;
    }
}

/* One thread per dwpe element (t, c), summing over the batch itself: every
 * element has exactly one writer, so no atomics and a fixed order. */
__global__ void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C) {
    long TC = (long)T * C;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < TC;
         i += (long)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dout[b * TC + i];
        dwpe[i] += s;
    }
}

static void cuda_encoder_forward(float *out, const int *tokens, const float *wte,
                                 const float *wpe, int B, int T, int C) {
    long NC = (long)B * T * C;
    if (NC <= 0) return;
    encoder_forward_kernel<<<elementwise_blocks(NC), THREADS, 0, stream()>>>(out, tokens, wte,
                                                                           wpe, T, C, NC);
    LAUNCH_CHECK("encoder_forward");
}

static void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                  const int *tokens, int B, int T, int C) {
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
__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const float *x = inp + (long)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += WARP) s += x[c];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float d = x[c] - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(warp_sum(v) / C + 1e-5f);
    float *o = out + (long)row * C;
    for (int c = lane; c < C; c += WARP) o[c] = (x[c] - m) * rs * w[c] + b[c];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

/* dinp, one warp per row for the same reason as the forward: the two row means
 * the gradient needs are warp reductions. */
__global__ void layernorm_backward_inp_kernel(float *dinp, const float *dout, const float *inp,
                                              const float *w, const float *mean,
                                              const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const float *x = inp + (long)row * C, *dy = dout + (long)row * C;
    float m = mean[row], rs = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float dnorm = w[c] * dy[c];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * (x[c] - m) * rs;
    }
    float dnorm_mean = warp_sum(dnorm_sum) / C;
    float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
    float *dx = dinp + (long)row * C;
    for (int c = lane; c < C; c += WARP) {
        float norm = (x[c] - m) * rs;
        dx[c] += (w[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * rs;
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
__global__ void add_chunk_sums_kernel(float *out, const float *partials, int chunks, int C) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < chunks; k++) s += partials[(long)k * C + c];
        out[c] += s;
    }
}

static void add_chunk_sums(float *out, const float *partials, int chunks, int C, const char *name) {
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
__global__ void layernorm_backward_params_kernel(float *dw, float *db, float *partials, const float *dout,
                                                 const float *inp, const float *mean,
                                                 const float *rstd, int N, int C, int rows_per_chunk) {
    __shared__ float sdw[WARP][WARP + 1], sdb[WARP][WARP + 1];
    int c = blockIdx.x * WARP + threadIdx.x;
    int lo = blockIdx.y * rows_per_chunk, hi = min(N, lo + rows_per_chunk);
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (int n = lo + threadIdx.y; n < hi; n += blockDim.y) {
            float dy = dout[(long)n * C + c];
            sw += dy * (inp[(long)n * C + c] - mean[n]) * rstd[n];
            sb += dy;
        }
    }
    sw = column_block_sum(sw, sdw);
    sb = column_block_sum(sb, sdb);
    if (threadIdx.y == 0 && c < C) {
        if (gridDim.y == 1) {
            dw[c] += sw;
            db[c] += sb;
        } else {
            partials[(long)blockIdx.y * C + c] = sw;
            partials[(long)(gridDim.y + blockIdx.y) * C + c] = sb;
        }
    }
}

static void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *w, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<<<warp_row_blocks(N), THREADS, 0, stream()>>>(out, mean, rstd, inp,
                                                                          w, b, N, C);
    LAUNCH_CHECK("layernorm_forward");
}

static void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                    const float *inp, const float *w, const float *mean,
                                    const float *rstd, int N, int C) {
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
__global__ void add_bias_kernel(float *out, const float *bias, int OC, long NOC) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < NOC;
         i += (long)gridDim.x * blockDim.x)
        out[i] += bias[i % OC];
}

/* dbias[OC] += column sums of dout[N,OC] over this block's chunk of rows (or
 * into partials[chunk][oc] with several chunks): the column sums above. */
__global__ void bias_backward_kernel(float *dbias, float *partials, const float *dout, int N, int OC,
                                     int rows_per_chunk) {
    __shared__ float shared[WARP][WARP + 1];
    int oc = blockIdx.x * WARP + threadIdx.x;
    int lo = blockIdx.y * rows_per_chunk, hi = min(N, lo + rows_per_chunk);
    float s = 0.0f;
    if (oc < OC)
        for (int n = lo + threadIdx.y; n < hi; n += blockDim.y) s += dout[(long)n * OC + oc];
    s = column_block_sum(s, shared);
    if (threadIdx.y == 0 && oc < OC) {
        if (gridDim.y == 1) dbias[oc] += s;
        else partials[(long)blockIdx.y * OC + oc] = s;
    }
}

static void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                                int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (IC <= 0) { /* an empty sum; cuBLAS would reject lda = 0 */
        CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(float), stream()));
    } else {
        /* out[N,OC] = inp @ w^T:  out^T[OC,N] = (w^T[IC,OC])^T * inp^T[IC,N] */
        CUBLAS_CHECK(cublasSgemm(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, w, IC, inp, IC,
                                 &zero, out, OC));
    }
    if (bias) {
        long NOC = (long)N * OC;
        add_bias_kernel<<<elementwise_blocks(NOC), THREADS, 0, stream()>>>(out, bias, OC, NOC);
        LAUNCH_CHECK("add_bias");
    }
}

static void cuda_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                 const float *inp, const float *w, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    const float one = 1.0f;
    if (dinp && IC > 0) /* dinp[N,IC] += dout @ w:  dinp^T[IC,N] += w^T[IC,OC] * dout^T[OC,N] */
        CUBLAS_CHECK(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, w, IC, dout,
                                 OC, &one, dinp, IC));
    /* dw[OC,IC] += dout^T @ inp:  dw^T[IC,OC] += inp^T[IC,N] * (dout^T[OC,N])^T
     * (dw NULL: the input half alone, cuda_matmul_backward_input) */
    if (dw && IC > 0)
        CUBLAS_CHECK(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout,
                                 OC, &one, dw, IC));
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
__global__ void causal_softmax_kernel(float *att, int T, long rows) {
    long row = blockIdx.x * (long)ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = (int)(row % T);
    float *a = att + row * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += WARP) m = fmaxf(m, a[j]);
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= t; j += WARP) s += expf(a[j] - m);
    float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < T; j += WARP) a[j] = j <= t ? expf(a[j] - m) * inv : 0.0f;
}

/* In place on datt[B,NH,T,T]: the gradient through the softmax,
 * dpre[j] = att[j] (datt[j] - sum_i att[i] datt[i]), zero above the diagonal.
 * One warp per row, like the forward. */
__global__ void causal_softmax_backward_kernel(float *datt, const float *att, int T, long rows) {
    long row = blockIdx.x * (long)ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = (int)(row % T);
    float *d = datt + row * T;
    const float *a = att + row * T;
    float s = 0.0f;
    for (int j = lane; j <= t; j += WARP) s += a[j] * d[j];
    s = warp_sum(s);
    for (int j = lane; j < T; j += WARP) d[j] = j <= t ? a[j] * (d[j] - s) : 0.0f;
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

static void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                                   int HS) {
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    attention_layout L = layout_of(B, T, NH, HS);
    const float scale = 1.0f / sqrtf((float)HS), zero = 0.0f, one = 1.0f;
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + h * HS, *k = qkv + L.C + h * HS;
        float *a = att + (long)h * T * T;
        /* pre[T,T] = q k^T * scale:  pre^T = k * q^T, with k read as (k^T)^T */
        CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, &scale,
                                               k, L.C3, L.qkv_batch, q, L.C3, L.qkv_batch, &zero,
                                               a, T, L.att_batch, B));
    }
    long rows = (long)B * NH * T;
    causal_softmax_kernel<<<warp_row_blocks(rows), THREADS, 0, stream()>>>(att, T, rows);
    LAUNCH_CHECK("causal_softmax");
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + 2 * L.C + h * HS;
        const float *a = att + (long)h * T * T;
        /* out_h[T,HS] = att @ v:  out_h^T[HS,T] = v^T[HS,T] * att^T[T,T] */
        CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, &one,
                                               v, L.C3, L.qkv_batch, a, T, L.att_batch, &zero,
                                               out + h * HS, L.C, L.out_batch, B));
    }
}

static void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                                    const float *att, int B, int T, int NH, int HS) {
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    attention_layout L = layout_of(B, T, NH, HS);
    const float scale = 1.0f / sqrtf((float)HS), zero = 0.0f, one = 1.0f;
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + 2 * L.C + h * HS, *dy = dout + h * HS;
        const float *a = att + (long)h * T * T;
        float *da = datt + (long)h * T * T, *dv = dqkv + 2 * L.C + h * HS;
        /* datt[T,T] = dout_h @ v^T:  datt^T = v * dout_h^T, v read as (v^T)^T */
        CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, &one,
                                               v, L.C3, L.qkv_batch, dy, L.C, L.out_batch, &zero,
                                               da, T, L.att_batch, B));
        /* dv[T,HS] += att^T @ dout_h:  dv^T[HS,T] += dout_h^T[HS,T] * (att^T)^T */
        CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, &one,
                                               dy, L.C, L.out_batch, a, T, L.att_batch, &one, dv,
                                               L.C3, L.qkv_batch, B));
    }
    long rows = (long)B * NH * T;
    causal_softmax_backward_kernel<<<warp_row_blocks(rows), THREADS, 0, stream()>>>(datt, att, T,
                                                                                   rows);
    LAUNCH_CHECK("causal_softmax_backward");
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + h * HS, *k = qkv + L.C + h * HS;
        const float *dpre = datt + (long)h * T * T;
        float *dq = dqkv + h * HS, *dk = dqkv + L.C + h * HS;
        /* dq[T,HS] += dpre @ k * scale:  dq^T[HS,T] += k^T[HS,T] * dpre^T[T,T] */
        CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T,
                                               &scale, k, L.C3, L.qkv_batch, dpre, T, L.att_batch,
                                               &one, dq, L.C3, L.qkv_batch, B));
        /* dk[T,HS] += dpre^T @ q * scale:  dk^T[HS,T] += q^T[HS,T] * (dpre^T)^T */
        CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T,
                                               &scale, q, L.C3, L.qkv_batch, dpre, T, L.att_batch,
                                               &one, dk, L.C3, L.qkv_batch, B));
    }
}

/* ---- elementwise: one thread per element, grid-stride --------------------- */

/* GELU as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same function
 * as 0.5 x (1 + tanh(u)) without the cancellation 1 + tanh(u) suffers for large
 * negative x, and the same formula as the CPU twin. exp's argument is capped
 * at 80 so the sigmoid stays a normal float. */
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

__global__ void gelu_forward_kernel(float *out, const float *inp, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x) {
        float x = inp[i];
        float u2 = fminf(-2.0f * GELU_K * (x + GELU_A * x * x * x), 80.0f);
        out[i] = x / (1.0f + expf(u2));
    }
}

/* d/dx [x s(2u)] = s + 2 x s (1 - s) u'(x), with s = sigmoid(2u) */
__global__ void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x) {
        float x = inp[i], x2 = x * x;
        float u2 = fminf(-2.0f * GELU_K * (x + GELU_A * x2 * x), 80.0f);
        float s = 1.0f / (1.0f + expf(u2));
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x2);
        dinp[i] += (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

__global__ void add_kernel(float *out, const float *a, const float *b, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float *dst, const float *src, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

__global__ void scale_kernel(float *x, float s, long N) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        x[i] *= s;
}

static void cuda_gelu_forward(float *out, const float *inp, long N) {
    if (N <= 0) return;
    gelu_forward_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(out, inp, N);
    LAUNCH_CHECK("gelu_forward");
}

static void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, long N) {
    if (N <= 0) return;
    gelu_backward_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(dinp, dout, inp, N);
    LAUNCH_CHECK("gelu_backward");
}

static void cuda_add(float *out, const float *a, const float *b, long N) {
    if (N <= 0) return;
    add_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(out, a, b, N);
    LAUNCH_CHECK("add");
}

static void cuda_accumulate(float *dst, const float *src, long N) {
    if (N <= 0) return;
    accumulate_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(dst, src, N);
    LAUNCH_CHECK("accumulate");
}

static void cuda_scale(float *x, float s, long N) {
    if (N <= 0) return;
    scale_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(x, s, N);
    LAUNCH_CHECK("scale");
}

/* ---- cross-entropy ---------------------------------------------------------- */

/* One block of 256 threads per row: V is 256 in the labs (one logit per
 * thread), any V works because threads stride over the row. Max and sum are
 * block reductions. The loss is log(sum) - (logit - max), the same value as
 * -log(prob) but finite even where the probability underflows. */
__global__ void crossentropy_forward_kernel(float *losses, float *probs, const float *logits,
                                            const int *targets, int V) {
    __shared__ float shared[WARP];
    long row = blockIdx.x;
    const float *l = logits + row * V;
    float *p = probs + row * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, l[j]);
    m = block_reduce<true>(m, shared);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(l[j] - m);
    s = block_reduce<false>(s, shared);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] = expf(l[j] - m) * inv;
    if (threadIdx.x == 0) losses[row] = logf(s) - (l[targets[row]] - m);
}

/* Elementwise over N*V: each dlogit depends only on its own prob (and whether
 * it is the target), so no row structure is needed. Overwrites dlogits. */
__global__ void crossentropy_backward_kernel(float *dlogits, const float *probs,
                                             const int *targets, float dloss, int V, long NV) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < NV;
         i += (long)gridDim.x * blockDim.x) {
        long n = i / V;
        int v = (int)(i % V);
        dlogits[i] = (probs[i] - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
    }
}

static void cuda_crossentropy_forward(float *losses, float *probs, const float *logits,
                                      const int *targets, int N, int V) {
    if (N <= 0 || V <= 0) return;
    crossentropy_forward_kernel<<<N, THREADS, 0, stream()>>>(losses, probs, logits, targets, V);
    LAUNCH_CHECK("crossentropy_forward");
}

static void cuda_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                       float dloss, int N, int V) {
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

__global__ void sum_squares_kernel(double *partials, const float *x, long N) {
    __shared__ double shared[THREADS];
    double s = 0.0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
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

static void cuda_sum_squares_add(double *acc, const float *x, long N) {
    if (N <= 0) return;
    long want = (N + THREADS - 1) / THREADS;
    int blocks = (int)(want < SUMSQ_BLOCKS ? want : SUMSQ_BLOCKS);
    sum_squares_kernel<<<blocks, THREADS, 0, stream()>>>(sumsq_partials, x, N);
    LAUNCH_CHECK("sum_squares");
    add_partials_kernel<<<1, WARP, 0, stream()>>>(acc, sumsq_partials, blocks);
    LAUNCH_CHECK("sum_squares_add");
}

/* The same sum, returned to the host: one copy, which waits for the stream. */
static double cuda_sum_squares(const float *x, long N) {
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
__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, long N, float lr,
                             float beta1, float beta2, float eps, float wd, float ibc1,
                             float ibc2, float grad_scale) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < N;
         i += (long)gridDim.x * blockDim.x) {
        float gi = g[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * ((mi * ibc1) / (sqrtf(vi * ibc2) + eps) + wd * p[i]);
    }
}

static void cuda_adamw(float *p, const float *g, float *m, float *v, long N, float lr,
                       float beta1, float beta2, float eps, float wd, int t, float grad_scale) {
    if (N <= 0) return;
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    adamw_kernel<<<elementwise_blocks(N), THREADS, 0, stream()>>>(
        p, g, m, v, N, lr, beta1, beta2, eps, wd, 1.0f / bc1, 1.0f / bc2, grad_scale);
    LAUNCH_CHECK("adamw");
}

/* ---- the backward in two halves (kernels.h): the fused kernels with one half off */

static void cuda_matmul_backward_input(float *dinp, const float *dout, const float *w, int N,
                                       int IC, int OC) {
    cuda_matmul_backward(dinp, NULL, NULL, dout, NULL, w, N, IC, OC);
}

static void cuda_matmul_backward_weight(float *dw, float *dbias, const float *dout,
                                        const float *inp, int N, int IC, int OC) {
    cuda_matmul_backward(NULL, dw, dbias, dout, inp, NULL, N, IC, OC);
}

static void cuda_layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                          const float *w, const float *mean, const float *rstd,
                                          int N, int C) {
    cuda_layernorm_backward(dinp, NULL, NULL, dout, inp, w, mean, rstd, N, C);
}

static void cuda_layernorm_backward_weight(float *dw, float *db, const float *dout,
                                           const float *inp, const float *mean,
                                           const float *rstd, int N, int C) {
    cuda_layernorm_backward(NULL, dw, db, dout, inp, NULL, mean, rstd, N, C);
}

/* ---- the table -------------------------------------------------------------- */

/* Designated initializers: standard C++20, and accepted by nvcc and gcc in
 * C++17 mode as well (only -Wpedantic would remark on them). They must follow
 * the order of struct kernels, which the compiler checks. */
extern "C" const kernels kernels_cuda = {
    .name = "cuda",
    .encoder_forward = cuda_encoder_forward,
    .encoder_backward = cuda_encoder_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .add = cuda_add,
    .accumulate = cuda_accumulate,
    .scale = cuda_scale,
    .crossentropy_forward = cuda_crossentropy_forward,
    .crossentropy_backward = cuda_crossentropy_backward,
    .sum_squares = cuda_sum_squares,
    .adamw = cuda_adamw,
    .sum_squares_add = cuda_sum_squares_add,
    .matmul_backward_input = cuda_matmul_backward_input,
    .matmul_backward_weight = cuda_matmul_backward_weight,
    .layernorm_backward_input = cuda_layernorm_backward_input,
    .layernorm_backward_weight = cuda_layernorm_backward_weight,
};

/* ---- fixed scratch ------------------------------------------------------------ */

extern "C" void kernels_cuda_init(void) {
    if (sumsq_partials) return; /* once per process: one GPU per rank */
    sumsq_partials = (double *)mem_alloc(SUMSQ_BLOCKS * sizeof(double), MEM_WORKSPACE);
    sumsq_result = (double *)mem_alloc(sizeof(double), MEM_WORKSPACE);
    colsum_partials = (float *)mem_alloc(COLSUM_SCRATCH_FLOATS * sizeof(float), MEM_WORKSPACE);
    token_sort_reserve(TOKEN_SORT_POSITIONS);
}
