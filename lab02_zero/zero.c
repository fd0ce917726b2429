#include "zero.h"
#include "kernels.h"
#include "mem.h"
#include "trace.h"
#include <string.h>
#include <math.h>

/* ---- where a unit lives in each stage's buffers ---------------------------- */

/* The unit's gradient as the backward writes it: its place in the full buffer
 * (stage 1), or the bucket every unit reuses (stages 2-3). */
static void *unit_grads(zero_state *z, const shard_unit *u) {
    return z->stage == 1 ? value_at(z->grads, u->full_offset) : z->grads;
}

/* This rank's chunk of the unit's gradient after the reduce-scatter. Stage 1
 * reduces in place: the chunk is this rank's slice of the full buffer. */
static void *unit_grad_shard(zero_state *z, const shard_unit *u) {
    return z->stage == 1 ? value_at(z->grads, u->full_offset + (long)z->plan.rank * u->chunk)
                         : value_at(z->grad_shard, u->shard_offset);
}

/* This rank's chunk of the unit's parameters, the ones its AdamW updates. */
static void *unit_param_shard(zero_state *z, const shard_unit *u) {
    return z->stage < 3 ? value_at(z->params, u->full_offset + (long)z->plan.rank * u->chunk)
                        : value_at(z->param_shard, u->shard_offset);
}

/* The fp32 weights AdamW updates for that chunk: the parameters themselves in
 * fp32; in bf16 the master chunk, which is then rounded into the parameters. */
static float *unit_master(zero_state *z, const shard_unit *u) {
    return z->master ? z->master + u->shard_offset : unit_param_shard(z, u);
}

/* ---- stage 3: one unit's parameters whole at a time ---------------------------- */

static void gather_unit(zero_state *z, const shard_unit *u) {
    int index = (int)(u - z->plan.units);
    if (z->gathered_unit == index) return;
    comm_allgather(z->dp, value_at(z->param_shard, u->shard_offset), z->params, u->end - u->begin, COMM_VALUES);
    z->gathered_unit = index;
}

/* The buffer is reused by the next gather; releasing is forgetting what it holds. */
static void release_unit(zero_state *z) { z->gathered_unit = -1; }

/* The parameters of a block, ready to compute with. */
static const void *block_params(zero_state *z, int block) {
    const shard_unit *u = shard_unit_of_block(&z->plan, block);
    long begin, end;
    block_range(z->g, block, &begin, &end);
    if (z->stage == 3) {
        gather_unit(z, u);
        return value_at(z->params, begin - u->begin);
    }
    return value_at(z->params, u->full_offset + (begin - u->begin));
}

/* ---- set-up ------------------------------------------------------------------ */

long zero_unit_elems(int stage, double bucket_mb) {
    long bucket_elems = (long)(bucket_mb * 1024 * 1024 / value_bytes()); /* buckets are bytes of values */
    /* stage 1 with no buckets reduces everything at once; stage 2 cannot (the
     * full gradient must never exist), so its smallest bucket is one block;
     * stage 3 gathers one block at a time, so its units are blocks */
    return stage == 3 ? 1 : bucket_elems > 0 ? bucket_elems : stage == 1 ? 0 : 1;
}

