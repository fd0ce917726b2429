/* lab08's experts on lab09's grid (experts.h). */
#include "experts.h"
#include "device.h"
#include "mem.h"
#include "trace.h"
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Which kind of run tensor i of a layer block is (experts.h), at TP degree t. */
static int kind_of(int i, int t) {
    if (i >= LAYER_FC_W && i <= LAYER_FCPROJ_B) return RUNS_EXPERT; /* the four expert tensors (lab08's ep_layout) */
    if (t > 1 && (i == LAYER_QKV_W || i == LAYER_QKV_B || i == LAYER_ATTPROJ_W)) return RUNS_TP_SHARDED;
    return RUNS_REPLICATED;
}

/* Add a run, joined to the last one when it continues it (same kind, next element here and in the model): a
 * replicated tensor to the one before it in the same layer, a TP shard's consecutive elements. */
static void add_run(grid_experts *x, long local, long global, long n, int kind, int join) {
    grid_run *last = x->n_runs > 0 ? &x->runs[x->n_runs - 1] : NULL;
    if (join && last && last->kind == kind && last->local + last->n == local && last->global + last->n == global) {
        last->n += n;
        return;
    }
    grid_run *grown = realloc(x->runs, sizeof(grid_run) * (size_t)(x->n_runs + 1));
    if (!grown) die("out of host memory");
    x->runs = grown;
    x->runs[x->n_runs++] = (grid_run){local, global, n, kind};
}

/* The rank's runs: at t = 1 lab08's (ep_runs); at t > 1 the same cut of the layer block, attention's matrices
 * in the rank's pieces of them (lab05's tp_global_index) */
static void build_runs(grid_experts *x) {
    const gpt_layout *g = &x->g;
    const tensor_info *ts = x->eh.tensors;
    if (!x->tl) {
        const int n = ep_runs(g, ts, x->eh.layer_size, x->eh.N, x->eh.rank, NULL);
        ep_run *runs = malloc(sizeof(ep_run) * (size_t)n);
        if (!runs) die("out of host memory");
        ep_runs(g, ts, x->eh.layer_size, x->eh.N, x->eh.rank, runs);
        for (int r = 0; r < n; r++)
            add_run(x, runs[r].local, runs[r].global, runs[r].n, runs[r].expert ? RUNS_EXPERT : RUNS_REPLICATED, 0);
        free(runs);
        return;
    }
    const long E = g->cfg.experts, local = E / x->eh.N;
    add_run(x, 0, 0, g->embed_size, RUNS_REPLICATED, 0);
    for (int l = 0; l < g->cfg.layers; l++) {
        const long lb = g->embed_size + (long)l * x->eh.layer_size, gb = gpt_layer_offset(g, l);
        for (int i = 0; i < LAYER_NTENSORS; i++) {
            const long n = ts[i].rows * ts[i].cols, at = lb + ts[i].offset, global = gb + g->layer[i].offset;
            if (n == 0) continue;
            const int kind = kind_of(i, x->tl->degree);
            if (kind == RUNS_EXPERT) /* this rank's experts: one run of each tensor */
                add_run(x, at, global + x->eh.rank * local * (g->layer[i].rows / E * g->layer[i].cols), n, kind, 0);
            else if (kind == RUNS_TP_SHARDED) /* a local row is one piece of the model's (lab05's cut) */
                for (long j = 0; j < n; j += ts[i].cols)
                    add_run(x, at + j, global + tp_global_index(x->tl, i, j), ts[i].cols, kind, 1);
            else
                add_run(x, at, global, n, kind, i > 0 && kind_of(i - 1, x->tl->degree) == RUNS_REPLICATED);
        }
    }
    add_run(x, g->embed_size + (long)g->cfg.layers * x->eh.layer_size, gpt_head_offset(g), g->head_size,
            RUNS_REPLICATED, 0);
}

/* The row linear's bias is added by TP rank 0 alone (lab05's row_forward), so its gradient is rank 0's: the
 * other ranks write none, and every replicated tensor's gradient is then a part to sum over the stage (lab05
 * keeps it whole on every rank and sums the norms' partial ones over TP apart). */
static void row_backward_bias_at_rank0(void *ctx, gpt_pass pass, void *dinp, void *dw, void *db, const void *dout,
                                       const void *inp, const void *w, int N, int IC, int OC) {
    const grid_experts *x = (const grid_experts *)((const char *)ctx - offsetof(grid_experts, th)); /* ctx: x->th */
    x->th.hooks.row_backward(ctx, pass, dinp, dw, x->th.tp->rank == 0 ? db : NULL, dout, inp, w, N, IC, OC);
}

