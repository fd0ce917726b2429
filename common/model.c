#include "model.h"
#include "kernels.h"
#include "mem.h"
#include "device.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- layout ---------------------------------------------------------------- */

static long place(tensor_info *t, const char *name, long *offset, long rows, long cols, int decay) {
    *t = (tensor_info){name, *offset, rows, cols, decay};
    *offset += rows * cols;
    return *offset;
}

void gpt_layout_init(gpt_layout *g, const gpt_config *cfg) {
    memset(g, 0, sizeof *g);
    g->cfg = *cfg;
    long V = cfg->vocab, T = cfg->seq, C = cfg->d_model, off;

    off = 0;
    place(&g->embed[EMBED_WTE], "wte.weight", &off, V, C, 1);
    g->embed_size = place(&g->embed[EMBED_WPE], "wpe.weight", &off, T, C, 1);

    off = 0;
    place(&g->layer[LAYER_LN1_W], "ln_1.weight", &off, C, 1, 0);
    place(&g->layer[LAYER_LN1_B], "ln_1.bias", &off, C, 1, 0);
    place(&g->layer[LAYER_QKV_W], "attn.c_attn.weight", &off, 3 * C, C, 1);
    place(&g->layer[LAYER_QKV_B], "attn.c_attn.bias", &off, 3 * C, 1, 0);
    place(&g->layer[LAYER_ATTPROJ_W], "attn.c_proj.weight", &off, C, C, 1);
    place(&g->layer[LAYER_ATTPROJ_B], "attn.c_proj.bias", &off, C, 1, 0);
    place(&g->layer[LAYER_LN2_W], "ln_2.weight", &off, C, 1, 0);
    place(&g->layer[LAYER_LN2_B], "ln_2.bias", &off, C, 1, 0);
    place(&g->layer[LAYER_FC_W], "mlp.c_fc.weight", &off, 4 * C, C, 1);
    place(&g->layer[LAYER_FC_B], "mlp.c_fc.bias", &off, 4 * C, 1, 0);
    place(&g->layer[LAYER_FCPROJ_W], "mlp.c_proj.weight", &off, C, 4 * C, 1);
    g->layer_size = place(&g->layer[LAYER_FCPROJ_B], "mlp.c_proj.bias", &off, C, 1, 0);

    /* The output head is untied from wte: tying would put one tensor on the
     * first pipeline stage and the last, and its two gradients would have to be
     * summed across stages every step. Untied, every stage owns its parameters
     * outright, which keeps the pipeline labs simple. */
    off = 0;
    place(&g->head[HEAD_LNF_W], "ln_f.weight", &off, C, 1, 0);
    place(&g->head[HEAD_LNF_B], "ln_f.bias", &off, C, 1, 0);
    g->head_size = place(&g->head[HEAD_W], "lm_head.weight", &off, V, C, 1);

    g->total = g->embed_size + (long)cfg->layers * g->layer_size + g->head_size;
}

long gpt_layer_offset(const gpt_layout *g, int layer) {
    return g->embed_size + (long)layer * g->layer_size;
}
long gpt_head_offset(const gpt_layout *g) { return gpt_layer_offset(g, g->cfg.layers); }

void gpt_range(const gpt_layout *g, int lo, int hi, long *begin, long *end) {
    *begin = lo == 0 ? 0 : gpt_layer_offset(g, lo);
    *end = hi == g->cfg.layers ? g->total : gpt_layer_offset(g, hi);
}

void gpt_for_each_tensor(const gpt_layout *g, long begin, long end, tensor_visitor fn, void *ctx) {
    int L = g->cfg.layers;
    for (int blk = -1; blk <= L; blk++) {
        const tensor_info *ts = blk < 0 ? g->embed : blk == L ? g->head : g->layer;
        int n = blk < 0 ? EMBED_NTENSORS : blk == L ? HEAD_NTENSORS : LAYER_NTENSORS;
        long base = blk < 0 ? 0 : gpt_layer_offset(g, blk);
        for (int i = 0; i < n; i++) {
            long lo = base + ts[i].offset, hi = lo + ts[i].rows * ts[i].cols;
            if (hi > begin && lo < end) fn(ctx, &ts[i], lo, blk);
        }
    }
}

/* ---- initialisation -------------------------------------------------------- */

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t a = mix64(mix64(seed * 0x9e3779b97f4a7c15ULL + stream) + 2 * index);
    uint64_t b = mix64(a + 0x632be59bd9b4e019ULL);
    double u1 = ((a >> 11) + 0.5) * 0x1.0p-53, u2 = (b >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)); /* Box-Muller */
}

float gpt_init_value(const gpt_layout *g, uint64_t seed, int layer, const tensor_info *t, long index) {
    if (strstr(t->name, "ln_") && strstr(t->name, ".weight")) return 1.0f; /* LayerNorm gains */
    if (t->cols == 1) return 0.0f;                                         /* biases */
    float std = 0.02f;
    if (strstr(t->name, "c_proj.weight")) std = 0.02f / sqrtf(2.0f * (float)g->cfg.layers);
    /* The stream key names the tensor and its layer, so values do not depend on
     * where the tensor sits in any buffer. */
    const tensor_info *first = layer < 0 ? g->embed : layer == g->cfg.layers ? g->head : g->layer;
    uint64_t stream = (uint64_t)(layer + 2) * 64 + (uint64_t)(t - first);
    return std * rng_normal(seed, stream, (uint64_t)index);
}

