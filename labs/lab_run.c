/* A lab's --dry-run and finish (lab_run.h). */
#include "lab_run.h"
#include "device.h"
#include "jsonval.h"
#include "precision.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

th_model lab_theory_model(const gpt_config *c) {
    th_model m = th_course_model(c->vocab, c->seq, c->layers, c->d_model, c->heads);
    m.experts = c->experts > 0 ? c->experts : 0;
    m.top_k = c->experts > 0 ? c->top_k : 0;
    m.ffn_expert = c->experts > 0 && c->expert_width > 0 ? c->expert_width : 0; /* 0: the dense MLP's ffn */
    m.shared_experts = c->experts > 0 ? c->shared_experts : 0;
    return m;
}

th_run lab_run_config(const run_ctx *ctx) {
    const gpt_config *m = &ctx->model;
    /* the flag, not g_precision: lab_start predicts before run_start selects the precision */
    return (th_run){.ranks = ctx->size, .cuda = ctx->device == DEVICE_CUDA, .bf16 = !strcmp(ctx->opt.precision, "bf16"),
                    .batch = ctx->opt.batch, .model = lab_theory_model(m), .tp = 1, .pp = 1, .dp = ctx->size,
                    .micro_batches = 1, .grad_accum = 1, .recompute = m->recompute};
}

/* ---- the memory check ------------------------------------------------------------------ */

/* The memory groups a message names, with the flags that size each. */
enum { GROUP_STATES, GROUP_ACTS, GROUP_COMM, GROUP_WORKSPACE, NGROUPS };
static const char *const group_names[NGROUPS] = {"model states", "activations", "communication buffers",
                                                 "workspace"};

typedef struct {
    double bytes;          /* the floor: the sum of the predicted categories */
    double group[NGROUPS]; /* of which */
} rank_floor;

/* Every rank's floor (floors[q], q < need->ranks): theory/predict's categories
 * as the CPU runs them (on CUDA the kernels add their own scratch to the
 * workspace), those it does not predict (lab04's message pool) left out.
 * Returns 0, -1 out of host memory. */
static int predict_floors(const th_run *need, rank_floor *floors) {
    th_run cpu = *need;
    cpu.cuda = 0;
    /* lab08 without a capacity: theory's received rows are the capacity-free bound, the most the routing can
     * send a rank; the floor takes the fewest a capacity keeps (one slot per expert and sequence) */
    if (cpu.ep > 0 && !(cpu.capacity_factor > 0)) cpu.capacity_factor = 1e-30;
    th_rank_need *all = calloc((size_t)need->ranks, sizeof *all);
    if (!all) return -1;
    th_predict_run(&cpu, all);
    for (int q = 0; q < need->ranks; q++) {
        rank_floor *f = &floors[q];
        *f = (rank_floor){0};
        for (int k = 0; k < MEM_NCAT; k++) {
            const double b = all[q].mem[k];
            if (!(b > 0)) continue; /* not predicted (< 0), or none */
            const int g = k <= MEM_OPTIM ? GROUP_STATES : k == MEM_ACTS ? GROUP_ACTS : k == MEM_COMM ? GROUP_COMM
                                                                                                   : GROUP_WORKSPACE;
            f->group[g] += b;
            f->bytes += b;
        }
    }
    free(all);
    return 0;
}

/* "activations 74.7 TiB, sized by --batch 32, --seq 200000, ...": f's largest group and the flags that size it */
static void name_largest(const run_ctx *ctx, const rank_floor *f, char *out, size_t len) {
    const run_options *o = &ctx->opt;
    int g = 0;
    for (int i = 1; i < NGROUPS; i++)
        if (f->group[i] > f->group[g]) g = i;
    char b[24], experts[96] = "";
    if (o->experts > 0) {
        int at = snprintf(experts, sizeof experts, ", --experts %d", o->experts);
        if (o->expert_width > 0) at += snprintf(experts + at, sizeof experts - (size_t)at, ", --expert-width %d", o->expert_width);
        if (o->shared_experts > 0) snprintf(experts + at, sizeof experts - (size_t)at, ", --shared-experts %d", o->shared_experts);
    }
    const int at = snprintf(out, len, "%s %s, sized by ", group_names[g], run_bytes_text(f->group[g], b));
    if (at < 0 || (size_t)at >= len) return;
    if (g == GROUP_STATES)
        snprintf(out + at, len - (size_t)at, "--d-model %d, --layers %d%s", o->d_model, o->layers, experts);
    else if (g == GROUP_ACTS)
        snprintf(out + at, len - (size_t)at, "--batch %d, --seq %d, --layers %d, --d-model %d, --heads %d%s%s",
                 o->batch, o->seq, o->layers, o->d_model, o->heads, experts,
                 ctx->model.recompute == RECOMPUTE_FULL ? "" : "; --recompute full keeps less");
    else if (g == GROUP_WORKSPACE)
        snprintf(out + at, len - (size_t)at, "--batch %d, --seq %d, --d-model %d, --heads %d", o->batch, o->seq,
                 o->d_model, o->heads);
    else snprintf(out + at, len - (size_t)at, "--batch %d, --seq %d, --d-model %d", o->batch, o->seq, o->d_model);
}

