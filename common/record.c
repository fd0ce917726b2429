/* The end of a run: gather what every rank measured, print the summary, and
 * append the run record (one JSON line, one CSV row) that tests and plots read. */
#define _POSIX_C_SOURCE 200809L
#include "run.h"
#include "mem.h"
#include "trace.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes one rank moves for a call with this payload under the ring algorithm
 * (what NCCL and MPICH use for large messages): an all-reduce is a
 * reduce-scatter plus an all-gather, each moving (N-1)/N of the buffer. */
static double ring_bytes(comm_kind k, double payload, int n) {
    if (n <= 1) return 0;
    switch (k) {
    case COLL_ALLREDUCE: return 2.0 * (n - 1) / n * payload;
    case COLL_REDUCE_SCATTER:
    case COLL_ALLGATHER: return (double)(n - 1) / n * payload;
    case COLL_BROADCAST:
    case COLL_SEND:
    case COLL_RECV: return payload;
    default: return 0;
    }
}

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
            t.wire[k] += ring_bytes((comm_kind)k, s->bytes, r->comms[c]->size);
            t.seconds[k] += s->seconds;
        }
    }
    return t;
}

static void json_numbers(FILE *f, const char *key, const double *x, int n, const char *fmt) {
    fprintf(f, "\"%s\":[", key);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        fprintf(f, fmt, x[i]);
    }
    fputc(']', f);
}

