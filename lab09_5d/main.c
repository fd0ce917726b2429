/* lab09_5d: the grid, tensor x context x pipeline x data parallelism in one run.
 *
 * lab06's grid (TP layers in pipeline stages, replicated by DP) gains lab07's
 * axis: the c ranks of a CP group split every sequence of their rows, each
 * running the whole stage on its T/c positions, and only attention, CP's slot
 * of the layer, exchanges keys and values (ring, all-gather or Ulysses). The
 * layer is one table of slots (common/model.h gpt_layer_hooks): TP fills its
 * linears and regions (lab05), CP its attention (lab07), in the same layer.
 *
 * The ranks form a mesh (common/mesh.h), TP fastest, then CP, DP, PP:
 *
 *     rank = tp + t x (cp + c x (dp + d x pp))
 *
 * TP's all-reduces sit between every two matrix products, so its ranks share a
 * host; CP's K/V blocks travel once per attention, next; the pipeline's one
 * activation per micro-batch may cross hosts. CP ranks hold the same weights as
 * the DP replicas do, so for the gradient the c x d ranks of a (tp, pp) are one
 * group of replicas (mesh_replicas, Megatron's data-parallel group with
 * context parallelism): each computes the mean loss of its rows' positions,
 * their average is the mean over the global batch, and lab06's machinery
 * (all-reduce, ZeRO-1, the clip by the whole model's norm) runs over it as
 * over its DP axis. So every layout reproduces `lab01_dp -n 1`.
 *
 * The fifth axis, --experts E --ep e (at t = c = 1): lab08's experts in the
 * MLP slot, E/e a layer on each rank of an EP group carved from the replicas
 * (common/mesh.h); experts.h says how their gradients are summed.
 *
 * What to look at: the mesh map printed at start (which rank holds which
 * layers, heads, positions and experts, on which host); the losses and
 * gradient norms, equal to `lab01_dp -n 1`; the traffic lines, one per group
 * kind beside its formula; the activations per rank beside the formula. */
#include "checkpoint.h"
#include "comm.h"
#include "cp.h"
#include "device.h"
#include "dp.h"
#include "executor.h"
#include "experts.h"
#include "grid.h"
#include "lab_run.h"
#include "jsonval.h"
#include "mesh.h"
#include "model.h"
#include "report3d.h"
#include "run.h"
#include "schedule.h"
#include "stage.h"
#include "stage3d.h"
#include "theory.h"
#include "tp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { AXIS_TP, AXIS_CP, AXIS_PP, AXIS_DP, AXES }; /* the flags' order: omitted ones take 2 in this order */
static const char *const axis_flags[AXES] = {"--tp", "--cp", "--pp", "--dp"};

/* lab06's process_grid over the mesh, its DP axis the c x d replicas: lab06's
 * stage code (gradient sync, ZeRO-1, norm, loss) sees CP ranks as replicas. */
static void grid_of_mesh(process_grid *g, const int *deg, int ep, comm_backend backend) {
    memset(g, 0, sizeof *g);
    const mesh_dims dims = {.size = {deg[AXIS_TP], deg[AXIS_CP], deg[AXIS_DP], deg[AXIS_PP]}, .ep = ep};
    mesh_init(&g->mesh, dims, backend);
    const mesh_coord me = g->mesh.me;
    g->dims = (grid_dims){deg[AXIS_TP], deg[AXIS_PP], deg[AXIS_CP] * deg[AXIS_DP]};
    g->me = (grid_coord){me.at[MESH_TP], me.at[MESH_PP], me.at[MESH_CP] + deg[AXIS_CP] * me.at[MESH_DP]};
    g->world = &g->mesh.world;
    g->tp = &g->mesh.axis[MESH_TP];
    g->pipe = &g->mesh.axis[MESH_PP];
    g->dp = mesh_replicas(&g->mesh);
    g->cp = &g->mesh.axis[MESH_CP];
}

