/* A lab run predicted from its flags (predict.h): theory.h's formulas put
 * together as each lab allocates and communicates. */
#include "predict.h"
#include <math.h>
#include <stdlib.h>


static void count(th_rank_need *x, comm_kind k, double calls, double each, int group) {
    x->calls[k] += calls;
    x->payload[k] += calls * each;
    x->ring[k] += calls * each * comm_ring_factor(k, group);
}

static void add_traffic(th_rank_need *x, comm_kind k, th_traffic t, int group) {
    if (t.calls > 0) count(x, k, t.calls, t.payload / t.calls, group);
}

/* Bytes of one of the model's values (activations, gradients, messages): 4, or 2 in bf16. */
static double value_bytes_of(const th_run *r) { return r->bf16 ? 2.0 : 4.0; }

/* Model states, activations (in flight x one micro-batch), the received
 * gradient and the scratch of one rank holding `params` parameters of layers
 * [lo, hi) at TP degree t, on model m (lab09: a CP rank's T/c positions). */
static void rank_memory_on(th_rank_need *x, const th_run *r, const th_model *m, int t, int receives_grad) {
    const th_opts o = th_opts_run(t, r->sequence_parallel && t > 1, r->recompute, r->bf16);
    const th_states s = th_model_states(x->params, &o, 0, 1);
    x->mem[MEM_PARAMS] = s.params;
    x->mem[MEM_GRADS] = s.grads;
    x->mem[MEM_OPTIM] = s.optim;
    x->mem[MEM_ACTS] = x->acts_in_flight * th_course_acts_bytes(m, &o, x->lo, x->hi, x->rows);
    /* lab03's stage keeps the gradient it receives from the next stage */
    x->mem[MEM_COMM] = receives_grad ? value_bytes_of(r) * x->rows * m->seq * m->d_model : 0;
    /* TP layers under sequence parallelism: the staging of the partial gradients' all-reduce */
    if (r->tensor_parallel && o.sequence_parallel)
        x->mem[MEM_COMM] = value_bytes_of(r) * th_sp_partial_params(m, 0, (int)m->layers);
    /* lab04's executor keeps a pool of message buffers whose size its lists decide */
    if (r->schedule) x->mem[MEM_COMM] = -1;
    /* the gradient-norm sums on the device: TP's two parts (replicated, sharded; lab09's experts: replicated,
     * experts, and at t > 1 TP-sharded), else ZeRO's one (the shard) */
    const int norm_parts = r->tensor_parallel ? (r->ep > 0 && t > 1 ? 3 : 2) : r->zero_stage > 0 ? 1 : 0;
    x->mem[MEM_WORKSPACE] = th_course_scratch_bytes(m, &o, x->rows) + th_grad_norm_bytes(norm_parts);
    /* On CUDA the kernels add their own scratch (partial sums, and the
     * embedding backward's sort buffers, whose size cub decides at run time). */
    if (r->cuda) x->mem[MEM_WORKSPACE] = -1;
}

static void rank_memory(th_rank_need *x, const th_run *r, int t, int receives_grad) {
    rank_memory_on(x, r, &r->model, t, receives_grad);
}

/* lab01 and lab02: every rank the whole model on B/N rows (lab01's --grad-accum:
 * K micro-batches of B/(N K) rows, their gradients added before the one
 * all-reduce, so only the rows held at once shrink); ZeRO shards the model
 * states over the N ranks. */
