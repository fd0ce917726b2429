#define _POSIX_C_SOURCE 200809L
#include "run.h"
#include "kernels.h"
#include "mem.h"
#include "paths.h"
#include "textbuf.h"
#include "trace.h"
#include <cblas.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- flags -------------------------------------------------------------------- */

static flag_spec shared_flags[] = {
    {"--steps", FLAG_INT, NULL, "optimizer steps of this run (with --resume: after the checkpoint's)", 1, NULL},
    {"--batch", FLAG_INT, NULL, "global batch in sequences, summed over data-parallel ranks", 1, NULL},
    {"--seq", FLAG_INT, NULL, "sequence length T (tokens per sequence)", 1, NULL},
    {"--layers", FLAG_INT, NULL, "transformer layers L", 1, NULL},
    {"--d-model", FLAG_INT, NULL, "model width C", 1, NULL},
    {"--heads", FLAG_INT, NULL, "attention heads (must divide --d-model)", 1, NULL},
    {"--preset", FLAG_STRING, NULL, "model shape by name: tiny = the defaults shown here; gpt2-small = "
     "12 layers, d-model 768, 12 heads, seq 1024 (GPT-2 small, byte vocabulary), batch 8. --batch, --seq, "
     "--layers, --d-model, --heads given as well override the preset's value", 0, "tiny|gpt2-small"},
    {"--lr", FLAG_FLOAT, NULL, "AdamW learning rate", 0, NULL},
    {"--weight-decay", FLAG_FLOAT, NULL, "AdamW weight decay on matrices", 0, NULL},
    {"--clip", FLAG_FLOAT, NULL, "clip the global gradient norm to this (0: off)", 0, NULL},
    {"--seed", FLAG_INT, NULL, "seed of the initial weights and of the data order", 0, NULL},
    {"--data", FLAG_STRING, NULL, "train on this text file's bytes instead of the built-in corpus", 0, NULL},
    {"--device", FLAG_STRING, NULL, "where kernels run", 0, "auto|cpu|cuda"},
    {"--comm", FLAG_STRING, NULL, "collectives over MPI or NCCL", 0, "auto|mpi|nccl"},
    {"--out", FLAG_STRING, NULL, "folder for the run record, trace and timeline", 0, NULL},
    {"--save", FLAG_OUTPUT_FILE, NULL, "write a checkpoint (safetensors, any lab can resume it) here at the end", 0, NULL},
    {"--save-every", FLAG_INT, NULL, "also save after every N-th step (0: only at the end)", 0, NULL},
    {"--resume", FLAG_STRING, NULL, "continue from this checkpoint: weights, AdamW moments and step", 0, NULL},
    {"--eval", FLAG_BOOL, NULL, "at the end, the loss on the held-out last 10% of the data", 0, NULL},
    {"--recompute", FLAG_STRING, NULL, "activation recomputation: what a layer keeps for its backward (none: "
     "everything; selective: all but the T x T attention matrix, recomputed from q and k; full: only its output, "
     "its forward rerun before its backward)", 0, RECOMPUTE_CHOICES},
    {"--precision", FLAG_STRING, NULL, "the model's values: fp32, or bf16 mixed precision (bf16 weights, "
     "activations and gradients; fp32 master weights, AdamW moments and arithmetic)", 0, "fp32|bf16"},
    {"--experts", FLAG_INT, NULL, "mixture of experts: every MLP becomes this many experts of its shape and a "
     "router (0: the dense MLP)", 0, NULL},
    {"--top-k", FLAG_INT, NULL, "with --experts: experts per token (ties to the lower index; gates renormalised over "
     "the k, top-1 gates by the probability itself)", 1, NULL},
    {"--expert-width", FLAG_INT, NULL, "with --experts: each expert's hidden units, fine-grained experts narrower "
     "than the dense MLP (DeepSeek-MoE: more experts, each a fraction of the width; 0: 4 d_model, the dense "
     "MLP's)", 0, NULL},
    {"--shared-experts", FLAG_INT, NULL, "with --experts: S shared experts of that width that every token runs beside "
     "its k routed ones, at gate 1, outside the routing (DeepSeek-MoE and V3: 1 shared + 256 routed); computed as "
     "one MLP of S x width units; lab08 holds them on every rank", 0, NULL},
    {"--capacity-factor", FLAG_FLOAT, NULL, "with --experts: each expert takes at most ceil(k T F / E) tokens of a "
     "sequence, in position order; the rest are dropped (0: none dropped)", 0, NULL},
    {"--capacity-scope", FLAG_STRING, NULL, "with --capacity-factor: what the capacity counts, each sequence's "
     "tokens (the same drops at every layout), or a rank's own B/N rows, ceil(k (B/N) T F / E) (drops that change "
     "with the number of ranks: the negative experiment)", 0, "sequence|rank"},
    {"--aux-loss-coef", FLAG_FLOAT, NULL, "with --experts: weight a of Switch's load-balancing loss (a under uniform "
     "routing), added to the loss", 0, NULL},
    {"--router", FLAG_STRING, NULL, "with --experts: the router's scores, softmax over the experts (Switch, "
     "Mixtral), or sigmoid of each logit (DeepSeek-V3), the chosen scores normalised to sum to 1 as gates", 0,
     "softmax|sigmoid"},
    {"--balance", FLAG_STRING, NULL, "with --experts: how the load is balanced, Switch's aux loss "
     "(--aux-loss-coef), or DeepSeek-V3's per-expert bias added to the scores for the choice only and moved by "
     "--bias-speed after each step towards the mean load (no aux loss). Either given: the step line shows the "
     "load imbalance (max/mean choices per expert) and the bias's range", 0, "aux|bias"},
    {"--bias-speed", FLAG_FLOAT, NULL, "with --balance bias: gamma, each step the bias of an expert over (under) "
     "the mean load moves down (up) by it", 0, NULL},
    {"--route-groups", FLAG_INT, NULL, "with --experts: node-limited routing (DeepSeek-V3): the experts in G groups "
     "of E/G consecutive ones (a group stands for a node), and each token's experts from at most "
     "--route-max-groups groups, those whose two best scores sum highest (0: every expert may be chosen)", 0, NULL},
    {"--route-max-groups", FLAG_INT, NULL, "with --route-groups: M, the groups one token's experts may come from "
     "(DeepSeek-V3: 4 of its 8 nodes; 0: half the groups, rounded up)", 0, NULL},
    {"--dry-run", FLAG_BOOL, NULL, "check the flags, print the layout, the hosts and GPUs of the ranks and the memory "
     "and bytes per rank the run will need (theory/'s formulas), then exit 0: nothing trained, --out not created", 0,
     NULL},
    {"--sample", FLAG_INT, NULL, "the model writes this many bytes after the prompt, before and after training "
     "(the same text at every layout as lab01 -n 1; 0: none)", 0, NULL},
    {"--prompt", FLAG_STRING, NULL, "what --sample continues (default: the first line of the training data)", 0, NULL},
    {"--temperature", FLAG_FLOAT, NULL, "--sample's choice: 0 the likeliest byte, else drawn from "
     "softmax(logits / temperature) with --seed", 0, NULL},
    {"--max-memory-mb", FLAG_FLOAT, NULL, "the memory a rank may use, MiB, instead of the machine's (the host's "
     "memory shared by its ranks; on CUDA the GPU's): a run whose predicted peak per rank (theory/predict's sum "
     "over categories; on CUDA without the kernels' own scratch) is over it is refused before anything is "
     "allocated; --dry-run prints the verdict (lab07: and the largest --seq under it). 0: the machine's", 0, NULL},
    {"--hang-timeout", FLAG_FLOAT, NULL, "the watchdog: a communication that waits this many seconds writes every "
     "rank's flight record to OUT/flight and ends the job with status 3; plots/hang_report.py OUT/flight names the "
     "rank, group and call that disagreed (0: no watchdog)", 0, NULL},
    {"--flight-records", FLAG_INT, NULL, "operations each rank's flight recorder keeps, the last ones (0: none)", 0,
     NULL},
    {"--check-collectives", FLAG_BOOL, NULL, "before each collective the group compares (kind, count, type, root, "
     "step) and stops at the first mismatch, before it can hang (a small all-reduce per collective; its cost is "
     "printed)", 0, NULL},
};
#define N_SHARED (int)(sizeof shared_flags / sizeof shared_flags[0])