typedef struct { const gpt_layout *g; uint64_t seed; long begin, end; float *host; } init_ctx;

static void init_tensor(void *vctx, const tensor_info *t, long offset, int layer) {
    init_ctx *c = vctx;
    long lo = offset > c->begin ? offset : c->begin;
    long hi = offset + t->rows * t->cols < c->end ? offset + t->rows * t->cols : c->end;
    for (long i = lo; i < hi; i++) c->host[i - c->begin] = gpt_init_value(c->g, c->seed, layer, t, i - offset);
}

void gpt_init_params(const gpt_layout *g, uint64_t seed, long begin, long end, float *dst) {
    float *host = malloc((size_t)(end - begin) * sizeof(float) + 1);
    if (!host) die("out of host memory initialising parameters");
    init_ctx c = {g, seed, begin, end, host};
    gpt_for_each_tensor(g, begin, end, init_tensor, &c);
    mem_to_device(dst, host, (size_t)(end - begin) * sizeof(float));
    free(host);
}

void gpt_init_values(const gpt_layout *g, uint64_t seed, long begin, long end, void *dst) {
    if (g_precision == PREC_FP32) {
        gpt_init_params(g, seed, begin, end, dst);
        return;
    }
    float *host = malloc((size_t)(end - begin) * sizeof(float) + 1);
    uint16_t *rounded = malloc((size_t)(end - begin) * sizeof(uint16_t) + 1);
    if (!host || !rounded) die("out of host memory initialising parameters");
    init_ctx c = {g, seed, begin, end, host};
    gpt_for_each_tensor(g, begin, end, init_tensor, &c);
    for (long i = 0; i < end - begin; i++) rounded[i] = bf16_from_float(host[i]);
    mem_to_device(dst, rounded, (size_t)(end - begin) * sizeof(uint16_t));
    free(host);
    free(rounded);
}

/* ---- activations ----------------------------------------------------------- */

/* Carve consecutive pieces of n elements of `size` bytes out of one block; the
 * first pass (block NULL) counts the bytes. Values are value_bytes() each
 * (VALUES), LayerNorm statistics, losses and token ids 4 (FOUR). */
static void *carve(void *block, long *used, long n, size_t size) {
    long at = *used;
    *used += ((long)size * n + 63) / 64 * 64; /* keep every piece 64-byte aligned */
    return block ? (char *)block + at : NULL;
}
#define VALUES value_bytes()
#define FOUR 4

/* Widths inside a layer: all heads and 4C MLP units, or a tensor-parallel
 * rank's share of them (the residual stream stays C wide either way), and the
 * parts the residual stream's positions are split into (sequence parallelism:
 * gpt_part; 1 otherwise). */
typedef struct { long heads, attn, mlp, parts, part; } layer_widths;

static layer_widths full_widths(const gpt_layout *g) {
    return (layer_widths){g->cfg.heads, g->cfg.d_model, 4L * g->cfg.d_model, 1, 0};
}

static layer_widths part_widths(const gpt_layout *g, const gpt_part *p) {
    int parts = p->seq_parts > 1 ? p->seq_parts : 1;
    if (g->cfg.seq % parts) die("gpt_part: %d sequence parts do not divide seq %d", parts, g->cfg.seq);
    return (layer_widths){p->heads, (long)p->heads * (g->cfg.d_model / g->cfg.heads), p->mlp_width, parts,
                          parts > 1 ? p->seq_part : 0};
}

static layer_widths local_widths(const gpt_layout *g, int heads, int mlp_width) {
    gpt_part p = {heads, mlp_width, 1, 0};
    return part_widths(g, &p);
}

const char *const gpt_recompute_names[GPT_RECOMPUTE_MODES] = {"none", "selective", "full"};

int gpt_recompute_parse(const char *name) {
    for (int m = 0; m < GPT_RECOMPUTE_MODES; m++)
        if (!strcmp(name, gpt_recompute_names[m])) return m;
    return -1;
}

/* The pieces of one layer's activations, in the order they are laid out. */
enum {
    LA_LN1 = 1 << 0,   /* ln1 [N,C] and its mean, rstd [Ns] */
    LA_QKV = 1 << 1,   /* qkv [N,3 attn] */
    LA_ATTY = 1 << 2,  /* atty [N,attn] */
    LA_ATT = 1 << 3,   /* att [B,heads,T,T] */
    LA_RES2 = 1 << 4,  /* res2 [Ns,C] */
    LA_LN2 = 1 << 5,   /* ln2 [N,C] and its mean, rstd [Ns] */
    LA_FCH = 1 << 6,   /* fch [N,mlp] */
    LA_GELU = 1 << 7,  /* fch_gelu [N,mlp] */
    LA_RES3 = 1 << 8,  /* res3 [Ns,C], the layer's output */
    LA_ALL = (1 << 9) - 1,
    LA_W_READS = LA_LN1 | LA_ATTY | LA_RES2 | LA_LN2 | LA_GELU /* what the weight half reads */
};

/* Carve the pieces `which` of one layer: N = B x T positions inside the
 * tensor-parallel region, Ns = N / parts on the residual stream. */
