#include "cost.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

double link_time(double ring_bytes, int latency_steps, double gbs, double us) {
    if (ring_bytes <= 0 && latency_steps <= 0) return 0;
    return latency_steps * us * 1e-6 + (gbs > 0 ? ring_bytes / (gbs * 1e9) : 0);
}

const char *layout_problem(const th_model *m, const cluster *c, const training *tr, const layout *l, char *buf, int len) {
    buf[0] = 0;
    const int chunks = th_schedule_chunks(l->schedule, l->vp);
    if ((long)l->tp * l->pp * l->dp != c->gpus)
        snprintf(buf, len, "--tp %d x --pp %d x --dp %d = %ld is not --gpus %d", l->tp, l->pp, l->dp,
                 (long)l->tp * l->pp * l->dp, c->gpus);
    else if (m->heads % l->tp)
        snprintf(buf, len, "--tp %d does not divide --heads %ld (each TP rank computes whole heads)", l->tp, m->heads);
    else if (m->ffn % l->tp)
        snprintf(buf, len, "--tp %d does not divide --ffn %ld (the MLP's units are split over the TP ranks)", l->tp, m->ffn);
    else if ((long)l->pp * chunks > m->layers)
        snprintf(buf, len, "--pp %d x %d chunk%s per rank (%s) is more than --layers %ld: every chunk needs a layer",
                 l->pp, chunks, chunks == 1 ? "" : "s", th_schedule_names[l->schedule], m->layers);
    else if (l->micro_batch < 1 || tr->global_batch % ((long)l->dp * l->micro_batch))
        snprintf(buf, len, "--global-batch %ld is not divisible by --dp %d x --micro-batch %d", tr->global_batch, l->dp,
                 l->micro_batch);
    else if (l->schedule == TH_SCHED_INTERLEAVED && l->pp > 1 && l->micro_batches % l->pp)
        snprintf(buf, len, "--schedule interleaved needs the micro-batch count B/(d b) = %d to be a multiple of --pp %d",
                 l->micro_batches, l->pp);
    return buf;
}

/* The chunks (contiguous layer runs) of the pipeline, in pipeline order:
 * layers[c] layers each. One chunk per rank is balanced so that the last
 * stage, which also runs the head, is no slower than the others; several
 * chunks per rank split as lab03 does (equal, the last ones one more). */
static void split_layers(const th_model *m, int n_chunks, double layer_cost, double head_cost, int *layers) {
    const int L = (int)m->layers;
    for (int c = 0; c < n_chunks; c++) layers[c] = L / n_chunks + (c >= n_chunks - L % n_chunks);
    if (n_chunks < 2) return;
    double best = INFINITY;
    int best_last = layers[n_chunks - 1];
    for (int last = 1; last <= L - (n_chunks - 1); last++) {
        int rest = L - last, most = (rest + n_chunks - 2) / (n_chunks - 1);
        double cost = fmax(last * layer_cost + head_cost, most * layer_cost);
        if (cost < best - 1e-12 * best) { best = cost; best_last = last; }
    }
    int rest = L - best_last;
    for (int c = 0; c < n_chunks - 1; c++) layers[c] = rest / (n_chunks - 1) + (c >= (n_chunks - 1) - rest % (n_chunks - 1));
    layers[n_chunks - 1] = best_last;
}

/* The course's exact formulas apply to its own model in fp32 (theory.h). */
static int course_exact(const th_model *m, const th_opts *o) {
    return th_course_acts_bytes(m, o, 0, 1, 1) >= 0;
}

