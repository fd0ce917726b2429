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
    return (gpt_part){tl->heads, tl->hidden, tl->seq_parts, tl->seq_parts > 1 ? tl->rank : 0};
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

/* ---- f and g ------------------------------------------------------------------------ */

/* The forward of f and the backward of g do nothing: the replicated input is
 * already on every rank, and so is the gradient of a g output. They exist so the
 * code reads like the diagram. */
void tp_f_forward(comm *tp, const void *x, long n) { (void)tp; (void)x; (void)n; }
void tp_g_backward(comm *tp, const void *dy, long n) { (void)tp; (void)dy; (void)n; }

void tp_f_backward(comm *tp, void *dx, long n) {
    if (tp->size > 1) comm_allreduce(tp, dx, n, 0);
}
void tp_g_forward(comm *tp, void *y, long n) {
    if (tp->size > 1) comm_allreduce(tp, y, n, 0);
}

/* ---- column- and row-parallel linears ----------------------------------------------- */

/* The two that communicate trace their GEMM as a compute event of its own, so
 * the timeline shows compute and all-reduce side by side, never one inside the
 * other (which would count the all-reduce's time as compute). */

void tp_column_parallel_forward(comm *tp, void *out_local, const void *inp, const void *w_local,
                                const void *b_local, int N, int IC, int OC_local) {
    tp_f_forward(tp, inp, (long)N * IC);
    KP->matmul_forward(out_local, inp, w_local, b_local, N, IC, OC_local);
}

void tp_column_parallel_backward(comm *tp, void *dinp, void *dw_local, void *db_local,
                                 const void *dout_local, const void *inp, const void *w_local,
                                 int N, int IC, int OC_local) {
    int ev = trace_begin("tp_column_gemm_bwd", TRACE_COMPUTE, -1, NULL);
    mem_zero(dinp, (size_t)N * IC * value_bytes());
    KP->matmul_backward(dinp, dw_local, db_local, dout_local, inp, w_local, N, IC, OC_local);
    trace_end(ev);
    /* this rank's output columns gave a partial dX; the true dX sums all of them */
    tp_f_backward(tp, dinp, (long)N * IC);
}

void tp_row_parallel_forward(comm *tp, void *out, const void *inp_local, const void *w_local,
                             const void *bias, int N, int IC_local, int OC) {
    int ev = trace_begin("tp_row_gemm", TRACE_COMPUTE, -1, NULL);
    KP->matmul_forward(out, inp_local, w_local, tp->rank == 0 ? bias : NULL, N, IC_local, OC);
    trace_end(ev);
    tp_g_forward(tp, out, (long)N * OC);
}

void tp_row_parallel_backward(comm *tp, void *dinp_local, void *dw_local, void *dbias,
                              const void *dout, const void *inp_local, const void *w_local,
                              int N, int IC_local, int OC) {
    tp_g_backward(tp, dout, (long)N * OC);
    KP->matmul_backward(dinp_local, dw_local, dbias, dout, inp_local, w_local, N, IC_local, OC);
}

/* ---- a layer ------------------------------------------------------------------------ */

#define LP(block, which) value_at(block, tl->layer[which].offset)

static const void *layer_input(const gpt_acts *a, int layer) {
    return layer == a->lo ? a->x_in : a->layer[layer - a->lo - 1].res3;
}

