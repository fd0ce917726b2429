/* lab05_tp: tensor parallelism (Megatron-LM style).
 *
 * The t ranks split every layer instead of the batch or the layer stack. In
 * attention each rank computes H/t whole heads (its rows of the QKV matrix:
 * column-parallel) and multiplies them by its columns of the output projection
 * (row-parallel), which gives a partial output of full width; an all-reduce sums
 * the partials. The MLP does the same with 4C/t of its units. So each rank holds
 * 1/t of every block's matrices and does 1/t of their work, and in exchange the
 * ranks all-reduce the B x T x C activation twice per layer forward (after each
 * row-parallel linear: g) and twice backward (the input gradient of each
 * column-parallel linear: f). Embedding, LayerNorms, row-parallel biases and
 * the head are replicated, and every rank trains on the whole batch.
 *
 * What to look at: `loss` (equal to `lab01_dp -n 1`), the summary's all-reduce
 * line (4L calls of B*T*C floats per step, beside the formula) and the
 * "block weights per rank" line (1/t of the block matrices). Then compare the
 * bytes with lab01's: TP's traffic grows with the tokens, DP's with the weights,
 * and TP's sits between layers where nothing can hide it: why TP stays inside a
 * host.
 *
 * --sequence-parallel (sequence_parallel.h): the LayerNorm and residual
 * regions, the embedding and the loss on T/t positions of every sequence per
 * rank; each all-reduce becomes a reduce-scatter and an all-gather of the same
 * bytes, and the replicated tensors' gradients, now partial, are summed over
 * the group after the backward. Look at the summary's traffic lines (the ring
 * bytes equal TP's) and the activations line (the formula beside the peak). */
#include "report.h"
#include "kernels.h"
#include "mem.h"
#include "sequence_parallel.h"
#include "trace.h"
#include <math.h>
#include <stdlib.h>

/* The step's mean loss: the head is replicated, so every rank has the same
 * losses; under sequence parallelism each rank has those of its positions,
 * and the mean over the ranks is the mean over the batch. */
double lab05_mean_loss(const tp_layout *tl, comm *tp, const gpt_acts *acts) {
    double loss = gpt_mean_loss(&tl->g, acts);
    if (tl->seq_parts == 1) return loss;
    comm_allreduce_host(tp, &loss, 1);
    return loss / tp->size;
}

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab05 *t = lab;
    comm_init(&t->tp, MPI_COMM_WORLD, ctx->backend);
    comm_set_axis(&t->tp, "tp");
    tp_layout_init(&t->tl, &ctx->model, t->tp.size, t->tp.rank);
    tp_layout_sequence_parallel(&t->tl, t->sequence_parallel);
    tp_hooks_init(&t->th, &t->tl, &t->tp);
    const long P = t->tl.total; /* this rank's parameters: replicated + its shards */
    /* the model's values (precision.h), the fp32 weights AdamW updates and its moments */
    model_states_alloc(&t->ms, P);
    tp_init_params(&t->tl, (uint64_t)ctx->opt.seed, 0, ctx->opt.layers, t->ms.master);
    /* replicated tensors whole, this rank's shards piece by piece */
    ckpt_view_init(view, t->ms.master, P, t->ms.adam_m, t->ms.adam_v, P);
    tp_checkpoint_hold(&t->tl, 0, ctx->opt.layers, view);
}

