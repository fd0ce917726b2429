/* The experts' figures of a step (experts_metrics.h). */
#include "experts_metrics.h"
#include "moe.h"
#include <stdlib.h>
#include <string.h>

void run_step_experts(run_ctx *ctx, int step, double aux_loss, double dropped) {
    if (!ctx->aux_losses) return;
    ctx->aux_losses[step] = aux_loss;
    ctx->dropped[step] = dropped;
}

void run_experts_load(run_ctx *ctx, const double *counts) {
    if (ctx->expert_load) memcpy(ctx->expert_load, counts, sizeof(double) * (size_t)ctx->opt.experts * ctx->opt.layers);
}

void run_experts_tally_begin(run_experts_tally *t, const gpt_config *c) {
    if (c->experts <= 0) return;
    const size_t cells = (size_t)c->layers * c->experts;
    if (!t->load && !(t->load = malloc(cells * sizeof(double)))) die("out of memory for the expert loads");
    memset(t->load, 0, cells * sizeof(double));
    t->aux_sum = t->dropped = 0;
    t->groups_most = t->groups_sum = t->token_layers = 0;
    t->micro_batches = 0;
}

void run_experts_tally_add(run_experts_tally *t, const gpt_layout *g, const gpt_acts *a) {
    const long E = g->cfg.experts, cells = (a->hi - a->lo) * E;
    if (E <= 0) return;
    t->aux_sum += moe_aux_loss(g, a);
    t->dropped += (double)moe_dropped(g, a);
    double *counts = malloc((size_t)cells * sizeof(double));
    if (!counts) die("out of memory for the expert loads");
    moe_expert_choices(g, a, counts);
    for (long i = 0; i < cells; i++) t->load[a->lo * E + i] += counts[i];
    free(counts);
    if (g->cfg.route_groups > 0) {
        double most, sum;
        moe_groups_reached(g, a, &most, &sum);
        t->groups_most = most > t->groups_most ? most : t->groups_most;
        t->groups_sum += sum;
        t->token_layers += (double)(a->hi - a->lo) * a->B * g->cfg.seq;
    }
    t->micro_batches++;
}

void run_experts_tally_free(run_experts_tally *t) {
    free(t->load);
    memset(t, 0, sizeof *t);
}

/* --balance bias (moe.h): each expert's bias moves by gamma towards the layer's mean load, on the
 * step's choices summed over every rank (the same numbers everywhere: counts, exact in double); and
 * the figures the step line shows */
static void route_step(run_ctx *ctx, const double *load, int step) {
    const int E = ctx->model.experts, L = ctx->model.layers;
    const float gamma = (float)ctx->opt.bias_speed;
    double worst = 0, lo = 0, hi = 0;
    for (int l = 0; l < L; l++) {
        double mean = 0, most = 0;
        for (int e = 0; e < E; e++) mean += load[l * E + e], most = load[l * E + e] > most ? load[l * E + e] : most;
        mean /= E;
        worst = mean > 0 && most / mean > worst ? most / mean : worst;
        for (int e = 0; e < E && ctx->route_bias; e++) {
            float *b = &ctx->route_bias[l * E + e];
            *b += load[l * E + e] < mean ? gamma : load[l * E + e] > mean ? -gamma : 0.0f;
            lo = *b < lo || (l == 0 && e == 0) ? *b : lo;
            hi = *b > hi || (l == 0 && e == 0) ? *b : hi;
        }
    }
    ctx->imbalance[step] = worst;
    ctx->bias_lo[step] = lo;
    ctx->bias_hi[step] = hi;
}

void run_experts_report(run_ctx *ctx, comm *c, const run_experts_tally *t, int n, int replicas, int step) {
    if (!ctx->model.experts) return;
    /* the loads are reported after the last step only: before it, only the aux loss and drops move (with
     * --router or --balance given, every step: the bias moves by them, the step line shows them) */
    const int last = step == ctx->opt.steps - 1;
    const int cells = last || ctx->route_report ? ctx->model.experts * ctx->model.layers : 0;
    /* node-limited routing: the groups reached summed with the token-layers, and a histogram of each
     * rank's most (one rank one count at its most), whose highest filled bin is the most of all ranks */
    const int G = ctx->model.route_groups, extra = G > 0 ? 2 + G + 1 : 0;
    double *sums = calloc((size_t)cells + 2 + (size_t)extra, sizeof(double)); /* aux, dropped, the loads, groups */
    if (!sums) die("out of memory for the expert loads");
    double most = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].micro_batches > 0) sums[0] += t[i].aux_sum / t[i].micro_batches;
        sums[1] += t[i].dropped;
        for (int j = 0; j < cells; j++) sums[2 + j] += t[i].load[j];
        if (extra) {
            sums[2 + cells] += t[i].groups_sum;
            sums[3 + cells] += t[i].token_layers;
            most = t[i].groups_most > most ? t[i].groups_most : most;
        }
    }
    if (extra) sums[4 + cells + (int)most] = 1;
    comm_allreduce_host(c, sums, cells + 2 + extra);
    run_step_experts(ctx, step, sums[0] / replicas, sums[1]);
    if (last) run_experts_load(ctx, sums + 2);
    if (ctx->route_report) route_step(ctx, sums + 2, step);
    if (extra) {
        int top = 0;
        for (int gr = 0; gr <= G; gr++) top = sums[4 + cells + gr] > 0 ? gr : top;
        ctx->groups_most[step] = top;
        ctx->groups_mean[step] = sums[3 + cells] > 0 ? sums[2 + cells] / sums[3 + cells] : 0;
    }
    free(sums);
}

void run_experts_step(run_ctx *ctx, comm *world, const gpt_layout *g, const gpt_acts *a, int step) {
    if (!ctx->model.experts) return;
    run_experts_tally t = {0};
    run_experts_tally_begin(&t, &g->cfg);
    run_experts_tally_add(&t, g, a);
    run_experts_report(ctx, world, &t, 1, world->size, step);
    run_experts_tally_free(&t);
}
