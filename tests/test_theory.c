/* theory/ against the code it describes, on many shapes: the exact activation
 * and scratch bytes against what common/model.c allocates (full widths and a
 * TP rank's), parameter counts against gpt_range and lab05's tp_range, FLOPs
 * against gpt_flops_per_token; the published and schedule formulas against
 * values worked out by hand from their papers; and the schedule formulas
 * against lab04's lists (lab04_1f1b/schedule.c), counted and simulated. */
#include "device.h"
#include "kernels.h"
#include "mem.h"
#include "model.h"
#include "moe.h"
#include "predict.h"
#include "sequence_parallel.h"
#include "theory.h"
#include "schedule.h"
#include "tp.h"
#include <math.h>
#include <stdio.h>

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); failures++; } } while (0)

/* in the run's precision (g_precision): the exact forms of fp32 and of bf16 */
/* --experts: theory's total parameters = the layout's, its FLOPs per token =
 * gpt_flops_per_token's (the active parameters), and both by hand */
static void check_experts(long E, long k) {
    const long V = 256, T = 64, L = 8, C = 128, H = 4;
    gpt_config cfg = {.vocab = (int)V, .seq = (int)T, .layers = (int)L, .d_model = (int)C, .heads = (int)H,
                      .experts = (int)E, .top_k = (int)k};
    gpt_layout g;
    gpt_layout_init(&g, &cfg);
    th_model m = th_course_model(V, T, L, C, H), dense = m;
    m.experts = E;
    m.top_k = k;
    const th_params p = th_param_counts(&m), d = th_param_counts(&dense);
    const double mlp = 8.0 * C * C + 5.0 * C; /* fc 4C x C + 4C, proj C x 4C + C */
    CHECK(p.total == (double)g.total, "experts %ld: params %ld, theory %.0f", E, g.total, p.total);
    CHECK(p.total == d.total + L * ((E - 1) * mlp + E * C), "experts %ld: total %.0f by hand", E, p.total);
    CHECK(p.active == d.total + L * ((k - 1) * mlp + E * C), "experts %ld top-%ld: active %.0f by hand", E, k,
          p.active);
    CHECK(fabs(th_flops_per_token(&m) - gpt_flops_per_token(&g)) <= 1e-9 * gpt_flops_per_token(&g),
          "experts %ld top-%ld: flops/token %g vs the model's %g", E, k, th_flops_per_token(&m),
          gpt_flops_per_token(&g));
    CHECK(th_flops_per_token(&m) == th_flops_per_token(&dense) + 6.0 * L * ((k - 1) * mlp + E * C),
          "experts %ld top-%ld: flops/token by hand", E, k);
    printf("tiny model, %ld experts top-%ld: %.3fM parameters, %.3fM active (dense %.3fM); %.2f MFLOP per token "
           "(dense %.2f)\n", E, k, p.total / 1e6, p.active / 1e6, d.total / 1e6, th_flops_per_token(&m) / 1e6,
           th_flops_per_token(&dense) / 1e6);
    /* lab01-lab04's blocks with --experts: the activations (k N slots' fch and
     * GELU, the router state, the statistics), the backward scratch and the
     * weight half's inputs (the zero-bubble schedules), each the allocator's
     * byte for byte, in both precisions and every --recompute mode, on every
     * range of layers */
    for (int prec = PREC_FP32; prec <= PREC_BF16; prec++) {
        precision_use((precision)prec);
        for (int mode = 0; mode < RECOMPUTE_MODES; mode++) {
            gpt_config rc = cfg;
            rc.recompute = mode;
            gpt_layout gr;
            gpt_layout_init(&gr, &rc);
            const th_opts o = th_opts_run(1, 0, mode, prec == PREC_BF16);
            for (int lo = 0; lo < L; lo += 3)
                for (int hi = lo + 1; hi <= L; hi += 2)
                    for (long rows = 1; rows <= 2; rows++) {
                        gpt_acts a;
                        gpt_acts_alloc(&a, &gr, lo, hi, (int)rows);
                        const double acts = th_course_acts_bytes(&m, &o, lo, hi, rows);
                        const th_acts_parts parts = th_course_acts_parts(&m, &o, lo, hi, rows);
                        CHECK(acts == (double)a.bytes && (double)mem_current(MEM_ACTS) == acts &&
                              parts.quadratic + parts.linear + parts.other == acts,
                              "experts %ld top-%ld %s --recompute %s [%d,%d) rows %ld: acts allocator %ld, "
                              "theory %.0f", E, k, precision_name(g_precision), recompute_names[mode], lo, hi, rows,
                              a.bytes, acts);
                        gpt_acts_free(&a);
                        gpt_wgrads w;
                        gpt_wgrads_alloc(&w, &gr, lo, hi, (int)rows);
                        const double got = th_course_wgrads_bytes(&m, &o, lo, hi, rows);
                        CHECK(got == (double)w.bytes && (double)mem_current(MEM_ACTS) == got,
                              "experts %ld top-%ld %s --recompute %s [%d,%d) rows %ld: wgrads allocator %ld, "
                              "theory %.0f", E, k, precision_name(g_precision), recompute_names[mode], lo, hi, rows,
                              w.bytes, got);
                        gpt_wgrads_free(&w);
                    }
            for (long rows = 1; rows <= 3; rows++) {
                gpt_grad_scratch sc;
                gpt_scratch_alloc(&sc, &gr, (int)rows);
                const double want = (double)mem_current(MEM_WORKSPACE), got = th_course_scratch_bytes(&m, &o, rows);
                CHECK(got == want, "experts %ld top-%ld %s --recompute %s rows %ld: scratch allocator %.0f, theory %.0f",
                      E, k, precision_name(g_precision), recompute_names[mode], rows, want, got);
                gpt_scratch_free(&sc);
            }
        }
    }
    precision_use(PREC_FP32);
}

