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

void th_ep_stage_elements(const th_model *m, const th_opts *o, int lo, int hi, double elems[2]) {
    const double experts = th_stage_expert_params(m, o, lo, hi);
    elems[0] += th_stage_params(m, o, lo, hi) - experts;
    elems[1] += experts;
}

void th_ep_grad_sums(const th_model *m, const th_opts *o, int lo, int hi, double value_bytes, int replicas, int edp,
                     th_traffic *replicated, th_traffic *experts) {
    double elems[2] = {0, 0};
    th_ep_stage_elements(m, o, lo, hi, elems);
    const double runs = (lo == 0) + 2.0 * (hi - lo) + (hi == m->layers); /* embedding, attention|router a layer, head */
    *replicated = th_dp_traffic(value_bytes * elems[0], replicas, (int)runs);
    *experts = hi > lo ? th_dp_traffic(value_bytes * elems[1], edp, 4 * (hi - lo)) : (th_traffic){0, 0, 0};
}

th_traffic th_ep_zero_traffic(double elems, int group, double value_bytes, double *slice) {
    *slice = ceil(elems / group);
    if (group < 2) return (th_traffic){0, 0, 0};
    th_traffic t = th_zero_traffic(value_bytes * *slice * group, group, 1);
    t.calls = 2;
    return t;
}

double th_ep_alltoall_calls(double passes, int forwards) { return passes * (3.0 * forwards + 2.0); }