static void predict_data_parallel(const th_run *r, th_rank_need *need) {
    const int N = r->ranks, zero = r->zero_stage, accum = r->grad_accum > 1 ? r->grad_accum : 1;
    const th_opts opts = th_opts_precision(1, r->bf16);
    const double vb = value_bytes_of(r);
    const th_params counts = th_param_counts(&r->model);
    const double psi = counts.total, full = r->full_elems, largest = r->largest_unit_elems;
    const int units = r->units;
    for (int q = 0; q < N; q++) {
        th_rank_need *x = &need[q];
        *x = (th_rank_need){.dp = q, .lo = 0, .hi = (int)r->model.layers, .rows = r->batch / N / accum, .params = psi,
                            .acts_in_flight = 1};
        rank_memory(x, r, 1, 0);
        if (zero) { /* the padded buffers, sharded as the stage shards them, and the unit buffers */
            const th_states s = th_model_states(full, &opts, zero, N), b = th_zero_buffers(largest, &opts, zero);
            x->mem[MEM_PARAMS] = s.params + b.params;
            x->mem[MEM_GRADS] = s.grads + b.grads;
            x->mem[MEM_OPTIM] = s.optim;
            if (N == 1) continue; /* a group of one counts no traffic */
            count(x, COLL_REDUCE_SCATTER, units, vb * full / units, N);
            if (zero < 3) count(x, COLL_ALLGATHER, units, vb * full / units, N);
            else { /* each unit gathered for the forward, again for the backward but the embedding's */
                x->calls[COLL_ALLGATHER] += 2 * units - 1;
                x->payload[COLL_ALLGATHER] += vb * (2 * full - r->embed_unit_elems);
                x->ring[COLL_ALLGATHER] += vb * (2 * full - r->embed_unit_elems) * comm_ring_factor(COLL_ALLGATHER, N);
            }
        } else if (N > 1) { /* a group of one counts no traffic */
            add_traffic(x, COLL_ALLREDUCE, th_dp_traffic(vb * psi, N, units > 0 ? units : 1), N);
            if (units <= 0) x->calls[COLL_ALLREDUCE] = -1; /* buckets: as many calls as the backward fills */
        }
    }
}

/* lab03, lab04, lab05, lab06: a t x p x d grid (lab03/04: p = ranks; lab05: t = ranks).
 * A pipeline rank holds v chunks (virtual stages th_chunk_stage(.., c), layers
 * th_stage_layers(L, p v, stage)); each chunk keeps its own activation blocks
 * (th_chunk_in_flight) and, where the backward is split, its weight-gradient
 * inputs; a boundary between chunks of one rank is a copy, not a message. */