static void check_course_shape(long V, long T, long L, long C, long H) {
    gpt_config cfg = {.vocab = (int)V, .seq = (int)T, .layers = (int)L, .d_model = (int)C, .heads = (int)H};
    gpt_layout g;
    gpt_layout_init(&g, &cfg);
    th_model m = th_course_model(V, T, L, C, H);
    const int bf16 = g_precision == PREC_BF16;
    th_opts one = th_opts_precision(1, bf16);
    CHECK(th_param_counts(&m).total == (double)g.total, "params %ld: theory %.0f", g.total, th_param_counts(&m).total);
    CHECK(fabs(th_flops_per_token(&m) - gpt_flops_per_token(&g)) <= 1e-9 * gpt_flops_per_token(&g),
          "flops/token C=%ld: %g vs %g", C, th_flops_per_token(&m), gpt_flops_per_token(&g));
    for (int t = 1; t <= H; t++) {
        if (H % t) continue;
        th_opts o = th_opts_precision(t, bf16);
        tp_layout tl;
        tp_layout_init(&tl, &cfg, t, 0);
        for (int lo = 0; lo < L; lo++)
            for (int hi = lo + 1; hi <= L; hi++) {
                long begin, end;
                tp_range(&tl, lo, hi, &begin, &end);
                CHECK(th_stage_params(&m, &o, lo, hi) == (double)(end - begin),
                      "t=%d layers [%d,%d): %ld params, theory %.0f", t, lo, hi, end - begin, th_stage_params(&m, &o, lo, hi));
                if (t == 1) {
                    gpt_range(&g, lo, hi, &begin, &end);
                    CHECK(th_stage_params(&m, &one, lo, hi) == (double)(end - begin), "gpt_range [%d,%d)", lo, hi);
                }
                for (long rows = 1; rows <= 3; rows++) {
                    gpt_acts a;
                    if (t == 1) gpt_acts_alloc(&a, &g, lo, hi, (int)rows);
                    else tp_acts_alloc(&a, &tl, lo, hi, (int)rows);
                    double want = (double)a.bytes, got = th_course_acts_bytes(&m, &o, lo, hi, rows);
                    CHECK(got == want && (double)mem_current(MEM_ACTS) == want,
                          "acts %s V=%ld T=%ld C=%ld H=%ld t=%d [%d,%d) rows %ld: allocator %.0f, theory %.0f",
                          precision_name(g_precision), V, T, C, H, t, lo, hi, rows, want, got);
                    gpt_acts_free(&a);
                    gpt_wgrads w;
                    if (t == 1) gpt_wgrads_alloc(&w, &g, lo, hi, (int)rows);
                    else tp_wgrads_alloc(&w, &tl, lo, hi, (int)rows);
                    want = (double)w.bytes;
                    got = th_course_wgrads_bytes(&m, &o, lo, hi, rows);
                    CHECK(got == want && (double)mem_current(MEM_ACTS) == want,
                          "wgrads V=%ld T=%ld C=%ld H=%ld t=%d [%d,%d) rows %ld: allocator %.0f, theory %.0f",
                          V, T, C, H, t, lo, hi, rows, want, got);
                    gpt_wgrads_free(&w);
                }
            }
        for (long rows = 1; rows <= 3; rows++) {
            gpt_grad_scratch s;
            if (t == 1) gpt_scratch_alloc(&s, &g, (int)rows);
            else tp_scratch_alloc(&s, &tl, (int)rows);
            double want = (double)mem_current(MEM_WORKSPACE), got = th_course_scratch_bytes(&m, &o, rows);
            CHECK(got == want, "scratch %s C=%ld t=%d rows %ld: allocator %.0f, theory %.0f", precision_name(g_precision),
                  C, t, rows, want, got);
            gpt_scratch_free(&s);
        }
    }
}

/* Sequence parallelism and --recompute: every combination's activations,
 * scratch and weight-gradient blocks against the allocator, on every range
 * and rank; the parts add up; the partial gradients SP sums are
 * th_sp_partial_params. */
static void check_course_options(long V, long T, long L, long C, long H) {
    th_model m = th_course_model(V, T, L, C, H);
    for (int mode = 0; mode < RECOMPUTE_MODES; mode++)
        for (int t = 1; t <= H; t++)
            for (int sp = 0; sp <= 1; sp++) {
                if (H % t || (sp && T % t)) continue;
                gpt_config cfg = {.vocab = (int)V, .seq = (int)T, .layers = (int)L, .d_model = (int)C, .heads = (int)H,
                                  .recompute = mode};
                th_opts o = th_opts_run(t, sp, mode, 0);
                for (int rank = 0; rank < t; rank++) {
                    tp_layout tl;
                    tp_layout_init(&tl, &cfg, t, rank);
                    tp_layout_sequence_parallel(&tl, sp);
                    for (int lo = 0; lo < L; lo++)
                        for (int hi = lo + 1; hi <= L; hi++)
                            for (long rows = 1; rows <= 2; rows++) {
                                gpt_acts a;
                                gpt_wgrads w;
                                tp_acts_alloc(&a, &tl, lo, hi, (int)rows);
                                tp_wgrads_alloc(&w, &tl, lo, hi, (int)rows);
                                th_acts_parts parts = th_course_acts_parts(&m, &o, lo, hi, (long)rows);
                                double got = th_course_acts_bytes(&m, &o, lo, hi, rows);
                                CHECK(got == (double)a.bytes && parts.quadratic + parts.linear + parts.other == got,
                                      "acts %s t=%d sp=%d rank %d T=%ld [%d,%d) rows %ld: allocator %ld, theory %.0f",
                                      recompute_names[mode], t, sp, rank, T, lo, hi, rows, a.bytes, got);
                                CHECK(th_course_wgrads_bytes(&m, &o, lo, hi, rows) == (double)w.bytes,
                                      "wgrads %s t=%d sp=%d [%d,%d) rows %ld: allocator %ld, theory %.0f",
                                      recompute_names[mode], t, sp, lo, hi, rows, w.bytes,
                                      th_course_wgrads_bytes(&m, &o, lo, hi, rows));
                                CHECK(!sp || t == 1 || sp_partial_elems(&tl, lo, hi) == th_sp_partial_params(&m, lo, hi),
                                      "partial gradients [%d,%d): %ld, theory %.0f", lo, hi,
                                      sp_partial_elems(&tl, lo, hi), th_sp_partial_params(&m, lo, hi));
                                CHECK(a.seq * (sp ? t : 1) == T && a.seq_first == (sp && t > 1 ? rank : 0) * a.seq,
                                      "t=%d sp=%d rank %d holds positions [%d, +%d)", t, sp, rank, a.seq_first, a.seq);
                                gpt_wgrads_free(&w);
                                gpt_acts_free(&a);
                            }
                    for (long rows = 1; rows <= 2; rows++) {
                        gpt_grad_scratch sc;
                        tp_scratch_alloc(&sc, &tl, (int)rows);
                        double want = (double)mem_current(MEM_WORKSPACE), got = th_course_scratch_bytes(&m, &o, rows);
                        CHECK(got == want, "scratch %s t=%d sp=%d rows %ld: allocator %.0f, theory %.0f",
                              recompute_names[mode], t, sp, rows, want, got);
                        gpt_scratch_free(&sc);
                    }
                }
            }
    /* the T^2 term goes with selective and full, and full keeps one [Ns,C] per layer */
    th_opts none = th_opts_run(2, 1, 0, 0), sel = th_opts_run(2, 1, 1, 0), full = th_opts_run(2, 1, 2, 0);
    th_acts_parts pn = th_course_acts_parts(&m, &none, 0, (int)L, 2), ps = th_course_acts_parts(&m, &sel, 0, (int)L, 2),
                  pf = th_course_acts_parts(&m, &full, 0, (int)L, 2);
    CHECK(pn.quadratic > 0 && ps.quadratic == 0 && ps.linear == pn.linear && pf.quadratic == 0 && pf.other == pn.other,
          "parts: selective drops exactly att, full keeps the rest of the range");
}

