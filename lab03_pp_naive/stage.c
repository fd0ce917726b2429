#include "stage.h"
#include "device.h"
#include "jsonval.h"
#include "kernels.h"
#include "lab_run.h" /* lab_theory_model */
#include "mem.h"
#include "moe.h"
#include "run.h" /* human() */
#include "theory.h"
#include "trace.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* ---- set-up ------------------------------------------------------------------- */

void stage_init(pipeline_stage *s, comm *pipe, const gpt_layout *g, const dataset *data,
                uint64_t seed, int global_batch, int micro_batches) {
    stage_init_model(s, pipe, g, NULL, data, seed, 0, global_batch, micro_batches);
}

void stage_init_model(pipeline_stage *s, comm *pipe, const gpt_layout *g, const stage_model *model,
                      const dataset *data, uint64_t seed, int first_row, int batch, int micro_batches) {
    int r = pipe->rank, p = pipe->size;
    stage_place place = {r, p, r > 0 ? r - 1 : -1, r < p - 1 ? r + 1 : -1, NULL, NULL, NULL, NULL, NULL};
    stage_init_placed(s, pipe, g, model, data, seed, first_row, batch, micro_batches, &place);
}

/* The positions of a data row: the whole sequence, also where the blocks hold a part of it. */
static int stage_data_seq(const pipeline_stage *s) { return s->model.data_seq ? s->model.data_seq : s->g->cfg.seq; }

void stage_init_placed(pipeline_stage *s, comm *pipe, const gpt_layout *g, const stage_model *model,
                       const dataset *data, uint64_t seed, int first_row, int batch, int micro_batches,
                       const stage_place *place) {
    memset(s, 0, sizeof *s);
    s->pipe = pipe;
    s->index = place->index;
    s->count = place->count;
    s->prev = place->prev;
    s->next = place->next;
    s->g = g;
    s->model = model ? *model : (stage_model){.layer = gpt_default_hooks(g), .part = gpt_whole_part(g)};
    th_stage_layers(g->cfg.layers, s->count, s->index, &s->lo, &s->hi);
    gpt_range_with(g, &s->model.layer, s->lo, s->hi, &s->begin, &s->end);
    const long len = s->end - s->begin;
    size_t n = (size_t)len * sizeof(float), values = (size_t)len * value_bytes();
    s->owns_buffers = !place->params;
    s->params = s->owns_buffers ? mem_alloc(values, MEM_PARAMS) : place->params;
    s->grads = s->owns_buffers ? mem_alloc(values, MEM_GRADS) : place->grads;
    s->master = s->owns_buffers ? master_alloc(s->params, len) : place->master;
    s->adam_m = s->owns_buffers ? mem_alloc(n, MEM_OPTIM) : place->adam_m;
    s->adam_v = s->owns_buffers ? mem_alloc(n, MEM_OPTIM) : place->adam_v;
    /* the same values lab01 has at these offsets: initial weights are a pure
     * function of (seed, tensor, element), not of who creates them */
    if (s->model.init_params) s->model.init_params(s->model.ctx, seed, s->lo, s->hi, s->master);
    else gpt_init_params(g, seed, s->begin, s->end, s->master);
    params_from_master(s->params, s->master, len);

    s->micro_batches = micro_batches;
    s->rows = batch / micro_batches;
    s->first_row = first_row;
    s->dloss = 1.0f / ((float)batch * (float)g->cfg.seq);
    /* a part may hold only a slice of every sequence's positions (lab05's sequence parallelism) */
    const int seq_parts = s->model.part.seq_parts > 1 ? s->model.part.seq_parts : 1;
    s->boundary_values = (long)s->rows * (g->cfg.seq / seq_parts) * g->cfg.d_model;
    gpt_scratch_alloc_part(&s->scratch, g, s->rows, &s->model.part);
    if (s->next >= 0) s->dout = mem_alloc((size_t)s->boundary_values * value_bytes(), MEM_COMM);
    s->data = data;
    s->seed = seed;
    const long data_seq = stage_data_seq(s);
    s->tokens = malloc(sizeof(int) * (size_t)s->rows * data_seq);
    s->targets = malloc(sizeof(int) * (size_t)s->rows * data_seq);
    /* never more blocks than micro-batches: at most m are in flight at once */
    s->spare_acts = calloc((size_t)micro_batches, sizeof *s->spare_acts);
    if (!s->tokens || !s->targets || !s->spare_acts) die("out of host memory");
}

