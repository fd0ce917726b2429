/* lab09's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "device.h"
#include "jsonval.h"
#include "mesh.h"
#include "schedule.h"
#include "theory.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lab09_flag_defaults(int ranks, void *lab) {
    lab09 *s = lab;
    grid_defaults_axes(ranks, s->deg, AXES); /* what --help shows for this rank count */
}

void lab09_check(run_ctx *ctx, void *lab) {
    static const char *const axis_flags[AXES] = {"--tp", "--cp", "--pp", "--dp"};
    lab09 *s = lab;
    grid_choose_axes(ctx, axis_flags, s->deg, AXES);
    const int t = s->deg[AXIS_TP], c = s->deg[AXIS_CP], p = s->deg[AXIS_PP], d = s->deg[AXIS_DP];
    const int m = s->micro_batches, ep = s->ep, zero_stage = s->zero_stage, sequence_parallel = s->sequence_parallel;
    const int experts = s->experts = ctx->opt.experts > 0;
    /* lab08's experts in the grid: whole experts (no expert tensor parallelism), the fused backward (lab08's
     * hook); under CP the routing gathers each sequence's choices over the CP group (moe_split) */
    run_check(ctx, ep == 1 || experts, "--ep %d needs --experts (experts to spread over the EP group)", ep);
    run_check(ctx, !experts || t == 1, "--experts with --tp %d: expert tensor parallelism is not taught (lab09 runs "
              "experts at --tp 1)", t);
    run_check(ctx, !experts || (c * d) % ep == 0, "--ep %d does not divide the %d replicas (--cp x --dp) that EP "
              "groups are carved from", ep, c * d);
    run_check(ctx, !experts || ctx->opt.experts % ep == 0, "--ep %d does not divide --experts %d (each rank holds "
              "E/e experts a layer)", ep, ctx->opt.experts);
    run_check(ctx, !experts || zero_stage == 0, "--zero-stage 1 with --experts: the optimizer state of expert "
              "and replicated runs is not sharded yet (lab09 runs experts at --zero-stage 0)");
    tp_check_degree(ctx, t, "--tp");
    run_check(ctx, th_stage_split_possible(ctx->opt.layers, p),
              "--pp %d is more than --layers %d: every pipeline stage needs at least one layer", p, ctx->opt.layers);
    s->kind = pipeline_check_flags(ctx, s->schedule_arg, p, m, s->virtual_stages);
    run_check(ctx, !experts || (s->kind != SCHEDULE_ZB_H1 && s->kind != SCHEDULE_ZB_V), "--schedule %s with "
              "--experts: lab08's experts run the fused backward, not its input and weight halves", s->schedule_arg);
    run_check(ctx, zero_stage == 0 || zero_stage == 1, "--zero-stage %d: lab09 shards the optimizer state only "
              "(0 or 1); lab02_zero has stages 2 and 3", zero_stage);
    run_check(ctx, zero_stage == 0 || c * d >= 2, "--zero-stage 1 needs --cp x --dp of at least 2 (%d x %d: no "
              "replicas to shard the optimizer state over)", c, d);
    run_check(ctx, ctx->opt.batch % ((long)d * m) == 0, "--batch %d is not divisible by --dp %d x --micro-batches %d "
              "(each replica cuts its B/d rows into micro-batches)", ctx->opt.batch, d, m);
    s->cp_layout = strcmp(s->layout_name, "contiguous") ? TH_CP_ZIGZAG : TH_CP_CONTIGUOUS;
    s->algo = !strcmp(s->algo_name, "allgather") ? TH_CP_ALLGATHER
              : !strcmp(s->algo_name, "ulysses") ? TH_CP_ULYSSES : TH_CP_RING;
    const int chunks = s->cp_layout == TH_CP_ZIGZAG ? 2 * c : c;
    run_check(ctx, ctx->opt.seq % chunks == 0, "--seq %d is not divisible by the %d chunks of --cp-layout %s (%s--cp "
              "%d)", ctx->opt.seq, chunks, s->layout_name, s->cp_layout == TH_CP_ZIGZAG ? "2 x " : "", c);
    run_check(ctx, s->algo != TH_CP_ULYSSES || t < 1 || c < 1 || ctx->opt.heads % ((long)t * c) == 0,
              "--heads %d is not divisible by --tp %d x --cp %d (--cp-algo ulysses gives each CP rank 1/c of a TP "
              "rank's heads)", ctx->opt.heads, t, c);
    run_check(ctx, !sequence_parallel || t >= 2, "--sequence-parallel needs --tp of at least 2 (--tp %d: no TP "
              "group to split the sequence over)", t);
    run_check(ctx, !sequence_parallel || t < 1 || c < 1 || ctx->opt.seq % ((long)c * t) == 0,
              "--sequence-parallel: --seq %d is not divisible by --cp %d x --tp %d (each TP rank holds 1/t of its "
              "CP rank's T/c positions)", ctx->opt.seq, c, t);
}

