/* The end of a run: gather what every rank measured, print the summary, and
 * append the run record (one JSON line, one CSV row) that tests and plots read. */
#define _POSIX_C_SOURCE 200809L
#include "run.h"
#include "jsonval.h"
#include "kernels.h"
#include "kernel_times.h"
#include "mem.h"
#include "textbuf.h"
#include "trace.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double calls[COLL_NKINDS], payload[COLL_NKINDS], wire[COLL_NKINDS], seconds[COLL_NKINDS];
} traffic;

static traffic count_traffic(const run_report *r) {
    traffic t;
    memset(&t, 0, sizeof t);
    for (int c = 0; c < r->n_comms; c++) {
        if (r->comms[c]->size <= 1) continue; /* a collective of one rank moves nothing */
        for (int k = 0; k < COLL_NKINDS; k++) {
            const comm_stat *s = &r->comms[c]->stats[k];
            t.calls[k] += (double)s->calls;
            t.payload[k] += s->bytes;
            t.wire[k] += comm_ring_factor(k, r->comms[c]->size) * s->bytes; /* the ring algorithm's bytes */
            t.seconds[k] += s->seconds;
        }
    }
    return t;
}

/* Appends text to path, or ends the job naming the path and the reason: a full
 * disk shows up at fclose, not at the write. */
static void append_or_die(const char *path, const char *text) {
    FILE *f = fopen(path, "a");
    if (!f) die("cannot append to %s: %s", path, strerror(errno));
    int bad = fputs(text, f) < 0 || fflush(f) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) { bad = 1; e = errno; }
    if (bad) die("cannot write %s: %s", path, strerror(e));
}

