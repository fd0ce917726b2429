/* lab01_dp: data parallelism.
 *
 * Every rank holds the whole model and takes its own rows of the global batch.
 * Each runs forward and backward on its rows, then the ranks all-reduce their
 * gradients and divide by the number of ranks: every rank now holds the
 * gradient of the whole batch and takes the same AdamW step, so the replicas
 * stay identical. The loss curve is the one-rank curve; the throughput grows
 * with the ranks, minus the cost of moving 2(N-1)/N x the gradient bytes per
 * step through the ring all-reduce.
 *
 * What to look at: `loss` in the step lines (equal to `-n 1`), tok/s against
 * `-n 1`, and the communication lines of the summary against the formula.
 * `mpirun -n 1 ./lab01_dp` is the serial baseline every other lab reproduces. */
#include "checkpoint.h"
#include "comm.h"
#include "dp.h"
#include "lab_run.h"
#include "kernels.h"
#include "mem.h"
#include "model.h"
#include "moe.h"
#include "optim.h"
#include "run.h"
#include "theory.h"
#include "trace.h"
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static void write_weights(const char *path, const float *params, long n) {
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) die("out of host memory");
    mem_to_host(host, params, (size_t)n * sizeof(float));
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(host, sizeof(float), (size_t)n, f) != (size_t)n || fclose(f) != 0)
        die("--dump-weights %s: cannot write: %s", path, strerror(errno));
    free(host);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    double bucket_mb = 0;
    int check_sync = 0, grad_accum = 1;
    const char *dump_weights = NULL;
    flag_spec flags[] = {
        {"--bucket-mb", FLAG_FLOAT, &bucket_mb,
         "all-reduce gradients in buckets of about this many MiB as the backward finishes them "
         "(0: one all-reduce after the backward)", 0, NULL},
        {"--check-sync", FLAG_BOOL, &check_sync,
         "verify at the end that all ranks hold bit-identical weights (exit 1 if not)", 0, NULL},
        {"--dump-weights", FLAG_OUTPUT_FILE, &dump_weights,
         "write the final weights (raw little-endian fp32, layout order) to this file", 0, NULL},
        {"--grad-accum", FLAG_INT, &grad_accum,
         "gradient accumulation: each rank runs its rows in K micro-batches, adding up their gradients "
         "before the one all-reduce and AdamW step (the same loss curve, 1/K of the activations; with --experts the "
         "aux loss, dropped choices and expert loads are added up over the K)", 1, NULL},
    };
    lab_info lab = {"lab01_dp", "data parallelism: the same model on every rank, gradients "
                    "all-reduced and averaged", flags, 4};
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &lab);
    run_check(&ctx, ctx.opt.batch % ctx.size == 0, "--batch %d is not divisible by the %d ranks",
              ctx.opt.batch, ctx.size);
    run_check(&ctx, ctx.opt.batch % ctx.size != 0 || (ctx.opt.batch / ctx.size) % grad_accum == 0,
              "--grad-accum %d does not divide the %d rows per rank (--batch %d / %d ranks)", grad_accum,
              ctx.opt.batch / (ctx.size > 0 ? ctx.size : 1), ctx.opt.batch, ctx.size);
    run_check_rank_capacity(&ctx, grad_accum, "--grad-accum");
    run_setup(&ctx);
    /* what the run needs by theory/, from the flags alone: held against the memory before anything is allocated */
    th_run need = lab_run_config(&ctx);
    need.units = bucket_mb > 0 ? 0 : 1; /* buckets decide the calls at run time, not the bytes */
    need.grad_accum = grad_accum; /* a micro-batch's activations; the all-reduce once a step all the same */
    need.full_elems = need.largest_unit_elems = th_param_counts(&need.model).total;
    lab_start(&ctx, &need);

    /* rows: this rank's share of the global batch; micro: the rows of one accumulation step */
    const int T = ctx.opt.seq, rows = ctx.opt.batch / ctx.size, micro = rows / grad_accum;
    gpt_layout g;
    gpt_layout_init(&g, &ctx.model);
    const long P = g.total;
    char layout[32];
    /* the layout names the trace and timeline files: every flag that changes what runs is in it */
    int at = snprintf(layout, sizeof layout, bucket_mb > 0 ? "dp=%d bucket=%gMiB" : "dp=%d", ctx.size, bucket_mb);
    if (grad_accum > 1) snprintf(layout + at, sizeof layout - (size_t)at, " accum=%d", grad_accum);
    const double comm_formula = th_dp_traffic((double)P * value_bytes(), ctx.size, 1).ring;
    const char *comm_formula_text = "ring all-reduce 2(N-1)/N x gradient bytes";
    if (ctx.opt.dry_run) {
        need.full_elems = need.largest_unit_elems = (double)P;
        lab_dry_run_exit(&ctx, &need, (run_report){.layout = layout, .comm_formula_bytes = comm_formula,
                                                   .comm_formula = comm_formula_text, .bubble_theory = -1});
    }
    comm world;
    comm_init(&world, MPI_COMM_WORLD, ctx.backend);
    comm_set_axis(&world, "dp");
    /* the values forward and backward use (fp32, or bf16: precision.h) and the
     * fp32 weights AdamW updates: the same buffer in fp32, a master copy in bf16 */
    model_states ms;
    model_states_alloc(&ms, P);
    gpt_init_params(&g, (uint64_t)ctx.opt.seed, 0, P, ms.master); /* the same on every rank */
    ckpt_view view; /* a whole replica: local [0, P) is global [0, P) */
    ckpt_view_range(&view, ms.master, ms.adam_m, ms.adam_v, 0, P);
    const int first = ckpt_resume(&ctx, &view);
    params_from_master(ms.params, ms.master, P);
    gpt_acts acts;
    gpt_acts_alloc(&acts, &g, 0, g.cfg.layers, micro);
    gpt_grad_scratch scratch;
    gpt_scratch_alloc(&scratch, &g, micro);
    gpt_acts_bind(&acts, &scratch); /* --recompute: what the layers do not keep goes there */
    int *tokens = malloc(sizeof(int) * (size_t)micro * T), *targets = malloc(sizeof(int) * (size_t)micro * T);
    dp_grad_sync sync;
    dp_sync_init(&sync, &world, ms.grads, 0, P, bucket_mb);
    run_experts_tally moe = {0}; /* --experts: the step's figures, added over the micro-batches */

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        mem_zero(ms.grads, (size_t)P * value_bytes());
        double loss = 0;
        run_experts_tally_begin(&moe, &g.cfg);
        for (int k = 0; k < grad_accum; k++) { /* this rank's rows of the global batch, micro at a time */
            data_batch(&ctx.data, (uint64_t)ctx.opt.seed, step, world.rank * rows + k * micro, micro, T, tokens,
                       targets);
            mem_to_device(acts.tokens, tokens, sizeof(int) * (size_t)micro * T);
            mem_to_device(acts.targets, targets, sizeof(int) * (size_t)micro * T);
            int ev = trace_begin("forward", TRACE_COMPUTE, grad_accum > 1 ? k : -1, NULL);
            gpt_forward(&g, ms.params, &acts);
            trace_end(ev);
            /* each micro-batch is whole sequences, and the aux loss and capacity are per sequence:
             * the sums over micro-batches are the whole rows' */
            run_experts_tally_add(&moe, &g, &acts);
            ev = trace_begin("backward", TRACE_COMPUTE, grad_accum > 1 ? k : -1, NULL);
            /* each token weighs 1/(rows T) whatever micro-batch it is in: the K backwards add up to the
             * mean over this rank's rows; the all-reduce then averages the ranks. Buckets go out only
             * after the last micro-batch, when the gradients are whole. */
            const int last = k == grad_accum - 1;
            gpt_backward(&g, ms.params, ms.grads, &acts, &scratch, NULL, 1.0f / ((float)rows * T),
                         bucket_mb > 0 && last ? dp_grads_ready : NULL, &sync);
            trace_end(ev);
            loss += gpt_mean_loss(&g, &acts) / grad_accum;
        }
        dp_sync_finish(&sync);

        int ev = trace_begin("optimizer", TRACE_COMPUTE, -1, NULL);
        const double grad_squares = KP->sum_squares(ms.grads, P);
        float scale = clip_scale(grad_squares, (float)ctx.opt.clip);
        adamw_step(&g, &ctx.adamw, 0, P, ms.master, ms.grads, ms.adam_m, ms.adam_v, step + 1, scale);
        params_from_master(ms.params, ms.master, P);
        trace_end(ev);

        comm_allreduce_host(&world, &loss, 1);
        run_experts_report(&ctx, &world, &moe, 1, world.size, i);
        run_step_end(&ctx, i, loss / world.size, sqrt(grad_squares), NULL);
        ckpt_step_done(&ctx, &view, step + 1);
    }
    const double eval_loss =
        ctx.opt.eval ? ckpt_print_eval(&ctx, lab_heldout_loss(&ctx, &world, NULL, world.rank * rows, rows, micro, &acts,
                                                              tokens, targets, lab_model_forward_loss,
                                                              &(lab_model){&g, NULL, ms.params})) : -1;

    int in_sync = check_sync ? dp_replicas_identical(&world, ms.master, P, 1) : 1;
    if (dump_weights && world.rank == 0) write_weights(dump_weights, ms.master, P);
    char extra[256];
    /* the activations of B/N rows by theory.h's exact formula, beside the allocator's peak;
     * the FLOPs a token costs, and what --recompute adds to them */
    const th_model tm = lab_theory_model(&g.cfg); /* --experts: FLOPs of the active parameters, their buffers */
    const th_opts opts = th_opts_run(1, 0, ctx.model.recompute, g_precision == PREC_BF16);
    snprintf(extra, sizeof extra, "\"bucket_mb\":%g,\"grad_accum\":%d,\"replicas_identical\":%s,\"flops_per_token_formula\":%.0f,"
             "\"recompute_flops_per_token_formula\":%.0f", bucket_mb, grad_accum, check_sync ? (in_sync ? "true" : "false") : "null",
             th_flops_per_token(&tm), th_recompute_flops_per_token(&tm, opts.recompute));
    lab_finish(&ctx, &view, eval_loss, extra, 1,
               (run_report){.layout = layout, .comms = {&world}, .n_comms = 1, .params = P,
                            .comm_formula_bytes = comm_formula, .comm_formula = comm_formula_text,
                            .bubble_theory = -1, .params_held = P,
                            .acts_formula_bytes = th_course_acts_bytes(&tm, &opts, 0, g.cfg.layers, micro)});

    free(tokens);
    free(targets);
    run_experts_tally_free(&moe);
    gpt_scratch_free(&scratch);
    gpt_acts_free(&acts);
    model_states_free(&ms);
    comm_free(&world);
    MPI_Finalize();
    return run_exit_status(&ctx, in_sync ? 0 : 1);
}
