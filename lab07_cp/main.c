/* lab07_cp: context parallelism.
 *
 * The N ranks of a CP group split every sequence: each holds T/N positions of
 * every row through the whole model (embedding, every layer, the loss), with
 * the whole weights. Only attention needs other ranks' positions (a query sees
 * every earlier key): cp.h's attention hook brings them, by a ring of K/V
 * blocks merged with their log-sum-exp (--cp-algo ring), by all-gathering
 * K and V (allgather), or by an all-to-all that hands each rank every
 * position of heads/N heads for attention and back (ulysses). Activations per rank fall to 1/N, the T^2 attention
 * matrix with them: no rank ever holds more than a (T/N) x (T/N) block of it.
 * --cp N (default: every rank) x data parallelism over the rest.
 *
 * What to look at: `loss` (equal to `lab01_dp -n 1`), the chunk map (zig-zag
 * gives each rank two chunks), the unmasked causal scores per rank (equal with
 * zig-zag, 1:3:5:7 with contiguous at N = 4) and the K/V bytes per layer
 * beside theory/context.c's formula, and the activation peak beside lab01's. */
#include "report.h"
#include "kernels.h"
#include "mem.h"
#include "trace.h"
#include <math.h>
#include <stdlib.h>

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab07 *c = lab;
    const int N = c->N;
    c->rows = ctx->opt.batch / c->dp;
    gpt_layout_init(&c->g, &ctx->model);
    comm_init(&c->world, MPI_COMM_WORLD, ctx->backend);
    comm_split(&c->world, c->world.rank / N, c->world.rank % N, &c->cp); /* consecutive ranks share a sequence */
    comm_set_axis(&c->world, "world");
    comm_set_axis(&c->cp, "cp");
    c->dp_rank = c->world.rank / N;
    c->local = c->g;
    c->local.cfg.seq = ctx->opt.seq / N; /* wpe keeps all T rows: the embedding reads them by global position */
    cp_hooks_init(&c->ch, &c->g, &c->cp, c->algo, c->cp_layout, c->rows);
    /* the model's values (precision.h), the fp32 weights AdamW updates and its moments */
    model_states_alloc(&c->ms, c->g.total);
    gpt_init_params(&c->g, (uint64_t)ctx->opt.seed, 0, c->g.total, c->ms.master); /* the same on every rank */
    ckpt_view_range(view, c->ms.master, c->ms.adam_m, c->ms.adam_v, 0, c->g.total); /* a whole replica */
}

