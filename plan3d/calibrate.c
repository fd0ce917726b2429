/* plan3d --calibrate: this machine as a cluster preset, measured with the
 * labs' own code (common/'s kernels, AdamW and communicator), so that --check
 * can turn theory/'s FLOPs and bytes into seconds.
 *
 *   model rate   the course's forward + backward (1 layer and the head, seq 64) on one
 *                rank, model FLOPs per second, on a grid of d_model x tokens:
 *                what the layers reach at that size (the CPU's "efficiency")
 *   sgemm        one thread, 512^3, for reference
 *   AdamW        seconds per parameter of adamw_step (memory-bound)
 *   links        comm_sendrecv ping-pong and comm_allreduce between the two
 *                ranks: latency from 1 float, bandwidth from 1M floats */
#include "calibrate.h"
#include "comm.h"
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "model.h"
#include "optim.h"
#include "paths.h"
#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CALIBRATION_MAX_BYTES (1LL << 20) /* what --calibrate writes is ~2 KB */

static const double grid_c[CAL_C] = {32, 64, 128, 256}, grid_tokens[CAL_N] = {128, 512, 2048};

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of runs of fn after a warm-up: `reps` of them, or fewer when
 * they take long (one run of a second says enough). */
typedef void (*work_fn)(void *ctx);
static double median_seconds(work_fn fn, void *ctx, int reps, double seconds) {
    double t[64];
    int n = 0;
    fn(ctx); /* warm-up */
    double start = now_seconds();
    while (n < 64 && (n < 1 || (n < reps && now_seconds() - start < seconds))) {
        double t0 = now_seconds();
        fn(ctx);
        t[n++] = now_seconds() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], by_value);
    return t[n / 2];
}

typedef struct { gpt_layout g; float *params, *grads; gpt_acts acts; gpt_grad_scratch scratch; int rows; } model_run;

static void forward_backward(void *vctx) {
    model_run *r = vctx;
    gpt_forward(&r->g, r->params, &r->acts);
    gpt_backward(&r->g, r->params, r->grads, &r->acts, &r->scratch, NULL, 1.0f / ((float)r->rows * r->g.cfg.seq),
                 NULL, NULL);
}

static double model_gflops(int C, int tokens) {
    const int T = 64, rows = tokens / T > 0 ? tokens / T : 1;
    model_run r = {.rows = rows};
    gpt_config cfg = {.vocab = 256, .seq = T, .layers = 1, .d_model = C, .heads = 4};
    gpt_layout_init(&r.g, &cfg);
    r.params = mem_alloc((size_t)r.g.total * sizeof(float), MEM_PARAMS);
    r.grads = mem_alloc((size_t)r.g.total * sizeof(float), MEM_GRADS);
    gpt_init_params(&r.g, 1, 0, r.g.total, r.params);
    gpt_acts_alloc(&r.acts, &r.g, 0, cfg.layers, rows);
    gpt_scratch_alloc(&r.scratch, &r.g, rows);
    int *tok = calloc((size_t)rows * T, sizeof(int));
    for (int i = 0; i < rows * T; i++) tok[i] = (i * 7) % 256;
    mem_to_device(r.acts.tokens, tok, sizeof(int) * (size_t)rows * T);
    mem_to_device(r.acts.targets, tok, sizeof(int) * (size_t)rows * T);
    free(tok);
    double s = median_seconds(forward_backward, &r, 5, 0.2);
    gpt_scratch_free(&r.scratch);
    gpt_acts_free(&r.acts);
    mem_free(r.params);
    mem_free(r.grads);
    return gpt_flops_per_token(&r.g) * rows * T / s / 1e9;
}

typedef struct { int n; float *a, *b, *c; } gemm_run;
static void sgemm(void *vctx) {
    gemm_run *g = vctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1, g->a, g->n, g->b, g->n, 0, g->c, g->n);
}

typedef struct { gpt_layout g; adamw_config cfg; float *p, *gr, *m, *v; long n; } adam_run;
static void adam(void *vctx) {
    adam_run *a = vctx;
    adamw_step(&a->g, &a->cfg, 0, a->n, a->p, a->gr, a->m, a->v, 1, 1.0f);
}

