#include "model.h"
#include "moe.h"
#include "kernels.h"
#include "mem.h"
#include "device.h"
#include "trace.h"
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
    /* experts: E MLPs of M hidden units stacked by rows, each one contiguous, and the router */
    long E = cfg->experts > 0 ? cfg->experts : 1, M = gpt_mlp_width(cfg);
    place(&g->layer[LAYER_FC_W], "mlp.c_fc.weight", &off, E * M, C, 1);
    place(&g->layer[LAYER_FC_B], "mlp.c_fc.bias", &off, E * M, 1, 0);
    place(&g->layer[LAYER_FCPROJ_W], "mlp.c_proj.weight", &off, E * C, M, 1);
    place(&g->layer[LAYER_FCPROJ_B], "mlp.c_proj.bias", &off, E * C, 1, 0);
    place(&g->layer[LAYER_ROUTER_W], "mlp.router.weight", &off, cfg->experts > 0 ? cfg->experts : 0, C, 1);
    /* shared experts: one MLP of S M hidden units (empty without them) */
    const long S = cfg->experts > 0 && cfg->shared_experts > 0 ? cfg->shared_experts : 0;
    place(&g->layer[LAYER_SHARED_FC_W], "mlp.shared.c_fc.weight", &off, S * M, C, 1);
    place(&g->layer[LAYER_SHARED_FC_B], "mlp.shared.c_fc.bias", &off, S * M, 1, 0);
    place(&g->layer[LAYER_SHARED_FCPROJ_W], "mlp.shared.c_proj.weight", &off, S ? C : 0, S * M, 1);
    g->layer_size = place(&g->layer[LAYER_SHARED_FCPROJ_B], "mlp.shared.c_proj.bias", &off, S ? C : 0, 1, 0);

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
            if (hi > lo && hi > begin && lo < end) fn(ctx, &ts[i], lo, blk); /* a dense model's router: empty */
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
typedef struct { long heads, attn, mlp, parts, part, att_row; } layer_widths;

static layer_widths full_widths(const gpt_layout *g) {
    long slots_per_position = g->cfg.experts > 0 ? g->cfg.top_k : 1; /* experts: fch holds k N slots */
    return (layer_widths){g->cfg.heads, g->cfg.d_model, gpt_mlp_width(&g->cfg) * slots_per_position, 1, 0, g->cfg.seq};
}

static layer_widths part_widths(const gpt_layout *g, const gpt_part *p) {
    int parts = p->seq_parts > 1 ? p->seq_parts : 1;
    if (g->cfg.seq % parts) die("gpt_part: %d sequence parts do not divide seq %d", parts, g->cfg.seq);
    return (layer_widths){p->heads, (long)p->heads * (g->cfg.d_model / g->cfg.heads), p->mlp_width, parts,
                          parts > 1 ? p->seq_part : 0, p->att_row > 0 ? p->att_row : g->cfg.seq};
}

int gpt_recompute_parse(const char *name) {
    for (int m = 0; m < RECOMPUTE_MODES; m++)
        if (!strcmp(name, recompute_names[m])) return m;
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
    LA_MOE = 1 << 9,   /* experts: the router's and dispatch's state (moe.h) */
    LA_MOE_STATS = 1 << 10, /* experts: the aux-loss sum, dropped choices, slots */
    LA_ALL = (1 << 11) - 1,
    LA_W_READS = LA_LN1 | LA_ATTY | LA_RES2 | LA_LN2 | LA_GELU | LA_MOE /* what the weight half reads */
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
    PIECE(LA_ATT, att, B * w.heads * T * w.att_row, VALUES);
    PIECE(LA_RES2, res2, Ns * C, VALUES);
    PIECE(LA_LN2, ln2, N * C, VALUES);
    PIECE(LA_LN2, ln2_mean, Ns, FOUR);
    PIECE(LA_LN2, ln2_rstd, Ns, FOUR);
    PIECE(LA_FCH, fch, N * w.mlp, VALUES);
    PIECE(LA_GELU, fch_gelu, N * w.mlp, VALUES);
    PIECE(LA_RES3, res3, Ns * C, VALUES);
    PIECE(LA_MOE, moe, moe_state_bytes(&g->cfg, N), 1);
    PIECE(LA_MOE_STATS, moe_stats, g->cfg.experts > 0 ? 6 + g->cfg.experts : 0, FOUR);
#undef PIECE
}

