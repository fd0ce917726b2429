#include "executor.h"
#include "device.h"
#include "jsonval.h"
#include "kernels.h"
#include "lab_run.h" /* lab_theory_model */
#include "mem.h"
#include "run.h" /* human() */
#include "trace.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) die("out of host memory");
    return p;
}

/* ---- messages ----------------------------------------------------------------------- */

/* A message is an activation going up from virtual stage `stage` (dir 0) or an
 * input gradient going down from it (dir 1), of micro-batch mb. Its id numbers
 * every possible one of a step; both ranks of a message compute the same id,
 * which is also its MPI tag (+1) and its place in a phase's order. */
enum { ACT = 0, GRAD = 1 };

static int message_id(const schedule *s, int dir, int stage, int mb) {
    return (dir * schedule_stages(s) + stage) * s->m + mb;
}

/* The message an action sends on, or -1 (none, or the end of the pipe). */
static int produced(const schedule *s, int rank, schedule_action a) {
    int st = schedule_stage_of(s, rank, a.chunk);
    if (a.op == OP_F && st < schedule_stages(s) - 1) return message_id(s, ACT, st, a.mb);
    if (a.op == OP_B && st > 0) return message_id(s, GRAD, st, a.mb);
    return -1;
}

/* The message an action waits for, or -1. */
static int consumed(const schedule *s, int rank, schedule_action a) {
    int st = schedule_stage_of(s, rank, a.chunk);
    if (a.op == OP_F && st > 0) return message_id(s, ACT, st - 1, a.mb);
    if (a.op == OP_B && st < schedule_stages(s) - 1) return message_id(s, GRAD, st + 1, a.mb);
    return -1;
}

/* Whether id is a message at all (nothing goes up from the last stage or down from the first). */
static int message_exists(const schedule *s, int id) {
    int S = schedule_stages(s), st = id / s->m % S;
    return id / (S * s->m) == ACT ? st < S - 1 : st > 0;
}

/* Where a message goes and comes from. */
static void endpoints(const schedule *s, int id, int *src, int *dst) {
    int per_dir = schedule_stages(s) * s->m, dir = id / per_dir, st = id % per_dir / s->m, chunk;
    schedule_place(s, st, src, &chunk);
    schedule_place(s, dir == ACT ? st + 1 : st - 1, dst, &chunk);
}

/* ---- the plan: this rank's program ------------------------------------------------- */

/* One entry of the program: an action of the rank's list, or a phase, the
 * messages (ids) this rank sends or receives at that tick, posted together. */
typedef struct plan_entry {
    int action;        /* index into the rank's list, or -1 for a phase */
    int first, count;  /* a phase: ids[first .. first + count) */
} plan_entry;

struct pipeline_plan {
    const schedule *s;
    plan_entry *entry;
    int n_entries;
    int *ids;          /* the phases' messages, in posting order */
    int n_ids;
    /* When a message this rank sends gives its buffer back: after its action
     * release_after[id] (-1: at the end of the step), the first of this rank's
     * actions that takes a message its receiver made after taking ours, so
     * that the send has surely been matched and the wait returns at once. A
     * point in the program, not a moment in time: the number of buffers does
     * not depend on how fast the ranks happen to run. A forward-only plan
     * (nothing comes back) waits for its sends right after posting them. */
    int *release_after;
    int wait_sends;
    /* the step's state per message id */
    void **buf;        /* the message's buffer while it exists, else NULL */
    comm_request *req; /* its send or receive between ranks */
    int n_messages;
};

typedef struct { double tick; int kind, key, action; } program_item; /* kind 0 action, 1 post */

static int by_tick(const void *x, const void *y) {
    const program_item *a = x, *b = y;
    if (a->tick != b->tick) return a->tick < b->tick ? -1 : 1;
    if (a->kind != b->kind) return a->kind - b->kind; /* the action first, then its phase */
    return a->key - b->key;
}

/* Simulated on integer ticks (each action of a chunk 1, an unsplit backward 2),
 * every rank's actions get a start tick; a message's phase is its producer's. */
