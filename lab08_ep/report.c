/* lab08's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "jsonval.h"
#include "moe.h"
#include "predict.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The received rows' buffers are sized by the config when the capacity is per sequence (ep.h). */
static int sized_by_config(const run_ctx *ctx) { return ctx->model.capacity_factor > 0 && !ctx->model.capacity_per_rank; }

void lab08_check(run_ctx *ctx, void *lab) {
    lab08 *e = lab;
    e->N = e->ep_degree > 0 ? e->ep_degree : ctx->size;
    e->dp = ctx->size % e->N ? 1 : ctx->size / e->N;
    /* the layout's rules (--experts, --ep and --batch dividing as the layout spreads them): theory/rules.c's,
     * the same plan3d --check applies to this lab's records */
    th_run asked = lab_run_config(ctx);
    asked.ep = e->N;
    char rule[256];
    run_check(ctx, !th_run_broken_rule(&asked, TH_NAMES_FLAGS, rule, sizeof rule), "%s", rule);
}

void lab08_predict(const run_ctx *ctx, void *lab, th_run *need) {
    const lab08 *e = lab;
    /* theory/predict.h (lab08's part in theory/expert_parallel.c) (F = 0: the received rows at the
     * capacity-free bound, which the run's routing stays under) */
    need->dp = e->dp;
    need->ep = e->N;
    need->capacity_factor = sized_by_config(ctx) ? ctx->model.capacity_factor : 0; /* the model's experts: lab_run_config's */
}

void lab08_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab08 *e = lab;
    snprintf(e->layout, sizeof e->layout, "ep=%d edp=%d E=%d k=%d", e->N, e->dp, ctx->opt.experts, ctx->opt.top_k);
    r->layout = e->layout;
}

/* Below theory/predict.h's tables: the all-to-alls (a kind the tables do not have) and what sizes the received
 * rows' buffers. Rank 0. */
void lab08_dry_run_notes(run_ctx *ctx, void *lab, const th_run *need) {
    const lab08 *e = lab;
    const int sized = sized_by_config(ctx), rows = ctx->opt.batch / ctx->size;
    const th_ep_alltoall a2a = th_ep_alltoall_per_step(need);
    printf("  and alltoall %.0f calls, payload %.0f per rank per step under uniform routing, at most %.0f "
           "(theory/expert_parallel.c: the return rows are the routing's; %s)\n", a2a.calls, a2a.payload,
           a2a.payload_max, sized ? "with F > 0 dropped slots do not travel, so both bound it"
           : "F = 0: the EP group's mean is the uniform figure exactly");
    printf("  memory: the received rows' buffers (acts, comm, workspace) at %.0f rows per layer, %s\n",
           th_ep_received_rows_bound(rows, ctx->opt.seq, ctx->opt.top_k, ctx->opt.experts, e->N,
                                     sized ? ctx->model.capacity_factor : 0), sized
           ? "the capacity's bound: exact (lab08 sizes them so)"
           : "the capacity-free bound (F = 0 or a capacity per rank): an upper bound, the run allocates what its routing "
             "needs");
}

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

void lab08_start_figures(const run_ctx *ctx, lab08 *e) {
    if (e->world.rank == 0) {
        const int N = e->N, E = ctx->opt.experts;
        printf("expert parallel: ep=%d x edp=%d | %d experts, %d per rank, top-%d, capacity %s | %d rows of %d "
               "per rank\n", N, e->dp, E, E / N, ctx->opt.top_k, ctx->model.capacity_factor <= 0 ? "unlimited (F = 0)"
               : ctx->model.capacity_per_rank ? "ceil(k (B/N) T F / E) per rank's rows" : "ceil(k T F / E) per sequence",
               e->rows, ctx->opt.batch);
        print_groups(ctx->size, N, E);
        fflush(stdout);
    }
    e->max_rows_per_step = calloc((size_t)ctx->opt.steps + 1, sizeof(long));
    e->margin_per_step = calloc((size_t)ctx->opt.steps + 1, sizeof(float));
    e->cross_per_step = calloc((size_t)ctx->opt.steps + 1, sizeof(double));
    e->cross_once_per_step = calloc((size_t)ctx->opt.steps + 1, sizeof(double));
    if (!e->max_rows_per_step || !e->margin_per_step || !e->cross_per_step || !e->cross_once_per_step)
        die("out of host memory");
}

void lab08_free_figures(lab08 *e) {
    free(e->max_rows_per_step);
    free(e->margin_per_step);
    free(e->cross_per_step);
    free(e->cross_once_per_step);
}

