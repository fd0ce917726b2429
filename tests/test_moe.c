/* Mixture of experts (common/moe.c): the model's gradient against central
 * finite differences with experts (top-2, top-2 with dropping, top-1, the aux
 * loss weighted up so its gradient shows), the router's rules on numbers
 * worked by hand (ties, gates, capacity in position order, the aux loss of a
 * uniform router), --recompute with experts bit for bit, the backward split
 * in B and W bit for bit, and dense E = 0
 * keeping the dense layout; DeepSeek-V3's sigmoid router (top-2, top-2 with
 * dropping, top-1, with a routing bias), and the bias taking no gradient. */
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "model.h"
#include "moe.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); failures++; } } while (0)

enum { B = 3 };
static const gpt_config base = {.vocab = 17, .seq = 5, .layers = 2, .d_model = 8, .heads = 2,
                                .experts = 4, .top_k = 2, .aux_coef = 0.1f};

static void set_batch(gpt_acts *a, long N, int vocab) {
    for (long i = 0; i < N; i++) {
        if (a->tokens) a->tokens[i] = (int)((i * 7 + 3) % vocab);
        if (a->targets) a->targets[i] = (int)((i * 5 + 1) % vocab);
    }
}

/* which expert each choice went to and its slot, over every layer: a finite
 * difference is only defined where a step of h leaves the routing alone */
static uint64_t routing_of(const gpt_config *c, const gpt_acts *a) {
    long N = (long)a->B * c->seq;
    uint64_t h = 1469598103934665603ULL;
    for (int l = 0; l < a->hi - a->lo; l++) {
        moe_state st = moe_state_view(a->layer[l].moe, c, N);
        for (long i = 0; i < N * c->top_k; i++) {
            h = (h ^ (uint64_t)(st.choice[i] + 7)) * 1099511628211ULL;
            h = (h ^ (uint64_t)(st.slot[i] + 7)) * 1099511628211ULL;
        }
    }
    return h;
}

static double loss_of(const gpt_layout *g, float *params, gpt_acts *a) {
    gpt_forward(g, params, a);
    return gpt_mean_loss(g, a);
}

/* every layer's router times f (a router near init is near uniform: near ties) */
static void spread_router(const gpt_layout *g, float *params, float f) {
    for (int l = 0; l < g->cfg.layers; l++) {
        float *wr = params + gpt_layer_offset(g, l) + g->layer[LAYER_ROUTER_W].offset;
        for (long i = 0; i < (long)g->cfg.experts * g->cfg.d_model; i++) wr[i] *= f;
    }
}

/* activations and scratch of the whole model for B rows, bound, with the test's tokens */
static void acts_with_batch(const gpt_layout *g, gpt_acts *a, gpt_grad_scratch *s) {
    gpt_acts_alloc(a, g, 0, g->cfg.layers, B);
    gpt_scratch_alloc(s, g, B);
    gpt_acts_bind(a, s);
    set_batch(a, (long)B * g->cfg.seq, g->cfg.vocab);
}