static pipeline_plan *plan_make(const schedule *s, int me) {
    pipeline_plan *pl = xcalloc(1, sizeof *pl);
    pl->s = s;
    pl->n_messages = 2 * schedule_stages(s) * s->m;
    pl->buf = xcalloc((size_t)pl->n_messages, sizeof *pl->buf);
    pl->req = xcalloc((size_t)pl->n_messages, sizeof *pl->req);
    double **start;
    schedule_simulate(s, s->v, s->v, s->v, &start);
    int total = 0;
    for (int r = 0; r < s->p; r++) total += s->count[r];
    program_item *items = xcalloc((size_t)(s->count[me] + total), sizeof *items);
    int n = 0;
    for (int i = 0; i < s->count[me]; i++) items[n++] = (program_item){start[me][i], 0, 0, i};
    for (int r = 0; r < s->p; r++)
        for (int i = 0; i < s->count[r]; i++) {
            int id = produced(s, r, s->rank[r][i]), src, dst;
            if (id < 0) continue;
            endpoints(s, id, &src, &dst);
            if (src != dst && (src == me || dst == me)) items[n++] = (program_item){start[r][i], 1, id, -1};
        }
    qsort(items, (size_t)n, sizeof *items, by_tick);
    /* which of this rank's actions takes each message */
    int *taker = xcalloc((size_t)pl->n_messages, sizeof *taker);
    for (int id = 0; id < pl->n_messages; id++) taker[id] = -1;
    for (int i = 0; i < s->count[me]; i++) {
        int id = consumed(s, me, s->rank[me][i]);
        if (id >= 0) taker[id] = i;
    }
    pl->release_after = xcalloc((size_t)pl->n_messages, sizeof *pl->release_after);
    pl->wait_sends = s->forward_only;
    for (int id = 0; id < pl->n_messages; id++) {
        pl->release_after[id] = -1;
        int src, dst;
        if (!message_exists(s, id)) continue;
        endpoints(s, id, &src, &dst);
        if (src != me || dst == me) continue;
        /* the receiver's actions from the one that takes it on */
        int k = 0;
        while (k < s->count[dst] && consumed(s, dst, s->rank[dst][k]) != id) k++;
        for (; k < s->count[dst]; k++) {
            int back = produced(s, dst, s->rank[dst][k]), from, to;
            if (back < 0) continue;
            endpoints(s, back, &from, &to);
            if (to == me && taker[back] >= 0 && (pl->release_after[id] < 0 || taker[back] < pl->release_after[id]))
                pl->release_after[id] = taker[back];
        }
    }
    free(taker);
    pl->entry = xcalloc((size_t)n, sizeof *pl->entry);
    pl->ids = xcalloc((size_t)n, sizeof *pl->ids);
    for (int k = 0; k < n; k++) {
        if (items[k].kind == 0) {
            pl->entry[pl->n_entries++] = (plan_entry){items[k].action, 0, 0};
            continue;
        }
        if (k == 0 || items[k - 1].kind != 1 || items[k - 1].tick != items[k].tick)
            pl->entry[pl->n_entries++] = (plan_entry){-1, pl->n_ids, 0};
        pl->ids[pl->n_ids++] = items[k].key;
        pl->entry[pl->n_entries - 1].count++;
    }
    free(items);
    for (int r = 0; r < s->p; r++) free(start[r]);
    free(start);
    return pl;
}

static void plan_free(pipeline_plan *pl) {
    if (!pl) return;
    for (int i = 0; i < pl->n_messages; i++) comm_request_free(&pl->req[i]);
    free(pl->release_after);
    free(pl->buf);
    free(pl->req);
    free(pl->entry);
    free(pl->ids);
    free(pl);
}

/* Message buffers come from one pool per rank (both plans), allocated only
 * when every kept one is in use, as the activation blocks are. */
static void *message_buffer(pipeline_rank *pr) {
    if (pr->n_spare_messages > 0) return pr->spare_messages[--pr->n_spare_messages];
    if (pr->n_messages_allocated == pr->cap_messages) {
        pr->cap_messages = pr->cap_messages ? 2 * pr->cap_messages : 16;
        pr->spare_messages = realloc(pr->spare_messages, (size_t)pr->cap_messages * sizeof *pr->spare_messages);
        if (!pr->spare_messages) die("out of host memory");
    }
    pr->n_messages_allocated++;
    return mem_alloc((size_t)pr->chunk[0].boundary_values * value_bytes(), MEM_COMM);
}