void stage_free(pipeline_stage *s) {
    if (s->owns_buffers) {
        master_free(s->master, s->params);
        mem_free(s->params);
        mem_free(s->grads);
        mem_free(s->adam_m);
        mem_free(s->adam_v);
    }
    mem_free(s->dout);
    gpt_scratch_free(&s->scratch);
    free(s->tokens);
    free(s->targets);
    while (s->n_spare_acts > 0) gpt_acts_free(&s->spare_acts[--s->n_spare_acts]);
    free(s->spare_acts);
    run_experts_tally_free(&s->moe);
    memset(s, 0, sizeof *s);
}

void stage_step_begin(pipeline_stage *s, int step) {
    s->step_started = now_seconds();
    s->step = step;
    s->loss_sum = 0;
    s->busy_seconds = 0;
    run_experts_tally_begin(&s->moe, &s->g->cfg);
    /* the stage's own work, so traced as compute: not idle time */
    int ev = trace_begin("zero_grads", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    mem_zero(s->grads, (size_t)(s->end - s->begin) * value_bytes());
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
}

/* A micro-batch's block is kept for the next micro-batch once its backward is
 * done, as PyTorch's caching allocator keeps freed blocks: otherwise every
 * micro-batch would pay for a fresh allocation (page faults on the CPU, a
 * device-wide synchronisation in cudaFree on the GPU) in the middle of the
 * pipeline. A block is allocated only when every kept one is in use, so the
 * allocator's peak is still the largest number of micro-batches in flight. */
void stage_acts_alloc(pipeline_stage *s, gpt_acts *a, int mb) {
    if (s->n_spare_acts > 0) {
        *a = s->spare_acts[--s->n_spare_acts];
        return;
    }
    /* a real allocation zeroes its block: work, not waiting, so traced as compute */
    int ev = trace_begin("alloc_acts", TRACE_COMPUTE, mb, NULL);
    double t0 = now_seconds();
    gpt_acts_alloc_part(a, s->g, s->lo, s->hi, s->rows, &s->model.part);
    gpt_acts_bind(a, &s->scratch); /* --recompute: what the layers do not keep goes there */
    a->positions = s->model.positions; /* context parallelism: the rank's positions of every row */
    s->acts_bytes = a->bytes;
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
}

void stage_acts_free(pipeline_stage *s, gpt_acts *a) {
    if (s->n_spare_acts >= s->micro_batches) die("stage_acts_free: more blocks than micro-batches");
    s->spare_acts[s->n_spare_acts++] = *a;
    memset(a, 0, sizeof *a);
}

/* ---- compute ------------------------------------------------------------------ */

void stage_forward_compute(pipeline_stage *s, gpt_acts *a, int mb) {
    int ev = trace_begin("forward", TRACE_COMPUTE, mb, NULL);
    double t0 = now_seconds();
    int T = stage_data_seq(s), first = s->prev < 0, last = s->next < 0;
    if (first || last) {
        /* micro-batch mb is rows [mb x rows, (mb+1) x rows) of this pipeline's share */
        data_batch(s->data, s->seed, s->step, s->first_row + mb * s->rows, s->rows, T, s->tokens, s->targets);
        gpt_acts_set_batch(a, first ? s->tokens : NULL, last ? s->targets : NULL, T); /* the positions it holds */
    }
    gpt_forward_with(s->g, &s->model.layer, s->params, a);
    /* every micro-batch has rows x T positions, so the batch mean is the mean of these */
    if (last) s->loss_sum += gpt_mean_loss(s->g, a);
    if (s->g->cfg.experts > 0) { /* per micro-batch: the aux loss is a mean over its sequences, each routed alone */
        run_experts_tally_add(&s->moe, s->g, a);
        if (!last) s->loss_sum += moe_aux_loss(s->g, a); /* the last's is in its mean loss; the loss sums all */
    }
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
}

const void *stage_backward_compute(pipeline_stage *s, gpt_acts *a, int mb) {
    int ev = trace_begin("backward", TRACE_COMPUTE, mb, NULL);
    double t0 = now_seconds();
    const void *dout = s->next >= 0 ? s->dout : NULL;
    const void *dx = gpt_backward_with(s->g, &s->model.layer, s->params, s->grads, a, &s->scratch, dout, s->dloss,
                                       NULL, NULL);
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
    return dx;
}

/* ---- exchanges ---------------------------------------------------------------- */

/* One paired send and receive (either may be absent: peer -1). The stage's own
 * events name what moves and which micro-batch it belongs to. */
static void exchange(pipeline_stage *s, const void *send, int dst, const char *send_op, int send_mb,
                     void *recv, int src, const char *recv_op, int recv_mb) {
    if (dst < 0 && src < 0) return;
    int send_ev = dst >= 0 ? trace_begin(send_op, TRACE_COMM, send_mb, NULL) : -1;
    int recv_ev = src >= 0 ? trace_begin(recv_op, TRACE_COMM, recv_mb, NULL) : -1;
    comm_sendrecv(s->pipe, send, dst >= 0 ? s->boundary_values : 0, dst,
                  recv, src >= 0 ? s->boundary_values : 0, src, COMM_VALUES);
    trace_end(recv_ev);
    trace_end(send_ev);
}

void stage_recv_forward(pipeline_stage *s, gpt_acts *a, int mb) {
    exchange(s, NULL, -1, NULL, -1, a->x_in, s->prev, "recv_act", mb);
}

void stage_send_forward(pipeline_stage *s, const gpt_acts *a, int mb) {
    exchange(s, gpt_acts_output(a), s->next, "send_act", mb, NULL, -1, NULL, -1);
}

void stage_recv_backward(pipeline_stage *s, int mb) {
    exchange(s, NULL, -1, NULL, -1, s->dout, s->next, "recv_grad", mb);
}

void stage_send_backward(pipeline_stage *s, const void *dx, int mb) {
    exchange(s, dx, s->prev, "send_grad", mb, NULL, -1, NULL, -1);
}

void stage_forward(pipeline_stage *s, gpt_acts *a, int mb) {
    stage_recv_forward(s, a, mb);
    stage_forward_compute(s, a, mb);
    stage_send_forward(s, a, mb);
}

void stage_backward(pipeline_stage *s, gpt_acts *a, int mb) {
    stage_recv_backward(s, mb);
    const void *dx = stage_backward_compute(s, a, mb);
    stage_send_backward(s, dx, mb);
}

/* ---- the step's end ----------------------------------------------------------- */

double stage_optimizer_step(pipeline_stage *s, const adamw_config *cfg, double clip, double *grad_norm) {
    long n = s->end - s->begin;
    int ev = trace_begin("grad_norm", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    /* Clipping must see the norm of the WHOLE model's gradient, as lab01 does:
     * a stage clipping by its own norm would scale each stage differently.
     * One host all-reduce carries the norm's pieces and the loss together. */
    double sums[2] = {KP->sum_squares(s->grads, n), s->loss_sum};
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
    /* traced as communication: a stage that finished its backward early waits here */
    ev = trace_begin("norm_allreduce", TRACE_COMM, -1, NULL);
    comm_allreduce_host(s->pipe, sums, 2);
    trace_end(ev);

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    t0 = now_seconds();
    *grad_norm = sqrt(sums[0]);
    float scale = clip_scale(sums[0], (float)clip);
    adamw_step(s->g, cfg, s->begin, s->end, s->master, s->grads, s->adam_m, s->adam_v, s->step + 1, scale);
    params_from_master(s->params, s->master, n);
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
    return sums[1] / s->micro_batches;
}

/* ---- the record ---------------------------------------------------------------- */

th_opts stage_opts(const pipeline_stage *s) {
    const gpt_part *p = &s->model.part; /* t: the heads split t ways; SP: the positions too */
    return th_opts_run(s->g->cfg.heads / p->heads, p->seq_parts > 1, s->g->cfg.recompute, g_precision == PREC_BF16);
}

double stage_acts_formula_bytes(const pipeline_stage *s) {
    const gpt_config *cfg = &s->g->cfg;
    th_model tm = lab_theory_model(cfg); /* --experts: their buffers too */
    const th_opts opts = stage_opts(s);
    if (s->model.cp < 2) return th_course_acts_bytes(&tm, &opts, s->lo, s->hi, s->rows);
    tm.seq = stage_data_seq(s); /* the whole sequence, of which the blocks hold 1/cp */
    return th_cp_stage_acts_bytes(&tm, &opts, s->lo, s->hi, s->rows, s->model.cp, (th_cp_algo)s->model.cp_algo);
}

json_t *stage_record_integers(const double *x, int n, int stride) {
    json_t *list = json_array();
    if (!list) die("out of host memory building JSON");
    for (int i = 0; i < n; i++) jsonval_append(list, jsonval_integer(x[(size_t)i * stride]));
    return list;
}

json_t *stage_record_rows(const double *x, int rows, int row_stride, int n, int stride) {
    json_t *list = json_array();
    if (!list) die("out of host memory building JSON");
    for (int r = 0; r < rows; r++) jsonval_append(list, stage_record_integers(x + (size_t)r * row_stride, n, stride));
    return list;
}

void stage_report_json(pipeline_stage *s, json_t *record, int in_flight_formula, const char *formula_text) {
    enum { LO, HI, BYTES, BYTES_F, IN_FLIGHT, PEAK, FIELDS };
    int p = s->count;
    double *all = calloc((size_t)p * FIELDS, sizeof(double));
    if (!all) die("out of host memory");
    double *mine = all + (size_t)s->index * FIELDS;
    mine[LO] = s->lo;
    mine[HI] = s->hi;
    mine[BYTES] = (double)s->acts_bytes;
    /* theory/'s exact formula of the same block (at the model's TP widths, SP
     * and --recompute) */
    mine[BYTES_F] = stage_acts_formula_bytes(s);
    mine[IN_FLIGHT] = in_flight_formula;
    mine[PEAK] = (double)mem_peak(MEM_ACTS);
    comm_allreduce_host(s->pipe, all, p * FIELDS); /* every other slot is 0: a gather */

    jsonval_set(record, "stages", json_integer(p));
    jsonval_set(record, "stage_layers", stage_record_rows(all + LO, p, FIELDS, 2, 1)); /* [LO, HI] of each stage */
    jsonval_set(record, "acts_bytes_per_micro_batch", stage_record_integers(all + BYTES, p, FIELDS));
    jsonval_set(record, "acts_bytes_per_micro_batch_formula", stage_record_integers(all + BYTES_F, p, FIELDS));
    jsonval_set(record, "acts_in_flight_formula", stage_record_integers(all + IN_FLIGHT, p, FIELDS));
    jsonval_set(record, "acts_peak_measured_bytes", stage_record_integers(all + PEAK, p, FIELDS));
    jsonval_set(record, "acts_formula", jsonval_text(formula_text));

    if (s->index == 0) {
        char a[16], b[16], c[16];
        printf("pipeline stages: activations per stage, measured by the allocator vs %s\n", formula_text);
        for (int r = 0; r < p; r++) {
            const double *x = all + (size_t)r * FIELDS;
            double formula = x[IN_FLIGHT] * x[BYTES];
            printf("  stage %d: layers [%.0f,%.0f) | peak %sB measured | formula %.0f x %sB per micro-batch = %sB%s"
                   " | per micro-batch: allocator %.0f B, theory %.0f B%s\n",
                   r, x[LO], x[HI], human(x[PEAK], a), x[IN_FLIGHT], human(x[BYTES], b),
                   human(formula, c), x[PEAK] == formula ? "" : " (MISMATCH)", x[BYTES], x[BYTES_F],
                   x[BYTES_F] < 0 || x[BYTES_F] == x[BYTES] ? "" : " (MISMATCH)");
        }
        fflush(stdout);
    }
    free(all);
}

/* --eval: the same pipeline forward on the held-out batches instead of
 * training ones (the stage reads its data through st->data), micro-batch by
 * micro-batch, no backward. Its sends stay out of the traffic counts, so the
 * record's per-step figures are the training's. */
static double heldout_batch_loss(void *stage, const dataset *heldout, int b) {
    pipeline_stage *st = stage;
    const dataset *training_data = st->data;
    st->data = heldout;
    stage_step_begin(st, b);
    for (int mb = 0; mb < st->micro_batches; mb++) {
        gpt_acts a;
        stage_acts_alloc(st, &a, mb);
        stage_forward(st, &a, mb);
        stage_acts_free(st, &a);
    }
    st->data = training_data;
    double loss = st->loss_sum / st->micro_batches; /* the last stage's; 0 on the others */
    comm_allreduce_host(st->pipe, &loss, 1);
    return loss;
}

double stage_evaluate(pipeline_stage *st, const dataset *data, int batch, int seq) {
    int batches;
    const double sum = lab_heldout_sum(data, batch, seq, st->pipe, heldout_batch_loss, st, &batches);
    return sum / batches;
}

const char *stage_bubble_text(const pipeline_stage *s, double theory, char buf[64]) {
    /* The host clock sees the work only on the CPU (CUDA queues it and returns);
     * on GPUs the summary's trace-based figures are the ones to read. */
    if (g_device != DEVICE_CPU) return NULL;
    snprintf(buf, 64, "bubble rank 0 %.2f (theory %.2f)",
             1 - s->busy_seconds / (now_seconds() - s->step_started), theory);
    return buf;
}

void stage_report_experts(run_ctx *ctx, comm *pipe, const pipeline_stage *stages, int n, int step) {
    if (stages[0].g->cfg.experts <= 0) return;
    run_experts_tally *t = malloc(sizeof *t * (size_t)n);
    if (!t) die("out of memory for the expert loads");
    for (int i = 0; i < n; i++) t[i] = stages[i].moe;
    run_experts_report(ctx, pipe, t, n, 1, step); /* the stages hold different layers: their aux losses add */
    free(t);
}
