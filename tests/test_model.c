/* The whole model's gradient against central finite differences on a tiny
 * config, and the same gradient when the layers are run as two pipeline
 * stages that hand activations and their gradients to each other. */
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); failures++; } } while (0)

static const gpt_config cfg = {.vocab = 17, .seq = 5, .layers = 2, .d_model = 8, .heads = 2};
enum { B = 3 };

static double loss_of(const gpt_layout *g, float *params, gpt_acts *a) {
    gpt_forward(g, params, a);
    return gpt_mean_loss(g, a);
}

typedef struct { long next_end; int calls, in_order; } ready_log;
static void log_ready(void *ctx, long begin, long end) {
    ready_log *r = ctx;
    r->in_order &= end == r->next_end && begin < end;
    r->next_end = begin;
    r->calls++;
}

int main(void) {
    device_use(DEVICE_CPU, 0);
    gpt_layout g;
    gpt_layout_init(&g, &cfg);
    long P = g.total, N = (long)B * cfg.seq;
    float *params = mem_alloc(P * sizeof(float), MEM_PARAMS), *grads = mem_alloc(P * sizeof(float), MEM_GRADS);
    gpt_init_params(&g, 7, 0, P, params);
    /* GPT-2 init leaves LayerNorm at identity and biases at zero; perturb them so
     * their gradients are exercised in general position too */
    for (long i = 0; i < P; i++) params[i] += 0.05f * rng_normal(99, 0, (uint64_t)i);

    gpt_acts a;
    gpt_acts_alloc(&a, &g, 0, cfg.layers, B);
    gpt_grad_scratch s;
    gpt_scratch_alloc(&s, &g, B);
    for (long i = 0; i < N; i++) {
        a.tokens[i] = (int)((i * 7 + 3) % cfg.vocab);
        a.targets[i] = (int)((i * 5 + 1) % cfg.vocab);
    }

    /* analytic gradient of the mean loss, with the readiness hook watched */
    double loss0 = loss_of(&g, params, &a);
    ready_log seen = {P, 0, 1};
    gpt_backward(&g, params, grads, &a, &s, NULL, 1.0f / (float)N, log_ready, &seen);
    CHECK(seen.in_order && seen.next_end == 0 && seen.calls == cfg.layers + 2,
          "grads_ready ranges must tile [0, P) from the top down (calls %d)", seen.calls);
    printf("loss at init %.4f (ln V = %.4f)\n", loss0, log((double)cfg.vocab));

    /* numeric gradient of every parameter: float forward, difference in double.
     * Measured on this config: the L2 error is 1.4e-2 at h = 3e-2, 1.6e-3 at
     * 1e-2 and 3.5e-4 at 3e-3, falling as h^2 (curvature, not rounding), so
     * h = 3e-3 with a 1e-3 bound leaves a margin of 3 while any real mistake
     * (a wrong transpose, a missed term) gives errors of order 1. */
    double num2 = 0, err2 = 0, worst = 0;
    long worst_i = -1;
    const float h = 3e-3f;
    for (long i = 0; i < P; i++) {
        float keep = params[i];
        params[i] = keep + h;
        double lp = loss_of(&g, params, &a);
        params[i] = keep - h;
        double lm = loss_of(&g, params, &a);
        params[i] = keep;
        double num = (lp - lm) / (2.0 * h), an = grads[i];
        num2 += num * num;
        err2 += (num - an) * (num - an);
        double e = fabs(num - an) / (fabs(num) + fabs(an) + 1e-3);
        if (e > worst) { worst = e; worst_i = i; }
    }
    double rel = sqrt(err2 / num2);
    printf("model gradient vs finite differences: %ld parameters, relative L2 error %.2e, "
           "worst element %.2e (index %ld)\n", P, rel, worst, worst_i);
    CHECK(rel < 1e-3, "relative L2 error %.3e >= 1e-3", rel);
    CHECK(worst < 5e-2, "worst element error %.3e >= 5e-2 at %ld", worst, worst_i);

    /* two stages: layers [0,1) then [1,2), activations handed over by copy */
    float *grads2 = mem_alloc(P * sizeof(float), MEM_GRADS);
    gpt_acts a0, a1;
    gpt_acts_alloc(&a0, &g, 0, 1, B);
    gpt_acts_alloc(&a1, &g, 1, cfg.layers, B);
    memcpy(a0.tokens, a.tokens, N * sizeof(int));
    memcpy(a1.targets, a.targets, N * sizeof(int));
    long b0, e0, b1, e1;
    gpt_range(&g, 0, 1, &b0, &e0);
    gpt_range(&g, 1, cfg.layers, &b1, &e1);
    CHECK(b0 == 0 && e0 == b1 && e1 == P, "stage ranges must tile the model");
    gpt_forward(&g, params + b0, &a0);
    memcpy(a1.x_in, gpt_acts_output(&a0), N * cfg.d_model * sizeof(float));
    gpt_forward(&g, params + b1, &a1);
    double loss_staged = gpt_mean_loss(&g, &a1);
    float *dx = gpt_backward(&g, params + b1, grads2 + b1, &a1, &s, NULL, 1.0f / (float)N, NULL, NULL);
    CHECK(dx != NULL, "a later stage must return the gradient of its input");
    float *dx_copy = malloc(N * cfg.d_model * sizeof(float));
    memcpy(dx_copy, dx, N * cfg.d_model * sizeof(float));
    CHECK(gpt_backward(&g, params + b0, grads2 + b0, &a0, &s, dx_copy, 0, NULL, NULL) == NULL,
          "the first stage returns no input gradient");
    double maxdiff = 0;
    for (long i = 0; i < P; i++) maxdiff = fmax(maxdiff, fabs(grads2[i] - grads[i]));
    printf("two stages vs one: loss %.9g vs %.9g, max gradient difference %.3g\n", loss_staged, loss0, maxdiff);
    CHECK(loss_staged == loss0, "staged loss differs");
    CHECK(maxdiff == 0, "staged gradients must be bit-identical (same kernels, same order)");

    /* the backward in two halves (B, then W later), on the same two stages:
     * both B's first, then both W's, as a zero-bubble schedule may order them */
    float *grads3 = mem_alloc(P * sizeof(float), MEM_GRADS);
    gpt_wgrads w0, w1;
    gpt_wgrads_alloc(&w0, &g, 0, 1, B);
    gpt_wgrads_alloc(&w1, &g, 1, cfg.layers, B);
    CHECK(w0.dx && !w0.dlogits && w1.dlogits && !w1.dx, "only the first stage keeps dx, only the last dlogits");
    float *dx_split = gpt_backward_input(&g, params + b1, &a1, &s, &w1, NULL, 1.0f / (float)N);
    CHECK(dx_split && memcmp(dx_split, dx_copy, N * cfg.d_model * sizeof(float)) == 0,
          "the input half must give the fused backward's input gradient, bit for bit");
    memcpy(dx_copy, dx_split, N * cfg.d_model * sizeof(float));
    CHECK(gpt_backward_input(&g, params + b0, &a0, &s, &w0, dx_copy, 0) == NULL,
          "the first stage's input half returns no input gradient");
    double untouched = 0;
    for (long i = 0; i < P; i++) untouched = fmax(untouched, fabs(grads3[i]));
    CHECK(untouched == 0, "the input half must not touch the weight gradients");
    gpt_backward_weight(&g, grads3 + b1, &a1, &w1);
    gpt_backward_weight(&g, grads3 + b0, &a0, &w0);
    double split_diff = 0;
    for (long i = 0; i < P; i++) split_diff = fmax(split_diff, fabs(grads3[i] - grads[i]));
    printf("backward in two halves vs fused: max gradient difference %.3g (activations %ld + "
           "weight-gradient inputs %ld bytes per stage-0 micro-batch)\n", split_diff, a0.bytes, w0.bytes);
    CHECK(split_diff == 0, "B then W must give the fused gradients bit for bit");
    const long w0_bytes = w0.bytes;
    gpt_wgrads_free(&w0);
    gpt_wgrads_free(&w1);
    mem_free(grads3);

    /* --recompute: every mode gives --recompute none's gradients bit for bit (the
     * same kernels recompute the same values), fused and split in B and W, on
     * one range and on two stages, and keeps less */
    for (int mode = RECOMPUTE_SELECTIVE; mode <= RECOMPUTE_FULL; mode++) {
        gpt_config rc = cfg;
        rc.recompute = mode;
        gpt_layout gr;
        gpt_layout_init(&gr, &rc);
        gpt_acts ar, ar0, ar1;
        gpt_grad_scratch sr;
        gpt_acts_alloc(&ar, &gr, 0, cfg.layers, B);
        gpt_acts_alloc(&ar0, &gr, 0, 1, B);
        gpt_acts_alloc(&ar1, &gr, 1, cfg.layers, B);
        gpt_scratch_alloc(&sr, &gr, B);
        gpt_acts_bind(&ar, &sr);
        gpt_acts_bind(&ar0, &sr);
        gpt_acts_bind(&ar1, &sr);
        memcpy(ar.tokens, a.tokens, N * sizeof(int));
        memcpy(ar.targets, a.targets, N * sizeof(int));
        memcpy(ar0.tokens, a.tokens, N * sizeof(int));
        memcpy(ar1.targets, a.targets, N * sizeof(int));
        float *gm = mem_alloc(P * sizeof(float), MEM_GRADS);
        mem_zero(gm, P * sizeof(float));
        gpt_forward(&gr, params, &ar);
        double lm = gpt_mean_loss(&gr, &ar);
        gpt_backward(&gr, params, gm, &ar, &sr, NULL, 1.0f / (float)N, NULL, NULL);
        CHECK(lm == loss0 && memcmp(gm, grads, P * sizeof(float)) == 0,
              "--recompute %s: loss or gradients differ from none's", recompute_names[mode]);
        /* two stages, the backward split: both B's, then both W's */
        gpt_wgrads wr0, wr1;
        gpt_wgrads_alloc(&wr0, &gr, 0, 1, B);
        gpt_wgrads_alloc(&wr1, &gr, 1, cfg.layers, B);
        mem_zero(gm, P * sizeof(float));
        gpt_forward(&gr, params + b0, &ar0);
        memcpy(ar1.x_in, gpt_acts_output(&ar0), N * cfg.d_model * sizeof(float));
        gpt_forward(&gr, params + b1, &ar1);
        memcpy(dx_copy, gpt_backward_input(&gr, params + b1, &ar1, &sr, &wr1, NULL, 1.0f / (float)N),
               N * cfg.d_model * sizeof(float));
        gpt_backward_input(&gr, params + b0, &ar0, &sr, &wr0, dx_copy, 0);
        gpt_backward_weight(&gr, gm + b1, &ar1, &wr1);
        gpt_backward_weight(&gr, gm + b0, &ar0, &wr0);
        CHECK(memcmp(gm, grads, P * sizeof(float)) == 0, "--recompute %s: B then W differ from none's fused gradients",
              recompute_names[mode]);
        printf("--recompute %s: loss and gradients bit-identical to none's (fused, and B then W on two stages); "
               "activations %ld of %ld bytes, weight-gradient block %ld of %ld\n", recompute_names[mode],
               ar0.bytes + ar1.bytes, a0.bytes + a1.bytes, wr0.bytes, w0_bytes);
        CHECK(ar0.bytes < a0.bytes && ar1.bytes < a1.bytes, "--recompute %s keeps no less", recompute_names[mode]);
        gpt_wgrads_free(&wr0);
        gpt_wgrads_free(&wr1);
        mem_free(gm);
        gpt_acts_free(&ar);
        gpt_acts_free(&ar0);
        gpt_acts_free(&ar1);
        gpt_scratch_free(&sr);
    }

    /* init: the slice [lo, hi) of the parameters equals the whole init's slice */
    float *whole = mem_alloc(P * sizeof(float), MEM_PARAMS), *part = mem_alloc(P * sizeof(float), MEM_PARAMS);
    gpt_init_params(&g, 7, 0, P, whole);
    long lo = P / 3 + 1, hi = 2 * P / 3 + 5;
    gpt_init_params(&g, 7, lo, hi, part);
    CHECK(memcmp(part, whole + lo, (hi - lo) * sizeof(float)) == 0, "a slice of the init differs from the whole");
    double mean = 0, var = 0;
    long n = 0;
    for (long i = 0; i < g.layer[LAYER_QKV_W].rows * g.layer[LAYER_QKV_W].cols; i++) {
        double x = whole[gpt_layer_offset(&g, 0) + g.layer[LAYER_QKV_W].offset + i];
        mean += x; var += x * x; n++;
    }
    mean /= n;
    var = var / n - mean * mean;
    printf("qkv init: mean %.4f std %.4f (want 0, 0.02)\n", mean, sqrt(var));
    CHECK(fabs(sqrt(var) - 0.02) < 0.004, "init std %.4f is not 0.02", sqrt(var));

    if (failures) { printf("%d check(s) failed\n", failures); return 1; }
    printf("model tests passed\n");
    return 0;
}
