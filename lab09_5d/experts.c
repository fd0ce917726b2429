/* lab08's experts on lab09's grid (experts.h). */
#include "experts.h"
#include "device.h"
#include "trace.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void grid_experts_init(grid_experts *x, const gpt_config *cfg, int positions, const moe_split *split, comm *ep,
                       comm *edp, comm *replicas, long rows) {
    memset(x, 0, sizeof *x);
    gpt_layout_init(&x->g, cfg);
    x->g.cfg.seq = positions; /* a CP rank's T/c of every sequence; wpe keeps all T rows */
    ep_hooks_init(&x->eh, &x->g, ep);
    x->eh.split = split;
    x->eh.reserve_rows = ep_received_rows_bound(&x->g.cfg, ep->size, rows, cfg->seq); /* F > 0: sized once */
    x->n_runs = ep_runs(&x->g, x->eh.tensors, x->eh.layer_size, ep->size, ep->rank, NULL);
    x->runs = malloc(sizeof(ep_run) * (size_t)x->n_runs);
    if (!x->runs) die("out of host memory");
    ep_runs(&x->g, x->eh.tensors, x->eh.layer_size, ep->size, ep->rank, x->runs);
    x->edp = edp;
    x->replicas = replicas;
    grad_norm_init(&x->norm, 2);
}

void grid_experts_free(grid_experts *x) {
    grad_norm_free(&x->norm);
    free(x->runs);
    ep_hooks_free(&x->eh);
}

/* The part of run r inside the local range [begin, end): its offset from begin, its global offset, its length. */
static int run_in(const ep_run *r, long begin, long end, long *at, long *global, long *n) {
    const long a = r->local > begin ? r->local : begin, b = r->local + r->n < end ? r->local + r->n : end;
    *at = a - begin;
    *global = r->global + (a - r->local);
    *n = b - a;
    return b > a;
}

static void init_params(void *ctx, uint64_t seed, int lo, int hi, float *dst) {
    const grid_experts *x = ctx;
    long begin, end, at, global, n;
    gpt_range_with(&x->g, &x->eh.hooks, lo, hi, &begin, &end);
    for (int r = 0; r < x->n_runs; r++) /* the values lab01 has at the same global offsets */
        if (run_in(&x->runs[r], begin, end, &at, &global, &n)) gpt_init_params(&x->g, seed, global, global + n, dst + at);
}

stage_model grid_experts_model(grid_experts *x) {
    gpt_part part = gpt_whole_part(&x->g);
    part.mlp_width = 0; /* the experts' hidden rows live in the hook (lab08) */
    return (stage_model){.layer = x->eh.hooks, .part = part, .ctx = x, .init_params = init_params};
}

void grid_experts_checkpoint_view(const pipeline_rank *pr, const grid_experts *x, ckpt_view *v) {
    ckpt_view_init(v, pr->master, pr->n, pr->adam_m, pr->adam_v, pr->n);
    long at, global, n;
    for (int c = 0; c < pr->v; c++)
        for (int r = 0; r < x->n_runs; r++)
            if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n))
                ckpt_hold(v, pr->offset[c] + at, global, n);
}

double grid_experts_optimizer_step(pipeline_rank *pr, grid_experts *x, comm *pipe, const adamw_config *cfg,
                                   double clip, double *grad_norm) {
    const double d = x->replicas->size;
    long at, global, n;
    /* replicated runs over the replicas, expert runs over their EDP group: sums */
    int ev = trace_begin("grad_sum", TRACE_COMM, -1, NULL);
    for (int c = 0; c < pr->v; c++)
        for (int r = 0; r < x->n_runs; r++)
            if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n))
                comm_allreduce(x->runs[r].expert ? x->edp : x->replicas, value_at(pr->grads, pr->offset[c] + at), n, COMM_VALUES, 0);
    trace_end(ev);

    ev = trace_begin("grad_norm", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    enum { REPLICATED, EXPERTS };
    grad_norm_begin(&x->norm);
    for (int c = 0; c < pr->v; c++)
        for (int r = 0; r < x->n_runs; r++)
            if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n))
                grad_norm_add(&x->norm, x->runs[r].expert ? EXPERTS : REPLICATED,
                              value_at(pr->grads, pr->offset[c] + at), n);
    double sums[3];
    grad_norm_read(&x->norm, sums);
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    /* every element once: the replicated parts (the same on every replica) of each stage, the experts
     * of each stage over one EP group (each rank its own E/e of them); the loss on the last stage */
    sums[2] = pipeline_loss_sum(pr) / pr->m;
    comm_allreduce_host(x->eh.ep, &sums[EXPERTS], 1);
    comm_allreduce_host(pipe, sums, 3);
    comm_allreduce_host(x->replicas, &sums[2], 1);

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    t0 = now_seconds();
    /* the sums are d x the mean gradient: its squared norm is 1/d^2 of theirs, and AdamW takes 1/d */
    const double mean_squares = (sums[REPLICATED] + sums[EXPERTS]) / (d * d);
    *grad_norm = sqrt(mean_squares);
    const float scale = clip_scale(mean_squares, (float)clip) / (float)d;
    for (int c = 0; c < pr->v; c++) {
        pipeline_stage *st = &pr->chunk[c];
        for (int r = 0; r < x->n_runs; r++)
            if (run_in(&x->runs[r], st->begin, st->end, &at, &global, &n)) {
                const long o = pr->offset[c] + at;
                adamw_step(&x->g, cfg, global, global + n, pr->master + o, value_at(pr->grads, o), pr->adam_m + o,
                           pr->adam_v + o, st->step + 1, scale);
            }
    }
    params_from_master(pr->params, pr->master, pr->n);
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    return sums[2] / d;
}
