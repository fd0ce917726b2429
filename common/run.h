/* What every lab shares around its technique: flags and their validation,
 * backend choice, the per-step line, the end-of-run summary and the run record.
 *
 * A lab's main reads:
 *   run_parse(&ctx, argc, argv, &lab);         shared + lab flags, --help
 *   run_check(&ctx, ok, "--flag ...", ...);    the lab's own rules
 *   run_setup(&ctx);                           exits 2 on any error, on every rank,
 *                                              before any communication; then picks
 *                                              the device and comm, loads the data,
 *                                              proves the outputs writable
 *   (labs/lab_run.h's lab_start: theory's memory figure against
 *    run_memory_limit, then) run_start(&ctx);  creates --out, the header lines
 *   for each step: run_step_begin / run_step_end
 *   run_finish(&ctx, &report);                 summary, record, trace */
#ifndef PL_RUN_H
#define PL_RUN_H
#include "comm.h"
#include "data.h"
#include "device.h"
#include "model.h"
#include "optim.h"
#include <stddef.h>

/* FLAG_OUTPUT_FILE: a string naming a file rank 0 writes (--save, lab01's
 * --dump-weights); run_setup proves it can be written before any work. Floats
 * are doubles that the code uses as floats: their values must be finite floats. */
typedef enum { FLAG_INT, FLAG_FLOAT, FLAG_STRING, FLAG_BOOL, FLAG_OUTPUT_FILE } flag_type;

typedef struct flag_spec {
    const char *name;    /* "--steps" */
    flag_type type;      /* the value is an int, double, const char * (also FLAG_OUTPUT_FILE) or int (0/1) */
    void *value;         /* holds the default on entry */
    const char *help;
    double min;          /* smallest value accepted (numbers) */
    const char *choices; /* strings: "a|b|c", or NULL for any */
} flag_spec;

typedef struct run_options {
    int steps, batch, seq, layers, d_model, heads, seed;
    double lr, weight_decay, clip;
    const char *data, *device, *comm, *out;
    const char *preset;        /* --preset: the shape's name ("tiny", "gpt2-small") */
    const char *save, *resume; /* checkpoint files (checkpoint.h), NULL: none */
    int save_every, eval;
    const char *recompute;     /* --recompute none|selective|full (gpt_config.recompute) */
    const char *precision;     /* --precision: "fp32" or "bf16" (precision.h) */
    int experts, top_k;        /* --experts, --top-k (gpt_config, moe.h) */
    int expert_width;          /* --expert-width: a routed expert's hidden units (0: 4 d_model) */
    int shared_experts;        /* --shared-experts: experts every token runs, beside its routed ones */
    double capacity_factor, aux_loss_coef; /* --capacity-factor, --aux-loss-coef */
    const char *capacity_scope; /* --capacity-scope sequence|rank (gpt_config.capacity_per_rank) */
    const char *router, *balance; /* --router softmax|sigmoid, --balance aux|bias (moe.h) */
    double bias_speed;          /* --bias-speed: gamma of --balance bias */
    int route_groups, route_max_groups; /* --route-groups G, --route-max-groups M: node-limited routing (moe.h) */
    int dry_run;               /* --dry-run: validate, print the placement and the needs, exit 0 */
    int sample;                /* --sample N: bytes the model writes before and after training (sample.h) */
    const char *prompt;        /* --prompt: what it continues (NULL: the data's first line) */
    double temperature;        /* --temperature: 0 greedy, else softmax(logits / temperature) */
    double max_memory_mb;      /* --max-memory-mb: the cap per rank, MiB (0: the machine's memory) */
} run_options;

typedef struct lab_info {
    const char *name;    /* the program, "lab01_dp" */
    const char *about;   /* one paragraph for --help */
    flag_spec *flags;    /* the lab's own flags */
    int n_flags;
} lab_info;