static void gradcheck(const char *name, gpt_config c, int want_drops) {
    gpt_layout g;
    gpt_layout_init(&g, &c);
    long P = g.total, N = (long)B * c.seq;
    float *params = mem_alloc(P * sizeof(float), MEM_PARAMS), *grads = mem_alloc(P * sizeof(float), MEM_GRADS);
    gpt_init_params(&g, 7, 0, P, params);
    for (long i = 0; i < P; i++) params[i] += 0.05f * rng_normal(99, 0, (uint64_t)i);
    /* a router of this size at init is near uniform (many near-ties, which finite
     * differences cannot cross): spread it 4x. Measured: the L2 error is 4e-4 at
     * 1x and 4x, 5.5e-4 at 8x, 2e-3 at 20x (the softmax's curvature grows with
     * its sharpness; the aux loss's weight changes nothing). Sigmoid scores lie
     * closer together (s' <= 1/4), more near ties: 12x. Measured, sigmoid
     * top-2: 4x skips 283 of 5448 parameters (a near tie), 6x 55, 12x 34; L2
     * error 4.4e-4 at each */
    spread_router(&g, params, c.router_sigmoid ? 12.0f : 4.0f);
    gpt_acts a;
    gpt_grad_scratch s;
    acts_with_batch(&g, &a, &s);
    mem_zero(grads, P * sizeof(float));
    double loss0 = loss_of(&g, params, &a);
    const uint64_t route0 = routing_of(&c, &a);
    long dropped = moe_dropped(&g, &a);
    double aux = moe_aux_loss(&g, &a);
    gpt_backward(&g, params, grads, &a, &s, NULL, 1.0f / (float)N, NULL, NULL);

    double num2 = 0, err2 = 0, worst = 0;
    long skipped = 0, worst_i = -1;
    const float h = 3e-3f; /* as test_model's */
    for (long i = 0; i < P; i++) {
        float keep = params[i];
        params[i] = keep + h;
        double lp = loss_of(&g, params, &a);
        int same = routing_of(&c, &a) == route0;
        params[i] = keep - h;
        double lm = loss_of(&g, params, &a);
        same &= routing_of(&c, &a) == route0;
        params[i] = keep;
        if (!same) { skipped++; continue; }
        double num = (lp - lm) / (2.0 * h), an = grads[i];
        num2 += num * num;
        err2 += (num - an) * (num - an);
        double e = fabs(num - an) / (fabs(num) + fabs(an) + 1e-3);
        if (e > worst) { worst = e; worst_i = i; }
    }
    double rel = sqrt(err2 / num2);
    printf("%s: loss %.5f (aux %.5f), %ld dropped choices; gradient vs finite differences over %ld parameters "
           "(%ld skipped: a step of h changes the routing): relative L2 error %.2e, worst %.2e (index %ld)\n",
           name, loss0, aux, dropped, P - skipped, skipped, rel, worst, worst_i);
    CHECK(rel < 1e-3, "%s: relative L2 error %.3e >= 1e-3", name, rel);
    CHECK(worst < 5e-2, "%s: worst element error %.3e >= 5e-2 at %ld", name, worst, worst_i);
    CHECK(skipped < P / 50, "%s: %ld of %ld parameters change the routing", name, skipped, P);
    CHECK(want_drops ? dropped > 0 : dropped == 0, "%s: %ld dropped choices", name, dropped);
    /* the router and every expert (the shared ones too) got a gradient */
    for (int part = LAYER_FC_W; part < LAYER_NTENSORS; part++) {
        const tensor_info *t = &g.layer[part];
        if (t->rows * t->cols == 0) continue; /* no shared experts */
        double sum = 0;
        for (long i = 0; i < t->rows * t->cols; i++) sum += fabs(grads[gpt_layer_offset(&g, 0) + t->offset + i]);
        CHECK(sum > 0, "%s: %s has no gradient", name, t->name);
    }

    /* --recompute with experts: the same loss and gradients, bit for bit */
    for (int mode = RECOMPUTE_SELECTIVE; mode <= RECOMPUTE_FULL; mode++) {
        gpt_config rc = c;
        rc.recompute = mode;
        gpt_layout gr;
        gpt_layout_init(&gr, &rc);
        gpt_acts ar;
        gpt_grad_scratch sr;
        gpt_acts_alloc(&ar, &gr, 0, c.layers, B);
        gpt_scratch_alloc(&sr, &gr, B);
        gpt_acts_bind(&ar, &sr);
        set_batch(&ar, N, c.vocab);
        float *gm = mem_alloc(P * sizeof(float), MEM_GRADS);
        mem_zero(gm, P * sizeof(float));
        double lm = loss_of(&gr, params, &ar);
        gpt_backward(&gr, params, gm, &ar, &sr, NULL, 1.0f / (float)N, NULL, NULL);
        CHECK(lm == loss0 && memcmp(gm, grads, P * sizeof(float)) == 0,
              "%s --recompute %s: loss or gradients differ from none's", name, recompute_names[mode]);
        CHECK(ar.bytes < a.bytes, "%s --recompute %s keeps no less", name, recompute_names[mode]);
        mem_free(gm);
        gpt_acts_free(&ar);
        gpt_scratch_free(&sr);
    }
    /* the backward split in B and W (lab04's zero-bubble schedules) on two
     * stages: both B's, then both W's, under every --recompute mode: the fused
     * gradients bit for bit (the router's d logits and the slots' dys kept
     * from B until W) */
    for (int mode = RECOMPUTE_NONE; mode <= RECOMPUTE_FULL; mode++) {
        gpt_config rc = c;
        rc.recompute = mode;
        gpt_layout gr;
        gpt_layout_init(&gr, &rc);
        const int mid = c.layers / 2;
        long b0, e0, b1, e1;
        gpt_range(&gr, 0, mid, &b0, &e0);
        gpt_range(&gr, mid, c.layers, &b1, &e1);
        gpt_acts a0, a1;
        gpt_grad_scratch sr;
        gpt_wgrads w0, w1;
        gpt_acts_alloc(&a0, &gr, 0, mid, B);
        gpt_acts_alloc(&a1, &gr, mid, c.layers, B);
        gpt_scratch_alloc(&sr, &gr, B);
        gpt_acts_bind(&a0, &sr);
        gpt_acts_bind(&a1, &sr);
        gpt_wgrads_alloc(&w0, &gr, 0, mid, B);
        gpt_wgrads_alloc(&w1, &gr, mid, c.layers, B);
        set_batch(&a0, N, c.vocab);
        set_batch(&a1, N, c.vocab);
        float *gm = mem_alloc(P * sizeof(float), MEM_GRADS), *dx = malloc(N * c.d_model * sizeof(float));
        mem_zero(gm, P * sizeof(float));
        gpt_forward(&gr, params + b0, &a0);
        memcpy(a1.x_in, gpt_acts_output(&a0), N * c.d_model * sizeof(float));
        gpt_forward(&gr, params + b1, &a1);
        memcpy(dx, gpt_backward_input(&gr, params + b1, &a1, &sr, &w1, NULL, 1.0f / (float)N),
               N * c.d_model * sizeof(float));
        gpt_backward_input(&gr, params + b0, &a0, &sr, &w0, dx, 1.0f / (float)N);
        gpt_backward_weight(&gr, gm + b1, &a1, &w1);
        gpt_backward_weight(&gr, gm + b0, &a0, &w0);
        long differ = 0;
        for (long i = 0; i < P; i++) differ += gm[i] != grads[i];
        printf("%s --recompute %s, B then W on two stages: %ld of %ld gradients differ from the fused pass's "
               "(weight-gradient blocks %ld + %ld bytes)\n", name, recompute_names[mode], differ, P, w0.bytes,
               w1.bytes);
        CHECK(differ == 0, "%s --recompute %s: B then W differ from the fused gradients in %ld places", name,
              recompute_names[mode], differ);
        free(dx);
        mem_free(gm);
        gpt_wgrads_free(&w0);
        gpt_wgrads_free(&w1);
        gpt_acts_free(&a0);
        gpt_acts_free(&a1);
        gpt_scratch_free(&sr);
    }
    gpt_acts_free(&a);
    gpt_scratch_free(&s);
    mem_free(params);
    mem_free(grads);
}

