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
#include "checkpoint.h"
#include "comm.h"
#include "ep.h"
#include "kernels.h"
#include "lab_run.h"
#include "jsonval.h"
#include "mem.h"
#include "model.h"
#include "moe.h"
#include "optim.h"
#include "run.h"
#include "predict.h"
#include "theory.h"
#include "trace.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* The groups, as lab06 prints its grid: EP groups exchange tokens, EDP groups sum expert gradients. */
static void print_groups(int ranks, int N, int E) {
    printf("  EP groups (all-to-all of tokens in every layer):");
    for (int d = 0; d < ranks / N; d++) {
        printf(" [");
        for (int q = 0; q < N; q++) printf("%s%d", q ? " " : "", d * N + q);
        printf("]");
    }
    printf("\n  EDP groups (all-reduce of the experts' gradients):");
    for (int q = 0; q < N; q++) {
        printf(" [");
        for (int d = 0; d < ranks / N; d++) printf("%s%d", d ? " " : "", d * N + q);
        if (E / N == 1) printf("] expert %d", q);
        else printf("] experts %d-%d", q * (E / N), (q + 1) * (E / N) - 1);
    }
    printf("\n  replicated (attention, router, embeddings, head): all-reduced over all %d ranks\n", ranks);
}

/* --eval: lab_heldout_loss laid out as in training. Its all-to-alls and
 * expert loads stay out of the counts, so the record's figures are the training's. */
