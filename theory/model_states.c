/* Parameter counts, FLOPs and the model states (theory.h). */
#include "theory.h"

th_model th_course_model(long vocab, long seq, long layers, long d_model, long heads) {
    return (th_model){.vocab = vocab, .seq = seq, .layers = layers, .d_model = d_model, .heads = heads,
                      .kv_heads = heads, .ffn = 4 * d_model, .gated_mlp = 0, .biases = 1,
                      .learned_positions = 1, .tied_head = 0};
}

th_opts th_opts_course(int tp) {
    return (th_opts){.precision = PREC_FP32, .tp = tp, .vocab_parallel = 0, .sequence_parallel = 0,
                     .recompute = RECOMPUTE_NONE};
}

th_opts th_opts_run(int tp, int sequence_parallel, recompute_mode recompute, int bf16) {
    th_opts o = th_opts_precision(tp, bf16);
    o.sequence_parallel = sequence_parallel;
    o.recompute = recompute;
    return o;
}

th_opts th_opts_precision(int tp, int bf16) {
    th_opts o = th_opts_course(tp);
    o.precision = bf16 ? PREC_BF16 : PREC_FP32;
    return o;
}

double th_param_bytes(precision p) { return p == PREC_BF16 ? 2 : 4; }
double th_grad_bytes(precision p) { return p == PREC_BF16 ? 2 : 4; }
double th_optim_bytes(precision p) { return p == PREC_BF16 ? 12 : 8; }

th_params th_param_counts(const th_model *m) {
    const double C = (double)m->d_model, F = (double)m->ffn, V = (double)m->vocab, T = (double)m->seq;
    const double Q = th_attn_width(m), kv_width = th_kv_width(m); /* Q's columns, K's and V's each */
    const double b = m->biases ? 1 : 0, norm = m->biases ? 2 * C : C;
    th_params p = {0};
    /* column-parallel (split by output rows, with their biases): q, k, v and the
     * MLP's first matrix (or gate and up); row-parallel (split by input
     * columns, bias whole): the attention projection and the MLP's last one */
    double qkv = C * (Q + 2 * kv_width) + b * (Q + 2 * kv_width);
    double mlp_in = (m->gated_mlp ? 2 : 1) * (C * F + b * F);
    p.layer_sharded = qkv + Q * C + mlp_in + F * C;
    p.layer = p.layer_sharded + 2 * norm + b * C /* attention projection bias */ + b * C /* MLP's last bias */;
    p.layer_active = p.layer;
    p.dense_layer = p.layer;
    p.dense_layer_sharded = p.layer_sharded;
    if (m->experts > 0) { /* E MLPs and the router E x C, of which a token runs k MLPs and the router */
        const double Fe = th_expert_width(m);
        const double mlp_e_in = (m->gated_mlp ? 2 : 1) * (C * Fe + b * Fe);
        const double mlp_dense = mlp_in + F * C + b * C, mlp = mlp_e_in + Fe * C + b * C;
        /* the shared experts: one MLP of S Fe units (S MLPs side by side; one output bias) */
        const double SF = (double)m->shared_experts * Fe;
        const double shared = m->shared_experts > 0 ? (m->gated_mlp ? 2 : 1) * (C * SF + b * SF) + SF * C + b * C : 0;
        const double E = (double)m->experts, router = E * C;
        const double moe = p.layer - mlp_dense; /* the layer without its MLP */
        p.layer_experts = E * mlp;
        p.layer_active = moe + ((double)m->top_k) * mlp + shared + router;
        p.layer = moe + p.layer_experts + shared + router;
        /* TP splits attention's matrices only: the experts, the shared ones and
         * the router are whole on every TP rank (no expert tensor parallelism) */
        p.layer_sharded = qkv + Q * C;
    }
    p.embed = V * C + (m->learned_positions ? T * C : 0);
    p.head_matrix = V * C;
    p.head = norm + p.head_matrix;
    const double n_dense = m->experts > 0 ? (double)m->dense_layers : 0, n_moe = (double)m->layers - n_dense;
    p.total = p.embed + n_moe * p.layer + n_dense * p.dense_layer + p.head - (m->tied_head ? p.head_matrix : 0);
    p.active = p.total - n_moe * (p.layer - p.layer_active);
    return p;
}

int th_moe_layers(const th_model *m, int lo, int hi) {
    if (m->experts <= 0) return 0;
    const int first = lo > m->dense_layers ? lo : (int)m->dense_layers;
    return hi > first ? hi - first : 0;
}