static void sanitize(char *dst, size_t len, const char *src) {
    size_t i = 0;
    for (; src[i] && i + 1 < len; i++) {
        char c = src[i];
        dst[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ? c : '_';
    }
    dst[i] = 0;
}

/* What run_setup allocated for the run. */
static void run_release(run_ctx *ctx) {
    free(ctx->step_seconds);
    free(ctx->losses);
    ctx->step_seconds = ctx->losses = NULL;
    data_free(&ctx->data);
}

void run_finish(run_ctx *ctx, const run_report *r) {
    const run_options *o = &ctx->opt;
    int R = ctx->size, rank = ctx->rank;

    /* memory: every category's peak on every rank */
    enum { NM = MEM_NCAT + 1 };
    double mine[NM], *all = rank == 0 ? malloc(sizeof(double) * NM * (size_t)R) : NULL;
    for (int c = 0; c < MEM_NCAT; c++) mine[c] = (double)mem_peak((mem_category)c);
    mine[MEM_NCAT] = (double)mem_peak_total();
    MPI_Gather(mine, NM, MPI_DOUBLE, all, NM, MPI_DOUBLE, 0, MPI_COMM_WORLD);

    /* timeline: busy fractions over the measured steps, then the files */
    trace_summary ts = trace_summarize(ctx->steps_done > 1 ? 1 : 0);
    double fr[2] = {ts.wall > 0 ? ts.compute / ts.wall : 0, ts.wall > 0 ? ts.comm / ts.wall : 0};
    double *fracs = rank == 0 ? malloc(sizeof(double) * 2 * (size_t)R) : NULL;
    MPI_Gather(fr, 2, MPI_DOUBLE, fracs, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);

    /* traffic: the maximum over ranks of each figure (ranks differ in pipelines) */
    traffic t = count_traffic(r), tmax;
    MPI_Reduce(&t, &tmax, sizeof t / sizeof(double), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    char layout[64], json_path[700], csv_path[700];
    sanitize(layout, sizeof layout, r->layout);
    snprintf(json_path, sizeof json_path, "%s/%s_%s_trace.json", o->out, ctx->lab.name, layout);
    snprintf(csv_path, sizeof csv_path, "%s/%s_%s_timeline.csv", o->out, ctx->lab.name, layout);
    trace_write(MPI_COMM_WORLD, json_path, csv_path);
    if (rank != 0) {
        run_release(ctx);
        return;
    }

    int steps = ctx->steps_done;
    double med = run_median_step_seconds(ctx), tok_s = med > 0 ? (double)ctx->tokens_per_step / med : 0;
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    double gflops = tok_s * gpt_flops_per_token(&g) / 1e9;
    double peak_max[NM] = {0};
    for (int q = 0; q < R; q++)
        for (int c = 0; c < NM; c++)
            if (all[q * NM + c] > peak_max[c]) peak_max[c] = all[q * NM + c];
    double per_step = steps > 0 ? 1.0 / steps : 0, wire_total = 0, payload_total = 0;
    for (int k = 0; k < COLL_NKINDS; k++) {
        wire_total += tmax.wire[k] * per_step;
        payload_total += tmax.payload[k] * per_step;
    }

    /* ---- the summary ---- */
    char a[16], b[16];
    printf("\nsummary of %s (%s, %d rank%s, %s/%s)\n", ctx->lab.name, r->layout, R, R == 1 ? "" : "s",
           ctx->device == DEVICE_CUDA ? "cuda" : "cpu", ctx->backend == COMM_NCCL ? "nccl" : "mpi");
    printf("  loss            %.4f -> %.4f over %d steps\n", ctx->losses[0], ctx->losses[steps - 1], steps);
    printf("  throughput      %s tok/s, median step %.1f ms (steps 2-%d), %s FLOP/s model compute\n",
           human(tok_s, a), med * 1e3, steps, human(gflops * 1e9, b));
    printf("  peak memory     (bytes per rank, max over ranks)\n                 ");
    for (int m = 0; m < MEM_NCAT; m++) printf(" %s %sB |", mem_category_names[m], human(peak_max[m], a));
    printf(" total %sB\n", human(peak_max[MEM_NCAT], a));
    size_t drv_free, drv_total;
    if (mem_driver_info(&drv_free, &drv_total))
        printf("                  driver (rank 0): %sB used of %sB\n", human((double)(drv_total - drv_free), a),
               human((double)drv_total, b));
    printf("  communication   per rank per step (max over ranks):\n");
    int any = 0;
    for (int k = 0; k < COLL_NKINDS; k++) {
        if (tmax.calls[k] == 0) continue;
        any = 1;
        /* point to point moves its payload once: no ring factor, and the line says so */
        int p2p = k == COLL_SEND || k == COLL_RECV;
        printf("                  %-14s %5.1f calls | payload %sB | %s %sB | %.2f ms\n",
               comm_kind_names[k], tmax.calls[k] * per_step, human(tmax.payload[k] * per_step, a),
               p2p ? "point to point" : "ring traffic",
               human(tmax.wire[k] * per_step, b), tmax.seconds[k] * per_step * 1e3);
    }
    if (!any) printf("                  none\n");
    if (r->comm_formula_bytes >= 0)
        printf("                  formula %s = %sB; measured ring traffic %sB (ratio %.3f)\n",
               r->comm_formula, human(r->comm_formula_bytes, a), human(wire_total, b),
               r->comm_formula_bytes > 0 ? wire_total / r->comm_formula_bytes : (wire_total == 0 ? 1.0 : 0.0));
    printf("  time split      (fraction of step time, measured steps)\n");
    for (int q = 0; q < R; q++) {
        printf("                  rank %d: compute %.2f | comm %.2f", q, fracs[2 * q], fracs[2 * q + 1]);
        if (r->bubble_theory >= 0) printf(" | bubble %.3f (theory %.3f)", 1 - fracs[2 * q], r->bubble_theory);
        printf("\n");
        if (q == 7 && R > 9) { printf("                  ... (%d more ranks in the record)\n", R - 8); break; }
    }
    printf("  record          %s (and records.csv)\n", ctx->records_jsonl);
    printf("  trace           %s (open in https://ui.perfetto.dev)\n", json_path);
    printf("  timeline        %s\n", csv_path);

    /* ---- the record: one JSON line ---- */
    FILE *f = fopen(ctx->records_jsonl, "a");
    if (!f) die("cannot append to %s", ctx->records_jsonl);
    fprintf(f, "{\"lab\":\"%s\",\"ranks\":%d,\"layout\":\"%s\",\"device\":\"%s\",\"comm\":\"%s\",",
            ctx->lab.name, R, r->layout, ctx->device == DEVICE_CUDA ? "cuda" : "cpu",
            ctx->backend == COMM_NCCL ? "nccl" : "mpi");
    fprintf(f, "\"config\":{\"steps\":%d,\"batch\":%d,\"seq\":%d,\"layers\":%d,\"d_model\":%d,\"heads\":%d,"
               "\"lr\":%g,\"weight_decay\":%g,\"clip\":%g,\"seed\":%d,\"data\":\"%s\"},",
            o->steps, o->batch, o->seq, o->layers, o->d_model, o->heads, o->lr, o->weight_decay, o->clip,
            o->seed, o->data ? o->data : "built-in");
    fprintf(f, "\"params\":%ld,", r->params);
    json_numbers(f, "losses", ctx->losses, steps, "%.17g"); /* exact: tests compare bits */
    fputc(',', f);
    json_numbers(f, "step_ms", ctx->step_seconds, steps, "%.6g");
    fprintf(f, ",\"tokens_per_s\":%.6g,\"step_ms_median\":%.6g,\"model_flops_per_s\":%.6g,",
            tok_s, med * 1e3, gflops * 1e9);
    fprintf(f, "\"mem_peak_bytes\":{");
    for (int m = 0; m <= MEM_NCAT; m++)
        fprintf(f, "%s\"%s\":%.0f", m ? "," : "", m < MEM_NCAT ? mem_category_names[m] : "total", peak_max[m]);
    fprintf(f, "},\"mem_peak_bytes_per_rank\":{");
    double *col = malloc(sizeof(double) * (size_t)R);
    for (int m = 0; m <= MEM_NCAT; m++) {
        for (int q = 0; q < R; q++) col[q] = all[q * NM + m];
        if (m) fputc(',', f);
        json_numbers(f, m < MEM_NCAT ? mem_category_names[m] : "total", col, R, "%.0f");
    }
    fprintf(f, "},\"comm_bytes_per_step\":{");
    for (int k = 0, first = 1; k < COLL_NKINDS; k++) {
        if (tmax.calls[k] == 0) continue;
        fprintf(f, "%s\"%s\":%.0f", first ? "" : ",", comm_kind_names[k], tmax.payload[k] * per_step);
        first = 0;
    }
    fprintf(f, "},\"comm_calls_per_step\":{");
    for (int k = 0, first = 1; k < COLL_NKINDS; k++) {
        if (tmax.calls[k] == 0) continue;
        fprintf(f, "%s\"%s\":%.6g", first ? "" : ",", comm_kind_names[k], tmax.calls[k] * per_step);
        first = 0;
    }
    fprintf(f, "},\"comm_ring_bytes_per_step\":%.0f,\"comm_formula_bytes_per_step\":%.0f,",
            wire_total, r->comm_formula_bytes);
    for (int q = 0; q < R; q++) col[q] = fracs[2 * q];
    json_numbers(f, "compute_fraction", col, R, "%.4f");
    fputc(',', f);
    for (int q = 0; q < R; q++) col[q] = fracs[2 * q + 1];
    json_numbers(f, "comm_fraction", col, R, "%.4f");
    if (r->bubble_theory >= 0) {
        for (int q = 0; q < R; q++) col[q] = 1 - fracs[2 * q];
        fprintf(f, ",\"bubble\":{");
        json_numbers(f, "measured", col, R, "%.4f");
        fprintf(f, ",\"theory\":%.6g}", r->bubble_theory);
    }
    fprintf(f, ",\"trace\":\"%s\",\"timeline\":\"%s\"", json_path, csv_path);
    if (r->extra_json && r->extra_json[0]) fprintf(f, ",%s", r->extra_json);
    fprintf(f, "}\n");
    fclose(f);

    /* ---- and one CSV row, the same columns for every lab ---- */
    FILE *probe = fopen(ctx->records_csv, "r");
    int fresh = probe == NULL;
    if (probe) fclose(probe);
    f = fopen(ctx->records_csv, "a");
    if (!f) die("cannot append to %s", ctx->records_csv);
    if (fresh)
        fprintf(f, "lab,ranks,layout,device,comm,steps,batch,seq,layers,d_model,heads,first_loss,final_loss,"
                   "tokens_per_s,step_ms_median,mem_peak_total,comm_payload_bytes_per_step,"
                   "comm_ring_bytes_per_step,comm_formula_bytes_per_step,bubble_measured_max,bubble_theory\n");
    double bubble_max = -1;
    if (r->bubble_theory >= 0)
        for (int q = 0; q < R; q++)
            if (1 - fracs[2 * q] > bubble_max) bubble_max = 1 - fracs[2 * q];
    fprintf(f, "%s,%d,%s,%s,%s,%d,%d,%d,%d,%d,%d,%.9g,%.9g,%.6g,%.6g,%.0f,%.0f,%.0f,%.0f,%.4f,%.4f\n",
            ctx->lab.name, R, layout, ctx->device == DEVICE_CUDA ? "cuda" : "cpu",
            ctx->backend == COMM_NCCL ? "nccl" : "mpi", o->steps, o->batch, o->seq, o->layers, o->d_model,
            o->heads, ctx->losses[0], ctx->losses[steps - 1], tok_s, med * 1e3, peak_max[MEM_NCAT],
            payload_total, wire_total, r->comm_formula_bytes, bubble_max, r->bubble_theory);
    fclose(f);
    free(col);
    free(all);
    free(fracs);
    run_release(ctx);
}
