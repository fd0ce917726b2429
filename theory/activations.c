/* Activation bytes (theory.h): the course's exact layout, and the published
 * 16-bit forms. */
#include "theory.h"

/* common/model.c's carve(): every piece starts 64-byte aligned. Pieces of the
 * model's values take the precision's bytes (4 or 2: th_param_bytes); the
 * LayerNorm statistics, the losses and the token ids 4 in both. */
static double pad64(double bytes) { return (double)(((long long)bytes + 63) / 64 * 64); }

/* The options and shape the course's model runs: fp32, no SP, no recomputation,
 * GPT-2's architecture, and whole heads and MLP units per TP rank. */
static int course_runs(const th_model *m, const th_opts *o) {
    long t = o->tp > 0 ? o->tp : 1;
    return (o->precision == TH_FP32 || o->precision == TH_BF16) && !o->sequence_parallel && o->recompute == TH_RECOMPUTE_NONE &&
           !o->vocab_parallel && m->kv_heads == m->heads && m->ffn == 4 * m->d_model && !m->gated_mlp &&
           m->biases && m->learned_positions && !m->tied_head && m->heads % t == 0 && m->d_model % m->heads == 0;
}

/* A TP rank's widths inside a layer: heads, attention columns, MLP units. */
typedef struct { double heads, attn, mlp; } widths;

static widths local_widths(const th_model *m, const th_opts *o) {
    long t = o->tp > 0 ? o->tp : 1, heads = m->heads / t;
    return (widths){(double)heads, (double)(heads * (m->d_model / m->heads)), (double)(m->ffn / t)};
}

double th_course_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows) {
    if (!course_runs(m, o)) return -1;
    const widths w = local_widths(m, o);
    const double B = (double)rows, T = (double)m->seq, C = (double)m->d_model, V = (double)m->vocab, N = B * T;
    const int first = lo == 0, last = hi == m->layers;
    const double v = th_param_bytes(o->precision);
    double layer = 4 * pad64(v * N * C)                          /* ln1, res2, ln2, res3 */
                 + 4 * pad64(4 * N)                              /* ln1 and ln2 mean and rstd */
                 + pad64(v * N * 3 * w.attn) + pad64(v * N * w.attn) /* qkv, atty */
                 + pad64(v * B * w.heads * T * T)                /* att */
                 + 2 * pad64(v * N * w.mlp);                     /* fch, fch_gelu */
    double bytes = pad64(v * N * C) /* x_in */ + (double)(hi - lo) * layer;
    if (first) bytes += pad64(4 * N); /* tokens */
    if (last) bytes += pad64(4 * N) /* targets */ + pad64(v * N * C) + 2 * pad64(4 * N) /* lnf, mean, rstd */
                       + 2 * pad64(v * N * V) /* logits, probs */ + pad64(4 * N) /* losses */;
    return bytes;
}

double th_course_scratch_bytes(const th_model *m, const th_opts *o, long rows) {
    if (!course_runs(m, o)) return -1;
    const widths w = local_widths(m, o);
    const double B = (double)rows, T = (double)m->seq, C = (double)m->d_model, V = (double)m->vocab, N = B * T;
    const double v = th_param_bytes(o->precision);
    return 2 * pad64(v * N * C) + pad64(v * N * 3 * w.attn) + pad64(v * N * w.attn) + pad64(v * B * w.heads * T * T) +
           2 * pad64(v * N * w.mlp) + pad64(v * N * V);
}

double th_published_layer_acts_bytes(const th_model *m, const th_opts *o, long b) {
    const double s = (double)m->seq, h = (double)m->d_model, a = (double)m->heads, B = (double)b;
    const double t = o->tp > 0 ? o->tp : 1, sbh = s * B * h;
    if (o->recompute == TH_RECOMPUTE_FULL) return 2 * sbh / (o->sequence_parallel ? t : 1); /* the layer's input */
    /* Korthikanti et al. 2022, section 4: LayerNorm inputs 4, the inputs of QKV
     * and of the MLP 2 + 2, two dropout masks 1 + 1: 10 sbh that TP does not
     * split (SP does); Q and K 4, V 2, the projection's input 2: 8 sbh in
     * attention (with GQA K and V shrink by kv/a); the GELU's input and output
     * 2 x 2 x 4h: 16 sbh; the s x s scores, softmax and dropout: 5 a s^2 b. */
    const double kv = (double)m->kv_heads / a;
    const double attention = sbh * (4 + 4 * kv);
    const double mlp = s * B * (double)m->ffn * (m->gated_mlp ? 6 : 4);
    const double scores = o->recompute == TH_RECOMPUTE_SELECTIVE ? 0 : 5 * a * s * s * B;
    const double split = attention + mlp + scores, unsplit = 10 * sbh;
    return o->sequence_parallel ? (unsplit + split) / t : unsplit + split / t;
}

double th_published_acts_bytes(const th_model *m, const th_opts *o, int lo, int hi, long b) {
    const double s = (double)m->seq, h = (double)m->d_model, B = (double)b;
    const double t = o->tp > 0 ? o->tp : 1, sp = o->sequence_parallel ? t : 1;
    double bytes = (double)(hi - lo) * th_published_layer_acts_bytes(m, o, b);
    if (lo == 0) bytes += s * B * h / sp;                                   /* embedding dropout mask */
    if (hi == m->layers) bytes += 2 * s * B * h / sp + 4 * s * B * (double)m->vocab / t; /* lnf, logits */
    return bytes;
}

double th_grad_norm_bytes(int parts) { return 8.0 * parts; }

double th_course_wgrads_bytes(const th_model *m, const th_opts *o, int lo, int hi, long rows) {
    if (!course_runs(m, o)) return -1;
    const widths w = local_widths(m, o);
    const double N = (double)rows * m->seq, C = (double)m->d_model, V = (double)m->vocab;
    const double v = th_param_bytes(o->precision); /* values: 4, or 2 in bf16 */
    double layer = 4 * pad64(v * N * C) + pad64(v * N * w.mlp) + pad64(v * N * 3 * w.attn); /* dres3 dln2 dres2 dln1, dfch, dqkv */
    double bytes = (double)(hi - lo) * layer;
    if (hi == m->layers) bytes += pad64(v * N * V) + pad64(v * N * C); /* dlogits, dlnf */
    if (lo == 0) bytes += pad64(v * N * C);                           /* dx */
    return bytes;
}