static void check_published(void) {
    /* GPT-3 175B's layer (Korthikanti et al. 2022, section 4 worked numbers):
     * s = 2048, h = 12288, a = 96, b = 1, t = 8 */
    th_model m = th_course_model(51200, 2048, 96, 12288, 96);
    m.dropout = 1; /* the paper's GPT has dropout: its masks are in Table 2 */
    double s = 2048, h = 12288, a = 96, t = 8, sbh = s * h;
    th_opts o = {.precision = PREC_BF16, .tp = 8};
    CHECK(fabs(th_published_layer_acts_bytes(&m, &o, 1) - sbh * (10 + 24 / t + 5 * a * s / (h * t))) < 1,
          "Table 2, tensor parallel");
    o.sequence_parallel = 1;
    CHECK(fabs(th_published_layer_acts_bytes(&m, &o, 1) - sbh * (34 / t + 5 * a * s / (h * t))) < 1, "Table 2, TP + SP");
    o.recompute = RECOMPUTE_SELECTIVE;
    CHECK(fabs(th_published_layer_acts_bytes(&m, &o, 1) - sbh * 34 / t) < 1, "Table 2, TP + SP + selective");
    o.sequence_parallel = 0;
    CHECK(fabs(th_published_layer_acts_bytes(&m, &o, 1) - sbh * (10 + 24 / t)) < 1, "Table 2, TP + selective");
    o.recompute = RECOMPUTE_FULL;
    CHECK(th_published_layer_acts_bytes(&m, &o, 1) == 2 * sbh, "Table 2, full recomputation");
    o = (th_opts){.precision = PREC_BF16, .tp = 1};
    CHECK(fabs(th_published_layer_acts_bytes(&m, &o, 1) - sbh * (34 + 5 * a * s / h)) < 1, "Table 2, no parallelism");
    /* without dropout (Llama): the two masks (2 sbh) and the scores' mask (a s^2) are not kept */
    m.dropout = 0;
    CHECK(fabs(th_published_layer_acts_bytes(&m, &o, 1) - sbh * (32 + 4 * a * s / h)) < 1, "no dropout: 32 sbh + 4as^2");
    m.dropout = 1;
    /* Llama 3's balanced pipeline: 126 layers over 128 stages, the ends empty; over 16, 7 + 8 x 14 + 7 */
    int lo, hi, ok_ends = 1, total = 0;
    for (int st = 0; st < 128; st++) {
        th_stage_layers_ends(126, 128, st, &lo, &hi);
        ok_ends &= hi - lo == (st == 0 || st == 127 ? 0 : 1) && lo == (st ? st - 1 : 0);
    }
    for (int st = 0; st < 16; st++) {
        th_stage_layers_ends(126, 16, st, &lo, &hi);
        ok_ends &= hi - lo == (st == 0 || st == 15 ? 7 : 8) && lo == total;
        total += hi - lo;
    }
    CHECK(ok_ends && total == 126 && th_stage_split_ends_possible(126, 128) && !th_stage_split_ends_possible(126, 129),
          "th_stage_layers_ends: the embedding and the head take a layer's place");
    /* ZeRO paper: 16 bytes per parameter under mixed precision, sharded by stage */
    th_states z = th_model_states(1e9, &o, 0, 64);
    CHECK(z.params + z.grads + z.optim == 16e9, "bf16 stage 0: 16 bytes per parameter");
    z = th_model_states(1e9, &o, 3, 64);
    CHECK(fabs(z.params + z.grads + z.optim - 16e9 / 64) < 1, "bf16 stage 3: 16 Psi / N");
    z = th_model_states(1e9, &o, 1, 64);
    CHECK(fabs(z.params + z.grads + z.optim - (4e9 + 12e9 / 64)) < 1, "bf16 stage 1: 4 Psi + 12 Psi / N");
    /* ... and its Table 1 row (Psi = 7.5B, N = 64, K = 12): 120 GB, 31.4, 16.6, 1.9 */
    const double paper[4] = {120, 31.4, 16.6, 1.9};
    for (int st = 0; st <= 3; st++) {
        z = th_model_states(7.5e9, &o, st, 64);
        double gb = (z.params + z.grads + z.optim) / 1e9;
        CHECK(fabs(gb - paper[st]) < 0.05, "ZeRO paper stage %d: %.3f GB, the paper %.1f", st, gb, paper[st]);
    }
    /* Llama-3-70B's published shape counts 70.6B parameters */
    th_model l = {.vocab = 128256, .seq = 8192, .layers = 80, .d_model = 8192, .heads = 64, .kv_heads = 8,
                  .ffn = 28672, .gated_mlp = 1};
    double n = th_param_counts(&l).total;
    CHECK(n > 70.5e9 && n < 70.6e9, "llama3-70b: %.4g parameters", n);
    /* a head wider than d_model / heads (Qwen3-235B: 64 of 128 over 4096, 4 K/V heads): Q and the projection
     * 8192 wide, by hand; 235B total and 22B active, as its report says; the causal count drops half the core */
    th_model q = {.vocab = 151936, .seq = 4096, .layers = 94, .d_model = 4096, .heads = 64, .kv_heads = 4,
                  .head_dim = 128, .ffn = 12288, .gated_mlp = 1, .experts = 128, .top_k = 8, .ffn_expert = 1536};
    const th_params qp = th_param_counts(&q);
    const double attn = 4096.0 * (8192 + 2 * 512) + 8192.0 * 4096, expert = 3 * 4096.0 * 1536;
    CHECK(th_attn_width(&q) == 8192 && th_kv_width(&q) == 512, "qwen3: Q %g and K %g wide", th_attn_width(&q),
          th_kv_width(&q));
    CHECK(qp.layer == attn + 2 * 4096 + 128 * expert + 128 * 4096, "qwen3: a layer by hand (%.6g)", qp.layer);
    CHECK(qp.layer_sharded == attn, "qwen3: TP splits attention's matrices");
    CHECK(fabs(qp.total / 235.1e9 - 1) < 0.001 && fabs(qp.active / 22.2e9 - 1) < 0.005, "qwen3: %.4g total, %.4g active",
          qp.total, qp.active);
    const double full = th_flops_per_token(&q), causal = th_causal_flops_per_token(&q);
    CHECK(full - causal == 6.0 * 94 * 4096 * 8192 && fabs(causal / 148.0e9 - 1) < 0.005,
          "qwen3: %.5g FLOPs a token, %.5g causal (Megatron's count 148.0G)", full, causal);
    /* Megatron-Core's --recompute-modules layernorm moe_act on a Qwen3 layer (TP 2, SP, flash attention): the
     * norms' outputs 4 sbh and the 8 routed experts' activation outputs 2 x 8 x 1536 sb leave the layer's
     * bytes, over t under SP (b = 1) */
    th_opts qo = {.precision = PREC_BF16, .tp = 2, .sequence_parallel = 1, .recompute = RECOMPUTE_SELECTIVE};
    const double kept = th_published_layer_acts_bytes(&q, &qo, 1), sb = 4096;
    qo.recompute_modules = TH_RECOMPUTE_NORMS;
    const double norms_dropped = kept - th_published_layer_acts_bytes(&q, &qo, 1);
    qo.recompute_modules = TH_RECOMPUTE_NORMS | TH_RECOMPUTE_EXPERT_ACT;
    const double both_dropped = kept - th_published_layer_acts_bytes(&q, &qo, 1);
    CHECK(norms_dropped == 4 * sb * 4096 / 2 && both_dropped == norms_dropped + 2 * 8 * 1536 * sb / 2,
          "qwen3: recomputing the norms drops %.6g bytes (want %.6g), and the experts' activation %.6g more",
          norms_dropped, 4 * sb * 4096 / 2, both_dropped - norms_dropped);
    qo.recompute = RECOMPUTE_FULL;
    const double full_with = th_published_layer_acts_bytes(&q, &qo, 1);
    qo.recompute_modules = 0;
    CHECK(full_with == th_published_layer_acts_bytes(&q, &qo, 1), "qwen3: full recomputation keeps the input alone");
    /* the head width left 0 is d_model / heads: the same counts as before it existed */
    th_model w = l;
    w.head_dim = 128;
    CHECK(th_param_counts(&w).total == n && th_flops_per_token(&w) == th_flops_per_token(&l), "llama3-70b: head 128");
}

