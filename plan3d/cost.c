#include "cost.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double link_time(double ring_bytes, int latency_steps, double gbs, double us) {
    if (ring_bytes <= 0 && latency_steps <= 0) return 0;
    return latency_steps * us * 1e-6 + (gbs > 0 ? ring_bytes / (gbs * 1e9) : 0);
}

int ep_folds_tp(const layout *l) { return l->sp && l->tp > 1; }
long ep_source_ranks(const layout *l) {
    return (long)(ep_folds_tp(l) ? l->tp : 1) * (l->cp > 1 ? l->cp : 1) * l->dp;
}
int expert_data_ranks(const layout *l) { return (int)(ep_source_ranks(l) / (l->ep > 1 ? l->ep : 1)); }

/* The rules a layout must keep, in the order they are named: 1 and, when buf
 * is not NULL, the first broken rule's text; 0 if the layout can run. */
#define BROKEN(...) (buf ? snprintf(buf, (size_t)len, __VA_ARGS__) : 0, 1)
static int broken_rule(const th_model *m, const cluster *c, const training *tr, const layout *l, char *buf, int len) {
    const int chunks = th_schedule_chunks(l->schedule, l->vp);
    const int cp = l->cp > 1 ? l->cp : 1, ep = l->ep > 1 ? l->ep : 1;
    if ((long)l->tp * cp * l->pp * l->dp != c->gpus)
        return BROKEN("--tp %d x --cp %d x --pp %d x --dp %d = %ld is not --gpus %d", l->tp, cp, l->pp, l->dp,
                      (long)l->tp * cp * l->pp * l->dp, c->gpus);
    if (m->seq % (2L * cp))
        return BROKEN("--cp %d does not divide --seq %ld into 2 x %d chunks (the ring's zig-zag layout)", cp, m->seq, cp);
    if (ep > 1 && m->experts <= 0)
        return BROKEN("--ep %d needs a model with experts (--model mixtral-8x7b or deepseek-v3)", ep);
    if (ep > 1 && m->experts % ep) return BROKEN("--ep %d does not divide the %ld routed experts", ep, m->experts);
    if (ep_source_ranks(l) % ep)
        return ep_folds_tp(l) ? BROKEN("--ep %d does not divide --tp %d x --cp %d x --dp %d (with SP the EP group is "
                                       "carved from the TP x CP x DP ranks)", ep, l->tp, cp, l->dp)
                              : BROKEN("--ep %d does not divide --cp %d x --dp %d (the EP group is carved from the DP x CP "
                                       "ranks; with --tp and --sp on from TP x CP x DP)", ep, cp, l->dp);
    if (m->heads % l->tp)
        return BROKEN("--tp %d does not divide --heads %ld (each TP rank computes whole heads)", l->tp, m->heads);
    if (m->ffn % l->tp)
        return BROKEN("--tp %d does not divide --ffn %ld (the MLP's units are split over the TP ranks)", l->tp, m->ffn);
    if ((long)l->pp * chunks > m->layers + (tr->split_ends ? 2 : 0))
        return BROKEN("--pp %d x %d chunk%s per rank (%s) is more than --layers %ld: every chunk needs a layer", l->pp,
                      chunks, chunks == 1 ? "" : "s", th_schedule_names[l->schedule], m->layers);
    if (l->micro_batch < 1 || tr->global_batch % ((long)l->dp * l->micro_batch))
        return BROKEN("--global-batch %ld is not divisible by --dp %d x --micro-batch %d", tr->global_batch, l->dp,
                      l->micro_batch);
    if (l->schedule == TH_SCHED_INTERLEAVED && l->pp > 1 && l->micro_batches % l->pp)
        return BROKEN("--schedule interleaved needs the micro-batch count B/(d b) = %d to be a multiple of --pp %d",
                      l->micro_batches, l->pp);
    return 0;
}
#undef BROKEN

const char *layout_problem(const th_model *m, const cluster *c, const training *tr, const layout *l, char *buf, int len) {
    buf[0] = 0;
    broken_rule(m, c, tr, l, buf, len);
    return buf;
}

int layout_divides(const th_model *m, const cluster *c, const training *tr, const layout *l) {
    return !broken_rule(m, c, tr, l, NULL, 0);
}

