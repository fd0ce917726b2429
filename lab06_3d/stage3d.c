#include "stage3d.h"
#include "device.h"
#include "dp.h"
#include "mem.h"
#include "sequence_parallel.h"
#include "trace.h"
#include <stdio.h>
#include <string.h>
#include <math.h>

/* ---- the stage's model: lab05's layer, part and initialisation --------------------- */

static void init_params(void *ctx, uint64_t seed, int lo, int hi, float *dst) {
    const stage3d *s = ctx;
    tp_init_params(s->tl, seed, lo, hi, dst);
}

void stage3d_init(stage3d *s, const tp_layout *tl, comm *tp) {
    s->tl = tl;
    s->tp = tp;
    tp_hooks_init(&s->layer, tl, tp);
    s->model = (stage_model){.layer = s->layer.hooks, .part = tp_part(tl), .ctx = s, .init_params = init_params};
    grad_norm_init(&s->norm, 2);
    s->partial_staging = NULL;
}

void stage3d_alloc_partials(stage3d *s, const pipeline_rank *pr) {
    if (s->tl->seq_parts == 1) return;
    long most = 0;
    for (int c = 0; c < pr->v; c++) {
        long n = sp_partial_elems(s->tl, pr->chunk[c].lo, pr->chunk[c].hi);
        if (n > most) most = n;
    }
    s->partial_staging = mem_alloc((size_t)most * value_bytes(), MEM_COMM);
}

void stage3d_free(stage3d *s) {
    mem_free(s->partial_staging);
    grad_norm_free(&s->norm);
}

/* Run [local, local + n) -> global cut to the slice [lo, hi) of the rank's
 * buffer: 0 if they do not meet, else the part left as *at (its offset in a
 * buffer holding the slice alone), *global and *count. */
static int run_in_slice(const ckpt_run *run, long base, long lo, long hi, long *at, long *global, long *count) {
    const long local = base + run->local, a = local > lo ? local : lo, b = local + run->n < hi ? local + run->n : hi;
    *at = a - lo;
    *global = run->global + (a - local);
    *count = b - a;
    return b > a;
}

void stage3d_checkpoint_view(pipeline_rank *pr, const tp_layout *tl, ckpt_view *v) {
    /* the moments, and the master weights unless they are the parameters
     * (fp32), hold the slice [slice_begin, slice_end): all of it unsharded */
    const int sliced_master = (void *)pr->master != pr->params;
    const long lo = pr->slice_begin, hi = pr->slice_end;
    ckpt_view_init(v, pr->master, sliced_master ? hi - lo : pr->n, pr->adam_m, pr->adam_v, hi - lo);
    for (int c = 0; c < pr->v; c++) {
        ckpt_view chunk; /* the chunk alone, its local offsets from its own start */
        const pipeline_stage *st = &pr->chunk[c];
        ckpt_view_init(&chunk, NULL, st->end - st->begin, NULL, NULL, st->end - st->begin);
        tp_checkpoint_hold(tl, pr->chunk[c].lo, pr->chunk[c].hi, &chunk);
        for (int i = 0; i < chunk.params_at.n; i++) {
            const ckpt_run *run = &chunk.params_at.runs[i];
            long at, global, count;
            if (!sliced_master) ckpt_hold_params(v, pr->offset[c] + run->local, run->global, run->n);
            else if (run_in_slice(run, pr->offset[c], lo, hi, &at, &global, &count))
                ckpt_hold_params(v, at, global, count);
        }
        for (int i = 0; i < chunk.moments_at.n; i++) {
            const ckpt_run *run = &chunk.moments_at.runs[i];
            long at, global, count;
            if (run_in_slice(run, pr->offset[c], lo, hi, &at, &global, &count)) ckpt_hold_moments(v, at, global, count);
        }
        ckpt_view_free(&chunk);
    }
}

/* ---- the step's end ------------------------------------------------------------------ */

/* The part of chunk c inside the rank's optimizer slice, in the chunk's local
 * offsets [*from, *to) (unsharded: the whole chunk); 0 when they do not meet. */
static int slice_of_chunk(const pipeline_rank *pr, int c, long *from, long *to) {
    const long o = pr->offset[c], len = pr->chunk[c].end - pr->chunk[c].begin;
    *from = (pr->slice_begin > o ? pr->slice_begin : o) - o;
    *to = (pr->slice_end < o + len ? pr->slice_end : o + len) - o;
    return *to > *from;
}