static void carve_layer(layer_acts *la, void *block, long *used, const gpt_layout *g, long B, layer_widths w,
                        unsigned which) {
    long T = g->cfg.seq, C = g->cfg.d_model, N = B * T, Ns = N / w.parts;
#define PIECE(flag, field, n, size) la->field = (which & (flag)) ? carve(block, used, (n), (size)) : NULL
    PIECE(LA_LN1, ln1, N * C, VALUES);
    PIECE(LA_LN1, ln1_mean, Ns, FOUR);
    PIECE(LA_LN1, ln1_rstd, Ns, FOUR);
    PIECE(LA_QKV, qkv, N * 3 * w.attn, VALUES);
    PIECE(LA_ATTY, atty, N * w.attn, VALUES);
    PIECE(LA_ATT, att, B * w.heads * T * T, VALUES);
    PIECE(LA_RES2, res2, Ns * C, VALUES);
    PIECE(LA_LN2, ln2, N * C, VALUES);
    PIECE(LA_LN2, ln2_mean, Ns, FOUR);
    PIECE(LA_LN2, ln2_rstd, Ns, FOUR);
    PIECE(LA_FCH, fch, N * w.mlp, VALUES);
    PIECE(LA_GELU, fch_gelu, N * w.mlp, VALUES);
    PIECE(LA_RES3, res3, Ns * C, VALUES);
#undef PIECE
}

/* What a layer keeps for its backward under each --recompute mode. */
static unsigned kept_pieces(const gpt_layout *g) {
    switch (g->cfg.recompute) {
    case GPT_RECOMPUTE_SELECTIVE: return LA_ALL & ~LA_ATT;
    case GPT_RECOMPUTE_FULL: return LA_RES3;
    default: return LA_ALL;
    }
}

static long lay_out_acts(gpt_acts *a, const gpt_layout *g, layer_widths w, void *block) {
    long B = a->B, T = g->cfg.seq, C = g->cfg.d_model, V = g->cfg.vocab;
    long Ns = B * T / w.parts, used = 0;
    int first = a->lo == 0, last = a->hi == g->cfg.layers;
    /* token ids live in the float block as int-sized slots */
    a->tokens = first ? (int *)carve(block, &used, Ns, FOUR) : NULL;
    a->targets = last ? (int *)carve(block, &used, Ns, FOUR) : NULL;
    a->x_in = carve(block, &used, Ns * C, VALUES);
    long layers_start = used, att = 0;
    for (int l = 0; l < a->hi - a->lo; l++) {
        carve_layer(&a->layer[l], block, &used, g, B, w, kept_pieces(g));
        if (a->layer[l].att) att += ((long)VALUES * B * w.heads * T * T + 63) / 64 * 64;
    }
    a->att_bytes = att;
    a->layer_bytes = used - layers_start - att;
    if (last) {
        a->lnf = carve(block, &used, Ns * C, VALUES);
        a->lnf_mean = carve(block, &used, Ns, FOUR);
        a->lnf_rstd = carve(block, &used, Ns, FOUR);
        a->logits = carve(block, &used, Ns * V, VALUES);
        a->probs = carve(block, &used, Ns * V, VALUES);
        a->losses = carve(block, &used, Ns, FOUR);
    } else {
        a->lnf = a->lnf_mean = a->lnf_rstd = a->logits = a->probs = a->losses = NULL;
    }
    return used;
}

static void acts_alloc(gpt_acts *a, const gpt_layout *g, int lo, int hi, int B, layer_widths w) {
    memset(a, 0, sizeof *a);
    a->B = B; a->lo = lo; a->hi = hi;
    a->seq = (int)(g->cfg.seq / w.parts);
    a->seq_first = (int)w.part * a->seq;
    a->layer = calloc((size_t)(hi - lo) + 1, sizeof *a->layer);
    if (!a->layer) die("out of host memory");
    a->bytes = lay_out_acts(a, g, w, NULL);
    a->block = mem_alloc((size_t)a->bytes, MEM_ACTS);
    lay_out_acts(a, g, w, a->block);
}

void gpt_acts_alloc(gpt_acts *a, const gpt_layout *g, int lo, int hi, int B) {
    acts_alloc(a, g, lo, hi, B, full_widths(g));
}

void gpt_acts_alloc_local(gpt_acts *a, const gpt_layout *g, int lo, int hi, int B, int heads, int mlp_width) {
    acts_alloc(a, g, lo, hi, B, local_widths(g, heads, mlp_width));
}

void gpt_acts_alloc_part(gpt_acts *a, const gpt_layout *g, int lo, int hi, int B, const gpt_part *p) {
    acts_alloc(a, g, lo, hi, B, part_widths(g, p));
}

void gpt_acts_free(gpt_acts *a) {
    mem_free(a->block);
    free(a->layer);
    memset(a, 0, sizeof *a);
}

void gpt_acts_bind(gpt_acts *a, gpt_grad_scratch *s) { a->scratch = s; }

void gpt_acts_set_batch(gpt_acts *a, const int *tokens, const int *targets, int T) {
    for (int b = 0; b < a->B; b++) {
        size_t at = (size_t)b * T + (size_t)a->seq_first, n = (size_t)a->seq * sizeof(int);
        if (a->tokens && tokens) mem_to_device(a->tokens + (size_t)b * a->seq, tokens + at, n);
        if (a->targets && targets) mem_to_device(a->targets + (size_t)b * a->seq, targets + at, n);
    }
}

