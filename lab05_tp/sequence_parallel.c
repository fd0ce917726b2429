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
    comm_allgather(tp, slice, s->seq_packed, n, COMM_VALUES); /* packed chunk r = rank r's slice */
    repack(tl, whole, s->seq_packed, B, 0);
}

void sp_reduce_scatter(const tp_layout *tl, comm *tp, const void *whole, void *slice, gpt_grad_scratch *s, int B) {
    const long n = (long)B * tl->g.cfg.seq * tl->g.cfg.d_model;
    repack(tl, (void *)(uintptr_t)whole, s->seq_packed, B, 1); /* reads whole only */
    comm_reduce_scatter(tp, s->seq_packed, slice, n, COMM_VALUES);
}

/* ---- the layer's regions ---------------------------------------------------------------- */

/* TP's f and g become: before a column-parallel linear an all-gather of the
 * LayerNorm's slice (backward: a reduce-scatter of its gradient: each rank's
 * column shard gave a partial dX of the whole sequence), after a row-parallel
 * one a reduce-scatter of the partial sums (backward: an all-gather of the
 * output gradient, of which each rank holds its slice). common/model's layer
 * puts the slices in s->seq_shard and the whole row outputs in s->seq_full. */
static void gather(void *ctx, void *from, void *to, long whole, int B, gpt_grad_scratch *s) {
    const tp_hooks *th = ctx;
    (void)whole;
    sp_allgather(th->tl, th->tp, from, to, s, B);
}

static void scatter(void *ctx, void *from, void *to, long whole, int B, gpt_grad_scratch *s) {
    const tp_hooks *th = ctx;
    (void)whole;
    sp_reduce_scatter(th->tl, th->tp, from, to, s, B);
}

void sp_hooks(gpt_layer_hooks *h) {
    h->enter_forward = gather;
    h->enter_backward = scatter;
    h->exit_forward = scatter;
    h->exit_backward = gather;
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
    comm_allreduce(tp, staging, n, COMM_VALUES, 0);
    visit_partials(tl, lo, hi, grads, staging, 1);
}
