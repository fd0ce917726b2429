/* lab08_ep: expert parallelism.
 *
 * A mixture-of-experts GPT (common/moe.h: every MLP is E experts and a router
 * sending each token to k of them) whose experts are spread over the N ranks
 * of an EP group, E/N each. Each rank trains its own rows of the batch (data
 * parallel over all ranks for everything but the experts); in every layer a
 * token's rows travel to the ranks holding its experts and back by all-to-all
 * (ep.h). Replicated weights (attention, router, embeddings, head) are summed
 * over all ranks; an expert's gradient over the ranks holding that expert, the
 * expert-data-parallel (EDP) group. --ep N (default: every rank) x EDP over
 * the rest; --experts defaults to 4 here.
 *
 * What to look at: `loss` (equal to `lab01_dp -n 1 --experts E`, capacity and
 * drops included: they are decided per sequence), the groups, the tokens per
 * expert, and the all-to-all bytes per rank beside the exact count from the
 * step's routing and the uniform-routing expectation (theory/expert_parallel.c);
 * on each step line the smallest top-k margin the step routed on (moe.h,
 * moe_min_margin): how near a token came to another choice. */
#include "experts_metrics.h"
#include "report.h"
#include "kernels.h"
#include "mem.h"
#include "trace.h"
#include <math.h>
#include <stdlib.h>

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab08 *e = lab;
    const int N = e->N;
    e->rows = ctx->opt.batch / ctx->size;
    gpt_layout_init(&e->g, &ctx->model);
    comm_init(&e->world, MPI_COMM_WORLD, ctx->backend);
    comm_split(&e->world, e->world.rank / N, e->world.rank % N, &e->ep);  /* consecutive ranks: consecutive rows */
    comm_split(&e->world, e->world.rank % N, e->world.rank / N, &e->edp); /* the ranks holding the same experts */
    comm_set_axis(&e->world, "world");
    comm_set_axis(&e->ep, "ep");
    comm_set_axis(&e->edp, "edp");
    ep_hooks_init(&e->eh, &e->g, &e->ep);
    e->eh.reserve_rows = ep_received_rows_bound(&e->g.cfg, N, e->rows, ctx->opt.seq); /* F > 0: sized once, from the config */
    e->P = e->g.embed_size + (long)ctx->opt.layers * e->eh.layer_size + e->g.head_size;
    e->n_runs = ep_runs(&e->g, e->eh.tensors, e->eh.layer_size, N, e->ep.rank, NULL);
    e->runs = malloc(sizeof(ep_run) * (size_t)e->n_runs);
    if (!e->runs) die("out of host memory");
    ep_runs(&e->g, e->eh.tensors, e->eh.layer_size, N, e->ep.rank, e->runs);
    /* the rank's elements: the model's values (precision.h), the fp32 weights and AdamW's moments */
    model_states_alloc(&e->ms, e->P);
    ckpt_view_init(view, e->ms.master, e->P, e->ms.adam_m, e->ms.adam_v, e->P);
    for (int r = 0; r < e->n_runs; r++) { /* each run's initial values are the one-rank run's */
        const ep_run *u = &e->runs[r];
        gpt_init_params(&e->g, (uint64_t)ctx->opt.seed, u->global, u->global + u->n, e->ms.master + u->local);
        ckpt_hold(view, u->local, u->global, u->n);
    }
}