void *gpt_acts_output(const gpt_acts *a) {
    return a->hi > a->lo ? a->layer[a->hi - a->lo - 1].res3 : a->x_in;
}

static long lay_out_scratch(gpt_grad_scratch *s, const gpt_layout *g, int B, layer_widths w, void *block) {
    long T = g->cfg.seq, C = g->cfg.d_model, V = g->cfg.vocab, N = B * T, Ns = N / w.parts;
    long used = 0;
    s->dres = carve(block, &used, Ns * C, VALUES);
    s->dln = carve(block, &used, N * C, VALUES);
    s->dqkv = carve(block, &used, N * 3 * w.attn, VALUES);
    s->datty = carve(block, &used, N * w.attn, VALUES);
    s->datt = carve(block, &used, (long)B * w.heads * T * T, VALUES);
    s->dfch = carve(block, &used, N * w.mlp, VALUES);
    s->dfch_gelu = carve(block, &used, N * w.mlp, VALUES);
    s->dlogits = carve(block, &used, Ns * V, VALUES);
    int split = w.parts > 1;
    s->seq_full = split ? carve(block, &used, N * C, VALUES) : NULL;
    s->seq_packed = split ? carve(block, &used, N * C, VALUES) : NULL;
    s->seq_shard = split ? carve(block, &used, Ns * C, VALUES) : NULL;
    /* the recomputation's one layer: what the layers do not keep (full: all
     * of it, the output too, which the recomputation must not write over the
     * kept one) */
    unsigned work = g->cfg.recompute == GPT_RECOMPUTE_FULL ? LA_ALL : LA_ALL & ~kept_pieces(g);
    carve_layer(&s->work, block, &used, g, B, w, work);
    return used;
}

static void scratch_alloc(gpt_grad_scratch *s, const gpt_layout *g, int B, layer_widths w) {
    long n = lay_out_scratch(s, g, B, w, NULL);
    s->block = mem_alloc((size_t)n, MEM_WORKSPACE);
    lay_out_scratch(s, g, B, w, s->block);
}

void gpt_scratch_alloc(gpt_grad_scratch *s, const gpt_layout *g, int B) { scratch_alloc(s, g, B, full_widths(g)); }

void gpt_scratch_alloc_local(gpt_grad_scratch *s, const gpt_layout *g, int B, int heads, int mlp_width) {
    scratch_alloc(s, g, B, local_widths(g, heads, mlp_width));
}

void gpt_scratch_alloc_part(gpt_grad_scratch *s, const gpt_layout *g, int B, const gpt_part *p) {
    scratch_alloc(s, g, B, part_widths(g, p));
}

void gpt_scratch_free(gpt_grad_scratch *s) {
    mem_free(s->block);
    memset(s, 0, sizeof *s);
}

/* ---- forward ----------------------------------------------------------------- */

#define P(block, which) value_at(block, g->layer[which].offset)

/* The block's positions: B rows of a->seq (all T, or a sequence-parallel slice). */
static long block_tokens(const gpt_acts *a) { return (long)a->B * a->seq; }

void gpt_embed_forward(const gpt_layout *g, const void *ep, gpt_acts *a) {
    int C = g->cfg.d_model; /* a slice of the positions adds its own rows of wpe */
    KP->encoder_forward(a->x_in, a->tokens, value_at(ep, g->embed[EMBED_WTE].offset),
                        value_at(ep, g->embed[EMBED_WPE].offset + (long)a->seq_first * C), a->B, a->seq, C);
}

/* The input of `layer`: the previous layer's output, or x_in for the first. */
static const void *layer_input(const gpt_acts *a, int layer) {
    return layer == a->lo ? a->x_in : a->layer[layer - a->lo - 1].res3;
}

static const layer_acts *bound_work(const gpt_layout *g, const gpt_acts *a) {
    if (!a->scratch)
        die("--recompute %s: the forward puts what a layer does not keep in the stage's scratch, and this "
            "block has none (gpt_acts_bind)", gpt_recompute_names[g->cfg.recompute]);
    return &a->scratch->work;
}

layer_acts gpt_layer_forward_target(const gpt_layout *g, const gpt_acts *a, int layer) {
    layer_acts la = a->layer[layer - a->lo];
    if (g->cfg.recompute == GPT_RECOMPUTE_SELECTIVE) {
        la.att = bound_work(g, a)->att; /* computed, used by the attention output, not kept */
    } else if (g->cfg.recompute == GPT_RECOMPUTE_FULL) {
        void *output = la.res3; /* the one piece kept: the next layer's input */
        la = *bound_work(g, a);
        la.res3 = output;
    }
    return la;
}