/* What lab_start found, for --dry-run's verdict (lab_dry_run_exit). */
static struct {
    int checked, per_host;
    double cap, machine; /* bytes: --max-memory-mb per rank (0: none), the machine's (0: unknown) */
    char machine_text[160];
    th_run need; /* lab_start's */
} limits;

/* This rank's verdict on need's floors: "" when it fits the limit (the cap,
 * else the machine), else the one-line refusal. *fits_machine, *fits_cap:
 * each limit alone (1 where none). */
static void judge(const run_ctx *ctx, const rank_floor *floors, char *err, size_t len, int *fits_machine,
                  int *fits_cap) {
    const int me = ctx->rank;
    char a[24], b[24], what[400];
    /* the machine: the ranks of this host together (the one needing most named), or this rank's share of a GPU */
    int worst = me, n = 1;
    double host = floors[me].bytes;
    if (limits.per_host) {
        host = 0;
        n = 0;
        for (int q = 0; q < ctx->size; q++) {
            if (ctx->host_of_rank[q] != ctx->host_of_rank[me]) continue;
            host += floors[q].bytes;
            n++;
            if (floors[q].bytes > floors[worst].bytes) worst = q;
        }
    }
    *fits_machine = !(limits.machine > 0) || host <= limits.machine;
    *fits_cap = !(limits.cap > 0) || floors[me].bytes <= limits.cap;
    err[0] = 0;
    if (limits.cap > 0 ? *fits_cap : *fits_machine) return;
    const rank_floor *f = limits.cap > 0 ? &floors[me] : &floors[worst];
    name_largest(ctx, f, what, sizeof what);
    if (limits.cap > 0)
        snprintf(err, len, "--max-memory-mb %g: the run needs at least %s on rank %d by theory/predict.h (%s), more "
                 "than the cap of %s per rank", ctx->opt.max_memory_mb, run_bytes_text(f->bytes, a), me, what,
                 run_bytes_text(limits.cap, b));
    else if (limits.per_host && n > 1)
        snprintf(err, len, "the run needs at least %s on rank %d by theory/predict.h (%s), %s for the %d ranks of "
                 "this host together: more than %s (--max-memory-mb sets a cap per rank instead)",
                 run_bytes_text(f->bytes, a), worst, what, run_bytes_text(host, b), n, limits.machine_text);
    else
        snprintf(err, len, "the run needs at least %s on rank %d by theory/predict.h (%s): more than %s "
                 "(--max-memory-mb sets a cap per rank instead)", run_bytes_text(f->bytes, a), worst, what,
                 limits.machine_text);
}

/* rank 0's line for --dry-run: the busiest rank's floor (and rank 0's host's) against the limits */
static void print_verdict(const run_ctx *ctx, const th_run *need) {
    rank_floor *floors = malloc(sizeof *floors * (size_t)need->ranks); /* = ctx->size */
    if (!floors || predict_floors(need, floors)) {
        free(floors);
        return;
    }
    int busiest = 0, n = 0;
    double host = 0;
    for (int q = 0; q < ctx->size; q++) {
        if (floors[q].bytes > floors[busiest].bytes) busiest = q;
        if (ctx->host_of_rank[q] == ctx->host_of_rank[0]) host += floors[q].bytes, n++;
    }
    char err[1024], a[24], b[24];
    int fits_machine, fits_cap;
    judge(ctx, floors, err, sizeof err, &fits_machine, &fits_cap);
    printf("memory: at least %s on the busiest rank (%d) by theory/predict.h%s", run_bytes_text(floors[busiest].bytes, a),
           busiest, need->cuda ? " (the kernels' own scratch on top)" : "");
    if (limits.cap > 0)
        printf(", %s --max-memory-mb %g (%s per rank): %s\n", floors[busiest].bytes <= limits.cap ? "under" : "over",
               ctx->opt.max_memory_mb, run_bytes_text(limits.cap, b),
               floors[busiest].bytes <= limits.cap ? "the run fits" : "the run would be refused");
    else if (limits.machine > 0 && limits.per_host && n > 1)
        printf(", %s for the %d ranks of rank 0's host together, against %s: %s\n", run_bytes_text(host, b), n,
               limits.machine_text, fits_machine ? "the run fits" : "the run would be refused");
    else if (limits.machine > 0)
        printf(", against %s: %s\n", limits.machine_text, fits_machine ? "the run fits" : "the run would be refused");
    else printf("; this machine does not say how much memory it has: not checked\n");
    free(floors);
}