void lab08_step_figures(lab08 *e, int i, lab_step *out) {
    e->max_rows_per_step[i] = e->eh.counts.max_expert_rows;
    float margin = moe_min_margin(&e->g, &e->acts); /* read after the step: it changes nothing */
    MPI_Allreduce(MPI_IN_PLACE, &margin, 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    e->margin_per_step[i] = margin;
    int at = snprintf(out->text, sizeof out->text, "top-k margin %.2e", margin);
    out->note = margin >= 0 ? out->text : NULL;
    if (ep_rank_group(e->eh.hooks.cfg, e->N, 0) >= 0) { /* node-limited over whole EP ranks: this step's bytes */
        const ep_counts *n = &e->eh.counts;
        const double now[3] = {n->rows_cross, n->routed_cross, n->routed_cross_once};
        double x[3]; /* this step's rows, summed over the ranks; the run's sums go on from them */
        for (int j = 0; j < 3; j++) x[j] = now[j] - e->cross_seen[j], e->cross_seen[j] = now[j];
        MPI_Allreduce(MPI_IN_PLACE, x, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        for (int j = 0; j < 3; j++) e->cross_rows[j] += x[j];
        if (!out->note) at = 0; /* no margin (k = E): the groups alone */
        const double row = (double)e->eh.hooks.cfg->d_model * value_bytes() / e->world.size;
        e->cross_per_step[i] = x[0] * row, e->cross_once_per_step[i] = x[2] * row;
        char a[16], b[16];
        snprintf(out->text + at, sizeof out->text - (size_t)at, "%sbetween groups %sB (once per group %sB)",
                 out->note ? " | " : "", human(e->cross_per_step[i], a), human(e->cross_once_per_step[i], b));
        out->note = out->text;
    }
}

/* --eval: lab_heldout_loss laid out as in training. Its all-to-alls and
 * expert loads stay out of the counts, so the record's figures are the training's. */
double lab08_evaluate(run_ctx *ctx, void *lab) {
    lab08 *e = lab;
    const ep_counts counts = e->eh.counts;
    const double loss = lab_heldout_loss(ctx, &e->world, e->eh.ep, e->world.rank * e->rows, e->rows, 0, &e->acts,
                                         e->tokens, e->targets, lab_model_forward_loss,
                                         &(lab_model){&e->g, &e->eh.hooks, e->ms.params});
    e->eh.counts = counts;
    return loss;
}

/* the all-to-all per rank per step: measured by comm (payload, the own block
 * included), the exact count from the routing (rows that left the rank, and
 * the counts), and the uniform-routing expectation */
typedef struct alltoall_figures {
    double steps, payload, sent, own, uniform, mean_rows;
    /* --route-groups G dividing the EP ranks: bytes between groups per rank per step (the mean of
     * the ranks), measured, from the routing, once per group, and under uniform routing both ways */
    int groups;
    double cross, routed, once, cross_uniform, once_uniform;
} alltoall_figures;

static alltoall_figures alltoall(const run_ctx *ctx, const lab08 *e) {
    const int T = ctx->opt.seq, C = ctx->opt.d_model, k = ctx->opt.top_k, N = e->N;
    const double vb = (double)value_bytes();
    const ep_counts *n = &e->eh.counts;
    alltoall_figures f;
    f.steps = ctx->steps_done > 0 ? ctx->steps_done : 1;
    f.payload = e->ep.stats[COLL_ALLTOALL].bytes / f.steps;
    f.sent = (n->rows_sent * C * vb + n->count_bytes_sent) / f.steps;
    f.own = (n->rows_kept * C * vb + n->count_bytes_kept) / f.steps;
    const th_cp_traffic per_layer = th_ep_layer_traffic(N, (double)e->rows * T, k, C, vb);
    f.uniform = ctx->opt.layers * (per_layer.fwd_sent + per_layer.bwd_sent);
    f.mean_rows = th_ep_tokens_per_expert_uniform((long)e->rows * T * N, k, ctx->opt.experts);
    /* between groups: the ranks' sums (every rank's own counts), then their mean */
    const int G = ctx->model.route_groups;
    f.groups = ep_rank_group(&ctx->model, N, 0) >= 0;
    const double *x = e->cross_rows; /* the steps' sums over the ranks (lab08_step_figures) */
    const double row = C * vb / f.steps / e->world.size;
    f.cross = x[0] * row, f.routed = x[1] * row, f.once = x[2] * row;
    const double exchanges = (ctx->model.recompute == RECOMPUTE_FULL ? 6.0 : 4.0) * ctx->opt.layers; /* a step's */
    const double rows_out = exchanges * (double)e->rows * T * C * vb; /* a token's row, each exchange */
    f.cross_uniform = f.groups ? rows_out * th_ep_cross_node_copies(k, 0, G) : 0;
    f.once_uniform = f.groups ? rows_out * th_ep_cross_node_copies(k, ctx->model.route_max_groups, G) : 0;
    return f;
}

void lab08_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab08 *e = lab;
    const int L = ctx->opt.layers, T = ctx->opt.seq, k = ctx->opt.top_k, sized = sized_by_config(ctx);
    const alltoall_figures f = alltoall(ctx, e);
    e->max_rows = e->eh.counts.max_expert_rows;
    MPI_Allreduce(MPI_IN_PLACE, &e->max_rows, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    const int done = ctx->steps_done < ctx->opt.steps ? ctx->steps_done : ctx->opt.steps;
    MPI_Allreduce(MPI_IN_PLACE, e->max_rows_per_step, done + 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    json_t *per_step = json_array(), *margins = json_array();
    if (!per_step || !margins) die("out of host memory");
    for (int i = 0; i < done; i++)
        jsonval_append(per_step, json_integer(e->max_rows_per_step[i]));
    for (int i = 0; i < done && e->margin_per_step[i] >= 0; i++) /* [] when k = E */
        jsonval_append(margins, jsonval_number((double)e->margin_per_step[i]));
    json_t *m = r->record;
    jsonval_set(m, "ep", json_integer(e->N));
    jsonval_set(m, "edp", json_integer(e->dp));
    jsonval_set(m, "alltoall_payload_per_step", jsonval_integer(f.payload));
    jsonval_set(m, "alltoall_sent_per_step", jsonval_integer(f.sent));
    jsonval_set(m, "alltoall_own_per_step", jsonval_integer(f.own));
    jsonval_set(m, "alltoall_uniform_per_step", jsonval_integer(f.uniform));
    if (f.groups) { /* between groups: the ranks' mean per step */
        jsonval_set(m, "alltoall_cross_group_per_step", jsonval_number(f.cross));
        jsonval_set(m, "alltoall_cross_group_routing_per_step", jsonval_number(f.routed));
        jsonval_set(m, "alltoall_cross_group_once_per_step", jsonval_number(f.once));
        jsonval_set(m, "alltoall_cross_group_uniform_per_step", jsonval_number(f.cross_uniform));
        jsonval_set(m, "alltoall_cross_group_once_uniform_per_step", jsonval_number(f.once_uniform));
    }
    jsonval_set(m, "expert_rows_max", json_integer(e->max_rows));
    jsonval_set(m, "expert_rows_uniform", jsonval_number(f.mean_rows));
    jsonval_set(m, "expert_rows_max_per_step", per_step);
    if (f.groups) { /* every step's bytes between groups, the ranks' mean */
        jsonval_set(m, "cross_group_bytes_by_step", jsonval_figures(e->cross_per_step, done));
        jsonval_set(m, "cross_group_once_bytes_by_step", jsonval_figures(e->cross_once_per_step, done));
    }
    jsonval_set(m, "topk_margin_per_step", margins);
    /* times: rank 0's, per step */
    jsonval_set(m, "alltoall_ms_per_step", jsonval_number(1e3 * e->eh.counts.alltoall_seconds / f.steps));
    jsonval_set(m, "experts_ms_per_step", jsonval_number(1e3 * e->eh.counts.expert_seconds / f.steps));
    /* activations: F > 0, the received rows' buffers at the capacity's bound (the config alone); F = 0,
     * at the most rows this rank received in each layer (the routing decides) */
    const th_model tm = lab_theory_model(&ctx->model);
    const th_opts acts_opts = th_opts_run(1, 0, ctx->model.recompute, g_precision == PREC_BF16);
    double *received = malloc(sizeof(double) * (size_t)L);
    if (!received) die("out of host memory");
    const double bound = th_ep_received_rows_bound(e->rows, T, k, ctx->opt.experts, e->N, ctx->model.capacity_factor);
    for (int l = 0; l < L; l++) received[l] = sized ? bound : (double)ep_layer_rows_cap(&e->eh, l);
    r->run.acts_formula_bytes = th_ep_acts_bytes(&tm, &acts_opts, e->rows, received);
    free(received);
    if (ctx->model.capacity_factor <= 0) { /* dropless: what the load's skew costs */
        double busiest = 0;
        for (int l = 0; l < L; l++) busiest = fmax(busiest, (double)ep_layer_rows_cap(&e->eh, l));
        MPI_Allreduce(MPI_IN_PLACE, &busiest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        e->skew = busiest / ((double)k * e->rows * T);
        e->acts_at_skew = th_ep_dropless_acts_bytes(&tm, &acts_opts, e->rows, e->N, e->skew);
        e->acts_uniform = th_ep_dropless_acts_bytes(&tm, &acts_opts, e->rows, e->N, 1);
        e->acts_bound = th_ep_dropless_acts_bytes(&tm, &acts_opts, e->rows, e->N, INFINITY); /* the bound's rows */
        jsonval_set(m, "dropless_skew", jsonval_number(e->skew));
        jsonval_set(m, "dropless_acts_at_skew", jsonval_number(e->acts_at_skew));
        jsonval_set(m, "dropless_acts_uniform", jsonval_number(e->acts_uniform));
        jsonval_set(m, "dropless_acts_bound", jsonval_number(e->acts_bound));
    }
    /* model states per parameter the rank holds: the replicated part and E/N of the experts */
    r->run.comms[0] = &e->world;
    r->run.comms[1] = &e->ep;
    r->run.comms[2] = &e->edp;
    r->run.n_comms = 3;
    r->run.params = e->g.total;
    r->run.params_held = e->P;
}

void lab08_print(run_ctx *ctx, void *lab) {
    const lab08 *e = lab;
    if (e->world.rank != 0) return;
    const int T = ctx->opt.seq, k = ctx->opt.top_k, E = ctx->opt.experts, N = e->N;
    const alltoall_figures f = alltoall(ctx, e);
    char a[16], b[16], c[16];
    printf("  tokens per expert per layer: max %ld (the last step, any rank's expert and layer) | "
           "mean %.1f under uniform routing (k x %d tokens of an EP group / E)\n", e->max_rows, f.mean_rows,
           e->rows * T * N);
    printf("  all-to-all per rank per step: %sB left the rank (measured: comm's payload less the own block) | "
           "%sB exact from this run's routing (rows to other ranks x C x b, and the counts) | %sB under uniform "
           "routing, 4 k N_tok C b (N-1)/N x L layers\n", human(f.payload - f.own, a), human(f.sent, b),
           human(f.uniform, c));
    if (f.groups) {
        char d[16], g[16];
        printf("  between groups (--route-groups %d: %d EP rank%s each), per rank per step (the ranks' mean): %sB "
               "sent, a row per choice (measured: the all-to-alls' rows to other groups) | %sB from this run's "
               "routing (its tokens' choices in other groups, out and back) | %sB once per group a token reaches "
               "(DeepSeek-V3's send) | uniform routing: %sB a row per choice, k (G-1)/G a token; at most %sB once "
               "per group, min(M, k) (G-1)/G (th_ep_cross_node_copies)\n",
               ctx->model.route_groups, N / ctx->model.route_groups, N / ctx->model.route_groups > 1 ? "s" : "",
               human(f.cross, a), human(f.routed, b),
               human(f.once, c), human(f.cross_uniform, d), human(f.once_uniform, g));
    }
    printf("  time per rank per step (rank 0): all-to-all %.2f ms (waiting for the slowest rank included) | "
           "experts' matmuls %.2f ms\n", 1e3 * e->eh.counts.alltoall_seconds / f.steps,
           1e3 * e->eh.counts.expert_seconds / f.steps);
    printf("  parameters per rank: %ld of %ld (experts at 1/%d)\n", e->P, e->g.total, N);
    if (sized_by_config(ctx))
        printf("  activations: received rows sized to the capacity bound, %.0f per layer (config alone, "
               "th_ep_received_rows_bound)\n",
               th_ep_received_rows_bound(e->rows, T, k, E, N, ctx->model.capacity_factor));
    else
        printf("  activations: received rows sized to the most this rank received per layer (F = 0: the "
               "routing decides; bound without capacity %.0f)\n", th_ep_received_rows_bound(e->rows, T, k, E, N, 0));
    if (ctx->model.capacity_factor <= 0) {
        char u[16], s[16], w[16];
        printf("  dropless (F = 0): the busiest layer received %.2fx the uniform k N_tok = %d rows (any rank); every "
               "layer at that skew: activations %sB per rank (th_ep_dropless_acts_bytes), %sB under uniform "
               "routing, %sB at the bound (every token to one rank)\n", e->skew, k * e->rows * T,
               human(e->acts_at_skew, s), human(e->acts_uniform, u), human(e->acts_bound, w));
    }
}
