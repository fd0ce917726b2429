/* plan3d: from the labs' measured formulas to a layout for a big model on a cluster.
 *
 * The labs measure every cost on small runs and print it beside a formula;
 * those formulas live in theory/ and this program uses the same functions to
 * answer the question the course ends with: how is a 70B model laid out on a
 * cluster, TP inside a node, PP across nodes, DP over the rest, and why?
 *
 * It enumerates layouts (t x p x d = GPUs, micro-batch size, schedule,
 * interleaving, sequence parallelism, recomputation), keeps those that fit in
 * memory, estimates each one's step time (cost.h says how) and prints the best
 * few. Three more modes tie the estimates to measurements:
 *   --check DIR      predicts every run in DIR/records.jsonl (any lab) from its
 *                    own flags: memory per category and bytes per collective
 *                    exactly, the bubble and the step time on this machine
 *   --calibrate      measures this machine (the course's kernels' FLOP rate,
 *                    AdamW, MPI latency and bandwidth): run under mpirun -n 2
 *   --published FILE predicts published large runs from their layouts and says
 *                    how far off it is (published_runs.tsv)
 *
 * What to look at: the table of layouts, the winner's memory and step-time
 * breakdown, and --explain: the best layout for each value of every knob. */
#include "calibrate.h"
#include "check.h"
#include "cost.h"
#include "plan.h"
#include "published.h"
#include "paths.h"
#include "presets.h"
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OPT_INT, OPT_DOUBLE, OPT_STRING, OPT_BOOL } opt_type;
typedef struct option {
    const char *name;
    opt_type type;
    void *value;
    const char *help;
    double min;          /* numbers: the smallest accepted */
    const char *choices; /* strings: "a|b", NULL: any */
    int given;
} option;

#define MAX_NUMBER 1e15 /* the largest value of a number flag */

/* The largest value of a count flag, and why. The GPUs (and so each of t, cp,
 * p, d) and the layers are bounded so that enumerating every split of the GPUs
 * stays cheap (a fraction of a second at 10^6 GPUs of many divisors) and a
 * layout's loop over its p v rank-chunks short (at most the layers); the
 * costing itself is bounded however many layouts the flags allow (plan.c's
 * WORK_CAP: beyond about a second of it the search costs the most promising
 * splits and says so). */
static long count_limit(const char *flag, const char **why) {
    static const char *const gpu_flags[] = {"--gpus", "--gpus-per-node", "--tp", "--pp", "--dp", "--cp", "--ep"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(flag, gpu_flags[i])) {
            *why = " (the search tries every t x cp x p x d split of the GPUs; the largest published run has 16384)";
            return 1000000;
        }
    if (!strcmp(flag, "--layers")) {
        *why = " (each layout's cost walks its pipeline's chunks of layers; the largest preset has 128)";
        return 4096;
    }
    return 1000000000;
}

static void bad_input(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void bad_input(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static int in_choices(const char *v, const char *choices) {
    size_t n = strlen(v);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && !strncmp(c, v, n)) return 1;
        c += len + (bar ? 1 : 0);
        if (!bar) break;
    }
    return 0;
}

static void parse(option *opts, int n, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        option *o = NULL;
        for (int k = 0; k < n; k++)
            if (!strcmp(a, opts[k].name)) o = &opts[k];
        if (!o) bad_input("%s is not a flag of plan3d (see --help)", a);
        o->given = 1;
        if (o->type == OPT_BOOL) { *(int *)o->value = 1; continue; }
        if (i + 1 >= argc) bad_input("%s needs a value", a);
        const char *v = argv[++i];
        char *end;
        if (o->type == OPT_STRING) {
            if (o->choices && !in_choices(v, o->choices)) bad_input("%s %s: must be one of %s", a, v, o->choices);
            *(const char **)o->value = v;
        } else if (o->type == OPT_INT) {
            long x = strtol(v, &end, 10);
            const char *why = "";
            const long max = count_limit(a, &why);
            if (end == v || *end || x < o->min || x > max)
                bad_input("%s %s: must be a whole number from %g to %ld%s", a, v, o->min, max, why);
            *(int *)o->value = (int)x;
        } else {
            double x = strtod(v, &end);
            if (end == v || *end || !(x >= o->min) || x > MAX_NUMBER)
                bad_input("%s %s: must be a number from %g to %g", a, v, o->min, MAX_NUMBER);
            *(double *)o->value = x;
        }
    }
}

