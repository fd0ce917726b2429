#include "tp.h"
#include "sequence_parallel.h"
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "trace.h"
#include <stdlib.h>
#include <string.h>

/* ---- the split ------------------------------------------------------------------- */

void tp_check_degree(run_ctx *ctx, int t, const char *degree_flag) {
    const run_options *o = &ctx->opt;
    if (t < 1) { /* and the rules below would divide by zero */
        run_check(ctx, 0, "%s %d: the tensor-parallel degree must be at least 1", degree_flag, t);
        return;
    }
    /* Whole heads per rank: attention mixes the q, k, v columns of one head, so a
     * head split over two ranks would need their columns put back together. */
    run_check(ctx, o->heads % t == 0,
              "--heads %d is not divisible by the tensor-parallel degree %s %d (each rank computes whole heads)",
              o->heads, degree_flag, t);
    /* Implied by the rule above and --heads dividing --d-model (checked first);
     * kept so the message names the real cause should either rule change. */
    run_check(ctx, (4L * o->d_model) % t == 0,
              "the MLP width 4 x --d-model %d = %ld is not divisible by the tensor-parallel degree %s %d",
              o->d_model, 4L * o->d_model, degree_flag, t);
    run_check(ctx, o->d_model % t == 0, "--d-model %d is not divisible by the tensor-parallel degree %s %d",
              o->d_model, degree_flag, t);
}

void tp_layout_init(tp_layout *tl, const gpt_config *cfg, int degree, int rank) {
    memset(tl, 0, sizeof *tl);
    gpt_layout_init(&tl->g, cfg);
    tl->degree = degree;
    tl->rank = rank;
    long C = cfg->d_model;
    tl->heads = cfg->heads / degree;
    tl->width = (int)(C / degree);
    tl->hidden = (int)(4 * C / degree);
    long shard_rows[LAYER_NTENSORS], shard_cols[LAYER_NTENSORS];
    for (int i = 0; i < LAYER_NTENSORS; i++) {
        shard_rows[i] = tl->g.layer[i].rows;
        shard_cols[i] = tl->g.layer[i].cols;
    }
    /* column-parallel: the output rows of W (and of its bias) are split */
    shard_rows[LAYER_QKV_W] = shard_rows[LAYER_QKV_B] = 3L * tl->width;
    shard_rows[LAYER_FC_W] = shard_rows[LAYER_FC_B] = tl->hidden;
    /* row-parallel: the input columns of W are split; the bias is not (added once) */
    shard_cols[LAYER_ATTPROJ_W] = tl->width;
    shard_cols[LAYER_FCPROJ_W] = tl->hidden;
    long off = 0;
    for (int i = 0; i < LAYER_NTENSORS; i++) {
        tl->layer[i] = tl->g.layer[i];
        tl->layer[i].offset = off;
        tl->layer[i].rows = shard_rows[i];
        tl->layer[i].cols = shard_cols[i];
        tl->sharded[i] = i == LAYER_QKV_W || i == LAYER_QKV_B || i == LAYER_ATTPROJ_W ||
                         i == LAYER_FC_W || i == LAYER_FC_B || i == LAYER_FCPROJ_W;
        off += shard_rows[i] * shard_cols[i];
    }
    tl->layer_size = off;
    tl->total = tl->g.embed_size + (long)cfg->layers * tl->layer_size + tl->g.head_size;
    tl->seq_parts = 1;
}

void tp_layout_sequence_parallel(tp_layout *tl, int on) {
    if (on && tl->g.cfg.seq % tl->degree) die("sequence parallelism: t = %d does not divide seq %d", tl->degree, tl->g.cfg.seq);
    tl->seq_parts = on ? tl->degree : 1;
}

