/* Activation bytes (theory.h): the course's exact layout, and the published
 * 16-bit forms. */
#include "theory.h"
#include <math.h>

/* common/model.c's carve(): every piece starts 64-byte aligned (th_pad64).
 * Pieces of the model's values take the precision's bytes (4 or 2:
 * th_param_bytes); the LayerNorm statistics, the losses and the token ids 4 in
 * both. */
/* The options and shape the course's model runs: fp32 or bf16, GPT-2's
 * architecture, whole heads and MLP units per TP rank, and with sequence
 * parallelism whole slices of every sequence (T divisible by t). */
static int course_runs(const th_model *m, const th_opts *o) {
    long t = o->tp > 0 ? o->tp : 1;
    return (o->precision == PREC_FP32 || o->precision == PREC_BF16) && !o->vocab_parallel && m->kv_heads == m->heads &&
           m->ffn == 4 * m->d_model && !m->gated_mlp && m->biases && m->learned_positions && !m->tied_head &&
           m->heads % t == 0 && m->d_model % m->heads == 0 && th_attn_width(m) == (double)m->d_model && (!o->sequence_parallel || m->seq % t == 0) &&
           (o->recompute == RECOMPUTE_NONE || o->recompute == RECOMPUTE_SELECTIVE ||
            o->recompute == RECOMPUTE_FULL) &&
           /* experts as common/moe.c runs them: every layer's MLP E MLPs (ffn_expert hidden units, or the
            * dense ffn), k of them a token */
           (m->experts <= 0 || (m->top_k >= 1 && m->top_k <= m->experts && !m->dense_layers));
}

/* A TP rank's widths inside a layer (heads, attention columns, MLP units), the
 * positions it holds (N = rows x T inside the tensor-parallel regions, Ns on
 * the residual stream: N / t under sequence parallelism, else N) and the bytes
 * of one of the model's values (v: 4 or 2). */
typedef struct { double heads, attn, mlp, B, T, C, V, N, Ns, v; } widths;

static widths local_widths(const th_model *m, const th_opts *o, long rows) {
    long t = o->tp > 0 ? o->tp : 1, heads = m->heads / t;
    double N = (double)rows * m->seq;
    /* experts: fch and GELU hold the k N slots' rows of an expert's width (common/model.c's full_widths) */
    const double slots_per_position = m->experts > 0 ? (double)m->top_k : 1;
    const double mlp = m->experts > 0 ? th_expert_width(m) : (double)(m->ffn / t);
    return (widths){(double)heads, (double)(heads * (m->d_model / m->heads)), mlp * slots_per_position,
                    (double)rows, (double)m->seq, (double)m->d_model, (double)m->vocab, N,
                    o->sequence_parallel ? N / (double)t : N, th_param_bytes(o->precision)};
}

/* With experts (common/moe.h), what a layer adds to its pieces: the router's
 * and dispatch's state, kept where the layer keeps its pieces, and the
 * aux-loss statistics, kept under every --recompute mode. 0 for a dense model. */
static double moe_state_of(const th_model *m, const widths *w) {
    return m->experts > 0 ? th_moe_state_bytes(m, w->B, w->v) : 0;
}

/* n of the model's values, and n fp32 statistics / losses / token ids, as carved */
static double vals(const widths *w, double n) { return th_pad64(w->v * n); }
static double fours(double n) { return th_pad64(4 * n); }

/* One layer's pieces (common/model.c's carve_layer), in bytes, split into
 * the attention matrix and the rest. */
typedef struct { double ln1, qkv, atty, att, res2, ln2, fch, gelu, res3; } layer_pieces;

static layer_pieces pieces_of(const widths *w) {
    return (layer_pieces){.ln1 = vals(w, w->N * w->C) + 2 * fours(w->Ns), /* + mean, rstd */
                          .qkv = vals(w, w->N * 3 * w->attn), .atty = vals(w, w->N * w->attn),
                          .att = vals(w, w->B * w->heads * w->T * w->T), .res2 = vals(w, w->Ns * w->C),
                          .ln2 = vals(w, w->N * w->C) + 2 * fours(w->Ns), .fch = vals(w, w->N * w->mlp),
                          .gelu = vals(w, w->N * w->mlp), .res3 = vals(w, w->Ns * w->C)};
}

static double all_but_att(const layer_pieces *p) {
    return p->ln1 + p->qkv + p->atty + p->res2 + p->ln2 + p->fch + p->gelu + p->res3;
}