layer_acts gpt_layer_backward_source(const gpt_layout *g, const gpt_acts *a, int layer, gpt_grad_scratch *s,
                                     const layer_acts *keep, int heads) {
    layer_acts la = a->layer[layer - a->lo];
    if (g->cfg.recompute == GPT_RECOMPUTE_SELECTIVE) {
        /* att from the kept q and k, the forward's kernel on the forward's
         * inputs: the same bits. Its output (att v) is not needed: s->datty
         * takes it and is overwritten before the backward reads it. */
        la.att = s->work.att;
        KP->attention_forward(s->datty, la.att, la.qkv, a->B, g->cfg.seq, heads, g->cfg.d_model / g->cfg.heads);
    } else if (g->cfg.recompute == GPT_RECOMPUTE_FULL) {
        la = s->work;
        if (keep) {
            la.ln1 = keep->ln1; la.ln1_mean = keep->ln1_mean; la.ln1_rstd = keep->ln1_rstd;
            la.atty = keep->atty; la.res2 = keep->res2;
            la.ln2 = keep->ln2; la.ln2_mean = keep->ln2_mean; la.ln2_rstd = keep->ln2_rstd;
            la.fch_gelu = keep->fch_gelu;
        }
    }
    return la;
}

/* One layer's forward from x into la (B rows of T positions). */
static void layer_compute(const gpt_layout *g, const void *lp, const void *x, const layer_acts *la, int B) {
    int T = g->cfg.seq, C = g->cfg.d_model, NH = g->cfg.heads, N = B * T;
    KP->layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, x, P(lp, LAYER_LN1_W), P(lp, LAYER_LN1_B), N, C);
    KP->matmul_forward(la->qkv, la->ln1, P(lp, LAYER_QKV_W), P(lp, LAYER_QKV_B), N, C, 3 * C);
    KP->attention_forward(la->atty, la->att, la->qkv, B, T, NH, C / NH);
    KP->matmul_forward(la->res2, la->atty, P(lp, LAYER_ATTPROJ_W), P(lp, LAYER_ATTPROJ_B), N, C, C);
    KP->add(la->res2, la->res2, x, (long)N * C);
    KP->layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, P(lp, LAYER_LN2_W), P(lp, LAYER_LN2_B), N, C);
    KP->matmul_forward(la->fch, la->ln2, P(lp, LAYER_FC_W), P(lp, LAYER_FC_B), N, C, 4 * C);
    KP->gelu_forward(la->fch_gelu, la->fch, (long)N * 4 * C);
    KP->matmul_forward(la->res3, la->fch_gelu, P(lp, LAYER_FCPROJ_W), P(lp, LAYER_FCPROJ_B), N, 4 * C, C);
    KP->add(la->res3, la->res3, la->res2, (long)N * C);
}

void gpt_layer_forward(const gpt_layout *g, const void *lp, gpt_acts *a, int layer) {
    layer_acts la = gpt_layer_forward_target(g, a, layer);
    layer_compute(g, lp, layer_input(a, layer), &la, a->B);
}

void gpt_head_forward(const gpt_layout *g, const void *hp, gpt_acts *a) {
    int C = g->cfg.d_model, V = g->cfg.vocab, N = (int)block_tokens(a);
    KP->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, gpt_acts_output(a), value_at(hp, g->head[HEAD_LNF_W].offset),
                          value_at(hp, g->head[HEAD_LNF_B].offset), N, C);
    KP->matmul_forward(a->logits, a->lnf, value_at(hp, g->head[HEAD_W].offset), NULL, N, C, V);
    KP->crossentropy_forward(a->losses, a->probs, a->logits, a->targets, N, V);
}

void gpt_forward(const gpt_layout *g, const void *params, gpt_acts *a) {
    long begin, end;
    gpt_range(g, a->lo, a->hi, &begin, &end);
    if (a->lo == 0) gpt_embed_forward(g, params, a);
    for (int l = a->lo; l < a->hi; l++) gpt_layer_forward(g, value_at(params, gpt_layer_offset(g, l) - begin), a, l);
    if (a->hi == g->cfg.layers) gpt_head_forward(g, value_at(params, gpt_head_offset(g) - begin), a);
}

/* ---- backward ---------------------------------------------------------------- */

void gpt_head_backward(const gpt_layout *g, const void *hp, void *hg, gpt_acts *a,
                       gpt_grad_scratch *s, float dloss) {
    int C = g->cfg.d_model, V = g->cfg.vocab, N = (int)block_tokens(a);
    size_t nc = (size_t)N * C * value_bytes();
    KP->crossentropy_backward(s->dlogits, a->probs, a->targets, dloss, N, V);
    mem_zero(s->dln, nc);
    KP->matmul_backward(s->dln, value_at(hg, g->head[HEAD_W].offset), NULL, s->dlogits, a->lnf,
                        value_at(hp, g->head[HEAD_W].offset), N, C, V);
    mem_zero(s->dres, nc);
    KP->layernorm_backward(s->dres, value_at(hg, g->head[HEAD_LNF_W].offset), value_at(hg, g->head[HEAD_LNF_B].offset),
                           s->dln, gpt_acts_output(a), value_at(hp, g->head[HEAD_LNF_W].offset),
                           a->lnf_mean, a->lnf_rstd, N, C);
}