double stage3d_optimizer_step(pipeline_rank *pr, stage3d *s, process_grid *g, const adamw_config *cfg,
                              double clip, double *grad_norm) {
    const tp_layout *tl = s->tl;
    const int zero = pr->opt_shards > 1;
    const long slice = pr->padded / pr->opt_shards; /* ZeRO-1's slices' length, the last one padded */
    const double d = g->dp->size;
    /* SP: the LayerNorms (and embedding, head) of each chunk saw this TP rank's
     * positions only: sum their partial gradients over the TP group first
     * (ZeRO-1: before the DP sum; over TP then DP is the sum over both) */
    if (tl->seq_parts > 1)
        for (int c = 0; c < pr->v; c++)
            sp_sum_partial_grads(tl, s->tp, pr->chunk[c].lo, pr->chunk[c].hi, pr->chunk[c].grads, s->partial_staging);
    /* ZeRO-1: in place of the DP all-reduce, each replica receives the SUM over
     * the replicas of its slice alone (the slice sits at its own offset of the
     * padded buffer) */
    if (zero) comm_reduce_scatter(g->dp, pr->grads, value_at(pr->grads, (long)pr->opt_shard * slice), pr->n, COMM_VALUES);
    int ev = trace_begin("grad_norm", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    /* The serial norm counts every element of the model once. A rank holds
     *   - its TP shard of its stage's block matrices: different on every TP rank
     *     and every stage, so these squares are summed over TP and PP;
     *   - its stage's replicated tensors (embedding, LayerNorms, row-parallel
     *     biases, head): the same on every TP rank, so summed over PP only;
     * and after the DP all-reduce every replica holds the same gradient, so
     * nothing is summed over DP; under ZeRO-1 each replica squares its own
     * slice, disjoint from the others', so both kinds are summed over DP too.
     * The loss lives on the last stage (the same on its TP ranks): summed over
     * PP, averaged over the DP replicas. */
    double sharded = 0, replicated = 0;
    for (int c = 0; c < pr->v; c++) {
        const pipeline_stage *st = &pr->chunk[c];
        long from, to;
        double sh, rep;
        if (!slice_of_chunk(pr, c, &from, &to)) continue;
        tp_grad_squares_window(tl, &s->norm, st->lo, st->hi, st->grads, from, to, &sh, &rep);
        sharded += sh;
        replicated += rep;
    }
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    double over_pp[3] = {sharded, replicated, pipeline_loss_sum(pr) / pr->m};
    comm_allreduce_host(g->pipe, over_pp, 3);
    if (zero) comm_allreduce_host(g->dp, over_pp, 2);
    comm_allreduce_host(g->tp, &over_pp[0], 1);
    comm_allreduce_host(g->dp, &over_pp[2], 1);
    if (tl->seq_parts > 1) { /* each TP rank's loss is that of its positions: the mean over the group */
        comm_allreduce_host(g->tp, &over_pp[2], 1);
        over_pp[2] /= g->tp->size;
    }

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    t0 = now_seconds();
    /* ZeRO-1's slices hold sums over the replicas: the mean is 1/d of them, its
     * squared norm 1/d^2 of theirs; the 1/d rides in AdamW's gradient scale */
    const double mean_squares = (over_pp[0] + over_pp[1]) / (zero ? (double)d * d : 1.0);
    *grad_norm = sqrt(mean_squares);
    float scale = clip_scale(mean_squares, (float)clip) / (zero ? d : 1);
    float *master = pipeline_slice_master(pr); /* the fp32 weights of the slice (unsharded: all) */
    for (int c = 0; c < pr->v; c++) {
        pipeline_stage *st = &pr->chunk[c];
        long from, to;
        if (!slice_of_chunk(pr, c, &from, &to)) continue;
        const long at = pr->offset[c] + from - pr->slice_begin; /* the window's place in the slice */
        tp_adamw_step_window(tl, cfg, st->lo, st->hi, from, to, master + at, st->grads, pr->adam_m + at,
                             pr->adam_v + at, st->step + 1, scale);
    }
    params_from_master(value_at(pr->params, pr->slice_begin), master, pr->slice_end - pr->slice_begin);
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    /* ZeRO-1: everyone's updated slices (this rank's already sits at its place) */
    if (zero) comm_allgather(g->dp, value_at(pr->params, (long)pr->opt_shard * slice), pr->params, pr->n, COMM_VALUES);
    return over_pp[2] / d;
}

void stage3d_params_from_master(pipeline_rank *pr, process_grid *g) {
    if (pr->opt_shards == 1) {
        params_from_master(pr->params, pr->master, pr->n);
        return;
    }
    if ((void *)pr->master == pr->params) return; /* fp32: every replica loaded the whole parameters */
    const long slice = pr->padded / pr->opt_shards;
    params_from_master(value_at(pr->params, pr->slice_begin), pr->master, pr->slice_end - pr->slice_begin);
    const comm_quiet q = comm_quiet_begin(g->dp);
    comm_allgather(g->dp, value_at(pr->params, (long)pr->opt_shard * slice), pr->params, pr->n, COMM_VALUES);
    comm_quiet_end(&q);
}

/* ---- the run's end -------------------------------------------------------------------- */

double stage3d_evaluate(const run_ctx *ctx, pipeline_rank *pr, process_grid *g, int sequence_parallel, comm *quiet) {
    const comm_quiet tp = comm_quiet_begin(g->tp), cp = comm_quiet_begin(g->cp), other = comm_quiet_begin(quiet);
    double loss = pipeline_evaluate(pr, &ctx->data, ctx->opt.batch, ctx->opt.seq);
    comm_quiet_end(&other);
    comm_quiet_end(&cp);
    comm_quiet_end(&tp);
    comm_allreduce_host(g->dp, &loss, 1);
    if (sequence_parallel) { /* each TP rank's loss is that of its positions */
        comm_allreduce_host(g->tp, &loss, 1);
        loss /= g->tp->size;
    }
    return loss / g->dp->size;
}

int stage3d_replicas_identical(const pipeline_rank *pr, comm *replicas) {
    const float *weights = pr->opt_shards == 1 || (void *)pr->master == pr->params ? pr->master
                                                                                   : (const float *)pr->params;
    const long floats = weights == pr->master ? pr->n : pr->n * (long)value_bytes() / (long)sizeof(float);
    int in_sync = dp_replicas_identical(replicas, weights, floats, 0);
    MPI_Allreduce(MPI_IN_PLACE, &in_sync, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return in_sync;
}

void stage3d_zero1_states(lab_report *r, char *text, int t, int d) {
    const th_opts opts = th_opts_precision(t, g_precision == PREC_BF16);
    const th_states per_elem = th_model_states(1, &opts, 1, d);
    snprintf(text, 64, "%g + %g + %g/%d", per_elem.params, per_elem.grads, th_optim_bytes(opts.precision), d);
    r->run.states_formula[0] = per_elem.params;
    r->run.states_formula[1] = per_elem.grads;
    r->run.states_formula[2] = per_elem.optim;
    r->run.states_formula_text = text;
    r->model_states = 0;
}