static int opts_given(const option *opts, int n, const char *name) {
    for (int k = 0; k < n; k++)
        if (!strcmp(opts[k].name, name)) return opts[k].given;
    return 0;
}

static void usage(const option *opts, int n) {
    printf("plan3d: lay out a model on a cluster (TP x CP x PP x DP and EP, micro-batches, schedule, SP, recomputation) from the\n"
           "formulas the labs check (theory/), and check those formulas against the labs' records and published runs.\n\n"
           "  ./plan3d                                     llama3-70b on 64 H100s, the best layouts\n"
           "  ./plan3d --model gpt3-175b --cluster a100-80gb --gpus 1024 --explain\n"
           "  mpirun -n 2 ./plan3d --calibrate            measure this machine (writes --calibration)\n"
           "  ./plan3d --check runs                        predict every run recorded in runs/records.jsonl\n"
           "  ./plan3d --published ../plan3d/published_runs.tsv\n\nflags (default in brackets):\n");
    for (int k = 0; k < n; k++) {
        const option *o = &opts[k];
        char def[64] = "";
        if (o->type == OPT_INT) snprintf(def, sizeof def, " [%d]", *(int *)o->value);
        else if (o->type == OPT_DOUBLE) snprintf(def, sizeof def, " [%g]", *(double *)o->value);
        else if (o->type == OPT_STRING) snprintf(def, sizeof def, " [%s]", *(const char **)o->value ? *(const char **)o->value : "none");
        printf("  %-18s %s%s\n", o->name, o->help, def);
    }
    printf("\nmodel presets (--model):\n");
    for (int i = 0; i < n_model_presets; i++) {
        th_params p = th_param_counts(&model_presets[i].m);
        if (model_presets[i].m.experts > 0)
            printf("  %-14s %8.4g B  (%.4g B active) %s\n", model_presets[i].name, p.total / 1e9, p.active / 1e9,
                   model_presets[i].about);
        else printf("  %-14s %8.4g B  %s\n", model_presets[i].name, p.total / 1e9, model_presets[i].about);
    }
    printf("  (Llama's GQA, SwiGLU, RMSNorm and untied head are modelled; BLOOM's ALiBi has no parameters; every other\n"
           "   preset is the GPT shape. MoE presets: total and active (per token) parameters; DeepSeek-V3's MLA attention\n"
           "   is modelled as standard multi-head attention of the same heads and width. Numbers of 0 in the shape flags\n"
           "   keep the preset's.)\ncluster presets (--cluster):\n");
    for (int i = 0; i < n_cluster_presets; i++) printf("  %-10s %s\n", cluster_presets[i].name, cluster_presets[i].source);
}