void zero_init(zero_state *z, const gpt_layout *g, comm *dp, int stage, double bucket_mb, uint64_t seed) {
    *z = (zero_state){.stage = stage, .g = g, .dp = dp, .gathered_unit = -1};
    shard_plan_init(&z->plan, g, dp->size, dp->rank, zero_unit_elems(stage, bucket_mb));
    const shard_plan *p = &z->plan;
    size_t vb = value_bytes(), full = (size_t)p->full_elems * vb, shard = (size_t)p->shard_elems * vb;
    size_t one_unit = (size_t)p->largest_unit_elems * vb, shard32 = (size_t)p->shard_elems * sizeof(float);

    z->params = mem_alloc(stage < 3 ? full : one_unit, MEM_PARAMS);
    if (stage == 3) z->param_shard = mem_alloc(shard, MEM_PARAMS);
    z->grads = mem_alloc(stage == 1 ? full : one_unit, MEM_GRADS);
    if (stage >= 2) z->grad_shard = mem_alloc(shard, MEM_GRADS);
    if (g_precision == PREC_BF16) z->master = mem_alloc(shard32, MEM_OPTIM);
    z->adam_m = mem_alloc(shard32, MEM_OPTIM);
    z->adam_v = mem_alloc(shard32, MEM_OPTIM);
    grad_norm_init(&z->norm, 1);

    /* Initial values are a pure function of (seed, tensor, index), so a rank
     * creates exactly the elements it stores, and every stage and rank count
     * starts from lab01's weights. */
    for (int i = 0; i < p->n_units; i++) {
        const shard_unit *u = &p->units[i];
        long begin = u->begin, end = u->end;
        if (stage == 3) shard_owned_range(p, u, &begin, &end);
        void *dst = stage == 3 ? unit_param_shard(z, u) : value_at(z->params, u->full_offset);
        if (end > begin) gpt_init_values(g, seed, begin, end, dst);
        shard_owned_range(p, u, &begin, &end); /* bf16: the master chunk, in fp32 */
        if (z->master && end > begin) gpt_init_params(g, seed, begin, end, unit_master(z, u));
    }
}

void zero_checkpoint_view(const zero_state *z, ckpt_view *v) {
    const shard_plan *p = &z->plan;
    const int whole = z->stage < 3 && !z->master; /* fp32 stages 1-2 hold every unit's parameters */
    ckpt_view_init(v, z->master ? z->master : whole ? z->params : z->param_shard,
                   whole ? p->full_elems : p->shard_elems, z->adam_m, z->adam_v, p->shard_elems);
    for (int i = 0; i < p->n_units; i++) {
        const shard_unit *u = &p->units[i];
        long begin, end;
        shard_owned_range(p, u, &begin, &end);
        if (whole) ckpt_hold_params(v, u->full_offset, u->begin, u->end - u->begin);
        else ckpt_hold_params(v, u->shard_offset, begin, end - begin);
        ckpt_hold_moments(v, u->shard_offset, begin, end - begin);
    }
}

/* Round every owned master chunk into its parameters; stages 1-2 then gather
 * everyone's chunks into the full buffer (in place: this rank's chunk already
 * sits at its slot). */
static void params_from_masters(zero_state *z) {
    const shard_plan *p = &z->plan;
    for (int i = 0; i < p->n_units; i++) {
        const shard_unit *u = &p->units[i];
        long begin, end;
        shard_owned_range(p, u, &begin, &end);
        if (end > begin) params_from_master(unit_param_shard(z, u), unit_master(z, u), end - begin);
    }
    if (z->stage < 3)
        for (int i = 0; i < p->n_units; i++) {
            const shard_unit *u = &p->units[i];
            comm_allgather(z->dp, unit_param_shard(z, u), value_at(z->params, u->full_offset), u->end - u->begin, COMM_VALUES);
        }
}

void zero_params_from_master(zero_state *z) {
    if (!z->master) return;
    const comm_quiet q = comm_quiet_begin(z->dp);
    params_from_masters(z);
    comm_quiet_end(&q);
}

void zero_free(zero_state *z) {
    mem_free(z->params);
    mem_free(z->param_shard);
    mem_free(z->grads);
    mem_free(z->grad_shard);
    mem_free(z->master);
    mem_free(z->adam_m);
    mem_free(z->adam_v);
    shard_plan_free(&z->plan);
    grad_norm_free(&z->norm);
}

/* ---- forward and backward ------------------------------------------------------- */