static void message_done(pipeline_rank *pr, pipeline_plan *pl, int id) {
    pr->spare_messages[pr->n_spare_messages++] = pl->buf[id];
    pl->buf[id] = NULL;
}

/* ---- set-up ------------------------------------------------------------------------- */

int pipeline_check_flags(run_ctx *ctx, const char *name, int p, int m, int v) {
    int kind = schedule_parse(name);
    if (kind < 0) { /* run_parse has said so already; this only keeps the message if not */
        run_check(ctx, 0, "--schedule must be one of %s, got '%s'", SCHEDULE_CHOICES, name);
        return -1;
    }
    char msg[sizeof ctx->error];
    run_check(ctx, schedule_check(kind, p, m, v, run_flag_given(ctx->argc, ctx->argv, "--virtual-stages"), ctx->opt.layers, msg,
                                  (int)sizeof msg), "%s", msg);
    run_check_rank_capacity(ctx, m, "--micro-batches");
    return kind;
}

void pipeline_init(pipeline_rank *pr, comm *pipe, const gpt_layout *g, const stage_model *model,
                   const dataset *data, uint64_t seed, int first_row, int batch, schedule_kind kind, int m, int v) {
    pipeline_init_sharded(pr, pipe, g, model, data, seed, first_row, batch, kind, m, v, 1, 0);
}

float *pipeline_slice_master(const pipeline_rank *pr) {
    return (void *)pr->master == pr->params ? pr->master + pr->slice_begin : pr->master;
}

void pipeline_init_sharded(pipeline_rank *pr, comm *pipe, const gpt_layout *g, const stage_model *model,
                           const dataset *data, uint64_t seed, int first_row, int batch, schedule_kind kind, int m,
                           int v, int opt_shards, int opt_shard) {
    memset(pr, 0, sizeof *pr);
    pr->pipe = pipe;
    pr->rank = pipe->rank;
    pr->p = pipe->size;
    pr->m = m;
    pr->g = g;
    schedule_make(&pr->sched, kind, pr->p, m, v);
    schedule_forward_only(&pr->sched, &pr->eval_sched);
    const schedule *s = &pr->sched;
    const int S = schedule_stages(s);
    pr->v = s->v;
    if (schedule_messages(pr->p, m, pr->sched.v) > SCHEDULE_MAX_MESSAGES) /* schedule_check refused it already */
        die("%d virtual stages x %d micro-batches: too many messages for MPI's tags", S, m);
    /* the chunks' ranges, then one flat buffer per kind holding them all */
    pr->offset = xcalloc((size_t)pr->v, sizeof *pr->offset);
    long *len = xcalloc((size_t)pr->v, sizeof *len);
    for (int c = 0; c < pr->v; c++) {
        int lo, hi;
        long begin, end;
        th_stage_layers(g->cfg.layers, S, schedule_stage_of(s, pr->rank, c), &lo, &hi);
        if (model) gpt_range_with(g, &model->layer, lo, hi, &begin, &end);
        else gpt_range(g, lo, hi, &begin, &end);
        pr->offset[c] = pr->n;
        len[c] = end - begin;
        pr->n += len[c];
    }
    const int elsewhere = opt_shards == PIPELINE_STATES_ELSEWHERE, sharded = opt_shards > 1 || elsewhere;
    const long slice = elsewhere ? 0 : sharded ? comm_chunk(pr->n, opt_shards) : pr->n; /* optimizer elements kept */
    pr->opt_shards = elsewhere ? 0 : sharded ? opt_shards : 1;
    pr->opt_shard = opt_shards > 1 ? opt_shard : 0;
    pr->padded = elsewhere ? pr->n : slice * pr->opt_shards;
    pr->slice_begin = (long)pr->opt_shard * slice < pr->n ? (long)pr->opt_shard * slice : pr->n;
    pr->slice_end = pr->slice_begin + slice < pr->n ? pr->slice_begin + slice : pr->n;
    size_t bytes = (size_t)slice * sizeof(float), values = (size_t)pr->padded * value_bytes();
    pr->params = mem_alloc(values, MEM_PARAMS);
    pr->grads = mem_alloc(values, MEM_GRADS);
    pr->master = elsewhere ? (g_precision == PREC_FP32 ? pr->params : NULL) : master_alloc(pr->params, slice);
    pr->adam_m = elsewhere ? NULL : mem_alloc(bytes, MEM_OPTIM);
    pr->adam_v = elsewhere ? NULL : mem_alloc(bytes, MEM_OPTIM);
    /* bf16 sharded: the chunks create their whole fp32 weights (what rounds into
     * the parameters) in scratch, of which the slice is kept as the master */
    float *init_master = sharded && (void *)pr->master != pr->params
                             ? mem_alloc((size_t)pr->n * sizeof(float), MEM_WORKSPACE) : NULL;
    if (elsewhere && init_master) pr->master = init_master; /* the caller's to slice and free */
    pr->chunk = xcalloc((size_t)pr->v, sizeof *pr->chunk);
    for (int c = 0; c < pr->v; c++) {
        int st = schedule_stage_of(s, pr->rank, c), prev = -1, next = -1, chunk;
        if (st > 0) schedule_place(s, st - 1, &prev, &chunk);
        if (st < S - 1) schedule_place(s, st + 1, &next, &chunk);
        long o = pr->offset[c];
        stage_place place = {st, S, prev, next, value_at(pr->params, o), value_at(pr->grads, o),
                             sharded ? NULL : pr->adam_m + o, sharded ? NULL : pr->adam_v + o,
                             init_master ? init_master + o : pr->master + o};
        stage_init_placed(&pr->chunk[c], pipe, g, model, data, seed, first_row, batch, m, &place);
        if (pr->chunk[c].end - pr->chunk[c].begin != len[c]) die("pipeline_init: chunk %d changed its range", c);
        if (sharded) pr->chunk[c].master = NULL; /* the slice's master is the caller's to step */
    }
    if (init_master && !elsewhere) {
        mem_copy(pr->master, init_master + pr->slice_begin, (size_t)(pr->slice_end - pr->slice_begin) * sizeof(float));
        mem_free(init_master);
    }
    free(len);
    pr->acts = xcalloc((size_t)pr->v, sizeof *pr->acts);
    pr->wgrads = xcalloc((size_t)pr->v, sizeof *pr->wgrads);
    pr->spare_wgrads = xcalloc((size_t)pr->v, sizeof *pr->spare_wgrads);
    pr->n_spare_wgrads = xcalloc((size_t)pr->v, sizeof *pr->n_spare_wgrads);
    pr->wgrads_bytes = xcalloc((size_t)pr->v, sizeof *pr->wgrads_bytes);
    for (int c = 0; c < pr->v; c++) {
        pr->acts[c] = xcalloc((size_t)m, sizeof **pr->acts);
        pr->wgrads[c] = xcalloc((size_t)m, sizeof **pr->wgrads);
        pr->spare_wgrads[c] = xcalloc((size_t)m, sizeof **pr->spare_wgrads);
    }
    pr->train = plan_make(&pr->sched, pr->rank);
    pr->eval = plan_make(&pr->eval_sched, pr->rank);
}