/* t > 1: lab05's layer around lab08's slot. Attention's matrices cut as lab05 cuts them (the rank's heads),
 * the linears and regions TP's (SP: all-gather in, reduce-scatter out), the MLP slot on the shard. */
static void plug_tensor_parallel(grid_experts *x, comm *tp) {
    tensor_info *ts = x->eh.tensors;
    long off = 0;
    for (int i = 0; i < LAYER_NTENSORS; i++) {
        if (kind_of(i, x->tl->degree) == RUNS_TP_SHARDED) ts[i].rows = x->tl->layer[i].rows, ts[i].cols = x->tl->layer[i].cols;
        ts[i].offset = off;
        off += ts[i].rows * ts[i].cols;
    }
    x->eh.layer_size = off;
    tp_hooks_init(&x->th, x->tl, tp);
    gpt_layer_hooks *h = &x->eh.hooks;
    const gpt_layer_hooks *tph = &x->th.hooks;
    h->layer_size = off;
    h->linear_ctx = tph->linear_ctx;
    h->column_forward = tph->column_forward, h->column_backward = tph->column_backward;
    h->row_forward = tph->row_forward, h->row_backward = row_backward_bias_at_rank0;
    h->region_ctx = tph->region_ctx;
    h->enter_forward = tph->enter_forward, h->enter_backward = tph->enter_backward;
    h->exit_forward = tph->exit_forward, h->exit_backward = tph->exit_backward;
    h->trace = tph->trace;
    h->mlp_on_shard = 1;
    h->cfg = &x->route; /* the routing's rows: the rank's T/(c t) positions of each */
}

void grid_experts_init(grid_experts *x, const gpt_config *cfg, int positions, const moe_split *split, comm *ep,
                       comm *edp, comm *replicas, long rows, const tp_layout *tl, comm *tp, comm *stage) {
    memset(x, 0, sizeof *x);
    gpt_layout_init(&x->g, cfg);
    x->g.cfg.seq = positions; /* a CP rank's T/c of every sequence; wpe keeps all T rows */
    x->tl = tl && tl->degree > 1 ? tl : NULL;
    if (x->tl && tl->seq_parts != tl->degree) die("lab09: experts beside TP need sequence parallelism");
    x->route = x->g.cfg;
    if (x->tl) x->route.seq = positions / tl->degree;
    ep_hooks_init(&x->eh, &x->g, ep);
    if (x->tl) plug_tensor_parallel(x, tp);
    x->eh.split = split;
    x->eh.reserve_rows = ep_received_rows_bound(&x->route, ep->size, rows, cfg->seq); /* F > 0: sized once */
    build_runs(x);
    x->sh.group[RUNS_REPLICATED] = stage;
    x->sh.group[RUNS_EXPERT] = edp;
    x->sh.group[RUNS_TP_SHARDED] = replicas;
    x->replicas = replicas;
    grad_norm_init(&x->norm, x->tl ? RUN_KINDS : RUNS_TP_SHARDED); /* the kinds that hold elements */
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
static int run_in(const grid_run *r, long begin, long end, long *at, long *global, long *n) {
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
    gpt_part part = x->tl ? tp_part(x->tl) : gpt_whole_part(&x->g); /* t > 1: the rank's heads, its T/(c t) */
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
        if (sh->group[k]->size > 1 && sh->n[k] > 0)
            comm_allgather(sh->group[k], mine, sh->staging[k], sh->n[k], COMM_VALUES);
        move_pieces(sh, k, pr->params, sh->staging[k], 1);
    }
}

void grid_experts_zero_init(pipeline_rank *pr, grid_experts *x) {
    expert_shards *sh = &x->sh;
    x->zero = 1;
    long at, global, n, kept = 0;
    for (int k = 0; k < RUN_KINDS; k++) /* at most every run in every chunk */
        if (!(sh->pieces[k] = malloc(sizeof(run_piece) * (size_t)pr->v * (size_t)x->n_runs))) die("out of host memory");
    for (int c = 0; c < pr->v; c++)
        for (int r = 0; r < x->n_runs; r++)
            if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n)) {
                const int k = x->runs[r].kind;
                sh->pieces[k][sh->n_pieces[k]++] = (run_piece){pr->offset[c] + at, global, n, sh->n[k], c};
                sh->n[k] += n;
            }
    for (int k = 0; k < RUN_KINDS; k++) {
        sh->slice[k] = comm_chunk(sh->n[k], sh->group[k]->size);
        sh->kept[k] = kept;
        kept += sh->slice[k];
        sh->staging[k] = sh->n[k] > 0 ? mem_alloc((size_t)(sh->slice[k] * sh->group[k]->size) * value_bytes(),
                                                   MEM_WORKSPACE) : NULL; /* t = 1: no TP-sharded runs */
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
    comm_quiet q[RUN_KINDS];
    for (int k = 0; k < RUN_KINDS; k++) q[k] = comm_quiet_begin(x->sh.group[k]);
    gather_params(pr, &x->sh);
    for (int k = RUN_KINDS - 1; k >= 0; k--) comm_quiet_end(&q[k]);
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

/* The gradients' sums without ZeRO: a run at a time over its kind's group, a layer's TP-sharded pieces (one
 * local range) at once. */
static void sum_runs(pipeline_rank *pr, grid_experts *x) {
    long at, global, n;
    for (int c = 0; c < pr->v; c++)
        for (int r = 0; r < x->n_runs; r++) {
            if (!run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n)) continue;
            const int kind = x->runs[r].kind;
            if (kind == RUNS_TP_SHARDED) { /* the following pieces that continue this one here */
                long more_at, more_global, more_n;
                while (r + 1 < x->n_runs && x->runs[r + 1].kind == kind &&
                       run_in(&x->runs[r + 1], pr->chunk[c].begin, pr->chunk[c].end, &more_at, &more_global, &more_n) &&
                       more_at == at + n)
                    n += more_n, r++;
            }
            comm_allreduce(x->sh.group[kind], value_at(pr->grads, pr->offset[c] + at), n, COMM_VALUES, 0);
        }
}

