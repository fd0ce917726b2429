#include "zero_report.h"
#include "device.h" /* die */
#include "jsonval.h"
#include "mem.h"
#include "theory.h"
#include <math.h>
#include <stdio.h>

static const mem_category zero_category[ZERO_NCAT] = {MEM_PARAMS, MEM_GRADS, MEM_OPTIM};

static void by_category(th_states s, double out[ZERO_NCAT]) {
    out[ZERO_PARAMS] = s.params;
    out[ZERO_GRADS] = s.grads;
    out[ZERO_OPTIM] = s.optim;
}

void zero_figures_compute(const zero_state *z, zero_figures *f) { zero_figures_of_plan(z->g, &z->plan, z->stage, f); }

void zero_figures_of_plan(const gpt_layout *g, const shard_plan *p, int s, zero_figures *f) {
    const double psi = (double)g->total, pad = (double)p->padding_elems;
    *f = (zero_figures){.psi = psi, .ranks = p->ranks};

    /* theory/'s table (theory.h: th_model_states), the buffers of whole units
     * on top, and the padding: the full buffers hold Psi + padding elements, a
     * shard (Psi + padding) / N */
    /* P, G, K bytes per parameter: fp32 4, 4, 8; bf16 2, 2, 12 (precision.h) */
    const th_opts opts = th_opts_precision(1, g_precision == PREC_BF16);
    const th_states formula = th_model_states(psi, &opts, s, p->ranks);
    const th_states padded = th_model_states(psi + pad, &opts, s, p->ranks);
    const th_states buffers = th_zero_buffers((double)p->largest_unit_elems, &opts, s);
    const th_states per = th_model_states(1, &opts, 0, 1);
    by_category(formula, f->mem_formula);
    by_category(buffers, f->mem_buffers);
    by_category(padded, f->mem_padding);
    for (int k = 0; k < ZERO_NCAT; k++) f->mem_padding[k] -= f->mem_formula[k];
    snprintf(f->mem_formula_text[ZERO_PARAMS], sizeof f->mem_formula_text[0], s < 3 ? "%g Psi" : "%g Psi/N", per.params);
    snprintf(f->mem_formula_text[ZERO_GRADS], sizeof f->mem_formula_text[0], s < 2 ? "%g Psi" : "%g Psi/N", per.grads);
    snprintf(f->mem_formula_text[ZERO_OPTIM], sizeof f->mem_formula_text[0], "%g Psi/N", per.optim);
    if (s == 1) snprintf(f->total_text, sizeof f->total_text, "%g Psi + %g Psi/N", per.params + per.grads, per.optim);
    else if (s == 2) snprintf(f->total_text, sizeof f->total_text, "%g Psi + %g Psi/N + bucket", per.params,
                              per.grads + per.optim);
    else snprintf(f->total_text, sizeof f->total_text, "%g Psi/N + buffers", per.params + per.grads + per.optim);

    /* one reduce-scatter and one all-gather of every unit; stage 3 gathers
     * each unit for the forward and again for the backward (th_zero_traffic) */
    const double vb = (double)value_bytes();
    f->comm_formula = th_zero_traffic(vb * psi, p->ranks, s).ring;
    snprintf(f->comm_formula_text, sizeof f->comm_formula_text,
             s < 3 ? "reduce-scatter + all-gather 2(N-1)/N x %g Psi (= DP's all-reduce)"
                   : "reduce-scatter + 2 all-gathers 3(N-1)/N x %g Psi (1.5x DP)", vb);
    f->comm_padding = th_zero_traffic(vb * (psi + pad), p->ranks, s).ring - f->comm_formula;
    if (s == 3) {
        const shard_unit *embedding = shard_unit_of_block(p, -1);
        f->comm_skipped = -comm_ring_factor(COLL_ALLGATHER, p->ranks) * vb * (double)(embedding->chunk * p->ranks);
    }
}

/* The ZeRO paper's Table 1 row (Rajbhandari et al. 2020, section 3.1: Psi = 7.5B
 * parameters, N = 64 ranks, mixed precision, K = 12) by th_model_states, the
 * formula this lab's allocator matches: 120 GB, then 31.4, 16.6 and 1.9 GB. */
static void print_paper_row(void) {
    const th_opts bf16 = th_opts_precision(1, 1);
    const double psi = 7.5e9;
    printf("  ZeRO paper's table (Psi = 7.5B, N = 64, 2 + 2 + K with K = 12), by the same formula:");
    for (int st = 0; st <= 3; st++) {
        th_states x = th_model_states(psi, &bf16, st, 64);
        printf("%s %.1f GB", st ? (st == 1 ? " -> stage 1" : st == 2 ? ", stage 2" : ", stage 3") : " DP",
               (x.params + x.grads + x.optim) / 1e9);
    }
    printf("\n");
}