static void bind_shared(run_options *o) {
    void *values[N_SHARED] = {&o->steps, &o->batch, &o->seq, &o->layers, &o->d_model, &o->heads, &o->preset,
                              &o->lr, &o->weight_decay, &o->clip, &o->seed, &o->data,
                              &o->device, &o->comm, &o->out, &o->save, &o->save_every,
                              &o->resume, &o->eval, &o->recompute, &o->precision, &o->experts, &o->top_k,
                              &o->expert_width, &o->shared_experts, &o->capacity_factor, &o->capacity_scope, &o->aux_loss_coef, &o->router,
                              &o->balance, &o->bias_speed, &o->route_groups, &o->route_max_groups, &o->dry_run,
                              &o->sample, &o->prompt, &o->temperature, &o->max_memory_mb,
                              /* the flight recorder's settings live in comm's recorder (flight.h) */
                              &flight_hang_timeout, &flight_records, &flight_check_collectives};
    for (int i = 0; i < N_SHARED; i++) shared_flags[i].value = values[i];
}

void run_check(run_ctx *ctx, int ok, const char *fmt, ...) {
    if (ok || ctx->error[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    va_end(ap);
}

static void format_value(const flag_spec *f, char *buf, size_t len) {
    switch (f->type) {
    case FLAG_INT: snprintf(buf, len, "%d", *(int *)f->value); break;
    case FLAG_FLOAT: snprintf(buf, len, "%g", *(double *)f->value); break;
    case FLAG_BOOL: snprintf(buf, len, "%s", *(int *)f->value ? "on" : "off"); break;
    case FLAG_STRING:
    case FLAG_OUTPUT_FILE: {
        const char *s = *(const char **)f->value;
        snprintf(buf, len, "%s", s ? s : "none");
        break;
    }
    }
}

static void print_flags(const char *title, const flag_spec *flags, int n) {
    printf("\n%s:\n", title);
    for (int i = 0; i < n; i++) {
        char def[64], left[64];
        format_value(&flags[i], def, sizeof def);
        const char *arg = flags[i].type == FLAG_INT ? " N" : flags[i].type == FLAG_FLOAT ? " X"
                        : flags[i].type == FLAG_BOOL ? "" : flags[i].choices ? " " : " S";
        snprintf(left, sizeof left, "%s%s%s", flags[i].name, arg,
                 flags[i].type == FLAG_STRING && flags[i].choices ? flags[i].choices : "");
        printf("  %-24s %s [%s]\n", left, flags[i].help, def);
    }
}

static void print_help(const lab_info *lab) {
    printf("%s: %s\n\nusage: mpirun -n RANKS ./%s [flags]\n", lab->name, lab->about, lab->name);
    print_flags("shared flags (every lab)", shared_flags, N_SHARED);
    if (lab->n_flags) {
        char title[64];
        snprintf(title, sizeof title, "%s flags", lab->name);
        print_flags(title, lab->flags, lab->n_flags);
    }
    printf("  %-24s %s\n", "--help", "print this and exit");
}

/* --preset: a named shape (and the batch that goes with it). The first is the
 * default; flags given as well override their member, in any order. */
typedef struct {
    const char *name;
    int batch, seq, layers, d_model, heads;
} model_preset;
static const model_preset presets[] = {
    {"tiny", 32, 64, 8, 128, 4},
    /* batch 8: every lab's default layout divides it (lab04's 8 micro-batches,
     * up to 8 data-parallel ranks), and one CPU run fits in ~12 GB (1.5 GB a sequence) */
    {"gpt2-small", 8, 1024, 12, 768, 12},
};

static const model_preset *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return &presets[0]; /* not reached: --preset's choices are the names above */
}

static int in_choices(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

/* Parse one value into f; returns 0 or records an error naming the flag. */
static void parse_value(run_ctx *ctx, const flag_spec *f, const char *v) {
    char *end;
    errno = 0;
    if (f->type == FLAG_INT) {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno) {
            run_check(ctx, 0, "%s expects an integer, got '%s'", f->name, v);
            return;
        }
        if (x < f->min || x > 1000000000L) {
            run_check(ctx, 0, "%s must be %s %g, got %ld", f->name, x < f->min ? "at least" : "at most",
                      x < f->min ? f->min : 1e9, x);
            return;
        }
        *(int *)f->value = (int)x;
    } else if (f->type == FLAG_FLOAT) {
        double x = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(x)) {
            run_check(ctx, 0, "%s expects a number, got '%s'", f->name, v);
            return;
        }
        if (x < f->min) {
            run_check(ctx, 0, "%s must be at least %g, got %g", f->name, f->min, x);
            return;
        }
        /* the code computes in float: a double beyond float's range would become inf or 0 */
        if (fabs(x) > FLT_MAX) {
            run_check(ctx, 0, "%s %s is beyond the largest 32-bit float, %g (the code computes in float)", f->name,
                      v, FLT_MAX);
            return;
        }
        if (x != 0 && fabs(x) < FLT_TRUE_MIN) {
            run_check(ctx, 0, "%s %s is 0 as a 32-bit float (the smallest is %g): give 0 or a larger value", f->name,
                      v, FLT_TRUE_MIN);
            return;
        }
        *(double *)f->value = x;
    } else {
        if (strlen(v) > PATH_MAX - 1) {
            run_check(ctx, 0, "%s: a value of %zu bytes, longer than the limit of %d (PATH_MAX - 1)", f->name,
                      strlen(v), PATH_MAX - 1);
            return;
        }
        if (f->choices && !in_choices(f->choices, v)) {
            run_check(ctx, 0, "%s must be one of %s, got '%s'", f->name, f->choices, v);
            return;
        }
        *(const char **)f->value = v;
    }
}

