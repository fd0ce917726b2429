/* Bytes per collective (theory.h). */
#include "theory.h"
#include <math.h>

th_traffic th_dp_traffic(double grad_bytes, int dp, int calls) {
    if (dp <= 1) return (th_traffic){0, 0, 0};
    return (th_traffic){calls, grad_bytes, comm_ring_factor(COLL_ALLREDUCE, dp) * grad_bytes};
}

th_traffic th_zero_traffic(double psi_bytes, int dp, int zero_stage) {
    const double passes = zero_stage >= 3 ? 3 : 2; /* reduce-scatter once, all-gather once or twice */
    return (th_traffic){0, passes * psi_bytes, passes * comm_ring_factor(COLL_REDUCE_SCATTER, dp) * psi_bytes};
}

th_traffic th_tp_traffic(int layers, int micro_batches, int tp, double act_bytes, int sequence_parallel) {
    if (tp <= 1) return (th_traffic){0, 0, 0};
    const double allreduces = 4.0 * layers * micro_batches;
    if (sequence_parallel)
        return (th_traffic){2 * allreduces, 2 * allreduces * act_bytes,
                            2 * allreduces * comm_ring_factor(COLL_ALLGATHER, tp) * act_bytes};
    return (th_traffic){allreduces, allreduces * act_bytes, allreduces * comm_ring_factor(COLL_ALLREDUCE, tp) * act_bytes};
}

th_traffic th_tp_traffic_run(int layers, int micro_batches, double act_bytes, const th_opts *o) {
    th_traffic t = th_tp_traffic(layers, micro_batches, o->tp, act_bytes, o->sequence_parallel);
    const double again = o->recompute == RECOMPUTE_FULL ? 1.5 : 1; /* the 2 forward ones of 4, again */
    return (th_traffic){again * t.calls, again * t.payload, again * t.ring};
}

th_traffic th_pp_traffic(int boundaries, int micro_batches, int chunks, double act_bytes) {
    const double messages = 2.0 * boundaries * micro_batches * (chunks > 0 ? chunks : 1);
    return (th_traffic){messages, messages * act_bytes, messages * act_bytes};
}

th_cp_traffic th_ep_layer_traffic(int N, double tokens, long top_k, long d_model, double value_bytes) {
    th_cp_traffic t = {0, 0, 0, 0};
    if (N <= 1) return t;
    /* dispatch and combine, each k copies of every token's d_model values, (N-1)/N of them to other ranks */
    const double one = (double)top_k * tokens * (double)d_model * value_bytes * (N - 1) / N;
    t.fwd_sent = t.fwd_recv = t.bwd_sent = t.bwd_recv = 2 * one;
    return t;
}

th_traffic th_ep_routing_gathers(double routed, int cp, double tokens, long experts, long top_k, double each[2]) {
    each[0] = 4.0 * cp * tokens * (double)experts; /* fp32 probabilities */
    each[1] = 4.0 * cp * tokens * (double)top_k;   /* int32 choices */
    if (cp <= 1) return (th_traffic){0, 0, 0};
    const double payload = routed * (each[0] + each[1]);
    return (th_traffic){2 * routed, payload, comm_ring_factor(COLL_ALLGATHER, cp) * payload};
}

void th_ep_stage_elements(const th_model *m, const th_opts *o, int lo, int hi, double elems[TH_EP_KINDS]) {
    const double experts = th_stage_expert_params(m, o, lo, hi);
    const th_params p = th_param_counts(m);
    const int moe = th_moe_layers(m, lo, hi), t = o->tp > 1 ? o->tp : 1;
    const double sharded = t > 1 ? (moe * p.layer_sharded + (hi - lo - moe) * p.dense_layer_sharded) / t : 0;
    elems[TH_EP_REPLICATED] += th_stage_params(m, o, lo, hi) - experts - sharded;
    elems[TH_EP_EXPERTS] += experts;
    elems[TH_EP_TP_SHARDED] += sharded;
}

void th_ep_grad_sums(const th_model *m, const th_opts *o, int lo, int hi, double value_bytes, int stage, int edp,
                     int replicas, th_traffic sums[TH_EP_KINDS]) {
    double elems[TH_EP_KINDS] = {0, 0, 0};
    th_ep_stage_elements(m, o, lo, hi, elems);
    const int tp = o->tp > 1, layers = hi - lo;
    /* embedding, a layer's replicated runs (attention part | router; at t > 1 LayerNorm | bias and LayerNorm |
     * router), head */
    const double runs = (lo == 0) + (tp ? 3.0 : 2.0) * layers + (hi == m->layers);
    const th_traffic none = {0, 0, 0};
    sums[TH_EP_REPLICATED] = th_dp_traffic(value_bytes * elems[TH_EP_REPLICATED], stage, (int)runs);
    sums[TH_EP_EXPERTS] = layers > 0 ? th_dp_traffic(value_bytes * elems[TH_EP_EXPERTS], edp, 4 * layers) : none;
    sums[TH_EP_TP_SHARDED] = tp && layers > 0 ? th_dp_traffic(value_bytes * elems[TH_EP_TP_SHARDED], replicas, layers)
                                              : none;
}

th_traffic th_ep_zero_traffic(double elems, int group, double value_bytes, double *slice) {
    *slice = ceil(elems / group);
    if (group < 2) return (th_traffic){0, 0, 0};
    th_traffic t = th_zero_traffic(value_bytes * *slice * group, group, 1);
    t.calls = 2;
    return t;
}

double th_ep_alltoall_calls(double passes, int forwards) { return passes * (3.0 * forwards + 2.0); }