/* plan3d's fourth and fifth dimensions: DeepSeek-V3's fine-grained MoE (671B
 * total, 37B active per its report; MLA counted as multi-head attention), its
 * layers' parameters over stages and EP ranks, the all-to-all's bytes, and CP
 * dividing the published activations. */
static void check_cp_ep(void) {
    th_model m = {.vocab = 129280, .seq = 4096, .layers = 61, .d_model = 7168, .heads = 128, .kv_heads = 128,
                  .ffn = 18432, .gated_mlp = 1, .experts = 256, .top_k = 8, .ffn_expert = 2048, .shared_experts = 1,
                  .dense_layers = 3};
    const th_params p = th_param_counts(&m);
    const double C = 7168, expert = 3 * C * 2048, attn = 4 * C * C, norms = 2 * C;
    CHECK(p.layer_experts == 256 * expert, "deepseek-v3: routed experts of a layer %.4g", p.layer_experts);
    CHECK(p.layer == attn + norms + 257 * expert + 256 * C, "deepseek-v3: a MoE layer by hand");
    CHECK(p.dense_layer == attn + norms + 3 * C * 18432, "deepseek-v3: a dense layer by hand");
    CHECK(p.layer_active == attn + norms + 9 * expert + 256 * C, "deepseek-v3: a MoE layer's active parameters");
    CHECK(fabs(p.total - 671e9) < 0.01 * 671e9, "deepseek-v3: %.4g parameters, its report 671B", p.total);
    CHECK(fabs(p.active - 37e9) < 0.05 * 37e9, "deepseek-v3: %.4g active, its report 37B (MLA as MHA)", p.active);
    /* the stages' parameters add up to the model's; at EP e every rank holds 1/e of the routed experts */
    for (int ep = 1; ep <= 64; ep *= 8) {
        th_opts o = {.precision = PREC_BF16, .tp = 1, .ep = ep};
        double sum = 0, experts = 0;
        for (int s = 0; s < 16; s++) {
            int lo, hi;
            th_stage_layers(61, 16, s, &lo, &hi);
            sum += th_stage_params(&m, &o, lo, hi);
            experts += th_stage_expert_params(&m, &o, lo, hi);
        }
        CHECK(fabs(experts - 58 * p.layer_experts / ep) < 1, "ep %d: routed experts per rank %.4g", ep, experts);
        CHECK(fabs(sum - (p.total - 58 * p.layer_experts * (1 - 1.0 / ep))) < 1e-9 * p.total,
              "ep %d: the stages hold %.6g", ep, sum);
    }
    CHECK(th_moe_layers(&m, 0, 3) == 0 && th_moe_layers(&m, 2, 5) == 2 && th_moe_layers(&m, 0, 61) == 58,
          "the first 3 layers dense");
    /* the all-to-all under uniform routing: 4 k N_tok C b (N-1)/N a layer, forward and backward */
    for (int N = 1; N <= 64; N *= 4) {
        th_cp_traffic t = th_ep_layer_traffic(N, 4096, 8, 7168, 2);
        double want = 4.0 * 8 * 4096 * 7168 * 2 * (N - 1) / N;
        CHECK(fabs(t.fwd_sent + t.bwd_sent - want) <= 1e-12 * want && t.fwd_recv == t.fwd_sent,
              "all-to-all at N = %d: %.6g bytes, 4 k N C b (N-1)/N = %.6g", N, t.fwd_sent + t.bwd_sent, want);
    }
    /* CP: every rank keeps T/N positions of every layer, s x s scores as (s/N) x s */
    th_model l = {.vocab = 128256, .seq = 131072, .layers = 80, .d_model = 8192, .heads = 64, .kv_heads = 8,
                  .ffn = 28672, .gated_mlp = 1};
    for (int r = 0; r < 3; r++) {
        th_opts o = {.precision = PREC_BF16, .tp = 8, .sequence_parallel = 1, .recompute = (recompute_mode)r}, c = o;
        c.cp = 16;
        double one = th_published_acts_bytes(&l, &o, 0, 80, 1), split = th_published_acts_bytes(&l, &c, 0, 80, 1);
        CHECK(fabs(one / split - 16) < 1e-12, "recompute %d: activations at CP 16 are 1/%.6g", r, one / split);
    }
}

/* lab07's --max-memory-mb: th_cp_max_seq's T is the last multiple of the step
 * whose predicted peak per rank fits (the next one is over), for the search
 * over T it does, not a formula of its own; none fits: 0; CUDA: not predicted */