typedef struct { comm *c; float *buf; long n; int kind; } link_run; /* kind 0: ping-pong, 1: all-reduce */
static void link_op(void *vctx) {
    link_run *l = vctx;
    if (l->kind == 1) { comm_allreduce(l->c, l->buf, l->n, COMM_VALUES, 0); return; }
    if (l->c->rank == 0) { comm_send(l->c, l->buf, l->n, COMM_VALUES, 1); comm_recv(l->c, l->buf, l->n, COMM_VALUES, 1); }
    else { comm_recv(l->c, l->buf, l->n, COMM_VALUES, 0); comm_send(l->c, l->buf, l->n, COMM_VALUES, 0); }
}

/* Both ranks run the same fixed number of operations (a count decided by
 * the clock could differ between them and leave one waiting forever); rank
 * 0's median is kept. */
static double link_seconds(comm *c, int kind, long n, int reps) {
    float *buf = calloc((size_t)n, sizeof(float));
    link_run l = {c, buf, n, kind};
    double t[64];
    link_op(&l); /* warm-up */
    for (int i = 0; i < reps && i < 64; i++) {
        double t0 = now_seconds();
        link_op(&l);
        t[i] = now_seconds() - t0;
    }
    qsort(t, (size_t)(reps < 64 ? reps : 64), sizeof t[0], by_value);
    double s = t[(reps < 64 ? reps : 64) / 2];
    MPI_Bcast(&s, 1, MPI_DOUBLE, 0, c->mpi);
    free(buf);
    return s;
}

