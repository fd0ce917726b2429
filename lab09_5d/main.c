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
 * The fifth axis, --experts E --ep e: lab08's experts in the MLP slot, E/e a
 * layer on each rank of an EP group carved from the stage's t x c x d ranks
 * (common/mesh.h); beside TP under sequence parallelism, each rank's tokens
 * its own positions. experts.h says how their gradients are summed.
 *
 * What to look at: the mesh map printed at start (which rank holds which
 * layers, heads, positions and experts, on which host); the losses and
 * gradient norms, equal to `lab01_dp -n 1`; the traffic lines, one per group
 * kind beside its formula; the activations per rank beside the formula. */
#include "experts_metrics.h"
#include "report.h"
#include "mesh.h"
#include "schedule.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* lab06's process_grid over the mesh, its DP axis the c x d replicas: lab06's
 * stage code (gradient sync, ZeRO-1, norm, loss) sees CP ranks as replicas. */
static void grid_of_mesh(process_grid *g, const int *deg, int ep, int experts, comm_backend backend) {
    memset(g, 0, sizeof *g);
    const mesh_dims dims = {.size = {deg[AXIS_TP], deg[AXIS_CP], deg[AXIS_DP], deg[AXIS_PP]}, .ep = ep,
                            .experts = experts};
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

static void setup(run_ctx *ctx, void *lab, ckpt_view *view) {
    lab09 *s = lab;
    const int t = s->deg[AXIS_TP], c = s->deg[AXIS_CP], d = s->deg[AXIS_DP], m = s->micro_batches;
    grid_of_mesh(&s->grid, s->deg, s->ep, s->experts, ctx->backend);
    const int share = ctx->opt.batch / d, Tl = ctx->opt.seq / c;

    /* The layer: lab05's TP linears and regions ... */
    tp_layout_init(&s->tl, &ctx->model, t, s->grid.me.tp);
    s->heads_view = s->tl.g; /* for CP's attention below: this TP rank's heads of all T positions */
    s->heads_view.cfg.heads = s->tl.heads;
    s->heads_view.cfg.d_model = s->tl.heads * (ctx->opt.d_model / ctx->opt.heads);
    s->tl.g.cfg.seq = Tl; /* a TP layer sees a CP rank's T/c positions whole (SP: its regions split them t ways) */
    tp_layout_sequence_parallel(&s->tl, s->sequence_parallel);
    if (c > 1) cp_hooks_init(&s->ch, &s->heads_view, s->grid.cp, s->algo, s->cp_layout, share / m);
    s->local = s->tl.g; /* seq T/c; wpe keeps all T rows: the embedding reads them by global position */

    /* --experts: lab08's MLP slot, over the EP group carved from the stage's t x c x d ranks (experts.h);
     * under CP or SP the routing sees whole sequences through the ranks that hold their positions, the
     * mesh's sequence group (common/moe.h moe_split) */
    s->ep_group = &s->grid.mesh.ep;
    s->edp_group = &s->grid.mesh.edp;
    if (s->experts && s->ep == 1) { /* each rank an EP group of its own, holding every expert */
        comm_split(s->grid.world, s->grid.world->rank, 0, &s->self);
        comm_set_axis(&s->self, "ep");
        s->ep_group = &s->self;
        s->edp_group = mesh_stage(&s->grid.mesh);
    }
    if (s->experts) {
        const int Ts = Tl / t; /* a rank's positions of each sequence (t > 1: SP's) */
        if (t * c > 1) { /* the sequence group's ranks, tp + t x cp: their positions (CP's, each TP rank 1/t) */
            if (!(s->seq_positions = malloc(sizeof(int) * (size_t)ctx->opt.seq))) die("out of host memory");
            for (int r = 0; r < t * c; r++)
                for (int i = 0; i < Ts; i++)
                    s->seq_positions[r * Ts + i] = c > 1 ? s->ch.pos_host[r / t * Tl + r % t * Ts + i] : r % t * Ts + i;
        }
        s->split = (moe_split){mesh_sequence(&s->grid.mesh), ctx->opt.seq, s->seq_positions};
        grid_experts_init(&s->gx, &ctx->model, Tl, t * c > 1 ? &s->split : NULL, s->ep_group, s->edp_group, s->grid.dp,
                          share / m, &s->tl, s->grid.tp, mesh_stage(&s->grid.mesh));
    } else {
        stage3d_init(&s->s3, &s->tl, s->grid.tp);
    }
    stage_model *sm = s->experts ? &s->model : &s->s3.model;
    if (s->experts) *sm = grid_experts_model(&s->gx);
    /* ... and lab07's attention, on this TP rank's heads (its q|k|v columns) */
    if (c > 1) { /* --cp 1: lab06's layer, attention whole */
        sm->layer.attention_forward = s->ch.hooks.attention_forward;
        sm->layer.attention_backward = s->ch.hooks.attention_backward;
        sm->layer.attention_ctx = s->ch.hooks.attention_ctx;
        sm->part.att_row = cp_att_row(s->algo, ctx->opt.d_model / ctx->opt.heads);
        /* the stages' blocks hold this CP rank's T/c positions of every row (SP: this TP rank's 1/t of them) */
        sm->positions = cp_positions(&s->ch) + (s->sequence_parallel ? (long)s->tl.rank * (Tl / t) : 0);
        sm->data_seq = ctx->opt.seq;
        sm->cp = c;
        sm->cp_algo = s->algo;
    }
    if (!s->experts) s->model = s->s3.model;

    /* This rank trains on rows [dp x B/d, (dp+1) x B/d) of every global batch,
     * its positions of them; the replicas (cp, dp) share the optimizer state
     * under ZeRO-1. Each micro-batch's loss weight is 1/(B/d x T/c): the mean
     * over its positions, and the replicas' average the global batch's mean. */
    pipeline_init_sharded(&s->pr, s->grid.pipe, s->experts ? &s->gx.g : &s->local, &s->model, &ctx->data,
                          (uint64_t)ctx->opt.seed, s->grid.mesh.me.at[MESH_DP] * share, share, s->kind, m,
                          s->virtual_stages,
                          /* ZeRO-1 with experts: two kinds of runs, each sharded over its own group (experts.h) */
                          !s->zero_stage ? 1 : s->experts ? PIPELINE_STATES_ELSEWHERE : c * d, s->grid.me.dp);
    if (s->experts && s->zero_stage) grid_experts_zero_init(&s->pr, &s->gx);
    if (!s->experts) stage3d_alloc_partials(&s->s3, &s->pr);
    if (!s->zero_stage && !s->experts) dp_sync_init(&s->dp_sync, s->grid.dp, s->pr.grads, 0, s->pr.n, 0);
    if (s->experts) grid_experts_checkpoint_view(&s->pr, &s->gx, view);
    else stage3d_checkpoint_view(&s->pr, &s->tl, view);
}

static void start(run_ctx *ctx, void *lab) {
    lab09 *s = lab;
    if (s->experts) grid_experts_params_from_master(&s->pr, &s->gx);
    else stage3d_params_from_master(&s->pr, &s->grid);
    s->theory = schedule_bubble_textbook(s->kind, s->deg[AXIS_PP], s->micro_batches, s->pr.v);
    lab09_print_mesh(ctx, s);
}

static void step(run_ctx *ctx, void *lab, int i, int step, lab_step *out) {
    lab09 *s = lab;
    pipeline_step_begin(&s->pr, step);
    pipeline_run(&s->pr); /* lab04's schedule; TP layers, CP attention inside */
    if (s->experts) { /* lab08's runs: replicated over the replicas, experts over EDP; the step's expert figures */
        out->loss = grid_experts_optimizer_step(&s->pr, &s->gx, s->grid.pipe, &ctx->adamw, ctx->opt.clip,
                                                &out->grad_norm);
        run_experts_tally *tallies = malloc(sizeof *tallies * (size_t)s->pr.v);
        if (!tallies) die("out of host memory");
        for (int k = 0; k < s->pr.v; k++) tallies[k] = s->pr.chunk[k].moe;
        /* stages: their layers; the aux loss, each CP and TP rank of the whole sequences, averaged over the
         * t x c x d ranks of a stage */
        run_experts_report(ctx, s->grid.world, tallies, s->pr.v, s->grid.dims.dp * s->grid.dims.tp, i);
        free(tallies);
    } else {
        if (s->grid.dims.dp > 1 && !s->zero_stage) dp_sync_finish(&s->dp_sync); /* lab01's, over the c x d replicas */
        out->loss = stage3d_optimizer_step(&s->pr, &s->s3, &s->grid, &ctx->adamw, ctx->opt.clip, &out->grad_norm);
    }
    out->note = pipeline_bubble_text(&s->pr, s->theory, out->text);
}

static void done(void *lab) {
    lab09 *s = lab;
    report3d_free(&s->rep);
    free(s->experts_traffic);
    pipeline_free(&s->pr);
    if (s->experts) grid_experts_free(&s->gx);
    if (s->experts && s->ep == 1) comm_free(&s->self);
    free(s->seq_positions);
    cp_hooks_free(&s->ch);
    if (!s->experts) stage3d_free(&s->s3);
    grid_free(&s->grid);
}

int main(int argc, char **argv) {
    lab09 lab = {.ep = 1, .micro_batches = 4, .virtual_stages = 2, .schedule_arg = "1f1b", .layout_name = "zigzag",
                 .algo_name = "ring"};
    flag_spec flags[] = {
        {"--tp", FLAG_INT, &lab.deg[AXIS_TP], "tensor-parallel degree t (omitted: 2 if the ranks allow)", 1, NULL},
        {"--cp", FLAG_INT, &lab.deg[AXIS_CP], "context-parallel degree c, ranks splitting each sequence (omitted: 2 "
         "if the ranks --tp leaves allow)", 1, NULL},
        {"--pp", FLAG_INT, &lab.deg[AXIS_PP], "pipeline stages p (omitted: 2 if the ranks left allow)", 1, NULL},
        {"--dp", FLAG_INT, &lab.deg[AXIS_DP], "data-parallel replicas d (omitted: the ranks left); t x c x p x d = "
         "ranks", 1, NULL},
        {"--ep", FLAG_INT, &lab.ep, "expert-parallel degree e (with --experts; omitted: 2 if E and the stage's ranks "
         "allow): each EP group of e ranks, carved from the t x c x d ranks of a stage, holds E/e experts a layer and "
         "exchanges tokens by all-to-all (lab08)", 1, NULL},
        {"--micro-batches", FLAG_INT, &lab.micro_batches, "micro-batches per replica and step (must divide --batch / "
         "--dp)", 1, NULL},
        {"--schedule", FLAG_STRING, &lab.schedule_arg,
         "lab04's pipeline schedules: gpipe, 1f1b, interleaved (--virtual-stages chunks per rank), zb-h1, zb-v", 0,
         SCHEDULE_CHOICES},
        {"--virtual-stages", FLAG_INT, &lab.virtual_stages,
         "model chunks per rank for --schedule interleaved (--layers must divide by --pp x chunks)", 1, NULL},
        {"--cp-algo", FLAG_STRING, &lab.algo_name, "lab07's attention over the CP group: ring, allgather or ulysses",
         0, "ring|allgather|ulysses"},
        {"--cp-layout", FLAG_STRING, &lab.layout_name, "lab07's positions per CP rank: zigzag or contiguous", 0,
         "zigzag|contiguous"},
        {"--sequence-parallel", FLAG_BOOL, &lab.sequence_parallel,
         "lab05's sequence parallelism in every TP group (needs --tp >= 2; on by itself with --experts there): "
         "outside the TP regions a rank holds 1/t of its CP rank's T/c positions; pipeline messages carry T/(c t)",
         0, NULL},
        {"--zero-stage", FLAG_INT, &lab.zero_stage, "0, or 1: lab06's ZeRO-1, the optimizer state sharded over the c "
         "x d ranks that hold the same weights (needs c x d >= 2; with --experts the expert runs over their EDP "
         "group)", 0, NULL},
        {"--check-sync", FLAG_BOOL, &lab.check_sync, "verify at the end that the c x d replicas of every (tp, pp) "
         "hold bit-identical weights (exit 1 if not)", 0, NULL},
    };
    const lab_def def = {
        .info = {"lab09_5d", "the grid: tensor-parallel layers (lab05) with context-parallel attention (lab07) in "
                 "pipeline stages (lab04), replicated by data parallelism (lab01)", flags,
                 (int)(sizeof flags / sizeof flags[0])},
        .defaults = lab09_flag_defaults, .check = lab09_check, .predict = lab09_predict, .plan = lab09_plan, .setup = setup, .start = start,
        .step = step, .evaluate = lab09_evaluate, .verify = lab09_verify, .report = lab09_report,
        .print = lab09_print, .done = done,
    };
    return lab_main(argc, argv, &def, &lab);
}
