#include "sequence_parallel.h"
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "trace.h"

/* ---- the collectives along the sequence ------------------------------------------- */

/* whole [B][T][C] <-> packed [t][B][T/t][C]: chunk r of packed is rank r's
 * positions [r T/t, (r+1) T/t) of every row, in the slice layout [B,T/t,C]. */
static void repack(const tp_layout *tl, void *whole, void *packed, int B, int to_packed) {
    const long T = tl->g.cfg.seq, C = tl->g.cfg.d_model, t = tl->seq_parts, Tl = T / t;
    const size_t run = (size_t)(Tl * C) * value_bytes();
    int ev = trace_begin("sp_pack", TRACE_COMPUTE, -1, NULL);
    for (long r = 0; r < t; r++)
        for (long b = 0; b < B; b++) {
            void *p = value_at(packed, (r * B + b) * Tl * C), *w = value_at(whole, (b * T + r * Tl) * C);
            if (to_packed) mem_copy(p, w, run);
            else mem_copy(w, p, run);
        }
    trace_end(ev);
}

void sp_allgather(const tp_layout *tl, comm *tp, const void *slice, void *whole, gpt_grad_scratch *s, int B) {
    const long n = (long)B * tl->g.cfg.seq * tl->g.cfg.d_model;
    comm_allgather(tp, slice, s->seq_packed, n); /* packed chunk r = rank r's slice */
    repack(tl, whole, s->seq_packed, B, 0);
}

void sp_reduce_scatter(const tp_layout *tl, comm *tp, const void *whole, void *slice, gpt_grad_scratch *s, int B) {
    const long n = (long)B * tl->g.cfg.seq * tl->g.cfg.d_model;
    repack(tl, (void *)(uintptr_t)whole, s->seq_packed, B, 1); /* reads whole only */
    comm_reduce_scatter(tp, s->seq_packed, slice, n);
}

/* ---- a layer ------------------------------------------------------------------------ */

#define LP(block, which) value_at(block, tl->layer[which].offset)

void sp_layer_compute(const tp_layout *tl, comm *tp, const void *lp, const void *x, const layer_acts *la, int B,
                      gpt_grad_scratch *s) {
    const gpt_config *cfg = &tl->g.cfg;
    const int T = cfg->seq, C = cfg->d_model, N = B * T, Ns = N / tl->seq_parts, HS = C / cfg->heads;
    const int bias_here = tp->rank == 0; /* the row-parallel biases, once, before the sum */

    /* attention: LN1 on this rank's positions; all-gather; QKV column-parallel,
     * attention over H/t heads, out-proj row-parallel on the whole sequence;
     * reduce-scatter back to the slice; + x */
    int ev = trace_begin("sp_ln1_fwd", TRACE_COMPUTE, -1, NULL);
    KP->layernorm_forward(s->seq_shard, la->ln1_mean, la->ln1_rstd, x, LP(lp, LAYER_LN1_W), LP(lp, LAYER_LN1_B), Ns, C);
    trace_end(ev);
    sp_allgather(tl, tp, s->seq_shard, la->ln1, s, B); /* all-gather 1 of 2 */
    ev = trace_begin("tp_attention_fwd", TRACE_COMPUTE, -1, NULL);
    KP->matmul_forward(la->qkv, la->ln1, LP(lp, LAYER_QKV_W), LP(lp, LAYER_QKV_B), N, C, 3 * tl->width);
    KP->attention_forward(la->atty, la->att, la->qkv, B, T, tl->heads, HS);
    KP->matmul_forward(s->seq_full, la->atty, LP(lp, LAYER_ATTPROJ_W), bias_here ? LP(lp, LAYER_ATTPROJ_B) : NULL, N,
                      tl->width, C);
    trace_end(ev);
    sp_reduce_scatter(tl, tp, s->seq_full, la->res2, s, B); /* reduce-scatter 1 of 2 */

    /* MLP: residual and LN2 on the slice; all-gather; fc column-parallel, GELU,
     * fc-proj row-parallel; reduce-scatter; + res2 */
    ev = trace_begin("sp_ln2_fwd", TRACE_COMPUTE, -1, NULL);
    KP->add(la->res2, la->res2, x, (long)Ns * C);
    KP->layernorm_forward(s->seq_shard, la->ln2_mean, la->ln2_rstd, la->res2, LP(lp, LAYER_LN2_W), LP(lp, LAYER_LN2_B),
                         Ns, C);
    trace_end(ev);
    sp_allgather(tl, tp, s->seq_shard, la->ln2, s, B); /* all-gather 2 of 2 */
    ev = trace_begin("tp_mlp_fwd", TRACE_COMPUTE, -1, NULL);
    KP->matmul_forward(la->fch, la->ln2, LP(lp, LAYER_FC_W), LP(lp, LAYER_FC_B), N, C, tl->hidden);
    KP->gelu_forward(la->fch_gelu, la->fch, (long)N * tl->hidden);
    KP->matmul_forward(s->seq_full, la->fch_gelu, LP(lp, LAYER_FCPROJ_W), bias_here ? LP(lp, LAYER_FCPROJ_B) : NULL, N,
                      tl->hidden, C);
    trace_end(ev);
    sp_reduce_scatter(tl, tp, s->seq_full, la->res3, s, B); /* reduce-scatter 2 of 2 */
    ev = trace_begin("tp_residual_fwd", TRACE_COMPUTE, -1, NULL);
    KP->add(la->res3, la->res3, la->res2, (long)Ns * C);
    trace_end(ev);
}

