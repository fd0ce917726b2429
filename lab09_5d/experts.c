/* lab08's experts on lab09's grid (experts.h). */
#include "experts.h"
#include "device.h"
#include "mem.h"
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
    for (int k = 0; k < RUN_KINDS; k++) {
        free(x->sh.pieces[k]);
        mem_free(x->sh.staging[k]);
    }
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

/* ---- --zero-stage 1: each kind of run sharded over its own group ------------------------------------------ */

/* Where this rank's slice of kind k starts and how much of it is real (the last slice is padded). */
static long slice_start(const expert_shards *sh, int k) { return (long)sh->group[k]->rank * sh->slice[k]; }
static long slice_real(const expert_shards *sh, int k) {
    const long left = sh->n[k] - slice_start(sh, k);
    return left < 0 ? 0 : left < sh->slice[k] ? left : sh->slice[k];
}

/* The part of piece p in this rank's slice of its kind: from its start `from`, n elements, at `at` in the slice. */
static int piece_in_slice(const expert_shards *sh, int k, const run_piece *p, long *from, long *n, long *at) {
    const long s0 = slice_start(sh, k), s1 = s0 + slice_real(sh, k);
    const long a = p->packed > s0 ? p->packed : s0, b = p->packed + p->n < s1 ? p->packed + p->n : s1;
    *from = a - p->packed;
    *n = b - a;
    *at = a - s0;
    return b > a;
}

/* The pieces' values, flat buffer -> packed (or back, unpack). */
static void move_pieces(const expert_shards *sh, int k, void *flat, void *packed, int unpack) {
    const size_t vb = value_bytes();
    for (int i = 0; i < sh->n_pieces[k]; i++) {
        const run_piece *p = &sh->pieces[k][i];
        if (unpack) mem_copy(value_at(flat, p->local), value_at(packed, p->packed), (size_t)p->n * vb);
        else mem_copy(value_at(packed, p->packed), value_at(flat, p->local), (size_t)p->n * vb);
    }
}

/* The fp32 weights AdamW updates for part (k, p, from): the slice's master in bf16, the parameters in fp32. */
static float *master_of(const pipeline_rank *pr, const expert_shards *sh, int k, const run_piece *p, long from, long at) {
    return (void *)pr->master == pr->params ? pr->master + p->local + from : pr->master + sh->kept[k] + at;
}

/* Every rank's updated slices into every rank's parameters: this rank's slice values from the master, the
 * all-gather of each kind over its group, the pieces unpacked. */
static void gather_params(pipeline_rank *pr, expert_shards *sh) {
    long from, n, at;
    for (int k = 0; k < RUN_KINDS; k++) {
        void *mine = value_at(sh->staging[k], slice_start(sh, k));
        for (int i = 0; i < sh->n_pieces[k]; i++)
            if (piece_in_slice(sh, k, &sh->pieces[k][i], &from, &n, &at))
                params_from_master(value_at(mine, at), master_of(pr, sh, k, &sh->pieces[k][i], from, at), n);
        if (sh->group[k]->size > 1) comm_allgather(sh->group[k], mine, sh->staging[k], sh->n[k], COMM_VALUES);
        move_pieces(sh, k, pr->params, sh->staging[k], 1);
    }
}

void grid_experts_zero_init(pipeline_rank *pr, grid_experts *x) {
    expert_shards *sh = &x->sh;
    x->zero = 1;
    sh->group[RUNS_REPLICATED] = x->replicas;
    sh->group[RUNS_EXPERT] = x->edp;
    long at, global, n, kept = 0;
    for (int k = 0; k < RUN_KINDS; k++) /* at most every run in every chunk */
        if (!(sh->pieces[k] = malloc(sizeof(run_piece) * (size_t)pr->v * (size_t)x->n_runs))) die("out of host memory");
    for (int c = 0; c < pr->v; c++)
        for (int r = 0; r < x->n_runs; r++)
            if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n)) {
                const int k = x->runs[r].expert ? RUNS_EXPERT : RUNS_REPLICATED;
                sh->pieces[k][sh->n_pieces[k]++] = (run_piece){pr->offset[c] + at, global, n, sh->n[k], c};
                sh->n[k] += n;
            }
    for (int k = 0; k < RUN_KINDS; k++) {
        sh->slice[k] = comm_chunk(sh->n[k], sh->group[k]->size);
        sh->kept[k] = kept;
        kept += sh->slice[k];
        sh->staging[k] = mem_alloc((size_t)(sh->slice[k] * sh->group[k]->size) * value_bytes(), MEM_WORKSPACE);
    }
    pr->adam_m = mem_alloc((size_t)kept * sizeof(float), MEM_OPTIM);
    pr->adam_v = mem_alloc((size_t)kept * sizeof(float), MEM_OPTIM);
    if ((void *)pr->master != pr->params) { /* bf16: the slices of the whole initial fp32 weights */
        float *whole = pr->master, *mine = mem_alloc((size_t)kept * sizeof(float), MEM_OPTIM);
        long from;
        for (int k = 0; k < RUN_KINDS; k++)
            for (int i = 0; i < sh->n_pieces[k]; i++) {
                const run_piece *p = &sh->pieces[k][i];
                if (piece_in_slice(sh, k, p, &from, &n, &at))
                    mem_copy(mine + sh->kept[k] + at, whole + p->local + from, (size_t)n * sizeof(float));
            }
        mem_free(whole);
        pr->master = mine;
    }
}

void grid_experts_params_from_master(pipeline_rank *pr, grid_experts *x) {
    if (!x->zero) {
        params_from_master(pr->params, pr->master, pr->n);
        return;
    }
    if ((void *)pr->master == pr->params) return; /* fp32: every rank holds (or loaded) the whole parameters */
    const comm_quiet a = comm_quiet_begin(x->sh.group[RUNS_REPLICATED]), b = comm_quiet_begin(x->sh.group[RUNS_EXPERT]);
    gather_params(pr, &x->sh);
    comm_quiet_end(&b);
    comm_quiet_end(&a);
}