void gpt_layer_backward(const gpt_layout *g, const void *lp, void *gp, gpt_acts *a, int layer,
                        gpt_grad_scratch *s) {
    int B = a->B, T = g->cfg.seq, C = g->cfg.d_model, NH = g->cfg.heads, N = B * T;
    const void *x = layer_input(a, layer);
    layer_acts recomputed = gpt_layer_backward_source(g, a, layer, s, NULL, NH);
    if (g->cfg.recompute == GPT_RECOMPUTE_FULL) layer_compute(g, lp, x, &recomputed, B); /* the forward again */
    const layer_acts *la = &recomputed;
    size_t nc = (size_t)N * C * value_bytes(), n4c = 4 * nc;
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    mem_zero(s->dfch_gelu, n4c);
    KP->matmul_backward(s->dfch_gelu, P(gp, LAYER_FCPROJ_W), P(gp, LAYER_FCPROJ_B), s->dres,
                       la->fch_gelu, P(lp, LAYER_FCPROJ_W), N, 4 * C, C);
    mem_zero(s->dfch, n4c);
    KP->gelu_backward(s->dfch, s->dfch_gelu, la->fch, (long)N * 4 * C);
    mem_zero(s->dln, nc);
    KP->matmul_backward(s->dln, P(gp, LAYER_FC_W), P(gp, LAYER_FC_B), s->dfch, la->ln2,
                       P(lp, LAYER_FC_W), N, C, 4 * C);
    KP->layernorm_backward(s->dres, P(gp, LAYER_LN2_W), P(gp, LAYER_LN2_B), s->dln, la->res2,
                          P(lp, LAYER_LN2_W), la->ln2_mean, la->ln2_rstd, N, C);
    /* attention: res2 = x + attproj(attention(qkv(ln1(x)))) */
    mem_zero(s->datty, nc);
    KP->matmul_backward(s->datty, P(gp, LAYER_ATTPROJ_W), P(gp, LAYER_ATTPROJ_B), s->dres,
                       la->atty, P(lp, LAYER_ATTPROJ_W), N, C, C);
    mem_zero(s->dqkv, 3 * nc);
    KP->attention_backward(s->dqkv, s->datt, s->datty, la->qkv, la->att, B, T, NH, C / NH);
    mem_zero(s->dln, nc);
    KP->matmul_backward(s->dln, P(gp, LAYER_QKV_W), P(gp, LAYER_QKV_B), s->dqkv, la->ln1,
                       P(lp, LAYER_QKV_W), N, C, 3 * C);
    KP->layernorm_backward(s->dres, P(gp, LAYER_LN1_W), P(gp, LAYER_LN1_B), s->dln, x,
                          P(lp, LAYER_LN1_W), la->ln1_mean, la->ln1_rstd, N, C);
}

void gpt_embed_backward(const gpt_layout *g, void *eg, gpt_acts *a, gpt_grad_scratch *s) {
    int C = g->cfg.d_model;
    KP->encoder_backward(value_at(eg, g->embed[EMBED_WTE].offset),
                         value_at(eg, g->embed[EMBED_WPE].offset + (long)a->seq_first * C), s->dres, a->tokens, a->B,
                         a->seq, C);
}

void *gpt_backward(const gpt_layout *g, const void *params, void *grads, gpt_acts *a,
                   gpt_grad_scratch *s, const void *dout, float dloss,
                   grads_ready_fn ready, void *ready_ctx) {
    int L = g->cfg.layers;
    long begin, end;
    gpt_range(g, a->lo, a->hi, &begin, &end);
    if (a->hi == L) {
        long h = gpt_head_offset(g) - begin;
        gpt_head_backward(g, value_at(params, h), value_at(grads, h), a, s, dloss);
        if (ready) ready(ready_ctx, gpt_head_offset(g), g->total);
    } else {
        mem_copy(s->dres, dout, (size_t)block_tokens(a) * g->cfg.d_model * value_bytes());
    }
    for (int l = a->hi - 1; l >= a->lo; l--) {
        long o = gpt_layer_offset(g, l) - begin;
        gpt_layer_backward(g, value_at(params, o), value_at(grads, o), a, l, s);
        if (ready) ready(ready_ctx, gpt_layer_offset(g, l), gpt_layer_offset(g, l + 1));
    }
    if (a->lo != 0) return s->dres;
    gpt_embed_backward(g, grads, a, s);
    if (ready) ready(ready_ctx, 0, g->embed_size);
    return NULL;
}

/* ---- the backward in two halves ----------------------------------------------------- */

/* N = B x T positions where the douts are whole along the sequence (the
 * matmuls'), Ns = N / parts where they are on the residual stream (the
 * LayerNorms', the head's, the embedding's). */
static long lay_out_wgrads(gpt_wgrads *w, const gpt_layout *g, layer_widths wd, void *block) {
    long N = (long)w->B * g->cfg.seq, Ns = N / wd.parts, C = g->cfg.d_model, V = g->cfg.vocab, used = 0;
    for (int l = 0; l < w->hi - w->lo; l++) {
        layer_wgrads *lw = &w->layer[l];
        lw->dres3 = carve(block, &used, N * C, VALUES);
        lw->dfch = carve(block, &used, N * wd.mlp, VALUES);
        lw->dln2 = carve(block, &used, Ns * C, VALUES);
        lw->dres2 = carve(block, &used, N * C, VALUES);
        lw->dqkv = carve(block, &used, N * 3 * wd.attn, VALUES);
        lw->dln1 = carve(block, &used, Ns * C, VALUES);
        carve_layer(&lw->kept, block, &used, g, w->B, wd, g->cfg.recompute == GPT_RECOMPUTE_FULL ? LA_W_READS : 0);
    }
    int last = w->hi == g->cfg.layers;
    w->dlogits = last ? carve(block, &used, Ns * V, VALUES) : NULL;
    w->dlnf = last ? carve(block, &used, Ns * C, VALUES) : NULL;
    w->dx = w->lo == 0 ? carve(block, &used, Ns * C, VALUES) : NULL;
    return used;
}