static void predict_grid(const th_run *r, th_rank_need *need) {
    const int t = r->tp, p = r->pp, d = r->dp, m = r->micro_batches > 0 ? r->micro_batches : 1;
    const th_schedule s = (th_schedule)th_schedule_parse(r->schedule ? r->schedule : "gpipe");
    const int v = s == TH_SCHED_ZB_V ? 2 : s == TH_SCHED_INTERLEAVED ? (r->chunks > 0 ? r->chunks : 2) : 1;
    const int S = p * v, L = (int)r->model.layers, sp = r->sequence_parallel && t > 1;
    /* lab09: c CP ranks split each sequence; the c x d ranks of a (tp, pp) are the replicas */
    const int cp = r->cp > 1 ? r->cp : 1, replicas = cp * d;
    const th_cp_algo algo = (th_cp_algo)r->cp_algo;
    th_model local = r->model; /* what a rank's blocks hold: T/c positions of every row */
    local.seq = r->model.seq / cp;
    const long rows = r->batch / ((long)d * m);
    const double act = value_bytes_of(r) * rows * local.seq * r->model.d_model; /* one activation, or its gradient */
    th_opts o = th_opts_run(t, sp, r->recompute, r->bf16);
    o.ep = r->ep; /* lab09's experts: a rank holds E/e of each layer's (th_stage_params) */
    const double msg = sp ? act / t : act; /* SP: a stage message carries a TP rank's T/t positions */
    /* lab09's experts: the rows an EP rank's experts receive in a layer, the capacity's bound (-1: none), from
     * each source's positions of a sequence (beside TP, SP's T/(c t)) */
    const int tp_experts = r->ep > 0 && t > 1;
    const double ep_received = r->ep > 0 && r->capacity_factor > 0
        ? th_ep_received_rows_bound_over(rows, local.seq / (tp_experts ? t : 1), r->model.seq, (int)r->model.top_k, (int)r->model.experts,
                                         r->ep, r->capacity_factor) : -1;
    /* CP's exchanges per layer and micro-batch (theory/context.c), of K|V blocks of the rank's heads */
    double cp_calls[COLL_NKINDS], cp_payload[COLL_NKINDS];
    th_cp_layer_calls(algo, cp, 2.0 * act / t, r->recompute ? 2 : 1, cp_calls, cp_payload);
    for (int q = 0; q < r->ranks; q++) {
        th_rank_need *x = &need[q];
        const int pp = q / (t * replicas); /* rank = tp + t (cp + c (dp + d pp)): common/mesh.h */
        double params = 0, acts = 0, in_flight = 0, ep_acts = 0;
        int layers = 0, moe_layers = 0, links = 0, lo = 0, hi = L;
        for (int c = 0; c < v; c++) {
            const int st = th_chunk_stage(s, p, pp, c);
            int clo, chi, a = 0, w = 0;
            th_stage_layers(L, S, st, &clo, &chi);
            th_chunk_in_flight(s, p, m, v, pp, c, &a, &w);
            params += th_stage_params(&r->model, &o, clo, chi);
            const double block = cp > 1 ? th_cp_stage_acts_bytes(&r->model, &o, clo, chi, rows, cp, algo)
                                        : th_course_acts_bytes(&r->model, &o, clo, chi, rows);
            acts += a * block;
            if (w > 0) acts += w * th_course_wgrads_bytes(&local, &o, clo, chi, rows);
            /* lab09's experts: the same block with lab08's MLP (on the rank's T/c positions under CP) */
            if (r->ep > 0) ep_acts += a * (block + th_ep_acts_change_bytes(&local, &o, clo, chi, rows, ep_received));
            moe_layers += th_moe_layers(&r->model, clo, chi);
            in_flight += (double)a / v;
            layers += chi - clo;
            for (int nb = st - 1; nb <= st + 1; nb += 2) {
                int nb_rank = pp, nb_chunk;
                if (nb >= 0 && nb < S) th_stage_place(s, p, nb, &nb_rank, &nb_chunk);
                links += nb_rank != pp;
            }
            if (c == 0) lo = clo, hi = chi;
        }
        *x = (th_rank_need){.tp = q % t, .cp = q / t % cp, .dp = q / (t * cp) % d, .pp = pp, .lo = lo, .hi = hi, .rows = rows,
                            .params = params, .acts_in_flight = in_flight};
        rank_memory_on(x, r, &local, t, pp < p - 1);
        x->mem[MEM_ACTS] = acts;
        /* each chunk is a lab03 stage with its own scratch; CP's with att slots, and its hook's buffers once */
        if (x->mem[MEM_WORKSPACE] >= 0 && cp > 1)
            x->mem[MEM_WORKSPACE] += v * th_cp_scratch_bytes(&r->model, &o, rows, cp, algo) -
                                     th_course_scratch_bytes(&local, &o, rows) +
                                     th_cp_hooks_bytes(&r->model, &o, rows, cp, algo);
        else if (x->mem[MEM_WORKSPACE] >= 0)
            x->mem[MEM_WORKSPACE] += (v - 1) * th_course_scratch_bytes(&r->model, &o, rows);
        if (r->ep > 0 && ep_received >= 0 && r->recompute != RECOMPUTE_FULL) {
            /* lab09's experts with a capacity: each block in flight claims lab08's received-row buffers at the
             * capacity's bound, every chunk's layers keep lab01's scratch but the slots' pieces, and the hook's
             * backward scratch is one set (comm: lab04's message pool, not predicted) */
            x->mem[MEM_ACTS] = ep_acts;
            if (x->mem[MEM_WORKSPACE] >= 0) /* each chunk's lab01 scratch is counted above: less the slots' */
                x->mem[MEM_WORKSPACE] += v * (th_ep_scratch_bytes(&local, &o, rows) -
                                              th_course_scratch_bytes(&local, &o, rows)) +
                                         th_ep_hook_scratch_bytes(&r->model, &o, ep_received);
        } else if (r->ep > 0) { /* without one the routing sizes them (or --recompute full's claims): not yet */
            x->mem[MEM_ACTS] = x->mem[MEM_COMM] = x->mem[MEM_WORKSPACE] = -1;
        }
        if (v > 1) x->lo = x->hi = -1; /* not one run of layers */
        const th_traffic pipe = th_pp_traffic(links, m, 1, msg); /* sends and receives together */
        count(x, COLL_SEND, pipe.calls / 2, msg, 2);
        count(x, COLL_RECV, pipe.calls / 2, msg, 2);
        /* 4 per layer and micro-batch, 6 under --recompute full; SP: each an all-gather and a reduce-scatter,
         * and one all-reduce per chunk of the partial gradients */
        /* lab09's experts beside TP: the MLP runs on each rank's own positions, SP's collectives around
         * attention alone, and the replicated tensors' partial gradients summed with the stage's (below) */
        const double tp_calls = th_tp_traffic_run(layers, m, act, &o).calls / (tp_experts ? 2 : 1);
        if (sp) {
            count(x, COLL_ALLGATHER, tp_calls / 2, act, t);
            count(x, COLL_REDUCE_SCATTER, tp_calls / 2, act, t);
            for (int c = 0; c < v && !tp_experts; c++) {
                int clo, chi;
                th_stage_layers(L, S, th_chunk_stage(s, p, pp, c), &clo, &chi);
                count(x, COLL_ALLREDUCE, 1, value_bytes_of(r) * th_sp_partial_params(&r->model, clo, chi), t);
            }
        } else if (t > 1) {
            count(x, COLL_ALLREDUCE, tp_calls, act, t);
        }
        for (int k = 0; k < TH_PREDICTED_KINDS; k++) /* CP: every layer of the rank's chunks, every micro-batch */
            if (cp_calls[k] > 0)
                count(x, (comm_kind)k, (double)layers * m * cp_calls[k], cp_payload[k] / cp_calls[k], cp);
        /* the routing of each MoE layer's forward sees whole sequences, over the ranks holding their
         * positions: the CP group, at t > 1 (SP) the t x c ranks */
        const int sequence_ranks = cp * (tp_experts ? t : 1);
        if (r->ep > 0 && sequence_ranks > 1) {
            const double forwards = r->recompute == RECOMPUTE_FULL ? 2 : 1, routed = forwards * moe_layers * m;
            double each[2];
            th_ep_routing_gathers(routed, sequence_ranks, (double)rows * local.seq / (tp_experts ? t : 1),
                                  r->model.experts, r->model.top_k, each);
            count(x, COLL_ALLGATHER, routed, each[0], sequence_ranks);
            count(x, COLL_ALLGATHER, routed, each[1], sequence_ranks);
        }
        if (r->ep > 0) { /* lab09's experts: replicated runs summed over the stage, experts over EDP, TP shards
                          * over the replicas (lab09_5d/experts.h) */
            const int stage = t * replicas, edp = stage / r->ep;
            const int groups[TH_EP_KINDS] = {stage, edp, replicas};
            double elems[TH_EP_KINDS] = {0, 0, 0}; /* the rank's elements of each kind */
            for (int c = 0; c < v; c++) {
                int clo, chi;
                th_stage_layers(L, S, th_chunk_stage(s, p, pp, c), &clo, &chi);
                if (r->zero_stage) {
                    th_ep_stage_elements(&r->model, &o, clo, chi, elems);
                    continue;
                }
                th_traffic sums[TH_EP_KINDS];
                th_ep_grad_sums(&r->model, &o, clo, chi, value_bytes_of(r), stage, edp, replicas, sums);
                for (int k = 0; k < TH_EP_KINDS; k++) add_traffic(x, COLL_ALLREDUCE, sums[k], groups[k]);
            }
            if (r->zero_stage == 1) {
                /* ZeRO-1 (lab09_5d/experts.h): each kind packed and cut into slices over its group (ceil(n/g)
                 * elements), the optimizer state of the slices, a reduce-scatter and an all-gather of each
                 * packed buffer (staging, workspace); bf16: the whole fp32 weights once, at set-up, before
                 * the hook's backward scratch exists (lab08 sizes it at the first backward) */
                double kept = 0, staging = 0;
                for (int k = 0; k < TH_EP_KINDS; k++) {
                    if (elems[k] <= 0) continue; /* t = 1: no TP-sharded runs */
                    double slice;
                    const th_traffic z = th_ep_zero_traffic(elems[k], groups[k], value_bytes_of(r), &slice);
                    kept += slice;
                    staging += value_bytes_of(r) * slice * groups[k];
                    if (z.calls > 0) { /* as many bytes each way */
                        count(x, COLL_REDUCE_SCATTER, 1, z.payload / 2, groups[k]);
                        count(x, COLL_ALLGATHER, 1, z.payload / 2, groups[k]);
                    }
                }
                x->mem[MEM_OPTIM] = th_optim_bytes(r->bf16 ? PREC_BF16 : PREC_FP32) * kept;
                const double hook = ep_received >= 0 ? th_ep_hook_scratch_bytes(&r->model, &o, ep_received) : 0;
                if (x->mem[MEM_WORKSPACE] >= 0)
                    x->mem[MEM_WORKSPACE] += staging + (r->bf16 ? fmax(0, 4 * x->params - hook) : 0);
            }
        } else if (r->zero_stage == 1 && replicas > 1) {
            /* lab06's ZeRO-1: params and grads padded to d slices (lab09: c x d) of comm_chunk
             * elements, the optimizer state one slice (th_model_states), a
             * reduce-scatter and an all-gather of the padded buffer; in bf16
             * the whole fp32 weights exist once, at set-up, in workspace */
            const double padded = ceil(x->params / replicas) * replicas;
            const th_opts po = th_opts_precision(t, r->bf16);
            const th_states st = th_model_states(padded, &po, 1, replicas);
            x->mem[MEM_PARAMS] = st.params;
            x->mem[MEM_GRADS] = st.grads;
            x->mem[MEM_OPTIM] = st.optim;
            if (r->bf16 && x->mem[MEM_WORKSPACE] >= 0) x->mem[MEM_WORKSPACE] += 4 * x->params;
            count(x, COLL_REDUCE_SCATTER, 1, value_bytes_of(r) * padded, replicas);
            count(x, COLL_ALLGATHER, 1, value_bytes_of(r) * padded, replicas);
        } else add_traffic(x, COLL_ALLREDUCE, th_dp_traffic(value_bytes_of(r) * x->params, replicas, 1), replicas);
    }
}

