#include "stage3d.h"
#include "device.h"
#include "mem.h"
#include "sequence_parallel.h"
#include "trace.h"

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

void stage3d_checkpoint_view(pipeline_rank *pr, const tp_layout *tl, ckpt_view *v) {
    ckpt_view_init(v, pr->master, pr->n, pr->adam_m, pr->adam_v, pr->n);
    for (int c = 0; c < pr->v; c++) {
        ckpt_view chunk; /* the chunk alone, its local offsets from its own start */
        const pipeline_stage *st = &pr->chunk[c];
        ckpt_view_init(&chunk, st->master, st->end - st->begin, st->adam_m, st->adam_v, st->end - st->begin);
        tp_checkpoint_hold(tl, pr->chunk[c].lo, pr->chunk[c].hi, &chunk);
        for (int i = 0; i < chunk.params_at.n; i++) {
            const ckpt_run *run = &chunk.params_at.runs[i];
            ckpt_hold_params(v, pr->offset[c] + run->local, run->global, run->n);
        }
        for (int i = 0; i < chunk.moments_at.n; i++) {
            const ckpt_run *run = &chunk.moments_at.runs[i];
            ckpt_hold_moments(v, pr->offset[c] + run->local, run->global, run->n);
        }
        ckpt_view_free(&chunk);
    }
}

/* ---- the step's end ------------------------------------------------------------------ */

double stage3d_optimizer_step(pipeline_rank *pr, stage3d *s, process_grid *g, const adamw_config *cfg,
                              double clip) {
    const tp_layout *tl = s->tl;
    /* SP: the LayerNorms (and embedding, head) of each chunk saw this TP rank's
     * positions only: sum their partial gradients over the TP group first */
    if (tl->seq_parts > 1)
        for (int c = 0; c < pr->v; c++)
            sp_sum_partial_grads(tl, s->tp, pr->chunk[c].lo, pr->chunk[c].hi, pr->chunk[c].grads, s->partial_staging);
    int ev = trace_begin("grad_norm", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    /* The serial norm counts every element of the model once. A rank holds
     *   - its TP shard of its stage's block matrices: different on every TP rank
     *     and every stage, so these squares are summed over TP and PP;
     *   - its stage's replicated tensors (embedding, LayerNorms, row-parallel
     *     biases, head): the same on every TP rank, so summed over PP only;
     * and after the DP all-reduce every replica holds the same gradient, so
     * nothing is summed over DP. The loss lives on the last stage (the same on
     * its TP ranks): summed over PP, averaged over the DP replicas. */
    double sharded = 0, replicated = 0;
    for (int c = 0; c < pr->v; c++) {
        const pipeline_stage *st = &pr->chunk[c];
        double sh, rep;
        tp_grad_squares(tl, &s->norm, st->lo, st->hi, st->grads, &sh, &rep);
        sharded += sh;
        replicated += rep;
    }
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    double over_pp[3] = {sharded, replicated, pipeline_loss_sum(pr) / pr->m};
    comm_allreduce_host(&g->pipe, over_pp, 3);
    comm_allreduce_host(&g->tp, &over_pp[0], 1);
    comm_allreduce_host(&g->dp, &over_pp[2], 1);
    if (tl->seq_parts > 1) { /* each TP rank's loss is that of its positions: the mean over the group */
        comm_allreduce_host(&g->tp, &over_pp[2], 1);
        over_pp[2] /= g->tp.size;
    }

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    t0 = now_seconds();
    float scale = clip_scale(over_pp[0] + over_pp[1], (float)clip);
    for (int c = 0; c < pr->v; c++) {
        pipeline_stage *st = &pr->chunk[c];
        tp_adamw_step(tl, cfg, st->lo, st->hi, st->master, st->grads, st->adam_m, st->adam_v, st->step + 1, scale);
    }
    params_from_master(pr->params, pr->master, pr->n);
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    return over_pp[2] / g->dp.size;
}