void pipeline_free(pipeline_rank *pr) {
    plan_free(pr->train);
    plan_free(pr->eval);
    for (int i = 0; i < pr->n_spare_messages; i++) mem_free(pr->spare_messages[i]);
    free(pr->spare_messages);
    for (int c = 0; c < pr->v; c++) {
        while (pr->n_spare_wgrads[c] > 0) gpt_wgrads_free(&pr->spare_wgrads[c][--pr->n_spare_wgrads[c]]);
        free(pr->spare_wgrads[c]);
        free(pr->acts[c]);
        free(pr->wgrads[c]);
        stage_free(&pr->chunk[c]);
    }
    free(pr->spare_wgrads);
    free(pr->n_spare_wgrads);
    free(pr->wgrads_bytes);
    free(pr->acts);
    free(pr->wgrads);
    free(pr->chunk);
    free(pr->offset);
    master_free(pr->master, pr->params);
    mem_free(pr->params);
    mem_free(pr->grads);
    mem_free(pr->adam_m);
    mem_free(pr->adam_v);
    schedule_free(&pr->sched);
    schedule_free(&pr->eval_sched);
    memset(pr, 0, sizeof *pr);
}

/* ---- the backward's two halves on a chunk (lab03's stage_backward_compute, split) -------- */

/* As stage_acts_alloc: a block is allocated only when every kept one is in use. */
static gpt_wgrads wgrads_alloc(pipeline_rank *pr, int c, int mb) {
    if (pr->n_spare_wgrads[c] > 0) return pr->spare_wgrads[c][--pr->n_spare_wgrads[c]];
    pipeline_stage *s = &pr->chunk[c];
    gpt_wgrads w;
    int ev = trace_begin("alloc_wgrads", TRACE_COMPUTE, mb, NULL);
    double t0 = now_seconds();
    gpt_wgrads_alloc_part(&w, s->g, s->lo, s->hi, s->rows, &s->model.part);
    pr->wgrads_bytes[c] = w.bytes;
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
    return w;
}