void tp_layer_compute(const tp_layout *tl, comm *tp, const void *lp, const void *x, const layer_acts *la, int B,
                      gpt_grad_scratch *s) {
    if (tl->seq_parts > 1) {
        sp_layer_compute(tl, tp, lp, x, la, B, s);
        return;
    }
    const gpt_config *cfg = &tl->g.cfg;
    int T = cfg->seq, C = cfg->d_model, N = B * T, HS = C / cfg->heads;
    long NC = (long)N * C;

    /* attention: LN1 replicated; f; QKV column-parallel: q, k, v of this rank's
     * H/t heads, attention over them; out-proj row-parallel; g */
    int ev = trace_begin("tp_attention_fwd", TRACE_COMPUTE, -1, NULL);
    KP->layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, x, LP(lp, LAYER_LN1_W), LP(lp, LAYER_LN1_B), N, C);
    tp_column_parallel_forward(tp, la->qkv, la->ln1, LP(lp, LAYER_QKV_W), LP(lp, LAYER_QKV_B), N, C, 3 * tl->width);
    KP->attention_forward(la->atty, la->att, la->qkv, B, T, tl->heads, HS);
    trace_end(ev);
    tp_row_parallel_forward(tp, la->res2, la->atty, LP(lp, LAYER_ATTPROJ_W), LP(lp, LAYER_ATTPROJ_B),
                            N, tl->width, C); /* all-reduce 1 of 2 */

    /* MLP: residual and LN2 replicated; f; fc column-parallel (4C/t units), GELU;
     * fc-proj row-parallel; g */
    ev = trace_begin("tp_mlp_fwd", TRACE_COMPUTE, -1, NULL);
    KP->add(la->res2, la->res2, x, NC);
    KP->layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, LP(lp, LAYER_LN2_W), LP(lp, LAYER_LN2_B), N, C);
    tp_column_parallel_forward(tp, la->fch, la->ln2, LP(lp, LAYER_FC_W), LP(lp, LAYER_FC_B), N, C, tl->hidden);
    KP->gelu_forward(la->fch_gelu, la->fch, (long)N * tl->hidden);
    trace_end(ev);
    tp_row_parallel_forward(tp, la->res3, la->fch_gelu, LP(lp, LAYER_FCPROJ_W), LP(lp, LAYER_FCPROJ_B),
                            N, tl->hidden, C); /* all-reduce 2 of 2 */
    ev = trace_begin("tp_residual_fwd", TRACE_COMPUTE, -1, NULL);
    KP->add(la->res3, la->res3, la->res2, NC);
    trace_end(ev);
}

void tp_layer_forward(const tp_layout *tl, comm *tp, const void *lp, gpt_acts *a, int layer) {
    if (tl->seq_parts > 1 && !a->scratch) die("sequence parallelism: the activations are not bound to a scratch (gpt_acts_bind)");
    layer_acts la = gpt_layer_forward_target(&tl->g, a, layer); /* --recompute decides where */
    tp_layer_compute(tl, tp, lp, layer_input(a, layer), &la, a->B, a->scratch);
}

/* What the layer's backward reads (common/model's rule, gpt_layer_backward_source):
 * selective recomputes att, full the whole forward, collectives included. */
static layer_acts backward_source(const tp_layout *tl, comm *tp, const void *lp, const gpt_acts *a, int layer,
                                  gpt_grad_scratch *s, const layer_acts *keep) {
    if (tl->g.cfg.recompute == GPT_RECOMPUTE_NONE) return a->layer[layer - a->lo];
    int ev = trace_begin("recompute", TRACE_COMPUTE, -1, NULL);
    layer_acts la = gpt_layer_backward_source(&tl->g, a, layer, s, keep, tl->heads);
    trace_end(ev);
    if (tl->g.cfg.recompute == GPT_RECOMPUTE_FULL) tp_layer_compute(tl, tp, lp, layer_input(a, layer), &la, a->B, s);
    return la;
}