static void check_cp_max_seq(void) {
    th_run r = {.ranks = 4, .batch = 4, .model = th_course_model(256, 64, 3, 36, 3), .tp = 1, .pp = 1, .dp = 1,
                .micro_batches = 1, .cp = 4};
    for (int algo = 0; algo < 3; algo++)
        for (double cap = 4 << 20; cap <= 1 << 30; cap *= 8) {
            r.cp_algo = algo;
            const long step = 2 * r.cp, T = th_cp_max_seq(&r, step, cap);
            th_run at = r, next = r;
            at.model.seq = T;
            next.model.seq = T + step;
            CHECK(T > 0 && T % step == 0 && th_predicted_peak_bytes(&at) <= cap && th_predicted_peak_bytes(&next) > cap,
                  "algo %d cap %.0f: largest T %ld, peak %.0f, at T + %ld %.0f", algo, cap, T,
                  th_predicted_peak_bytes(&at), step, th_predicted_peak_bytes(&next));
        }
    CHECK(th_cp_max_seq(&r, 8, 1000) == 0, "a cap under the model states: no T fits");
    r.cuda = 1;
    CHECK(th_cp_max_seq(&r, 8, 1 << 30) == -1, "CUDA's workspace is not predicted");
}

/* lab01's --grad-accum K (th_run.grad_accum): a rank holds the activations and
 * scratch of one micro-batch, B/(N K) rows, as a run of batch B/K would, while
 * its model states and its one all-reduce a step are the whole batch's. */
static void check_grad_accum(void) {
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int rc = 0; rc < 3; rc++)
            for (int K = 2; K <= 4; K *= 2) {
                th_run whole = {.ranks = 2, .bf16 = bf16, .batch = 16, .model = th_course_model(256, 32, 2, 32, 2),
                                .tp = 1, .pp = 1, .dp = 2, .micro_batches = 1, .recompute = rc, .units = 1};
                whole.full_elems = whole.largest_unit_elems = th_param_counts(&whole.model).total;
                th_run accum = whole, small = whole;
                accum.grad_accum = K;
                small.batch = whole.batch / K;
                th_rank_need a[2], w[2], s[2];
                th_predict_run(&accum, a);
                th_predict_run(&whole, w);
                th_predict_run(&small, s);
                for (int k = 0; k < MEM_NCAT; k++)
                    CHECK(a[1].mem[k] == s[1].mem[k], "bf16 %d recompute %d K %d: %s %.0f, at batch B/K %.0f", bf16, rc,
                          K, mem_category_names[k], a[1].mem[k], s[1].mem[k]);
                CHECK(a[1].mem[MEM_ACTS] < w[1].mem[MEM_ACTS], "K %d: fewer activations than K = 1", K);
                for (int k = 0; k < TH_PREDICTED_KINDS; k++)
                    CHECK(a[1].calls[k] == w[1].calls[k] && a[1].payload[k] == w[1].payload[k],
                          "K %d %s: %g calls %.0f B, K = 1 %g calls %.0f B", K, comm_kind_names[k], a[1].calls[k],
                          a[1].payload[k], w[1].calls[k], w[1].payload[k]);
            }
}

/* The activation blocks a chunk holds at its peak, counted on lab04's list of
 * the rank: an F adds one, the backward (W where split) removes it; a split
 * B adds a weight-gradient block, its W removes it. */
static void count_on_list(const schedule *s, int r, int c, int *acts, int *wgrads) {
    int a = 0, w = 0;
    *acts = *wgrads = 0;
    for (int i = 0; i < s->count[r]; i++) {
        schedule_action x = s->rank[r][i];
        if (x.chunk != c) continue;
        a += x.op == OP_F ? 1 : x.op == OP_W || (x.op == OP_B && !s->split) ? -1 : 0;
        w += x.op == OP_B && s->split ? 1 : x.op == OP_W ? -1 : 0;
        if (a > *acts) *acts = a;
        if (w > *wgrads) *wgrads = w;
    }
}

/* theory/'s pipeline formulas against lab04's lists (schedule.c), for every
 * schedule on p = 1..8, the micro-batch counts it accepts up to 3p + 4, and
 * v = 2..4: the blocks in flight counted on the lists, the textbook bubble
 * against the lists simulated on unit times, and the timed bubble against the
 * simulation on random times wherever theory says its form is exact. */
static void check_against_lists(void) {
    unsigned seed = 12345;
    int timed = 0;
    for (int kind = 0; kind < SCHEDULE_KINDS; kind++)
        for (int v = 2; v <= (kind == SCHEDULE_INTERLEAVED ? 4 : 2); v++)
            for (int p = 1; p <= 8; p++)
                for (int m = 1; m <= 3 * p + 4; m++) {
                    char msg[256];
                    const int chunks = schedule_chunks(kind, v);
                    if (!schedule_check(kind, p, m, v, kind == SCHEDULE_INTERLEAVED, p * chunks, msg, sizeof msg)) continue;
                    schedule s;
                    schedule_make(&s, kind, p, m, v);
                    for (int r = 0; r < p; r++)
                        for (int c = 0; c < chunks; c++) {
                            int a, w, ta, tw;
                            count_on_list(&s, r, c, &a, &w);
                            th_chunk_in_flight((th_schedule)kind, p, m, chunks, r, c, &ta, &tw);
                            CHECK(a == ta && w == tw, "%s p=%d m=%d v=%d rank %d chunk %d: lists %d+%d, theory %d+%d",
                                  schedule_name(kind), p, m, chunks, r, c, a, w, ta, tw);
                        }
                    const double unit = schedule_simulated_bubble(&s, 1, 1, 1);
                    CHECK(fabs(unit - th_bubble_unit((th_schedule)kind, p, m, chunks)) < 1e-12,
                          "%s p=%d m=%d v=%d: unit-time bubble simulated %.6f, theory %.6f", schedule_name(kind), p, m,
                          chunks, unit, th_bubble_unit((th_schedule)kind, p, m, chunks));
                    for (int k = 0; k < 8; k++) {
                        double t[3];
                        for (int i = 0; i < 3; i++) t[i] = 0.05 + (seed = seed * 1103515245u + 12345u) % 1000 / 1000.0;
                        if (!s.split) t[2] = t[1]; /* one backward: B + W as one */
                        if (!th_bubble_time_exact((th_schedule)kind, t[0], t[1], t[2])) continue;
                        const double idle = schedule_simulate(&s, t[0], t[1], t[2], NULL) - m * (t[0] + t[1] + t[2]);
                        const double want = th_bubble_time((th_schedule)kind, p, m, chunks, t[0], t[1], t[2]);
                        CHECK(fabs(idle - want) < 1e-9, "%s p=%d m=%d v=%d on %.3f %.3f %.3f: simulated idle %.6f, "
                              "theory %.6f", schedule_name(kind), p, m, chunks, t[0], t[1], t[2], idle, want);
                        timed++;
                    }
                    schedule_free(&s);
                }
    CHECK(timed > 2000, "%d timed comparisons", timed);
}