static const void *backward_input(pipeline_stage *s, gpt_acts *a, gpt_wgrads *w, const void *dout, int mb) {
    int ev = trace_begin("backward", TRACE_COMPUTE, mb, NULL);
    double t0 = now_seconds();
    const void *dx = gpt_backward_input_with(s->g, &s->model.layer, s->params, a, &s->scratch, w, dout, s->dloss);
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
    return dx;
}

static void backward_weight(pipeline_stage *s, const gpt_acts *a, const gpt_wgrads *w, int mb) {
    int ev = trace_begin("backward_weight", TRACE_COMPUTE, mb, NULL);
    double t0 = now_seconds();
    gpt_backward_weight_with(s->g, &s->model.layer, s->grads, a, w);
    s->busy_seconds += now_seconds() - t0;
    trace_end(ev);
}

/* ---- running a plan -------------------------------------------------------------------- */

/* The message an action needs, there to read: waited for (a "recv_act" or
 * "recv_grad" event) when it comes from another rank. */
static void *take(pipeline_plan *pl, int id, int mb) {
    if (!pl->buf[id]) die("pipeline: message %d is needed before it was posted", id);
    if (!pl->req[id].active) return pl->buf[id]; /* from a chunk of this rank, or already there */
    int ev = trace_begin(id < pl->n_messages / 2 ? "recv_act" : "recv_grad", TRACE_COMM, mb, NULL);
    comm_wait(&pl->req[id]);
    trace_end(ev);
    return pl->buf[id];
}

/* An action's output becomes message id: copied into a buffer of its own
 * (the output's storage is reused before a send could be waited for). */
static void give(pipeline_rank *pr, pipeline_plan *pl, int id, const void *data) {
    pl->buf[id] = message_buffer(pr);
    mem_copy(pl->buf[id], data, (size_t)pr->chunk[0].boundary_values * value_bytes());
}

static void run_action(pipeline_rank *pr, pipeline_plan *pl, schedule_action a) {
    const schedule *s = pl->s;
    pipeline_stage *st = &pr->chunk[a.chunk];
    gpt_acts *acts = &pr->acts[a.chunk][a.mb];
    gpt_wgrads *wg = &pr->wgrads[a.chunk][a.mb];
    const size_t boundary_bytes = (size_t)st->boundary_values * value_bytes();
    int in = consumed(s, pr->rank, a), out = produced(s, pr->rank, a);
    if (a.op == OP_F) {
        stage_acts_alloc(st, acts, a.mb);
        if (in >= 0) {
            mem_copy(acts->x_in, take(pl, in, a.mb), boundary_bytes);
            message_done(pr, pl, in);
        }
        stage_forward_compute(st, acts, a.mb);
        if (out >= 0) give(pr, pl, out, gpt_acts_output(acts));
        if (s->forward_only) stage_acts_free(st, acts);
    } else if (a.op == OP_B) {
        const void *dout = in >= 0 ? take(pl, in, a.mb) : NULL, *dx;
        if (s->split) {
            *wg = wgrads_alloc(pr, a.chunk, a.mb);
            dx = backward_input(st, acts, wg, dout, a.mb);
        } else {
            if (dout) mem_copy(st->dout, dout, boundary_bytes);
            dx = stage_backward_compute(st, acts, a.mb);
            stage_acts_free(st, acts);
        }
        if (in >= 0) message_done(pr, pl, in);
        if (out >= 0) give(pr, pl, out, dx);
    } else {
        backward_weight(st, acts, wg, a.mb);
        pr->spare_wgrads[a.chunk][pr->n_spare_wgrads[a.chunk]++] = *wg;
        memset(wg, 0, sizeof *wg);
        stage_acts_free(st, acts);
    }
}