void tp_layer_backward(const tp_layout *tl, comm *tp, const void *lp, void *gp, gpt_acts *a,
                       int layer, gpt_grad_scratch *s) {
    const gpt_config *cfg = &tl->g.cfg;
    int B = a->B, T = cfg->seq, C = cfg->d_model, N = B * T, HS = C / cfg->heads;
    const layer_acts source = backward_source(tl, tp, lp, a, layer, s, NULL), *la = &source;
    const void *x = layer_input(a, layer);
    if (tl->seq_parts > 1) {
        sp_layer_backward(tl, tp, lp, gp, x, la, B, s);
        return;
    }

    /* MLP. s->dres, the gradient of res3, is full width and the same on every
     * rank: that is why g's backward is the identity. */
    int ev = trace_begin("tp_mlp_bwd", TRACE_COMPUTE, -1, NULL);
    mem_zero(s->dfch_gelu, (size_t)N * tl->hidden * value_bytes());
    tp_row_parallel_backward(tp, s->dfch_gelu, LP(gp, LAYER_FCPROJ_W), LP(gp, LAYER_FCPROJ_B), s->dres,
                             la->fch_gelu, LP(lp, LAYER_FCPROJ_W), N, tl->hidden, C);
    mem_zero(s->dfch, (size_t)N * tl->hidden * value_bytes());
    KP->gelu_backward(s->dfch, s->dfch_gelu, la->fch, (long)N * tl->hidden);
    trace_end(ev);
    tp_column_parallel_backward(tp, s->dln, LP(gp, LAYER_FC_W), LP(gp, LAYER_FC_B), s->dfch, la->ln2,
                                LP(lp, LAYER_FC_W), N, C, tl->hidden); /* all-reduce 1 of 2 */

    /* From here every rank holds the same full-width gradient again, so the
     * replicated LN2 gains and the out-proj bias get identical gradients. */
    ev = trace_begin("tp_attention_bwd", TRACE_COMPUTE, -1, NULL);
    KP->layernorm_backward(s->dres, LP(gp, LAYER_LN2_W), LP(gp, LAYER_LN2_B), s->dln, la->res2,
                          LP(lp, LAYER_LN2_W), la->ln2_mean, la->ln2_rstd, N, C);
    mem_zero(s->datty, (size_t)N * tl->width * value_bytes());
    tp_row_parallel_backward(tp, s->datty, LP(gp, LAYER_ATTPROJ_W), LP(gp, LAYER_ATTPROJ_B), s->dres,
                             la->atty, LP(lp, LAYER_ATTPROJ_W), N, tl->width, C);
    mem_zero(s->dqkv, (size_t)N * 3 * tl->width * value_bytes());
    KP->attention_backward(s->dqkv, s->datt, s->datty, la->qkv, la->att, B, T, tl->heads, HS);
    trace_end(ev);
    tp_column_parallel_backward(tp, s->dln, LP(gp, LAYER_QKV_W), LP(gp, LAYER_QKV_B), s->dqkv, la->ln1,
                                LP(lp, LAYER_QKV_W), N, C, 3 * tl->width); /* all-reduce 2 of 2 */
    ev = trace_begin("tp_ln1_bwd", TRACE_COMPUTE, -1, NULL);
    KP->layernorm_backward(s->dres, LP(gp, LAYER_LN1_W), LP(gp, LAYER_LN1_B), s->dln, x,
                          LP(lp, LAYER_LN1_W), la->ln1_mean, la->ln1_rstd, N, C);
    trace_end(ev);
}

/* ---- a range of layers -------------------------------------------------------------- */

void tp_forward(const tp_layout *tl, comm *tp, const void *params, gpt_acts *a) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    tp_range(tl, a->lo, a->hi, &begin, &end);
    if (a->lo == 0) {
        int ev = trace_begin("embed_fwd", TRACE_COMPUTE, -1, NULL);
        gpt_embed_forward(g, params, a); /* replicated: the same x on every rank */
        trace_end(ev);
    }
    for (int l = a->lo; l < a->hi; l++) tp_layer_forward(tl, tp, value_at(params, tp_layer_offset(tl, l) - begin), a, l);
    if (a->hi == g->cfg.layers) {
        /* replicated: every rank computes the full logits and the same losses */
        int ev = trace_begin("head_fwd", TRACE_COMPUTE, -1, NULL);
        gpt_head_forward(g, value_at(params, tp_head_offset(tl) - begin), a);
        trace_end(ev);
    }
}

void *tp_backward(const tp_layout *tl, comm *tp, const void *params, void *grads, gpt_acts *a,
                   gpt_grad_scratch *s, const void *dout, float dloss) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    tp_range(tl, a->lo, a->hi, &begin, &end);
    if (a->hi == g->cfg.layers) {
        int ev = trace_begin("head_bwd", TRACE_COMPUTE, -1, NULL);
        long h = tp_head_offset(tl) - begin;
        gpt_head_backward(g, value_at(params, h), value_at(grads, h), a, s, dloss);
        trace_end(ev);
    } else {
        mem_copy(s->dres, dout, (size_t)a->B * a->seq * g->cfg.d_model * value_bytes());
    }
    for (int l = a->hi - 1; l >= a->lo; l--) {
        long o = tp_layer_offset(tl, l) - begin;
        tp_layer_backward(tl, tp, value_at(params, o), value_at(grads, o), a, l, s);
    }
    if (a->lo != 0) return s->dres;
    int ev = trace_begin("embed_bwd", TRACE_COMPUTE, -1, NULL);
    gpt_embed_backward(g, grads, a, s); /* s->dres is full and identical after layer 0's f (SP: this rank's positions) */
    trace_end(ev);
    return NULL;
}

/* ---- the backward in two halves ------------------------------------------------------ */

void tp_wgrads_alloc(gpt_wgrads *w, const tp_layout *tl, int lo, int hi, int B) {
    gpt_part part = tp_part(tl);
    gpt_wgrads_alloc_part(w, &tl->g, lo, hi, B, &part);
}

/* tp_layer_backward without the weight gradients: the same input-gradient
 * GEMMs and the same two all-reduces, the douts kept in w. */
