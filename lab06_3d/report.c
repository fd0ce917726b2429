/* lab06's flags checked, its needs predicted, its run reported (report.h). */
#include "report.h"
#include "jsonval.h"
#include "schedule.h"
#include "theory.h"
#include <stdio.h>

void lab06_flag_defaults(int ranks, void *lab) {
    lab06 *s = lab;
    s->flag_dims = grid_defaults(ranks); /* what --help shows for this rank count */
}

void lab06_check(run_ctx *ctx, void *lab) {
    lab06 *s = lab;
    run_check(ctx, !ctx->opt.experts, "--experts: expert tensor parallelism is not taught (lab01_dp and lab02_zero "
              "take --experts)");
    s->dims = grid_choose(ctx, s->flag_dims.tp, s->flag_dims.pp, s->flag_dims.dp);
    const grid_dims dims = s->dims;
    tp_check_degree(ctx, dims.tp, "--tp");
    if (s->sequence_parallel) {
        run_check(ctx, dims.tp >= 2, "--sequence-parallel needs --tp of at least 2 (--tp %d: no TP group to split "
                  "the sequence over)", dims.tp);
        tp_check_sequence_parallel(ctx, dims.tp, "--tp");
    }
    run_check(ctx, th_stage_split_possible(ctx->opt.layers, dims.pp),
              "--pp %d is more than --layers %d: every pipeline stage needs at least one layer", dims.pp,
              ctx->opt.layers);
    s->kind = pipeline_check_flags(ctx, s->schedule_arg, dims.pp, s->micro_batches,
                                   s->virtual_stages);
    run_check(ctx, s->zero_stage == 0 || s->zero_stage == 1, "--zero-stage %d: lab06 shards the optimizer state only "
              "(0 or 1); lab02_zero has stages 2 and 3", s->zero_stage);
    run_check(ctx, s->zero_stage == 0 || dims.dp >= 2, "--zero-stage 1 needs --dp of at least 2 (--dp %d: no DP group "
              "to shard the optimizer state over)", dims.dp);
    run_check(ctx, ctx->opt.batch % ((long)dims.dp * s->micro_batches) == 0,
              "--batch %d is not divisible by --dp %d x --micro-batches %d (each replica cuts its B/d rows "
              "into micro-batches)", ctx->opt.batch, dims.dp, s->micro_batches);
}

/* theory/predict.h's config of the grid, held against the memory before anything is allocated */
void lab06_predict(const run_ctx *ctx, void *lab, th_run *need) {
    (void)ctx;
    lab06 *s = lab;
    s->v = schedule_chunks(s->kind, s->virtual_stages);
    need->tp = s->dims.tp;
    need->pp = s->dims.pp;
    need->dp = s->dims.dp;
    need->micro_batches = s->micro_batches;
    need->schedule = schedule_name(s->kind);
    need->chunks = s->v;
    need->zero_stage = s->zero_stage;
    need->tensor_parallel = 1;
    need->sequence_parallel = s->sequence_parallel;
}

void lab06_plan(const run_ctx *ctx, void *lab, run_report *r) {
    (void)ctx;
    lab06 *s = lab;
    const int t = s->dims.tp, p = s->dims.pp, d = s->dims.dp, m = s->micro_batches;
    if (s->kind == SCHEDULE_INTERLEAVED)
        snprintf(s->layout, sizeof s->layout, "tp=%d pp=%d dp=%d m=%d %s v=%d%s%s", t, p, d, m,
                 schedule_name(s->kind), s->v, s->sequence_parallel ? " sp" : "", s->zero_stage ? " zero1" : "");
    else snprintf(s->layout, sizeof s->layout, "tp=%d pp=%d dp=%d m=%d %s%s%s", t, p, d, m, schedule_name(s->kind),
                  s->sequence_parallel ? " sp" : "", s->zero_stage ? " zero1" : "");
    r->layout = s->layout;
    r->comm_formula = "busiest rank: TP + DP all-reduces (ring) + PP sends and receives, the formulas below";
    /* --dry-run's formula: the prediction's ring bytes, as report3d adds up its formulas (the run's: lab06_report) */
    r->comm_formula_bytes = DRY_RUN_PREDICTED_RING;
    r->bubble_theory = schedule_bubble_textbook(s->kind, p, m, s->v);
}