th_acts_parts th_course_acts_parts(const th_model *m, const th_opts *o, int lo, int hi, long rows) {
    th_acts_parts r = {-1, -1, -1};
    if (!course_runs(m, o)) return r;
    const widths w = local_widths(m, o, rows);
    const layer_pieces p = pieces_of(&w);
    const double layers = hi - lo;
    /* what a layer keeps for its backward under each --recompute mode */
    double quadratic = p.att, linear = all_but_att(&p) + moe_state_of(m, &w);
    if (o->recompute == RECOMPUTE_SELECTIVE) quadratic = 0;
    if (o->recompute == RECOMPUTE_FULL) { quadratic = 0; linear = p.res3; /* its output only */ }
    linear += th_moe_stats_bytes(m);
    double other = vals(&w, w.Ns * w.C);   /* x_in */
    if (lo == 0) other += fours(w.Ns);     /* tokens */
    if (hi == m->layers)                   /* targets, lnf + mean, rstd, logits, probs, losses */
        other += fours(w.Ns) + vals(&w, w.Ns * w.C) + 2 * fours(w.Ns) + 2 * vals(&w, w.Ns * w.V) + fours(w.Ns);
    r.quadratic = layers * quadratic;
    r.linear = layers * linear;
    r.other = other;
    return r;
}

double th_course_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows) {
    th_acts_parts p = th_course_acts_parts(m, o, lo, hi, rows);
    return p.other < 0 ? -1 : p.quadratic + p.linear + p.other;
}

double th_course_scratch_bytes(const th_model *m, const th_opts *o, long rows) {
    if (!course_runs(m, o)) return -1;
    const widths w = local_widths(m, o, rows);
    const layer_pieces p = pieces_of(&w);
    double bytes = vals(&w, w.Ns * w.C) /* dres */ + vals(&w, w.N * w.C) /* dln */ + vals(&w, w.N * 3 * w.attn) +
                   vals(&w, w.B * w.heads * w.T * w.T) + vals(&w, w.N * w.attn) + vals(&w, w.N * w.mlp) /* dfch */ +
                   /* dGELU; experts: then the slots' input gradients, k N x C (common/moe.c) */
                   vals(&w, w.N * fmax(w.mlp, m->experts > 0 ? (double)m->top_k * w.C : 0)) +
                   vals(&w, w.Ns * w.V) /* dlogits */;
    if (o->sequence_parallel && o->tp > 1) bytes += 2 * vals(&w, w.N * w.C) + vals(&w, w.Ns * w.C); /* staging */
    if (m->experts > 0) bytes += th_moe_scratch_bytes(m, w.B, w.v); /* the slots' dys, the router's backward */
    if (o->recompute == RECOMPUTE_SELECTIVE) bytes += p.att;                  /* the recomputed att */
    if (o->recompute == RECOMPUTE_FULL)                                       /* one whole layer */
        bytes += p.att + all_but_att(&p) + moe_state_of(m, &w) + th_moe_stats_bytes(m);
    return bytes;
}

double th_course_wgrads_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows) {
    if (!course_runs(m, o)) return -1;
    const widths w = local_widths(m, o, rows); /* experts: fch, GELU the k N slots' rows */
    const int experts = m->experts > 0;
    const layer_pieces p = pieces_of(&w);
    double layer = 2 * vals(&w, w.N * w.C)                 /* dres3, dres2: the row-parallel douts, whole */
                 + 2 * vals(&w, w.Ns * w.C)                /* dln1, dln2: the LayerNorms' */
                 + vals(&w, w.N * w.mlp) + vals(&w, w.N * 3 * w.attn); /* dfch, dqkv */
    if (experts) layer += th_moe_scratch_bytes(m, (double)rows, w.v); /* the slots' dys, the router's d logits */
    if (o->recompute == RECOMPUTE_FULL) layer += p.ln1 + p.atty + p.res2 + p.ln2 + p.gelu; /* what W reads */
    if (experts && o->recompute == RECOMPUTE_FULL) layer += moe_state_of(m, &w);
    double bytes = (double)(hi - lo) * layer;
    if (hi == m->layers) bytes += vals(&w, w.Ns * w.V) + vals(&w, w.Ns * w.C); /* dlogits, dlnf */
    if (lo == 0) bytes += vals(&w, w.Ns * w.C);                               /* dx */
    return bytes;
}

double th_sp_partial_params(const th_model *m, int lo, int hi) {
    const double V = (double)m->vocab, T = (double)m->seq, C = (double)m->d_model;
    double n = (double)(hi - lo) * 4 * C;      /* LN1 and LN2, weight and bias */
    if (lo == 0) n += V * C + T * C;           /* wte, wpe */
    if (hi == m->layers) n += 2 * C + V * C;   /* ln_f, the head */
    return n;
}