static void check_schedules(void) {
    const int P[] = {1, 2, 4, 8}, M[] = {1, 2, 4, 8, 16};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) {
            int p = P[i], m = M[j];
            double one = (double)(p - 1) / (m + p - 1);
            CHECK(fabs(th_bubble_unit(TH_SCHED_GPIPE, p, m, 1) - one) < 1e-12, "gpipe p=%d m=%d", p, m);
            CHECK(fabs(th_bubble_unit(TH_SCHED_1F1B, p, m, 1) - one) < 1e-12, "1f1b p=%d m=%d", p, m);
            CHECK(fabs(th_bubble_unit(TH_SCHED_INTERLEAVED, p, m, 2) - (p - 1.0) / (2 * m + p - 1)) < 1e-12,
                  "interleaved v=2 p=%d m=%d", p, m);
            CHECK(fabs(th_bubble_unit(TH_SCHED_ZB_H1, p, m, 1) - (p - 1.0) / (3 * m + p - 1)) < 1e-12, "zb-h1");
            CHECK(fabs(th_bubble_unit(TH_SCHED_ZB_V, p, m, 1) - (p - 1.0) / (6 * m + p - 1)) < 1e-12, "zb-v");
            /* the timed forms with tB + tW = one backward of twice the forward */
            CHECK(fabs(th_bubble_time(TH_SCHED_1F1B, p, m, 1, 1, 1, 1) - 3.0 * (p - 1)) < 1e-12, "1f1b timed");
            CHECK(fabs(th_bubble_time(TH_SCHED_ZB_H1, p, m, 1, 1, 1, 1) - (p - 1.0)) < 1e-12, "zb-h1 timed: a third");
            /* the paper's (p-1)(tF + tB - tW) whenever tW is the smallest */
            CHECK(fabs(th_bubble_time(TH_SCHED_ZB_H1, p, m, 1, 1, 1.2, 0.7) - (p - 1.0) * 1.5) < 1e-12, "zb-h1 paper");
            for (int r = 0; r < p; r++) {
                CHECK(th_acts_in_flight(TH_SCHED_GPIPE, p, r, m, 1) == m, "gpipe in flight");
                CHECK(th_acts_in_flight(TH_SCHED_1F1B, p, r, m, 1) == (m < p - r ? m : p - r), "1f1b in flight");
            }
            if (m >= 2 * p && m % p == 0) /* interleaved, v = 2, stage 0: chunk 0 holds 2p, chunk 1 p */
                CHECK(fabs(th_acts_in_flight(TH_SCHED_INTERLEAVED, p, 0, m, 2) - 1.5 * p) < 1e-12,
                      "interleaved in flight p=%d m=%d: %g", p, m, th_acts_in_flight(TH_SCHED_INTERLEAVED, p, 0, m, 2));
        }
    CHECK(th_schedule_parse("zb-v") == TH_SCHED_ZB_V && th_schedule_parse("1F1B") == -1, "schedule names");
    /* traffic: lab01's all-reduce, lab02's stages, lab05's f and g */
    th_traffic d = th_dp_traffic(1000, 4, 1);
    CHECK(d.ring == 1500 && d.payload == 1000 && d.calls == 1, "dp ring 2(N-1)/N");
    CHECK(th_zero_traffic(1000, 4, 3).ring == 2250 && th_zero_traffic(1000, 4, 2).ring == 1500, "zero 3 = 1.5 x dp");
    th_traffic tp = th_tp_traffic(3, 2, 2, 100, 0);
    CHECK(tp.calls == 24 && tp.payload == 2400 && tp.ring == 2400, "tp: 4 L m all-reduces");
    CHECK(th_tp_traffic(3, 2, 2, 100, 1).ring == tp.ring, "sequence parallel moves the same ring bytes");
    th_opts full = th_opts_run(2, 1, RECOMPUTE_FULL, 0);
    CHECK(th_tp_traffic_run(3, 2, 100, &full).calls == 72 && th_tp_traffic_run(3, 2, 100, &full).ring == 1.5 * tp.ring,
          "--recompute full: the forward's collectives again, 6 per layer");
    CHECK(th_pp_traffic(2, 4, 1, 10).payload == 160, "pp: 2 boundaries x m x 2");
}

/* Context parallelism: the positions are a partition of the sequence; the
 * score formula equals the count over the positions (kernels.h's counter,
 * block by block as the ring meets them) and the figures; the
 * traffic equals sums worked out by hand. */
