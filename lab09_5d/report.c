/* lab09's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "device.h"
#include "jsonval.h"
#include "mesh.h"
#include "schedule.h"
#include "lab_run.h"
#include "theory.h"
#include <math.h>
#include <stddef.h>
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
    const int experts = s->experts = ctx->opt.experts > 0;
    /* with experts, an omitted --ep takes 2 where the experts and the stage's t x c x d ranks allow (so the
     * 8-rank --experts run has four axes: TP, CP, PP and EP folded over them), and beside TP sequence
     * parallelism is on by itself: the experts take each TP rank's own positions (Megatron requires it too) */
    if (experts && !run_flag_given(ctx->argc, ctx->argv, "--ep") && t >= 1 && c >= 1 && d >= 1)
        s->ep = ctx->opt.experts % 2 == 0 && ((long)t * c * d) % 2 == 0 ? 2 : 1;
    if (experts && t > 1) s->sequence_parallel = 1;
    const int m = s->micro_batches, ep = s->ep, zero_stage = s->zero_stage, sequence_parallel = s->sequence_parallel;
    /* lab08's experts in the grid: whole experts (no expert tensor parallelism), the fused backward (lab08's
     * hook); under CP and SP the routing gathers each sequence's choices over the ranks holding its positions
     * (moe_split); beside TP the experts take each rank's own positions, so SP is on (as Megatron requires) */
    run_check(ctx, ep == 1 || experts, "--ep %d needs --experts (experts to spread over the EP group)", ep);
    run_check(ctx, !experts || ((long)t * c * d) % ep == 0, "--ep %d does not divide the %d ranks of a stage (--tp x "
              "--cp x --dp) that EP groups are carved from", ep, t * c * d);
    run_check(ctx, !experts || ctx->opt.experts % ep == 0, "--ep %d does not divide --experts %d (each rank holds "
              "E/e experts a layer)", ep, ctx->opt.experts);
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
        if (per_rank) { /* its place in its EP block: f = tp + t (cp + c dp), EP rank f mod e */
            const int f = c_at(c, MESH_TP) + deg[AXIS_TP] * (c_at(c, MESH_CP) + deg[AXIS_CP] * c_at(c, MESH_DP));
            const int q = f % ep;
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
    char mlp[96];
    if (s->experts) snprintf(mlp, sizeof mlp, "%d of %d experts a layer per rank (EP e=%d over the stage's t x c x d "
                             "ranks)", ctx->opt.experts / s->ep, ctx->opt.experts, s->ep);
    else snprintf(mlp, sizeof mlp, "%d of %d MLP units per rank", s->tl.hidden, 4 * ctx->opt.d_model);
    const char *zero = !s->zero_stage ? ""
                       : !s->experts ? " + ZeRO-1 over the c x d replicas"
                       : deg[AXIS_TP] > 1 ? " + ZeRO-1 (replicated runs over the stage, expert runs over EDP, "
                                            "attention's shards over the c x d replicas)"
                                          : " + ZeRO-1 (replicated runs over the c x d replicas, expert runs over EDP)";
    printf("5D: TP t=%d%s (%d of %d heads, %s) | CP c=%d (%s, %s: %d of %d positions) | "
           "PP p=%d stages x %d chunk%s, m=%d micro-batches of %d rows, %s | DP d=%d replicas of %d rows%s | "
           "bubble theory %s = %.3f\n", deg[AXIS_TP], s->sequence_parallel ? " + SP" : "", s->tl.heads,
           ctx->opt.heads, mlp, c, s->algo_name, s->layout_name, Tl, T, deg[AXIS_PP],
           pr->v, pr->v == 1 ? "" : "s", s->micro_batches, pr->chunk[0].rows, schedule_name(s->kind), deg[AXIS_DP],
           ctx->opt.batch / deg[AXIS_DP], zero, schedule_bubble_textbook_text(s->kind), s->theory);
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
 * (an EP group's ranks hold different ones), at t > 1 those of its ranks that hold the same TP shards */
int lab09_verify(run_ctx *ctx, void *lab) {
    lab09 *s = lab;
    comm same_shards = {0};
    comm *group = s->experts ? s->edp_group : s->grid.dp;
    const int by_tp = s->check_sync && s->experts && s->deg[AXIS_TP] > 1;
    if (by_tp) comm_split(s->edp_group, s->grid.me.tp, s->edp_group->rank, group = &same_shards);
    s->in_sync = s->check_sync ? stage3d_replicas_identical(&s->pr, group) : 1;
    if (by_tp) comm_free(&same_shards);
    if (s->check_sync && ctx->rank == 0) {
        if (s->experts) printf("check-sync: the ranks of every EDP group (the replicas holding the same experts%s) %s\n",
                               by_tp ? ", at the same TP rank" : "", s->in_sync ? "hold bit-identical weights" : "DIFFER");
        else printf("check-sync: the %d replicas (cp x dp) of every (tp, pp) position %s\n",
                    s->deg[AXIS_CP] * s->deg[AXIS_DP], s->in_sync ? "hold bit-identical weights" : "DIFFER");
    }
    return s->in_sync;
}

/* ---- with experts: each group's traffic per step beside its formula ------------------------------------ */

static const char *const experts_group_names[XG_GROUPS] = {"tp", "cp", "seq", "pp", "dp", "stage", "ep", "edp"};
enum { BY_ALLREDUCE, BY_GATHER, BY_P2P, BY_ALLTOALL, BY_KINDS }; /* how run_finish adds the kinds up */

static void add_formula(group_traffic *g, th_traffic t) {
    g->calls_formula += t.calls;
    g->payload_formula += t.payload;
    g->ring_formula += t.ring;
}

/* The groups that communicate (as the record counts them: a group of one rank moves nothing), each once: at
 * --ep 1 the EDP group is the stage's own (main.c: at t = 1 the replicas), the sequence group at c = 1 TP's,
 * at t = 1 CP's, and the stage at t = 1 the replicas. */
static void experts_groups(lab09 *s, comm *groups[XG_GROUPS]) {
    const int t = s->deg[AXIS_TP], c = s->deg[AXIS_CP];
    comm *all[XG_GROUPS] = {s->grid.tp, s->grid.cp, t > 1 && c > 1 ? mesh_sequence(&s->grid.mesh) : NULL,
                            s->grid.pipe, s->grid.dp, t > 1 ? mesh_stage(&s->grid.mesh) : NULL, s->ep_group,
                            s->edp_group};
    for (int k = 0; k < XG_GROUPS; k++) {
        const int again = k == XG_EDP && (all[k] == all[XG_DP] || all[k] == all[XG_STAGE]);
        groups[k] = all[k] && all[k]->size > 1 && !again ? all[k] : NULL;
    }
}

/* Where each kind of run is summed (th_ep_grad_sums' order), and where the routing gathers go. */
static void experts_sums_at(lab09 *s, int at[TH_EP_KINDS], int *routing_at) {
    const int t = s->deg[AXIS_TP], c = s->deg[AXIS_CP];
    at[TH_EP_REPLICATED] = t > 1 ? XG_STAGE : XG_DP;
    at[TH_EP_EXPERTS] = s->edp_group == s->grid.dp ? XG_DP : t > 1 && s->edp_group == mesh_stage(&s->grid.mesh)
                                                                 ? XG_STAGE : XG_EDP;
    at[TH_EP_TP_SHARDED] = XG_DP;
    *routing_at = t == 1 ? XG_CP : c == 1 ? XG_TP : XG_SEQ;
}

static int bucket_of(comm_kind k) {
    return k == COLL_ALLREDUCE ? BY_ALLREDUCE : k == COLL_SEND || k == COLL_RECV ? BY_P2P
           : k == COLL_ALLTOALL ? BY_ALLTOALL : BY_GATHER;
}

/* This rank's groups per step, measured and by theory's formulas (the dry run's, theory/predict.c), and the
 * formulas' ring bytes by kind. The all-to-alls' payload is this run's routing (lab08's counts): every slot
 * row a rank sends, its own included, x C x b, and the counts. */
static void experts_traffic_of_rank(const run_ctx *ctx, lab09 *s, group_traffic *g, double *by_kind) {
    const pipeline_rank *pr = &s->pr;
    const pipeline_stage *st = &pr->chunk[0];
    const int steps = ctx->steps_done > 0 ? ctx->steps_done : 1, m = pr->m, c = s->deg[AXIS_CP];
    const double vb = (double)value_bytes(), C = (double)ctx->model.d_model;
    const th_model tm = lab_theory_model(&ctx->model);
    th_opts o = stage_opts(st);
    o.ep = s->ep;
    const int forwards = o.recompute == RECOMPUTE_FULL ? 2 : 1;
    comm *groups[XG_GROUPS];
    experts_groups(s, groups);
    memset(g, 0, sizeof *g * XG_GROUPS);
    for (int k = 0; k < XG_GROUPS; k++)
        if (groups[k]) group_traffic_measure(groups[k], steps, &g[k]);
    int layers = 0, moe_layers = 0, at[TH_EP_KINDS], routing_at;
    experts_sums_at(s, at, &routing_at);
    double elems[TH_EP_KINDS] = {0, 0, 0};
    for (int q = 0; q < pr->v; q++) { /* the gradient's sums, each kind of run over its group (experts.h) */
        const pipeline_stage *ch = &pr->chunk[q];
        layers += ch->hi - ch->lo;
        moe_layers += th_moe_layers(&tm, ch->lo, ch->hi);
        if (s->zero_stage) {
            th_ep_stage_elements(&tm, &o, ch->lo, ch->hi, elems);
            continue;
        }
        th_traffic sums[TH_EP_KINDS];
        th_ep_grad_sums(&tm, &o, ch->lo, ch->hi, vb, s->gx.sh.group[RUNS_REPLICATED]->size,
                        s->gx.sh.group[RUNS_EXPERT]->size, s->gx.sh.group[RUNS_TP_SHARDED]->size, sums);
        for (int k = 0; k < TH_EP_KINDS; k++) {
            add_formula(&g[at[k]], sums[k]);
            by_kind[BY_ALLREDUCE] += sums[k].ring;
        }
    }
    for (int k = 0; s->zero_stage && k < TH_EP_KINDS; k++) { /* ZeRO-1: a reduce-scatter and an all-gather a kind */
        if (elems[k] <= 0) continue;
        double slice;
        const th_traffic z = th_ep_zero_traffic(elems[k], s->gx.sh.group[k]->size, vb, &slice);
        add_formula(&g[at[k]], z);
        by_kind[BY_GATHER] += z.ring;
    }
    if (groups[XG_TP]) { /* SP's all-gather and reduce-scatter around attention (the experts take the shard) */
        const double act = vb * st->rows * st->g->cfg.seq * C;
        const th_traffic tp = th_tp_traffic_run(layers, m, act, &o);
        const th_traffic half = {tp.calls / 2, tp.payload / 2, tp.ring / 2};
        add_formula(&g[XG_TP], half);
        by_kind[BY_GATHER] += half.ring;
    }
    const th_traffic pp = th_pp_traffic(schedule_remote_links(&pr->sched, pr->rank), m, 1, vb * st->boundary_values);
    add_formula(&g[XG_PP], pp);
    by_kind[BY_P2P] += pp.ring;
    if (groups[XG_CP]) { /* CP's exchanges (lab06's table's formula) */
        th_traffic per_kind[COLL_NKINDS];
        report3d_cp_traffic(st, &ctx->model, c, layers, m, per_kind);
        for (int k = 0; k < COLL_NKINDS; k++) {
            add_formula(&g[XG_CP], per_kind[k]);
            by_kind[bucket_of((comm_kind)k)] += per_kind[k].ring;
        }
    }
    if (groups[routing_at]) { /* each MoE layer's routing gathers, over the ranks holding a sequence's positions */
        double each[2];
        const int t = s->deg[AXIS_TP];
        const th_traffic gathers = th_ep_routing_gathers((double)forwards * moe_layers * m, t * c,
                                                         (double)st->rows * st->g->cfg.seq / t, ctx->model.experts,
                                                         ctx->model.top_k, each);
        add_formula(&g[routing_at], gathers);
        by_kind[BY_GATHER] += gathers.ring;
    }
    if (groups[XG_EP]) {
        const ep_counts *n = &s->gx.eh.counts;
        const double routed = ((n->rows_sent + n->rows_kept) * C * vb + n->count_bytes_sent + n->count_bytes_kept) / steps;
        const th_traffic a2a = {th_ep_alltoall_calls((double)moe_layers * m, forwards), routed,
                                routed * comm_ring_factor(COLL_ALLTOALL, s->ep_group->size)};
        add_formula(&g[XG_EP], a2a);
        by_kind[BY_ALLTOALL] += a2a.ring;
    }
}

/* Collective: every rank's groups to rank 0 (s->experts_traffic), and the formulas' busiest-rank ring bytes. */
static void experts_traffic_gather(const run_ctx *ctx, lab09 *s) {
    group_traffic mine[XG_GROUPS];
    double by_kind[BY_KINDS] = {0};
    experts_traffic_of_rank(ctx, s, mine, by_kind);
    const int fields = XG_GROUPS * (int)(sizeof(group_traffic) / sizeof(double)); /* group_traffic: doubles only */
    if (ctx->rank == 0 && !(s->experts_traffic = calloc((size_t)ctx->size * XG_GROUPS, sizeof(group_traffic))))
        die("out of host memory");
    MPI_Gather(mine, fields, MPI_DOUBLE, s->experts_traffic, fields, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Reduce(ctx->rank == 0 ? MPI_IN_PLACE : by_kind, by_kind, BY_KINDS, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    s->experts_formula_ring = 0;
    for (int k = 0; k < BY_KINDS; k++) s->experts_formula_ring += by_kind[k];
}

static double group_max(const group_traffic *rows, int ranks, int group, size_t field) {
    double most = 0;
    for (int r = 0; r < ranks; r++) most = fmax(most, *(const double *)((const char *)&rows[r * XG_GROUPS + group] + field));
    return most;
}

static void experts_traffic_record(const run_ctx *ctx, lab09 *s, json_t *record) {
    static const struct { const char *key; size_t field; } columns[] = {
        {"calls", offsetof(group_traffic, calls)}, {"payload_bytes", offsetof(group_traffic, payload)},
        {"ring_bytes", offsetof(group_traffic, ring)}, {"seconds", offsetof(group_traffic, seconds)},
        {"calls_formula", offsetof(group_traffic, calls_formula)},
        {"payload_bytes_formula", offsetof(group_traffic, payload_formula)},
        {"ring_bytes_formula", offsetof(group_traffic, ring_formula)}};
    comm *groups[XG_GROUPS];
    experts_groups(s, groups);
    json_t *traffic = json_object();
    if (!traffic) die("out of host memory");
    for (int k = 0; k < XG_GROUPS; k++) {
        if (!groups[k]) continue;
        json_t *group = json_object();
        if (!group) die("out of host memory");
        jsonval_set(group, "group_size", json_integer(groups[k]->size));
        for (int c = 0; c < (int)(sizeof columns / sizeof columns[0]); c++) {
            json_t *column = json_array();
            if (!column) die("out of host memory");
            for (int r = 0; r < ctx->size; r++)
                jsonval_append(column, jsonval_figure(*(const double *)((const char *)&s->experts_traffic[r * XG_GROUPS + k]
                                                                        + columns[c].field)));
            jsonval_set(group, columns[c].key, column);
        }
        jsonval_set(traffic, experts_group_names[k], group);
    }
    jsonval_set(record, "traffic_per_group", traffic);
}

/* Rank 0: lab06's table for the groups a run with experts has. */
static void experts_traffic_print(const run_ctx *ctx, lab09 *s) {
    const int t = s->deg[AXIS_TP];
    int at[TH_EP_KINDS], routing_at;
    experts_sums_at(s, at, &routing_at);
    const char *titles[XG_GROUPS] = {"TP AG+RS     ", "CP           ", "SEQ routing  ", "PP send+recv ",
                                     "DP all-reduce", "STAGE all-red", "EP all-to-all", "EDP all-reduce"};
    const char *formulas[XG_GROUPS] = {
        "stage layers x m x SP's all-gather and reduce-scatter around attention, forward and backward (the "
        "experts take each rank's own positions: none around the MLP), each of (B/(d m)) x T/c x C values",
        "stage layers x m x CP's K|V exchanges (lab07's, as without experts)",
        "",
        "2 x boundaries x m messages of (B/(d m)) x T/c x C values (activation out, gradient back)",
        t > 1 ? "each layer's TP-sharded pieces (attention's q|k|v and output matrices), one all-reduce over the c "
                "x d replicas; ring 2(cd-1)/(cd)"
              : "the replicated runs (embedding, each layer's attention and router, head), one all-reduce each over "
                "the c x d replicas; ring 2(cd-1)/(cd)",
        "the replicated runs (embedding, each layer's LayerNorm, attention's output bias with the next LayerNorm, "
        "router, head), partial on each rank's positions: one all-reduce each over the t x c x d ranks of the "
        "stage; ring 2(n-1)/n",
        "MoE layers x m x (3 a forward: the counts, the dispatch, the combine; 2 a backward); payload: this run's "
        "routing, every slot row sent (the rank's own block included) x C x b, and the counts",
        "each layer's 4 expert tensors, one all-reduce each over the ranks holding the same experts; ring "
        "2(n-1)/n"};
    char routing[400];
    snprintf(routing, sizeof routing, "%s%sMoE layers x m x 2 all-gathers of the routing (every rank's P [N,E] fp32 "
             "and choices [N,k] int32 over the %d ranks holding a sequence's positions: capacity and aux loss per "
             "whole sequence)", routing_at == XG_SEQ ? "" : formulas[routing_at], routing_at == XG_SEQ ? "" : " + ",
             t * s->deg[AXIS_CP]);
    formulas[routing_at] = routing;
    if (routing_at == XG_CP) titles[XG_CP] = "CP + routing ";
    if (routing_at == XG_TP) titles[XG_TP] = "TP + routing ";
    if (s->zero_stage) {
        titles[XG_DP] = "DP RS+AG     ";
        titles[XG_STAGE] = "STAGE RS+AG  ";
        titles[XG_EDP] = "EDP RS+AG    ";
        formulas[XG_DP] = t > 1 ? "ZeRO-1: 1 reduce-scatter + 1 all-gather of the rank's TP-sharded runs, packed and "
                                  "padded to c x d slices; ring (cd-1)/(cd) each"
                                : "ZeRO-1: 1 reduce-scatter + 1 all-gather of the rank's replicated runs, packed and "
                                  "padded to c x d slices (--ep 1: and of its experts' runs); ring (cd-1)/(cd) each";
        formulas[XG_STAGE] = "ZeRO-1: 1 reduce-scatter + 1 all-gather of the rank's replicated runs, packed and padded "
                             "to the stage's t x c x d slices (--ep 1: and of its experts' runs); ring (n-1)/n each";
        formulas[XG_EDP] = "ZeRO-1: 1 reduce-scatter + 1 all-gather of the rank's expert runs, packed and padded to "
                           "the EDP group's n slices; ring (n-1)/n each";
    } else if (at[TH_EP_EXPERTS] != XG_EDP)
        formulas[at[TH_EP_EXPERTS]] = t > 1 ? "the replicated runs (embedding, each layer's LayerNorm, attention's "
                                              "output bias with the next LayerNorm, router, head) and each layer's 4 "
                                              "expert tensors (--ep 1: each rank holds every expert), one all-reduce "
                                              "each over the t x c x d ranks of the stage; ring 2(n-1)/n"
                                            : "every run (embedding, each layer's attention and router, its experts' "
                                              "4 tensors, head), one all-reduce each over the c x d replicas (--ep 1: "
                                              "each holds every expert); ring 2(cd-1)/(cd)";
    comm *groups[XG_GROUPS];
    experts_groups(s, groups);
    const group_traffic *rows = s->experts_traffic;
    char a[16], b[16], c[16], e[16];
    printf("\ntraffic per group kind per rank per step, busiest rank, measured | formula:\n");
    for (int k = 0; k < XG_GROUPS; k++) {
        if (!groups[k]) continue;
        int mismatches = 0;
        for (int r = 0; r < ctx->size; r++) {
            const group_traffic *x = &rows[r * XG_GROUPS + k];
            mismatches += x->calls != x->calls_formula || fabs(x->payload - x->payload_formula) > 0.5 ||
                          fabs(x->ring - x->ring_formula) > 0.5;
        }
        const char *wire = k == XG_PP ? "point to point" : k == XG_EP ? "to other ranks" : "ring";
        printf("  %s (groups of %d): %4.0f calls, payload %sB, %s %sB, %.1f ms | %.0f calls, %sB, %s %sB%s\n",
               titles[k], groups[k]->size, group_max(rows, ctx->size, k, offsetof(group_traffic, calls)),
               human(group_max(rows, ctx->size, k, offsetof(group_traffic, payload)), a), wire,
               human(group_max(rows, ctx->size, k, offsetof(group_traffic, ring)), b),
               1e3 * group_max(rows, ctx->size, k, offsetof(group_traffic, seconds)),
               group_max(rows, ctx->size, k, offsetof(group_traffic, calls_formula)),
               human(group_max(rows, ctx->size, k, offsetof(group_traffic, payload_formula)), c), wire,
               human(group_max(rows, ctx->size, k, offsetof(group_traffic, ring_formula)), e),
               mismatches ? " MISMATCH" : "");
        printf("      formula: %s%s\n", formulas[k], mismatches ? "" : "; every rank's measured figures equal its own");
    }
    fflush(stdout);
}

void lab09_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab09 *s = lab;
    const int *deg = s->deg;
    if (!s->experts) report3d_gather(&s->rep, &s->grid, &s->pr, ctx);
    else experts_traffic_gather(ctx, s);
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
    if (s->experts && ctx->rank == 0) experts_traffic_record(ctx, s, rec);
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
    } else { /* the groups of the table, each once; lab08's own figures after the summary (lab09_print) */
        comm *groups[XG_GROUPS];
        experts_groups(s, groups);
        /* the record's order at t = 1: CP, pipeline, replicas, EP, EDP (a group of one moves nothing) */
        static const int order[XG_GROUPS] = {XG_CP, XG_PP, XG_DP, XG_EP, XG_EDP, XG_TP, XG_SEQ, XG_STAGE};
        comm *all[XG_GROUPS] = {s->grid.tp, s->grid.cp, NULL, s->grid.pipe, s->grid.dp, NULL, s->ep_group,
                                s->edp_group};
        r->run.n_comms = 0;
        for (int k = 0; k < XG_GROUPS; k++) { /* the size-1 ones too, as before: they add nothing */
            comm *g = groups[order[k]] ? groups[order[k]] : order[k] == XG_EDP ? NULL : all[order[k]];
            if (order[k] == XG_TP && s->deg[AXIS_TP] == 1) g = NULL;
            if (g) r->run.comms[r->run.n_comms++] = g;
        }
        r->run.params = s->gx.g.total;
        r->run.comm_formula_bytes = s->experts_formula_ring;
        r->run.comm_formula = "busiest rank: TP's and CP's exchanges and the routing gathers + PP sends and "
                              "receives + the replicas', stage's and EDP's all-reduces + EP's all-to-alls (this "
                              "run's routing), the formulas below";
    }
    if (!s->experts) r->run.n_comms = 4;
    /* ZeRO-1 over the c x d replicas; with experts over two groups, whose slices have no one formula per
     * parameter: the dry run predicts each rank's optimizer state instead */
    if (s->zero_stage && !s->experts) stage3d_zero1_states(r, s->states_text, deg[AXIS_TP], deg[AXIS_CP] * deg[AXIS_DP]);
    else if (s->zero_stage) r->model_states = 0;
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
    else {
        if (ctx->rank == 0) experts_traffic_print(ctx, s);
        print_experts(&s->gx, &s->grid, s->pr.n, ctx->steps_done);
    }
}