void zero_record_members(const zero_state *z, const zero_figures *f, double bucket_mb, json_t *record) {
    const shard_plan *p = &z->plan;
    const char *names[ZERO_NCAT] = {"params", "grads", "optim"};
    const double *parts[3] = {f->mem_formula, f->mem_buffers, f->mem_padding};
    const char *keys[3] = {"mem_formula_bytes", "mem_buffer_bytes", "mem_padding_bytes"};
    jsonval_set(record, "zero_stage", json_integer(z->stage));
    jsonval_set(record, "bucket_mb", jsonval_figure(bucket_mb));
    jsonval_set(record, "shard_units", json_integer(p->n_units));
    jsonval_set(record, "padding_elems", json_integer(p->padding_elems));
    jsonval_set(record, "shard_elems", json_integer(p->shard_elems));
    jsonval_set(record, "largest_unit_elems", json_integer(p->largest_unit_elems));
    jsonval_set(record, "comm_padding_ring_bytes", jsonval_figure(f->comm_padding));
    jsonval_set(record, "comm_skipped_ring_bytes", jsonval_figure(f->comm_skipped));
    for (int k = 0; k < 3; k++) {
        json_t *by_category = json_object();
        if (!by_category) die("out of host memory");
        for (int c = 0; c < ZERO_NCAT; c++) jsonval_set(by_category, names[c], jsonval_figure(parts[k][c]));
        jsonval_set(record, keys[k], by_category);
    }
}

/* Integral bytes as integers; a formula like 4 Psi / 3 with its fraction. */
static const char *bytes(double x, char out[32]) {
    snprintf(out, 32, x == floor(x) ? "%.0f" : "%.2f", x);
    return out;
}

void zero_print_summary(const zero_state *z, const zero_figures *f, int steps) {
    double mine[ZERO_NCAT], measured[ZERO_NCAT];
    for (int c = 0; c < ZERO_NCAT; c++) mine[c] = (double)mem_peak(zero_category[c]);
    MPI_Reduce(mine, measured, ZERO_NCAT, MPI_DOUBLE, MPI_MAX, 0, z->dp->mpi);
    if (z->dp->rank != 0) return;

    const shard_plan *p = &z->plan;
    const char *names[ZERO_NCAT] = {"params", "grads", "optim"};
    const char *buffer_names[ZERO_NCAT] = {"gathered unit", "bucket", ""};
    double N = p->ranks, psi = f->psi, total = 0;
    char a[32], b[32], c[32], d[32];
    printf("\nZeRO stage %d on %d rank%s: Psi = %.0f parameters in %d unit%s, padded by %ld element%s; "
           "a shard is %ld elements\n", z->stage, p->ranks, p->ranks == 1 ? "" : "s", psi, p->n_units,
           p->n_units == 1 ? "" : "s", p->padding_elems, p->padding_elems == 1 ? "" : "s", p->shard_elems);
    printf("  bytes per rank  %12s = %-22s + %-26s + %s\n", "measured", "formula", "named buffer", "padding");
    for (int k = 0; k < ZERO_NCAT; k++) {
        char formula[48], buffer[48] = "0";
        snprintf(formula, sizeof formula, "%s (%s)", bytes(f->mem_formula[k], b), f->mem_formula_text[k]);
        if (f->mem_buffers[k] > 0)
            snprintf(buffer, sizeof buffer, "%s (%s)", bytes(f->mem_buffers[k], d), buffer_names[k]);
        printf("  %-15s %12s = %-22s + %-26s + %s\n", names[k], bytes(measured[k], a), formula, buffer,
               bytes(f->mem_padding[k], c));
        total += measured[k];
    }
    printf("  %-15s %12s   (%s): %.2f of lab01's 16 Psi = %s\n", "total", bytes(total, a), f->total_text,
           total / (16 * psi), bytes(16 * psi, b));
    if (g_precision == PREC_BF16) {
        printf("  per parameter   %.4f bytes = %.4f + %.4f + %.4f (params + grads + optim, measured / Psi)\n",
               total / psi, measured[ZERO_PARAMS] / psi, measured[ZERO_GRADS] / psi, measured[ZERO_OPTIM] / psi);
        print_paper_row();
    }

    double payload = 0;
    for (int k = COLL_REDUCE_SCATTER; k <= COLL_ALLGATHER; k++) payload += z->dp->stats[k].bytes;
    double ring = steps > 0 ? (N - 1) / N * payload / steps : 0;
    double dp_ring = th_dp_traffic((double)value_bytes() * psi, p->ranks, 1).ring;
    printf("  ring bytes/step %12s = %s (%s)\n", bytes(ring, a), bytes(f->comm_formula, b),
           f->comm_formula_text);
    printf("  %-15s %12s   + %s (padding)", "", "", bytes(f->comm_padding, a));
    if (f->comm_skipped < 0)
        printf(" - %s (the embedding's backward needs no gather)", bytes(-f->comm_skipped, b));
    printf("; %.3fx DP's all-reduce\n", dp_ring > 0 ? ring / dp_ring : 1.0);
}