/* What a layer keeps for its backward under each --recompute mode. */
static unsigned kept_pieces(const gpt_layout *g) {
    switch (g->cfg.recompute) {
    case RECOMPUTE_SELECTIVE: return LA_ALL & ~LA_ATT;
    case RECOMPUTE_FULL: return LA_RES3 | LA_MOE_STATS;
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
        a->layer[l].layer = a->lo + l;
        if (a->layer[l].att) att += ((long)VALUES * B * w.heads * T * w.att_row + 63) / 64 * 64;
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
    if (a->positions) { /* gather this block's columns, then one copy each */
        int *host = malloc(sizeof(int) * (size_t)a->B * a->seq + 1);
        if (!host) die("out of host memory");
        for (int k = 0; k < 2; k++) {
            const int *src = k ? targets : tokens;
            int *dst = k ? a->targets : a->tokens;
            if (!src || !dst) continue;
            for (int b = 0; b < a->B; b++)
                for (int i = 0; i < a->seq; i++) host[(size_t)b * a->seq + i] = src[(size_t)b * T + a->positions[i]];
            mem_to_device(dst, host, sizeof(int) * (size_t)a->B * a->seq);
        }
        free(host);
        return;
    }
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
    s->datt = carve(block, &used, (long)B * w.heads * T * w.att_row, VALUES);
    s->dfch = carve(block, &used, N * w.mlp, VALUES);
    /* experts: after the fc-proj backward the slots' input gradients [k N, C] go here (moe.h), which
     * need more room than the k N slots' dGELU when an expert is narrower than C (--expert-width); a
     * part without the MLP's units (lab08's layers, whose hook keeps its own) has neither */
    const long slots_width = g->cfg.experts > 0 && w.mlp > 0 ? (long)g->cfg.top_k * C : 0;
    s->dfch_gelu = carve(block, &used, N * (w.mlp > slots_width ? w.mlp : slots_width), VALUES);
    s->dlogits = carve(block, &used, Ns * V, VALUES);
    int split = w.parts > 1;
    s->seq_full = split ? carve(block, &used, N * C, VALUES) : NULL;
    s->seq_packed = split ? carve(block, &used, N * C, VALUES) : NULL;
    s->seq_shard = split ? carve(block, &used, Ns * C, VALUES) : NULL;
    s->moe = carve(block, &used, moe_scratch_bytes(&g->cfg, N), 1);
    /* the recomputation's one layer: what the layers do not keep (full: all
     * of it, the output too, which the recomputation must not write over the
     * kept one) */
    unsigned work = g->cfg.recompute == RECOMPUTE_FULL ? LA_ALL : LA_ALL & ~kept_pieces(g);
    carve_layer(&s->work, block, &used, g, B, w, work);
    return used;
}

static void scratch_alloc(gpt_grad_scratch *s, const gpt_layout *g, int B, layer_widths w) {
    long n = lay_out_scratch(s, g, B, w, NULL);
    s->block = mem_alloc((size_t)n, MEM_WORKSPACE);
    lay_out_scratch(s, g, B, w, s->block);
}

void gpt_scratch_alloc(gpt_grad_scratch *s, const gpt_layout *g, int B) { scratch_alloc(s, g, B, full_widths(g)); }

void gpt_scratch_alloc_part(gpt_grad_scratch *s, const gpt_layout *g, int B, const gpt_part *p) {
    scratch_alloc(s, g, B, part_widths(g, p));
}

void gpt_scratch_free(gpt_grad_scratch *s) {
    mem_free(s->block);
    memset(s, 0, sizeof *s);
}

/* ---- forward ----------------------------------------------------------------- */

/* The block's positions: B rows of a->seq (all T, or a sequence-parallel slice). */
static long block_tokens(const gpt_acts *a) { return (long)a->B * a->seq; }

/* With a->positions: one encoder call per run of consecutive global
 * positions in each row (a zig-zag rank has two per row), each reading its
 * own rows of wpe. dout NULL: the forward into a->x_in; else the backward
 * into the gradients ewg. */
static void embed_runs(const gpt_layout *g, const void *ep, void *eg, const void *dout, const gpt_acts *a) {
    const int C = g->cfg.d_model, *pos = a->positions;
    const long wte = g->embed[EMBED_WTE].offset, wpe = g->embed[EMBED_WPE].offset;
    for (int b = 0; b < a->B; b++)
        for (int i = 0, j; i < a->seq; i = j) {
            for (j = i + 1; j < a->seq && pos[j] == pos[j - 1] + 1; j++) {}
            const long row = (long)b * a->seq + i;
            if (!dout)
                KP->encoder_forward(value_at(a->x_in, row * C), a->tokens + row, value_at(ep, wte),
                                    value_at(ep, wpe + (long)pos[i] * C), 1, j - i, C);
            else
                KP->encoder_backward(value_at(eg, wte), value_at(eg, wpe + (long)pos[i] * C), value_at(dout, row * C),
                                     a->tokens + row, 1, j - i, C);
        }
}

void gpt_embed_forward(const gpt_layout *g, const void *ep, gpt_acts *a) {
    int C = g->cfg.d_model; /* a slice of the positions adds its own rows of wpe */
    if (a->positions) {
        embed_runs(g, ep, NULL, NULL, a);
        return;
    }
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
            "block has none (gpt_acts_bind)", recompute_names[g->cfg.recompute]);
    return &a->scratch->work;
}

/* Where the forward of `layer` writes under --recompute: its own layer_acts;
 * selective: att in the bound scratch's work set; full: the work set, but the
 * output in the layer's own res3. */