/* theory/predict.h's config of the grid, held against the memory before anything is allocated */
void lab09_predict(const run_ctx *ctx, void *lab, th_run *need) {
    lab09 *s = lab;
    s->v = schedule_chunks(s->kind, s->virtual_stages);
    need->tp = s->deg[AXIS_TP];
    need->pp = s->deg[AXIS_PP];
    need->dp = s->deg[AXIS_DP];
    need->cp = s->deg[AXIS_CP];
    need->ep = s->experts ? s->ep : 0;
    need->capacity_factor = ctx->model.capacity_per_rank ? 0 : ctx->model.capacity_factor;
    need->cp_algo = s->algo;
    need->cp_layout = s->cp_layout;
    need->micro_batches = s->micro_batches;
    need->schedule = schedule_name(s->kind);
    need->chunks = s->v;
    need->zero_stage = s->zero_stage;
    need->tensor_parallel = 1;
    need->sequence_parallel = s->sequence_parallel;
}

void lab09_plan(const run_ctx *ctx, void *lab, run_report *r) {
    lab09 *s = lab;
    const int *deg = s->deg;
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    char chunks_text[16] = "", cp_text[32] = "", ep_text[40] = "";
    if (s->kind == SCHEDULE_INTERLEAVED) snprintf(chunks_text, sizeof chunks_text, " v=%d", s->v);
    if (deg[AXIS_CP] > 1) snprintf(cp_text, sizeof cp_text, " %s %s", s->algo_name, s->layout_name);
    if (s->experts) snprintf(ep_text, sizeof ep_text, " ep=%d E=%d k=%d", s->ep, ctx->opt.experts, ctx->opt.top_k);
    snprintf(s->layout, sizeof s->layout, "tp=%d cp=%d pp=%d dp=%d m=%d %s%s%s%s%s%s", deg[AXIS_TP], deg[AXIS_CP],
             deg[AXIS_PP], deg[AXIS_DP], s->micro_batches, schedule_name(s->kind), chunks_text, cp_text,
             s->sequence_parallel ? " sp" : "", s->zero_stage ? " zero1" : "", ep_text);
    r->layout = s->layout;
    r->comm_formula = "busiest rank: TP + DP all-reduces (ring) + PP sends and receives + CP's K/V exchanges, the "
                      "formulas below";
    /* --dry-run's formula: the prediction's ring bytes, as report3d adds up its formulas (the run's: lab09_report) */
    r->comm_formula_bytes = DRY_RUN_PREDICTED_RING;
    r->bubble_theory = schedule_bubble_textbook(s->kind, deg[AXIS_PP], s->micro_batches, s->v);
}

static int c_at(mesh_coord c, mesh_axis a) { return c.at[a]; }

