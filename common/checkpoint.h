/* Checkpoints: the whole training state in one safetensors file that every
 * lab, at any layout, can save and resume from.
 *
 * The file holds whole tensors with GPT-2 names, never one rank's buffers:
 *
 *   8 bytes   N, the length of the JSON header (unsigned, little-endian)
 *   N bytes   {"__metadata__": {"format": "parallel-labs-checkpoint-2", "step": "10", ...},
 *              "wte.weight": {"dtype": "F32", "shape": [256, 128], "data_offsets": [0, 131072]}, ...}
 *   the data  fp32, little-endian: the parameters ("wte.weight", "h.3.attn.c_attn.weight",
 *             ...), then the AdamW first moments ("optimizer.m.<name>"), then the second
 *             moments ("optimizer.v.<name>"), each in the order of the flat layout
 *
 * so the data is exactly the three flat buffers of the whole model, [params | m | v].
 * The metadata (strings, as safetensors wants) gives the step (optimizer steps
 * done), the model shape and training flags, the lab that saved it and an
 * FNV-1a 64-bit checksum of the other metadata and the data, so an edited
 * header is refused like a flipped bit (files of format 1, whose checksum
 * covers the data alone, are still read). The header is written and parsed
 * with jansson; a file is checked header first, so one that is no checkpoint
 * is refused before its data is read.
 *
 * Saving gathers every element to rank 0, which writes the file atomically
 * (temporary file PATH.tmp.PID, fsync, rename; the temporary goes on errors
 * and on SIGINT/SIGTERM, and a later save removes those of killed saves).
 * Loading: every rank reads the file and takes
 * its slice, the same "any rank can create exactly its slice" idea as the
 * initialisation. So what a lab must say is only which elements of the global
 * flat layout its buffers hold, and where:
 *
 *   ckpt_view view;
 *   ckpt_view_init(&view, params, P, adam_m, adam_v, P);
 *   ckpt_hold(&view, 0, 0, P);            local [0, P) is global [0, P): a whole replica
 *                                         (both lines: ckpt_view_range(&view, .., 0, P))
 *   int first = ckpt_resume(&ctx, &view); the step to start from (0 without --resume)
 *   for (int i = 0; i < ctx.opt.steps; i++) {
 *       int step = first + i;             the data and AdamW's t follow the GLOBAL step
 *       ...
 *       ckpt_step_done(&ctx, &view, step + 1);   saves at --save-every and at the end
 *   }                                     (or after an interrupted step: ctx.interrupted)
 *
 * A pipeline stage holds one range, a ZeRO rank its chunks, a tensor-parallel
 * rank its rows or columns of each matrix (one run per contiguous piece). Several
 * ranks may hold the same element (replicas): the lowest of them saves it. */
#ifndef PL_CHECKPOINT_H
#define PL_CHECKPOINT_H
#include "run.h"
#include "shard_map.h" /* ckpt_view: which elements of the model this rank holds */

/* Collective. With --resume: loads this rank's slice of the file's parameters
 * and moments into the view's buffers and returns the step it was saved at;
 * without: returns 0. The file was checked by lab_start (ckpt_check_flags), so
 * a failure here (the file changed since) ends the job through die(). */
int ckpt_resume(run_ctx *ctx, ckpt_view *v);

/* Collective; call after every step with the number of steps done. With --save,
 * writes the checkpoint when --save-every divides it, and after the run's last
 * step (the last of an interrupted run too). */
void ckpt_step_done(run_ctx *ctx, ckpt_view *v, int steps_done);

/* Collective: gathers the whole model to rank 0 and writes it to path (what
 * ckpt_step_done calls). */
void ckpt_save(run_ctx *ctx, ckpt_view *v, const char *path, int step);

/* Called by lab_start on every rank, before anything is created: checks that the
 * --resume file is a complete, uncorrupted checkpoint of the model the flags
 * describe (--save, like every output, is proven writable by run_setup on rank
 * 0). Returns 0, or -1 with one line in err. */
int ckpt_check_flags(const run_ctx *ctx, char *err, size_t errlen);

/* --eval's line on rank 0: the held-out loss, and what it was measured on.
 * Returns eval_loss: `double e = ctx.opt.eval ? ckpt_print_eval(&ctx, evaluate(..)) : -1;` */
double ckpt_print_eval(const run_ctx *ctx, double eval_loss);

/* The record members checkpoints and --eval add (first_step, resumed_from,
 * saved_to, eval_loss, --sample's), set on `members` (a jansson object) after
 * the lab's own. eval_loss < 0: not evaluated. */
struct json_t;
void ckpt_record_members(const run_ctx *ctx, const ckpt_view *v, double eval_loss, struct json_t *members);

#endif