double th_stage_expert_params(const th_model *m, const th_opts *o, int lo, int hi) {
    const double ep = o->ep > 1 ? o->ep : 1;
    return th_moe_layers(m, lo, hi) * th_param_counts(m).layer_experts / ep;
}

double th_stage_params(const th_model *m, const th_opts *o, int lo, int hi) {
    const th_params p = th_param_counts(m);
    const double t = o->tp > 0 ? o->tp : 1, vocab_split = o->vocab_parallel ? t : 1;
    const double C = (double)m->d_model;
    const int moe = th_moe_layers(m, lo, hi), dense = hi - lo - moe;
    /* dense layers (every layer of a dense model): the sharded part / t; MoE
     * layers: attention's matrices / t, the routed experts / ep */
    double n = (double)dense * (p.dense_layer - p.dense_layer_sharded + p.dense_layer_sharded / t);
    if (moe)
        n += (double)moe * (p.layer - p.layer_experts - p.layer_sharded + p.layer_sharded / t) +
             th_stage_expert_params(m, o, lo, hi);
    if (lo == 0) /* the token table, split over t when vocab-parallel; positions whole */
        n += (double)m->vocab * C / vocab_split + (m->learned_positions ? (double)m->seq * C : 0);
    if (hi == m->layers) {
        double norm = m->biases ? 2 * C : C;
        /* a tied head shares the embedding's matrix only when one stage holds both */
        int own_matrix = !m->tied_head || lo > 0;
        n += norm + (own_matrix ? p.head_matrix / vocab_split : 0);
    }
    return n;
}

double th_expert_width(const th_model *m) { return (double)(m->ffn_expert > 0 ? m->ffn_expert : m->ffn); }

static double head_width(const th_model *m) {
    return m->head_dim > 0 ? (double)m->head_dim : (double)m->d_model / (double)m->heads;
}
double th_attn_width(const th_model *m) { return (double)m->heads * head_width(m); }
double th_kv_width(const th_model *m) { return (double)m->kv_heads * head_width(m); }

double th_flops_per_token(const th_model *m) {
    const th_params p = th_param_counts(m);
    const double L = (double)m->layers, T = (double)m->seq, Q = th_attn_width(m);
    /* every parameter of a matrix product does a multiply-add per token forward
     * (2 FLOPs) and two backward (input and weight gradients): 6; the attention
     * scores and their use of V add 2 x 2 T Q per layer forward (Q = heads x
     * head width: d_model but where a head is wider), 12 T Q in all */
    const double n_dense = m->experts > 0 ? (double)m->dense_layers : 0;
    return 6.0 * ((L - n_dense) * p.layer_active + n_dense * p.dense_layer + p.head) + 12.0 * L * T * Q;
}

double th_causal_flops_per_token(const th_model *m) {
    return th_flops_per_token(m) - 6.0 * (double)m->layers * (double)m->seq * th_attn_width(m);
}

double th_recompute_flops_per_token(const th_model *m, recompute_mode r) {
    const th_params p = th_param_counts(m);
    const double L = (double)m->layers, T = (double)m->seq, Q = th_attn_width(m);
    /* a second forward of the layers runs what a token runs: the active parameters */
    const double n_dense = m->experts > 0 ? (double)m->dense_layers : 0;
    if (r == RECOMPUTE_FULL) return 2.0 * ((L - n_dense) * p.layer_active + n_dense * p.dense_layer) + 4.0 * L * T * Q;
    if (r == RECOMPUTE_SELECTIVE) return 4.0 * L * T * Q;
    return 0;
}

th_states th_model_states(double psi, const th_opts *o, int zero_stage, int dp) {
    const double N = dp > 0 ? dp : 1;
    th_states s = {th_param_bytes(o->precision) * psi, th_grad_bytes(o->precision) * psi,
                   th_optim_bytes(o->precision) * psi};
    if (zero_stage >= 1) s.optim /= N;
    if (zero_stage >= 2) s.grads /= N;
    if (zero_stage >= 3) s.params /= N;
    return s;
}

th_states th_zero_buffers(double unit_elems, const th_opts *o, int zero_stage) {
    return (th_states){zero_stage >= 3 ? th_param_bytes(o->precision) * unit_elems : 0,
                       zero_stage >= 2 ? th_grad_bytes(o->precision) * unit_elems : 0, 0};
}