/* The flags naming a file the run writes (FLAG_OUTPUT_FILE), shared then the
 * lab's: call with *i = 0 until it returns NULL. */
static const flag_spec *next_output_flag(const lab_info *lab, int *i) {
    for (; *i < N_SHARED + lab->n_flags; ++*i) {
        const flag_spec *f = *i < N_SHARED ? &shared_flags[*i] : &lab->flags[*i - N_SHARED];
        if (f->type == FLAG_OUTPUT_FILE) {
            ++*i;
            return f;
        }
    }
    return NULL;
}

static const flag_spec *find_flag(const lab_info *lab, const char *name, size_t len) {
    for (int i = 0; i < N_SHARED; i++)
        if (strlen(shared_flags[i].name) == len && !strncmp(shared_flags[i].name, name, len))
            return &shared_flags[i];
    for (int i = 0; i < lab->n_flags; i++)
        if (strlen(lab->flags[i].name) == len && !strncmp(lab->flags[i].name, name, len))
            return &lab->flags[i];
    return NULL;
}

/* Flags that act only through another: given while that one is off (0, none),
 * they would change nothing, so they are refused, in one line that names both
 * (docs/flags.md, "dependent flags"). A lab's own dependent flags are checked
 * by the lab (lab04's --virtual-stages). */
static const struct { const char *flag, *needs, *why; } dependent_flags[] = {
    {"--save-every", "--save", "the saves go to --save's PATH"},
    {"--top-k", "--experts", "the model is dense"},
    {"--expert-width", "--experts", "the model is dense"},
    {"--shared-experts", "--experts", "the model is dense"},
    {"--capacity-factor", "--experts", "the model is dense"},
    {"--aux-loss-coef", "--experts", "the model is dense"},
    {"--capacity-scope", "--capacity-factor", "without a capacity nothing is dropped, in any scope"},
    {"--router", "--experts", "the model is dense"},
    {"--balance", "--experts", "the model is dense"},
    {"--bias-speed", "--experts", "the model is dense"},
    {"--route-groups", "--experts", "the model is dense"},
    {"--route-max-groups", "--route-groups", "without groups every expert may be chosen"},
    {"--prompt", "--sample", "nothing is sampled"},
    {"--temperature", "--sample", "nothing is sampled"},
};

/* Whether a flag's value is on: a number above 0, a string given. */
static int flag_is_on(const flag_spec *f) {
    switch (f->type) {
    case FLAG_INT:
    case FLAG_BOOL: return *(const int *)f->value > 0;
    case FLAG_FLOAT: return *(const double *)f->value > 0;
    default: return *(const char *const *)f->value != NULL;
    }
}

static void check_dependent_flags(run_ctx *ctx, int argc, char **argv) {
    for (size_t i = 0; i < sizeof dependent_flags / sizeof dependent_flags[0]; i++) {
        const char *flag = dependent_flags[i].flag, *needs = dependent_flags[i].needs;
        const flag_spec *f = find_flag(&ctx->lab, flag, strlen(flag)), *n = find_flag(&ctx->lab, needs, strlen(needs));
        if (!f || !n || !run_flag_given(argc, argv, flag) || flag_is_on(n)) continue;
        char value[64];
        format_value(f, value, sizeof value);
        run_check(ctx, 0, "%s %s does nothing without %s (%s): give %s too, or leave %s out", flag, value, needs,
                  dependent_flags[i].why, needs, flag);
    }
}

static int experts_default; /* --experts when not given: 0 (dense) unless a lab says otherwise */

void run_default_experts(int experts) { experts_default = experts; }