/* A zero router: every p = 1/E, so every token picks experts 0 and 1 (ties to
 * the lower index) with gates 1/2; with F = 1, capacity ceil(2 x 5 x 1 / 4) = 3,
 * so positions 3 and 4 of every sequence drop both choices; the aux loss of
 * each sequence is E (1/2 x 1/E + 1/2 x 1/E) = 1, the loss adds exactly a. */
static void rules_by_hand(void) {
    gpt_config c = base;
    c.capacity_factor = 1.0f;
    gpt_layout g;
    gpt_layout_init(&g, &c);
    long P = g.total, N = (long)B * c.seq;
    float *params = mem_alloc(P * sizeof(float), MEM_PARAMS);
    gpt_init_params(&g, 7, 0, P, params);
    for (int l = 0; l < c.layers; l++)
        memset(params + gpt_layer_offset(&g, l) + g.layer[LAYER_ROUTER_W].offset, 0,
               (size_t)c.experts * c.d_model * sizeof(float));
    gpt_acts a;
    gpt_acts_alloc(&a, &g, 0, c.layers, B);
    set_batch(&a, N, c.vocab);
    gpt_forward(&g, params, &a);
    CHECK(moe_capacity(&c) == 3, "capacity %ld, want ceil(2 x 5 x 1 / 4) = 3", moe_capacity(&c));
    int bad = 0;
    for (int l = 0; l < c.layers; l++) {
        moe_state st = moe_state_view(a.layer[l].moe, &c, N);
        for (long n = 0; n < N; n++) {
            int t = (int)(n % c.seq), kept = t < 3;
            bad += st.choice[2 * n] != 0 || st.choice[2 * n + 1] != 1;
            bad += st.gate[2 * n] != 0.5f || st.gate[2 * n + 1] != 0.5f;
            bad += (st.slot[2 * n] >= 0) != kept || (st.slot[2 * n + 1] >= 0) != kept;
        }
        /* slots: expert 0's 9 tokens in order, then expert 1's */
        bad += st.count[0] != 3 * B || st.count[1] != 3 * B || st.count[2] || st.count[3];
        bad += st.slot[2 * (c.seq + 1)] != 4 || st.slot[2 * (c.seq + 1) + 1] != 3 * B + 4;
        bad += a.layer[l].moe_stats[1] != 2 * 2 * B || fabsf(a.layer[l].moe_stats[0] - (float)B) > 1e-5f;
    }
    CHECK(!bad, "a zero router: %d choices, gates, slots or counts differ from the rules", bad);
    double aux = moe_aux_loss(&g, &a);
    printf("zero router: experts 0 and 1 with gates 1/2, capacity 3, %ld dropped (want %d), aux loss %.7f (want a = "
           "%.2f)\n", moe_dropped(&g, &a), 2 * 2 * B * c.layers, aux, c.aux_coef);
    CHECK(moe_dropped(&g, &a) == 2 * 2 * B * c.layers, "dropped %ld", moe_dropped(&g, &a));
    CHECK(fabs(aux - c.aux_coef) < 1e-6, "aux loss %.7f is not a = %.2f under uniform routing", aux, c.aux_coef);
    /* top-1 gates by p itself: 1/E */
    c.top_k = 1;
    c.capacity_factor = 0;
    gpt_layout g1;
    gpt_layout_init(&g1, &c);
    gpt_acts a1;
    gpt_acts_alloc(&a1, &g1, 0, c.layers, B);
    set_batch(&a1, N, c.vocab);
    gpt_forward(&g1, params, &a1);
    moe_state st = moe_state_view(a1.layer[0].moe, &c, N);
    CHECK(st.choice[0] == 0 && fabsf(st.gate[0] - 0.25f) < 1e-7f, "top-1: expert %d gate %g, want 0 and 1/4",
          st.choice[0], st.gate[0]);
    gpt_acts_free(&a);
    gpt_acts_free(&a1);
    mem_free(params);
}