void zero_forward(zero_state *z, gpt_acts *a) {
    const gpt_layout *g = z->g;
    int L = g->cfg.layers;
    for (int b = -1; b <= L; b++) {
        const void *p = block_params(z, b); /* stage 3: the all-gather happens here */
        int ev = trace_begin("forward", TRACE_COMPUTE, -1, NULL);
        if (b < 0) gpt_embed_forward(g, p, a);
        else if (b < L) gpt_layer_forward(g, p, a, b);
        else gpt_head_forward(g, p, a);
        trace_end(ev);
        if (z->stage == 3) release_unit(z);
    }
}

void zero_backward(zero_state *z, gpt_acts *a, gpt_grad_scratch *s, float dloss) {
    const gpt_layout *g = z->g;
    int L = g->cfg.layers;
    if (z->stage == 1) mem_zero(z->grads, (size_t)z->plan.full_elems * value_bytes());
    for (int b = L; b >= -1; b--) {
        const shard_unit *u = shard_unit_of_block(&z->plan, b);
        long begin, end;
        block_range(g, b, &begin, &end);
        /* stages 2-3: a unit starts with its highest block; the bucket is free
         * again (its last contents were reduce-scattered) and must start at 0,
         * because the kernels accumulate */
        if (z->stage >= 2 && b == u->last_block)
            mem_zero(z->grads, (size_t)(u->chunk * z->plan.ranks) * value_bytes());
        void *grads = value_at(unit_grads(z, u), begin - u->begin);
        /* the embedding's backward needs no weights (it adds the output
         * gradient into the rows of the tokens looked up): no gather for it */
        const void *p = b >= 0 ? block_params(z, b) : NULL;
        int ev = trace_begin("backward", TRACE_COMPUTE, -1, NULL);
        if (b == L) gpt_head_backward(g, p, grads, a, s, dloss);
        else if (b >= 0) gpt_layer_backward(g, p, grads, a, b, s);
        else gpt_embed_backward(g, grads, a, s);
        trace_end(ev);
        if (z->stage == 3) release_unit(z);
        /* the unit's lowest block is done: its gradient is final on this rank,
         * so sum it over the ranks, each keeping its own chunk */
        if (b == u->first_block)
            comm_reduce_scatter(z->dp, unit_grads(z, u), unit_grad_shard(z, u), u->end - u->begin, COMM_VALUES);
    }
}

/* ---- the optimizer step on this rank's chunks ---------------------------------------- */

double zero_optimizer_step(zero_state *z, const adamw_config *cfg, int t, float max_norm) {
    const shard_plan *p = &z->plan;
    int ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    /* The clipping factor needs the norm of the WHOLE gradient: every rank
     * sums the squares of the chunks it owns (never the padding), and the ranks
     * add their sums. Clipping by a shard's own norm would scale each chunk
     * differently and leave lab01's curve. The chunks' squares are summed on
     * the device, one copy for all of them. */
    grad_norm_begin(&z->norm);
    for (int i = 0; i < p->n_units; i++) {
        long begin, end;
        shard_owned_range(p, &p->units[i], &begin, &end);
        if (end > begin) grad_norm_add(&z->norm, 0, unit_grad_shard(z, &p->units[i]), end - begin);
    }
    double sum_squares;
    grad_norm_read(&z->norm, &sum_squares);
    comm_allreduce_host(z->dp, &sum_squares, 1);
    float scale = clip_scale(sum_squares, max_norm);
    for (int i = 0; i < p->n_units; i++) {
        const shard_unit *u = &p->units[i];
        long begin, end;
        shard_owned_range(p, u, &begin, &end);
        if (end > begin)
            adamw_step(z->g, cfg, begin, end, unit_master(z, u), unit_grad_shard(z, u),
                       z->adam_m + u->shard_offset, z->adam_v + u->shard_offset, t, scale);
    }
    trace_end(ev);
    /* bf16: the updated master chunks rounded into the parameters; stages 1-2
     * keep whole parameters: everyone's updated chunks, gathered in place
     * (this rank's chunk already sits at its slot of the full buffer) */
    params_from_masters(z);
    return sqrt(sum_squares);
}