double grid_experts_optimizer_step(pipeline_rank *pr, grid_experts *x, comm *pipe, const adamw_config *cfg,
                                   double clip, double *grad_norm) {
    const double d = x->replicas->size;
    expert_shards *sh = &x->sh;
    long at, global, n, from;
    /* each kind over its group (experts.h): sums (ZeRO-1: each kind packed and reduce-scattered, a rank
     * receiving the sum of its slice alone, as lab06's ZeRO-1 does over DP) */
    int ev = trace_begin("grad_sum", TRACE_COMM, -1, NULL);
    if (x->zero)
        for (int k = 0; k < RUN_KINDS; k++) {
            if (sh->n[k] == 0) continue;
            move_pieces(sh, k, pr->grads, sh->staging[k], 0);
            if (sh->group[k]->size > 1)
                comm_reduce_scatter(sh->group[k], sh->staging[k], value_at(sh->staging[k], slice_start(sh, k)),
                                    sh->n[k], COMM_VALUES);
        }
    else
        sum_runs(pr, x);
    trace_end(ev);

    ev = trace_begin("grad_norm", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    grad_norm_begin(&x->norm);
    if (x->zero)
        for (int k = 0; k < RUN_KINDS; k++) {
            if (sh->n[k] > 0) grad_norm_add(&x->norm, k, value_at(sh->staging[k], slice_start(sh, k)), slice_real(sh, k));
        }
    else
        for (int c = 0; c < pr->v; c++)
            for (int r = 0; r < x->n_runs; r++)
                if (run_in(&x->runs[r], pr->chunk[c].begin, pr->chunk[c].end, &at, &global, &n))
                    grad_norm_add(&x->norm, x->runs[r].kind, value_at(pr->grads, pr->offset[c] + at), n);
    double sums[RUN_KINDS + 1] = {0};
    grad_norm_read(&x->norm, sums);
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    /* every element once: each kind's sum is the same on every rank of its group (ZeRO-1: each rank squares its
     * own slices, disjoint over the group: summed over it), and different over the ranks that hold other
     * elements of the stage: the experts over the EP group, attention's shards over TP; the stages over the
     * pipeline; the loss on the last stage */
    const int loss = RUN_KINDS;
    sums[loss] = pipeline_loss_sum(pr) / pr->m;
    if (x->zero)
        for (int k = 0; k < RUN_KINDS; k++)
            if (k != RUNS_TP_SHARDED || x->tl) comm_allreduce_host(sh->group[k], &sums[k], 1);
    comm_allreduce_host(x->eh.ep, &sums[RUNS_EXPERT], 1);
    if (x->tl) comm_allreduce_host(x->th.tp, &sums[RUNS_TP_SHARDED], 1);
    comm_allreduce_host(pipe, sums, RUN_KINDS + 1);
    comm_allreduce_host(x->replicas, &sums[loss], 1);
    if (x->tl) { /* SP: each TP rank's loss is that of its positions: the mean over the group */
        comm_allreduce_host(x->th.tp, &sums[loss], 1);
        sums[loss] /= x->tl->degree;
    }

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    t0 = now_seconds();
    /* the sums are c d x the mean gradient: its squared norm is 1/(c d)^2 of theirs, and AdamW takes 1/(c d) */
    const double mean_squares = (sums[RUNS_REPLICATED] + sums[RUNS_EXPERT] + sums[RUNS_TP_SHARDED]) / (d * d);
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
    return sums[loss] / d;
}