void run_parse(run_ctx *ctx, int argc, char **argv, const lab_info *lab) {
    memset(ctx, 0, sizeof *ctx);
    ctx->lab = *lab;
    ctx->argc = argc;
    ctx->argv = argv;
    MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ctx->size);
    run_options *o = &ctx->opt;
    const model_preset *tiny = &presets[0];
    *o = (run_options){.steps = 50, .batch = tiny->batch, .seq = tiny->seq, .layers = tiny->layers,
                       .d_model = tiny->d_model, .heads = tiny->heads, .preset = tiny->name,
                       .seed = 1, .lr = 1e-3, .weight_decay = 0.1, .clip = 1.0,
                       .data = NULL, .device = "auto", .comm = "auto", .out = "runs", .recompute = "none",
                       .precision = "fp32", .experts = experts_default, .top_k = 2,
                       .aux_loss_coef = 0.01, .capacity_scope = "sequence", .router = "softmax",
                       .balance = "aux", .bias_speed = 0.001};
    flight_hang_timeout = FLIGHT_DEFAULT_TIMEOUT;
    flight_records = 64;
    flight_check_collectives = 0;
    bind_shared(o);

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (ctx->rank == 0) print_help(lab);
            MPI_Finalize();
            exit(0);
        }
    }
    /* 0 = not given (each of these flags is at least 1): the preset fills it in below */
    o->batch = o->seq = o->layers = o->d_model = o->heads = 0;
    for (int i = 1; i < argc && !ctx->error[0]; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0) {
            run_check(ctx, 0, "unexpected argument '%s' (flags start with --; see --help)", arg);
            break;
        }
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const flag_spec *f = find_flag(lab, arg, len);
        if (!f) {
            run_check(ctx, 0, "unknown flag '%.*s' (see --help)", (int)len, arg);
            break;
        }
        if (f->type == FLAG_BOOL) {
            run_check(ctx, !eq, "%s takes no value", f->name);
            *(int *)f->value = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v || (!eq && !strncmp(v, "--", 2) && find_flag(lab, v, strcspn(v, "=")))) {
            run_check(ctx, 0, "%s needs a value", f->name);
            break;
        }
        parse_value(ctx, f, v);
    }
    const model_preset *preset = find_preset(o->preset);
    if (!o->batch) o->batch = preset->batch;
    if (!o->seq) o->seq = preset->seq;
    if (!o->layers) o->layers = preset->layers;
    if (!o->d_model) o->d_model = preset->d_model;
    if (!o->heads) o->heads = preset->heads;
    run_check(ctx, o->d_model % o->heads == 0, "--heads %d does not divide --d-model %d", o->heads, o->d_model);
    run_check(ctx, !(o->data && !o->data[0]), "--data needs a file name");
    run_check(ctx, !(o->resume && !o->resume[0]), "--resume needs a file name");
    run_check(ctx, o->out[0] != 0, "--out needs a folder name");
    /* every file a run writes (--save, lab01's --dump-weights): "" would fail only after training */
    const flag_spec *f;
    for (int i = 0; (f = next_output_flag(lab, &i));)
        run_check(ctx, !(*(const char **)f->value && !**(const char **)f->value), "%s needs a file name", f->name);
    run_check(ctx, o->sample <= 100000, "--sample %d: at most 100000 bytes (one forward each)", o->sample);
    run_check(ctx, !(o->prompt && !o->prompt[0]), "--prompt needs some text");
    run_check(ctx, flight_records <= 1000000, "--flight-records %d: at most 1000000 (about 100 bytes each, per rank)",
              flight_records);
    flight_set_out(o->out);
    check_dependent_flags(ctx, argc, argv);
    run_check(ctx, !o->experts || o->top_k <= o->experts, "--top-k %d is more than --experts %d", o->top_k,
              o->experts);
    /* the bias balances instead of the aux loss: both at once would pull the router two ways */
    const int bias = !strcmp(o->balance, "bias");
    run_check(ctx, !bias || !run_flag_given(argc, argv, "--aux-loss-coef"), "--aux-loss-coef %g with --balance bias: "
              "the bias balances the load without an aux loss (leave --aux-loss-coef out, or use --balance aux)",
              o->aux_loss_coef);
    run_check(ctx, bias || !run_flag_given(argc, argv, "--bias-speed"), "--bias-speed %g does nothing without "
              "--balance bias (the aux loss balances): give --balance bias too, or leave --bias-speed out",
              o->bias_speed);
    run_check(ctx, o->bias_speed > 0, "--bias-speed must be above 0, got %g (a bias that never moves balances "
              "nothing)", o->bias_speed);
    /* node-limited routing: whole groups of experts, and room in M groups for a token's k experts */
    const int G = o->route_groups, M = o->route_groups && !o->route_max_groups ? (G + 1) / 2 : o->route_max_groups;
    run_check(ctx, !G || (o->experts % G == 0 && G <= o->experts), "--route-groups %d does not divide --experts %d "
              "(each group holds E/G experts)", G, o->experts);
    run_check(ctx, !G || M <= G, "--route-max-groups %d is more than --route-groups %d", M, G);
    run_check(ctx, !G || G > o->experts || o->experts % G || o->top_k <= (long)M * (o->experts / G),
              "--top-k %d is more than the %d experts of --route-max-groups %d groups of %d", o->top_k,
              G && o->experts % G == 0 ? M * (o->experts / G) : 0, M, G ? o->experts / G : 0);
    ctx->route_report = o->experts && (run_flag_given(argc, argv, "--router") ||
                                       run_flag_given(argc, argv, "--balance") || o->route_groups > 0);
    if (o->experts > 0 && bias && !ctx->error[0] && !(ctx->route_bias = calloc((size_t)o->experts * o->layers,
                                                                                sizeof(float))))
        die("out of host memory for the routing bias");
    ctx->model = (gpt_config){.vocab = 256, .seq = o->seq, .layers = o->layers,
                              .d_model = o->d_model, .heads = o->heads,
                              .recompute = gpt_recompute_parse(o->recompute), /* a choice: never -1 */
                              .experts = o->experts, .top_k = o->top_k,
                              .expert_width = o->experts ? o->expert_width : 0,
                              .shared_experts = o->experts ? o->shared_experts : 0,
                              .capacity_factor = (float)o->capacity_factor,
                              .aux_coef = bias ? 0.0f : (float)o->aux_loss_coef,
                              .capacity_per_rank = !strcmp(o->capacity_scope, "rank"),
                              .router_sigmoid = !strcmp(o->router, "sigmoid"), .route_bias = ctx->route_bias,
                              .route_groups = o->experts ? G : 0, .route_max_groups = o->experts && G ? M : 0};
    ctx->adamw = (adamw_config){.lr = (float)o->lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                .weight_decay = (float)o->weight_decay};
    ctx->tokens_per_step = (long)o->batch * o->seq;
}