void tp_layer_backward_input(const tp_layout *tl, comm *tp, const void *lp, const gpt_acts *a, int layer,
                             gpt_grad_scratch *s, gpt_wgrads *w) {
    const gpt_config *cfg = &tl->g.cfg;
    int B = a->B, T = cfg->seq, C = cfg->d_model, N = B * T, HS = C / cfg->heads;
    layer_wgrads *lw = &w->layer[layer - a->lo];
    const layer_acts source = backward_source(tl, tp, lp, a, layer, s, &lw->kept), *la = &source;
    const void *x = layer_input(a, layer);
    if (tl->seq_parts > 1) {
        sp_layer_backward_input(tl, tp, lp, x, la, B, s, lw);
        return;
    }
    size_t nc = (size_t)N * C * value_bytes(), nh = (size_t)N * tl->hidden * value_bytes();

    /* MLP: row-parallel fc-proj's input gradient, GELU, column-parallel fc's, then f */
    mem_copy(lw->dres3, s->dres, nc);
    mem_zero(s->dfch_gelu, nh);
    KP->matmul_backward_input(s->dfch_gelu, s->dres, LP(lp, LAYER_FCPROJ_W), N, tl->hidden, C);
    mem_zero(lw->dfch, nh);
    KP->gelu_backward(lw->dfch, s->dfch_gelu, la->fch, (long)N * tl->hidden);
    mem_zero(lw->dln2, nc);
    KP->matmul_backward_input(lw->dln2, lw->dfch, LP(lp, LAYER_FC_W), N, C, tl->hidden);
    tp_f_backward(tp, lw->dln2, (long)N * C); /* all-reduce 1 of 2 */
    KP->layernorm_backward_input(s->dres, lw->dln2, la->res2, LP(lp, LAYER_LN2_W), la->ln2_mean, la->ln2_rstd, N, C);

    /* attention: row-parallel out-proj, attention over this rank's heads, column-parallel qkv, then f */
    mem_copy(lw->dres2, s->dres, nc);
    mem_zero(s->datty, (size_t)N * tl->width * value_bytes());
    KP->matmul_backward_input(s->datty, s->dres, LP(lp, LAYER_ATTPROJ_W), N, tl->width, C);
    mem_zero(lw->dqkv, (size_t)N * 3 * tl->width * value_bytes());
    KP->attention_backward(lw->dqkv, s->datt, s->datty, la->qkv, la->att, B, T, tl->heads, HS);
    mem_zero(lw->dln1, nc);
    KP->matmul_backward_input(lw->dln1, lw->dqkv, LP(lp, LAYER_QKV_W), N, C, 3 * tl->width);
    tp_f_backward(tp, lw->dln1, (long)N * C); /* all-reduce 2 of 2 */
    KP->layernorm_backward_input(s->dres, lw->dln1, x, LP(lp, LAYER_LN1_W), la->ln1_mean, la->ln1_rstd, N, C);
}

/* In tp_layer_backward's order; the replicated tensors (LayerNorms, row-parallel
 * biases) get the same gradient on every TP rank, from the same full douts. */
void tp_layer_backward_weight(const tp_layout *tl, void *gp, const gpt_acts *a, int layer, const gpt_wgrads *w) {
    const gpt_config *cfg = &tl->g.cfg;
    int C = cfg->d_model, N = a->B * cfg->seq, Ns = a->B * a->seq; /* LayerNorms: this rank's positions */
    const layer_acts *la = gpt_layer_weight_source(&tl->g, a, layer, w);
    const layer_wgrads *lw = &w->layer[layer - a->lo];
    KP->matmul_backward_weight(LP(gp, LAYER_FCPROJ_W), LP(gp, LAYER_FCPROJ_B), lw->dres3, la->fch_gelu, N,
                              tl->hidden, C);
    KP->matmul_backward_weight(LP(gp, LAYER_FC_W), LP(gp, LAYER_FC_B), lw->dfch, la->ln2, N, C, tl->hidden);
    KP->layernorm_backward_weight(LP(gp, LAYER_LN2_W), LP(gp, LAYER_LN2_B), lw->dln2, la->res2, la->ln2_mean,
                                  la->ln2_rstd, Ns, C);
    KP->matmul_backward_weight(LP(gp, LAYER_ATTPROJ_W), LP(gp, LAYER_ATTPROJ_B), lw->dres2, la->atty, N, tl->width, C);
    KP->matmul_backward_weight(LP(gp, LAYER_QKV_W), LP(gp, LAYER_QKV_B), lw->dqkv, la->ln1, N, C, 3 * tl->width);
    KP->layernorm_backward_weight(LP(gp, LAYER_LN1_W), LP(gp, LAYER_LN1_B), lw->dln1, layer_input(a, layer),
                                  la->ln1_mean, la->ln1_rstd, Ns, C);
}