static void start(run_ctx *ctx, void *lab) {
    lab08 *e = lab;
    const int T = ctx->opt.seq, rows = e->rows;
    params_from_master(e->ms.params, e->ms.master, e->P); /* bf16: round what was resumed */
    /* the experts' hidden activations live in the hook (the rows a rank receives, not k x its own): the
     * layer's fch and GELU pieces, and the scratch's, are empty */
    gpt_part part = gpt_whole_part(&e->g);
    part.mlp_width = 0;
    gpt_acts_alloc_part(&e->acts, &e->g, 0, ctx->opt.layers, rows, &part);
    gpt_scratch_alloc_part(&e->scratch, &e->g, rows, &part);
    gpt_acts_bind(&e->acts, &e->scratch);
    e->tokens = malloc(sizeof(int) * (size_t)rows * T);
    e->targets = malloc(sizeof(int) * (size_t)rows * T);
    if (!e->tokens || !e->targets) die("out of host memory");
    lab08_start_figures(ctx, e);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    lab08 *e = lab;
    model_states *ms = &e->ms;
    const int B = ctx->opt.batch, T = ctx->opt.seq;
    const ep_run *runs = e->runs;
    e->eh.counts.max_expert_rows = 0; /* the last step's is printed */
    data_batch(&ctx->data, (uint64_t)ctx->opt.seed, step, e->world.rank * e->rows, e->rows, T, e->tokens, e->targets);
    gpt_acts_set_batch(&e->acts, e->tokens, e->targets, T);
    mem_zero(ms->grads, (size_t)e->P * value_bytes());
    gpt_forward_with(&e->g, &e->eh.hooks, ms->params, &e->acts);
    gpt_backward_with(&e->g, &e->eh.hooks, ms->params, ms->grads, &e->acts, &e->scratch, NULL, 1.0f / ((float)B * T),
                      NULL, NULL);
    /* replicated weights: every rank's share, summed over all; an expert's over its EDP group */
    int ev = trace_begin("grad_sum", TRACE_COMM, -1, NULL);
    for (int r = 0; r < e->n_runs; r++)
        comm_allreduce(runs[r].expert ? &e->edp : &e->world, value_at(ms->grads, runs[r].local), runs[r].n, COMM_VALUES, 0);
    trace_end(ev);

    ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
    double squares[2] = {0, 0}; /* replicated (the same on every rank), and this rank's experts */
    for (int r = 0; r < e->n_runs; r++)
        squares[runs[r].expert] += KP->sum_squares(value_at(ms->grads, runs[r].local), runs[r].n);
    comm_allreduce_host(&e->ep, squares + 1, 1); /* every expert once: over one EP group */
    const float scale = clip_scale(squares[0] + squares[1], (float)ctx->opt.clip);
    for (int r = 0; r < e->n_runs; r++) {
        const ep_run *u = &runs[r];
        adamw_step(&e->g, &ctx->adamw, u->global, u->global + u->n, ms->master + u->local,
                   value_at(ms->grads, u->local), ms->adam_m + u->local, ms->adam_v + u->local, step + 1, scale);
    }
    params_from_master(ms->params, ms->master, e->P);
    trace_end(ev);

    double loss = gpt_mean_loss(&e->g, &e->acts); /* this rank's rows, with the aux loss */
    comm_allreduce_host(&e->world, &loss, 1);
    run_experts_step(ctx, &e->world, &e->g, &e->acts, i);
    lab08_step_figures(e, i, out); /* the busiest expert, and the top-k margin on the step line */
    out->loss = loss / e->world.size;
    out->grad_norm = sqrt(squares[0] + squares[1]);
}

static void done(void *lab) {
    lab08 *e = lab;
    lab08_free_figures(e);
    free(e->runs);
    free(e->tokens);
    free(e->targets);
    gpt_scratch_free(&e->scratch);
    gpt_acts_free(&e->acts);
    ep_hooks_free(&e->eh);
    model_states_free(&e->ms);
    comm_free(&e->edp);
    comm_free(&e->ep);
    comm_free(&e->world);
}

int main(int argc, char **argv) {
    lab08 lab = {0};
    flag_spec flags[] = {
        {"--ep", FLAG_INT, &lab.ep_degree,
         "ranks in each expert-parallel group, each holding E/N experts (0: all of them); expert data "
         "parallelism over the groups", 0, NULL},
    };
    const lab_def def = {
        .info = {"lab08_ep", "expert parallelism: the experts of every MoE layer spread over the ranks of an EP "
                 "group, tokens sent to them and back by all-to-all", flags, 1},
        .check = lab08_check, .predict = lab08_predict, .plan = lab08_plan, .dry_run_notes = lab08_dry_run_notes,
        .setup = setup, .start = start, .step = step, .evaluate = lab08_evaluate, .report = lab08_report,
        .print = lab08_print, .done = done,
    };
    run_default_experts(4); /* before the flags are parsed: --help shows it */
    return lab_main(argc, argv, &def, &lab);
}