static layer_acts forward_target(const gpt_layout *g, const gpt_acts *a, int layer) {
    layer_acts la = a->layer[layer - a->lo];
    if (g->cfg.recompute == RECOMPUTE_SELECTIVE) {
        la.att = bound_work(g, a)->att; /* computed, used by the attention output, not kept */
    } else if (g->cfg.recompute == RECOMPUTE_FULL) {
        void *output = la.res3; /* the one piece kept: the next layer's input */
        float *stats = la.moe_stats; /* and, with experts, what the loss reports */
        la = *bound_work(g, a);
        la.res3 = output;
        la.moe_stats = stats;
    }
    la.layer = layer;
    return la;
}

void gpt_head_forward(const gpt_layout *g, const void *hp, gpt_acts *a) {
    int C = g->cfg.d_model, V = g->cfg.vocab, N = (int)block_tokens(a);
    KP->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, gpt_acts_output(a), value_at(hp, g->head[HEAD_LNF_W].offset),
                          value_at(hp, g->head[HEAD_LNF_B].offset), N, C);
    KP->matmul_forward(a->logits, a->lnf, value_at(hp, g->head[HEAD_W].offset), NULL, N, C, V);
    KP->crossentropy_forward(a->losses, a->probs, a->logits, a->targets, N, V);
}

void gpt_head_backward(const gpt_layout *g, const void *hp, void *hg, gpt_acts *a,
                       gpt_grad_scratch *s, float dloss) {
    int C = g->cfg.d_model, V = g->cfg.vocab, N = (int)block_tokens(a);
    size_t nc = (size_t)N * C * value_bytes();
    s->dloss = dloss; /* the layers' aux-loss gradients (experts) scale by it */
    KP->crossentropy_backward(s->dlogits, a->probs, a->targets, dloss, N, V);
    mem_zero(s->dln, nc);
    KP->matmul_backward(s->dln, value_at(hg, g->head[HEAD_W].offset), NULL, s->dlogits, a->lnf,
                        value_at(hp, g->head[HEAD_W].offset), N, C, V);
    mem_zero(s->dres, nc);
    KP->layernorm_backward(s->dres, value_at(hg, g->head[HEAD_LNF_W].offset), value_at(hg, g->head[HEAD_LNF_B].offset),
                           s->dln, gpt_acts_output(a), value_at(hp, g->head[HEAD_LNF_W].offset),
                           a->lnf_mean, a->lnf_rstd, N, C);
}

void gpt_embed_backward(const gpt_layout *g, void *eg, gpt_acts *a, gpt_grad_scratch *s) {
    int C = g->cfg.d_model;
    if (a->positions) {
        embed_runs(g, NULL, eg, s->dres, a);
        return;
    }
    KP->encoder_backward(value_at(eg, g->embed[EMBED_WTE].offset),
                         value_at(eg, g->embed[EMBED_WPE].offset + (long)a->seq_first * C), s->dres, a->tokens, a->B,
                         a->seq, C);
}

/* ---- the backward in two halves ----------------------------------------------------- */

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
        lw->moe = carve(block, &used, moe_scratch_bytes(&g->cfg, N), 1); /* dense: no bytes */
        carve_layer(&lw->kept, block, &used, g, w->B, wd, g->cfg.recompute == RECOMPUTE_FULL ? LA_W_READS : 0);
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

void gpt_wgrads_alloc_part(gpt_wgrads *w, const gpt_layout *g, int lo, int hi, int B, const gpt_part *p) {
    wgrads_alloc(w, g, lo, hi, B, part_widths(g, p));
}