void tp_check_sequence_parallel(run_ctx *ctx, int t, const char *degree_flag) {
    /* every rank holds the same number of positions of every sequence */
    run_check(ctx, t < 1 || ctx->opt.seq % t == 0,
              "--sequence-parallel: --seq %d is not divisible by the tensor-parallel degree %s %d (each rank "
              "holds T/t positions of every sequence)", ctx->opt.seq, degree_flag, t);
}

gpt_part tp_part(const tp_layout *tl) {
    return (gpt_part){tl->heads, tl->hidden, tl->seq_parts, tl->seq_parts > 1 ? tl->rank : 0, 0};
}

long tp_layer_offset(const tp_layout *tl, int layer) {
    return tl->g.embed_size + (long)layer * tl->layer_size;
}
long tp_head_offset(const tp_layout *tl) { return tp_layer_offset(tl, tl->g.cfg.layers); }

void tp_range(const tp_layout *tl, int lo, int hi, long *begin, long *end) {
    *begin = lo == 0 ? 0 : tp_layer_offset(tl, lo);
    *end = hi == tl->g.cfg.layers ? tl->total : tp_layer_offset(tl, hi);
}

long tp_global_index(const tp_layout *tl, int which, long i) {
    long C = tl->g.cfg.d_model, cols = tl->layer[which].cols, row = i / cols, col = i % cols;
    long r = tl->rank, w = tl->width, h = tl->hidden;
    switch (which) {
    case LAYER_QKV_W:
    case LAYER_QKV_B: {
        /* local rows are [q of my heads | k of my heads | v of my heads], which is
         * the q | k | v layout attention expects, over H/t heads */
        long part = row / w, within = row % w;
        return (part * C + r * w + within) * cols + col;
    }
    case LAYER_FC_W:
    case LAYER_FC_B: return (r * h + row) * cols + col;
    case LAYER_ATTPROJ_W: return row * C + r * w + col;
    case LAYER_FCPROJ_W: return row * 4 * C + r * h + col;
    default: return i; /* replicated */
    }
}

void tp_checkpoint_hold(const tp_layout *tl, int lo, int hi, ckpt_view *v) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    tp_range(tl, lo, hi, &begin, &end);
    if (lo == 0) ckpt_hold(v, 0, 0, g->embed_size);
    for (int l = lo; l < hi; l++)
        for (int i = 0; i < LAYER_NTENSORS; i++) {
            long local = tp_layer_offset(tl, l) - begin + tl->layer[i].offset;
            long global = gpt_layer_offset(g, l) + g->layer[i].offset;
            /* element by element; ckpt_hold merges neighbours into runs */
            for (long k = 0; k < tl->layer[i].rows * tl->layer[i].cols; k++)
                ckpt_hold(v, local + k, global + tp_global_index(tl, i, k), 1);
        }
    if (hi == g->cfg.layers) ckpt_hold(v, tp_head_offset(tl) - begin, gpt_head_offset(g), g->head_size);
}

static long replicated_per_layer(const tp_layout *tl) {
    long n = 0;
    for (int i = 0; i < LAYER_NTENSORS; i++)
        if (!tl->sharded[i]) n += tl->layer[i].rows * tl->layer[i].cols;
    return n;
}

long tp_replicated_elems(const tp_layout *tl) {
    return tl->g.embed_size + tl->g.head_size + (long)tl->g.cfg.layers * replicated_per_layer(tl);
}

long tp_sharded_elems(const tp_layout *tl) {
    return (long)tl->g.cfg.layers * (tl->layer_size - replicated_per_layer(tl));
}