/* Post one phase: this rank's sends and receives of one tick, in one group. */
static void post_phase(pipeline_rank *pr, pipeline_plan *pl, const plan_entry *e) {
    const schedule *s = pl->s;
    const long n = pr->chunk[0].boundary_values;
    comm_group_begin(pr->pipe);
    for (int k = e->first; k < e->first + e->count; k++) {
        int id = pl->ids[k], src, dst, grad = id >= pl->n_messages / 2;
        endpoints(s, id, &src, &dst);
        int mb = id % s->m;
        if (src == pr->rank) {
            int ev = trace_begin(grad ? "send_grad" : "send_act", TRACE_COMM, mb, NULL);
            comm_isend(pr->pipe, pl->buf[id], n, COMM_VALUES, dst, id + 1, &pl->req[id]);
            trace_end(ev);
        } else {
            pl->buf[id] = message_buffer(pr);
            comm_irecv(pr->pipe, pl->buf[id], n, COMM_VALUES, src, id + 1, &pl->req[id]);
        }
    }
    comm_group_end(pr->pipe);
}

/* A sent message's buffer goes back to the pool once its send is complete. */
static void release_send(pipeline_rank *pr, pipeline_plan *pl, int id) {
    comm_wait(&pl->req[id]);
    message_done(pr, pl, id);
}

static int sent_here(const pipeline_rank *pr, const pipeline_plan *pl, int id) {
    int src, dst;
    endpoints(pl->s, id, &src, &dst);
    return src == pr->rank && dst != pr->rank;
}

static void run_plan(pipeline_rank *pr, pipeline_plan *pl) {
    const schedule *s = pl->s;
    for (int k = 0; k < pl->n_entries; k++) {
        const plan_entry *e = &pl->entry[k];
        if (e->action >= 0) {
            run_action(pr, pl, s->rank[pr->rank][e->action]);
            for (int id = 0; id < pl->n_messages; id++)
                if (pl->release_after[id] == e->action && pl->buf[id] && sent_here(pr, pl, id)) release_send(pr, pl, id);
            continue;
        }
        post_phase(pr, pl, e);
        if (pl->wait_sends)
            for (int i = e->first; i < e->first + e->count; i++)
                if (sent_here(pr, pl, pl->ids[i])) release_send(pr, pl, pl->ids[i]);
    }
    for (int id = 0; id < pl->n_messages; id++) /* what nothing came back for */
        if (pl->buf[id] && sent_here(pr, pl, id)) release_send(pr, pl, id);
    for (int id = 0; id < pl->n_messages; id++)
        if (pl->buf[id]) die("pipeline: message %d was never taken", id);
}

void pipeline_step_begin(pipeline_rank *pr, int step) {
    for (int c = 0; c < pr->v; c++) stage_step_begin(&pr->chunk[c], step);
    pr->step_started = pr->chunk[0].step_started;
    pr->other_busy = 0;
}

void pipeline_run(pipeline_rank *pr) { run_plan(pr, pr->train); }

double pipeline_loss_sum(const pipeline_rank *pr) {
    double sum = 0;
    for (int c = 0; c < pr->v; c++) sum += pr->chunk[c].loss_sum;
    return sum;
}

double pipeline_busy_seconds(const pipeline_rank *pr) {
    double busy = pr->other_busy;
    for (int c = 0; c < pr->v; c++) busy += pr->chunk[c].busy_seconds;
    return busy;
}

const char *pipeline_bubble_text(const pipeline_rank *pr, double theory, char buf[64]) {
    /* as stage_bubble_text: the host clock sees the work only on the CPU */
    if (g_device != DEVICE_CPU) return NULL;
    snprintf(buf, 64, "bubble rank 0 %.2f (theory %.2f)",
             1 - pipeline_busy_seconds(pr) / (now_seconds() - pr->step_started), theory);
    return buf;
}

/* ---- the step's end ---------------------------------------------------------------------- */