/* --balance bias (moe.h): the bias decides the choice only. Two biases that
 * leave every choice as it was give the same loss and the same gradients, bit
 * for bit (nothing flows into or through it); a bias that moves the choice
 * changes the loss, and the gates stay the scores' (the bias is not in them). */
static void bias_gets_no_gradient(int sigmoid) {
    gpt_config c = base;
    c.router_sigmoid = sigmoid;
    c.aux_coef = 0; /* --balance bias: no aux loss */
    gpt_layout g;
    gpt_layout_init(&g, &c);
    const long P = g.total, N = (long)B * c.seq, E = c.experts;
    float *params = mem_alloc(P * sizeof(float), MEM_PARAMS);
    gpt_init_params(&g, 7, 0, P, params);
    spread_router(&g, params, 4.0f); /* as gradcheck does: choices with clear margins */
    float bias[3][2 * 4] = {{0}, {1e-7f, -1e-7f, 2e-7f, 0, -1e-7f, 0, 1e-7f, 0}, {0, 0, 0, 10, 0, 0, 0, 10}};
    double loss[3];
    uint64_t route[3];
    float *grads[3];
    int gates_are_scores = 1;
    for (int v = 0; v < 3; v++) {
        c.route_bias = bias[v];
        g.cfg = c;
        gpt_acts a;
        gpt_grad_scratch s;
        acts_with_batch(&g, &a, &s);
        grads[v] = mem_alloc(P * sizeof(float), MEM_GRADS);
        mem_zero(grads[v], P * sizeof(float));
        loss[v] = loss_of(&g, params, &a);
        route[v] = routing_of(&c, &a);
        gpt_backward(&g, params, grads[v], &a, &s, NULL, 1.0f / (float)N, NULL, NULL);
        if (v == 2) { /* expert 3 is every token's first choice; its gate is still s_3 / (s_3 + s_j) */
            moe_state st = moe_state_view(a.layer[0].moe, &c, N);
            for (long n = 0; n < N; n++) {
                const float *p = st.probs + n * E;
                const int *ch = st.choice + n * 2;
                gates_are_scores &= ch[0] == 3 && st.gate[n * 2] == p[3] / (p[3] + p[ch[1]]);
            }
        }
        gpt_acts_free(&a);
        gpt_scratch_free(&s);
    }
    const char *name = sigmoid ? "sigmoid" : "softmax";
    printf("%s router, bias 0 / +-1e-7 / +10 on expert 3: routing %s / %s, loss %.7f / %.7f / %.7f, gradients "
           "%s for the first two\n", name, route[1] == route[0] ? "the same" : "changed",
           route[2] == route[0] ? "the same" : "changed", loss[0], loss[1], loss[2],
           memcmp(grads[0], grads[1], P * sizeof(float)) ? "differ" : "bit-identical");
    CHECK(route[1] == route[0] && loss[1] == loss[0] && !memcmp(grads[0], grads[1], P * sizeof(float)),
          "%s: a bias that keeps every choice changed the loss or a gradient", name);
    CHECK(route[2] != route[0] && loss[2] != loss[0], "%s: a bias of 10 did not change the routing", name);
    CHECK(gates_are_scores, "%s: with a bias the gates are not the chosen scores normalised", name);
    for (int v = 0; v < 3; v++) mem_free(grads[v]);
    mem_free(params);
}