void tp_init_params(const tp_layout *tl, uint64_t seed, int lo, int hi, float *dst) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    tp_range(tl, lo, hi, &begin, &end);
    /* embedding and head are replicated: the serial initialisation of their range */
    if (lo == 0) gpt_init_params(g, seed, 0, g->embed_size, dst);
    float *host = malloc((size_t)tl->layer_size * sizeof(float));
    if (!host) die("out of host memory initialising parameters");
    for (int l = lo; l < hi; l++) {
        for (int i = 0; i < LAYER_NTENSORS; i++) {
            const tensor_info *t = &tl->layer[i];
            for (long k = 0; k < t->rows * t->cols; k++)
                host[t->offset + k] = gpt_init_value(g, seed, l, &g->layer[i], tp_global_index(tl, i, k));
        }
        mem_to_device(dst + tp_layer_offset(tl, l) - begin, host, (size_t)tl->layer_size * sizeof(float));
    }
    free(host);
    if (hi == g->cfg.layers) gpt_init_params(g, seed, gpt_head_offset(g), g->total, dst + tp_head_offset(tl) - begin);
}

/* ---- activations and scratch at local widths --------------------------------------- */

void tp_acts_alloc(gpt_acts *a, const tp_layout *tl, int lo, int hi, int B) {
    gpt_part part = tp_part(tl);
    gpt_acts_alloc_part(a, &tl->g, lo, hi, B, &part);
}

void tp_scratch_alloc(gpt_grad_scratch *s, const tp_layout *tl, int B) {
    gpt_part part = tp_part(tl);
    gpt_scratch_alloc_part(s, &tl->g, B, &part);
}

void tp_wgrads_alloc(gpt_wgrads *w, const tp_layout *tl, int lo, int hi, int B) {
    gpt_part part = tp_part(tl);
    gpt_wgrads_alloc_part(w, &tl->g, lo, hi, B, &part);
}

/* ---- the Megatron layer as common/model's hook table --------------------------------- */

/* The row-parallel linears' bias, added by TP rank 0 only, inside its GEMM
 * (the kernel's bias epilogue, no extra pass): added on every rank it would
 * be counted t times by the sum that follows. Its gradient is accumulated on
 * every rank (the default backward): dout is the same on all of them, so the
 * replicated bias gets the same gradient everywhere. */
static void row_parallel_forward(void *ctx, void *out, const void *inp_local, const void *w_local, const void *bias,
                                 int N, int IC_local, int OC) {
    const tp_hooks *th = ctx;
    KP->matmul_forward(out, inp_local, w_local, th->tp->rank == 0 ? bias : NULL, N, IC_local, OC);
}

/* f's backward and g's forward: the all-reduce (sum) of the partial results
 * (each rank's shard gave a partial dX, or a partial Y), in place. f's forward
 * and g's backward are the identity: the replicated input is already on every
 * rank, and so is the gradient of a g output. A group of one moves nothing. */
static void all_reduce(void *ctx, void *from, void *to, long whole, int B, gpt_grad_scratch *s) {
    const tp_hooks *th = ctx;
    if (th->tp->size > 1) comm_allreduce(th->tp, from, whole, COMM_VALUES, 0);
    gpt_region_identity(NULL, from, to, whole, B, s);
}

void tp_hooks_init(tp_hooks *th, const tp_layout *tl, comm *tp) {
    th->tl = tl;
    th->tp = tp;
    th->hooks = gpt_default_hooks(&tl->g); /* column linears, attention, MLP: the one-rank ones at local widths */
    th->hooks.linear_ctx = th->hooks.region_ctx = th; /* TP's slots: the linears and the regions */
    th->hooks.tensors = tl->layer;
    th->hooks.layer_size = tl->layer_size;
    th->hooks.trace = 1;
    th->hooks.row_forward = row_parallel_forward;
    if (tl->seq_parts > 1) {
        sp_hooks(&th->hooks);
    } else {
        th->hooks.enter_forward = gpt_region_identity; /* f */
        th->hooks.enter_backward = all_reduce;
        th->hooks.exit_forward = all_reduce;           /* g */
        th->hooks.exit_backward = gpt_region_identity;
    }
}

/* ---- optimizer and clipping --------------------------------------------------------- */

/* [a, a + n) cut to the window [from, to): the part left, [*x, *y) (empty: *x == *y). */
static int window_cut(long a, long n, long from, long to, long *x, long *y) {
    *x = a > from ? a : from;
    *y = a + n < to ? a + n : to;
    return *y > *x;
}