/* Rank 0 prints the map: each rank's coordinate, host, layers, heads and positions (and experts). */
static void print_map(const run_ctx *ctx, const int *deg, const int *positions, int Tl, int heads_per_rank, int ep) {
    const mesh_dims dims = {.size = {deg[AXIS_TP], deg[AXIS_CP], deg[AXIS_DP], deg[AXIS_PP]}, .ep = ep > 0 ? ep : 1};
    const int per_rank = ep > 0 ? ctx->opt.experts / ep : 0; /* --experts: E/e a layer */
    const int L = ctx->opt.layers, p = deg[AXIS_PP];
    int *all = ctx->rank == 0 ? malloc(sizeof(int) * (size_t)Tl * ctx->size) : NULL;
    if (ctx->rank == 0 && !all) die("out of host memory");
    MPI_Gather(positions, Tl, MPI_INT, all, Tl, MPI_INT, 0, MPI_COMM_WORLD);
    if (ctx->rank != 0) return;
    printf("mesh: rank = tp + %d x (cp + %d x (dp + %d x pp))\n", deg[AXIS_TP], deg[AXIS_CP], deg[AXIS_DP]);
    for (int r = 0; r < ctx->size; r++) {
        const mesh_coord c = mesh_coord_of(&dims, r);
        int lo, hi;
        th_stage_layers(L, p, c.at[MESH_PP], &lo, &hi);
        printf("  rank %d (%s): tp %d cp %d pp %d dp %d | layers %d-%d | heads %d-%d | positions", r,
               run_host_label(ctx, r), c.at[MESH_TP], c.at[MESH_CP], c.at[MESH_PP], c.at[MESH_DP], lo, hi - 1,
               c.at[MESH_TP] * heads_per_rank, (c.at[MESH_TP] + 1) * heads_per_rank - 1);
        const int *pos = all + (size_t)r * Tl;
        for (int i = 0, j; i < Tl; i = j) {
            for (j = i + 1; j < Tl && pos[j] == pos[j - 1] + 1; j++) {}
            printf(" %d-%d", pos[i], pos[j - 1]);
        }
        if (per_rank) { /* its place in its EP block: f = cp + c dp, EP rank f mod e */
            const int f = c_at(c, MESH_CP) + deg[AXIS_CP] * c_at(c, MESH_DP), q = f % ep;
            if (per_rank == 1) printf(" | expert %d (ep group %d)", q, f / ep);
            else printf(" | experts %d-%d (ep group %d)", q * per_rank, (q + 1) * per_rank - 1, f / ep);
        }
        printf("\n");
    }
    fflush(stdout);
    free(all);
}

void lab09_print_mesh(const run_ctx *ctx, const lab09 *s) {
    const int *deg = s->deg, c = deg[AXIS_CP], T = ctx->opt.seq, Tl = T / c;
    int *all_positions = malloc(sizeof(int) * (size_t)T); /* --cp 1: every position, in order */
    if (!all_positions) die("out of host memory");
    for (int i = 0; i < T; i++) all_positions[i] = i;
    print_map(ctx, deg, c > 1 ? cp_positions(&s->ch) : all_positions, Tl, s->tl.heads, s->experts ? s->ep : 0);
    free(all_positions);
    if (ctx->rank != 0) return;
    const pipeline_rank *pr = &s->pr;
    printf("5D: TP t=%d%s (%d of %d heads, %d of %d MLP units per rank) | CP c=%d (%s, %s: %d of %d positions) | "
           "PP p=%d stages x %d chunk%s, m=%d micro-batches of %d rows, %s | DP d=%d replicas of %d rows%s | "
           "bubble theory %s = %.3f\n", deg[AXIS_TP], s->sequence_parallel ? " + SP" : "", s->tl.heads,
           ctx->opt.heads, s->tl.hidden, 4 * ctx->opt.d_model, c, s->algo_name, s->layout_name, Tl, T, deg[AXIS_PP],
           pr->v, pr->v == 1 ? "" : "s", s->micro_batches, pr->chunk[0].rows, schedule_name(s->kind), deg[AXIS_DP],
           ctx->opt.batch / deg[AXIS_DP], s->zero_stage ? " + ZeRO-1 over the c x d replicas" : "",
           schedule_bubble_textbook_text(s->kind), s->theory);
    fflush(stdout);
}

double lab09_evaluate(run_ctx *ctx, void *lab) {
    lab09 *s = lab;
    /* lab06's, its EP all-to-alls out of the traffic counts too; the experts' figures stay the training's */
    const ep_counts training_counts = s->experts ? s->gx.eh.counts : (ep_counts){0};
    const double loss = stage3d_evaluate(ctx, &s->pr, &s->grid, s->sequence_parallel, s->experts ? s->ep_group : NULL);
    if (s->experts) s->gx.eh.counts = training_counts;
    return loss;
}

/* lab06's check over the c x d replicas; with experts over each EDP group, whose ranks hold the same experts
 * (an EP group's ranks hold different ones) */
int lab09_verify(run_ctx *ctx, void *lab) {
    lab09 *s = lab;
    s->in_sync = s->check_sync ? stage3d_replicas_identical(&s->pr, s->experts ? s->edp_group : s->grid.dp) : 1;
    if (s->check_sync && ctx->rank == 0) {
        if (s->experts) printf("check-sync: the ranks of every EDP group (the replicas holding the same experts) %s\n",
                               s->in_sync ? "hold bit-identical weights" : "DIFFER");
        else printf("check-sync: the %d replicas (cp x dp) of every (tp, pp) position %s\n",
                    s->deg[AXIS_CP] * s->deg[AXIS_DP], s->in_sync ? "hold bit-identical weights" : "DIFFER");
    }
    return s->in_sync;
}