int th_predict_run(const th_run *r, th_rank_need *need) {
    /* context-parallel layers (lab07) and expert-parallel MLPs (lab08) have
     * their own parts; data parallelism alone (lab01, lab02; a one-stage lab03
     * is the same run) has units and ZeRO's shards; anything with stages, a
     * schedule or TP layers is a grid */
    if (r->cp > 0 && !r->tensor_parallel) th_cp_predict(r, need); /* lab09's CP runs in a grid */
    else if (r->ep > 0 && !r->tensor_parallel) th_ep_predict(r, need); /* lab09's EP too */
    else if (r->pp == 1 && !r->schedule && !r->tensor_parallel) predict_data_parallel(r, need);
    else predict_grid(r, need);
    return 0;
}

static double rank_sum_bytes(const th_rank_need *x) {
    double total = 0;
    for (int k = 0; k < MEM_NCAT; k++) total = x->mem[k] < 0 || total < 0 ? -1 : total + x->mem[k];
    return total;
}

double th_predicted_peak_bytes(const th_run *r) {
    th_rank_need *need = calloc((size_t)r->ranks, sizeof *need);
    if (!need) return -1;
    th_predict_run(r, need);
    double peak = 0;
    for (int q = 0; q < r->ranks && peak >= 0; q++) {
        const double total = rank_sum_bytes(&need[q]);
        peak = total < 0 ? -1 : fmax(peak, total);
    }
    free(need);
    return peak;
}