typedef struct run_ctx {
    lab_info lab;
    run_options opt;
    int argc;                     /* the command line run_parse read (a lab may ask whether a flag was given) */
    char **argv;
    int rank, size;               /* in MPI_COMM_WORLD */
    int local_rank, local_size;   /* among the ranks on this host */
    int gpu_sharers;              /* ranks of this host on this rank's GPU (1: its own; 0: no GPU) */
    int hosts;                    /* hosts of the job: groups of ranks that share memory (MPI_COMM_TYPE_SHARED) */
    int *host_of_rank;            /* every rank's host, as the world rank of the host's first rank */
    char *host_labels;            /* every rank's host name (run_host_label) */
    char *hosts_text;             /* rank 0: run_setup's lines on the hosts, printed by run_start (NULL: none) */
    char error[8400];             /* the first error found, "" if none (room for two PATH_MAX paths) */
    device_kind device;
    comm_backend backend;
    dataset data;
    gpt_config model;
    adamw_config adamw;
    char *records_jsonl, *records_csv; /* in --out; malloc'd */
    /* filled by run_step_end */
    double *step_seconds, *losses, *grad_norms;
    double *aux_losses, *dropped; /* --experts: the aux loss in each step's loss, dropped choices (all ranks) */
    double *expert_load;          /* --experts: the last step's choices per expert [L][E] (all ranks) */
    float *route_bias;            /* --balance bias: [L][E], ctx->model.route_bias; moved by run_experts_report */
    int route_report;             /* --router or --balance given: every step's loads summed, imbalance printed */
    double *imbalance, *bias_lo, *bias_hi; /* route_report: per step, max over layers of max/mean choices per
                                             * expert; the bias's least and largest value after the step */
    double *groups_most, *groups_mean;     /* --route-groups: per step, the most groups one token's experts
                                             * came from (any layer, any rank), and the mean over tokens x layers */
    int steps_done;
    int diverged_at;              /* the first step (1-based) whose loss was not finite, 0: none */
    int interrupted;              /* SIGINT or SIGTERM that stopped the run after a whole step (every rank
                                   * agrees, run_agree_interrupted), 0: none; the labs' loops end on it */
    double step_t0;
    long tokens_per_step;         /* global batch x seq */
} run_ctx;