static int c_at(mesh_coord c, mesh_axis a) { return c.at[a]; }

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
            printf(" | experts %d-%d (ep group %d)", q * per_rank, (q + 1) * per_rank - 1, f / ep);
        }
        printf("\n");
    }
    fflush(stdout);
    free(all);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int ranks;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    int deg[AXES];
    grid_defaults_axes(ranks, deg, AXES); /* what --help shows for this rank count */
    int micro_batches = 4, virtual_stages = 2, check_sync = 0, zero_stage = 0, sequence_parallel = 0, ep = 1;
    const char *schedule_arg = "1f1b", *layout_name = "zigzag", *algo_name = "ring";
    flag_spec flags[] = {
        {"--tp", FLAG_INT, &deg[AXIS_TP], "tensor-parallel degree t (omitted: 2 if the ranks allow)", 1, NULL},
        {"--cp", FLAG_INT, &deg[AXIS_CP], "context-parallel degree c, ranks splitting each sequence (omitted: 2 if "
         "the ranks --tp leaves allow)", 1, NULL},
        {"--pp", FLAG_INT, &deg[AXIS_PP], "pipeline stages p (omitted: 2 if the ranks left allow)", 1, NULL},
        {"--dp", FLAG_INT, &deg[AXIS_DP], "data-parallel replicas d (omitted: the ranks left); t x c x p x d = ranks",
         1, NULL},
        {"--ep", FLAG_INT, &ep, "expert-parallel degree e (with --experts): each EP group of e replicas, carved from "
         "the c x d ranks of a (tp, pp), holds E/e experts a layer and exchanges tokens by all-to-all (lab08)", 1,
         NULL},
        {"--micro-batches", FLAG_INT, &micro_batches, "micro-batches per replica and step (must divide --batch / --dp)",
         1, NULL},
        {"--schedule", FLAG_STRING, &schedule_arg,
         "lab04's pipeline schedules: gpipe, 1f1b, interleaved (--virtual-stages chunks per rank), zb-h1, zb-v", 0,
         SCHEDULE_CHOICES},
        {"--virtual-stages", FLAG_INT, &virtual_stages,
         "model chunks per rank for --schedule interleaved (--layers must divide by --pp x chunks)", 1, NULL},
        {"--cp-algo", FLAG_STRING, &algo_name, "lab07's attention over the CP group: ring, allgather or ulysses", 0,
         "ring|allgather|ulysses"},
        {"--cp-layout", FLAG_STRING, &layout_name, "lab07's positions per CP rank: zigzag or contiguous", 0,
         "zigzag|contiguous"},
        {"--sequence-parallel", FLAG_BOOL, &sequence_parallel,
         "lab05's sequence parallelism in every TP group (needs --tp >= 2): outside the TP regions a rank holds "
         "1/t of its CP rank's T/c positions; pipeline messages carry T/(c t)", 0, NULL},
        {"--zero-stage", FLAG_INT, &zero_stage, "0, or 1: lab06's ZeRO-1, the optimizer state sharded over the c x d "
         "ranks that hold the same weights (needs c x d >= 2)", 0, NULL},
        {"--check-sync", FLAG_BOOL, &check_sync, "verify at the end that the c x d replicas of every (tp, pp) hold "
         "bit-identical weights (exit 1 if not)", 0, NULL},
    };
    lab_info lab = {"lab09_5d", "the grid: tensor-parallel layers (lab05) with context-parallel attention (lab07) in "
                    "pipeline stages (lab04), replicated by data parallelism (lab01)", flags,
                    (int)(sizeof flags / sizeof flags[0])};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    grid_choose_axes(&ctx, argc, argv, axis_flags, deg, AXES);
    const int t = deg[AXIS_TP], c = deg[AXIS_CP], p = deg[AXIS_PP], d = deg[AXIS_DP], m = micro_batches;
    const int experts = ctx.opt.experts > 0;
    /* lab08's experts in the grid: whole sequences on every rank (the capacity and the aux loss are per
     * sequence), whole experts (no expert tensor parallelism), the fused backward (lab08's hook) */
    run_check(&ctx, ep == 1 || experts, "--ep %d needs --experts (experts to spread over the EP group)", ep);
    run_check(&ctx, !experts || t == 1, "--experts with --tp %d: expert tensor parallelism is not taught (lab09 runs "
              "experts at --tp 1)", t);
    run_check(&ctx, !experts || c == 1, "--experts with --cp %d: the capacity and the aux loss are per sequence, and a "
              "CP rank holds T/c of each (lab09 runs experts at --cp 1)", c);
    run_check(&ctx, !experts || (c * d) % ep == 0, "--ep %d does not divide the %d replicas (--cp x --dp) that EP "
              "groups are carved from", ep, c * d);
    run_check(&ctx, !experts || ctx.opt.experts % ep == 0, "--ep %d does not divide --experts %d (each rank holds "
              "E/e experts a layer)", ep, ctx.opt.experts);
    run_check(&ctx, !experts || zero_stage == 0, "--zero-stage 1 with --experts: the optimizer state of expert "
              "and replicated runs is not sharded yet (lab09 runs experts at --zero-stage 0)");
    tp_check_degree(&ctx, t, "--tp");
    run_check(&ctx, th_stage_split_possible(ctx.opt.layers, p),
              "--pp %d is more than --layers %d: every pipeline stage needs at least one layer", p, ctx.opt.layers);
    const int kind = pipeline_check_flags(&ctx, argc, argv, schedule_arg, p, m, virtual_stages);
    run_check(&ctx, !experts || (kind != SCHEDULE_ZB_H1 && kind != SCHEDULE_ZB_V), "--schedule %s with --experts: "
              "lab08's experts run the fused backward, not its input and weight halves", schedule_arg);
    run_check(&ctx, zero_stage == 0 || zero_stage == 1, "--zero-stage %d: lab09 shards the optimizer state only "
              "(0 or 1); lab02_zero has stages 2 and 3", zero_stage);
    run_check(&ctx, zero_stage == 0 || c * d >= 2, "--zero-stage 1 needs --cp x --dp of at least 2 (%d x %d: no "
              "replicas to shard the optimizer state over)", c, d);
    run_check(&ctx, ctx.opt.batch % ((long)d * m) == 0, "--batch %d is not divisible by --dp %d x --micro-batches %d "
              "(each replica cuts its B/d rows into micro-batches)", ctx.opt.batch, d, m);
    const th_cp_layout cp_layout = strcmp(layout_name, "contiguous") ? TH_CP_ZIGZAG : TH_CP_CONTIGUOUS;
    const th_cp_algo algo = !strcmp(algo_name, "allgather") ? TH_CP_ALLGATHER
                            : !strcmp(algo_name, "ulysses") ? TH_CP_ULYSSES : TH_CP_RING;
    const int chunks = cp_layout == TH_CP_ZIGZAG ? 2 * c : c;
    run_check(&ctx, ctx.opt.seq % chunks == 0, "--seq %d is not divisible by the %d chunks of --cp-layout %s (%s--cp %d)",
              ctx.opt.seq, chunks, layout_name, cp_layout == TH_CP_ZIGZAG ? "2 x " : "", c);
    run_check(&ctx, algo != TH_CP_ULYSSES || t < 1 || c < 1 || ctx.opt.heads % ((long)t * c) == 0,
              "--heads %d is not divisible by --tp %d x --cp %d (--cp-algo ulysses gives each CP rank 1/c of a TP "
              "rank's heads)", ctx.opt.heads, t, c);
    run_check(&ctx, !sequence_parallel || t >= 2, "--sequence-parallel needs --tp of at least 2 (--tp %d: no TP "
              "group to split the sequence over)", t);
    run_check(&ctx, !sequence_parallel || t < 1 || c < 1 || ctx.opt.seq % ((long)c * t) == 0,
              "--sequence-parallel: --seq %d is not divisible by --cp %d x --tp %d (each TP rank holds 1/t of its "
              "CP rank's T/c positions)", ctx.opt.seq, c, t);
    run_setup(&ctx);

    /* theory/predict.h's config of the grid, held against the memory before anything is allocated */
    const int v = schedule_chunks(kind, virtual_stages);
    th_run need = lab_run_config(&ctx);
    need.tp = t;
    need.pp = p;
    need.dp = d;
    need.cp = experts ? 0 : c; /* experts run at c = 1: no CP layers */
    need.ep = experts ? ep : 0;
    need.capacity_factor = ctx.model.capacity_per_rank ? 0 : ctx.model.capacity_factor;
    need.cp_algo = algo;
    need.cp_layout = cp_layout;
    need.micro_batches = m;
    need.schedule = schedule_name(kind);
    need.chunks = v;
    need.zero_stage = zero_stage;
    need.tensor_parallel = 1;
    need.sequence_parallel = sequence_parallel;
    lab_start(&ctx, &need);
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    char layout[128], chunks_text[16] = "", cp_text[32] = "", ep_text[40] = "";
    if (kind == SCHEDULE_INTERLEAVED) snprintf(chunks_text, sizeof chunks_text, " v=%d", v);
    if (c > 1) snprintf(cp_text, sizeof cp_text, " %s %s", algo_name, layout_name);
    if (experts) snprintf(ep_text, sizeof ep_text, " ep=%d E=%d k=%d", ep, ctx.opt.experts, ctx.opt.top_k);
    snprintf(layout, sizeof layout, "tp=%d cp=%d pp=%d dp=%d m=%d %s%s%s%s%s%s", t, c, p, d, m, schedule_name(kind),
             chunks_text, cp_text, sequence_parallel ? " sp" : "", zero_stage ? " zero1" : "", ep_text);
    const char *comm_formula_text = "busiest rank: TP + DP all-reduces (ring) + PP sends and receives + CP's "
                                    "K/V exchanges, the formulas below";
    if (ctx.opt.dry_run)
        lab_dry_run_exit(&ctx, &need, (run_report){.layout = layout, .comm_formula_bytes = DRY_RUN_PREDICTED_RING,
                                                   .comm_formula = comm_formula_text,
                                                   .bubble_theory = schedule_bubble_textbook(kind, p, m, v)});

    process_grid grid;
    grid_of_mesh(&grid, deg, ep, ctx.backend);
    comm *cp = grid.cp;
    const int dp_rank = grid.mesh.me.at[MESH_DP], share = ctx.opt.batch / d, T = ctx.opt.seq, Tl = T / c;

    /* The layer: lab05's TP linears and regions ... */
    tp_layout tl;
    tp_layout_init(&tl, &ctx.model, t, grid.me.tp);
    gpt_layout heads_view = tl.g; /* for CP's attention below: this TP rank's heads of all T positions */
    heads_view.cfg.heads = tl.heads;
    heads_view.cfg.d_model = tl.heads * (ctx.opt.d_model / ctx.opt.heads);
    tl.g.cfg.seq = Tl; /* a TP layer sees a CP rank's T/c positions whole (SP: its regions split them t ways) */
    tp_layout_sequence_parallel(&tl, sequence_parallel);
    stage3d s3 = {0}; /* --experts: lab08's stage model below instead */
    if (!experts) stage3d_init(&s3, &tl, grid.tp);
    /* ... and lab07's attention, on this TP rank's heads (its q|k|v columns) */
    cp_hooks ch = {0};
    if (c > 1) { /* --cp 1: lab06's layer, attention whole */
        cp_hooks_init(&ch, &heads_view, cp, algo, cp_layout, share / m);
        s3.model.layer.attention_forward = ch.hooks.attention_forward;
        s3.model.layer.attention_backward = ch.hooks.attention_backward;
        s3.model.layer.attention_ctx = ch.hooks.attention_ctx;
        s3.model.part.att_row = cp_att_row(algo, ctx.opt.d_model / ctx.opt.heads);
        /* the stages' blocks hold this CP rank's T/c positions of every row (SP: this TP rank's 1/t of them) */
        s3.model.positions = cp_positions(&ch) + (sequence_parallel ? (long)tl.rank * (Tl / t) : 0);
        s3.model.data_seq = T;
        s3.model.cp = c;
        s3.model.cp_algo = algo;
    }
    gpt_layout local = tl.g; /* seq T/c; wpe keeps all T rows: the embedding reads them by global position */
    /* --experts: lab08's MLP slot instead (at t = c = 1), over the EP group carved from the replicas */
    grid_experts gx;
    comm self; /* e = 1: each rank an EP group of its own, holding every expert */
    comm *ep_group = &grid.mesh.ep, *edp_group = &grid.mesh.edp;
    if (experts && ep == 1) {
        comm_split(grid.world, grid.world->rank, 0, &self);
        comm_set_axis(&self, "ep");
        ep_group = &self;
        edp_group = grid.dp;
    }
    if (experts) grid_experts_init(&gx, &ctx.model, ep_group, edp_group, grid.dp, share / m);
    const stage_model model = experts ? grid_experts_model(&gx) : s3.model;

    /* This rank trains on rows [dp x B/d, (dp+1) x B/d) of every global batch,
     * its positions of them; the replicas (cp, dp) share the optimizer state
     * under ZeRO-1. Each micro-batch's loss weight is 1/(B/d x T/c): the mean
     * over its positions, and the replicas' average the global batch's mean. */
    pipeline_rank pr;
    pipeline_init_sharded(&pr, grid.pipe, experts ? &gx.g : &local, &model, &ctx.data, (uint64_t)ctx.opt.seed,
                          dp_rank * share, share, kind, m, virtual_stages, zero_stage ? c * d : 1, grid.me.dp);
    if (!experts) stage3d_alloc_partials(&s3, &pr);
    dp_grad_sync dp_sync;
    if (!zero_stage && !experts) dp_sync_init(&dp_sync, grid.dp, pr.grads, 0, pr.n, 0);
    ckpt_view view;
    if (experts) grid_experts_checkpoint_view(&pr, &gx, &view);
    else stage3d_checkpoint_view(&pr, &tl, &view);
    const int first = ckpt_resume(&ctx, &view);
    stage3d_params_from_master(&pr, &grid);
    const double theory = schedule_bubble_textbook(kind, p, m, pr.v);
    int *all_positions = malloc(sizeof(int) * (size_t)T); /* --cp 1: every position, in order */
    if (!all_positions) die("out of host memory");
    for (int i = 0; i < T; i++) all_positions[i] = i;
    print_map(&ctx, deg, c > 1 ? cp_positions(&ch) : all_positions, Tl, tl.heads, experts ? ep : 0);
    free(all_positions);
    if (ctx.rank == 0) {
        printf("5D: TP t=%d%s (%d of %d heads, %d of %d MLP units per rank) | CP c=%d (%s, %s: %d of %d positions) | "
               "PP p=%d stages x %d chunk%s, m=%d micro-batches of %d rows, %s | DP d=%d replicas of %d rows%s | "
               "bubble theory %s = %.3f\n", t, sequence_parallel ? " + SP" : "", tl.heads, ctx.opt.heads, tl.hidden, 4 * ctx.opt.d_model, c, algo_name,
               layout_name, Tl, T, p, pr.v, pr.v == 1 ? "" : "s", m, pr.chunk[0].rows, schedule_name(kind), d, share,
               zero_stage ? " + ZeRO-1 over the c x d replicas" : "", schedule_bubble_textbook_text(kind), theory);
        fflush(stdout);
    }

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i;
        run_step_begin(&ctx, i);
        pipeline_step_begin(&pr, step);
        pipeline_run(&pr);                                  /* lab04's schedule; TP layers, CP attention inside */
        double grad_norm, loss;
        if (experts) { /* lab08's runs: replicated over the replicas, experts over EDP; the step's expert figures */
            loss = grid_experts_optimizer_step(&pr, &gx, grid.pipe, &ctx.adamw, ctx.opt.clip, &grad_norm);
            run_experts_tally *tallies = malloc(sizeof *tallies * (size_t)pr.v);
            if (!tallies) die("out of host memory");
            for (int k = 0; k < pr.v; k++) tallies[k] = pr.chunk[k].moe;
            run_experts_report(&ctx, grid.world, tallies, pr.v, d, i); /* stages: their layers; replicas: rows */
            free(tallies);
        } else {
            if (c * d > 1 && !zero_stage) dp_sync_finish(&dp_sync); /* lab01's average, over the c x d replicas */
            loss = stage3d_optimizer_step(&pr, &s3, &grid, &ctx.adamw, ctx.opt.clip, &grad_norm);
        }
        char bubble[64];
        run_step_end(&ctx, i, loss, grad_norm, pipeline_bubble_text(&pr, theory, bubble));
        ckpt_step_done(&ctx, &view, step + 1);
    }
    const ep_counts training_counts = experts ? gx.eh.counts : (ep_counts){0}; /* the figures are the training's */
    /* --eval: lab06's, its EP all-to-alls out of the traffic counts too */
    const double eval_loss = ctx.opt.eval ? ckpt_print_eval(&ctx, stage3d_evaluate(&ctx, &pr, &grid, sequence_parallel,
                                                                                  experts ? ep_group : NULL)) : -1;
    if (experts) gx.eh.counts = training_counts;

    /* lab06's check over the c x d replicas; with experts over each EDP group, whose ranks hold the same experts
     * (an EP group's ranks hold different ones) */
    const int in_sync = check_sync ? stage3d_replicas_identical(&pr, experts ? edp_group : grid.dp) : 1;
    if (check_sync && ctx.rank == 0) {
        if (experts) printf("check-sync: the ranks of every EDP group (the replicas holding the same experts) %s\n",
                            in_sync ? "hold bit-identical weights" : "DIFFER");
        else printf("check-sync: the %d replicas (cp x dp) of every (tp, pp) position %s\n", c * d,
                    in_sync ? "hold bit-identical weights" : "DIFFER");
    }

    report3d rep = {0};
    if (!experts) report3d_gather(&rep, &grid, &pr, &ctx); /* the experts' traffic has no formula here yet */
    size_t json_len = (rep.json ? strlen(rep.json) : 0) + 512;
    char *extra_json = malloc(json_len);
    if (!extra_json) die("out of host memory");
    snprintf(extra_json, json_len, "\"tp\":%d,\"cp\":%d,\"pp\":%d,\"dp\":%d,\"ep\":%d,\"micro_batches\":%d,"
             "\"schedule\":\"%s\","
             "\"chunks_per_rank\":%d,\"cp_algo\":\"%s\",\"cp_layout\":\"%s\",\"sequence_parallel\":%s,%s"
             "\"replicas_identical\":%s%s%s", t, c, p, d, experts ? ep : 0, m, schedule_name(kind), pr.v, algo_name, layout_name,
             sequence_parallel ? "true" : "false", zero_stage ? "\"zero_stage\":1," : "",
             check_sync ? (in_sync ? "true" : "false") : "null", rep.json ? "," : "",
             rep.json ? rep.json : "");
    run_report report = {.layout = layout, .comms = {grid.tp, cp, grid.pipe, grid.dp}, .n_comms = 4,
                         .params = tl.g.total, .comm_formula_bytes = rep.formula_ring_bytes,
                         .comm_formula = comm_formula_text, .bubble_theory = theory, .params_held = pr.n,
                         .acts_formula_bytes = pipeline_acts_formula_bytes(&pr)};
    if (experts) { /* the pipeline, replicas, EP and EDP groups; lab08's own figures below */
        report = (run_report){.layout = layout, .comms = {grid.pipe, grid.dp, ep_group, edp_group}, .n_comms = 4,
                              .params = gx.g.total, .comm_formula_bytes = -1, .bubble_theory = theory,
                              .params_held = pr.n};
    }
    char states_text[64];
    if (zero_stage) stage3d_zero1_states(&report, states_text, t, c * d); /* ZeRO-1 over the c x d replicas */
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra_json, "the lab's record members"), !zero_stage, report);
    if (!experts) report3d_print(&rep, &grid);
    else print_experts(&gx, &grid, pr.n, ctx.steps_done);
    report3d_free(&rep);
    free(extra_json);
    pipeline_free(&pr);
    if (experts) grid_experts_free(&gx);
    if (experts && ep == 1) comm_free(&self);
    cp_hooks_free(&ch);
    if (!experts) stage3d_free(&s3);
    grid_free(&grid);
    MPI_Finalize();
    return run_exit_status(&ctx, in_sync ? 0 : 1);
}