static void sanitize(char *dst, size_t len, const char *src) {
    size_t i = 0;
    for (; src[i] && i + 1 < len; i++) {
        char c = src[i];
        dst[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ? c : '_';
    }
    dst[i] = 0;
}

/* The activation peak of every rank beside its formula, on one line:
 * `all` holds each rank's row of `fields` doubles, the measured peak at
 * MEM_ACTS and the formula at `formula` (0: the lab gave none). */
static void print_acts_formula(const double *all, int fields, int formula, int R, const char *recompute) {
    int equal = 1, same = 1;
    for (int q = 0; q < R; q++) {
        const double *x = all + (size_t)q * fields;
        if (x[formula] <= 0) return;
        equal &= x[MEM_ACTS] == x[formula];
        same &= x[MEM_ACTS] == all[MEM_ACTS];
    }
    char a[16], b[16];
    /* no "formula" in this line: the lessons' transcripts `grep formula` for the traffic line */
    printf("  activations     peak per rank, allocator %s theory.h (--recompute %s):", equal ? "=" : "vs", recompute);
    if (equal && same) printf(" %sB on every rank\n", human(all[MEM_ACTS], a));
    else {
        for (int q = 0; q < R && q < 8; q++) {
            const double *x = all + (size_t)q * fields;
            if (x[MEM_ACTS] == x[formula]) printf(" %sB", human(x[MEM_ACTS], a));
            else printf(" rank %d %sB vs %sB MISMATCH", q, human(x[MEM_ACTS], a), human(x[formula], b));
        }
        printf("%s\n", R > 8 ? " ... (every rank in the record)" : "");
    }
}

/* What run_setup allocated for the run. */
static void run_release(run_ctx *ctx) {
    free(ctx->step_seconds);
    free(ctx->losses);
    free(ctx->grad_norms);
    free(ctx->aux_losses);
    free(ctx->dropped);
    free(ctx->expert_load);
    free(ctx->route_bias);
    free(ctx->imbalance);
    free(ctx->bias_lo);
    free(ctx->bias_hi);
    free(ctx->groups_most);
    free(ctx->groups_mean);
    ctx->groups_most = ctx->groups_mean = NULL;
    ctx->route_bias = NULL;
    ctx->model.route_bias = NULL;
    ctx->step_seconds = ctx->losses = ctx->grad_norms = NULL;
    free(ctx->records_jsonl);
    free(ctx->records_csv);
    ctx->records_jsonl = ctx->records_csv = NULL;
    data_free(&ctx->data);
    free(ctx->host_of_rank);
    free(ctx->host_labels);
    ctx->host_of_rank = NULL;
    ctx->host_labels = NULL;
}

/* The bubble as the papers count it (GPipe, Megatron-LM, zero bubble): idle time over the
 * ideal step (the work alone), b / (1 - b) for a bubble b of the whole step: (p-1)/m for
 * 1F1B's (p-1)/(m+p-1), (p-1)/(v m) interleaved, 0 for ZB-V. */
static double bubble_per_ideal(double idle_per_step) { return idle_per_step / (1 - idle_per_step); }

/* What the end of a run measured, gathered from every rank: the summary and the record print it. */
enum { NM = MEM_NCAT + 2, ACTS_FORMULA = MEM_NCAT + 1 }; /* per rank: the categories, the total, the formula */
typedef struct finish_figures {
    int R, steps;
    char *run_layout;     /* the run's layout, --recompute in it when not none */
    char layout[64];      /* the same as a file name's part */
    char *json_path, *csv_path; /* the trace and the timeline */
    double *all;          /* rank 0: [R][NM] every rank's memory peaks and activation formula */
    double states[3];     /* model states per parameter held, the largest over ranks */
    int states_formula;   /* the lab gave theory's bytes per parameter */
    trace_summary ts;     /* rank 0's timeline over the measured steps */
    double *fracs;        /* rank 0: [R][3] compute, comm and bubble fractions of the step */
    traffic tmax;         /* the most of any rank, per kind */
    double check_max[2];  /* --check-collectives: checks and seconds, the most of any rank */
    double med, tok_s, gflops, peak_max[NM], per_step, wire_total, payload_total;
    char measured[48];    /* which steps the clocks measured */
    int kernel_times;     /* PL_KERNEL_TIMES=1: kernel_ms holds ms per step by kind, then the rest */
    double kernel_ms[KERNEL_NKINDS + 1];
} finish_figures;

/* Gathers every rank's figures into f (rank 0's) and writes the trace and the
 * timeline. Collective. Returns 1 on rank 0, which goes on to print and record. */
static int gather_figures(run_ctx *ctx, const run_report *r, finish_figures *f) {
    const run_options *o = &ctx->opt;
    const int R = ctx->size, rank = ctx->rank;
    *f = (finish_figures){.R = R, .steps = ctx->steps_done};
    /* the layout names the run (summary, record, trace and timeline files): --recompute is in it when not none */
    f->run_layout = ctx->model.recompute ? text_format("%s recompute=%s", r->layout, o->recompute)
                                         : text_format("%s", r->layout);

    /* memory: every category's peak on every rank */
    double mine[NM];
    f->all = rank == 0 ? malloc(sizeof(double) * NM * (size_t)R) : NULL;
    for (int c = 0; c < MEM_NCAT; c++) mine[c] = (double)mem_peak(c);
    mine[MEM_NCAT] = (double)mem_peak_total();
    mine[ACTS_FORMULA] = r->acts_formula_bytes;
    MPI_Gather(mine, NM, MPI_DOUBLE, f->all, NM, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    /* model states per parameter this rank computes with, the largest over ranks */
    const double held = (double)(r->params_held > 0 ? r->params_held : r->params);
    double states_mine[3];
    for (int c = 0; c < 3; c++) states_mine[c] = held > 0 ? (double)mem_peak(MEM_PARAMS + c) / held : 0;
    MPI_Reduce(states_mine, f->states, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    f->states_formula = r->states_formula[0] + r->states_formula[1] + r->states_formula[2] > 0;

    /* timeline: busy fractions over the measured steps, then the files */
    f->ts = trace_summarize(ctx->steps_done > 1 ? 1 : 0);
    const trace_summary *ts = &f->ts;
    double fr[3] = {ts->wall > 0 ? ts->compute / ts->wall : 0, ts->wall > 0 ? ts->comm / ts->wall : 0,
                    ts->wall > 0 ? 1 - ts->busy / ts->wall : 0}; /* compute, comm, bubble (idle outside compute events) */
    f->fracs = rank == 0 ? malloc(sizeof(double) * 3 * (size_t)R) : NULL;
    MPI_Gather(fr, 3, MPI_DOUBLE, f->fracs, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);

    /* traffic: the maximum over ranks of each figure (ranks differ in pipelines) */
    traffic t = count_traffic(r);
    MPI_Reduce(&t, &f->tmax, sizeof t / sizeof(double), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    /* --check-collectives: its checks and seconds, the most of any rank */
    long checks;
    double check_s, check_mine[2];
    flight_check_cost(&checks, &check_s);
    check_mine[0] = (double)checks;
    check_mine[1] = check_s;
    MPI_Reduce(check_mine, f->check_max, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    sanitize(f->layout, sizeof f->layout, f->run_layout);
    f->json_path = text_format("%s/%s_%s_trace.json", o->out, ctx->lab.name, f->layout);
    f->csv_path = text_format("%s/%s_%s_timeline.csv", o->out, ctx->lab.name, f->layout);
    trace_write(MPI_COMM_WORLD, f->json_path, f->csv_path);
    if (rank != 0) return 0;

    const int steps = f->steps;
    f->med = run_median_step_seconds(ctx);
    f->tok_s = f->med > 0 ? (double)ctx->tokens_per_step / f->med : 0;
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    f->gflops = f->tok_s * gpt_flops_per_token(&g) / 1e9;
    for (int q = 0; q < R; q++)
        for (int c = 0; c < NM; c++)
            if (f->all[q * NM + c] > f->peak_max[c]) f->peak_max[c] = f->all[q * NM + c];
    f->per_step = steps > 0 ? 1.0 / steps : 0;
    for (int k = 0; k < COLL_NKINDS; k++) {
        f->wire_total += f->tmax.wire[k] * f->per_step;
        f->payload_total += f->tmax.payload[k] * f->per_step;
    }
    /* what was measured: the steps after the first (start-up), or step 1 alone in a one-step run */
    if (steps > 2) snprintf(f->measured, sizeof f->measured, "steps 2-%d", steps);
    else if (steps == 2) snprintf(f->measured, sizeof f->measured, "step 2");
    else snprintf(f->measured, sizeof f->measured, "step 1 alone, start-up included");
    /* PL_KERNEL_TIMES=1: the step by kernel kind (kernel_times.h), rank 0's */
    f->kernel_times = kernel_times_enabled() && ts->steps > 0;
    if (f->kernel_times) {
        kernel_times_seconds(ctx->steps_done > 1 ? 1 : 0, f->kernel_ms);
        const double step_ms = ts->wall / ts->steps * 1e3;
        f->kernel_ms[KERNEL_NKINDS] = step_ms;
        for (int k = 0; k < KERNEL_NKINDS; k++) {
            f->kernel_ms[k] *= 1e3 / ts->steps;
            f->kernel_ms[KERNEL_NKINDS] -= f->kernel_ms[k];
        }
    }
    return 1;
}

static void figures_free(finish_figures *f) {
    free(f->all);
    free(f->fracs);
    free(f->json_path);
    free(f->csv_path);
    free(f->run_layout);
}

/* The summary, on rank 0. */
static void print_summary(const run_ctx *ctx, const run_report *r, const finish_figures *f) {
    const run_options *o = &ctx->opt;
    const int R = f->R, steps = f->steps;
    const double per_step = f->per_step, med = f->med;
    const traffic *tmax = &f->tmax;
    char a[16], b[16];
    printf("\nsummary of %s (%s, %d rank%s, %s/%s)\n", ctx->lab.name, f->run_layout, R, R == 1 ? "" : "s",
           ctx->device == DEVICE_CUDA ? "cuda" : "cpu", ctx->backend == COMM_NCCL ? "nccl" : "mpi");
    printf("  loss            %.4f -> %.4f over %d steps\n", ctx->losses[0], ctx->losses[steps - 1], steps);
    if (ctx->aux_losses && ctx->route_bias)
        printf("  balance         --balance bias: no aux loss; gamma %g, the bias %+.4f..%+.4f after the last step, "
               "%.0f dropped choices in the last step\n", o->bias_speed, ctx->bias_lo[steps - 1],
               ctx->bias_hi[steps - 1], ctx->dropped[steps - 1]);
    else if (ctx->aux_losses)
        printf("  aux loss        %.5f -> %.5f inside it (uniform routing: %g), %.0f dropped choices in the last "
               "step\n", ctx->aux_losses[0], ctx->aux_losses[steps - 1], o->aux_loss_coef, ctx->dropped[steps - 1]);
    if (ctx->expert_load) { /* max / mean of the choices per expert, layer by layer (1: balanced) */
        printf("  expert load     last step, choices per expert max/mean by layer:");
        for (int l = 0; l < o->layers; l++) {
            double mx = 0, sum = 0;
            for (int e = 0; e < o->experts; e++) {
                double x = ctx->expert_load[(long)l * o->experts + e];
                mx = x > mx ? x : mx;
                sum += x;
            }
            printf(" %.2f", sum > 0 ? mx * o->experts / sum : 0);
        }
        printf("\n");
    }
    if (ctx->interrupted)
        printf("  interrupted     by %s after %d of %d steps (the record says so; the status is %d)\n",
               ctx->interrupted == SIGINT ? "SIGINT" : "SIGTERM", steps, o->steps, 128 + ctx->interrupted);
    if (ctx->diverged_at)
        printf("  diverged        the loss was first not finite at step %d (null in the record)\n", ctx->diverged_at);
    printf("  throughput      %s tok/s, %sstep %.1f ms (%s), %s FLOP/s model compute\n",
           human(f->tok_s, a), steps > 2 ? "median " : "", med * 1e3, f->measured, human(f->gflops * 1e9, b));
    printf("  peak memory     (bytes per rank, max over ranks)\n                 ");
    for (int m = 0; m < MEM_NCAT; m++) printf(" %s %sB |", mem_category_names[m], human(f->peak_max[m], a));
    printf(" total %sB\n", human(f->peak_max[MEM_NCAT], a));
    print_acts_formula(f->all, NM, ACTS_FORMULA, R, o->recompute);
    if (g_precision == PREC_BF16 && f->states_formula) {
        const double *formula = r->states_formula;
        printf("  model states    %.2f bytes per parameter held = params %.2f + grads %.2f + optim %.2f "
               "(formula %s = %.2f: bf16 weights and gradients, fp32 master + AdamW moments)\n",
               f->states[0] + f->states[1] + f->states[2], f->states[0], f->states[1], f->states[2], r->states_formula_text,
               formula[0] + formula[1] + formula[2]);
        if (ctx->device == DEVICE_CPU)
            printf("                  (+ %sB of fp32 host scratch in the CPU's bf16 kernels, outside the categories)\n",
                   human((double)kernels_bf16_cpu_scratch_bytes(), a));
    }
    size_t drv_free, drv_total;
    if (mem_driver_info(&drv_free, &drv_total)) { /* the whole GPU's figure, whoever else uses it */
        char whose[48] = "rank 0's GPU";
        if (ctx->gpu_sharers > 1) snprintf(whose, sizeof whose, "whole GPU of rank 0, shared by %d ranks", ctx->gpu_sharers);
        printf("                  driver (%s): %sB used of %sB\n", whose, human((double)(drv_total - drv_free), a),
               human((double)drv_total, b));
    }
    printf("  communication   per rank per step (max over ranks):\n");
    int any = 0;
    for (int k = 0; k < COLL_NKINDS; k++) {
        if (tmax->calls[k] == 0) continue;
        any = 1;
        /* point to point moves its payload once: no ring factor, and the line says so */
        int p2p = k == COLL_SEND || k == COLL_RECV;
        printf("                  %-14s %5.1f calls | payload %sB | %s %sB | %.2f ms\n",
               comm_kind_names[k], tmax->calls[k] * per_step, human(tmax->payload[k] * per_step, a),
               p2p ? "point to point" : k == COLL_ALLTOALL ? "to other ranks" : "ring traffic",
               human(tmax->wire[k] * per_step, b), tmax->seconds[k] * per_step * 1e3);
    }
    if (!any) printf("                  none\n");
    if (r->comm_formula_bytes >= 0)
        printf("                  formula %s = %sB; measured ring traffic %sB (ratio %.3f)\n",
               r->comm_formula, human(r->comm_formula_bytes, a), human(f->wire_total, b),
               r->comm_formula_bytes > 0 ? f->wire_total / r->comm_formula_bytes : (f->wire_total == 0 ? 1.0 : 0.0));
    if (flight_check_collectives)
        printf("  check-collectives %.0f checks, %.2f ms per step (%.2f%% of the median step), the most of any rank\n",
               f->check_max[0], steps > 0 ? f->check_max[1] / steps * 1e3 : 0,
               med > 0 && steps > 0 ? 100 * f->check_max[1] / steps / med : 0);
    printf("  time split      (fraction of step time, %s; each second counted once)\n", f->measured);
    for (int q = 0; q < R; q++) {
        printf("                  rank %d: compute %.2f | comm %.2f", q, f->fracs[3 * q], f->fracs[3 * q + 1]);
        if (r->bubble_theory >= 0) printf(" | bubble %.3f (theory %.3f)", f->fracs[3 * q + 2], r->bubble_theory);
        printf("\n");
        if (q == 7 && R > 9) { printf("                  ... (%d more ranks in the record)\n", R - 8); break; }
    }
    if (r->bubble_theory >= 0 && r->bubble_theory < 1) /* the two conventions a student meets */
        printf("                  bubble theory %.3f of the step (idle / step, this course) = %.3f of the ideal step "
               "(idle / ideal: the papers' and Megatron's (p-1)/m)\n", r->bubble_theory, bubble_per_ideal(r->bubble_theory));
    if (f->kernel_times) {
        const double step_ms = f->ts.wall / f->ts.steps * 1e3;
        const double *kernel_ms = f->kernel_ms;
        printf("  kernel time     ms per step by kernel kind (rank 0, mean of the measured steps: %.1f ms)\n", step_ms);
        for (int k = 0; k <= KERNEL_NKINDS; k++)
            printf("%s%s %.1f (%.0f%%)%s", k % 5 == 0 ? "                  " : "",
                   k < KERNEL_NKINDS ? kernel_kind_names[k] : "other", kernel_ms[k],
                   step_ms > 0 ? 100 * kernel_ms[k] / step_ms : 0, k == KERNEL_NKINDS || k % 5 == 4 ? "\n" : " | ");
    }
    printf("  record          %s (and records.csv)\n", ctx->records_jsonl);
    printf("  trace           %s (open in https://ui.perfetto.dev)\n", f->json_path);
    printf("  timeline        %s\n", f->csv_path);

}

/* The record: one JSON line (jansson: escaped strings, null for what is not finite), on rank 0. */
static void write_record(const run_ctx *ctx, const run_report *r, const finish_figures *f) {
    const run_options *o = &ctx->opt;
    const int R = f->R, steps = f->steps;
    const double per_step = f->per_step;
    const traffic *tmax = &f->tmax;
    const double *all = f->all, *fracs = f->fracs;
    const char *dev = ctx->device == DEVICE_CUDA ? "cuda" : "cpu", *backend = ctx->backend == COMM_NCCL ? "nccl" : "mpi";
    json_t *rec = json_object(), *config = json_object(), *x;
    if (!rec || !config) die("out of host memory");
    jsonval_set(rec, "lab", jsonval_text(ctx->lab.name));
    jsonval_set(rec, "ranks", json_integer(R));
    jsonval_set(rec, "layout", jsonval_text(f->run_layout));
    jsonval_set(rec, "device", jsonval_text(dev));
    jsonval_set(rec, "comm", jsonval_text(backend));
    const struct { const char *key; int value; } ints[] = {{"steps", o->steps}, {"batch", o->batch}, {"seq", o->seq},
        {"layers", o->layers}, {"d_model", o->d_model}, {"heads", o->heads}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) jsonval_set(config, ints[i].key, json_integer(ints[i].value));
    jsonval_set(config, "lr", jsonval_number(o->lr));
    jsonval_set(config, "weight_decay", jsonval_number(o->weight_decay));
    jsonval_set(config, "clip", jsonval_number(o->clip));
    jsonval_set(config, "seed", json_integer(o->seed));
    jsonval_set(config, "data", jsonval_text(o->data ? o->data : "built-in"));
    jsonval_set(config, "preset", jsonval_text(o->preset));
    jsonval_set(config, "recompute", jsonval_text(o->recompute));
    jsonval_set(config, "precision", jsonval_text(precision_name(g_precision)));
    if (o->experts) {
        jsonval_set(config, "experts", json_integer(o->experts));
        jsonval_set(config, "top_k", json_integer(o->top_k));
        if (ctx->model.expert_width > 0) jsonval_set(config, "expert_width", json_integer(ctx->model.expert_width));
        if (ctx->model.shared_experts > 0) jsonval_set(config, "shared_experts", json_integer(ctx->model.shared_experts));
        jsonval_set(config, "capacity_factor", jsonval_number(o->capacity_factor));
        jsonval_set(config, "capacity_scope", jsonval_text(o->capacity_scope));
        jsonval_set(config, "aux_loss_coef", jsonval_number(o->aux_loss_coef));
        if (ctx->model.route_groups > 0) { /* node-limited routing: the groups and the most a token reaches */
            jsonval_set(config, "route_groups", json_integer(ctx->model.route_groups));
            jsonval_set(config, "route_max_groups", json_integer(ctx->model.route_max_groups));
            jsonval_set(rec, "route_groups_max_per_step", jsonval_numbers(ctx->groups_most, steps));
            jsonval_set(rec, "route_groups_mean_per_step", jsonval_numbers(ctx->groups_mean, steps));
        }
    }
    jsonval_set(rec, "config", config);
    /* the flight recorder's settings (flight.h): they change no result */
    json_t *flight = json_object();
    jsonval_set(flight, "records_kept", json_integer(flight_records));
    jsonval_set(flight, "hang_timeout_s", jsonval_number(flight_hang_timeout));
    jsonval_set(flight, "check_collectives", json_boolean(flight_check_collectives));
    jsonval_set(flight, "check_calls", json_integer((json_int_t)f->check_max[0]));
    jsonval_set(flight, "check_seconds", jsonval_number(f->check_max[1]));
    jsonval_set(rec, "flight", flight);
    jsonval_set(rec, "params", json_integer(r->params));
    jsonval_set(rec, "losses", jsonval_numbers(ctx->losses, steps)); /* 17 digits, exact: tests compare bits */
    jsonval_set(rec, "grad_norms", jsonval_numbers(ctx->grad_norms, steps)); /* before clipping */
    if (ctx->aux_losses) { /* inside "losses" already */
        jsonval_set(rec, "aux_losses", jsonval_numbers(ctx->aux_losses, steps));
        jsonval_set(rec, "dropped_per_step", jsonval_numbers(ctx->dropped, steps));
        jsonval_set(rec, "expert_choices_last_step", jsonval_numbers(ctx->expert_load, o->experts * o->layers));
    }
    if (ctx->route_report) { /* --router or --balance given (moe.h): the routing and its balance per step */
        jsonval_set(rec, "router", json_string(o->router));
        jsonval_set(rec, "balance", json_string(o->balance));
        jsonval_set(rec, "load_imbalance_per_step", jsonval_numbers(ctx->imbalance, steps));
        if (ctx->route_bias) {
            jsonval_set(rec, "bias_speed", jsonval_number(o->bias_speed));
            jsonval_set(rec, "bias_min_per_step", jsonval_numbers(ctx->bias_lo, steps));
            jsonval_set(rec, "bias_max_per_step", jsonval_numbers(ctx->bias_hi, steps));
        }
    }
    jsonval_set(rec, "diverged_at_step", ctx->diverged_at ? json_integer(ctx->diverged_at) : json_null());
    /* a run that ended early: how a script tells a finished run (steps_done = config.steps) from one a
     * signal stopped, whatever status the launcher reports (docs/cluster.md) */
    jsonval_set(rec, "steps_done", json_integer(steps));
    jsonval_set(rec, "interrupted", ctx->interrupted ? json_string(ctx->interrupted == SIGINT ? "SIGINT" : "SIGTERM")
                                                     : json_null());
    double *col = malloc(sizeof(double) * (size_t)(R > steps ? R : steps) + 1);
    if (!col) die("out of host memory");
    for (int i = 0; i < steps; i++) col[i] = ctx->step_seconds[i] * 1e3;
    jsonval_set(rec, "step_ms", jsonval_numbers(col, steps));
    jsonval_set(rec, "tokens_per_s", jsonval_number(f->tok_s));
    jsonval_set(rec, "step_ms_median", jsonval_number(f->med * 1e3));
    jsonval_set(rec, "model_flops_per_s", jsonval_number(f->gflops * 1e9));
    jsonval_set(rec, "mem_peak_bytes", x = json_object());
    for (int m = 0; m <= MEM_NCAT; m++)
        jsonval_set(x, m < MEM_NCAT ? mem_category_names[m] : "total", jsonval_integer(f->peak_max[m]));
    jsonval_set(rec, "mem_peak_bytes_per_rank", x = json_object());
    for (int m = 0; m <= MEM_NCAT; m++) {
        for (int q = 0; q < R; q++) col[q] = all[q * NM + m];
        jsonval_set(x, m < MEM_NCAT ? mem_category_names[m] : "total", jsonval_integers(col, R));
    }
    /* beside mem_peak_bytes_per_rank.acts: the same peak by theory.h, rank by rank */
    for (int q = 0; q < R; q++) col[q] = all[q * NM + ACTS_FORMULA];
    jsonval_set(rec, "acts_peak_bytes_formula_per_rank", r->acts_formula_bytes > 0 ? jsonval_integers(col, R) : json_null());
    if (f->states_formula) {
        jsonval_set(rec, "model_state_bytes_per_param", x = json_object());
        for (int c = 0; c < 3; c++) jsonval_set(x, mem_category_names[MEM_PARAMS + c], jsonval_number(f->states[c]));
        jsonval_set(x, "formula", jsonval_numbers(r->states_formula, 3));
        jsonval_set(x, "formula_text", jsonval_text(r->states_formula_text));
    }
    if (g_precision == PREC_BF16 && ctx->device == DEVICE_CPU) {
        jsonval_set(rec, "bf16_gemm", jsonval_text(kernels_bf16_cpu_uses_onednn() ? "onednn" : "sgemm"));
        jsonval_set(rec, "bf16_cpu_scratch_bytes", jsonval_integer((double)kernels_bf16_cpu_scratch_bytes()));
    }
    if (f->kernel_times) {
        jsonval_set(rec, "kernel_ms_per_step", x = json_object());
        for (int k = 0; k <= KERNEL_NKINDS; k++)
            jsonval_set(x, k < KERNEL_NKINDS ? kernel_kind_names[k] : "other", jsonval_number(f->kernel_ms[k]));
    }
    jsonval_set(rec, "comm_bytes_per_step", x = json_object());
    for (int k = 0; k < COLL_NKINDS; k++)
        if (tmax->calls[k] != 0) jsonval_set(x, comm_kind_names[k], jsonval_integer(tmax->payload[k] * per_step));
    jsonval_set(rec, "comm_calls_per_step", x = json_object());
    for (int k = 0; k < COLL_NKINDS; k++)
        if (tmax->calls[k] != 0) jsonval_set(x, comm_kind_names[k], jsonval_number(tmax->calls[k] * per_step));
    jsonval_set(rec, "comm_ring_bytes_per_step", jsonval_integer(f->wire_total));
    jsonval_set(rec, "comm_formula_bytes_per_step", jsonval_integer(r->comm_formula_bytes));
    for (int q = 0; q < R; q++) col[q] = fracs[3 * q];
    jsonval_set(rec, "compute_fraction", jsonval_numbers(col, R));
    for (int q = 0; q < R; q++) col[q] = fracs[3 * q + 1];
    jsonval_set(rec, "comm_fraction", jsonval_numbers(col, R));
    if (r->bubble_theory >= 0) {
        for (int q = 0; q < R; q++) col[q] = fracs[3 * q + 2];
        jsonval_set(rec, "bubble", x = json_object());
        jsonval_set(x, "measured", jsonval_numbers(col, R));
        jsonval_set(x, "theory", jsonval_number(r->bubble_theory));
        jsonval_set(x, "theory_per_ideal", jsonval_number(bubble_per_ideal(r->bubble_theory)));
    }
    jsonval_set(rec, "trace", jsonval_text(f->json_path));
    jsonval_set(rec, "timeline", jsonval_text(f->csv_path));
    jsonval_set(rec, "data_bytes", json_integer(ctx->data.n));
    char hash[24];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)ctx->data.hash);
    jsonval_set(rec, "data_fnv1a64", jsonval_text(hash));
    if (r->record_members && json_object_update(rec, (json_t *)r->record_members) != 0) die("out of host memory");
    char *line = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    if (!line) die("out of host memory");
    char *with_newline = text_format("%s\n", line);
    append_or_die(ctx->records_jsonl, with_newline);
    free(with_newline);
    free(line);
    free(col);

}

/* And one CSV row, the same columns for every lab, on rank 0. */
static void write_csv_row(const run_ctx *ctx, const run_report *r, const finish_figures *f) {
    const run_options *o = &ctx->opt;
    const int R = f->R, steps = f->steps;
    const char *dev = ctx->device == DEVICE_CUDA ? "cuda" : "cpu", *backend = ctx->backend == COMM_NCCL ? "nccl" : "mpi";
    FILE *probe = fopen(ctx->records_csv, "r");
    int fresh = probe == NULL;
    if (probe) fclose(probe);
    double bubble_max = -1;
    if (r->bubble_theory >= 0)
        for (int q = 0; q < R; q++)
            if (f->fracs[3 * q + 2] > bubble_max) bubble_max = f->fracs[3 * q + 2];
    char *row = text_format("%s%s,%d,%s,%s,%s,%d,%d,%d,%d,%d,%d,%.9g,%.9g,%.6g,%.6g,%.0f,%.0f,%.0f,%.0f,%.4f,%.4f\n",
            fresh ? "lab,ranks,layout,device,comm,steps,batch,seq,layers,d_model,heads,first_loss,final_loss,"
                    "tokens_per_s,step_ms_median,mem_peak_total,comm_payload_bytes_per_step,"
                    "comm_ring_bytes_per_step,comm_formula_bytes_per_step,bubble_measured_max,bubble_theory\n" : "",
            ctx->lab.name, R, f->layout, dev, backend, o->steps, o->batch, o->seq, o->layers, o->d_model,
            o->heads, ctx->losses[0], ctx->losses[steps - 1], f->tok_s, f->med * 1e3, f->peak_max[MEM_NCAT],
            f->payload_total, f->wire_total, r->comm_formula_bytes, bubble_max, r->bubble_theory);
    append_or_die(ctx->records_csv, row);
    free(row);
}

void run_finish(run_ctx *ctx, const run_report *r) {
    finish_figures f;
    if (gather_figures(ctx, r, &f)) {
        print_summary(ctx, r, &f);
        write_record(ctx, r, &f);
        write_csv_row(ctx, r, &f);
    }
    figures_free(&f);
    run_release(ctx);
}