static void start(run_ctx *ctx, void *lab) {
    lab05 *t = lab;
    const int B = ctx->opt.batch, T = ctx->opt.seq, L = ctx->opt.layers;
    params_from_master(t->ms.params, t->ms.master, t->tl.total); /* bf16: round what was resumed */
    tp_acts_alloc(&t->acts, &t->tl, 0, L, B); /* the whole batch: TP does not split it */
    tp_scratch_alloc(&t->scratch, &t->tl, B);
    gpt_acts_bind(&t->acts, &t->scratch); /* --recompute and SP put what they do not keep there */
    t->partial = t->tl.seq_parts > 1 ? sp_partial_elems(&t->tl, 0, L) : 0;
    t->partial_staging = t->partial ? mem_alloc((size_t)t->partial * value_bytes(), MEM_COMM) : NULL;
    grad_norm_init(&t->norm, 2);
    t->tokens = malloc(sizeof(int) * (size_t)B * T);
    t->targets = malloc(sizeof(int) * (size_t)B * T);
    lab05_print_split(ctx, t);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    (void)i;
    lab05 *t = lab;
    const tp_layout *tl = &t->tl;
    const int B = ctx->opt.batch, T = ctx->opt.seq, L = ctx->opt.layers;
    const long P = tl->total;
    /* every rank the same, whole global batch */
    data_batch(&ctx->data, (uint64_t)ctx->opt.seed, step, 0, B, T, t->tokens, t->targets);
    gpt_acts_set_batch(&t->acts, t->tokens, t->targets, T); /* SP: the T/t positions of every row this rank holds */
    mem_zero(t->ms.grads, (size_t)P * value_bytes());

    gpt_forward_with(&tl->g, &t->th.hooks, t->ms.params, &t->acts);
    gpt_backward_with(&tl->g, &t->th.hooks, t->ms.params, t->ms.grads, &t->acts, &t->scratch, NULL,
                      1.0f / ((float)B * T), NULL, NULL);
    /* SP: the LayerNorms, embedding and head saw this rank's positions only:
     * their gradients are partial until summed over the group */
    if (t->partial) sp_sum_partial_grads(tl, &t->tp, 0, L, t->ms.grads, t->partial_staging);

    /* Clip by the norm of the WHOLE model's gradient, each element counted
     * once: the shards' squares are summed over the ranks, the replicated
     * tensors' (identical everywhere) are added once. That is exactly the
     * serial model's norm, so clipping matches lab01 -n 1. */
    int ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    double sharded_sq, replicated_sq;
    tp_grad_squares(tl, &t->norm, 0, L, t->ms.grads, &sharded_sq, &replicated_sq);
    comm_allreduce_host(&t->tp, &sharded_sq, 1);
    float scale = clip_scale(sharded_sq + replicated_sq, (float)ctx->opt.clip);
    tp_adamw_step(tl, &ctx->adamw, 0, L, t->ms.master, t->ms.grads, t->ms.adam_m, t->ms.adam_v, step + 1, scale);
    params_from_master(t->ms.params, t->ms.master, P);
    trace_end(ev);

    out->loss = lab05_mean_loss(tl, &t->tp, &t->acts);
    out->grad_norm = sqrt(sharded_sq + replicated_sq);
}

static void done(void *lab) {
    lab05 *t = lab;
    free(t->tokens);
    free(t->targets);
    gpt_scratch_free(&t->scratch);
    gpt_acts_free(&t->acts);
    mem_free(t->partial_staging);
    grad_norm_free(&t->norm);
    model_states_free(&t->ms);
    comm_free(&t->tp);
}

int main(int argc, char **argv) {
    lab05 lab = {0};
    flag_spec flags[] = {
        {"--check-sync", FLAG_BOOL, &lab.check_sync,
         "verify at the end that the replicated tensors are bit-identical on all ranks (exit 1 if not)", 0, NULL},
        {"--sequence-parallel", FLAG_BOOL, &lab.sequence_parallel,
         "sequence parallelism: outside the TP regions (LayerNorms, residuals, embedding, loss) each rank holds "
         "T/t positions of every sequence; all-gather and reduce-scatter instead of TP's all-reduces (t >= 2)", 0,
         NULL},
    };
    const lab_def def = {
        .info = {"lab05_tp", "tensor parallelism: every layer's matrices split over the ranks "
                 "(the TP degree is the rank count), activations all-reduced twice per layer each way", flags, 2},
        .check = lab05_check, .predict = lab05_predict, .plan = lab05_plan, .setup = setup, .start = start,
        .step = step, .evaluate = lab05_evaluate, .verify = lab05_verify, .report = lab05_report,
        .print = lab05_print, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