int calibrate_machine(const char *path, int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "error: --calibrate measures the link between two ranks: mpirun -n 2 ./plan3d --calibrate\n");
        MPI_Finalize();
        return 2;
    }
    /* the file it will write, proven writable before minutes of measuring */
    char err[PATH_MAX + 200] = "";
    int bad = rank == 0 && path_check_output_file("--calibration", path, err, sizeof err) != 0;
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (bad) {
        if (rank == 0) fprintf(stderr, "error: %s\n", err);
        MPI_Finalize();
        return 2;
    }
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
    device_use(DEVICE_CPU, 0);
    comm world;
    comm_init(&world, MPI_COMM_WORLD, COMM_MPI);
    calibration cal = {.cores = (int)sysconf(_SC_NPROCESSORS_ONLN)};

    /* links first, both ranks busy with them */
    const long big = 1L << 20;
    cal.p2p_us = link_seconds(&world, 0, 1, 64) / 2 * 1e6;
    /* the bandwidth from what the big message takes beyond the small one's latency
     * (at least half its time: a busy machine can make the latency look longer) */
    double p2p_big = link_seconds(&world, 0, big, 15) / 2;
    cal.p2p_gbs = 4.0 * big / fmax(p2p_big - cal.p2p_us * 1e-6, p2p_big / 2) / 1e9;
    double ar_small = link_seconds(&world, 1, 1, 64), ar_big = link_seconds(&world, 1, big, 15);
    cal.allreduce_us = ar_small / 2 * 1e6; /* a ring all-reduce of 2 ranks takes 2(n-1) = 2 steps */
    cal.allreduce_gbs = comm_ring_factor(COLL_ALLREDUCE, 2) * 4.0 * big / fmax(ar_big - ar_small, ar_big / 2) / 1e9;

    /* compute on rank 0 while rank 1 waits for it */
    if (rank == 0) {
        for (int i = 0; i < CAL_C; i++)
            for (int j = 0; j < CAL_N; j++) {
                cal.d_model[i] = grid_c[i];
                cal.tokens[j] = grid_tokens[j];
                cal.gflops[i][j] = model_gflops((int)grid_c[i], (int)grid_tokens[j]);
            }
        gemm_run gm = {512, calloc(512 * 512, 4), calloc(512 * 512, 4), calloc(512 * 512, 4)};
        cal.sgemm_gflops = 2.0 * 512 * 512 * 512 / median_seconds(sgemm, &gm, 5, 0.3) / 1e9;
        free(gm.a); free(gm.b); free(gm.c);
        adam_run a = {.n = 1L << 20};
        gpt_config cfg = {.vocab = 256, .seq = 64, .layers = 8, .d_model = 128, .heads = 4};
        gpt_layout_init(&a.g, &cfg);
        a.n = a.g.total;
        a.cfg = (adamw_config){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
        a.p = mem_alloc((size_t)a.n * 4, MEM_PARAMS); a.gr = mem_alloc((size_t)a.n * 4, MEM_GRADS);
        a.m = mem_alloc((size_t)a.n * 4, MEM_OPTIM); a.v = mem_alloc((size_t)a.n * 4, MEM_OPTIM);
        cal.adamw_ns = median_seconds(adam, &a, 5, 0.2) / (double)a.n * 1e9;
        mem_free(a.p); mem_free(a.gr); mem_free(a.m); mem_free(a.v);
        float done = 1;
        comm_send(&world, &done, 1, COMM_FP32, 1);
    } else {
        float done;
        comm_recv(&world, &done, 1, COMM_FP32, 0);
    }

    int status = 0;
    if (rank == 0) {
        json_t *rates = json_array();
        for (int i = 0; i < CAL_C; i++)
            for (int j = 0; j < CAL_N; j++)
                json_array_append_new(rates, json_pack("{s:f,s:f,s:f}", "d_model", cal.d_model[i], "tokens",
                                                       cal.tokens[j], "gflops", cal.gflops[i][j]));
        json_t *root = json_pack("{s:s,s:i,s:o,s:f,s:f,s:f,s:f,s:f,s:f}", "about",
                                 "plan3d --calibrate: the course's kernels and communicator on this machine", "cores",
                                 cal.cores, "model_gflops", rates, "sgemm_gflops", cal.sgemm_gflops, "adamw_ns_per_param",
                                 cal.adamw_ns, "p2p_us", cal.p2p_us, "p2p_gbs", cal.p2p_gbs, "allreduce_us",
                                 cal.allreduce_us, "allreduce_gbs", cal.allreduce_gbs);
        if (json_dump_file(root, path, JSON_INDENT(1)) != 0) {
            fprintf(stderr, "error: --calibration %s: cannot write the file\n", path);
            status = 2;
        } else {
            printf("calibration of this machine (%d cores) -> %s\n", cal.cores, path);
            printf("  the course's forward + backward, model GFLOP/s by d_model (rows) x tokens per rank (columns):\n"
                   "          %8.0f %8.0f %8.0f\n", cal.tokens[0], cal.tokens[1], cal.tokens[2]);
            for (int i = 0; i < CAL_C; i++)
                printf("  C=%-5.0f %8.1f %8.1f %8.1f\n", cal.d_model[i], cal.gflops[i][0], cal.gflops[i][1], cal.gflops[i][2]);
            printf("  sgemm 512^3 one thread %.1f GFLOP/s | AdamW %.2f ns per parameter\n", cal.sgemm_gflops, cal.adamw_ns);
            printf("  send/recv: %.1f us + %.2f GB/s | all-reduce of 2: %.1f us per step + %.2f GB/s of ring bytes\n",
                   cal.p2p_us, cal.p2p_gbs, cal.allreduce_us, cal.allreduce_gbs);
        }
        json_decref(root);
    }
    comm_free(&world);
    MPI_Finalize();
    return status;
}

