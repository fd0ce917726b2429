/* The yardstick for the training step's speed: single-thread cblas_sgemm
 * GFLOP/s at 512 x 512 x 512 on this machine, median of several repeats. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    enum { N = 512, REPEATS = 15, CALLS = 4 };
    openblas_set_num_threads(1);
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N), *c = malloc(sizeof(float) * N * N);
    for (int i = 0; i < N * N; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; c[i] = 0; }
    double gflops[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        for (int k = 0; k < CALLS; k++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
        gflops[r] = 2.0 * N * N * N * CALLS / (now() - t0) / 1e9;
    }
    qsort(gflops, REPEATS, sizeof(double), cmp);
    printf("sgemm 512^3, 1 thread: %.1f GFLOP/s (median of %d)\n", gflops[REPEATS / 2], REPEATS);
    free(a); free(b); free(c);
    return 0;
}