void *tp_backward_input(const tp_layout *tl, comm *tp, const void *params, gpt_acts *a, gpt_grad_scratch *s,
                         gpt_wgrads *w, const void *dout, float dloss) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    size_t nc = (size_t)a->B * a->seq * g->cfg.d_model * value_bytes();
    tp_range(tl, a->lo, a->hi, &begin, &end);
    if (a->hi == g->cfg.layers) gpt_head_backward_input(g, value_at(params, tp_head_offset(tl) - begin), a, s, w, dloss);
    else mem_copy(s->dres, dout, nc);
    for (int l = a->hi - 1; l >= a->lo; l--)
        tp_layer_backward_input(tl, tp, value_at(params, tp_layer_offset(tl, l) - begin), a, l, s, w);
    if (a->lo != 0) return s->dres;
    mem_copy(w->dx, s->dres, nc); /* full and identical on every rank after layer 0's f */
    return NULL;
}

void tp_backward_weight(const tp_layout *tl, void *grads, const gpt_acts *a, const gpt_wgrads *w) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    tp_range(tl, a->lo, a->hi, &begin, &end);
    if (a->hi == g->cfg.layers) gpt_head_backward_weight(g, value_at(grads, tp_head_offset(tl) - begin), a, w);
    for (int l = a->hi - 1; l >= a->lo; l--)
        tp_layer_backward_weight(tl, value_at(grads, tp_layer_offset(tl, l) - begin), a, l, w);
    if (a->lo == 0) gpt_embed_backward_weight(g, grads, a, w);
}

/* ---- optimizer and clipping --------------------------------------------------------- */

void tp_grad_squares(const tp_layout *tl, grad_norm *norm, int lo, int hi, const void *grads,
                     double *sharded, double *replicated) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    tp_range(tl, lo, hi, &begin, &end);
    enum { SHARDED, REPLICATED }; /* the parts of norm: two sums, one copy */
    grad_norm_begin(norm);
    if (lo == 0) grad_norm_add(norm, REPLICATED, grads, g->embed_size);
    for (int l = lo; l < hi; l++) {
        const void *gp = value_at(grads, tp_layer_offset(tl, l) - begin);
        for (int i = 0; i < LAYER_NTENSORS; i++)
            grad_norm_add(norm, tl->sharded[i] ? SHARDED : REPLICATED, value_at(gp, tl->layer[i].offset),
                          tl->layer[i].rows * tl->layer[i].cols);
    }
    if (hi == g->cfg.layers) grad_norm_add(norm, REPLICATED, value_at(grads, tp_head_offset(tl) - begin), g->head_size);
    double sums[2];
    grad_norm_read(norm, sums);
    *sharded = sums[SHARDED];
    *replicated = sums[REPLICATED];
}

void tp_adamw_step(const tp_layout *tl, const adamw_config *cfg, int lo, int hi, float *params,
                   const void *grads, float *m, float *v, int t, float grad_scale) {
    const gpt_layout *g = &tl->g;
    long begin, end;
    tp_range(tl, lo, hi, &begin, &end);
    /* embedding and head have the full model's shapes: the shared step does them */
    if (lo == 0) adamw_step(g, cfg, 0, g->embed_size, params, grads, m, v, t, grad_scale);
    for (int l = lo; l < hi; l++) {
        long o = tp_layer_offset(tl, l) - begin;
        for (int i = 0; i < LAYER_NTENSORS; i++) {
            const tensor_info *ti = &tl->layer[i];
            long k = o + ti->offset;
            KP->adamw(params + k, value_at(grads, k), m + k, v + k, ti->rows * ti->cols, cfg->lr, cfg->beta1,
                      cfg->beta2, cfg->eps, ti->decay ? cfg->weight_decay : 0.0f, t, grad_scale);
        }
    }
    if (hi == g->cfg.layers) {
        long h = tp_head_offset(tl) - begin;
        adamw_step(g, cfg, gpt_head_offset(g), g->total, params + h, value_at(grads, h), m + h, v + h, t, grad_scale);
    }
}
