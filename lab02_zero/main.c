/* lab02_zero: ZeRO, data parallelism without the redundant copies.
 *
 * As in lab01, every rank runs the whole model on its own rows of the global
 * batch. But lab01 keeps the parameters, the gradient and both AdamW moments
 * (16 bytes per parameter) on every rank, N identical copies. ZeRO gives each
 * rank 1/N of the flat parameter range and keeps on it only what that share
 * needs:
 *   --zero-stage 1  the optimizer state is sharded (8 of the 16 bytes, / N);
 *   --zero-stage 2  the gradient too (the backward reduce-scatters it bucket by
 *                   bucket, so the full gradient never exists);
 *   --zero-stage 3  the parameters too (a layer is all-gathered just before
 *                   its forward and again before its backward).
 * The loss curve is lab01's (the tests hold every stage and rank count to
 * `lab01_dp -n 1`); stages 1 and 2 move exactly lab01's bytes, stage 3 1.5x.
 *
 * What to look at: the "ZeRO stage" table after the summary, bytes per rank
 * measured by the allocator = the formula + named buffers + padding, and the
 * traffic per step beside its formula. */
#include "checkpoint.h"
#include "comm.h"
#include "lab_run.h"
#include "jsonval.h"
#include "mem.h"
#include "model.h"
#include "moe.h"
#include "run.h"
#include "theory.h"
#include "zero.h"
#include "zero_report.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --eval's forward (lab_heldout_loss keeps its stage-3 gathers out of the traffic counts) */
static double forward_loss(void *zero, gpt_acts *acts) {
    zero_forward(zero, acts);
    return gpt_mean_loss(((zero_state *)zero)->g, acts);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int zero_stage = 1;
    double bucket_mb = 0;
    flag_spec flags[] = {
        {"--zero-stage", FLAG_INT, &zero_stage,
         "what is sharded: 1 optimizer state, 2 + gradients, 3 + parameters", 1, NULL},
        {"--bucket-mb", FLAG_FLOAT, &bucket_mb,
         "stages 1-2: reduce-scatter gradients in buckets of whole blocks of about this many MiB as the "
         "backward finishes them (0: stage 1 all at once, stage 2 one block at a time)", 0, NULL},
    };
    lab_info lab = {"lab02_zero", "ZeRO: data parallelism with the optimizer state (stage 1), the gradients "
                    "(2) and the parameters (3) sharded over the ranks", flags, 2};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    run_check(&ctx, zero_stage <= 3, "--zero-stage must be 1, 2 or 3, got %d", zero_stage);
    run_check(&ctx, zero_stage < 3 || bucket_mb == 0,
              "--bucket-mb %g does not apply to --zero-stage 3 (it gathers and reduces one block at a time)",
              bucket_mb);
    run_check(&ctx, ctx.opt.batch % ctx.size == 0, "--batch %d is not divisible by the %d ranks",
              ctx.opt.batch, ctx.size);
    run_setup(&ctx);
    /* what the run needs by theory/, from the flags alone, held against the memory before anything is
     * allocated: the shard plan (the layout's) is not made yet, so its padding is left out and its largest
     * unit is the largest block (every unit is whole blocks; stage 1 without buckets: one unit, the model) */
    th_run need = lab_run_config(&ctx);
    need.zero_stage = zero_stage;
    const th_params counts = th_param_counts(&need.model);
    need.units = 1;
    need.full_elems = need.embed_unit_elems = counts.total;
    need.largest_unit_elems = zero_unit_elems(zero_stage, bucket_mb) == 0
                                  ? counts.total : fmax(counts.embed, fmax(counts.layer, counts.head));
    lab_start(&ctx, &need);

    const int T = ctx.opt.seq, rows = ctx.opt.batch / ctx.size;
    gpt_layout g;
    gpt_layout_init(&g, &ctx.model);
    const long P = g.total;
    char layout[48];
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    snprintf(layout, sizeof layout, bucket_mb > 0 ? "zero%d dp=%d bucket=%gMiB" : "zero%d dp=%d", zero_stage,
             ctx.size, bucket_mb);
    if (ctx.opt.dry_run) { /* the stage's shard plan, which zero_init makes, without its buffers */
        shard_plan plan;
        shard_plan_init(&plan, &g, ctx.size, 0, zero_unit_elems(zero_stage, bucket_mb));
        zero_figures fig;
        zero_figures_of_plan(&g, &plan, zero_stage, &fig);
        need.units = plan.n_units; /* the plan's exact figures */
        need.full_elems = (double)plan.full_elems;
        need.largest_unit_elems = (double)plan.largest_unit_elems;
        need.embed_unit_elems = (double)(shard_unit_of_block(&plan, -1)->chunk * ctx.size);
        shard_plan_free(&plan);
        lab_dry_run_exit(&ctx, &need, (run_report){.layout = layout, .comm_formula_bytes = fig.comm_formula,
                                                   .comm_formula = fig.comm_formula_text, .bubble_theory = -1});
    }
    comm world;
    comm_init(&world, MPI_COMM_WORLD, ctx.backend);
    comm_set_axis(&world, "dp");
    zero_state zero;
    zero_init(&zero, &g, &world, zero_stage, bucket_mb, (uint64_t)ctx.opt.seed);
    ckpt_view view;
    zero_checkpoint_view(&zero, &view);
    const int first = ckpt_resume(&ctx, &view);
    zero_params_from_master(&zero); /* bf16: the resumed master weights rounded and gathered */
    gpt_acts acts;
    gpt_acts_alloc(&acts, &g, 0, g.cfg.layers, rows);
    gpt_grad_scratch scratch;
    gpt_scratch_alloc(&scratch, &g, rows);
    gpt_acts_bind(&acts, &scratch); /* --recompute: what the layers do not keep goes there */
    int *tokens = malloc(sizeof(int) * (size_t)rows * T), *targets = malloc(sizeof(int) * (size_t)rows * T);

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        /* this rank's rows of the global batch */
        data_batch(&ctx.data, (uint64_t)ctx.opt.seed, step, world.rank * rows, rows, T, tokens, targets);
        mem_to_device(acts.tokens, tokens, sizeof(int) * (size_t)rows * T);
        mem_to_device(acts.targets, targets, sizeof(int) * (size_t)rows * T);

        zero_forward(&zero, &acts);
        /* weight 1 / (global tokens): the reduce-scatter sums over the ranks,
         * and the sum of the ranks' shares of the mean is the mean */
        zero_backward(&zero, &acts, &scratch, 1.0f / ((float)ctx.opt.batch * T));
        const double grad_norm = zero_optimizer_step(&zero, &ctx.adamw, step + 1, (float)ctx.opt.clip);

        double loss = gpt_mean_loss(&g, &acts);
        comm_allreduce_host(&world, &loss, 1);
        run_experts_step(&ctx, &world, &g, &acts, i);
        run_step_end(&ctx, i, loss / world.size, grad_norm, NULL);
        ckpt_step_done(&ctx, &view, step + 1);
    }
    const double eval_loss =
        ctx.opt.eval ? ckpt_print_eval(&ctx, lab_heldout_loss(&ctx, zero.dp, zero.dp, zero.dp->rank * rows, rows, 0, &acts,
                                                              tokens, targets, forward_loss, &zero)) : -1;

    zero_figures fig;
    zero_figures_compute(&zero, &fig);
    char extra[1024];
    zero_extra_json(&zero, &fig, bucket_mb, extra, sizeof extra);
    const th_model tm = lab_theory_model(&g.cfg); /* --experts: FLOPs of the active parameters, their buffers */
    const th_opts opts = th_opts_run(1, 0, ctx.model.recompute, g_precision == PREC_BF16);
    lab_finish(&ctx, &view, eval_loss, jsonval_members(extra, "the lab's record members"), 0 /* model states: its own table */,
               (run_report){.layout = layout, .comms = {&world}, .n_comms = 1, .params = P,
                            .comm_formula_bytes = fig.comm_formula, .comm_formula = fig.comm_formula_text,
                            .bubble_theory = -1,
                            .acts_formula_bytes = th_course_acts_bytes(&tm, &opts, 0, g.cfg.layers, rows)});
    zero_print_summary(&zero, &fig, ctx.steps_done);

    free(tokens);
    free(targets);
    gpt_scratch_free(&scratch);
    gpt_acts_free(&acts);
    zero_free(&zero);
    comm_free(&world);
    MPI_Finalize();
    return run_exit_status(&ctx, 0);
}