void in_flight_table(th_schedule s, int p, int m, int v, in_flight *table) {
    for (int r = 0; r < p; r++)
        for (int k = 0; k < v; k++) th_chunk_in_flight(s, p, m, v, r, k, &table[r * v + k].acts, &table[r * v + k].wgrads);
}

/* The chunks (contiguous layer runs) of the pipeline, in pipeline order:
 * layers[c] layers each, equal, the last ones one more (lab03's split), or
 * with ends theory's th_stage_layers_ends (the embedding and the head take a
 * layer's place: Llama 3's balanced pipeline). The last stage also runs the
 * head; moving layers off it is not modelled otherwise (the balancing loop
 * plan3d once had never moved a layer: its first comparison was with infinity
 * minus a share of infinity, NaN, so every plan so far has been this equal
 * split). */
static void split_layers(const th_model *m, int n_chunks, int ends, int *layers) {
    const int L = (int)m->layers;
    for (int c = 0; c < n_chunks; c++) {
        int lo, hi;
        if (ends) th_stage_layers_ends(L, n_chunks, c, &lo, &hi);
        else th_stage_layers(L, n_chunks, c, &lo, &hi);
        layers[c] = hi - lo;
    }
}

/* The course's exact formulas apply to its own model in fp32 (theory.h). */
static int course_exact(const th_model *m, const th_opts *o) {
    return th_course_acts_bytes(m, o, 0, 1, 1) >= 0 && o->cp <= 1 && o->ep <= 1 && m->experts <= 0 &&
           !o->recompute_modules; /* the course recomputes whole layers or attention's core only */
}

const char *recompute_modules_text(int modules) {
    static const char *const text[] = {"none", "norm", "act", "norm,act"};
    return text[modules & (TH_RECOMPUTE_NORMS | TH_RECOMPUTE_EXPERT_ACT)];
}

int recompute_modules_parse(const char *text, int *modules) {
    for (int k = 0; k < 4; k++)
        if (!strcmp(text, recompute_modules_text(k))) {
            *modules = k;
            return 0;
        }
    return -1;
}