void lab09_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab09 *s = lab;
    const int *deg = s->deg;
    if (!s->experts) report3d_gather(&s->rep, &s->grid, &s->pr, ctx); /* the experts' traffic has no formula here yet */
    json_t *rec = r->record;
    jsonval_set(rec, "tp", json_integer(deg[AXIS_TP]));
    jsonval_set(rec, "cp", json_integer(deg[AXIS_CP]));
    jsonval_set(rec, "pp", json_integer(deg[AXIS_PP]));
    jsonval_set(rec, "dp", json_integer(deg[AXIS_DP]));
    jsonval_set(rec, "ep", json_integer(s->experts ? s->ep : 0));
    jsonval_set(rec, "micro_batches", json_integer(s->micro_batches));
    jsonval_set(rec, "schedule", jsonval_text(schedule_name(s->kind)));
    jsonval_set(rec, "chunks_per_rank", json_integer(s->pr.v));
    jsonval_set(rec, "cp_algo", jsonval_text(s->algo_name));
    jsonval_set(rec, "cp_layout", jsonval_text(s->layout_name));
    jsonval_set(rec, "sequence_parallel", json_boolean(s->sequence_parallel));
    if (s->zero_stage) jsonval_set(rec, "zero_stage", json_integer(1)); /* absent: 0 */
    jsonval_set(rec, "replicas_identical", s->check_sync ? json_boolean(s->in_sync) : json_null());
    report3d_record(&s->rep, &s->grid, rec);
    r->run.bubble_theory = s->theory;
    r->run.params_held = s->pr.n;
    if (!s->experts) {
        r->run.comms[0] = s->grid.tp;
        r->run.comms[1] = s->grid.cp;
        r->run.comms[2] = s->grid.pipe;
        r->run.comms[3] = s->grid.dp;
        r->run.params = s->tl.g.total;
        r->run.comm_formula_bytes = s->rep.formula_ring_bytes;
        r->run.acts_formula_bytes = pipeline_acts_formula_bytes(&s->pr);
    } else { /* the CP, pipeline, replicas, EP and EDP groups; lab08's own figures after the summary (lab09_print) */
        r->run.comms[0] = s->grid.cp;
        r->run.comms[1] = s->grid.pipe;
        r->run.comms[2] = s->grid.dp;
        r->run.comms[3] = s->ep_group;
        r->run.comms[4] = s->edp_group;
        r->run.params = s->gx.g.total;
        r->run.comm_formula_bytes = -1;
        r->run.comm_formula = NULL;
    }
    /* at --ep 1 the EDP group is the replicas' own (main.c): listed once, or its sums would count twice */
    r->run.n_comms = s->experts ? (s->edp_group == s->grid.dp ? 4 : 5) : 4;
    /* ZeRO-1 over the c x d replicas */
    if (s->zero_stage) stage3d_zero1_states(r, s->states_text, deg[AXIS_TP], deg[AXIS_CP] * deg[AXIS_DP]);
}

/* lab08's figures of the run (rank 0): tokens per expert, all-to-all bytes, parameters per rank. */
static void print_experts(grid_experts *x, process_grid *g, long held, int steps_done) {
    const double steps = steps_done > 0 ? steps_done : 1, vb = (double)value_bytes();
    const double C = (double)x->g.cfg.d_model;
    double sent = (x->eh.counts.rows_sent * C * vb + x->eh.counts.count_bytes_sent) / steps;
    long most = x->eh.counts.max_expert_rows;
    MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_DOUBLE, MPI_MAX, g->world->mpi);
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_LONG, MPI_MAX, g->world->mpi);
    if (g->world->rank != 0) return;
    char a[16];
    printf("  experts: %ld tokens at most on one expert in one layer's forward (the last step) | all-to-all: %sB left "
           "the busiest rank per step (the routing's rows x C x b, and the counts) | parameters per rank: %ld of %ld "
           "(experts at 1/%d)\n", most, human(sent, a), held, x->g.total, x->eh.N);
    fflush(stdout);
}

void lab09_print(run_ctx *ctx, void *lab) {
    lab09 *s = lab;
    if (!s->experts) report3d_print(&s->rep, &s->grid);
    else print_experts(&s->gx, &s->grid, s->pr.n, ctx->steps_done);
}