int calibration_load(const char *path, calibration *cal, char *err, size_t errlen) {
    memset(cal, 0, sizeof *cal);
    long long size;
    json_error_t jerr;
    int fd = path_open_input("--calibration", path, CALIBRATION_MAX_BYTES, &size, err, errlen);
    if (fd < 0) return access(path, F_OK) != 0 && errno == ENOENT ? 0 : -1;
    json_t *root = json_loadfd(fd, 0, &jerr);
    close(fd);
    if (!root) {
        snprintf(err, errlen, "--calibration %s: not JSON (line %d: %s); plan3d --calibrate writes it", path, jerr.line,
                 jerr.text);
        return -1;
    }
    json_t *rates = json_object_get(root, "model_gflops");
    int ok = json_unpack(root, "{s:i,s:F,s:F,s:F,s:F,s:F,s:F}", "cores", &cal->cores, "sgemm_gflops", &cal->sgemm_gflops,
                         "adamw_ns_per_param", &cal->adamw_ns, "p2p_us", &cal->p2p_us, "p2p_gbs", &cal->p2p_gbs,
                         "allreduce_us", &cal->allreduce_us, "allreduce_gbs", &cal->allreduce_gbs) == 0 &&
             json_is_array(rates) && json_array_size(rates) == CAL_C * CAL_N;
    for (size_t k = 0; ok && k < CAL_C * CAL_N; k++) {
        int i = (int)k / CAL_N, j = (int)k % CAL_N;
        ok = json_unpack(json_array_get(rates, k), "{s:F,s:F,s:F}", "d_model", &cal->d_model[i], "tokens",
                         &cal->tokens[j], "gflops", &cal->gflops[i][j]) == 0 && cal->gflops[i][j] > 0 &&
             cal->d_model[i] > 0 && cal->tokens[j] > 0;
    }
    /* every rate and time positive and finite: they divide and take logarithms */
    const double figures[] = {cal->sgemm_gflops, cal->adamw_ns, cal->p2p_us, cal->p2p_gbs, cal->allreduce_us, cal->allreduce_gbs};
    for (size_t k = 0; ok && k < sizeof figures / sizeof figures[0]; k++) ok = figures[k] > 0 && isfinite(figures[k]);
    json_decref(root);
    if (!ok)
        snprintf(err, errlen, "--calibration %s: not a calibration of plan3d (a key is missing or a figure not positive); "
                 "mpirun -n 2 ./plan3d --calibrate writes one", path);
    return ok ? 1 : -1;
}

/* where x falls on a log grid: the cell and the weight of its upper end */
static void locate(const double *grid, int n, double x, int *cell, double *w) {
    double lx = log(x);
    if (lx <= log(grid[0])) { *cell = 0; *w = 0; return; }
    if (lx >= log(grid[n - 1])) { *cell = n - 2; *w = 1; return; }
    int i = 0;
    while (i < n - 2 && lx > log(grid[i + 1])) i++;
    *cell = i;
    *w = (lx - log(grid[i])) / (log(grid[i + 1]) - log(grid[i]));
}

double calibration_rate(const calibration *cal, double d_model, double tokens) {
    int i, j;
    double wi, wj;
    locate(cal->d_model, CAL_C, d_model, &i, &wi);
    locate(cal->tokens, CAL_N, tokens, &j, &wj);
    double l00 = log(cal->gflops[i][j]), l01 = log(cal->gflops[i][j + 1]);
    double l10 = log(cal->gflops[i + 1][j]), l11 = log(cal->gflops[i + 1][j + 1]);
    double l = (1 - wi) * ((1 - wj) * l00 + wj * l01) + wi * ((1 - wj) * l10 + wj * l11);
    return exp(l) * 1e9;
}

int calibration_cluster(const char *path, const th_model *m, cluster *c, char *err, size_t errlen) {
    calibration cal;
    int loaded = calibration_load(path, &cal, err, errlen);
    if (loaded != 1) return loaded;
    /* a rank's rate at the model's width, at the lab default's 2048 tokens per rank */
    double rate = calibration_rate(&cal, (double)m->d_model, 2048) / 1e12;
    c->fp32_tflops = c->bf16_tflops = rate;
    c->efficiency = 1; /* measured: the rate is what the layers reach */
    c->cores = cal.cores;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && cal.cores > 0) c->mem_gib = (double)pages * page / cal.cores / 1073741824.0; /* RAM per rank */
    c->gpus_per_node = cal.cores;
    c->intra_gbs = c->inter_gbs = cal.allreduce_gbs;
    c->intra_us = c->inter_us = cal.allreduce_us;
    c->hbm_gbs = 28.0 / cal.adamw_ns; /* cost.c charges 28 bytes per parameter */
    return 1;
}