void estimate_layout(const th_model *m, const cluster *c, const training *tr, const layout *l, estimate *e) {
    *e = (estimate){.l = *l};
    const int p = l->pp, t = l->tp, d = l->dp, M = l->micro_batches, v = th_schedule_chunks(l->schedule, l->vp);
    const int n_chunks = p * v, L = (int)m->layers;
    const double T = (double)m->seq, C = (double)m->d_model, b = l->micro_batch, tokens = b * T;
    const th_opts o = {.precision = tr->precision, .tp = t, .vocab_parallel = 1, .sequence_parallel = l->sp,
                       .recompute = l->recompute};
    th_opts lab = o;
    lab.vocab_parallel = 0; /* the labs replicate embedding and head */
    const int exact = course_exact(m, &lab);
    const th_opts *mo = exact ? &lab : &o;
    const th_params pc = th_param_counts(m);
    const double layer_local = pc.layer - pc.layer_sharded + pc.layer_sharded / t;
    const double head_local = th_stage_params(m, mo, L, L);
    const double act_bytes = tr->precision == PREC_BF16 ? 2 : 4;

    /* the compute rate, shared where ranks outnumber cores (the CPU "cluster") */
    double rate = (tr->precision == PREC_BF16 ? c->bf16_tflops : c->fp32_tflops) * 1e12 * c->efficiency;
    if (c->cores > 0 && c->gpus > c->cores) {
        double busy = c->gpus * (1 - th_bubble_unit(l->schedule, p, M, l->vp));
        if (busy > c->cores) rate *= c->cores / busy;
    }
    const double layer_fwd = tokens * 2 * layer_local, attn_fwd = tokens * 4 * T * C / t, head_fwd = tokens * 2 * head_local;

    int *layers = malloc(sizeof(int) * (size_t)n_chunks), *first = malloc(sizeof(int) * (size_t)n_chunks);
    if (!layers || !first) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    split_layers(m, n_chunks, layer_fwd + attn_fwd, v == 1 ? head_fwd : 0, layers);
    for (int k = 0, at = 0; k < n_chunks; at += layers[k], k++) first[k] = at;

    /* links: TP groups are consecutive ranks, DP groups t apart, pipeline
     * neighbours t x d apart (Megatron's numbering, lab06's grid.h) */
    const int G = c->gpus_per_node;
    const double tp_gbs = t <= G ? c->intra_gbs : c->inter_gbs, tp_us = t <= G ? c->intra_us : c->inter_us;
    const int dp_inside = (long)t * d <= G, pp_inside = (long)t * d * p <= G;
    const double act = tokens * C * act_bytes;                 /* one TP collective's buffer */
    const double tp_one = t > 1 ? link_time(comm_ring_factor(COLL_ALLREDUCE, t) * act, 2 * (t - 1), tp_gbs, tp_us) : 0;
    const double msg = act / (t > 1 ? t : 1);                   /* Megatron sends 1/t per TP rank */
    const double pp_one = p > 1 ? link_time(msg, 1, pp_inside ? c->intra_gbs : c->inter_gbs,
                                            pp_inside ? c->intra_us : c->inter_us) : 0;

    double worst = -1, most_params = 0;
    e->mem_limit = c->mem_gib * 1073741824.0 * (1 - tr->headroom);
    for (int r = 0; r < p; r++) {
        int nl = 0, has_head = 0;
        double params = 0, acts = 0;
        for (int k = 0; k < v; k++) { /* rank r's chunks, placed as lab04 places them */
            const int st = th_chunk_stage(l->schedule, p, r, k), lo = first[st], hi = lo + layers[st];
            nl += hi - lo;
            has_head |= hi == L;
            params += th_stage_params(m, mo, lo, hi);
            /* the chunk's own pool of blocks (lab04's executor): its blocks in flight x their bytes */
            int n_acts, n_wgrads;
            th_chunk_in_flight(l->schedule, p, M, v, r, k, &n_acts, &n_wgrads);
            acts += n_acts * (exact ? th_course_acts_bytes(m, &lab, lo, hi, (long)b)
                                    : th_published_acts_bytes(m, &o, lo, hi, (long)b) * act_bytes / 2);
            if (exact) acts += n_wgrads * th_course_wgrads_bytes(m, &lab, lo, hi, (long)b);
        }
        /* time of one micro-batch on this rank */
        double fwd = nl * layer_fwd + (has_head ? head_fwd : 0), core = nl * attn_fwd;
        double tF = (fwd + core) / rate, tB = (fwd + 2 * core) / rate, tW = fwd / rate;
        double tp_calls_fwd = 2.0 * nl, tp_calls_bwd = 2.0 * nl;
        if (l->recompute == RECOMPUTE_FULL) { tB += tF; tp_calls_bwd += 2.0 * nl; }
        else if (l->recompute == RECOMPUTE_SELECTIVE) tB += core / rate;
        double compute = tF + tB + tW, tp_time = (tp_calls_fwd + tp_calls_bwd) * tp_one, pp_time = 2.0 * v * pp_one;
        tF += tp_calls_fwd * tp_one + v * pp_one;
        tB += tp_calls_bwd * tp_one + v * pp_one;
        if (tF + tB + tW > worst) {
            worst = tF + tB + tW;
            e->tF = tF; e->tB = tB; e->tW = tW;
            e->t_compute = M * compute; e->t_tp = M * tp_time; e->t_pp = M * pp_time;
            e->stage_layers_max = nl;
        }
        most_params = fmax(most_params, params);
        /* memory of this rank */
        th_states s = th_model_states(params, mo, tr->zero_stage, d);
        th_states buf = th_zero_buffers(layer_local, mo, tr->zero_stage);
        double mem[MEM_NCAT] = {s.params + buf.params, s.grads + buf.grads, s.optim,
                             acts,
                             r < p - 1 ? act : 0, /* the received gradient of the output (lab03's dout) */
                             exact ? th_course_scratch_bytes(m, &lab, (long)b) : 0};
        double total = 0;
        for (int k = 0; k < MEM_NCAT; k++) total += mem[k];
        if (total > e->mem_total) {
            e->mem_total = total;
            e->fullest_stage = r;
            for (int k = 0; k < MEM_NCAT; k++) e->mem[k] = mem[k];
        }
    }
    free(layers);
    free(first);
    e->fits = e->mem_total <= e->mem_limit;

    double pipe = th_pipeline_step_time(l->schedule, p, M, l->vp, e->tF, e->tB, e->tW);
    e->t_bubble = th_bubble_time(l->schedule, p, M, l->vp, e->tF, e->tB, e->tW);
    /* DP: the gradient of the rank's shard; ZeRO 3 gathers the parameters for
     * every micro-batch's forward and backward */
    const double dp_gbs = dp_inside ? c->intra_gbs : c->inter_gbs, dp_us = dp_inside ? c->intra_us : c->inter_us;
    const double grad = th_grad_bytes(tr->precision) * most_params;
    e->dp_bytes = comm_ring_factor(COLL_ALLREDUCE, d) * grad;
    double t_dp = d > 1 ? link_time(e->dp_bytes, 2 * (d - 1), dp_gbs, dp_us) : 0;
    if (tr->zero_stage >= 3 && d > 1) {
        double gather = comm_ring_factor(COLL_ALLGATHER, d) * th_param_bytes(tr->precision) * most_params;
        e->dp_bytes += 2.0 * M * gather;
        t_dp += 2.0 * M * link_time(gather, d - 1, dp_gbs, dp_us);
    }
    e->t_dp = (1 - tr->dp_overlap) * t_dp;
    double shard = most_params / (tr->zero_stage >= 1 ? d : 1);
    e->t_optim = c->hbm_gbs > 0 ? 28.0 * shard / (c->hbm_gbs * 1e9) : 0;
    e->t_step = pipe + e->t_dp + e->t_optim;
    e->tp_bytes = M * (l->recompute == RECOMPUTE_FULL ? 6.0 : 4.0) * e->stage_layers_max *
                  (t > 1 ? comm_ring_factor(COLL_ALLREDUCE, t) * act : 0);
    e->pp_bytes = p > 1 ? M * 2.0 * 2 * v * msg : 0;

    const double step_tokens = (double)tr->global_batch * T;
    e->tokens_per_s = step_tokens / e->t_step;
    e->model_flops = th_flops_per_token(m) * step_tokens;
    e->hw_flops = e->model_flops + th_recompute_flops_per_token(m, l->recompute) * step_tokens;
    double peak = (tr->precision == PREC_BF16 ? c->bf16_tflops : c->fp32_tflops) * 1e12;
    e->mfu = peak > 0 ? e->model_flops / (e->t_step * c->gpus * peak) : 0;
}