static void wgrads_alloc(gpt_wgrads *w, const gpt_layout *g, int lo, int hi, int B, layer_widths wd) {
    memset(w, 0, sizeof *w);
    w->B = B; w->lo = lo; w->hi = hi;
    w->layer = calloc((size_t)(hi - lo) + 1, sizeof *w->layer);
    if (!w->layer) die("out of host memory");
    w->bytes = lay_out_wgrads(w, g, wd, NULL);
    w->block = mem_alloc((size_t)w->bytes, MEM_ACTS);
    lay_out_wgrads(w, g, wd, w->block);
}

void gpt_wgrads_alloc(gpt_wgrads *w, const gpt_layout *g, int lo, int hi, int B) {
    wgrads_alloc(w, g, lo, hi, B, full_widths(g));
}

void gpt_wgrads_alloc_local(gpt_wgrads *w, const gpt_layout *g, int lo, int hi, int B, int heads, int mlp_width) {
    wgrads_alloc(w, g, lo, hi, B, local_widths(g, heads, mlp_width));
}

void gpt_wgrads_alloc_part(gpt_wgrads *w, const gpt_layout *g, int lo, int hi, int B, const gpt_part *p) {
    wgrads_alloc(w, g, lo, hi, B, part_widths(g, p));
}

const layer_acts *gpt_layer_weight_source(const gpt_layout *g, const gpt_acts *a, int layer, const gpt_wgrads *w) {
    return g->cfg.recompute == GPT_RECOMPUTE_FULL ? &w->layer[layer - a->lo].kept : &a->layer[layer - a->lo];
}

void gpt_wgrads_free(gpt_wgrads *w) {
    mem_free(w->block);
    free(w->layer);
    memset(w, 0, sizeof *w);
}

void gpt_head_backward_input(const gpt_layout *g, const void *hp, gpt_acts *a, gpt_grad_scratch *s,
                             gpt_wgrads *w, float dloss) {
    int C = g->cfg.d_model, V = g->cfg.vocab, N = (int)block_tokens(a);
    size_t nc = (size_t)N * C * value_bytes();
    KP->crossentropy_backward(w->dlogits, a->probs, a->targets, dloss, N, V);
    mem_zero(w->dlnf, nc);
    KP->matmul_backward_input(w->dlnf, w->dlogits, value_at(hp, g->head[HEAD_W].offset), N, C, V);
    mem_zero(s->dres, nc);
    KP->layernorm_backward_input(s->dres, w->dlnf, gpt_acts_output(a), value_at(hp, g->head[HEAD_LNF_W].offset),
                                 a->lnf_mean, a->lnf_rstd, N, C);
}

/* gpt_layer_backward with every weight gradient left out, and the douts W
 * needs kept in w instead of in the shared scratch. */
void gpt_layer_backward_input(const gpt_layout *g, const void *lp, const gpt_acts *a, int layer,
                              gpt_grad_scratch *s, gpt_wgrads *w) {
    int B = a->B, T = g->cfg.seq, C = g->cfg.d_model, NH = g->cfg.heads, N = B * T;
    layer_wgrads *lw = &w->layer[layer - a->lo];
    const void *x = layer_input(a, layer);
    /* full: B recomputes the forward, leaving what W reads in lw->kept */
    layer_acts recomputed = gpt_layer_backward_source(g, a, layer, s, &lw->kept, NH);
    if (g->cfg.recompute == GPT_RECOMPUTE_FULL) layer_compute(g, lp, x, &recomputed, B);
    const layer_acts *la = &recomputed;
    size_t nc = (size_t)N * C * value_bytes(), n4c = 4 * nc;
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    mem_copy(lw->dres3, s->dres, nc);
    mem_zero(s->dfch_gelu, n4c);
    KP->matmul_backward_input(s->dfch_gelu, s->dres, P(lp, LAYER_FCPROJ_W), N, 4 * C, C);
    mem_zero(lw->dfch, n4c);
    KP->gelu_backward(lw->dfch, s->dfch_gelu, la->fch, (long)N * 4 * C);
    mem_zero(lw->dln2, nc);
    KP->matmul_backward_input(lw->dln2, lw->dfch, P(lp, LAYER_FC_W), N, C, 4 * C);
    KP->layernorm_backward_input(s->dres, lw->dln2, la->res2, P(lp, LAYER_LN2_W), la->ln2_mean, la->ln2_rstd, N, C);
    /* attention: res2 = x + attproj(attention(qkv(ln1(x)))) */
    mem_copy(lw->dres2, s->dres, nc);
    mem_zero(s->datty, nc);
    KP->matmul_backward_input(s->datty, s->dres, P(lp, LAYER_ATTPROJ_W), N, C, C);
    mem_zero(lw->dqkv, 3 * nc);
    KP->attention_backward(lw->dqkv, s->datt, s->datty, la->qkv, la->att, B, T, NH, C / NH);
    mem_zero(lw->dln1, nc);
    KP->matmul_backward_input(lw->dln1, lw->dqkv, P(lp, LAYER_QKV_W), N, C, 3 * C);
    KP->layernorm_backward_input(s->dres, lw->dln1, x, P(lp, LAYER_LN1_W), la->ln1_mean, la->ln1_rstd, N, C);
}