/* The transposes: a forward all-gather's backward is a reduce-scatter of the
 * input gradient (each rank's column shard gave a partial dX of the whole
 * sequence), a forward reduce-scatter's is an all-gather of the output
 * gradient (each rank holds its slice of it). s->dres is the residual
 * gradient of this rank's positions throughout. */
void sp_layer_backward(const tp_layout *tl, comm *tp, const void *lp, void *gp, const void *x,
                       const layer_acts *la, int B, gpt_grad_scratch *s) {
    const gpt_config *cfg = &tl->g.cfg;
    const int T = cfg->seq, C = cfg->d_model, N = B * T, Ns = N / tl->seq_parts, HS = C / cfg->heads;
    const size_t nc = (size_t)N * C * value_bytes(), nh = (size_t)N * tl->hidden * value_bytes();

    /* MLP */
    sp_allgather(tl, tp, s->dres, s->seq_full, s, B); /* the gradient of res3, whole */
    int ev = trace_begin("tp_mlp_bwd", TRACE_COMPUTE, -1, NULL);
    mem_zero(s->dfch_gelu, nh);
    KP->matmul_backward(s->dfch_gelu, LP(gp, LAYER_FCPROJ_W), LP(gp, LAYER_FCPROJ_B), s->seq_full, la->fch_gelu,
                       LP(lp, LAYER_FCPROJ_W), N, tl->hidden, C);
    mem_zero(s->dfch, nh);
    KP->gelu_backward(s->dfch, s->dfch_gelu, la->fch, (long)N * tl->hidden);
    mem_zero(s->dln, nc);
    KP->matmul_backward(s->dln, LP(gp, LAYER_FC_W), LP(gp, LAYER_FC_B), s->dfch, la->ln2, LP(lp, LAYER_FC_W), N, C,
                       tl->hidden);
    trace_end(ev);
    sp_reduce_scatter(tl, tp, s->dln, s->seq_shard, s, B); /* LN2's dout, this rank's positions */
    ev = trace_begin("sp_ln2_bwd", TRACE_COMPUTE, -1, NULL);
    /* LN2's gains and biases from this rank's positions only: partial (sp_sum_partial_grads) */
    KP->layernorm_backward(s->dres, LP(gp, LAYER_LN2_W), LP(gp, LAYER_LN2_B), s->seq_shard, la->res2,
                          LP(lp, LAYER_LN2_W), la->ln2_mean, la->ln2_rstd, Ns, C);
    trace_end(ev);

    /* attention */
    sp_allgather(tl, tp, s->dres, s->seq_full, s, B); /* the gradient of res2, whole */
    ev = trace_begin("tp_attention_bwd", TRACE_COMPUTE, -1, NULL);
    mem_zero(s->datty, (size_t)N * tl->width * value_bytes());
    KP->matmul_backward(s->datty, LP(gp, LAYER_ATTPROJ_W), LP(gp, LAYER_ATTPROJ_B), s->seq_full, la->atty,
                       LP(lp, LAYER_ATTPROJ_W), N, tl->width, C);
    mem_zero(s->dqkv, (size_t)N * 3 * tl->width * value_bytes());
    KP->attention_backward(s->dqkv, s->datt, s->datty, la->qkv, la->att, B, T, tl->heads, HS);
    mem_zero(s->dln, nc);
    KP->matmul_backward(s->dln, LP(gp, LAYER_QKV_W), LP(gp, LAYER_QKV_B), s->dqkv, la->ln1, LP(lp, LAYER_QKV_W), N, C,
                       3 * tl->width);
    trace_end(ev);
    sp_reduce_scatter(tl, tp, s->dln, s->seq_shard, s, B);
    ev = trace_begin("tp_ln1_bwd", TRACE_COMPUTE, -1, NULL);
    KP->layernorm_backward(s->dres, LP(gp, LAYER_LN1_W), LP(gp, LAYER_LN1_B), s->seq_shard, x, LP(lp, LAYER_LN1_W),
                          la->ln1_mean, la->ln1_rstd, Ns, C);
    trace_end(ev);
}

/* sp_layer_backward without the weight gradients; the douts W reads kept in
 * lw: the matmuls' whole (dres3, dres2 all-gathered, dfch, dqkv), the
 * LayerNorms' sliced (dln2, dln1 reduce-scattered). */