static void start(run_ctx *ctx, void *lab) {
    lab07 *c = lab;
    const int T = ctx->opt.seq, C = ctx->opt.d_model, rows = c->rows;
    params_from_master(c->ms.params, c->ms.master, c->g.total); /* bf16: round what was resumed */
    /* a layer keeps its log-sum-exp (fp32, one per query row and head) where
     * the one-rank layer keeps its attention matrix */
    const gpt_part part = {ctx->opt.heads, 4 * C, 1, 0, cp_att_row(c->algo, C / ctx->opt.heads)};
    gpt_acts_alloc_part(&c->acts, &c->local, 0, ctx->opt.layers, rows, &part);
    c->acts.positions = cp_positions(&c->ch);
    gpt_scratch_alloc_part(&c->scratch, &c->local, rows, &part);
    gpt_acts_bind(&c->acts, &c->scratch);
    c->tokens = malloc(sizeof(int) * (size_t)rows * T);
    c->targets = malloc(sizeof(int) * (size_t)rows * T);
    if (!c->tokens || !c->targets) die("out of host memory");
    lab07_print_layout(ctx, c);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    lab07 *c = lab;
    const int B = ctx->opt.batch, T = ctx->opt.seq;
    const long P = c->g.total;
    /* this group's rows of the global batch; the rank's positions of them */
    data_batch(&ctx->data, (uint64_t)ctx->opt.seed, step, c->dp_rank * c->rows, c->rows, T, c->tokens, c->targets);
    gpt_acts_set_batch(&c->acts, c->tokens, c->targets, T);
    mem_zero(c->ms.grads, (size_t)P * value_bytes());
    /* forward and backward as compute events, as lab01's: the summary's time split counts the seconds inside
     * them (the K/V exchanges nested in them count as comm) */
    int ev = trace_begin("forward", TRACE_COMPUTE, -1, NULL);
    gpt_forward_with(&c->local, &c->ch.hooks, c->ms.params, &c->acts);
    trace_end(ev);
    ev = trace_begin("backward", TRACE_COMPUTE, -1, NULL);
    /* every position's weight: 1 / the global token count, so the sum over all ranks is the mean */
    gpt_backward_with(&c->local, &c->ch.hooks, c->ms.params, c->ms.grads, &c->acts, &c->scratch, NULL,
                      1.0f / ((float)B * T), NULL, NULL);
    trace_end(ev);
    ev = trace_begin("grad_sum", TRACE_COMM, -1, NULL);
    comm_allreduce(&c->world, c->ms.grads, P, COMM_VALUES, 0); /* every rank's share of the same weights: summed over DP x CP */
    trace_end(ev);

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    const double grad_squares = KP->sum_squares(c->ms.grads, P);
    float scale = clip_scale(grad_squares, (float)ctx->opt.clip);
    adamw_step(&c->g, &ctx->adamw, 0, P, c->ms.master, c->ms.grads, c->ms.adam_m, c->ms.adam_v, step + 1, scale);
    params_from_master(c->ms.params, c->ms.master, P);
    trace_end(ev);

    double loss = gpt_mean_loss(&c->local, &c->acts); /* over this rank's rows x T/N positions */
    comm_allreduce_host(&c->world, &loss, 1);
    out->loss = loss / c->world.size;
    out->grad_norm = sqrt(grad_squares);
    if (i == 0 && ctx->opt.steps > 1) c->first_step_attention = c->ch.attention_cpu_seconds; /* warm-up: left out */
}

static void done(void *lab) {
    lab07 *c = lab;
    free(c->scores);
    free(c->attention_per_rank);
    free(c->tokens);
    free(c->targets);
    gpt_scratch_free(&c->scratch);
    gpt_acts_free(&c->acts);
    cp_hooks_free(&c->ch);
    model_states_free(&c->ms);
    comm_free(&c->cp);
    comm_free(&c->world);
}

int main(int argc, char **argv) {
    lab07 lab = {.layout_name = "zigzag", .algo_name = "ring"};
    flag_spec flags[] = {
        {"--cp", FLAG_INT, &lab.cp_degree,
         "ranks in each context-parallel group (0: all of them); data parallelism over the groups", 0, NULL},
        {"--cp-layout", FLAG_STRING, &lab.layout_name,
         "which positions a rank holds: zigzag (chunks r and 2N-1-r of 2N, balanced causal work) or contiguous "
         "(T/N in a row)", 0, "zigzag|contiguous"},
        {"--cp-algo", FLAG_STRING, &lab.algo_name,
         "how attention sees the other ranks' keys: ring (K/V blocks passed round, merged by log-sum-exp) or "
         "allgather (K and V gathered whole) or ulysses (all-to-all to a head split and back)", 0,
         "ring|allgather|ulysses"},
    };
    const lab_def def = {
        .info = {"lab07_cp", "context parallelism: every sequence split over the ranks of a CP group, "
                 "attention's keys and values brought by a ring or an all-gather, or the heads split by an all-to-all "
                 "(Ulysses); data parallel over the groups", flags, 3},
        .check = lab07_check, .predict = lab07_predict, .plan = lab07_plan, .dry_run_notes = lab07_dry_run_notes,
        .setup = setup, .start = start, .step = step, .trained = lab07_trained, .evaluate = lab07_evaluate, .report = lab07_report,
        .print = lab07_print, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