void gpt_head_backward_weight(const gpt_layout *g, void *hg, const gpt_acts *a, const gpt_wgrads *w) {
    int C = g->cfg.d_model, V = g->cfg.vocab, N = (int)block_tokens(a);
    KP->matmul_backward_weight(value_at(hg, g->head[HEAD_W].offset), NULL, w->dlogits, a->lnf, N, C, V);
    KP->layernorm_backward_weight(value_at(hg, g->head[HEAD_LNF_W].offset), value_at(hg, g->head[HEAD_LNF_B].offset),
                                  w->dlnf, gpt_acts_output(a), a->lnf_mean, a->lnf_rstd, N, C);
}

/* In gpt_layer_backward's order, so the gradients come out the same. */
void gpt_layer_backward_weight(const gpt_layout *g, void *gp, const gpt_acts *a, int layer, const gpt_wgrads *w) {
    int C = g->cfg.d_model, N = a->B * g->cfg.seq;
    const layer_acts *la = gpt_layer_weight_source(g, a, layer, w);
    const layer_wgrads *lw = &w->layer[layer - a->lo];
    KP->matmul_backward_weight(P(gp, LAYER_FCPROJ_W), P(gp, LAYER_FCPROJ_B), lw->dres3, la->fch_gelu, N, 4 * C, C);
    KP->matmul_backward_weight(P(gp, LAYER_FC_W), P(gp, LAYER_FC_B), lw->dfch, la->ln2, N, C, 4 * C);
    KP->layernorm_backward_weight(P(gp, LAYER_LN2_W), P(gp, LAYER_LN2_B), lw->dln2, la->res2, la->ln2_mean,
                                 la->ln2_rstd, N, C);
    KP->matmul_backward_weight(P(gp, LAYER_ATTPROJ_W), P(gp, LAYER_ATTPROJ_B), lw->dres2, la->atty, N, C, C);
    KP->matmul_backward_weight(P(gp, LAYER_QKV_W), P(gp, LAYER_QKV_B), lw->dqkv, la->ln1, N, C, 3 * C);
    KP->layernorm_backward_weight(P(gp, LAYER_LN1_W), P(gp, LAYER_LN1_B), lw->dln1, layer_input(a, layer),
                                 la->ln1_mean, la->ln1_rstd, N, C);
}

void gpt_embed_backward_weight(const gpt_layout *g, void *eg, const gpt_acts *a, const gpt_wgrads *w) {
    int C = g->cfg.d_model;
    KP->encoder_backward(value_at(eg, g->embed[EMBED_WTE].offset),
                         value_at(eg, g->embed[EMBED_WPE].offset + (long)a->seq_first * C), w->dx, a->tokens, a->B,
                         a->seq, C);
}

void *gpt_backward_input(const gpt_layout *g, const void *params, gpt_acts *a, gpt_grad_scratch *s,
                         gpt_wgrads *w, const void *dout, float dloss) {
    long begin, end;
    size_t nc = (size_t)block_tokens(a) * g->cfg.d_model * value_bytes();
    gpt_range(g, a->lo, a->hi, &begin, &end);
    if (a->hi == g->cfg.layers) gpt_head_backward_input(g, value_at(params, gpt_head_offset(g) - begin), a, s, w, dloss);
    else mem_copy(s->dres, dout, nc);
    for (int l = a->hi - 1; l >= a->lo; l--)
        gpt_layer_backward_input(g, value_at(params, gpt_layer_offset(g, l) - begin), a, l, s, w);
    if (a->lo != 0) return s->dres;
    mem_copy(w->dx, s->dres, nc); /* the embedding's W reads it */
    return NULL;
}

void gpt_backward_weight(const gpt_layout *g, void *grads, const gpt_acts *a, const gpt_wgrads *w) {
    long begin, end;
    gpt_range(g, a->lo, a->hi, &begin, &end);
    if (a->hi == g->cfg.layers) gpt_head_backward_weight(g, value_at(grads, gpt_head_offset(g) - begin), a, w);
    for (int l = a->hi - 1; l >= a->lo; l--)
        gpt_layer_backward_weight(g, value_at(grads, gpt_layer_offset(g, l) - begin), a, l, w);
    if (a->lo == 0) gpt_embed_backward_weight(g, grads, a, w);
}

double gpt_mean_loss(const gpt_layout *g, const gpt_acts *a) {
    (void)g;
    long n = block_tokens(a);
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) die("out of host memory");
    mem_to_host(host, a->losses, (size_t)n * sizeof(float));
    double sum = 0;
    for (long i = 0; i < n; i++) sum += host[i];
    free(host);
    return sum / (double)n;
}

double gpt_flops_per_token(const gpt_layout *g) {
    double L = g->cfg.layers, T = g->cfg.seq, C = g->cfg.d_model;
    /* the embeddings are lookups, not matmuls: leave wte and wpe out */
    double matmul_params = (double)(g->total - g->embed_size);
    return 6.0 * matmul_params + 12.0 * L * T * C;
}