/* Node-limited routing (--route-groups G --route-max-groups M), checked against a
 * second reading of the rule on the forward's own scores: every token's experts
 * lie in its M best groups (each scored by the sum of its two best scores), and
 * are the top-k of those groups' experts. G = E with M = k keeps every choice
 * (a group of one is its expert), as does M = G; M = 1 of 2 moves some. */
static void node_limited_routing(void) {
    struct { int G, M, same_as_free; } cases[] = {{2, 1, 0}, {2, 2, 1}, {4, 2, 1}, {4, 3, 1}};
    gpt_config free_cfg = base;
    free_cfg.router_sigmoid = 1; /* scores on their own: a group's sum means something */
    gpt_layout g;
    gpt_layout_init(&g, &free_cfg);
    const long P = g.total, N = (long)B * base.seq, E = base.experts, k = base.top_k;
    float *params = mem_alloc(P * sizeof(float), MEM_PARAMS);
    gpt_init_params(&g, 11, 0, P, params);
    spread_router(&g, params, 12.0f);
    gpt_acts a;
    gpt_grad_scratch s;
    acts_with_batch(&g, &a, &s);
    loss_of(&g, params, &a);
    const uint64_t free_route = routing_of(&free_cfg, &a);
    gpt_acts_free(&a);
    gpt_scratch_free(&s);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gpt_config c = free_cfg;
        c.route_groups = cases[i].G, c.route_max_groups = cases[i].M;
        g.cfg = c;
        acts_with_batch(&g, &a, &s);
        loss_of(&g, params, &a);
        const int per = (int)E / c.route_groups;
        long outside = 0, not_top = 0, moved = 0;
        for (int l = 0; l < c.layers; l++) {
            moe_state st = moe_state_view(a.layer[l].moe, &c, N);
            for (long n = 0; n < N; n++) {
                const float *p = st.probs + n * E;
                float score[4];
                int kept[4] = {0};
                for (int gr = 0; gr < c.route_groups; gr++) {
                    float best = -1, second = -1;
                    for (int e = gr * per; e < (gr + 1) * per; e++)
                        if (p[e] > best) second = best, best = p[e];
                        else if (p[e] > second) second = p[e];
                    score[gr] = per > 1 ? best + second : best;
                }
                for (int m = 0; m < c.route_max_groups; m++) {
                    int top = -1;
                    for (int gr = 0; gr < c.route_groups; gr++)
                        if (!kept[gr] && (top < 0 || score[gr] > score[top])) top = gr;
                    kept[top] = 1;
                }
                for (int j = 0; j < k; j++) {
                    const int e = st.choice[n * k + j];
                    outside += !kept[e / per];
                    for (int o = 0; o < E; o++) /* a kept expert above a chosen one, not chosen itself */
                        if (kept[o / per] && p[o] > p[e] && o != st.choice[n * k] && o != st.choice[n * k + 1])
                            not_top++;
                }
                int best = 0, second = -1; /* the free top-2 */
                for (int e = 1; e < E; e++) if (p[e] > p[best]) best = e;
                for (int e = 0; e < E; e++) if (e != best && (second < 0 || p[e] > p[second])) second = e;
                moved += st.choice[n * k] != best || st.choice[n * k + 1] != second;
            }
        }
        const uint64_t route = routing_of(&c, &a);
        printf("node-limited routing, %d groups, at most %d: %ld choices outside the kept groups, %ld below a kept "
               "expert, %ld of %ld tokens routed otherwise than free routing\n", c.route_groups, c.route_max_groups,
               outside, not_top, moved, N * c.layers);
        CHECK(outside == 0 && not_top == 0, "G %d M %d: a choice breaks the rule", c.route_groups, c.route_max_groups);
        CHECK((route == free_route) == cases[i].same_as_free && (moved == 0) == cases[i].same_as_free,
              "G %d M %d: the routing %s free routing's", c.route_groups, c.route_max_groups,
              route == free_route ? "equals" : "differs from");
        gpt_acts_free(&a);
        gpt_scratch_free(&s);
    }
    mem_free(params);
}