double pipeline_optimizer_step(pipeline_rank *pr, const adamw_config *cfg, double clip, double *grad_norm) {
    int ev = trace_begin("grad_norm", TRACE_COMPUTE, -1, NULL);
    double t0 = now_seconds();
    /* the GLOBAL norm, as lab01's: every chunk of every rank, one all-reduce */
    double sums[2] = {KP->sum_squares(pr->grads, pr->n), pipeline_loss_sum(pr)};
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    comm_allreduce_host(pr->pipe, sums, 2);

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    t0 = now_seconds();
    *grad_norm = sqrt(sums[0]);
    float scale = clip_scale(sums[0], (float)clip);
    for (int c = 0; c < pr->v; c++) {
        pipeline_stage *s = &pr->chunk[c];
        adamw_step(pr->g, cfg, s->begin, s->end, s->master, s->grads, s->adam_m, s->adam_v, s->step + 1, scale);
    }
    params_from_master(pr->params, pr->master, pr->n);
    pr->other_busy += now_seconds() - t0;
    trace_end(ev);
    return sums[1] / pr->m;
}

void pipeline_checkpoint_view(pipeline_rank *pr, ckpt_view *v) {
    ckpt_view_init(v, pr->master, pr->n, pr->adam_m, pr->adam_v, pr->n);
    for (int c = 0; c < pr->v; c++)
        ckpt_hold(v, pr->offset[c], pr->chunk[c].begin, pr->chunk[c].end - pr->chunk[c].begin);
}

/* As lab03's stage_evaluate, with the forward-only plan. */
static double heldout_batch_loss(void *rank, const dataset *heldout, int b) {
    pipeline_rank *pr = rank;
    const dataset *training_data = pr->chunk[0].data;
    for (int c = 0; c < pr->v; c++) pr->chunk[c].data = heldout;
    pipeline_step_begin(pr, b);
    run_plan(pr, pr->eval);
    for (int c = 0; c < pr->v; c++) pr->chunk[c].data = training_data;
    double loss = pipeline_loss_sum(pr) / pr->m; /* the last virtual stage's; 0 elsewhere */
    comm_allreduce_host(pr->pipe, &loss, 1);
    return loss;
}

double pipeline_evaluate(pipeline_rank *pr, const dataset *data, int batch, int seq) {
    int batches;
    const double sum = lab_heldout_sum(data, batch, seq, pr->pipe, heldout_batch_loss, pr, &batches);
    return sum / batches;
}

/* ---- measurements and the record ------------------------------------------------------- */

void pipeline_measured_times(const pipeline_rank *pr, int first_measured, double t[3]) {
    static const char *const ops[3] = {"forward", "backward", "backward_weight"};
    double x[3];
    for (int k = 0; k < 3; k++) {
        int count = 0;
        double sec = trace_op_seconds(ops[k], first_measured, &count);
        /* count / v events per micro-batch of a rank's share */
        x[k] = count ? sec * pr->v / count : 0;
    }
    comm_allreduce_host(pr->pipe, x, 3);
    for (int k = 0; k < 3; k++) t[k] = x[k] / pr->p;
}

double pipeline_acts_formula_bytes(const pipeline_rank *pr) {
    const gpt_config *cfg = &pr->g->cfg;
    const th_model tm = lab_theory_model(cfg); /* --experts: their buffers too */
    double bytes = 0;
    for (int c = 0; c < pr->v; c++) {
        const pipeline_stage *s = &pr->chunk[c];
        const th_opts opts = stage_opts(s); /* the blocks by theory.h, at the chunk's widths and --recompute */
        int acts, wgrads;
        schedule_in_flight(&pr->sched, pr->rank, c, &acts, &wgrads);
        bytes += (double)acts * stage_acts_formula_bytes(s) +
                 (double)wgrads * th_course_wgrads_bytes(&tm, &opts, s->lo, s->hi, s->rows);
    }
    return bytes;
}

