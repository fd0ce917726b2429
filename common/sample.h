/* --sample N (every lab): the model writes. Before training and after it, the
 * whole model's weights are gathered to rank 0 (as a checkpoint gathers them),
 * which runs the one-rank forward of lab01 -n 1 on them and extends the prompt
 * (--prompt, default the first line of the training data) by N bytes: greedy
 * (--temperature 0), or drawn from softmax(logits / temperature) with a
 * generator seeded by --seed. The same weights give the same text, so every
 * layout writes what lab01 -n 1 writes. Printed by rank 0, and recorded
 * (checkpoint.c's record members: "sample"). The bytes it allocates are left
 * out of the run's memory peaks. */
#ifndef PL_SAMPLE_H
#define PL_SAMPLE_H
#include "run.h"
#include "shard_map.h"
#include <jansson.h>

/* Collective: the sample of the view's weights after `step` optimizer steps. */
void sample_print(run_ctx *ctx, ckpt_view *v, int step);
/* The record's "sample": {"prompt", "bytes", "temperature", "steps": [...], "texts": [...]}. */
json_t *sample_record(void);

/* Rank-local: n bytes after prompt[0..len) from the whole model's fp32 weights
 * (the flat layout of cfg), written to out (n bytes). */
void sample_generate(const gpt_config *cfg, const float *weights, const unsigned char *prompt, int len, int n,
                     double temperature, unsigned long long seed, unsigned char *out);
#endif