/* Before run_parse: a lab whose model has experts by default (lab08_ep: 4); --help shows it. */
void run_default_experts(int experts);
void run_parse(run_ctx *ctx, int argc, char **argv, const lab_info *lab);
/* Record an error (the first one wins) unless ok. fmt names the flag. */
void run_check(run_ctx *ctx, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Whether argv holds the flag, "--x v" or "--x=v" (after run_parse, which
 * checked that every "--x" is a flag, not the value of another). */
int run_flag_given(int argc, char **argv, const char *flag);
/* --capacity-scope rank counts a rank's own rows: a rank that runs them as
 * `micro_batches` micro-batches (lab01's --grad-accum, lab04's --micro-batches,
 * flag names which) would count one micro-batch's, and its drops would change
 * with their number. Refused unless micro_batches is 1 or the run drops nothing
 * by rank. */
void run_check_rank_capacity(run_ctx *ctx, int micro_batches, const char *flag);

/* Everything a run checks before it allocates: flag errors (exit 2 on every
 * rank), the device and comm, the data, --resume, outputs proven writable.
 * Creates nothing and prints nothing: run_start does, once the run is known
 * to fit (lab_start). */
void run_setup(run_ctx *ctx);
/* After run_setup (and lab_start's memory check): creates --out (not with
 * --dry-run), selects the device and precision, the step arrays, the trace,
 * and rank 0 prints the header lines. Collective. */
void run_start(run_ctx *ctx);
/* The machine's memory this rank may count on, for the check before anything
 * is allocated: on CUDA the GPU's memory over the ranks sharing it (*per_host
 * = 0: this rank's own share); on the CPU the host's physical memory, or its
 * cgroup's limit when lower, for all the ranks on the host together (*per_host
 * = 1: the caller adds up their needs; rank q's host is ctx->host_of_rank[q]).
 * `what` gets its description ("the 23.4 GiB of this host"). Returns the
 * bytes, 0 where the machine does not say (no check then). After run_setup. */
double run_memory_limit(const run_ctx *ctx, int *per_host, char *what, size_t len);
/* "7.50 GiB": bytes for a message. */
const char *run_bytes_text(double bytes, char buf[24]);
/* All ranks agree: if any rank has a non-empty `err`, the lowest such rank prints
 * it as one line, and every rank exits with status 2. Collective. */
void run_agree_or_exit(const char *err);

void run_step_begin(run_ctx *ctx, int step);
/* loss: the global mean loss of the step (the same on every rank that passes it);
 * grad_norm: the L2 norm of the whole model's gradient before clipping, as the
 * optimizer step computed it (recorded: the tests compare it across layouts, since
 * clipping and AdamW hide a constant error in the gradient's scale from the losses);
 * extra: more text for the step line, or NULL. Synchronises the device, and
 * agrees on an interruption (run_agree_interrupted). Collective. */
void run_step_end(run_ctx *ctx, int step, double loss, double grad_norm, const char *extra);

typedef struct run_report {
    const char *layout;         /* "dp=4", printed and recorded */
    comm *comms[8];             /* communicators whose traffic is reported */
    int n_comms;
    long params;                /* parameters of the whole model */
    double comm_formula_bytes;  /* bytes per rank per step by the lesson's formula, < 0: none */
    const char *comm_formula;   /* how it is computed, e.g. "2(N-1)/N x gradient bytes" */
    double bubble_theory;       /* < 0: not a pipeline */
    const struct json_t *record_members; /* the lab's own members of the record (a jansson object), or NULL */
    double acts_formula_bytes;  /* THIS rank's activation peak by theory.h's formula (0: none given),
                                 * printed and recorded beside the allocator's peak */
    /* Model states per parameter this rank computes with (its replica, stage or
     * TP shard: params_held, 0 meaning `params`), measured as the allocator's
     * params, grads and optim peaks over params_held, beside the formula's bytes
     * per parameter (theory.h: th_model_states(1, ...)), printed in bf16 runs and
     * recorded in both. states_formula[] all 0: the lab prints its own (lab02). */
    long params_held;
    double states_formula[3];
    const char *states_formula_text; /* "2 + 2 + 12" */
} run_report;

/* Collective: gathers memory, traffic and timeline from all ranks, prints the
 * summary on rank 0, appends the run record and writes trace + timeline. */
void run_finish(run_ctx *ctx, const run_report *report);

/* The name of rank's host (MPI_Get_processor_name), "name/R" where two hosts
 * (groups of ranks that share memory, R the first rank of each) report one name. */
const char *run_host_label(const run_ctx *ctx, int rank);

/* --dry-run, after run_setup and the lab's own layout lines: rank 0 prints the
 * layout and the formula lines the summary would print beside its
 * measurements (r's layout, comm formula and bubble theory; nothing else of r
 * is read), then every rank exits 0. Nothing was trained, no training buffer
 * allocated and --out not created. Collective. */
void run_dry_run_exit(run_ctx *ctx, const run_report *r) __attribute__((noreturn));

/* Collective, at every step's end (run_step_end calls it): whether any rank
 * got SIGINT or SIGTERM (Ctrl-C, a scheduler's stop) since run_setup, agreed
 * over all ranks into ctx->interrupted, so that every rank ends the loop after
 * the same whole step, the record says so and the status is not 0. A second
 * signal ends the process at once (the default action). */
int run_agree_interrupted(run_ctx *ctx);
/* main's status: 128 + the signal when the run was interrupted (as a shell
 * reports a process the signal ended), else `status`. */
int run_exit_status(const run_ctx *ctx, int status);

/* Median of the measured step times in seconds (step 0 is warm-up when steps > 1). */
double run_median_step_seconds(const run_ctx *ctx);

/* "12.4k", "3.20M": short human figures for the console. */
const char *human(double x, char buf[16]);

#endif