int main(void) {
    device_use(DEVICE_CPU, 0);
    /* E = 0 is the dense model: no router, the dense MLP's sizes */
    gpt_config dense = base;
    dense.experts = 0;
    gpt_layout gd, ge;
    gpt_layout_init(&gd, &dense);
    gpt_layout_init(&ge, &base);
    long C = base.d_model, mlp = 8 * C * C + 5 * C;
    CHECK(gd.layer[LAYER_ROUTER_W].rows == 0 && gd.layer_size == ge.layer_size - 3 * mlp - base.experts * C,
          "layer sizes: dense %ld, experts %ld", gd.layer_size, ge.layer_size);

    rules_by_hand();
    gradcheck("top-2", base, 0);
    gpt_config c = base;
    c.capacity_factor = 1.0f;
    gradcheck("top-2, capacity factor 1", c, 1);
    c = base;
    c.top_k = 1;
    gradcheck("top-1", c, 0);
    c.capacity_factor = 1.0f;
    gradcheck("top-1, capacity factor 1", c, 1);
    /* --router sigmoid: scores s = sigmoid(logits), gates s / sum of the chosen, top-1 s itself; the aux
     * loss (a = 0.1 here) on s / sum s */
    c = base;
    c.router_sigmoid = 1;
    gradcheck("sigmoid top-2", c, 0);
    c.capacity_factor = 1.0f;
    gradcheck("sigmoid top-2, capacity factor 1", c, 1);
    c = base;
    c.router_sigmoid = 1;
    c.top_k = 1;
    gradcheck("sigmoid top-1", c, 0);
    /* --balance bias: a bias that moves choices (the gradient is still exact where the routing stays) */
    static const float some_bias[2 * 4] = {0.05f, -0.05f, 0.1f, 0, 0, 0.08f, -0.02f, 0};
    c = base;
    c.router_sigmoid = 1;
    c.aux_coef = 0;
    c.route_bias = some_bias;
    gradcheck("sigmoid top-2 with a bias, no aux loss", c, 0);
    bias_gets_no_gradient(0);
    bias_gets_no_gradient(1);
    node_limited_routing();
    c = base;
    c.router_sigmoid = 1;
    c.route_groups = 2, c.route_max_groups = 1; /* both choices in one group of two */
    gradcheck("sigmoid top-2, node-limited: 2 groups, at most 1", c, 0);
    /* --expert-width: fine-grained experts narrower than the dense MLP's 4C = 32 units (3: narrower
     * than C too, where the slots' input gradients need more room than their dGELU) and wider, the
     * layout's expert tensors and the layer's slots as wide. Each width draws other parameters and so
     * other near-ties: at 6 and 24 units a step of h crosses the routing for 124 and 239 parameters
     * (more than P/50), at 3 for 6, at 10 for none and at 40 for 28 of 6536 */
    static const int widths[] = {3, 10, 40};
    for (int wi = 0; wi < 3; wi++) {
        const int width = widths[wi];
        c = base;
        c.expert_width = width;
        gpt_layout gw;
        gpt_layout_init(&gw, &c);
        const long per_expert = 2 * C * width + width + C;
        CHECK(gw.layer_size == ge.layer_size - base.experts * (mlp - per_expert) &&
                  gw.layer[LAYER_FCPROJ_W].cols == width && gw.layer[LAYER_FC_W].rows == base.experts * width,
              "--expert-width %d: layer size %ld, expected %ld", width, gw.layer_size,
              ge.layer_size - base.experts * (mlp - per_expert));
        char name[64];
        snprintf(name, sizeof name, "top-2, experts %d units wide", width);
        gradcheck(name, c, 0);
        c.capacity_factor = 1.0f;
        snprintf(name, sizeof name, "top-2, experts %d units wide, capacity factor 1", width);
        gradcheck(name, c, 1);
    }
    /* --shared-experts: S MLPs every token runs at gate 1, one MLP of S M units beside the routed
     * experts: its tensors, its gradient, recomputation and the B/W split (gradcheck's) */
    for (int S = 1; S <= 2; S++) {
        c = base;
        c.shared_experts = S;
        c.expert_width = S == 2 ? 10 : 0;
        gpt_layout gs;
        gpt_layout_init(&gs, &c);
        const long M = gpt_mlp_width(&c), routed = 2 * C * M + M + C, shared = 2 * C * S * M + S * M + C;
        CHECK(gs.layer_size == ge.layer_size - base.experts * (mlp - routed) + shared &&
                  gs.layer[LAYER_SHARED_FC_W].rows == S * M && gs.layer[LAYER_SHARED_FCPROJ_W].cols == S * M,
              "--shared-experts %d: layer size %ld, expected %ld", S, gs.layer_size,
              ge.layer_size - base.experts * (mlp - routed) + shared);
        char name[80];
        snprintf(name, sizeof name, "top-2 + %d shared expert%s of %ld units", S, S > 1 ? "s" : "", M);
        gradcheck(name, c, 0);
        if (S == 2) {
            c.capacity_factor = 1.0f;
            snprintf(name, sizeof name, "top-2 + 2 shared experts of %ld units, capacity factor 1", M);
            gradcheck(name, c, 1);
        }
    }
    if (failures) { printf("%d check(s) failed\n", failures); return 1; }
    printf("moe tests passed\n");
    return 0;
}
