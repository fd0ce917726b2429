/* The GEMM rates behind --precision bf16 on the CPU, in one process so the
 * ratios are fair: single-thread fp32 sgemm (kernels_cpu's matmul_forward)
 * against the bf16 matmul of kernels_bf16_cpu on the path PL_BF16_GEMM picks
 * (onednn: oneDNN's bf16 matmul, fp32 accumulation; sgemm: widened to fp32
 * for OpenBLAS), at the default model's shapes (B x T = 2048 rows, C = 128):
 * the QKV, MLP-up and MLP-down products. Repeats alternate between the two so
 * that a change in the machine's load hits both; medians of REPEATS. */
#include "device.h"
#include "kernels.h"
#include "precision.h"
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    enum { REPEATS = 9, CALLS = 4 };
    const int shapes[][3] = {{2048, 128, 384}, {2048, 128, 512}, {2048, 512, 128}}; /* N, IC, OC */
    openblas_set_num_threads(1);
    precision_use(PREC_BF16);
    printf("%s\n", kernels_bf16_cpu_gemm_text());
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        long ni = (long)N * IC, nw = (long)OC * IC, no = (long)N * OC;
        float *inp = malloc(sizeof(float) * ni), *w = malloc(sizeof(float) * nw), *out = malloc(sizeof(float) * no);
        uint16_t *inp16 = malloc(2 * ni), *w16 = malloc(2 * nw), *out16 = malloc(2 * no);
        for (long i = 0; i < ni; i++) inp[i] = (float)(i % 7) * 0.1f - 0.3f;
        for (long i = 0; i < nw; i++) w[i] = (float)(i % 5) * 0.1f - 0.2f;
        KP->to_values(inp16, inp, ni);
        KP->to_values(w16, w, nw);
        double f32[REPEATS], b16[REPEATS], flop = 2.0 * N * IC * OC * CALLS;
        for (int r = 0; r < REPEATS; r++) {
            double t0 = now_seconds();
            for (int k = 0; k < CALLS; k++) kernels_cpu.matmul_forward(out, inp, w, NULL, N, IC, OC);
            f32[r] = flop / (now_seconds() - t0) / 1e9;
            t0 = now_seconds();
            for (int k = 0; k < CALLS; k++) KP->matmul_forward(out16, inp16, w16, NULL, N, IC, OC);
            b16[r] = flop / (now_seconds() - t0) / 1e9;
        }
        qsort(f32, REPEATS, sizeof(double), cmp);
        qsort(b16, REPEATS, sizeof(double), cmp);
        printf("matmul %d x %d -> %d, 1 thread: fp32 sgemm %.1f GFLOP/s | bf16 %s %.1f GFLOP/s | bf16/fp32 %.2f "
               "(medians of %d)\n", N, IC, OC, f32[REPEATS / 2], kernels_bf16_cpu_uses_onednn() ? "onednn" : "sgemm",
               b16[REPEATS / 2], b16[REPEATS / 2] / f32[REPEATS / 2], REPEATS);
        free(inp); free(w); free(out); free(inp16); free(w16); free(out16);
    }
    return 0;
}