/* One layer, dense (moe 0) or with experts (moe 1). */
static double published_layer(const th_model *m, const th_opts *o, long b, int moe) {
    const double s = (double)m->seq, h = (double)m->d_model, a = (double)m->heads, B = (double)b;
    const double t = o->tp > 0 ? o->tp : 1, sbh = s * B * h, cp = o->cp > 1 ? o->cp : 1;
    if (o->recompute == RECOMPUTE_FULL) return 2 * sbh / (o->sequence_parallel ? t : 1) / cp; /* the layer's input */
    /* Korthikanti et al. 2022, section 4: LayerNorm inputs 4, the inputs of QKV
     * and of the MLP 2 + 2, two dropout masks 1 + 1: 10 sbh that TP does not
     * split (SP does); Q and K 4, V 2, the projection's input 2: 8 sbh in
     * attention (with GQA K and V shrink by kv/a); the GELU's input and output
     * 2 x 2 x 4h: 16 sbh; the s x s scores, softmax and dropout: 5 a s^2 b. */
    const double attention = s * B * (4 * th_attn_width(m) + 4 * th_kv_width(m)); /* = sbh (4 + 4 kv/a) */
    double mlp = s * B * (double)m->ffn * (m->gated_mlp ? 6 : 4);
    if (moe) { /* k routed + shared experts' MLPs, the k dispatched inputs, the router's probabilities */
        const double Fe = th_expert_width(m), per_run = m->gated_mlp ? 6 : 4;
        const double routed = (double)m->top_k * (per_run - (o->recompute_modules & TH_RECOMPUTE_EXPERT_ACT ? 2 : 0));
        mlp = s * B * ((routed + (double)m->shared_experts * per_run) * Fe + 2.0 * (double)m->top_k * h +
                       4.0 * (double)m->experts);
    }
    const double scores = o->recompute == RECOMPUTE_SELECTIVE ? 0 : (m->dropout ? 5 : 4) * a * s * s * B; /* mask: 1 */
    const double norms_out = o->recompute_modules & TH_RECOMPUTE_NORMS ? 4 * sbh : 0; /* QKV's and the MLP's inputs */
    const double split = attention + mlp + scores, unsplit = (m->dropout ? 10 : 8) * sbh - norms_out; /* masks: 2 sbh */
    return (o->sequence_parallel ? (unsplit + split) / t : unsplit + split / t) / cp;
}

double th_published_layer_acts_bytes(const th_model *m, const th_opts *o, long b) {
    return published_layer(m, o, b, m->experts > 0);
}

double th_published_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long b) {
    const double s = (double)m->seq, h = (double)m->d_model, B = (double)b;
    const double t = o->tp > 0 ? o->tp : 1, sp = o->sequence_parallel ? t : 1, cp = o->cp > 1 ? o->cp : 1;
    const int moe = th_moe_layers(m, lo, hi);
    double bytes = (double)moe * published_layer(m, o, b, 1) + (double)(hi - lo - moe) * published_layer(m, o, b, 0);
    if (lo == 0 && m->dropout) bytes += s * B * h / sp / cp;                     /* embedding dropout mask */
    if (hi == m->layers) bytes += (2 * s * B * h / sp + 4 * s * B * (double)m->vocab / t) / cp; /* lnf, logits */
    return bytes;
}

double th_grad_norm_bytes(int parts) { return 8.0 * parts; }

/* The experts' pieces of a layer (theory.h: EXACT, common/moe.c's buffers) */
double th_moe_state_bytes(const th_model *m, double rows, double v) {
    const double N = rows * (double)m->seq, E = (double)m->experts, k = (double)m->top_k, C = (double)m->d_model;
    const double SF = (double)m->shared_experts * th_expert_width(m); /* the shared experts' units */
    return th_pad64(4 * N * E) + 3 * th_pad64(4 * N * k) + 2 * th_pad64(4 * E) + th_pad64(4 * rows * E) +
           2 * th_pad64(v * N * k * C) +
           (SF > 0 ? 2 * th_pad64(v * N * SF) + th_pad64(v * N * C) : 0); /* their fch, GELU, output */
}

double th_moe_stats_bytes(const th_model *m) { return m->experts > 0 ? th_pad64(4 * (6 + (double)m->experts)) : 0; }

double th_moe_scratch_bytes(const th_model *m, double rows, double v) {
    const double N = rows * (double)m->seq, E = (double)m->experts, k = (double)m->top_k, C = (double)m->d_model;
    const double SF = (double)m->shared_experts * th_expert_width(m);
    return th_pad64(v * N * k * C) + th_pad64(4 * N * k) + th_pad64(4 * N * E) +
           /* the shared experts': B's dout, fc's dout, the dGELU room then their input gradients */
           (SF > 0 ? th_pad64(v * N * C) + th_pad64(v * N * SF) + th_pad64(v * N * fmax(SF, C)) : 0);
}