void gpt_wgrads_free(gpt_wgrads *w) {
    mem_free(w->block);
    free(w->layer);
    memset(w, 0, sizeof *w);
}
static void head_backward_input(const gpt_layout *g, const void *hp, gpt_acts *a, gpt_grad_scratch *s,
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


static void head_backward_weight(const gpt_layout *g, void *hg, const gpt_acts *a, const gpt_wgrads *w) {
    int C = g->cfg.d_model, V = g->cfg.vocab, N = (int)block_tokens(a);
    KP->matmul_backward_weight(value_at(hg, g->head[HEAD_W].offset), NULL, w->dlogits, a->lnf, N, C, V);
    KP->layernorm_backward_weight(value_at(hg, g->head[HEAD_LNF_W].offset), value_at(hg, g->head[HEAD_LNF_B].offset),
                                  w->dlnf, gpt_acts_output(a), a->lnf_mean, a->lnf_rstd, N, C);
}

static void embed_backward_weight(const gpt_layout *g, void *eg, const gpt_acts *a, const gpt_wgrads *w) {
    int C = g->cfg.d_model;
    if (a->positions) {
        embed_runs(g, NULL, eg, w->dx, a);
        return;
    }
    KP->encoder_backward(value_at(eg, g->embed[EMBED_WTE].offset),
                         value_at(eg, g->embed[EMBED_WPE].offset + (long)a->seq_first * C), w->dx, a->tokens, a->B,
                         a->seq, C);
}

/* ---- one layer, with parallelism plugged in (model.h: gpt_layer_hooks) ------------ */

/* A tensor of a layer block at the hooks' shapes; NULL where the pass has no
 * such block (W has no parameters, B writes no gradients). */
#define HP(block, which) ((block) ? value_at(block, h->tensors[which].offset) : NULL)

/* The shapes one layer runs at: N = B x T positions inside the region, Ns = B x
 * seq on the residual stream; a rank's heads, attention and MLP widths. */
typedef struct { int B, T, C, N, Ns, heads, HS, attn, mlp, split; } layer_dims;

static layer_dims dims_of(const gpt_layout *g, const gpt_layer_hooks *h, int B, int seq) {
    layer_dims d = {.B = B, .T = g->cfg.seq, .C = g->cfg.d_model, .HS = g->cfg.d_model / g->cfg.heads};
    d.N = B * d.T;
    d.Ns = B * seq;
    d.attn = (int)(h->tensors[LAYER_QKV_W].rows / 3);
    d.heads = d.attn / d.HS;
    d.mlp = (int)h->tensors[LAYER_FC_W].rows;
    d.split = seq != d.T;
    return d;
}

/* Close the open compute event and open `name` (NULL: none), when h traces. */
static int segment(const gpt_layer_hooks *h, int open, const char *name) {
    trace_end(open);
    return h->trace && name ? trace_begin(name, TRACE_COMPUTE, -1, NULL) : -1;
}

static void layernorm_backward_pass(gpt_pass pass, void *dinp, void *dw, void *db, const void *dout, const void *inp,
                                    const void *w, const float *mean, const float *rstd, int N, int C) {
    if (pass == GPT_PASS_FUSED) KP->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    else if (pass == GPT_PASS_INPUT) KP->layernorm_backward_input(dinp, dout, inp, w, mean, rstd, N, C);
    else KP->layernorm_backward_weight(dw, db, dout, inp, mean, rstd, N, C);
}

/* One layer's forward from x ([B,seq,C]) into la. s: the scratch, for the
 * staging of a split residual stream (the LayerNorms write their slice to
 * s->seq_shard, the row linears their whole output to s->seq_full). */
static void layer_forward_body(const gpt_layout *g, const gpt_layer_hooks *h, const void *lp, const void *x,
                               const layer_acts *la, int B, int seq, gpt_grad_scratch *s) {
    const layer_dims d = dims_of(g, h, B, seq);
    if (d.split && !s) die("sequence parallelism: the activations are not bound to a scratch (gpt_acts_bind)");
    const long whole = (long)d.N * d.C, part = (long)d.Ns * d.C;
    void *ln_out = d.split ? s->seq_shard : NULL, *row_out = d.split ? s->seq_full : NULL;

    /* attention: res2 = x + attproj(attention(qkv(ln1(x)))) */
    int ev = segment(h, -1, "ln1_fwd");
    KP->layernorm_forward(d.split ? ln_out : la->ln1, la->ln1_mean, la->ln1_rstd, x, HP(lp, LAYER_LN1_W),
                          HP(lp, LAYER_LN1_B), d.Ns, d.C);
    ev = segment(h, ev, NULL);
    h->enter_forward(h->region_ctx, d.split ? ln_out : la->ln1, la->ln1, whole, B, s);
    ev = segment(h, ev, "attention_fwd");
    h->column_forward(h->linear_ctx, la->qkv, la->ln1, HP(lp, LAYER_QKV_W), HP(lp, LAYER_QKV_B), d.N, d.C, 3 * d.attn);
    h->attention_forward(h->attention_ctx, la->atty, la->att, la->qkv, B, d.T, d.heads, d.HS);
    h->row_forward(h->linear_ctx, d.split ? row_out : la->res2, la->atty, HP(lp, LAYER_ATTPROJ_W), HP(lp, LAYER_ATTPROJ_B),
                   d.N, d.attn, d.C);
    ev = segment(h, ev, NULL);
    h->exit_forward(h->region_ctx, d.split ? row_out : la->res2, la->res2, whole, B, s);

    /* MLP: res3 = res2 + mlp(ln2(res2)) */
    ev = segment(h, ev, "ln2_fwd");
    KP->add(la->res2, la->res2, x, part);
    const int mlp_split = d.split && !h->mlp_on_shard; /* the MLP's region gathers the sequence */
    KP->layernorm_forward(mlp_split ? ln_out : la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, HP(lp, LAYER_LN2_W),
                          HP(lp, LAYER_LN2_B), d.Ns, d.C);
    ev = segment(h, ev, NULL);
    if (!d.split || mlp_split) h->enter_forward(h->region_ctx, mlp_split ? ln_out : la->ln2, la->ln2, whole, B, s);
    ev = segment(h, ev, "mlp_fwd");
    h->mlp_forward(h, lp, la, mlp_split ? row_out : la->res3, mlp_split || !d.split ? d.N : d.Ns);
    ev = segment(h, ev, NULL);
    if (!d.split || mlp_split) h->exit_forward(h->region_ctx, mlp_split ? row_out : la->res3, la->res3, whole, B, s);
    ev = segment(h, ev, "residual_fwd");
    KP->add(la->res3, la->res3, la->res2, part);
    segment(h, ev, NULL);
}

/* What the backward of `layer` reads under --recompute (none: the kept pieces;
 * selective: att recomputed into s->work.att by attention's forward, its
 * output into s->datty, which the backward overwrites; full: s->work, the
 * forward run again there, collectives included). keep: B of a split
 * backward under full: the pieces W reads go there instead, to live until W. */
static layer_acts backward_source(const gpt_layout *g, const gpt_layer_hooks *h, const void *lp, const gpt_acts *a,
                                  int layer, gpt_grad_scratch *s, const layer_acts *keep) {
    layer_acts la = a->layer[layer - a->lo];
    la.layer = layer;
    if (g->cfg.recompute == RECOMPUTE_NONE) return la;
    int ev = segment(h, -1, "recompute");
    if (g->cfg.recompute == RECOMPUTE_SELECTIVE) {
        /* att from the kept q and k, the forward's kernel on the forward's inputs: the same bits */
        const layer_dims d = dims_of(g, h, a->B, a->seq);
        la.att = s->work.att;
        h->attention_forward(h->attention_ctx, s->datty, la.att, la.qkv, a->B, d.T, d.heads, d.HS);
    } else {
        la = s->work;
        if (keep) {
            la.ln1 = keep->ln1; la.ln1_mean = keep->ln1_mean; la.ln1_rstd = keep->ln1_rstd;
            la.atty = keep->atty; la.res2 = keep->res2;
            la.ln2 = keep->ln2; la.ln2_mean = keep->ln2_mean; la.ln2_rstd = keep->ln2_rstd;
            la.fch_gelu = keep->fch_gelu;
            la.moe = keep->moe; /* experts: W's slots, gates and xs */
        }
    }
    segment(h, ev, NULL);
    la.layer = layer; /* the work set's: full reruns the routing, with the layer's bias */
    if (g->cfg.recompute == RECOMPUTE_FULL) layer_forward_body(g, h, lp, layer_input(a, layer), &la, a->B, a->seq, s);
    return la;
}

/* One layer's backward: turns s->dres from the gradient of its output into
 * that of its input (B) and accumulates its weight gradients into gp (W).
 * lw: NULL for the fused pass (the douts live in s); B keeps in it the douts W
 * reads, and W reads them there with the activations (under --recompute full
 * what B's recomputation kept in lw). */
static void layer_backward_body(const gpt_layout *g, const gpt_layer_hooks *h, gpt_pass pass, const void *lp,
                                void *gp, const gpt_acts *a, int layer, gpt_grad_scratch *s, layer_wgrads *lw) {
    const int input = pass != GPT_PASS_WEIGHT;
    gpt_grad_scratch no_scratch = {0}; /* W reads no scratch: its douts are in lw */
    if (!s) s = &no_scratch;
    const layer_dims d = dims_of(g, h, a->B, a->seq);
    const void *x = layer_input(a, layer);
    layer_acts src = input ? backward_source(g, h, lp, a, layer, s, lw ? &lw->kept : NULL)
                           : g->cfg.recompute == RECOMPUTE_FULL ? lw->kept : a->layer[layer - a->lo];
    src.moe_kept = lw ? lw->moe : NULL; /* experts: B's douts the dense MLP would keep in dfch alone */
    const layer_acts *la = &src;
    const long whole = (long)d.N * d.C;
    const size_t vb = value_bytes();
    /* the douts: the row linears' whole, the column linears' input gradient whole
     * (before enter's backward) and the LayerNorms' on the residual stream */
    void *dres3 = lw ? lw->dres3 : d.split ? s->seq_full : s->dres, *dres2 = lw ? lw->dres2 : dres3;
    void *dln2_whole = lw && !d.split ? lw->dln2 : s->dln, *dln1_whole = lw && !d.split ? lw->dln1 : s->dln;
    void *dln2 = lw ? lw->dln2 : d.split ? s->seq_shard : s->dln, *dln1 = lw ? lw->dln1 : dln2;
    void *dfch = lw ? lw->dfch : s->dfch, *dqkv = lw ? lw->dqkv : s->dqkv;

    /* MLP (on the shard: its output gradient is the residual stream's, its input gradient dln2's own) */
    int ev = -1;
    const int on_shard = d.split && h->mlp_on_shard;
    if (on_shard) {
        dres3 = lw ? lw->dres3 : s->dres;
        if (input) gpt_region_identity(NULL, s->dres, dres3, (long)d.Ns * d.C, a->B, s);
        dln2_whole = dln2;
    } else if (input) h->exit_backward(h->region_ctx, s->dres, dres3, whole, a->B, s);
    ev = segment(h, ev, "mlp_bwd");
    h->mlp_backward(h, pass, lp, gp, la, dres3, dfch, dln2_whole, s, on_shard ? d.Ns : d.N);
    ev = segment(h, ev, NULL);
    if (input && !on_shard) h->enter_backward(h->region_ctx, dln2_whole, dln2, whole, a->B, s);
    ev = segment(h, ev, "ln2_bwd");
    layernorm_backward_pass(pass, s->dres, HP(gp, LAYER_LN2_W), HP(gp, LAYER_LN2_B), dln2, la->res2,
                            HP(lp, LAYER_LN2_W), la->ln2_mean, la->ln2_rstd, d.Ns, d.C);
    ev = segment(h, ev, NULL);

    /* attention */
    if (input) h->exit_backward(h->region_ctx, s->dres, dres2, whole, a->B, s);
    ev = segment(h, ev, "attention_bwd");
    if (input) mem_zero(s->datty, (size_t)d.N * d.attn * vb);
    h->row_backward(h->linear_ctx, pass, s->datty, HP(gp, LAYER_ATTPROJ_W), HP(gp, LAYER_ATTPROJ_B), dres2, la->atty,
                    HP(lp, LAYER_ATTPROJ_W), d.N, d.attn, d.C);
    if (input) {
        mem_zero(dqkv, (size_t)d.N * 3 * d.attn * vb);
        h->attention_backward(h->attention_ctx, dqkv, s->datt, s->datty, la->qkv, la->att, la->atty, a->B, d.T, d.heads,
                             d.HS);
        mem_zero(dln1_whole, (size_t)whole * vb);
    }
    h->column_backward(h->linear_ctx, pass, dln1_whole, HP(gp, LAYER_QKV_W), HP(gp, LAYER_QKV_B), dqkv, la->ln1,
                       HP(lp, LAYER_QKV_W), d.N, d.C, 3 * d.attn);
    ev = segment(h, ev, NULL);
    if (input) h->enter_backward(h->region_ctx, dln1_whole, dln1, whole, a->B, s);
    ev = segment(h, ev, "ln1_bwd");
    layernorm_backward_pass(pass, s->dres, HP(gp, LAYER_LN1_W), HP(gp, LAYER_LN1_B), dln1, x, HP(lp, LAYER_LN1_W),
                            la->ln1_mean, la->ln1_rstd, d.Ns, d.C);
    segment(h, ev, NULL);
}

/* ---- the one-rank hooks ---------------------------------------------------------- */

static void matmul_forward_hook(void *ctx, void *out, const void *inp, const void *w, const void *b, int N, int IC,
                                int OC) {
    (void)ctx;
    KP->matmul_forward(out, inp, w, b, N, IC, OC);
}

static void matmul_backward_hook(void *ctx, gpt_pass pass, void *dinp, void *dw, void *db, const void *dout,
                                 const void *inp, const void *w, int N, int IC, int OC) {
    (void)ctx;
    if (pass == GPT_PASS_FUSED) KP->matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
    else if (pass == GPT_PASS_INPUT) KP->matmul_backward_input(dinp, dout, w, N, IC, OC);
    else KP->matmul_backward_weight(dw, db, dout, inp, N, IC, OC);
}

void gpt_region_identity(void *ctx, void *from, void *to, long whole, int B, gpt_grad_scratch *s) {
    (void)ctx; (void)B; (void)s;
    if (from != to) mem_copy(to, from, (size_t)whole * value_bytes());
}

static void attention_forward_hook(void *ctx, void *atty, void *att, const void *qkv, int B, int T, int heads,
                                   int HS) {
    (void)ctx;
    KP->attention_forward(atty, att, qkv, B, T, heads, HS);
}

static void attention_backward_hook(void *ctx, void *dqkv, void *datt, const void *datty, const void *qkv,
                                    const void *att, const void *atty, int B, int T, int heads, int HS) {
    (void)ctx; (void)atty;
    KP->attention_backward(dqkv, datt, datty, qkv, att, B, T, heads, HS);
}

/* fc (column) -> GELU -> fc-proj (row), at the hooks' MLP width */
static void mlp_forward_hook(const gpt_layer_hooks *h, const void *lp, const layer_acts *la, void *out, int N) {
    const int C = (int)h->tensors[LAYER_FC_W].cols, M = (int)h->tensors[LAYER_FC_W].rows;
    h->column_forward(h->linear_ctx, la->fch, la->ln2, HP(lp, LAYER_FC_W), HP(lp, LAYER_FC_B), N, C, M);
    KP->gelu_forward(la->fch_gelu, la->fch, (long)N * M);
    h->row_forward(h->linear_ctx, out, la->fch_gelu, HP(lp, LAYER_FCPROJ_W), HP(lp, LAYER_FCPROJ_B), N, M, C);
}

static void mlp_backward_hook(const gpt_layer_hooks *h, gpt_pass pass, const void *lp, void *gp, const layer_acts *la,
                              const void *dout, void *dfch, void *dinp, gpt_grad_scratch *s, int N) {
    const int C = (int)h->tensors[LAYER_FC_W].cols, M = (int)h->tensors[LAYER_FC_W].rows;
    const int input = pass != GPT_PASS_WEIGHT;
    const size_t vb = value_bytes();
    if (input) mem_zero(s->dfch_gelu, (size_t)N * M * vb);
    h->row_backward(h->linear_ctx, pass, s->dfch_gelu, HP(gp, LAYER_FCPROJ_W), HP(gp, LAYER_FCPROJ_B), dout, la->fch_gelu,
                    HP(lp, LAYER_FCPROJ_W), N, M, C);
    if (input) {
        mem_zero(dfch, (size_t)N * M * vb);
        KP->gelu_backward(dfch, s->dfch_gelu, la->fch, (long)N * M);
        mem_zero(dinp, (size_t)N * C * vb);
    }
    h->column_backward(h->linear_ctx, pass, dinp, HP(gp, LAYER_FC_W), HP(gp, LAYER_FC_B), dfch, la->ln2, HP(lp, LAYER_FC_W),
                       N, C, M);
}

gpt_layer_hooks gpt_default_hooks(const gpt_layout *g) {
    const int experts = g->cfg.experts > 0;
    return (gpt_layer_hooks){
        .cfg = &g->cfg, .tensors = g->layer, .layer_size = g->layer_size,
        .column_forward = matmul_forward_hook, .row_forward = matmul_forward_hook,
        .column_backward = matmul_backward_hook, .row_backward = matmul_backward_hook,
        .enter_forward = gpt_region_identity, .enter_backward = gpt_region_identity,
        .exit_forward = gpt_region_identity, .exit_backward = gpt_region_identity,
        .attention_forward = attention_forward_hook, .attention_backward = attention_backward_hook,
        .mlp_forward = experts ? moe_mlp_forward : mlp_forward_hook,
        .mlp_backward = experts ? moe_mlp_backward : mlp_backward_hook,
    };
}

/* ---- a range of layers ------------------------------------------------------------ */

/* Where a block starts in a buffer whose layer blocks are h->layer_size long:
 * the model's flat layout, or a tensor-parallel rank's local one. */
static long block_at(const gpt_layout *g, const gpt_layer_hooks *h, int layer) {
    return g->embed_size + (long)layer * h->layer_size;
}

static long range_begin(const gpt_layout *g, const gpt_layer_hooks *h, int lo) {
    return lo == 0 ? 0 : block_at(g, h, lo);
}

void gpt_range_with(const gpt_layout *g, const gpt_layer_hooks *h, int lo, int hi, long *begin, long *end) {
    *begin = range_begin(g, h, lo);
    *end = hi == g->cfg.layers ? block_at(g, h, hi) + g->head_size : block_at(g, h, hi);
}

gpt_part gpt_whole_part(const gpt_layout *g) {
    return (gpt_part){g->cfg.heads, (int)full_widths(g).mlp, 1, 0, 0}; /* experts: k slots a position, as gpt_acts_alloc */
}

void gpt_layer_forward(const gpt_layout *g, const void *lp, gpt_acts *a, int layer) {
    gpt_layer_hooks h = gpt_default_hooks(g);
    layer_acts la = forward_target(g, a, layer);
    layer_forward_body(g, &h, lp, layer_input(a, layer), &la, a->B, a->seq, a->scratch);
}

void gpt_layer_backward(const gpt_layout *g, const void *lp, void *gp, gpt_acts *a, int layer,
                        gpt_grad_scratch *s) {
    gpt_layer_hooks h = gpt_default_hooks(g);
    layer_backward_body(g, &h, GPT_PASS_FUSED, lp, gp, a, layer, s, NULL);
}

void gpt_forward_with(const gpt_layout *g, const gpt_layer_hooks *h, const void *params, gpt_acts *a) {
    const long begin = range_begin(g, h, a->lo);
    int ev;
    if (a->lo == 0) {
        ev = segment(h, -1, "embed_fwd");
        gpt_embed_forward(g, params, a); /* tensor parallelism: replicated, the same x on every rank */
        segment(h, ev, NULL);
    }
    for (int l = a->lo; l < a->hi; l++) {
        layer_acts la = forward_target(g, a, l); /* --recompute decides where */
        layer_forward_body(g, h, value_at(params, block_at(g, h, l) - begin), layer_input(a, l), &la, a->B, a->seq,
                           a->scratch);
    }
    if (a->hi == g->cfg.layers) {
        ev = segment(h, -1, "head_fwd");
        gpt_head_forward(g, value_at(params, block_at(g, h, a->hi) - begin), a);
        segment(h, ev, NULL);
    }
}

void gpt_forward(const gpt_layout *g, const void *params, gpt_acts *a) {
    gpt_layer_hooks h = gpt_default_hooks(g);
    gpt_forward_with(g, &h, params, a);
}

void *gpt_backward_with(const gpt_layout *g, const gpt_layer_hooks *h, const void *params, void *grads,
                        gpt_acts *a, gpt_grad_scratch *s, const void *dout, float dloss, grads_ready_fn ready,
                        void *ready_ctx) {
    const int L = g->cfg.layers;
    const long begin = range_begin(g, h, a->lo);
    s->dloss = dloss;
    if (a->hi == L) {
        int ev = segment(h, -1, "head_bwd");
        long o = block_at(g, h, L) - begin;
        gpt_head_backward(g, value_at(params, o), value_at(grads, o), a, s, dloss);
        segment(h, ev, NULL);
        if (ready) ready(ready_ctx, block_at(g, h, L), block_at(g, h, L) + g->head_size);
    } else {
        mem_copy(s->dres, dout, (size_t)block_tokens(a) * g->cfg.d_model * value_bytes());
    }
    for (int l = a->hi - 1; l >= a->lo; l--) {
        long o = block_at(g, h, l) - begin;
        layer_backward_body(g, h, GPT_PASS_FUSED, value_at(params, o), value_at(grads, o), a, l, s, NULL);
        if (ready) ready(ready_ctx, block_at(g, h, l), block_at(g, h, l + 1));
    }
    if (a->lo != 0) return s->dres;
    int ev = segment(h, -1, "embed_bwd");
    gpt_embed_backward(g, grads, a, s); /* s->dres: whole, or this rank's positions */
    segment(h, ev, NULL);
    if (ready) ready(ready_ctx, 0, g->embed_size);
    return NULL;
}

void *gpt_backward(const gpt_layout *g, const void *params, void *grads, gpt_acts *a,
                   gpt_grad_scratch *s, const void *dout, float dloss,
                   grads_ready_fn ready, void *ready_ctx) {
    gpt_layer_hooks h = gpt_default_hooks(g);
    return gpt_backward_with(g, &h, params, grads, a, s, dout, dloss, ready, ready_ctx);
}

void *gpt_backward_input_with(const gpt_layout *g, const gpt_layer_hooks *h, const void *params, gpt_acts *a,
                              gpt_grad_scratch *s, gpt_wgrads *w, const void *dout, float dloss) {
    const long begin = range_begin(g, h, a->lo);
    const size_t nc = (size_t)block_tokens(a) * g->cfg.d_model * value_bytes();
    s->dloss = dloss; /* every stage's: the layers' aux-loss gradients (experts) scale by it */
    if (a->hi == g->cfg.layers) head_backward_input(g, value_at(params, block_at(g, h, a->hi) - begin), a, s, w, dloss);
    else mem_copy(s->dres, dout, nc);
    for (int l = a->hi - 1; l >= a->lo; l--)
        layer_backward_body(g, h, GPT_PASS_INPUT, value_at(params, block_at(g, h, l) - begin), NULL, a, l, s,
                            &w->layer[l - a->lo]);
    if (a->lo != 0) return s->dres;
    mem_copy(w->dx, s->dres, nc); /* the embedding's W reads it */
    return NULL;
}

void *gpt_backward_input(const gpt_layout *g, const void *params, gpt_acts *a, gpt_grad_scratch *s,
                         gpt_wgrads *w, const void *dout, float dloss) {
    gpt_layer_hooks h = gpt_default_hooks(g);
    return gpt_backward_input_with(g, &h, params, a, s, w, dout, dloss);
}

/* In the fused backward's order (each tensor's gradient is its own sum, so
 * the order does not change a bit, but it reads the same). */
void gpt_backward_weight_with(const gpt_layout *g, const gpt_layer_hooks *h, void *grads, const gpt_acts *a,
                              const gpt_wgrads *w) {
    const long begin = range_begin(g, h, a->lo);
    if (a->hi == g->cfg.layers) head_backward_weight(g, value_at(grads, block_at(g, h, a->hi) - begin), a, w);
    for (int l = a->hi - 1; l >= a->lo; l--)
        layer_backward_body(g, h, GPT_PASS_WEIGHT, NULL, value_at(grads, block_at(g, h, l) - begin), a, l, NULL,
                            (layer_wgrads *)&w->layer[l - a->lo]);
    if (a->lo == 0) embed_backward_weight(g, grads, a, w);
}

void gpt_backward_weight(const gpt_layout *g, void *grads, const gpt_acts *a, const gpt_wgrads *w) {
    gpt_layer_hooks h = gpt_default_hooks(g);
    gpt_backward_weight_with(g, &h, grads, a, w);
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
    return sum / (double)n + moe_aux_loss(g, a);
}

long gpt_mlp_width(const gpt_config *c) {
    return c->experts > 0 && c->expert_width > 0 ? c->expert_width : 4L * c->d_model;
}

double gpt_flops_per_token(const gpt_layout *g) {
    double L = g->cfg.layers, T = g->cfg.seq, C = g->cfg.d_model;
    /* the embeddings are lookups, not matmuls: leave wte and wpe out; with
     * experts a token runs k of the E experts' MLPs (2 C M + M + C each, M hidden units) */
    const double M = (double)gpt_mlp_width(&g->cfg);
    double matmul_params = (double)(g->total - g->embed_size);
    if (g->cfg.experts > 0) matmul_params -= L * (g->cfg.experts - g->cfg.top_k) * (2.0 * C * M + M + C);
    return 6.0 * matmul_params + 12.0 * L * T * C;
}