/* The grid map and its warnings (MPI groups only: no NCCL), above theory/predict.h's needs */
void lab06_dry_run(run_ctx *ctx, void *lab, th_run *need, run_report *r) {
    (void)need, (void)r;
    lab06 *s = lab;
    process_grid grid;
    grid_init(&grid, s->dims, COMM_MPI);
    json_decref(grid_describe(&grid, ctx->opt.layers, ctx));
    grid_free(&grid);
}

void lab06_print_grid(const run_ctx *ctx, const lab06 *s) {
    if (ctx->rank != 0) return;
    const pipeline_rank *pr = &s->pr;
    printf("3D: TP t=%d%s (%d of %d heads, %d of %d MLP units per rank) | PP p=%d stages x %d chunk%s, m=%d "
           "micro-batches of %d rows, %s | DP d=%d replicas of %d rows%s | bubble theory %s = %.3f\n",
           s->dims.tp, s->sequence_parallel ? " + SP [the sequence split by t outside the split matrices: pipeline "
           "messages of T/t positions]" : "", s->tl.heads, ctx->opt.heads, s->tl.hidden, 4 * ctx->opt.d_model,
           s->dims.pp, pr->v, pr->v == 1 ? "" : "s", s->micro_batches, pr->chunk[0].rows, schedule_name(s->kind),
           s->dims.dp, ctx->opt.batch / s->dims.dp,
           s->zero_stage ? " + ZeRO-1 [each keeps the optimizer state of 1/d of its buffer: reduce-scatter, "
                           "AdamW on the slice, all-gather]" : "",
           schedule_bubble_textbook_text(s->kind), s->theory);
    fflush(stdout);
}

double lab06_evaluate(run_ctx *ctx, void *lab) {
    lab06 *s = lab;
    return stage3d_evaluate(ctx, &s->pr, &s->grid, s->sequence_parallel, NULL);
}

/* lab01's check over each DP group (the replicas of one (tp, pp) position), all groups agreeing */
int lab06_verify(run_ctx *ctx, void *lab) {
    lab06 *s = lab;
    s->in_sync = s->check_sync ? stage3d_replicas_identical(&s->pr, s->grid.dp) : 1;
    if (s->check_sync && ctx->rank == 0)
        printf("check-sync: the %d data-parallel replicas of every (tp, pp) position %s\n", s->dims.dp,
               s->in_sync ? "hold bit-identical weights" : "DIFFER");
    return s->in_sync;
}

void lab06_report(run_ctx *ctx, void *lab, lab_report *r) {
    lab06 *s = lab;
    report3d_gather(&s->rep, &s->grid, &s->pr, ctx);
    json_t *rec = r->record;
    jsonval_set(rec, "tp", json_integer(s->dims.tp));
    jsonval_set(rec, "pp", json_integer(s->dims.pp));
    jsonval_set(rec, "dp", json_integer(s->dims.dp));
    jsonval_set(rec, "micro_batches", json_integer(s->micro_batches));
    jsonval_set(rec, "schedule", jsonval_text(schedule_name(s->kind)));
    jsonval_set(rec, "chunks_per_rank", json_integer(s->pr.v));
    jsonval_set(rec, "sequence_parallel", json_boolean(s->sequence_parallel));
    if (s->zero_stage) jsonval_set(rec, "zero_stage", json_integer(1)); /* absent: 0, the record lab06 always wrote */
    jsonval_set(rec, "replicas_identical", s->check_sync ? json_boolean(s->in_sync) : json_null());
    jsonval_set(rec, "grid", s->grid_record);
    s->grid_record = NULL; /* the record holds it now */
    report3d_record(&s->rep, &s->grid, rec);
    r->run.comms[0] = s->grid.tp;
    r->run.comms[1] = s->grid.pipe;
    r->run.comms[2] = s->grid.dp;
    r->run.n_comms = 3;
    r->run.params = s->tl.g.total;
    r->run.comm_formula_bytes = s->rep.formula_ring_bytes;
    r->run.bubble_theory = s->theory;
    r->run.params_held = s->pr.n;
    r->run.acts_formula_bytes = pipeline_acts_formula_bytes(&s->pr);
    if (s->zero_stage) stage3d_zero1_states(r, s->states_text, s->dims.tp, s->dims.dp);
}

void lab06_print(run_ctx *ctx, void *lab) {
    (void)ctx;
    lab06 *s = lab;
    report3d_print(&s->rep, &s->grid);
}
