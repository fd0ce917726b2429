#include "zero_report.h"
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
    const th_opts fp32 = th_opts_course(1);
    const th_states formula = th_model_states(psi, &fp32, s, p->ranks);
    const th_states padded = th_model_states(psi + pad, &fp32, s, p->ranks);
    const th_states buffers = th_zero_buffers((double)p->largest_unit_elems, &fp32, s);
    by_category(formula, f->mem_formula);
    by_category(buffers, f->mem_buffers);
    by_category(padded, f->mem_padding);
    for (int k = 0; k < ZERO_NCAT; k++) f->mem_padding[k] -= f->mem_formula[k];
    f->mem_formula_text[ZERO_PARAMS] = s < 3 ? "4 Psi" : "4 Psi/N";
    f->mem_formula_text[ZERO_GRADS] = s < 2 ? "4 Psi" : "4 Psi/N";
    f->mem_formula_text[ZERO_OPTIM] = "8 Psi/N";

    /* one reduce-scatter and one all-gather of every unit; stage 3 gathers
     * each unit for the forward and again for the backward (th_zero_traffic) */
    f->comm_formula = th_zero_traffic(4 * psi, p->ranks, s).ring;
    f->comm_formula_text = s < 3 ? "reduce-scatter + all-gather 2(N-1)/N x 4 Psi (= DP's all-reduce)"
                                 : "reduce-scatter + 2 all-gathers 3(N-1)/N x 4 Psi (1.5x DP)";
    f->comm_padding = th_zero_traffic(4 * (psi + pad), p->ranks, s).ring - f->comm_formula;
    if (s == 3) {
        const shard_unit *embedding = shard_unit_of_block(p, -1);
        f->comm_skipped = -th_ring_factor(TH_ALLGATHER, p->ranks) * 4.0 * (double)(embedding->chunk * p->ranks);
    }
}

void zero_extra_json(const zero_state *z, const zero_figures *f, double bucket_mb, char *buf, size_t len) {
    const shard_plan *p = &z->plan;
    const char *names[ZERO_NCAT] = {"params", "grads", "optim"};
    const double *parts[3] = {f->mem_formula, f->mem_buffers, f->mem_padding};
    const char *keys[3] = {"mem_formula_bytes", "mem_buffer_bytes", "mem_padding_bytes"};
    size_t at = (size_t)snprintf(buf, len,
        "\"zero_stage\":%d,\"bucket_mb\":%g,\"shard_units\":%d,\"padding_elems\":%ld,\"shard_elems\":%ld,"
        "\"largest_unit_elems\":%ld,\"comm_padding_ring_bytes\":%.17g,\"comm_skipped_ring_bytes\":%.17g",
        z->stage, bucket_mb, p->n_units, p->padding_elems, p->shard_elems, p->largest_unit_elems,
        f->comm_padding, f->comm_skipped);
    for (int k = 0; k < 3 && at < len; k++) {
        at += (size_t)snprintf(buf + at, len - at, ",\"%s\":{", keys[k]);
        for (int c = 0; c < ZERO_NCAT && at < len; c++)
            at += (size_t)snprintf(buf + at, len - at, "%s\"%s\":%.17g", c ? "," : "", names[c], parts[k][c]);
        if (at < len) at += (size_t)snprintf(buf + at, len - at, "}");
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
    const char *total_text = z->stage == 1 ? "8 Psi + 8 Psi/N" : z->stage == 2 ? "4 Psi + 12 Psi/N + bucket"
                                                                               : "16 Psi/N + buffers";
    printf("  %-15s %12s   (%s): %.2f of lab01's 16 Psi = %s\n", "total", bytes(total, a), total_text,
           total / (16 * psi), bytes(16 * psi, b));

    double payload = 0;
    for (int k = COLL_REDUCE_SCATTER; k <= COLL_ALLGATHER; k++) payload += z->dp->stats[k].bytes;
    double ring = steps > 0 ? (N - 1) / N * payload / steps : 0;
    double dp_ring = th_dp_traffic(4 * psi, p->ranks, 1).ring;
    printf("  ring bytes/step %12s = %s (%s)\n", bytes(ring, a), bytes(f->comm_formula, b),
           f->comm_formula_text);
    printf("  %-15s %12s   + %s (padding)", "", "", bytes(f->comm_padding, a));
    if (f->comm_skipped < 0)
        printf(" - %s (the embedding's backward needs no gather)", bytes(-f->comm_skipped, b));
    printf("; %.3fx DP's all-reduce\n", dp_ring > 0 ? ring / dp_ring : 1.0);
}