void run_check_rank_capacity(run_ctx *ctx, int micro_batches, const char *flag) {
    run_check(ctx, micro_batches == 1 || !ctx->model.experts || !(ctx->model.capacity_factor > 0) ||
                       !ctx->model.capacity_per_rank,
              "%s %d with --capacity-scope rank: the capacity would count a micro-batch's rows, not the rank's "
              "(use --capacity-scope sequence, or %s 1)", flag, micro_batches, flag);
}

/* ---- set-up ------------------------------------------------------------------- */

void run_agree_or_exit(const char *err) {
    int rank, size, mine, first;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mine = err && err[0] ? rank : size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == size) return;
    if (rank == first) {
        fprintf(stderr, "error: %s\n", err);
        fflush(stderr);
    }
    MPI_Finalize();
    exit(2);
}

int run_flag_given(int argc, char **argv, const char *flag) {
    size_t n = strlen(flag);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], flag, n) && (argv[i][n] == 0 || argv[i][n] == '=')) return 1;
    return 0;
}

static int min_over_ranks(int x) {
    int y;
    MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return y;
}

/* Every rank read --data itself: refuse to train unless all saw the same bytes
 * (a file changed under the job, or a path that names another file elsewhere). */
static void agree_on_data(const run_ctx *ctx, char *err, size_t len) {
    unsigned long long mine[2] = {(unsigned long long)ctx->data.n, (unsigned long long)ctx->data.hash};
    unsigned long long *all = malloc(2 * sizeof *all * (size_t)ctx->size);
    if (!all) die("out of host memory");
    MPI_Allgather(mine, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
    for (int r = 1; r < ctx->size; r++)
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
            snprintf(err, len, "--data %s: the ranks read different bytes (rank 0: %llu bytes, FNV-1a %016llx; "
                     "rank %d: %llu bytes, %016llx); every rank must see the same file", ctx->data.source, all[0],
                     all[1], r, all[2 * r], all[2 * r + 1]);
            break;
        }
    free(all);
}

/* Rank 0 writes every output: prove now, before any work, that it can. */
static void check_outputs(const run_ctx *ctx, char *err, size_t len) {
    if (path_check_output_folder("--out", ctx->opt.out, err, len)) return;
    const flag_spec *f;
    for (int i = 0; (f = next_output_flag(&ctx->lab, &i));) {
        const char *path = *(const char **)f->value;
        if (path && path_check_output_file(f->name, path, err, len)) return;
    }
}

/* How many ranks of this host use the same GPU as this rank (1: its own; 0: no
 * GPU), judged by the GPUs' UUIDs, not by how many GPUs a rank sees: ranks
 * given one GPU each through CUDA_VISIBLE_DEVICES all see one "GPU 0", and
 * yet each has its own. Collective over `local`, the ranks of this host. */
static int ranks_sharing_my_gpu(MPI_Comm local, int gpu_index) {
    struct { unsigned char has, uuid[16]; } mine = {0}, *all;
    if (gpu_index >= 0 && device_gpu_uuid(gpu_index, mine.uuid) == 0) mine.has = 1;
    int n;
    MPI_Comm_size(local, &n);
    all = malloc((size_t)n * sizeof *all);
    if (!all) die("out of host memory");
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, local);
    int sharing = 0;
    for (int q = 0; q < n && mine.has; q++) sharing += all[q].has && !memcmp(all[q].uuid, mine.uuid, 16);
    free(all);
    return sharing;
}

/* ---- placement: which ranks share a host, and their GPUs ------------------------- */

/* What a rank tells the others about where it runs. */
typedef struct rank_place {
    int host;                  /* the world rank of its host's first rank: the host's id */
    int gpu;                   /* the GPU index it uses (local rank % GPUs it sees); -1: none */
    unsigned char has_uuid, uuid[16];
    char name[MPI_MAX_PROCESSOR_NAME + 1];
} rank_place;

enum { HOST_LABEL = MPI_MAX_PROCESSOR_NAME + 16 };

const char *run_host_label(const run_ctx *ctx, int rank) { return ctx->host_labels + (size_t)rank * HOST_LABEL; }

/* "0-3", "0,4,8,12" (a hostfile without counts, Open MPI's --map-by node): the
 * ranks of one host, consecutive runs joined. */
static void append_ranks(textbuf *b, const rank_place *all, int ranks, int host) {
    int shown = 0;
    for (int r = 0; r < ranks; r++) {
        if (all[r].host != host) continue;
        int end = r;
        while (end + 1 < ranks && all[end + 1].host == host) end++;
        if (++shown > 8) { textbuf_printf(b, ",..."); break; }
        textbuf_printf(b, shown > 1 ? "," : "");
        textbuf_printf(b, end > r ? "%d-%d" : "%d", r, end);
        r = end;
    }
}

/* Where every rank runs, known to every rank (ctx->hosts, host_of_rank,
 * host_labels): a host is a group of ranks that share memory, the launcher's
 * placement as MPI sees it, which decides the local rank and so the GPU. With
 * more than one host (or `show`, --dry-run) rank 0 gets one line per host, its
 * ranks and the GPU each uses. Ranks see their GPUs through
 * CUDA_VISIBLE_DEVICES, so "GPU 0" on every rank of a host can be as many GPUs
 * as ranks: they are counted by UUID (the identity of run_setup's NCCL rule).
 * Collective over the world; returns rank 0's text (malloc'd) or NULL. */