void lab_start(run_ctx *ctx, const th_run *need) {
    char err[1024] = "";
    limits.cap = ctx->opt.max_memory_mb * 1048576.0;
    limits.machine = run_memory_limit(ctx, &limits.per_host, limits.machine_text, sizeof limits.machine_text);
    limits.checked = 1;
    limits.need = *need;
    rank_floor *floors = malloc(sizeof *floors * (size_t)need->ranks); /* = ctx->size */
    if (!floors || predict_floors(need, floors)) {
        snprintf(err, sizeof err, "out of host memory predicting the run's memory");
    } else {
        int fits_machine, fits_cap;
        judge(ctx, floors, err, sizeof err, &fits_machine, &fits_cap);
        /* a dry run with a cap plans for another machine: refused only when it fits neither */
        if (ctx->opt.dry_run && limits.cap > 0 && (fits_machine || fits_cap)) err[0] = 0;
    }
    free(floors);
    run_agree_or_exit(err);
    /* --resume against the model's tensors, before anything is created; after the memory check, which
     * bounds the shape whose tensor table it builds */
    ckpt_check_flags(ctx, err, sizeof err);
    run_agree_or_exit(err);
    run_start(ctx);
}

void lab_dry_run_exit(run_ctx *ctx, const th_run *need, run_report r, lab_dry_run_notes *notes, void *lab) {
    double ring = -1;
    if (ctx->rank == 0) ring = th_print_prediction(stdout, need, 32);
    if (ctx->rank == 0 && notes) notes(ctx, lab, need);
    if (ctx->rank == 0 && limits.checked) print_verdict(ctx, need);
    if (r.comm_formula_bytes == DRY_RUN_PREDICTED_RING) r.comm_formula_bytes = ring;
    run_dry_run_exit(ctx, &r);
}

void lab_finish(run_ctx *ctx, ckpt_view *view, double eval_loss, json_t *members, int states, run_report r) {
    if (!members && !(members = json_object())) die("out of host memory");
    ckpt_record_members(ctx, view, eval_loss, members);
    r.record_members = members;
    if (states) {
        const th_opts opts = th_opts_precision(1, g_precision == PREC_BF16);
        const th_states per_param = th_model_states(1, &opts, 0, 1);
        r.states_formula[0] = per_param.params;
        r.states_formula[1] = per_param.grads;
        r.states_formula[2] = per_param.optim;
        r.states_formula_text = g_precision == PREC_BF16 ? "2 + 2 + 12" : "4 + 4 + 8";
    }
    run_finish(ctx, &r);
    json_decref(members);
    ckpt_view_free(view);
}

double lab_model_forward_loss(void *model, gpt_acts *acts) {
    const lab_model *m = model;
    if (m->hooks) gpt_forward_with(m->g, m->hooks, m->params, acts);
    else gpt_forward(m->g, m->params, acts);
    return gpt_mean_loss(m->g, acts);
}

double lab_heldout_sum(const dataset *data, int batch, int seq, comm *quiet, lab_batch_loss *batch_loss, void *arg,
                       int *batches) {
    dataset heldout;
    *batches = data_heldout(data, batch, seq, &heldout);
    const comm_quiet q = comm_quiet_begin(quiet);
    double sum = 0;
    for (int b = 0; b < *batches; b++) sum += batch_loss(arg, &heldout, b);
    comm_quiet_end(&q);
    return sum;
}

typedef struct {
    int T, first_row, rows, micro;
    gpt_acts *acts;
    int *tokens, *targets;
    lab_forward_loss *forward;
    void *arg;
} rows_forward;

/* lab_heldout_loss's batch: this rank's rows, micro rows at a time */
static double rows_loss(void *arg, const dataset *heldout, int b) {
    const rows_forward *r = arg;
    const int n = r->micro > 0 ? r->micro : r->rows;
    double sum = 0;
    for (int k = 0; k < r->rows / n; k++) {
        data_batch(heldout, 0, b, r->first_row + k * n, n, r->T, r->tokens, r->targets);
        gpt_acts_set_batch(r->acts, r->tokens, r->targets, r->T);
        const double loss = r->forward(r->arg, r->acts);
        sum += r->micro > 0 ? loss * r->micro / r->rows : loss;
    }
    return sum;
}

double lab_heldout_loss(const run_ctx *ctx, comm *world, comm *quiet, int first_row, int rows, int micro,
                        gpt_acts *acts, int *tokens, int *targets, lab_forward_loss *forward, void *arg) {
    rows_forward r = {ctx->opt.seq, first_row, rows, micro, acts, tokens, targets, forward, arg};
    int batches;
    double sum = lab_heldout_sum(&ctx->data, ctx->opt.batch, ctx->opt.seq, quiet, rows_loss, &r, &batches);
    const comm_quiet q = comm_quiet_begin(quiet);
    comm_allreduce_host(world, &sum, 1);
    comm_quiet_end(&q);
    return sum / ((double)batches * world->size);
}
