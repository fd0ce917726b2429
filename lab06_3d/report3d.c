#include "report3d.h"
#include "device.h"
#include "jsonval.h"
#include "mem.h"
#include "theory.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const group_names[GROUP_KINDS] = {"tp", "pp", "dp", "cp"};

/* Every rank's figures, one row of doubles each. */
enum {
    F_GROUPS = 0,                       /* GROUP_KINDS x G_FIELDS */
    G_CALLS = 0, G_PAYLOAD, G_RING, G_SECONDS, G_CALLS_F, G_PAYLOAD_F, G_RING_F, G_FIELDS,
    F_LO = GROUP_KINDS * G_FIELDS, F_HI, F_TP, F_PP, F_DP,
    F_PARAMS, F_GRADS, F_OPTIM, F_ACTS, F_TOTAL, F_PARAMS_F, F_ACTS_PER_MB, F_ACTS_PER_MB_F, F_IN_FLIGHT, F_ACTS_F,
    F_ALLREDUCE_RING_F, F_GATHER_RING_F, /* the formulas' ring bytes by kind: all-reduces, all-gathers + reduce-scatters */
    F_P2P_RING_F, F_ALLTOALL_RING_F,     /* sends + receives, all-to-alls */
    F_ELEMS, F_OPTIM_F, F_OPTIM_PAD, /* ZeRO-1: the rank's elements, K x elements / d, the last slice's padding */
    F_FIELDS
};

void group_traffic_measure(const comm *c, int steps, group_traffic *t) {
    for (int k = 0; k < COLL_NKINDS; k++) {
        const comm_stat *s = &c->stats[k];
        t->calls += (double)s->calls / steps;
        t->payload += s->bytes / steps;
        t->ring += comm_ring_factor(k, c->size) * s->bytes / steps; /* as run_finish counts */
        t->seconds += s->seconds / steps;
    }
}

/* Everything a group's communicator counted, per step. */
static void measured(const comm *c, int steps, double *row) {
    group_traffic t = {0};
    group_traffic_measure(c, steps, &t);
    row[G_CALLS] += t.calls;
    row[G_PAYLOAD] += t.payload;
    row[G_RING] += t.ring;
    row[G_SECONDS] += t.seconds;
}

void report3d_cp_traffic(const pipeline_stage *st, const gpt_config *model, int N, int layers, int m,
                         th_traffic per_kind[COLL_NKINDS]) {
    const double width = (double)st->model.part.heads * (model->d_model / model->heads);
    const double block = (double)value_bytes() * st->rows * st->g->cfg.seq * 2 * width; /* one K|V block of the rank's heads */
    double calls[COLL_NKINDS], payload[COLL_NKINDS];
    th_cp_layer_calls((th_cp_algo)st->model.cp_algo, N, block, stage_opts(st).recompute == RECOMPUTE_NONE ? 1 : 2, calls,
                      payload);
    const double n = (double)layers * m;
    for (int k = 0; k < COLL_NKINDS; k++)
        per_kind[k] = (th_traffic){n * calls[k], n * payload[k], n * payload[k] * comm_ring_factor((comm_kind)k, N)};
}

static void formula(double *row, th_traffic t) {
    row[G_CALLS_F] = t.calls;
    row[G_PAYLOAD_F] = t.payload;
    row[G_RING_F] = t.ring;
}

/* One field over the ranks: [rank 0's, rank 1's, ...]. */
static json_t *json_column(const double *rows, int ranks, int field) {
    json_t *column = json_array();
    if (!column) die("out of host memory");
    for (int r = 0; r < ranks; r++)
        jsonval_append(column, jsonval_figure(rows[(size_t)r * F_FIELDS + field])); /* whole calls and bytes stay integers */
    return column;
}

static double column_max(const double *rows, int ranks, int field) {
    double m = 0;
    for (int r = 0; r < ranks; r++) m = fmax(m, rows[(size_t)r * F_FIELDS + field]);
    return m;
}