static char *describe_hosts(run_ctx *ctx, MPI_Comm local, int gpu_index, int show) {
    rank_place mine = {.host = ctx->rank, .gpu = gpu_index};
    MPI_Bcast(&mine.host, 1, MPI_INT, 0, local);
    if (gpu_index >= 0 && device_gpu_uuid(gpu_index, mine.uuid) == 0) mine.has_uuid = 1;
    int len = 0;
    MPI_Get_processor_name(mine.name, &len);
    rank_place *all = malloc((size_t)ctx->size * sizeof *all);
    ctx->host_of_rank = malloc((size_t)ctx->size * sizeof *ctx->host_of_rank);
    ctx->host_labels = malloc((size_t)ctx->size * HOST_LABEL);
    if (!all || !ctx->host_of_rank || !ctx->host_labels) die("out of host memory");
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
    ctx->hosts = 0;
    for (int r = 0; r < ctx->size; r++) {
        ctx->host_of_rank[r] = all[r].host;
        ctx->hosts += all[r].host == r;
        int shared_name = 0; /* another host with this name */
        for (int q = 0; q < ctx->size && !shared_name; q++) /* each other host's first rank */
            shared_name = all[q].host == q && q != all[r].host && !strcmp(all[q].name, all[r].name);
        snprintf(ctx->host_labels + (size_t)r * HOST_LABEL, HOST_LABEL, shared_name ? "%s/%d" : "%s", all[r].name,
                 all[r].host);
    }
    if ((ctx->hosts <= 1 && !show) || ctx->rank != 0) {
        free(all);
        return NULL;
    }
    textbuf b = {0};
    textbuf_printf(&b, "hosts: %d (ranks that share memory, MPI_COMM_TYPE_SHARED) | %d rank%s\n", ctx->hosts,
                   ctx->size, ctx->size == 1 ? "" : "s");
    for (int h = 0, shown_hosts = 0; h < ctx->size; h++) {
        if (all[h].host != h) continue; /* each host once, at its first rank */
        if (++shown_hosts > 32) {
            textbuf_printf(&b, "  ... (%d more hosts)\n", ctx->hosts - 32);
            break;
        }
        int n = 0, gpus = 0, with_gpu = 0;
        for (int r = 0; r < ctx->size; r++) {
            if (all[r].host != h) continue;
            n++;
            with_gpu += all[r].gpu >= 0;
            int seen = 0; /* the first rank of the host on this GPU counts it */
            for (int q = 0; q < r && !seen; q++)
                seen = all[q].host == h && all[q].has_uuid && all[r].has_uuid && !memcmp(all[q].uuid, all[r].uuid, 16);
            gpus += all[r].has_uuid && !seen;
        }
        textbuf_printf(&b, "  host %s: %d rank%s ", run_host_label(ctx, h), n, n == 1 ? "" : "s");
        append_ranks(&b, all, ctx->size, h);
        if (ctx->device != DEVICE_CUDA) {
            textbuf_printf(&b, " | cpu");
            if (with_gpu)
                textbuf_printf(&b, " (the GPUs it has are not used: %s)",
                               ctx->opt.experts && strcmp(ctx->opt.device, "cpu") ? "--experts runs on the CPU only"
                                                                                  : "--device cpu");
        } else {
            textbuf_printf(&b, " | GPU index per rank:");
            int shown = 0;
            for (int r = 0; r < ctx->size; r++)
                if (all[r].host == h && ++shown <= 16) textbuf_printf(&b, " %d", all[r].gpu);
            if (shown > 16) textbuf_printf(&b, " ...");
            textbuf_printf(&b, " = %d GPU%s by UUID%s", gpus, gpus == 1 ? "" : "s",
                           gpus == n ? ", one per rank" : ", shared: NCCL refuses, comm mpi");
        }
        textbuf_printf(&b, "\n");
    }
    free(all);
    return b.s;
}

/* ---- interruption: SIGINT, SIGTERM ------------------------------------------------------ */

static volatile sig_atomic_t signal_seen; /* the signal the handler saw, 0: none */

static void note_signal(int sig) { signal_seen = sig; } /* SA_RESETHAND: a second one ends the process */

/* The run finishes the step it is in, then stops on every rank with a record
 * that says so (a launcher may report status 0 for a job it interrupted:
 * MPICH's hydra did, 3 times in 8). A signal the process ignores (started in
 * the background) stays ignored. */
static void stop_after_the_step_on_signals(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = note_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        sigaction(sigs[i], &sa, &old);
        if (old.sa_handler == SIG_IGN) sigaction(sigs[i], &old, NULL);
    }
}

int run_agree_interrupted(run_ctx *ctx) {
    int mine = signal_seen, any = 0;
    MPI_Request req;
    MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
    polite_wait(&req);
    if (any && !ctx->interrupted) {
        ctx->interrupted = any;
        if (ctx->rank == 0) {
            printf("interrupted by %s: stopping after step %d of %d (recorded as interrupted; a second signal ends "
                   "the ranks at once)\n", any == SIGINT ? "SIGINT" : "SIGTERM", ctx->steps_done, ctx->opt.steps);
            fflush(stdout);
        }
    }
    return ctx->interrupted;
}

int run_exit_status(const run_ctx *ctx, int status) { return ctx->interrupted ? 128 + ctx->interrupted : status; }

/* --max-memory-mb's largest value: a PiB per rank. Above it the sizes the
 * check lets through could overflow the 64-bit counts of the code after it. */
#define MAX_MEMORY_MB 1073741824.0