int main(int argc, char **argv) {
    const char *model_name = "llama3-70b", *cluster_name = "h100", *precision = "bf16", *schedule = "any";
    const char *sp = "any", *recompute = "any", *json = NULL, *check_dir = NULL, *published = NULL;
    const char *calibration = "calibration.json", *split = "equal", *ep_dispatch = "per-choice", *modules = "none";
    int gpus = 64, gpn = 0, layers = 0, d_model = 0, heads = 0, kv_heads = 0, seq = 0, vocab = 0, ffn = 0;
    int global_batch = 512, zero = 1, tp = 0, pp = 0, dp = 0, micro_batch = 0, vp = 0, top = 5, cpd = 0, ep = 0;
    int explain = 0, calibrate = 0, across = 0, help = 0;
    double mem = 0, tflops = 0, eff = 0, intra_gbs = 0, intra_us = 0, inter_gbs = 0, inter_us = 0, hbm = 0;
    double overlap = 0, headroom = 0.1, ep_overlap = 0;
    option opts[] = {
        {"--model", OPT_STRING, &model_name, "a model preset (listed below)", 0, NULL, 0},
        {"--layers", OPT_INT, &layers, "override the preset: layers", 0, NULL, 0},
        {"--d-model", OPT_INT, &d_model, "override: hidden size", 0, NULL, 0},
        {"--heads", OPT_INT, &heads, "override: attention heads", 0, NULL, 0},
        {"--kv-heads", OPT_INT, &kv_heads, "override: K/V heads (grouped-query attention)", 0, NULL, 0},
        {"--seq", OPT_INT, &seq, "override: sequence length", 0, NULL, 0},
        {"--vocab", OPT_INT, &vocab, "override: vocabulary", 0, NULL, 0},
        {"--ffn", OPT_INT, &ffn, "override: MLP hidden width", 0, NULL, 0},
        {"--cluster", OPT_STRING, &cluster_name, "a cluster preset (listed below)", 0, NULL, 0},
        {"--gpus", OPT_INT, &gpus, "GPUs in all (the cpu preset: ranks), at most 1000000", 1, NULL, 0},
        {"--gpus-per-node", OPT_INT, &gpn, "override: GPUs per node (0: the preset's)", 0, NULL, 0},
        {"--gpu-mem", OPT_DOUBLE, &mem, "override: GiB per GPU", 0, NULL, 0},
        {"--gpu-tflops", OPT_DOUBLE, &tflops, "override: dense peak TFLOP/s of --precision", 0, NULL, 0},
        {"--efficiency", OPT_DOUBLE, &eff, "override: fraction of peak the layers' compute reaches", 0, NULL, 0},
        {"--intra-gbs", OPT_DOUBLE, &intra_gbs, "override: GB/s per GPU one way inside a node", 0, NULL, 0},
        {"--intra-us", OPT_DOUBLE, &intra_us, "override: latency per collective step inside a node, us", 0, NULL, 0},
        {"--inter-gbs", OPT_DOUBLE, &inter_gbs, "override: GB/s per GPU one way between nodes", 0, NULL, 0},
        {"--inter-us", OPT_DOUBLE, &inter_us, "override: latency per step between nodes, us", 0, NULL, 0},
        {"--hbm-gbs", OPT_DOUBLE, &hbm, "override: memory bandwidth, GB/s (the optimizer step)", 0, NULL, 0},
        {"--global-batch", OPT_INT, &global_batch, "sequences per step", 1, NULL, 0},
        {"--precision", OPT_STRING, &precision, "fp32 (the labs) or bf16 mixed precision (16 bytes of state per parameter)", 0, "fp32|bf16", 0},
        {"--zero-stage", OPT_INT, &zero, "ZeRO over the DP group: 0 none, 1 optimizer, 2 + gradients, 3 + parameters", 0, NULL, 0},
        {"--dp-overlap", OPT_DOUBLE, &overlap, "share of the DP traffic hidden behind the backward, 0..1", 0, NULL, 0},
        {"--ep-overlap", OPT_DOUBLE, &ep_overlap, "share of the EP all-to-all hidden behind compute, 0..1", 0, NULL, 0},
        {"--ep-dispatch", OPT_STRING, &ep_dispatch, "a token's row between nodes: per-choice (a copy per expert it "
         "chose, Megatron's all-to-all) or per-node (once to each node it reaches, DeepEP)", 0, "per-choice|per-node", 0},
        {"--mem-headroom", OPT_DOUBLE, &headroom, "share of GPU memory kept free (context, NCCL, fragmentation), 0..1", 0, NULL, 0},
        {"--tp", OPT_INT, &tp, "fix the tensor-parallel degree (0: search)", 0, NULL, 0},
        {"--pp", OPT_INT, &pp, "fix the pipeline stages (0: search)", 0, NULL, 0},
        {"--dp", OPT_INT, &dp, "fix the data-parallel replicas (0: search)", 0, NULL, 0},
        {"--cp", OPT_INT, &cpd, "fix the context-parallel degree: every sequence over cp ranks, a ring (0: search)", 0, NULL, 0},
        {"--ep", OPT_INT, &ep, "fix the expert-parallel degree: divides the routed experts and cp x dp (with --sp on: tp x cp x dp) (0: search)", 0, NULL, 0},
        {"--micro-batch", OPT_INT, &micro_batch, "fix the sequences per micro-batch (0: search)", 0, NULL, 0},
        {"--schedule", OPT_STRING, &schedule, "fix the pipeline schedule", 0, "any|gpipe|1f1b|interleaved|zb-h1|zb-v", 0},
        {"--vp", OPT_INT, &vp, "fix the chunks per rank of --schedule interleaved (0: search)", 0, NULL, 0},
        {"--sp", OPT_STRING, &sp, "sequence parallelism", 0, "any|on|off", 0},
        {"--recompute", OPT_STRING, &recompute, "activation recomputation", 0, "any|none|selective|full", 0},
        {"--recompute-modules", OPT_STRING, &modules, "parts of a layer recomputed beside --recompute none or "
         "selective (Megatron-Core's --recompute-modules layernorm moe_act): the norms' outputs, the routed experts' "
         "activation output, or both; elementwise, so memory falls and no time is charged", 0, "none|norm|act|norm,act", 0},
        {"--split", OPT_STRING, &split, "layers over the stages: equal, or ends (the embedding and head take a layer's place: Llama 3)", 0, "equal|ends", 0},
        {"--tp-across-nodes", OPT_BOOL, &across, "let the TP group span nodes (its all-reduces then cross the network)", 0, NULL, 0},
        {"--top", OPT_INT, &top, "layouts to print", 1, NULL, 0},
        {"--explain", OPT_BOOL, &explain, "show how the best layout was reached", 0, NULL, 0},
        {"--json", OPT_STRING, &json, "write every layout to this file (for plots)", 0, NULL, 0},
        {"--check", OPT_STRING, &check_dir, "predict the runs in DIR/records.jsonl and compare", 0, NULL, 0},
        {"--calibration", OPT_STRING, &calibration, "the file --calibrate writes and --check and --cluster cpu read", 0, NULL, 0},
        {"--calibrate", OPT_BOOL, &calibrate, "measure this machine (run under mpirun -n 2)", 0, NULL, 0},
        {"--published", OPT_STRING, &published, "predict the published runs in this TSV file", 0, NULL, 0},
        {"--help", OPT_BOOL, &help, "this text", 0, NULL, 0},
    };
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    parse(opts, n_opts, argc, argv);
    if (help) { usage(opts, n_opts); return 0; }
    if (calibrate) return calibrate_machine(calibration, argc, argv);
    char err[PATH_MAX + 200];
    if (json && path_check_output_file("--json", json, err, sizeof err)) bad_input("%s", err);
    if (check_dir) return check_records(check_dir, calibration, json);
    if (published) return predict_published(published, json);

    const model_preset *mp = find_model(model_name);
    if (!mp) bad_input("--model %s is not a preset (./plan3d --help lists them)", model_name);
    const cluster *cp = find_cluster(cluster_name);
    if (!cp) bad_input("--cluster %s is not a preset (./plan3d --help lists them)", cluster_name);
    th_model m = mp->m;
    if (layers) m.layers = layers;
    if (d_model) m.d_model = d_model;
    if (heads) m.heads = m.kv_heads = heads;
    if (kv_heads) m.kv_heads = kv_heads;
    if (seq) m.seq = seq;
    if (vocab) m.vocab = vocab;
    if (ffn) m.ffn = ffn;
    else if (d_model && !m.gated_mlp) m.ffn = 4 * m.d_model;
    if (m.d_model % m.heads) bad_input("--heads %ld does not divide --d-model %ld", m.heads, m.d_model);
    if (m.heads % m.kv_heads) bad_input("--kv-heads %ld does not divide --heads %ld", m.kv_heads, m.heads);

    cluster c = *cp;
    if (!strcmp(c.name, "cpu")) {
        int loaded = calibration_cluster(calibration, &m, &c, err, sizeof err);
        if (loaded < 0) bad_input("%s", err);
        if (loaded == 0)
            bad_input("--cluster cpu needs --calibration %s: run mpirun -n 2 ./plan3d --calibrate first", calibration);
    }
    if (strcmp(c.name, "cpu") || opts_given(opts, n_opts, "--gpus")) c.gpus = gpus; /* cpu: a rank per core */
    if (gpn) c.gpus_per_node = gpn;
    if (c.gpus_per_node > c.gpus) c.gpus_per_node = c.gpus;
    if (mem) c.mem_gib = mem;
    if (eff) c.efficiency = eff;
    if (intra_gbs) c.intra_gbs = intra_gbs;
    if (intra_us) c.intra_us = intra_us;
    if (inter_gbs) c.inter_gbs = inter_gbs;
    if (inter_us) c.inter_us = inter_us;
    if (hbm) c.hbm_gbs = hbm;
    training tr = {global_batch, !strcmp(precision, "bf16") ? PREC_BF16 : PREC_FP32, zero, overlap, ep_overlap, headroom, !strcmp(split, "ends"),
                   !strcmp(ep_dispatch, "per-node"), 0};
    recompute_modules_parse(modules, &tr.recompute_modules); /* one of the flag's choices */
    if (tr.recompute_modules && !strcmp(recompute, "full"))
        bad_input("--recompute-modules %s: recomputes parts of a layer beside --recompute none or selective; --recompute "
                  "full recomputes every layer whole", modules);
    if ((tr.recompute_modules & TH_RECOMPUTE_EXPERT_ACT) && m.experts <= 0)
        bad_input("--recompute-modules %s: act is the routed experts' activation; --model %s has no experts", modules,
                  model_name);
    if (tflops) *(tr.precision == PREC_BF16 ? &c.bf16_tflops : &c.fp32_tflops) = tflops;
    if (zero > 3) bad_input("--zero-stage %d: must be 0, 1, 2 or 3", zero);
    if (overlap > 1) bad_input("--dp-overlap %g: must be between 0 and 1", overlap);
    if (ep_overlap > 1) bad_input("--ep-overlap %g: must be between 0 and 1", ep_overlap);
    if (headroom >= 1) bad_input("--mem-headroom %g: must be below 1", headroom);
    if (c.efficiency > 1) bad_input("--efficiency %g: must be at most 1", c.efficiency);

    constraints k = {tp, pp, dp, micro_batch, vp, th_schedule_parse(schedule), !strcmp(sp, "any") ? -1 : !strcmp(sp, "on"),
                     !strcmp(recompute, "any") ? -1 : !strcmp(recompute, "none") ? 0 : !strcmp(recompute, "selective") ? 1 : 2,
                     across, cpd, ep};
    /* fixed knobs: the rules a layout must keep, named by their flags */
    if (ep > 1 && m.experts <= 0)
        bad_input("--ep %d needs a model with experts (--model mixtral-8x7b or deepseek-v3)", ep);
    if (ep && m.experts > 0 && m.experts % ep)
        bad_input("--ep %d does not divide the %ld routed experts of --model %s", ep, m.experts, mp->name);
    if (cpd && c.gpus % cpd) bad_input("--cp %d does not divide --gpus %d", cpd, c.gpus);
    if (cpd > 1 && m.seq % (2L * cpd))
        bad_input("--cp %d does not divide --seq %ld into 2 x %d chunks (the ring's zig-zag layout)", cpd, m.seq, cpd);
    /* EP is carved from the DP x CP ranks, or with SP folded over TP too (cost.h's ep_folds_tp): refused
     * when no TP degree the other flags allow (SP on) makes it divide */
    if (ep && cpd && dp && ((long)cpd * dp) % ep) {
        int folds = 0;
        const int top_t = tp ? tp : across ? c.gpus : c.gpus_per_node;
        for (int t = 2; k.sp != 0 && t <= top_t && !folds; t++)
            folds = (!tp || t == tp) && c.gpus % t == 0 && m.heads % t == 0 && ((long)t * cpd * dp) % ep == 0;
        if (!folds && tp > 1 && k.sp != 0)
            bad_input("--ep %d does not divide --tp %d x --cp %d x --dp %d (with SP the EP group is carved from the TP x "
                      "CP x DP ranks)", ep, tp, cpd, dp);
        if (!folds)
            bad_input("--ep %d does not divide --cp %d x --dp %d (the EP group is carved from the DP x CP ranks; with --tp "
                      "and --sp on from TP x CP x DP)", ep, cpd, dp);
    }
    if (tp && c.gpus % tp) bad_input("--tp %d does not divide --gpus %d", tp, c.gpus);
    if (tp && m.heads % tp) bad_input("--tp %d does not divide --heads %ld (each TP rank computes whole heads)", tp, m.heads);
    if (tp > c.gpus_per_node && !across)
        bad_input("--tp %d is more than --gpus-per-node %d (TP's all-reduces need the node's links; --tp-across-nodes "
                  "allows it)", tp, c.gpus_per_node);
    if (tp && c.gpus_per_node % tp && tp < c.gpus_per_node && !across)
        bad_input("--tp %d does not divide --gpus-per-node %d: some TP groups would span two nodes (--tp-across-nodes "
                  "allows it)", tp, c.gpus_per_node);
    int chunks = k.schedule >= 0 ? th_schedule_chunks((th_schedule)k.schedule, vp ? vp : 1) : 1;
    if (pp && (long)pp * chunks > m.layers)
        bad_input("--pp %d x %d chunk%s per rank is more than --layers %ld: every chunk needs a layer", pp, chunks,
                  chunks == 1 ? "" : "s", m.layers);
    long fixed = (long)(tp ? tp : 1) * (cpd ? cpd : 1) * (pp ? pp : 1) * (dp ? dp : 1);
    if (fixed > c.gpus || c.gpus % fixed) { /* name only the flags given */
        char text[128] = "";
        const char *names[4] = {"--tp", "--cp", "--pp", "--dp"};
        const int values[4] = {tp, cpd, pp, dp};
        for (int i = 0; i < 4; i++)
            if (values[i]) snprintf(text + strlen(text), sizeof text - strlen(text), "%s%s %d", text[0] ? " x " : "",
                                    names[i], values[i]);
        bad_input("%s does not divide --gpus %d", text, c.gpus);
    }
    if (tp && pp && dp && cpd && (long)tp * cpd * pp * dp != c.gpus)
        bad_input("--tp %d x --cp %d x --pp %d x --dp %d is not --gpus %d", tp, cpd, pp, dp, c.gpus);
    if (dp && micro_batch && global_batch % ((long)dp * micro_batch))
        bad_input("--global-batch %d is not divisible by --dp %d x --micro-batch %d", global_batch, dp, micro_batch);
    if (dp && global_batch % dp) bad_input("--global-batch %d is not divisible by --dp %d", global_batch, dp);
    if (vp && k.schedule != TH_SCHED_INTERLEAVED) bad_input("--vp %d needs --schedule interleaved", vp);
    if (vp > 16) bad_input("--vp %d: at most 16 chunks per rank", vp);

    plan_result r;
    plan_search(&m, &c, &tr, &k, &r);
    if (r.n == 0) {
        fprintf(stderr, "error: no layout of %d GPUs divides this model and batch (the fixed flags leave none)\n", c.gpus);
        return 2;
    }
    plan_print_header(stdout, mp->name, &m, &c, &tr);
    if (json && !plan_write_json(json, mp->name, &m, &c, &tr, &r)) {
        fprintf(stderr, "error: --json %s: writing the file failed\n", json);
        return 1;
    }
    plan_print_table(stdout, &r, top);
    if (explain) plan_print_explain(stdout, &r);
    if (!r.n_fit) {
        const estimate *e = &r.all[0]; /* the closest: sorted by how far over */
        char lt[160];
        fflush(stdout);
        fprintf(stderr, "nothing fits in %.4g GiB per GPU: the closest layout, %s, needs %.2f GiB, %.2f GiB more "
                        "(more GPUs, --zero-stage 3, or more memory per GPU)\n",
                e->mem_limit / 1073741824.0, layout_text(&e->l, lt, sizeof lt), e->mem_total / 1073741824.0,
                (e->mem_total - e->mem_limit) / 1073741824.0);
        plan_free(&r);
        return 1;
    }
    plan_print_winner(stdout, &r.all[0], &c);
    plan_print_why(stdout, &r, &k);
    plan_free(&r);
    return 0;
}