void tp_grad_squares_window(const tp_layout *tl, grad_norm *norm, int lo, int hi, const void *grads, long from,
                            long to, double *sharded, double *replicated) {
    const gpt_layout *g = &tl->g;
    long begin, end, x, y;
    tp_range(tl, lo, hi, &begin, &end);
    enum { SHARDED, REPLICATED }; /* the parts of norm: two sums, one copy */
    grad_norm_begin(norm);
    if (lo == 0 && window_cut(0, g->embed_size, from, to, &x, &y))
        grad_norm_add(norm, REPLICATED, value_at(grads, x), y - x);
    for (int l = lo; l < hi; l++) {
        const long o = tp_layer_offset(tl, l) - begin;
        for (int i = 0; i < LAYER_NTENSORS; i++)
            if (window_cut(o + tl->layer[i].offset, tl->layer[i].rows * tl->layer[i].cols, from, to, &x, &y))
                grad_norm_add(norm, tl->sharded[i] ? SHARDED : REPLICATED, value_at(grads, x), y - x);
    }
    if (hi == g->cfg.layers && window_cut(tp_head_offset(tl) - begin, g->head_size, from, to, &x, &y))
        grad_norm_add(norm, REPLICATED, value_at(grads, x), y - x);
    double sums[2];
    grad_norm_read(norm, sums);
    *sharded = sums[SHARDED];
    *replicated = sums[REPLICATED];
}

void tp_grad_squares(const tp_layout *tl, grad_norm *norm, int lo, int hi, const void *grads,
                     double *sharded, double *replicated) {
    long begin, end;
    tp_range(tl, lo, hi, &begin, &end);
    tp_grad_squares_window(tl, norm, lo, hi, grads, 0, end - begin, sharded, replicated);
}

void tp_adamw_step_window(const tp_layout *tl, const adamw_config *cfg, int lo, int hi, long from, long to,
                          float *params, const void *grads, float *m, float *v, int t, float grad_scale) {
    const gpt_layout *g = &tl->g;
    long begin, end, x, y;
    tp_range(tl, lo, hi, &begin, &end);
    /* embedding and head have the full model's shapes: the shared step does
     * them (their local offsets differ from the model's by a constant) */
    if (lo == 0 && window_cut(0, g->embed_size, from, to, &x, &y))
        adamw_step(g, cfg, x, y, params + (x - from), value_at(grads, x), m + (x - from), v + (x - from), t,
                   grad_scale);
    for (int l = lo; l < hi; l++) {
        const long o = tp_layer_offset(tl, l) - begin;
        for (int i = 0; i < LAYER_NTENSORS; i++) {
            const tensor_info *ti = &tl->layer[i];
            if (!window_cut(o + ti->offset, ti->rows * ti->cols, from, to, &x, &y)) continue;
            KP->adamw(params + (x - from), value_at(grads, x), m + (x - from), v + (x - from), y - x, cfg->lr,
                      cfg->beta1, cfg->beta2, cfg->eps, ti->decay ? cfg->weight_decay : 0.0f, t, grad_scale);
        }
    }
    const long h = tp_head_offset(tl) - begin, model_h = gpt_head_offset(g);
    if (hi == g->cfg.layers && window_cut(h, g->head_size, from, to, &x, &y))
        adamw_step(g, cfg, model_h + (x - h), model_h + (y - h), params + (x - from), value_at(grads, x),
                   m + (x - from), v + (x - from), t, grad_scale);
}

void tp_adamw_step(const tp_layout *tl, const adamw_config *cfg, int lo, int hi, float *params,
                   const void *grads, float *m, float *v, int t, float grad_scale) {
    long begin, end;
    tp_range(tl, lo, hi, &begin, &end);
    tp_adamw_step_window(tl, cfg, lo, hi, 0, end - begin, params, grads, m, v, t, grad_scale);
}