void run_setup(run_ctx *ctx) {
    run_options *o = &ctx->opt;
    run_check(ctx, o->max_memory_mb <= MAX_MEMORY_MB, "--max-memory-mb %g: at most %.0f (a PiB per rank)",
              o->max_memory_mb, MAX_MEMORY_MB);
    /* Flag errors come from the same arguments on every rank, so every rank
     * already knows: no communication is needed to agree on them. */
    if (ctx->error[0]) {
        if (ctx->rank == 0) fprintf(stderr, "error: %s\n", ctx->error);
        MPI_Finalize();
        exit(2);
    }
    MPI_Comm local = comm_world_host();
    MPI_Comm_rank(local, &ctx->local_rank);
    MPI_Comm_size(local, &ctx->local_size);

    /* One OpenBLAS thread per rank: ranks are the parallelism on the CPU. */
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);

    char err[sizeof ctx->error] = "";
    int gpus = device_gpu_count();
    ctx->gpu_sharers = ranks_sharing_my_gpu(local, gpus > 0 ? ctx->local_rank % gpus : -1);
    int every_rank_has_gpu = min_over_ranks(gpus > 0);
    int every_rank_own_gpu = min_over_ranks(ctx->gpu_sharers == 1);
    if (!strcmp(o->device, "cuda") && gpus == 0) {
#ifdef PL_HAVE_CUDA
        snprintf(err, sizeof err, "--device cuda: no usable GPU on this host (no driver or no device)");
#else
        snprintf(err, sizeof err, "--device cuda: this build has no CUDA support (the toolkit was not found at configure time)");
#endif
    }
    /* auto takes the GPUs, except for experts, whose router and dispatch have no CUDA twins yet: a lab
     * run with no arguments (lab08's default has experts) must still run on a GPU machine */
    ctx->device = !strcmp(o->device, "cuda") || (!strcmp(o->device, "auto") && every_rank_has_gpu && !o->experts)
                      ? DEVICE_CUDA : DEVICE_CPU;
    if (!err[0] && !strcmp(o->comm, "nccl")) {
        if (ctx->device != DEVICE_CUDA)
            snprintf(err, sizeof err, "--comm nccl needs --device cuda (the run is on the CPU)");
        else if (ctx->gpu_sharers != 1)
            snprintf(err, sizeof err, "--comm nccl needs one GPU per rank: %d ranks on this host share one GPU "
                     "(NCCL refuses two ranks on one GPU; use --comm mpi)", ctx->gpu_sharers);
    }
    ctx->backend = !strcmp(o->comm, "nccl") || (!strcmp(o->comm, "auto") && ctx->device == DEVICE_CUDA
                                                && every_rank_own_gpu) ? COMM_NCCL : COMM_MPI;
    char *hosts_text = describe_hosts(ctx, local, gpus > 0 ? ctx->local_rank % gpus : -1, o->dry_run);
    if (!err[0] && data_load(&ctx->data, o->data, o->seq, err, sizeof err) != 0) { /* err is set */ }
    dataset heldout;
    if (!err[0] && o->eval && data_heldout(&ctx->data, o->batch, o->seq, &heldout) == 0)
        snprintf(err, sizeof err, "--eval: %s leaves %ld held-out bytes, too few for one batch of --batch %d "
                 "windows of --seq %d", ctx->data.source, ctx->data.n - ctx->data.train_n, o->batch, o->seq);
    if (!err[0] && o->experts && ctx->device == DEVICE_CUDA)
        snprintf(err, sizeof err, "--experts on --device cuda: the router and the dispatch run on the CPU only "
                 "so far (no CUDA twins yet): give --device cpu or auto");
    run_agree_or_exit(err);
    agree_on_data(ctx, err, sizeof err);
    run_agree_or_exit(err);
    /* Only rank 0 writes the record, trace, timeline and files such as --save:
     * it proves each place writable for everyone. Only then, with every input
     * known good and the run known to fit (lab_start), does run_start create
     * the --out folder, so a rejected run leaves nothing behind. */
    if (ctx->rank == 0) check_outputs(ctx, err, sizeof err);
    run_agree_or_exit(err);
    ctx->hosts_text = hosts_text;
    /* the values' bytes (value_bytes) for what a lab predicts before run_start, which selects the
     * precision's kernels again once the device is in use */
    precision p = PREC_FP32;
    precision_parse(o->precision, &p); /* one of --precision's choices */
    precision_use(p);
}

void run_start(run_ctx *ctx) {
    run_options *o = &ctx->opt;
    char err[sizeof ctx->error] = "";
    /* --dry-run creates nothing: the checks of run_setup are the run's own */
    if (ctx->rank == 0 && !o->dry_run && path_make_folder(o->out) != 0)
        snprintf(err, sizeof err, "--out %s: cannot create it: %s", o->out, strerror(errno));
    run_agree_or_exit(err);
    const int gpus = device_gpu_count();
    if (!o->dry_run) {
        stop_after_the_step_on_signals();
        ctx->records_jsonl = path_join(o->out, "records.jsonl");
        ctx->records_csv = path_join(o->out, "records.csv");
        device_use(ctx->device, ctx->device == DEVICE_CUDA ? ctx->local_rank % gpus : 0);
        trace_init(MPI_COMM_WORLD);
        ctx->step_seconds = calloc((size_t)o->steps, sizeof(double));
        ctx->losses = calloc((size_t)o->steps, sizeof(double));
        ctx->grad_norms = calloc((size_t)o->steps, sizeof(double));
        ctx->aux_losses = o->experts ? calloc((size_t)o->steps, sizeof(double)) : NULL;
        ctx->dropped = o->experts ? calloc((size_t)o->steps, sizeof(double)) : NULL;
        ctx->expert_load = o->experts ? calloc((size_t)o->experts * o->layers, sizeof(double)) : NULL;
        if (ctx->route_report) {
            ctx->imbalance = calloc((size_t)o->steps, sizeof(double));
            ctx->bias_lo = calloc((size_t)o->steps, sizeof(double));
            ctx->bias_hi = calloc((size_t)o->steps, sizeof(double));
            if (!ctx->imbalance || !ctx->bias_lo || !ctx->bias_hi) die("out of host memory");
        }
        if (ctx->model.route_groups > 0) {
            ctx->groups_most = calloc((size_t)o->steps, sizeof(double));
            ctx->groups_mean = calloc((size_t)o->steps, sizeof(double));
            if (!ctx->groups_most || !ctx->groups_mean) die("out of host memory");
        }
    }
    precision_use(g_precision); /* after device_use: the kernel table is the device's */

    if (ctx->rank == 0) {
        gpt_layout g;
        gpt_layout_init(&g, &ctx->model);
        char p[16];
        printf("%s | %d rank%s | device %s | comm %s%s\n", ctx->lab.name, ctx->size,
               ctx->size == 1 ? "" : "s", ctx->device == DEVICE_CUDA ? "cuda" : "cpu",
               ctx->backend == COMM_NCCL ? "nccl" : "mpi",
               ctx->device == DEVICE_CUDA && ctx->backend == COMM_MPI ? " (staged through host memory)" : "");
        printf("model: %s: %d layers, d_model %d, %d heads, seq %d, vocab 256 | %s parameters%s%s\n",
               o->preset, o->layers, o->d_model, o->heads, o->seq, human((double)g.total, p),
               ctx->model.recompute ? " | --recompute " : "", ctx->model.recompute ? o->recompute : "");
        printf("data: %s (%ld bytes) | batch %d x %d = %ld tokens per step | %d steps, lr %g\n",
               ctx->data.source, ctx->data.n, o->batch, o->seq, ctx->tokens_per_step, o->steps, o->lr);
        if (g_precision == PREC_BF16)
            printf("precision: bf16 weights, activations and gradients; fp32 master weights, AdamW moments and "
                   "arithmetic | %s\n", ctx->device == DEVICE_CUDA
                                            ? "bf16 matmuls: cuBLAS on bf16, fp32 compute (tensor cores)"
                                            : kernels_bf16_cpu_gemm_text());
        if (ctx->hosts_text) fputs(ctx->hosts_text, stdout);
        fflush(stdout);
    }
    free(ctx->hosts_text);
    ctx->hosts_text = NULL;
}