void estimate_layout(const th_model *m, const cluster *c, const training *tr, const layout *l, const in_flight *table,
                     estimate *e) {
    *e = (estimate){.l = *l};
    const int p = l->pp, t = l->tp, d = l->dp, M = l->micro_batches, v = th_schedule_chunks(l->schedule, l->vp);
    const int cp = l->cp > 1 ? l->cp : 1, ep = l->ep > 1 ? l->ep : 1;
    e->l.cp = cp;
    e->l.ep = ep;
    const int n_chunks = p * v, L = (int)m->layers;
    /* a rank's tokens: its T / cp positions of b sequences */
    const double T = (double)m->seq, C = (double)m->d_model, b = l->micro_batch, tokens = b * T / cp;
    const th_opts o = {.precision = tr->precision, .tp = t, .vocab_parallel = 1, .sequence_parallel = l->sp,
                       .recompute = l->recompute, .cp = cp, .ep = ep,
                       .recompute_modules = l->recompute == RECOMPUTE_FULL ? 0 : tr->recompute_modules};
    th_opts lab = o;
    lab.vocab_parallel = 0; /* the labs replicate embedding and head */
    const int exact = course_exact(m, &lab);
    const th_opts *mo = exact ? &lab : &o;
    const th_params pc = th_param_counts(m);
    /* what a token runs of one layer on a TP rank (its k experts with experts) */
    const double layer_local = pc.layer - pc.layer_sharded + pc.layer_sharded / t;
    const double moe_run = pc.layer_active - pc.layer_sharded + pc.layer_sharded / t;
    const double dense_run = pc.dense_layer - pc.dense_layer_sharded + pc.dense_layer_sharded / t;
    const double head_local = th_stage_params(m, mo, L, L), embed_local = th_stage_params(m, mo, 0, 0);
    const double act_bytes = tr->precision == PREC_BF16 ? 2 : 4;

    /* the compute rate, shared where ranks outnumber cores (the CPU "cluster") */
    double rate = (tr->precision == PREC_BF16 ? c->bf16_tflops : c->fp32_tflops) * 1e12 * c->efficiency;
    if (c->cores > 0 && c->gpus > c->cores) {
        double busy = c->gpus * (1 - th_bubble_unit(l->schedule, p, M, l->vp));
        if (busy > c->cores) rate *= c->cores / busy;
    }
    /* attention's core: each of a rank's queries meets all T keys (over the ring with CP) */
    const double moe_fwd = tokens * 2 * moe_run, dense_fwd = tokens * 2 * dense_run;
    const double attn_fwd = tokens * 4 * T * th_attn_width(m) / t, head_fwd = tokens * 2 * head_local;

    int *layers = malloc(sizeof(int) * (size_t)n_chunks), *first = malloc(sizeof(int) * (size_t)n_chunks);
    if (!layers || !first) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    split_layers(m, n_chunks, tr->split_ends, layers);
    for (int k = 0, at = 0; k < n_chunks; at += layers[k], k++) first[k] = at;

    /* links: TP groups are consecutive ranks, CP groups t apart, DP groups t cp
     * apart, pipeline neighbours t cp d apart (Megatron's numbering, lab06's
     * grid.h); an EP group is ep consecutive ranks of the DP x CP group */
    const int G = c->gpus_per_node;
    const double tp_gbs = t <= G ? c->intra_gbs : c->inter_gbs, tp_us = t <= G ? c->intra_us : c->inter_us;
    const int dp_inside = (long)t * cp * d <= G, pp_inside = (long)t * cp * d * p <= G, cp_inside = (long)t * cp <= G;
    const double act = tokens * C * act_bytes;                 /* one TP collective's buffer */
    const double tp_one = t > 1 ? link_time(comm_ring_factor(COLL_ALLREDUCE, t) * act, 2 * (t - 1), tp_gbs, tp_us) : 0;
    const double msg = act / (t > 1 ? t : 1);                   /* Megatron sends 1/t per TP rank */
    const double pp_one = p > 1 ? link_time(msg, 1, pp_inside ? c->intra_gbs : c->inter_gbs,
                                            pp_inside ? c->intra_us : c->inter_us) : 0;
    /* CP: a TP rank's heads' K and V travel the ring; exposed what the core's compute leaves */
    const long kv_dim = (long)th_kv_width(m), kv_local = kv_dim / t > 0 ? kv_dim / t : 1;
    const th_cp_traffic cpt = th_cp_layer_traffic(TH_CP_RING, cp, (long)b, m->seq, m->d_model, kv_local, act_bytes);
    const double cp_gbs = cp_inside ? c->intra_gbs : c->inter_gbs, cp_us = cp_inside ? c->intra_us : c->inter_us;
    const double cp_fwd = cp > 1 ? fmax(0, link_time(cpt.fwd_sent, cp - 1, cp_gbs, cp_us) - attn_fwd / rate) : 0;
    const double cp_bwd = cp > 1 ? fmax(0, link_time(cpt.bwd_sent, 2 * cp - 1, cp_gbs, cp_us) - 2 * attn_fwd / rate) : 0;
    /* EP: the all-to-alls of a MoE layer; of a rank's ep-1 peers, those in its node take NVLink; the
     * copies between nodes are th_ep_cross_node_copies' (node-limited routing sends a token once to
     * each node it reaches: DeepSeek-V3's preset; so does a per-node dispatcher, DeepEP, without a limit) */
    const double ep_tokens = tokens / (l->sp ? t : 1);
    const th_cp_traffic ept = th_ep_layer_traffic(ep, ep_tokens, m->top_k, m->d_model, act_bytes);
    const int ep_in_node = (int)fmin(ep, fmax(1, ep_folds_tp(l) ? G : G / t)), ep_nodes = ep > 1 ? ep / ep_in_node : 1;
    const double out_share = ep > 1 ? (double)(ep - ep_in_node) / (ep - 1) : 0;
    const long node_limit = m->route_max_nodes > 0 ? m->route_max_nodes : tr->ep_per_node ? ep_nodes : 0;
    const double ep_copies = th_ep_cross_node_copies(m->top_k, node_limit, ep_nodes);
    const double ep_between = ep_tokens * (double)m->d_model * act_bytes * ep_copies; /* one all-to-all */
    const double ep_one = ep > 1 ? fmax(link_time(ep_between, 0, c->inter_gbs, 0),
                                        link_time((1 - out_share) * ept.fwd_sent / 2, 0, c->intra_gbs, 0)) +
                                       (out_share > 0 ? c->inter_us : c->intra_us) * 1e-6 : 0;

    double worst = -1, most_params = 0, most_experts = 0;
    e->mem_limit = c->mem_gib * 1073741824.0 * (1 - tr->headroom);
    for (int r = 0; r < p; r++) {
        int nl = 0, n_moe = 0, has_head = 0;
        double params = 0, experts = 0, acts = 0;
        for (int k = 0; k < v; k++) { /* rank r's chunks, placed as lab04 places them */
            const int st = th_chunk_stage(l->schedule, p, r, k), lo = first[st], hi = lo + layers[st];
            /* the embedding is the first chunk's, the head the last's (with ends an
             * empty first chunk and its neighbour both start at layer 0) */
            const int not_first = lo == 0 && st > 0, not_last = hi == L && st < n_chunks - 1;
            nl += hi - lo;
            n_moe += th_moe_layers(m, lo, hi);
            has_head |= hi == L && !not_last;
            params += th_stage_params(m, mo, lo, hi) - (not_first ? embed_local : 0) - (not_last ? head_local : 0);
            experts += th_stage_expert_params(m, mo, lo, hi);
            /* the chunk's own pool of blocks (lab04's executor): its blocks in flight x their bytes */
            int n_acts, n_wgrads;
            if (table) n_acts = table[r * v + k].acts, n_wgrads = table[r * v + k].wgrads;
            else th_chunk_in_flight(l->schedule, p, M, v, r, k, &n_acts, &n_wgrads);
            acts += n_acts * (exact ? th_course_acts_bytes(m, &lab, lo, hi, (long)b)
                                    : (th_published_acts_bytes(m, &o, lo, hi, (long)b) -
                                       (not_first ? th_published_acts_bytes(m, &o, 0, 0, (long)b) : 0) -
                                       (not_last ? th_published_acts_bytes(m, &o, L, L, (long)b) : 0)) * act_bytes / 2);
            if (exact) acts += n_wgrads * th_course_wgrads_bytes(m, &lab, lo, hi, (long)b);
        }
        /* time of one micro-batch on this rank */
        double fwd = n_moe * moe_fwd + (nl - n_moe) * dense_fwd + (has_head ? head_fwd : 0), core = nl * attn_fwd;
        double tF = (fwd + core) / rate, tB = (fwd + 2 * core) / rate, tW = fwd / rate;
        double tp_calls_fwd = 2.0 * nl, tp_calls_bwd = 2.0 * nl;
        const double ep_exposed = 2.0 * n_moe * ep_one * (1 - tr->ep_overlap);
        double cp_f = nl * cp_fwd, cp_b = nl * cp_bwd, ep_f = ep_exposed, ep_b = ep_exposed;
        if (l->recompute == RECOMPUTE_FULL) { tB += tF; tp_calls_bwd += 2.0 * nl; cp_b += cp_f; ep_b += ep_f; }
        else if (l->recompute == RECOMPUTE_SELECTIVE) tB += core / rate;
        double compute = tF + tB + tW, tp_time = (tp_calls_fwd + tp_calls_bwd) * tp_one, pp_time = 2.0 * v * pp_one;
        tF += tp_calls_fwd * tp_one + v * pp_one + cp_f + ep_f;
        tB += tp_calls_bwd * tp_one + v * pp_one + cp_b + ep_b;
        if (tF + tB + tW > worst) {
            worst = tF + tB + tW;
            e->tF = tF; e->tB = tB; e->tW = tW;
            e->t_compute = M * compute; e->t_tp = M * tp_time; e->t_pp = M * pp_time;
            e->t_cp = M * (cp_f + cp_b); e->t_ep = M * (ep_f + ep_b);
            e->stage_layers_max = nl;
            e->cp_bytes = (double)M * nl * (cpt.fwd_sent + (l->recompute == RECOMPUTE_FULL ? 2 : 1) * cpt.bwd_sent);
            e->ep_bytes = (double)M * n_moe * (ept.fwd_sent + (l->recompute == RECOMPUTE_FULL ? 2 : 1) * ept.bwd_sent);
            e->ep_node_bytes = (double)M * n_moe * ep_between * (l->recompute == RECOMPUTE_FULL ? 6 : 4);
            e->ep_node_copies = ep_copies;
            e->ep_node_limit = node_limit;
            e->ep_node_dispatch = m->route_max_nodes <= 0 && tr->ep_per_node;
        }
        most_params = fmax(most_params, params - experts);
        most_experts = fmax(most_experts, experts);
        /* memory of this rank: the dense parameters' states over the DP x CP
         * group, the experts' over the ranks holding the same experts */
        th_states s = th_model_states(params - experts, mo, tr->zero_stage, d * cp);
        th_states sx = th_model_states(experts, mo, tr->zero_stage, expert_data_ranks(l));
        th_states buf = th_zero_buffers(layer_local, mo, tr->zero_stage);
        double mem[MEM_NCAT] = {s.params + sx.params + buf.params, s.grads + sx.grads + buf.grads, s.optim + sx.optim,
                             acts,
                             r < p - 1 ? act : 0, /* the received gradient of the output (lab03's dout) */
                             exact ? th_course_scratch_bytes(m, &lab, (long)b) : 0};
        double total = 0;
        for (int k = 0; k < MEM_NCAT; k++) total += mem[k];
        if (total > e->mem_total) {
            e->mem_total = total;
            e->fullest_stage = r;
            e->expert_params = experts;
            for (int k = 0; k < MEM_NCAT; k++) e->mem[k] = mem[k];
        }
    }
    free(layers);
    free(first);
    e->fits = e->mem_total <= e->mem_limit;

    double pipe = th_pipeline_step_time(l->schedule, p, M, l->vp, e->tF, e->tB, e->tW);
    e->t_bubble = th_bubble_time(l->schedule, p, M, l->vp, e->tF, e->tB, e->tW);
    /* DP: the gradient of the rank's shard over the DP x CP group (the experts'
     * over the ranks holding the same experts: cp d / ep, t cp d / ep folded);
     * ZeRO 3 gathers the parameters for every micro-batch's forward and backward */
    const double dp_gbs = dp_inside ? c->intra_gbs : c->inter_gbs, dp_us = dp_inside ? c->intra_us : c->inter_us;
    const int dpc = d * cp, edp = expert_data_ranks(l);
    const double grad = th_grad_bytes(tr->precision) * most_params, xgrad = th_grad_bytes(tr->precision) * most_experts;
    e->dp_bytes = comm_ring_factor(COLL_ALLREDUCE, dpc) * grad + comm_ring_factor(COLL_ALLREDUCE, edp) * xgrad;
    double t_dp = (dpc > 1 ? link_time(comm_ring_factor(COLL_ALLREDUCE, dpc) * grad, 2 * (dpc - 1), dp_gbs, dp_us) : 0) +
                  (edp > 1 && xgrad > 0 ? link_time(comm_ring_factor(COLL_ALLREDUCE, edp) * xgrad, 2 * (edp - 1), dp_gbs, dp_us) : 0);
    if (tr->zero_stage >= 3 && dpc > 1) {
        double gather = comm_ring_factor(COLL_ALLGATHER, dpc) * th_param_bytes(tr->precision) * most_params +
                        comm_ring_factor(COLL_ALLGATHER, edp) * th_param_bytes(tr->precision) * most_experts;
        e->dp_bytes += 2.0 * M * gather;
        t_dp += 2.0 * M * link_time(gather, dpc - 1, dp_gbs, dp_us);
    }
    e->t_dp = (1 - tr->dp_overlap) * t_dp;
    double shard = tr->zero_stage >= 1 ? most_params / dpc + most_experts / edp : most_params + most_experts;
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

double model_states_floor(const th_model *m, const training *tr, const layout *l) {
    const int cp = l->cp > 1 ? l->cp : 1, ep = l->ep > 1 ? l->ep : 1, dpc = l->dp * cp;
    /* the experts' states over the most ranks any SP choice of the split gives (a floor) */
    const int edp = (l->tp > 1 && ((long)l->tp * dpc) % ep == 0 ? l->tp : 1) * dpc / ep;
    /* vocab-parallel: the smaller of estimate_layout's two splits of the embedding and head */
    const th_opts o = {.precision = tr->precision, .tp = l->tp, .vocab_parallel = 1, .cp = cp, .ep = ep};
    const int L = (int)m->layers;
    const double experts = th_stage_expert_params(m, &o, 0, L), dense = th_stage_params(m, &o, 0, L) - experts;
    const th_states s = th_model_states(dense / l->pp, &o, tr->zero_stage, dpc);
    const th_states sx = th_model_states(experts / l->pp, &o, tr->zero_stage, edp);
    return s.params + s.grads + s.optim + sx.params + sx.grads + sx.optim;
}