void grid_experts_checkpoint_view(const pipeline_rank *pr, const grid_experts *x, ckpt_view *v) {
    long at, global, n;
    if (x->zero) { /* the parameters whole (fp32: the master), the moments and bf16 master of the slices */
        const expert_shards *sh = &x->sh;
        const long kept = sh->kept[RUN_KINDS - 1] + sh->slice[RUN_KINDS - 1];
        const int sliced_master = (void *)pr->master != pr->params;
        ckpt_view_init(v, pr->master, sliced_master ? kept : pr->n, pr->adam_m, pr->adam_v, kept);
        long from;
        for (int k = 0; k < RUN_KINDS; k++)
            for (int i = 0; i < sh->n_pieces[k]; i++) {
                const run_piece *p = &sh->pieces[k][i];
                if (!sliced_master) ckpt_hold_params(v, p->local, p->global, p->n);
                if (!piece_in_slice(sh, k, p, &from, &n, &at)) continue;
                if (sliced_master) ckpt_hold_params(v, sh->kept[k] + at, p->global + from, n);
                ckpt_hold_moments(v, sh->kept[k] + at, p->global + from, n);
            }
        return;
    }
    ckpt_view_init(v, pr->master, pr->n, pr->adam_m, pr->adam_v, pr->n);
    for (int c = 0; c < pr->v; c++)
        for (int r = 0; r < x->n_runs; r++)
            if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n))
                ckpt_hold(v, pr->offset[c] + at, global, n);
}

double grid_experts_optimizer_step(pipeline_rank *pr, grid_experts *x, comm *pipe, const adamw_config *cfg,
                                   double clip, double *grad_norm) {
    const double d = x->replicas->size;
    expert_shards *sh = &x->sh;
    long at, global, n, from;
    /* replicated runs over the replicas, expert runs over their EDP group: sums (ZeRO-1: each kind packed and
     * reduce-scattered, a rank receiving the sum of its slice alone, as lab06's ZeRO-1 does over DP) */
    int ev = trace_begin("grad_sum", TRACE_COMM, -1, NULL);
    if (x->zero)
        for (int k = 0; k < RUN_KINDS; k++) {
            move_pieces(sh, k, pr->grads, sh->staging[k], 0);
            if (sh->group[k]->size > 1)
                comm_reduce_scatter(sh->group[k], sh->staging[k], value_at(sh->staging[k], slice_start(sh, k)),
                                    sh->n[k], COMM_VALUES);
        }
    else
        for (int c = 0; c < pr->v; c++)
            for (int r = 0; r < x->n_runs; r++)
                if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n))
                    comm_allreduce(x->runs[r].expert ? x->edp : x->replicas, value_at(pr->grads, pr->offset[c] + at), n,
                                   COMM_VALUES, 0);
    trace_end(ev);

    ev = trace_begin("grad_norm", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    grad_norm_begin(&x->norm);
    if (x->zero)
        for (int k = 0; k < RUN_KINDS; k++)
            grad_norm_add(&x->norm, k, value_at(sh->staging[k], slice_start(sh, k)), slice_real(sh, k));
    else
        for (int c = 0; c < pr->v; c++)
            for (int r = 0; r < x->n_runs; r++)
                if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n))
                    grad_norm_add(&x->norm, x->runs[r].expert ? RUNS_EXPERT : RUNS_REPLICATED,
                                  value_at(pr->grads, pr->offset[c] + at), n);
    double sums[3];
    grad_norm_read(&x->norm, sums);
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    /* every element once: the replicated parts (the same on every replica) of each stage, the experts
     * of each stage over one EP group (each rank its own E/e of them); ZeRO-1: each rank its slices, disjoint
     * over the replicas and the EDP group; the loss on the last stage */
    sums[2] = pipeline_loss_sum(pr) / pr->m;
    if (x->zero) {
        comm_allreduce_host(x->replicas, &sums[RUNS_REPLICATED], 1);
        comm_allreduce_host(x->edp, &sums[RUNS_EXPERT], 1);
    }
    comm_allreduce_host(x->eh.ep, &sums[RUNS_EXPERT], 1);
    comm_allreduce_host(pipe, sums, 3);
    comm_allreduce_host(x->replicas, &sums[2], 1);

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    t0 = now_seconds();
    /* the sums are d x the mean gradient: its squared norm is 1/d^2 of theirs, and AdamW takes 1/d */
    const double mean_squares = (sums[RUNS_REPLICATED] + sums[RUNS_EXPERT]) / (d * d);
    *grad_norm = sqrt(mean_squares);
    const float scale = clip_scale(mean_squares, (float)clip) / (float)d;
    if (x->zero) {
        for (int k = 0; k < RUN_KINDS; k++)
            for (int i = 0; i < sh->n_pieces[k]; i++) {
                const run_piece *p = &sh->pieces[k][i];
                if (!piece_in_slice(sh, k, p, &from, &n, &at)) continue;
                const long o = sh->kept[k] + at; /* the slice's moments */
                adamw_step(&x->g, cfg, p->global + from, p->global + from + n, master_of(pr, sh, k, p, from, at),
                           value_at(sh->staging[k], slice_start(sh, k) + at), pr->adam_m + o, pr->adam_v + o,
                           pr->chunk[p->chunk].step + 1, scale);
            }
    } else {
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
    }
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    if (x->zero) gather_params(pr, sh); /* ZeRO-1: everyone's updated slices */
    return sums[2] / d;
}