const char *run_bytes_text(double bytes, char buf[24]) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) {
        bytes /= 1024;
        u++;
    }
    if (bytes >= 1024) snprintf(buf, 24, "%.3g bytes", bytes * 0x1p60); /* beyond EiB */
    else snprintf(buf, 24, u == 0 ? "%.0f %s" : bytes < 10 ? "%.2f %s" : bytes < 100 ? "%.1f %s" : "%.0f %s", bytes,
                  units[u]);
    return buf;
}

double run_memory_limit(const run_ctx *ctx, int *per_host, char *what, size_t len) {
    char a[24], b[24];
    if (ctx->device == DEVICE_CUDA) {
        const int gpus = device_gpu_count();
        const double gpu = gpus > 0 ? device_gpu_memory_bytes(ctx->local_rank % gpus) : 0;
        const int sharers = ctx->gpu_sharers > 0 ? ctx->gpu_sharers : 1;
        *per_host = 0;
        if (sharers > 1)
            snprintf(what, len, "the %s each of the %d ranks on this rank's GPU can have (%s)",
                     run_bytes_text(gpu / sharers, a), sharers, run_bytes_text(gpu, b));
        else snprintf(what, len, "the %s of this rank's GPU", run_bytes_text(gpu, a));
        return gpu / sharers;
    }
    const double host = device_host_memory_bytes();
    *per_host = 1;
    snprintf(what, len, "the %s of memory of this host", run_bytes_text(host, a));
    return host;
}

/* ---- steps -------------------------------------------------------------------- */

void run_step_begin(run_ctx *ctx, int step) {
    trace_step_begin(step);
    ctx->step_t0 = now_seconds();
}

const char *human(double x, char buf[16]) {
    const char *unit = "";
    double a = fabs(x);
    if (a >= 1e9) { x /= 1e9; unit = "G"; }
    else if (a >= 1e6) { x /= 1e6; unit = "M"; }
    else if (a >= 1e3) { x /= 1e3; unit = "k"; }
    snprintf(buf, 16, fabs(x) >= 100 || !unit[0] ? "%.0f%s" : "%.2f%s", x, unit);
    return buf;
}

void run_step_end(run_ctx *ctx, int step, double loss, double grad_norm, const char *extra) {
    device_synchronize();
    double dt = now_seconds() - ctx->step_t0;
    trace_step_end(step);
    ctx->step_seconds[step] = dt;
    ctx->losses[step] = loss;
    ctx->grad_norms[step] = grad_norm;
    ctx->steps_done = step + 1;
    if (ctx->rank == 0) {
        char tps[16], route[160] = "";
        int at = 0;
        if (ctx->route_report && ctx->route_bias)
            at = snprintf(route, sizeof route, " | load max/mean %.3f | bias %+.4f..%+.4f", ctx->imbalance[step],
                          ctx->bias_lo[step], ctx->bias_hi[step]);
        else if (ctx->route_report)
            at = snprintf(route, sizeof route, " | load max/mean %.3f", ctx->imbalance[step]);
        if (ctx->groups_most && at >= 0 && at < (int)sizeof route)
            snprintf(route + at, sizeof route - (size_t)at, " | groups a token reached: at most %.0f, mean %.2f",
                     ctx->groups_most[step], ctx->groups_mean[step]);
        printf("step %d/%d | loss %.4f | %.1f ms | %s tok/s%s%s%s\n", step + 1, ctx->opt.steps, loss,
               dt * 1e3, human((double)ctx->tokens_per_step / dt, tps), extra ? " | " : "",
               extra ? extra : "", route);
    }
    if (!isfinite(loss) && !ctx->diverged_at) {
        ctx->diverged_at = step + 1;
        if (ctx->rank == 0)
            printf("step %d: the loss is %g: the run diverged (recorded as diverged_at_step %d; a smaller --lr "
                   "may help)\n", step + 1, loss, step + 1);
    }
    if (ctx->rank == 0) fflush(stdout);
    run_agree_interrupted(ctx);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double run_median_step_seconds(const run_ctx *ctx) {
    int first = ctx->steps_done > 1 ? 1 : 0, n = ctx->steps_done - first;
    if (n <= 0) return 0;
    double *t = malloc((size_t)n * sizeof(double));
    memcpy(t, ctx->step_seconds + first, (size_t)n * sizeof(double));
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

/* ---- --dry-run ------------------------------------------------------------------- */

void run_dry_run_exit(run_ctx *ctx, const run_report *r) {
    if (ctx->rank == 0) {
        char a[16];
        printf("dry run of %s (%s, %d rank%s, %s/%s): the formulas the summary prints beside its measurements\n",
               ctx->lab.name, r->layout, ctx->size, ctx->size == 1 ? "" : "s",
               ctx->device == DEVICE_CUDA ? "cuda" : "cpu", ctx->backend == COMM_NCCL ? "nccl" : "mpi");
        if (r->comm_formula_bytes >= 0)
            printf("  communication   formula %s = %sB (%.0f bytes per rank per step)\n", r->comm_formula,
                   human(r->comm_formula_bytes, a), r->comm_formula_bytes);
        else if (r->comm_formula)
            printf("  communication   formula %s: not predicted for this layout\n", r->comm_formula);
        if (r->bubble_theory >= 0) printf("  bubble theory   %.3f\n", r->bubble_theory);
        printf("dry run: nothing trained, no training buffer allocated, nothing written to --out %s\n", ctx->opt.out);
        fflush(stdout);
    }
    data_free(&ctx->data);
    free(ctx->host_of_rank);
    free(ctx->host_labels);
    MPI_Finalize();
    exit(0);
}
