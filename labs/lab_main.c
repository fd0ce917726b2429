/* The lab skeleton (lab_main.h). */
#include "lab_main.h"
#include "jsonval.h"
#include "th_run_json.h"
#include <stdlib.h>

int lab_main(int argc, char **argv, const lab_def *def, void *lab) {
    MPI_Init(&argc, &argv);
    if (def->defaults) {
        int ranks;
        MPI_Comm_size(MPI_COMM_WORLD, &ranks);
        def->defaults(ranks, lab);
    }
    run_ctx ctx;
    run_parse(&ctx, argc, argv, &def->info);
    if (def->check) def->check(&ctx, lab);
    run_setup(&ctx);
    /* what the run needs by theory/, from the flags alone: held against the memory before anything is allocated */
    th_run need = lab_run_config(&ctx);
    if (def->predict) def->predict(&ctx, lab, &need);
    lab_start(&ctx, &need);

    lab_report report = {.run = {.comm_formula_bytes = -1, .bubble_theory = -1}, .model_states = 1};
    if (def->plan) def->plan(&ctx, lab, &report.run);
    if (ctx.opt.dry_run) {
        if (def->dry_run) def->dry_run(&ctx, lab, &need, &report.run);
        lab_dry_run_exit(&ctx, &need, report.run, def->dry_run_notes, lab);
    }
    ckpt_view view;
    def->setup(&ctx, lab, &view);
    const int first = ckpt_resume(&ctx, &view);
    if (def->start) def->start(&ctx, lab);

    for (int i = 0; i < ctx.opt.steps && !ctx.interrupted; i++) {
        const int step = first + i; /* the global step: it picks the batch and AdamW's t */
        run_step_begin(&ctx, i);
        lab_step out = {0};
        def->step(&ctx, lab, i, step, &out);
        run_step_end(&ctx, i, out.loss, out.grad_norm, out.note);
        ckpt_step_done(&ctx, &view, step + 1);
    }
    if (def->trained) def->trained(&ctx, lab);
    const double eval_loss = ctx.opt.eval ? ckpt_print_eval(&ctx, def->evaluate(&ctx, lab)) : -1;
    const int verified = def->verify ? def->verify(&ctx, lab) : 1;

    if (!(report.record = json_object())) die("out of host memory");
    if (def->report) def->report(&ctx, lab, &report);
    jsonval_set(report.record, "th_run", th_run_to_json(&need)); /* what theory predicted the run from */
    lab_finish(&ctx, &view, eval_loss, report.record, report.model_states, report.run);
    if (def->print) def->print(&ctx, lab);
    if (def->done) def->done(lab);
    MPI_Finalize();
    return run_exit_status(&ctx, verified ? 0 : 1);
}