void pipeline_report_json(const pipeline_rank *pr, json_t *record) {
    enum { STAGE, LO, HI, ACTS_BYTES, ACTS_N, WG_BYTES, WG_N, PEAK, FIELDS };
    const int p = pr->p, v = pr->v, S = p * v;
    double *all = xcalloc((size_t)p * v * FIELDS, sizeof(double));
    for (int c = 0; c < v; c++) {
        double *x = all + ((size_t)pr->rank * v + c) * FIELDS;
        int acts, wgrads;
        schedule_in_flight(&pr->sched, pr->rank, c, &acts, &wgrads);
        x[STAGE] = pr->chunk[c].index;
        x[LO] = pr->chunk[c].lo;
        x[HI] = pr->chunk[c].hi;
        x[ACTS_BYTES] = (double)pr->chunk[c].acts_bytes;
        x[ACTS_N] = acts;
        x[WG_BYTES] = (double)pr->wgrads_bytes[c];
        x[WG_N] = wgrads;
        x[PEAK] = c == 0 ? (double)mem_peak(MEM_ACTS) : 0;
    }
    comm_allreduce_host(pr->pipe, all, p * v * FIELDS); /* every other slot is 0: a gather */

    double *layers = xcalloc((size_t)S * 2, sizeof *layers); /* [lo, hi) by virtual stage */
    for (int q = 0; q < p * v; q++) {
        const int st = (int)all[q * FIELDS + STAGE];
        layers[st * 2] = all[q * FIELDS + LO];
        layers[st * 2 + 1] = all[q * FIELDS + HI];
    }
    jsonval_set(record, "stages", json_integer(p));
    jsonval_set(record, "virtual_stages", json_integer(S));
    jsonval_set(record, "chunks_per_rank", json_integer(v));
    jsonval_set(record, "stage_layers", stage_record_rows(layers, S, 2, 2, 1));
    free(layers);
    /* per rank, its chunks' figures ([[rank 0's v], [rank 1's v], ...]); a rank's row is v x FIELDS long */
    const int row = v * FIELDS;
    jsonval_set(record, "chunk_stages", stage_record_rows(all + STAGE, p, row, v, FIELDS));
    jsonval_set(record, "chunk_acts_bytes_per_micro_batch", stage_record_rows(all + ACTS_BYTES, p, row, v, FIELDS));
    jsonval_set(record, "chunk_acts_in_flight_formula", stage_record_rows(all + ACTS_N, p, row, v, FIELDS));
    jsonval_set(record, "chunk_wgrads_bytes_per_micro_batch", stage_record_rows(all + WG_BYTES, p, row, v, FIELDS));
    jsonval_set(record, "chunk_wgrads_in_flight_formula", stage_record_rows(all + WG_N, p, row, v, FIELDS));
    /* chunk 0's, per rank, as lab03's record has them (the whole of it with one chunk, unsplit) */
    jsonval_set(record, "acts_bytes_per_micro_batch", stage_record_integers(all + ACTS_BYTES, p, row));
    jsonval_set(record, "acts_in_flight_formula", stage_record_integers(all + ACTS_N, p, row));
    double *formula = xcalloc((size_t)p, sizeof *formula);
    for (int r = 0; r < p; r++)
        for (int c = 0; c < v; c++) {
            const double *x = all + ((size_t)r * v + c) * FIELDS;
            formula[r] += x[ACTS_N] * x[ACTS_BYTES] + x[WG_N] * x[WG_BYTES];
        }
    /* the formula's total per rank is the record's acts_peak_bytes_formula_per_rank (pipeline_acts_formula_bytes) */
    jsonval_set(record, "acts_peak_measured_bytes", stage_record_integers(all + PEAK, p, row));
    char formula_text[128];
    snprintf(formula_text, sizeof formula_text, "per chunk: activation blocks in flight x their bytes%s, counted on "
             "the schedule's lists", pr->sched.split ? " + weight-gradient inputs x theirs" : "");
    jsonval_set(record, "acts_formula", jsonval_text(formula_text));

    if (pr->rank == 0) {
        char a[16], b[16], c16[16], d[16];
        printf("pipeline ranks: activations per rank, measured by the allocator vs the schedule's blocks in flight\n");
        for (int r = 0; r < p; r++) {
            double peak = all[(size_t)r * v * FIELDS + PEAK];
            printf("  rank %d: peak %sB measured | formula %sB =", r, human(peak, a), human(formula[r], b));
            for (int c = 0; c < v; c++) {
                const double *x = all + ((size_t)r * v + c) * FIELDS;
                printf("%s stage %.0f, layers [%.0f,%.0f): %.0f x %sB", c ? " +" : "", x[STAGE], x[LO], x[HI],
                       x[ACTS_N], human(x[ACTS_BYTES], c16));
                if (pr->sched.split) printf(" + %.0f x %sB", x[WG_N], human(x[WG_BYTES], d));
            }
            printf("%s\n", peak == formula[r] ? "" : " (MISMATCH)");
        }
        fflush(stdout);
    }
    free(formula);
    free(all);
}