static void check_context_parallel(void) {
    const th_cp_layout layouts[2] = {TH_CP_CONTIGUOUS, TH_CP_ZIGZAG};
    const long T_all[] = {8, 24, 64, 120, 96};
    for (int ti = 0; ti < 5; ti++)
        for (int N = 1; N <= 6; N++)
            for (int l = 0; l < 2; l++) {
                const long T = T_all[ti];
                if (T % (l ? 2 * N : N)) continue;
                const int n = (int)(T / N);
                int pos[128], seen[128] = {0}, ok = 1;
                double total = 0;
                for (int r = 0; r < N; r++) {
                    for (int i = 0; i < n; i++) {
                        pos[r * n + i] = (int)th_cp_position(T, N, r, i, layouts[l]);
                        ok &= pos[r * n + i] >= 0 && pos[r * n + i] < T && !seen[pos[r * n + i]]++;
                    }
                }
                CHECK(ok, "cp positions T=%ld N=%d %s: not a partition of [0, T)", T, N, l ? "zig-zag" : "contiguous");
                for (int r = 0; r < N; r++) {
                    long counted = 0;
                    for (int s = 0; s < N; s++) counted += attention_unmasked_scores(pos + r * n, n, pos + s * n, n);
                    double f = th_cp_causal_scores(T, N, r, layouts[l]);
                    CHECK(f == (double)counted, "cp scores T=%ld N=%d rank %d %s: counted %ld, formula %.0f", T, N, r,
                          l ? "zig-zag" : "contiguous", counted, f);
                    if (l) CHECK(f == th_cp_causal_scores(T, N, 0, TH_CP_ZIGZAG), "zig-zag is not balanced");
                    total += f;
                }
                CHECK(total == T * (T + 1) / 2.0, "cp scores T=%ld N=%d: %.0f in all, not T(T+1)/2", T, N, total);
            }
    const double contiguous[4] = {136, 392, 648, 904};
    for (int r = 0; r < 4; r++) {
        CHECK(th_cp_causal_scores(64, 4, r, TH_CP_CONTIGUOUS) == contiguous[r], "T=64 N=4 contiguous rank %d", r);
        CHECK(th_cp_causal_scores(64, 4, r, TH_CP_ZIGZAG) == 520, "T=64 N=4 zig-zag rank %d", r);
    }
    /* traffic. N = 2, one sequence of T = 8, C = 4, fp32: a rank's K (or V) is
     * 4 positions x 4 x 4 bytes = 64 B, its Q 64 B.
     *   ring       fwd: K and V one step = 128; bwd: 128 again + dK and dV 2 steps = 256: 384
     *   allgather  fwd: half of the gathered 2 x 128 = 128; bwd: that again + the reduce-scatter: 256
     *   ulysses    half of Q, K, V and the output, 4 x 64: 128 each way
     * N = 4, 2 sequences of T = 16, C = 8, K and V 4 wide (GQA), bf16: K = 2 x 4 x 4 x 2 = 64 B, Q 128 B
     *   ring       fwd 3 steps x 128 = 384; bwd 384 + 4 x 128 = 896
     *   allgather  fwd 384; bwd 768
     *   ulysses    3/4 of (2 x 128 + 2 x 64) = 288 each way */
    const struct { th_cp_algo a; int N; long rows, T, C, kv; double vb, fwd, bwd; } cases[] = {
        {TH_CP_RING, 2, 1, 8, 4, 4, 4, 128, 384},      {TH_CP_ALLGATHER, 2, 1, 8, 4, 4, 4, 128, 256},
        {TH_CP_ULYSSES, 2, 1, 8, 4, 4, 4, 128, 128},   {TH_CP_RING, 4, 2, 16, 8, 4, 2, 384, 896},
        {TH_CP_ALLGATHER, 4, 2, 16, 8, 4, 2, 384, 768}, {TH_CP_ULYSSES, 4, 2, 16, 8, 4, 2, 288, 288},
        {TH_CP_RING, 1, 2, 16, 8, 8, 4, 0, 0},          {TH_CP_ULYSSES, 1, 2, 16, 8, 8, 4, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_cp_traffic t = th_cp_layer_traffic(cases[i].a, cases[i].N, cases[i].rows, cases[i].T, cases[i].C, cases[i].kv,
                                              cases[i].vb);
        CHECK(t.fwd_sent == cases[i].fwd && t.fwd_recv == cases[i].fwd && t.bwd_sent == cases[i].bwd &&
                  t.bwd_recv == cases[i].bwd,
              "cp traffic case %zu: fwd %.0f/%.0f bwd %.0f/%.0f, by hand %.0f and %.0f", i, t.fwd_sent, t.fwd_recv,
              t.bwd_sent, t.bwd_recv, cases[i].fwd, cases[i].bwd);
    }
    /* Ulysses: every rank all T(T+1)/2 scores of its H/N heads, 1/N per model head, whatever the layout */
    CHECK(th_cp_rank_scores(64, 4, 3, TH_CP_CONTIGUOUS, TH_CP_ULYSSES) == 520, "ulysses T=64 N=4: not 2080/4");
    CHECK(th_cp_rank_scores(64, 4, 3, TH_CP_CONTIGUOUS, TH_CP_RING) == 904, "ring's scores are not causal_scores'");
    /* the ring's hiding condition, by hand: 1 sequence, T = 8, N = 2, C = 4, fp32,
     * 18 scores per head on the rank: a block 4 x 4 x 18 / 2 = 144 FLOPs, at 144
     * FLOP/s one second; its K|V message 4 positions x 8 x 4 B = 128 B, at 64 B/s
     * two seconds: not hidden; positions needed 144 x 4 / 64 = 9 > T/N = 4 */
    th_cp_ring_hiding hd = th_cp_ring_hiding_of(1, 8, 2, 4, 4, 18, 144, 64);
    CHECK(hd.block_seconds == 1 && hd.message_seconds == 2 && hd.positions_needed == 9 && !hd.hidden,
          "ring hiding by hand: block %g s, message %g s, %g positions, hidden %d", hd.block_seconds,
          hd.message_seconds, hd.positions_needed, hd.hidden);
    hd = th_cp_ring_hiding_of(1, 8, 2, 4, 4, 18, 144, 256);
    CHECK(hd.message_seconds == 0.5 && hd.hidden, "ring hiding at 4x the bandwidth: message %g s", hd.message_seconds);
    /* the rule of thumb holds with zig-zag's exact scores: T/N at positions_needed
     * and twice it lands either side of block = message (H100-like numbers) */
    for (int twice = 0; twice < 2; twice++) {
        const long T = 4 * 2000L * (1 + twice);
        hd = th_cp_ring_hiding_of(1, T, 4, 1024, 2, th_cp_causal_scores(T, 4, 0, TH_CP_ZIGZAG), 4e14, 4e11);
        CHECK(hd.positions_needed == 2000 && hd.hidden && (twice || hd.block_seconds < 1.01 * hd.message_seconds),
              "ring hiding at T/N = %ld: block %g s, message %g s", T / 4, hd.block_seconds, hd.message_seconds);
    }
    hd = th_cp_ring_hiding_of(1, 4 * 1000L, 4, 1024, 2, th_cp_causal_scores(4000, 4, 0, TH_CP_ZIGZAG), 4e14, 4e11);
    CHECK(!hd.hidden, "ring hiding at T/N = 1000 < 2000 needed: hidden");
}

/* lab08's uniform-routing all-to-all, by hand: N = 4, 512 tokens, k = 2, C = 128, fp32:
 * 4 x 2 x 512 rows of 512 B = 2,097,152 B, 3/4 of it off the rank = 1,572,864 (x 8 layers:
 * the lesson's 12.58MB); N = 2: half, 1,048,576; one rank: nothing. Tokens per expert:
 * 2 x 2048 / 4 = 1024 (the lesson's uniform mean). */
static void check_expert_parallel(void) {
    th_cp_traffic t4 = th_ep_layer_traffic(4, 512, 2, 128, 4), t2 = th_ep_layer_traffic(2, 512, 2, 128, 4),
                  t1 = th_ep_layer_traffic(1, 512, 2, 128, 4);
    CHECK(t4.fwd_sent + t4.bwd_sent == 1572864, "ep all-to-all N=4: %.0f", t4.fwd_sent + t4.bwd_sent);
    CHECK(t4.fwd_recv == t4.fwd_sent && t4.bwd_recv == t4.bwd_sent, "ep all-to-all: received = sent");
    CHECK(t2.fwd_sent + t2.bwd_sent == 1048576, "ep all-to-all N=2");
    CHECK(t1.fwd_sent + t1.bwd_sent == 0, "ep all-to-all N=1");
    CHECK(th_ep_tokens_per_expert_uniform(2048, 2, 4) == 1024, "ep tokens per expert");
    /* copies of a token's row between nodes per all-to-all, by hand: DeepSeek-V3 (k 8, at most 4
     * nodes, EP 64 over 8 nodes of 8): a copy per choice 8 x 7/8 = 7, once per node 4 x 7/8 = 3.5;
     * one node: none; a limit above k or the nodes bounds nothing more (k 2, M 4: 2 x 3/4) */
    /* dropless rows, by hand (8 rows of T = 64, k 2, E 4 over N 2): uniform k N_tok = 1024; skew 1.6:
     * ceil(1638.4) = 1639; skew 3 passes the capacity-free bound 2 x 8 x min(2 x 64, 2 x 64) = 2048 */
    CHECK(th_ep_dropless_rows(8, 64, 2, 4, 2, 1) == 1024 && th_ep_dropless_rows(8, 64, 2, 4, 2, 1.6) == 1639 &&
              th_ep_dropless_rows(8, 64, 2, 4, 2, 3) == 2048,
          "dropless rows: %g %g %g", th_ep_dropless_rows(8, 64, 2, 4, 2, 1), th_ep_dropless_rows(8, 64, 2, 4, 2, 1.6),
          th_ep_dropless_rows(8, 64, 2, 4, 2, 3));
    CHECK(th_ep_cross_node_copies(8, 0, 8) == 7 && th_ep_cross_node_copies(8, 4, 8) == 3.5,
          "cross-node copies, V3: %g per choice, %g node-limited", th_ep_cross_node_copies(8, 0, 8),
          th_ep_cross_node_copies(8, 4, 8));
    CHECK(th_ep_cross_node_copies(8, 4, 1) == 0 && th_ep_cross_node_copies(2, 4, 4) == 1.5 &&
              th_ep_cross_node_copies(8, 16, 2) == 1,
          "cross-node copies: one node %g, k 2 M 4 over 4 nodes %g, M 16 over 2 nodes %g",
          th_ep_cross_node_copies(8, 4, 1), th_ep_cross_node_copies(2, 4, 4), th_ep_cross_node_copies(8, 16, 2));
    /* received rows, by hand (the lesson's tiny model: 8 rows of T = 64 per rank, k = 2, E = 4):
     * F = 1.0, cap = 32 per expert and sequence: --ep 4, one expert each, 4 x 8 x 32 = 1024; --ep 2,
     * two each, 2 x 8 x 64 = 1024; F = 0: min(E/N T, k T) per sequence, 4 x 8 x 64 = 2048 at --ep 4,
     * 2 x 8 x min(128, 128) = 2048 at --ep 2; F = 3.0: cap 96 > T, so T: as F = 0 */
    CHECK(th_ep_received_rows_bound(8, 64, 2, 4, 4, 1.0) == 1024, "ep received rows F=1 N=4");
    CHECK(th_ep_received_rows_bound(8, 64, 2, 4, 2, 1.0) == 1024, "ep received rows F=1 N=2");
    CHECK(th_ep_received_rows_bound(8, 64, 2, 4, 4, 0) == 2048, "ep received rows F=0 N=4");
    CHECK(th_ep_received_rows_bound(8, 64, 2, 4, 2, 0) == 2048, "ep received rows F=0 N=2");
    CHECK(th_ep_received_rows_bound(8, 64, 2, 4, 4, 3.0) == 2048, "ep received rows F=3 (cap past T)");
    CHECK(th_ep_received_rows_bound(8, 64, 1, 8, 2, 1.25) == 2 * 8 * 4 * 10, "ep received rows top-1 E=8: cap 10, 4 each");
}

/* The capacity: common/moe.c's rule and theory's are one rule. The flag's
 * decimal decides the ceiling (0.1 and 1.1 are not exact doubles: ceil of
 * 1.0000000149 or 11.000000000000002 would give a slot more than ceil(k T F / E)
 * written out, issue 34), and a factor past any sequence is no limit (before,
 * ceil(k T F / E) past 2^31 - 1 became a negative int and every choice dropped,
 * issue 31). */
static void check_capacity(void) {
    const struct { int k; long T; double F; int E; long want; } cases[] = {
        {1, 40, 0.1, 4, 1}, {2, 50, 1.1, 10, 11}, {2, 5, 1.0, 4, 3}, {1, 64, 1.25, 4, 20}, {2, 64, 0.3, 6, 7},
        {2, 64, 1e9, 4, 64}, {2, 64, 3.4e38, 4, 64}, {1, 1000000000, 1e9, 4, 1000000000}, {2, 64, 8.0, 4, 64},
        {2, 64, 0, 4, 0}, {8, 4096, 1.0, 256, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gpt_config c = {.seq = (int)cases[i].T, .experts = cases[i].E, .top_k = cases[i].k,
                        .capacity_factor = cases[i].F};
        const long got = moe_capacity(&c);
        const double theory = th_expert_capacity(c.top_k, (double)c.seq, c.capacity_factor, c.experts);
        CHECK(got == cases[i].want, "capacity k %d T %ld F %g E %d: %ld slots, want %ld", c.top_k, cases[i].T,
              c.capacity_factor, c.experts, got, cases[i].want);
        CHECK(theory == (double)(cases[i].want ? cases[i].want : cases[i].T), "th_expert_capacity k %d T %ld F %g E %d: "
              "%.0f", c.top_k, cases[i].T, c.capacity_factor, c.experts, theory);
    }
    /* the two rules agree on every decimal factor 0.01 .. 4 in steps of 0.01, for a spread of shapes */
    for (int f = 1; f <= 400; f++)
        for (int E = 2; E <= 12; E += 5)
            for (int k = 1; k <= 2; k++)
                for (long T = 7; T <= 100; T += 31) {
                    gpt_config c = {.seq = (int)T, .experts = E, .top_k = k, .capacity_factor = f / 100.0};
                    const double exact = (double)((k * T * f + 100L * E - 1) / (100L * E)); /* integer ceiling */
                    const long got = moe_capacity(&c);
                    CHECK(got == (long)fmin(exact, (double)T) &&
                              (double)got == th_expert_capacity(k, (double)T, c.capacity_factor, E),
                          "capacity k %d T %ld F %.2f E %d: moe %ld, theory %.0f, exact %.0f", k, T, f / 100.0, E, got,
                          th_expert_capacity(k, (double)T, c.capacity_factor, E), exact);
                }
}

int main(void) {
    device_use(DEVICE_CPU, 0);
    check_capacity();
    const long shapes[][5] = {{17, 5, 2, 8, 2}, {256, 16, 3, 32, 4}, {256, 7, 4, 24, 6}, {31, 9, 2, 12, 3}};
    for (int p = PREC_FP32; p <= PREC_BF16; p++) {
        precision_use((precision)p);
        for (int i = 0; i < 4; i++) check_course_shape(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]);
    }
    precision_use(PREC_FP32);
    check_experts(4, 2);
    check_experts(4, 1);
    check_experts(8, 2);
    check_course_options(17, 12, 3, 24, 4);
    check_course_options(256, 8, 2, 16, 2);
    check_published();
    check_cp_ep();
    check_cp_max_seq();
    check_grad_accum();
    check_schedules();
    check_against_lists();
    check_context_parallel();
    check_expert_parallel();
    printf("theory: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