static double predicted_ring_bytes(const th_run *r, const th_rank_need *need) {
    double total = 0;
    for (int k = 0; k < TH_PREDICTED_KINDS; k++) {
        double busiest = 0;
        for (int q = 0; q < r->ranks; q++) {
            if (need[q].ring[k] < 0) return -1; /* calls may be unknown where the bytes are not */
            busiest = fmax(busiest, need[q].ring[k]);
        }
        total += busiest;
    }
    return total;
}

/* ---- --dry-run's tables ------------------------------------------------------------------ */

static void print_bytes(FILE *f, double x) {
    if (x < 0) fprintf(f, " %12s", "?");
    else fprintf(f, " %12.0f", x);
}

static double print_needs(FILE *f, const th_run *r, const th_rank_need *need, int max_rows) {
    const int R = r->ranks;
    fprintf(f, "needs of the run by theory/'s formulas (theory/predict.h), rank by rank:\n");
    fprintf(f, "  memory per rank, bytes (the peak per category the allocator will count; ? not predicted):\n");
    const int with_cp = r->cp > 1 && r->tensor_parallel; /* lab09's grid: the CP coordinate too */
    fprintf(f, with_cp ? "    rank  tp cp pp dp  layers  " : "    rank  tp pp dp  layers  ");
    for (int k = 0; k < MEM_NCAT; k++) fprintf(f, " %12s", mem_category_names[k]);
    fprintf(f, " %12s\n", "sum");
    double max[MEM_NCAT + 1] = {0};
    for (int q = 0; q < R; q++) {
        const th_rank_need *x = &need[q];
        const double total = rank_sum_bytes(x);
        for (int k = 0; k < MEM_NCAT; k++) {
            max[k] = x->mem[k] < 0 || max[k] < 0 ? -1 : fmax(max[k], x->mem[k]);
        }
        /* the sum of the categories' peaks: the allocator's peak of the total is at most this */
        max[MEM_NCAT] = total < 0 || max[MEM_NCAT] < 0 ? -1 : fmax(max[MEM_NCAT], total);
        if (q >= max_rows) continue;
        char layers[24] = "?";
        if (x->lo >= 0) snprintf(layers, sizeof layers, "[%d,%d)", x->lo, x->hi);
        if (with_cp) fprintf(f, "    %4d  %2d %2d %2d %2d  %-8s", q, x->tp, x->cp, x->pp, x->dp, layers);
        else fprintf(f, "    %4d  %2d %2d %2d  %-8s", q, x->tp, x->pp, x->dp, layers);
        for (int k = 0; k < MEM_NCAT; k++) print_bytes(f, x->mem[k]);
        print_bytes(f, total);
        fprintf(f, "\n");
    }
    if (R > max_rows) fprintf(f, "    ... (%d more ranks)\n", R - max_rows);
    fprintf(f, with_cp ? "    max over ranks           " : "    max over ranks        ");
    for (int k = 0; k <= MEM_NCAT; k++) print_bytes(f, max[k]);
    fprintf(f, "\n");

    fprintf(f, "  traffic per rank per step (calls x payload bytes, by kind):\n");
    int shown = 0;
    for (int q = 0; q < R && shown < max_rows; q++, shown++) {
        fprintf(f, "    %4d ", q);
        int any = 0;
        for (int k = 0; k < TH_PREDICTED_KINDS; k++) {
            const th_rank_need *x = &need[q];
            if (x->calls[k] == 0 && x->payload[k] == 0) continue;
            any = 1;
            if (x->payload[k] < 0) fprintf(f, " | %s ? (not predicted)", comm_kind_names[k]);
            else if (x->calls[k] < 0) fprintf(f, " | %s ? calls, payload %.0f", comm_kind_names[k], x->payload[k]);
            else fprintf(f, " | %s %g calls, payload %.0f", comm_kind_names[k], x->calls[k], x->payload[k]);
        }
        fprintf(f, "%s\n", any ? "" : " | none");
    }
    if (R > max_rows) fprintf(f, "    ... (%d more ranks)\n", R - max_rows);
    const double ring = predicted_ring_bytes(r, need);
    if (ring >= 0) fprintf(f, "  ring traffic of the busiest rank per step: %.0f bytes (per kind, the maximum over ranks, summed)\n", ring);
    else fprintf(f, "  ring traffic of the busiest rank per step: not predicted\n");
    if (r->model.experts > 0 && r->ep == 0) /* lab08 (ep > 0) says what its routing decides itself */
        fprintf(f, "  experts: %ld per layer, top-%ld, in every figure (all experts' and the router's parameters; the "
                "k N slots' buffers and the router's state, fixed by the batch: exact whatever the routing and "
                "--capacity-factor)\n", r->model.experts, r->model.top_k);
    return ring;
}

double th_print_prediction(FILE *f, const th_run *r, int max_rows) {
    th_rank_need *need = calloc((size_t)r->ranks, sizeof *need);
    if (!need) return -1;
    th_predict_run(r, need);
    const double ring = print_needs(f, r, need, max_rows);
    free(need);
    return ring;
}

/* The peak grows with T (every category's bytes do, the positional embedding
 * among the model states): doubling finds a T over the cap, halving the gap
 * finds the last one under it. T stays an int (the labs' --seq). */
long th_cp_max_seq(const th_run *r, long step, double cap_bytes) {
    th_run at = *r;
    const long most = 0x7fffffffL / step; /* in steps */
    long fits = 0, over = 1;
    for (;;) {
        at.model.seq = over * step;
        const double peak = th_predicted_peak_bytes(&at);
        if (peak < 0) return -1;
        if (peak > cap_bytes) break;
        fits = over;
        if (over > most / 2) return fits * step; /* the cap is not reached by any int T */
        over *= 2;
    }
    while (over - fits > 1) {
        const long mid = fits + (over - fits) / 2;
        at.model.seq = mid * step;
        if (th_predicted_peak_bytes(&at) <= cap_bytes) fits = mid;
        else over = mid;
    }
    return fits * step;
}