void report3d_gather(report3d *r, process_grid *g, const pipeline_rank *pr, const run_ctx *ctx) {
    memset(r, 0, sizeof *r);
    r->ranks = g->world->size;
    const pipeline_stage *st = &pr->chunk[0]; /* the one chunk, except under interleaved and zb-v */
    const int steps = ctx->steps_done > 0 ? ctx->steps_done : 1, m = pr->m;
    int layers = 0, in_flight, wgrads;
    for (int c = 0; c < pr->v; c++) layers += pr->chunk[c].hi - pr->chunk[c].lo;
    schedule_in_flight(&pr->sched, pr->rank, 0, &in_flight, &wgrads);
    const grid_dims d = g->dims;
    double row[F_FIELDS] = {0};
    /* one activation (or its gradient), of value_bytes() per value: what one TP
     * collective carries, whole, and what one pipeline message carries (under SP
     * a TP rank's T/t positions) */
    const double vb = (double)value_bytes();
    const double act_bytes = vb * st->rows * st->g->cfg.seq * ctx->model.d_model; /* lab09: a CP rank's positions */
    const double msg_bytes = vb * st->boundary_values;
    const gpt_config *cfg = &ctx->model;
    const th_model tm = th_course_model(cfg->vocab, cfg->seq, cfg->layers, cfg->d_model, cfg->heads);
    const th_opts opts = stage_opts(st); /* precision, t, SP, --recompute as the stages run */
    const int sp = opts.sequence_parallel && d.tp > 1;
    comm *groups[GROUP_KINDS] = {g->tp, g->pipe, g->dp, g->cp};
    r->kinds = g->cp ? GROUP_CP + 1 : GROUP_CP;
    for (int k = 0; k < r->kinds; k++) measured(groups[k], steps, row + k * G_FIELDS);
    /* theory/'s formulas (theory.h), the ones plan3d predicts with.
     * TP: two g's forward, two f's backward per layer and micro-batch (none for
     * t = 1; --recompute full: the g's again); SP: each an all-gather and a
     * reduce-scatter, and one all-reduce of each chunk's partial gradients */
    th_traffic tp_f = th_tp_traffic_run(layers, m, act_bytes, &opts), partial_f = {0, 0, 0};
    for (int c = 0; sp && c < pr->v; c++) {
        th_traffic one = th_dp_traffic(vb * th_sp_partial_params(&tm, pr->chunk[c].lo, pr->chunk[c].hi), d.tp, 1);
        partial_f.calls += one.calls;
        partial_f.payload += one.payload;
        partial_f.ring += one.ring;
    }
    formula(row + GROUP_TP * G_FIELDS,
            (th_traffic){tp_f.calls + partial_f.calls, tp_f.payload + partial_f.payload, tp_f.ring + partial_f.ring});
    /* PP: per boundary to another rank and micro-batch, one activation out and
     * one gradient back, each counted once as a send and once as a receive
     * (schedule_remote_links counts the links of every chunk of this rank) */
    formula(row + GROUP_PP * G_FIELDS, th_pp_traffic(schedule_remote_links(&pr->sched, pr->rank), m, 1, msg_bytes));
    /* DP: one all-reduce of the rank's whole gradient after the flush (none for
     * d = 1); ZeRO-1: a reduce-scatter and an all-gather of the buffer padded to
     * d equal slices, the same ring bytes as the all-reduce but for the padding */
    const int zero = pr->opt_shards > 1;
    if (zero) {
        th_traffic z = th_zero_traffic(vb * pr->padded, d.dp, 1);
        z.calls = 2;
        formula(row + GROUP_DP * G_FIELDS, z);
    } else formula(row + GROUP_DP * G_FIELDS, th_dp_traffic(vb * pr->n, d.dp, 1));
    row[F_ALLREDUCE_RING_F] = (sp ? partial_f.ring : tp_f.ring) + (zero ? 0 : row[GROUP_DP * G_FIELDS + G_RING_F]);
    row[F_GATHER_RING_F] = (sp ? tp_f.ring : 0) + (zero ? row[GROUP_DP * G_FIELDS + G_RING_F] : 0);
    row[F_P2P_RING_F] = row[GROUP_PP * G_FIELDS + G_RING_F];
    if (g->cp) { /* lab09: CP's exchanges, per layer and micro-batch (theory/context.c), by kind */
        r->cp_algo = st->model.cp_algo;
        th_traffic per_kind[COLL_NKINDS];
        double *x = row + GROUP_CP * G_FIELDS;
        report3d_cp_traffic(st, cfg, g->cp->size, layers, m, per_kind);
        for (int k = 0; k < COLL_NKINDS; k++) {
            const double ring = per_kind[k].ring;
            x[G_CALLS_F] += per_kind[k].calls;
            x[G_PAYLOAD_F] += per_kind[k].payload;
            x[G_RING_F] += ring;
            if (k == COLL_ALLGATHER || k == COLL_REDUCE_SCATTER) row[F_GATHER_RING_F] += ring;
            else if (k == COLL_SEND || k == COLL_RECV) row[F_P2P_RING_F] += ring;
            else if (k == COLL_ALLTOALL) row[F_ALLTOALL_RING_F] += ring;
        }
    }
    row[F_LO] = st->lo;
    row[F_HI] = st->hi;
    row[F_TP] = g->me.tp;
    row[F_PP] = g->me.pp;
    row[F_DP] = g->me.dp;
    row[F_PARAMS] = (double)mem_peak(MEM_PARAMS);
    row[F_GRADS] = (double)mem_peak(MEM_GRADS);
    row[F_OPTIM] = (double)mem_peak(MEM_OPTIM);
    row[F_ACTS] = (double)mem_peak(MEM_ACTS);
    row[F_TOTAL] = (double)mem_peak_total();
    row[F_PARAMS_F] = 0;
    for (int c = 0; c < pr->v; c++)
        row[F_PARAMS_F] += th_param_bytes(opts.precision) * th_stage_params(&tm, &opts, pr->chunk[c].lo, pr->chunk[c].hi);
    row[F_ACTS_PER_MB] = (double)st->acts_bytes; /* chunk 0's: the whole formula is F_ACTS_F */
    row[F_ACTS_PER_MB_F] = stage_acts_formula_bytes(st);
    row[F_IN_FLIGHT] = in_flight;
    row[F_ACTS_F] = pipeline_acts_formula_bytes(pr);
    /* the optimizer state by theory/'s model states (th_model_states: K bytes
     * per element, / d under ZeRO-1), and what padding the slices adds */
    const th_states states = th_model_states((double)pr->n, &opts, zero, d.dp),
                    padded = th_model_states((double)pr->padded, &opts, zero, d.dp);
    row[F_PARAMS_F] += padded.params - states.params; /* ZeRO-1: the buffer padded to d slices */
    row[F_ELEMS] = (double)pr->n;
    row[F_OPTIM_F] = states.optim;
    row[F_OPTIM_PAD] = padded.optim - states.optim;

    if (g->world->rank == 0) {
        r->rows = malloc(sizeof(double) * F_FIELDS * (size_t)r->ranks);
        if (!r->rows) die("out of host memory");
    }
    MPI_Gather(row, F_FIELDS, MPI_DOUBLE, r->rows, F_FIELDS, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (g->world->rank != 0) return;

    /* run_finish adds, per kind, the busiest rank's ring bytes: all-reduces (TP
     * and DP on one rank together), all-gathers and reduce-scatters (SP),
     * sends, receives. The formula, the same way. */
    double allreduce_f = 0, gather_f = 0, p2p_f = 0, alltoall_f = 0;
    for (int q = 0; q < r->ranks; q++) {
        const double *x = r->rows + (size_t)q * F_FIELDS;
        allreduce_f = fmax(allreduce_f, x[F_ALLREDUCE_RING_F]);
        gather_f = fmax(gather_f, x[F_GATHER_RING_F]); /* as many all-gathers as reduce-scatters, alike */
        p2p_f = fmax(p2p_f, x[F_P2P_RING_F]);
        alltoall_f = fmax(alltoall_f, x[F_ALLTOALL_RING_F]);
    }
    r->formula_ring_bytes = allreduce_f + gather_f + p2p_f + alltoall_f; /* a rank sends as much as it receives */
    r->sequence_parallel = sp;
    r->zero_stage = zero;
    r->optim_bytes_per_elem = th_optim_bytes(opts.precision);
    r->recompute_full = opts.recompute == RECOMPUTE_FULL;

    r->acts_formula = pr->v == 1 && !pr->sched.split
                          ? "the schedule's micro-batches in flight x one micro-batch's activations"
                          : "per chunk: blocks in flight x their bytes (activations, and the weight-gradient inputs "
                            "where the backward is split)";
}

void report3d_record(const report3d *r, const process_grid *g, json_t *record) {
    if (!r->rows) return; /* not rank 0, or nothing gathered (lab09's experts) */
    const grid_dims d = g->dims;
    json_t *traffic = json_object(), *layers = json_array();
    if (!traffic || !layers) die("out of host memory");
    /* per group kind, one array over the ranks for each of these */
    static const struct { const char *key; int field; } columns[] = {
        {"calls", G_CALLS}, {"payload_bytes", G_PAYLOAD}, {"ring_bytes", G_RING}, {"seconds", G_SECONDS},
        {"calls_formula", G_CALLS_F}, {"payload_bytes_formula", G_PAYLOAD_F},
        {"ring_bytes_formula", G_RING_F}};
    for (int k = 0; k < r->kinds; k++) {
        json_t *group = json_object();
        if (!group) die("out of host memory");
        jsonval_set(group, "group_size",
                    json_integer(k == GROUP_TP ? d.tp : k == GROUP_PP ? d.pp : k == GROUP_DP ? d.dp : g->cp->size));
        for (int c = 0; c < (int)(sizeof columns / sizeof columns[0]); c++)
            jsonval_set(group, columns[c].key, json_column(r->rows, r->ranks, k * G_FIELDS + columns[c].field));
        jsonval_set(traffic, group_names[k], group);
    }
    jsonval_set(record, "traffic_per_group", traffic);
    for (int q = 0; q < r->ranks; q++) {
        const double *x = r->rows + (size_t)q * F_FIELDS;
        jsonval_append(layers, jsonval_integers((const double[]){x[F_LO], x[F_HI]}, 2));
    }
    jsonval_set(record, "stage_layers_per_rank", layers);
    jsonval_set(record, "param_bytes_per_rank_formula", json_column(r->rows, r->ranks, F_PARAMS_F));
    if (r->zero_stage) { /* (absent otherwise: a zero-stage 0 record is the one lab06 always wrote) */
        jsonval_set(record, "optim_bytes_per_rank_formula", json_column(r->rows, r->ranks, F_OPTIM_F));
        jsonval_set(record, "optim_padding_bytes_per_rank", json_column(r->rows, r->ranks, F_OPTIM_PAD));
    }
    jsonval_set(record, "acts_bytes_per_micro_batch", json_column(r->rows, r->ranks, F_ACTS_PER_MB));
    jsonval_set(record, "acts_bytes_per_micro_batch_formula", json_column(r->rows, r->ranks, F_ACTS_PER_MB_F));
    jsonval_set(record, "acts_in_flight_formula", json_column(r->rows, r->ranks, F_IN_FLIGHT));
    jsonval_set(record, "acts_formula", jsonval_text(r->acts_formula));
}

void report3d_print(const report3d *r, const process_grid *g) {
    if (g->world->rank != 0) return;
    const grid_dims d = g->dims;
    const char *titles[GROUP_KINDS] = {"TP all-reduce", "PP send+recv ", "DP all-reduce", "CP ring      "};
    const char *formulas[GROUP_KINDS] = {
        "4 x stage layers x m all-reduces of (B/(d m)) x T x C floats; ring 2(t-1)/t",
        "2 x boundaries x m messages of (B/(d m)) x T x C floats (activation out, gradient back)",
        "1 all-reduce of the rank's gradient (its shard of its stage); ring 2(d-1)/d",
        "stage layers x m x (K|V blocks of (B/(d m)) x T/c x 2C/t floats: (c-1) per forward, (c-1) + c backward), "
        "sent and received"};
    if (r->kinds > GROUP_CP && r->cp_algo == TH_CP_ALLGATHER) {
        titles[GROUP_CP] = "CP AG+RS      ";
        formulas[GROUP_CP] = "stage layers x m x (an all-gather of c K|V blocks of (B/(d m)) x T/c x 2C/t floats per "
                             "forward and backward, a reduce-scatter of dK|dV); ring (c-1)/c";
    } else if (r->kinds > GROUP_CP && r->cp_algo == TH_CP_ULYSSES) {
        titles[GROUP_CP] = "CP all-to-all";
        formulas[GROUP_CP] = "stage layers x m x 2 all-to-alls per forward and backward (q|k|v and the output; dO and "
                             "dq|dk|dv), 4 x (B/(d m)) x T/c x C/t floats each pass; ring (c-1)/c";
    }
    if (r->kinds > GROUP_CP) { /* lab09: a rank's blocks hold T/c positions; the replicas are the c x d ranks */
        formulas[GROUP_TP] = r->recompute_full ? "6 x stage layers x m all-reduces of (B/(d m)) x T/c x C floats (the "
                                                 "forward's 2 again: --recompute full); ring 2(t-1)/t"
                                               : "4 x stage layers x m all-reduces of (B/(d m)) x T/c x C floats; ring "
                                                 "2(t-1)/t";
        formulas[GROUP_PP] = "2 x boundaries x m messages of (B/(d m)) x T/c x C floats (activation out, gradient back)";
        titles[GROUP_DP] = "DP all-reduce";
        formulas[GROUP_DP] = "1 all-reduce of the rank's gradient over its c x d replicas (cp x dp); ring "
                             "2(cd-1)/(cd)";
    }
    if (r->zero_stage) {
        titles[GROUP_DP] = "DP RS+AG      ";
        formulas[GROUP_DP] = "ZeRO-1: 1 reduce-scatter + 1 all-gather of the rank's buffer padded to d slices; ring "
                             "(d-1)/d each (DP's all-reduce's bytes)";
    }
    if (r->recompute_full) formulas[GROUP_TP] = "6 x stage layers x m all-reduces of (B/(d m)) x T x C floats (the "
                                                "forward's 2 again: --recompute full); ring 2(t-1)/t";
    if (r->sequence_parallel) {
        titles[GROUP_TP] = "TP AG+RS+AR  ";
        formulas[GROUP_TP] = r->recompute_full
            ? "(6 all-gathers + 6 reduce-scatters) x stage layers x m, of (B/(d m)) x T x C floats, ring (t-1)/t "
              "each (TP's all-reduces' bytes), + 1 all-reduce of each chunk's partial gradients"
            : "(4 all-gathers + 4 reduce-scatters) x stage layers x m, of (B/(d m)) x T x C floats, ring (t-1)/t "
              "each (TP's all-reduces' bytes), + 1 all-reduce of each chunk's partial gradients";
        formulas[GROUP_PP] = "2 x boundaries x m messages of (B/(d m)) x T/t x C floats (each TP rank its positions)";
    }
    const int sizes[GROUP_KINDS] = {d.tp, d.pp, d.dp, g->cp ? g->cp->size : 1};
    char a[16], b[16], c[16], e[16], f[16], t[16];
    printf("\n%s traffic per rank per step, busiest rank, measured | formula:\n", r->kinds > GROUP_CP ? "4D" : "3D");
    for (int k = 0; k < r->kinds; k++) {
        const int o = k * G_FIELDS;
        int mismatches = 0;
        for (int q = 0; q < r->ranks; q++) {
            const double *x = r->rows + (size_t)q * F_FIELDS + o;
            mismatches += x[G_CALLS] != x[G_CALLS_F] || fabs(x[G_PAYLOAD] - x[G_PAYLOAD_F]) > 0.5 ||
                          fabs(x[G_RING] - x[G_RING_F]) > 0.5;
        }
        const char *wire = k == GROUP_PP || (k == GROUP_CP && r->cp_algo == TH_CP_RING)
                               ? "point to point" : "ring"; /* a send has no ring factor */
        printf("  %s (groups of %d): %4.0f calls, payload %sB, %s %sB, %.1f ms | %.0f calls, %sB, %s %sB%s\n",
               titles[k], sizes[k], column_max(r->rows, r->ranks, o + G_CALLS),
               human(column_max(r->rows, r->ranks, o + G_PAYLOAD), a), wire,
               human(column_max(r->rows, r->ranks, o + G_RING), b), 1e3 * column_max(r->rows, r->ranks, o + G_SECONDS),
               column_max(r->rows, r->ranks, o + G_CALLS_F), human(column_max(r->rows, r->ranks, o + G_PAYLOAD_F), c),
               wire, human(column_max(r->rows, r->ranks, o + G_RING_F), e), mismatches ? " MISMATCH" : "");
        printf("      formula: %s%s\n", formulas[k],
               mismatches ? "" : "; every rank's measured figures equal its own formula");
    }

    printf("  (the time split above counts a micro-batch's whole forward or backward as compute, the TP\n"
           "   all-reduces inside it too, so compute + comm can exceed 1 and 1 - compute is the pipeline's idle\n"
           "   time plus the DP all-reduce; the last columns below give each group's share in ms per step)\n");
    printf("memory per rank (peak bytes by the allocator) and communication time per step:\n");
    const int with_cp = r->kinds > GROUP_CP; /* lab09: the third coordinate is the replica, cp + c x dp */
    printf("  rank (tp,pp,%s) layers | params = 4 x local elements | grads | AdamW | activations = in flight x "
           "per micro-batch | total | TP / PP / DP%s ms\n", with_cp ? "cp+c*dp" : "dp", with_cp ? " / CP" : "");
    for (int q = 0; q < r->ranks; q++) {
        if (q == 16 && r->ranks > 17) { printf("  ... (%d more ranks in the record)\n", r->ranks - 16); break; }
        const double *x = r->rows + (size_t)q * F_FIELDS;
        double acts_f = x[F_ACTS_F];
        if (x[F_ACTS_PER_MB_F] != x[F_ACTS_PER_MB]) printf("  rank %d: activations per micro-batch %.0f B, theory.h "
                                                        "%.0f B (MISMATCH)\n", q, x[F_ACTS_PER_MB], x[F_ACTS_PER_MB_F]);
        char how[48]; /* one chunk, unsplit: in flight x per micro-batch; else the chunks' sum */
        if (x[F_IN_FLIGHT] * x[F_ACTS_PER_MB] == acts_f) snprintf(how, sizeof how, "%.0f x %sB", x[F_IN_FLIGHT],
                                                                  human(x[F_ACTS_PER_MB], f));
        else snprintf(how, sizeof how, "%sB (chunks)", human(acts_f, f));
        char cp_ms[24] = "";
        if (with_cp) snprintf(cp_ms, sizeof cp_ms, " / %.1f", 1e3 * x[GROUP_CP * G_FIELDS + G_SECONDS]);
        printf("  %4d (%.0f,%.0f,%.0f) [%.0f,%.0f) | %sB%s | %sB | %sB | %sB = %s%s | %sB | %.1f / %.1f / %.1f%s\n", q,
               x[F_TP], x[F_PP], x[F_DP], x[F_LO], x[F_HI], human(x[F_PARAMS], a),
               x[F_PARAMS] == x[F_PARAMS_F] ? "" : " (MISMATCH)", human(x[F_GRADS], b), human(x[F_OPTIM], c),
               human(x[F_ACTS], e), how, x[F_ACTS] == acts_f ? "" : " (MISMATCH)",
               human(x[F_TOTAL], t), 1e3 * x[GROUP_TP * G_FIELDS + G_SECONDS], 1e3 * x[GROUP_PP * G_FIELDS + G_SECONDS],
               1e3 * x[GROUP_DP * G_FIELDS + G_SECONDS], cp_ms);
    }
    if (r->zero_stage) { /* allocator = theory/'s formula, rank by rank */
        printf("ZeRO-1 over each DP group (d=%d): optimizer state per rank = K x elements / d + the last slice's "
               "padding, K = %g (%s):\n", d.dp, r->optim_bytes_per_elem, r->optim_bytes_per_elem == 8 ?
               "AdamW's m and v in fp32" : "fp32 master + AdamW's m and v");
        for (int q = 0; q < r->ranks; q++) {
            if (q == 16 && r->ranks > 17) break;
            const double *x = r->rows + (size_t)q * F_FIELDS;
            const double want = x[F_OPTIM_F] + x[F_OPTIM_PAD];
            printf("  rank %d: %.0f B = %g x %.0f / %d = %.2f + %.2f padding%s (unsharded: %.0f B)\n", q,
                   x[F_OPTIM], r->optim_bytes_per_elem, x[F_ELEMS], d.dp, x[F_OPTIM_F], x[F_OPTIM_PAD],
                   fabs(x[F_OPTIM] - want) < 0.5 ? "" : " (MISMATCH)", r->optim_bytes_per_elem * x[F_ELEMS]);
        }
    }
    fflush(stdout);
}

void report3d_free(report3d *r) {
    free(r->rows);
    memset(r, 0, sizeof *r);
}