static double evaluate(const run_ctx *ctx, const gpt_layout *g, ep_hooks *eh, comm *world, const void *params,
                       gpt_acts *acts, int rows, int *tokens, int *targets) {
    const ep_counts counts = eh->counts;
    const double loss = lab_heldout_loss(ctx, world, eh->ep, world->rank * rows, rows, 0, acts, tokens, targets,
                                         lab_model_forward_loss, &(lab_model){g, &eh->hooks, params});
    eh->counts = counts;
    return loss;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int ep_degree = 0;
    flag_spec flags[] = {
        {"--ep", FLAG_INT, &ep_degree,
         "ranks in each expert-parallel group, each holding E/N experts (0: all of them); expert data "
         "parallelism over the groups", 0, NULL},
    };
    lab_info lab = {"lab08_ep", "expert parallelism: the experts of every MoE layer spread over the ranks of an EP "
                    "group, tokens sent to them and back by all-to-all", flags, 1};
    run_ctx ctx;
    run_default_experts(4);
    run_parse(&ctx, argc, argv, &lab);
    const int E = ctx.opt.experts, N = ep_degree > 0 ? ep_degree : ctx.size;
    const int dp = ctx.size % N ? 1 : ctx.size / N;
    /* the layout's rules (--experts, --ep and --batch dividing as the layout spreads them): theory/rules.c's,
     * the same plan3d --check applies to this lab's records */
    th_run asked = lab_run_config(&ctx);
    asked.ep = N;
    char rule[256];
    run_check(&ctx, !th_run_broken_rule(&asked, TH_NAMES_FLAGS, rule, sizeof rule), "%s", rule);
    run_setup(&ctx);
    /* the received rows' buffers are sized by the config when the capacity is per sequence (ep.h) */
    const int sized = ctx.model.capacity_factor > 0 && !ctx.model.capacity_per_rank;
    /* theory/predict.h (lab08's part in theory/expert_parallel.c), held against the memory before anything is
     * allocated (F = 0: the received rows at the capacity-free bound, which the run's routing stays under) */
    th_run need = lab_run_config(&ctx);
    need.dp = dp;
    need.ep = N;
    need.capacity_factor = sized ? ctx.model.capacity_factor : 0; /* the model's experts: lab_run_config's */
    lab_start(&ctx, &need);

    const int B = ctx.opt.batch, T = ctx.opt.seq, L = ctx.opt.layers, C = ctx.opt.d_model;
    const int rows = B / ctx.size, k = ctx.opt.top_k;
    if (ctx.opt.dry_run) {
        if (ctx.rank == 0) {
            th_print_prediction(stdout, &need, 32);
            const th_ep_alltoall a2a = th_ep_alltoall_per_step(&need);
            printf("  and alltoall %.0f calls, payload %.0f per rank per step under uniform routing, at most %.0f "
                   "(theory/expert_parallel.c: the return rows are the routing's; %s)\n", a2a.calls, a2a.payload,
                   a2a.payload_max, sized ? "with F > 0 dropped slots do not travel, so both bound it"
                   : "F = 0: the EP group's mean is the uniform figure exactly");
            printf("  memory: the received rows' buffers (acts, comm, workspace) at %.0f rows per layer, %s\n",
                   th_ep_received_rows_bound(rows, T, k, E, N, sized ? ctx.model.capacity_factor : 0), sized
                   ? "the capacity's bound: exact (lab08 sizes them so)"
                   : "the capacity-free bound (F = 0 or a capacity per rank): an upper bound, the run allocates what its routing "
                     "needs");
        }
        char layout[64];
        snprintf(layout, sizeof layout, "ep=%d edp=%d E=%d k=%d", N, dp, E, k);
        lab_dry_run_exit(&ctx, NULL, (run_report){.layout = layout, .comm_formula_bytes = -1, .bubble_theory = -1});
    }
    gpt_layout g; /* the model; a rank's buffer holds its layout (ep.h): E/N experts per layer */
    gpt_layout_init(&g, &ctx.model);
    comm world, ep, edp;
    comm_init(&world, MPI_COMM_WORLD, ctx.backend);
    comm_split(&world, world.rank / N, world.rank % N, &ep);  /* consecutive ranks: consecutive rows */
    comm_split(&world, world.rank % N, world.rank / N, &edp); /* the ranks holding the same experts */
    comm_set_axis(&world, "world");
    comm_set_axis(&ep, "ep");
    comm_set_axis(&edp, "edp");
    ep_hooks eh;
    ep_hooks_init(&eh, &g, &ep);
    eh.reserve_rows = ep_received_rows_bound(&g.cfg, N, rows); /* F > 0: sized once, from the config */
    const long P = g.embed_size + (long)L * eh.layer_size + g.head_size; /* this rank's elements */
    const int n_runs = ep_runs(&g, eh.tensors, eh.layer_size, N, ep.rank, NULL);
    ep_run *runs = malloc(sizeof(ep_run) * (size_t)n_runs);
    if (!runs) die("out of host memory");
    ep_runs(&g, eh.tensors, eh.layer_size, N, ep.rank, runs);
    model_states ms; /* the rank's elements: the model's values (precision.h), the fp32 weights and AdamW's moments */
    model_states_alloc(&ms, P);
    ckpt_view view; /* the runs of the global layout this rank holds */
    ckpt_view_init(&view, ms.master, P, ms.adam_m, ms.adam_v, P);
    for (int r = 0; r < n_runs; r++) { /* each run's initial values are the one-rank run's */
        gpt_init_params(&g, (uint64_t)ctx.opt.seed, runs[r].global, runs[r].global + runs[r].n, ms.master + runs[r].local);
        ckpt_hold(&view, runs[r].local, runs[r].global, runs[r].n);
    }
    const int first = ckpt_resume(&ctx, &view);
    params_from_master(ms.params, ms.master, P);
    /* the experts' hidden activations live in the hook (the rows a rank receives, not k x its own): the
     * layer's fch and GELU pieces, and the scratch's, are empty */
    gpt_part part = gpt_whole_part(&g);
    part.mlp_width = 0;
    gpt_acts acts;
    gpt_acts_alloc_part(&acts, &g, 0, L, rows, &part);
    gpt_grad_scratch scratch;
    gpt_scratch_alloc_part(&scratch, &g, rows, &part);
    gpt_acts_bind(&acts, &scratch);
    int *tokens = malloc(sizeof(int) * (size_t)rows * T), *targets = malloc(sizeof(int) * (size_t)rows * T);
    if (!tokens || !targets) die("out of host memory");

    if (world.rank == 0) {
        printf("expert parallel: ep=%d x edp=%d | %d experts, %d per rank, top-%d, capacity %s | %d rows of %d "
               "per rank\n", N, dp, E, E / N, k, ctx.model.capacity_factor <= 0 ? "unlimited (F = 0)"
               : ctx.model.capacity_per_rank ? "ceil(k (B/N) T F / E) per rank's rows" : "ceil(k T F / E) per sequence", rows, B);
        print_groups(ctx.size, N, E);
        fflush(stdout);
    }

    /* the busiest expert's rows of each step (any rank, layer): the load the plots draw over the steps */
    long *max_rows_per_step = calloc((size_t)ctx.opt.steps + 1, sizeof(long));
    /* the smallest top-k margin each step routed on (moe_min_margin, min over layers and ranks; -1: k = E) */
    float *margin_per_step = calloc((size_t)ctx.opt.steps + 1, sizeof(float));
    if (!max_rows_per_step || !margin_per_step) die("out of host memory");
    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i;
        run_step_begin(&ctx, i);
        eh.counts.max_expert_rows = 0; /* the last step's is printed */
        data_batch(&ctx.data, (uint64_t)ctx.opt.seed, step, world.rank * rows, rows, T, tokens, targets);
        gpt_acts_set_batch(&acts, tokens, targets, T);
        mem_zero(ms.grads, (size_t)P * value_bytes());
        gpt_forward_with(&g, &eh.hooks, ms.params, &acts);
        gpt_backward_with(&g, &eh.hooks, ms.params, ms.grads, &acts, &scratch, NULL, 1.0f / ((float)B * T), NULL, NULL);
        /* replicated weights: every rank's share, summed over all; an expert's over its EDP group */
        int ev = trace_begin("grad_sum", TRACE_COMM, -1, NULL);
        for (int r = 0; r < n_runs; r++)
            comm_allreduce(runs[r].expert ? &edp : &world, value_at(ms.grads, runs[r].local), runs[r].n, 0);
        trace_end(ev);

        ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
        double squares[2] = {0, 0}; /* replicated (the same on every rank), and this rank's experts */
        for (int r = 0; r < n_runs; r++)
            squares[runs[r].expert] += KP->sum_squares(value_at(ms.grads, runs[r].local), runs[r].n);
        comm_allreduce_host(&ep, squares + 1, 1); /* every expert once: over one EP group */
        const float scale = clip_scale(squares[0] + squares[1], (float)ctx.opt.clip);
        for (int r = 0; r < n_runs; r++) {
            const ep_run *u = &runs[r];
            adamw_step(&g, &ctx.adamw, u->global, u->global + u->n, ms.master + u->local, value_at(ms.grads, u->local),
                       ms.adam_m + u->local, ms.adam_v + u->local, step + 1, scale);
        }
        params_from_master(ms.params, ms.master, P);
        trace_end(ev);

        double loss = gpt_mean_loss(&g, &acts); /* this rank's rows, with the aux loss */
        comm_allreduce_host(&world, &loss, 1);
        run_experts_step(&ctx, &world, &g, &acts, i);
        max_rows_per_step[i] = eh.counts.max_expert_rows;
        float margin = moe_min_margin(&g, &acts); /* read after the step: it changes nothing */
        MPI_Allreduce(MPI_IN_PLACE, &margin, 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
        margin_per_step[i] = margin;
        char margin_text[48];
        snprintf(margin_text, sizeof margin_text, "top-k margin %.2e", margin);
        run_step_end(&ctx, i, loss / world.size, sqrt(squares[0] + squares[1]), margin >= 0 ? margin_text : NULL);
        ckpt_step_done(&ctx, &view, step + 1);
    }

    const double eval_loss =
        ctx.opt.eval ? ckpt_print_eval(&ctx, evaluate(&ctx, &g, &eh, &world, ms.params, &acts, rows, tokens, targets)) : -1;

    /* the all-to-all per rank per step: measured by comm (payload, the own block
     * included), the exact count from the routing (rows that left the rank, and
     * the counts), and the uniform-routing expectation */
    const double steps = ctx.steps_done > 0 ? ctx.steps_done : 1, vb = (double)value_bytes();
    const double payload = ep.stats[COLL_ALLTOALL].bytes / steps;
    const double sent = (eh.counts.rows_sent * C * vb + eh.counts.count_bytes_sent) / steps;
    const double own = (eh.counts.rows_kept * C * vb + eh.counts.count_bytes_kept) / steps;
    const th_cp_traffic per_layer = th_ep_layer_traffic(N, (double)rows * T, k, C, vb);
    const double uniform = L * (per_layer.fwd_sent + per_layer.bwd_sent);
    long max_rows = eh.counts.max_expert_rows;
    MPI_Allreduce(MPI_IN_PLACE, &max_rows, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    const int done = ctx.steps_done < ctx.opt.steps ? ctx.steps_done : ctx.opt.steps;
    MPI_Allreduce(MPI_IN_PLACE, max_rows_per_step, done + 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    char *per_step = malloc(24 * ((size_t)done + 1) + 2), *margins = malloc(24 * ((size_t)done + 1) + 2);
    if (!per_step || !margins) die("out of host memory");
    size_t at = 0, at_margins = 0;
    for (int i = 0; i < done; i++) at += (size_t)sprintf(per_step + at, "%s%ld", i ? "," : "", max_rows_per_step[i]);
    per_step[at] = 0;
    margins[0] = 0;
    for (int i = 0; i < done && margin_per_step[i] >= 0; i++)
        at_margins += (size_t)sprintf(margins + at_margins, "%s%.9g", i ? "," : "", (double)margin_per_step[i]);
    const double mean_rows = th_ep_tokens_per_expert_uniform((long)rows * T * N, k, E);
    char layout[64];
    char *extra = malloc(1024 + at + at_margins);
    if (!extra) die("out of host memory");
    /* times: rank 0's, per step; the margins: [] when k = E */
    snprintf(extra, 1024 + at + at_margins, "\"ep\":%d,\"edp\":%d,\"alltoall_payload_per_step\":%.0f,"
             "\"alltoall_sent_per_step\":%.0f,\"alltoall_own_per_step\":%.0f,\"alltoall_uniform_per_step\":%.0f,"
             "\"expert_rows_max\":%ld,\"expert_rows_uniform\":%.3f,\"expert_rows_max_per_step\":[%s],"
             "\"topk_margin_per_step\":[%s],"
             "\"alltoall_ms_per_step\":%.4f,\"experts_ms_per_step\":%.4f", N, dp, payload, sent, own, uniform,
             max_rows, mean_rows, per_step, margins, 1e3 * eh.counts.alltoall_seconds / steps,
             1e3 * eh.counts.expert_seconds / steps);
    free(per_step);
    free(margins);
    free(max_rows_per_step);
    free(margin_per_step);
    snprintf(layout, sizeof layout, "ep=%d edp=%d E=%d k=%d", N, dp, E, k);
    /* activations: F > 0, the received rows' buffers at the capacity's bound (the config alone); F = 0,
     * at the most rows this rank received in each layer (the routing decides) */
    const th_model tm = lab_theory_model(&ctx.model);
    const th_opts acts_opts = th_opts_run(1, 0, ctx.model.recompute, g_precision == PREC_BF16);
    double *received = malloc(sizeof(double) * (size_t)L);
    if (!received) die("out of host memory");
    const double bound = th_ep_received_rows_bound(rows, T, k, E, N, ctx.model.capacity_factor);
    for (int l = 0; l < L; l++) received[l] = sized ? bound : (double)ep_layer_rows_cap(&eh, l);
    const double acts_formula = th_ep_acts_bytes(&tm, &acts_opts, rows, received);
    free(received);
    /* model states per parameter the rank holds: the replicated part and E/N of the experts */
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra, "the lab's record members"), 1,
               (run_report){.layout = layout, .comms = {&world, &ep, &edp}, .n_comms = 3, .params = g.total,
                            .comm_formula_bytes = -1, .bubble_theory = -1, .params_held = P,
                            .acts_formula_bytes = acts_formula});
    free(extra);
    if (world.rank == 0) {
        char a[16], b[16], c[16];
        printf("  tokens per expert per layer: max %ld (the last step, any rank's expert and layer) | "
               "mean %.1f under uniform routing (k x %d tokens of an EP group / E)\n", max_rows, mean_rows,
               rows * T * N);
        printf("  all-to-all per rank per step: %sB left the rank (measured: comm's payload less the own block) | "
               "%sB exact from this run's routing (rows to other ranks x C x b, and the counts) | %sB under uniform "
               "routing, 4 k N_tok C b (N-1)/N x L layers\n", human(payload - own, a), human(sent, b),
               human(uniform, c));
        printf("  time per rank per step (rank 0): all-to-all %.2f ms (waiting for the slowest rank included) | "
               "experts' matmuls %.2f ms\n", 1e3 * eh.counts.alltoall_seconds / steps,
               1e3 * eh.counts.expert_seconds / steps);
        printf("  parameters per rank: %ld of %ld (experts at 1/%d)\n", P, g.total, N);
        if (sized)
            printf("  activations: received rows sized to the capacity bound, %.0f per layer (config alone, "
                   "th_ep_received_rows_bound)\n", bound);
        else
            printf("  activations: received rows sized to the most this rank received per layer (F = 0: the "
                   "routing decides; bound without capacity %.0f)\n", th_ep_received_rows_bound(rows, T, k, E, N, 0));
    }
    free(runs);
    free(tokens);
    free(targets);
    gpt_scratch_free(&scratch);
    gpt_acts_free(&acts);
    ep_hooks_free(&eh);
    model_states_free(&ms);
    comm_free(&edp);
    comm_free(&ep);
    comm_free(&world);
    MPI_Finalize();
    return run_exit_status(&ctx, 0);
}