void sp_layer_backward_input(const tp_layout *tl, comm *tp, const void *lp, const void *x, const layer_acts *la,
                             int B, gpt_grad_scratch *s, layer_wgrads *lw) {
    const gpt_config *cfg = &tl->g.cfg;
    const int T = cfg->seq, C = cfg->d_model, N = B * T, Ns = N / tl->seq_parts, HS = C / cfg->heads;
    const size_t nc = (size_t)N * C * value_bytes(), nh = (size_t)N * tl->hidden * value_bytes();

    sp_allgather(tl, tp, s->dres, lw->dres3, s, B);
    int ev = trace_begin("tp_mlp_bwd", TRACE_COMPUTE, -1, NULL);
    mem_zero(s->dfch_gelu, nh);
    KP->matmul_backward_input(s->dfch_gelu, lw->dres3, LP(lp, LAYER_FCPROJ_W), N, tl->hidden, C);
    mem_zero(lw->dfch, nh);
    KP->gelu_backward(lw->dfch, s->dfch_gelu, la->fch, (long)N * tl->hidden);
    mem_zero(s->dln, nc);
    KP->matmul_backward_input(s->dln, lw->dfch, LP(lp, LAYER_FC_W), N, C, tl->hidden);
    trace_end(ev);
    sp_reduce_scatter(tl, tp, s->dln, lw->dln2, s, B);
    ev = trace_begin("sp_ln2_bwd", TRACE_COMPUTE, -1, NULL);
    KP->layernorm_backward_input(s->dres, lw->dln2, la->res2, LP(lp, LAYER_LN2_W), la->ln2_mean, la->ln2_rstd, Ns, C);
    trace_end(ev);

    sp_allgather(tl, tp, s->dres, lw->dres2, s, B);
    ev = trace_begin("tp_attention_bwd", TRACE_COMPUTE, -1, NULL);
    mem_zero(s->datty, (size_t)N * tl->width * value_bytes());
    KP->matmul_backward_input(s->datty, lw->dres2, LP(lp, LAYER_ATTPROJ_W), N, tl->width, C);
    mem_zero(lw->dqkv, (size_t)N * 3 * tl->width * value_bytes());
    KP->attention_backward(lw->dqkv, s->datt, s->datty, la->qkv, la->att, B, T, tl->heads, HS);
    mem_zero(s->dln, nc);
    KP->matmul_backward_input(s->dln, lw->dqkv, LP(lp, LAYER_QKV_W), N, C, 3 * tl->width);
    trace_end(ev);
    sp_reduce_scatter(tl, tp, s->dln, lw->dln1, s, B);
    ev = trace_begin("tp_ln1_bwd", TRACE_COMPUTE, -1, NULL);
    KP->layernorm_backward_input(s->dres, lw->dln1, x, LP(lp, LAYER_LN1_W), la->ln1_mean, la->ln1_rstd, Ns, C);
    trace_end(ev);
}

/* ---- the partial gradients of the replicated tensors ------------------------------ */

/* Visit the partial ranges of the local buffer of layers [lo, hi): copy each
 * into staging (pack) or back (unpack); staging NULL only counts. */
static long visit_partials(const tp_layout *tl, int lo, int hi, void *grads, void *staging, int unpack) {
    const gpt_layout *g = &tl->g;
    const long C = g->cfg.d_model;
    long begin, end, n = 0;
    tp_range(tl, lo, hi, &begin, &end);
#define PARTIAL(offset, len)                                                                      \
    do {                                                                                          \
        size_t bytes_ = (size_t)(len) * value_bytes();                                            \
        if (staging && unpack) mem_copy(value_at(grads, offset), value_at(staging, n), bytes_);                   \
        else if (staging) mem_copy(value_at(staging, n), value_at(grads, offset), bytes_);                     \
        n += (len);                                                                               \
    } while (0)
    if (lo == 0) PARTIAL(0, g->embed_size); /* wte, wpe: each rank embedded its own positions */
    for (int l = lo; l < hi; l++) {
        const long o = tp_layer_offset(tl, l) - begin;
        PARTIAL(o + tl->layer[LAYER_LN1_W].offset, 2 * C); /* ln_1 weight and bias, side by side */
        PARTIAL(o + tl->layer[LAYER_LN2_W].offset, 2 * C); /* ln_2 */
    }
    if (hi == g->cfg.layers) PARTIAL(tp_head_offset(tl) - begin, g->head_size); /* ln_f, lm_head: its own positions' loss */
#undef PARTIAL
    return n;
}

long sp_partial_elems(const tp_layout *tl, int lo, int hi) { return visit_partials(tl, lo, hi, NULL, NULL, 0); }

void sp_sum_partial_grads(const tp_layout *tl, comm *tp, int lo, int hi, void *grads, void *staging) {
    if (tp->size <= 1) return;
    long n = visit_partials(tl, lo, hi, grads, staging, 0);
    comm_allreduce(tp, staging, n, 0);
    visit_partials(tl, lo, hi, grads, staging, 1);
}
