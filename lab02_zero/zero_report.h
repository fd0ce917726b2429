/* The lesson's formulas beside what the allocator and the communicator measured.
 *
 * Psi parameters, N ranks, fp32 AdamW (4 bytes of weight, 4 of gradient, 8 of
 * moments per parameter; with --precision bf16 2, 2 and 12: bf16 weights and
 * gradients, fp32 master weights and moments, the ZeRO paper's 2 + 2 + K with
 * K = 12, and the traffic moves 2 Psi), bytes per rank:
 *
 *             parameters               gradients            optimizer
 *   lab01     4 Psi                    4 Psi                8 Psi
 *   stage 1   4 Psi                    4 Psi                8 Psi / N
 *   stage 2   4 Psi                    4 Psi / N + bucket   8 Psi / N
 *   stage 3   4 Psi / N + gathered     4 Psi / N + bucket   8 Psi / N
 *
 * and ring traffic per step: 2 (N-1)/N x 4 Psi in stages 1-2 (a reduce-scatter
 * and an all-gather: exactly DP's all-reduce), 3 (N-1)/N x 4 Psi in stage 3
 * (the parameters are gathered twice).
 *
 * Measured = formula + named buffers + padding, exactly; the figures below
 * name every term so the summary and the tests can add them up. The formulas
 * themselves are theory/'s (th_model_states, th_zero_buffers, th_zero_traffic),
 * the code plan3d predicts with. */
#ifndef LAB02_ZERO_REPORT_H
#define LAB02_ZERO_REPORT_H
#include "zero.h"
#include <jansson.h>

enum { ZERO_PARAMS, ZERO_GRADS, ZERO_OPTIM, ZERO_NCAT };

typedef struct zero_figures {
    double psi;                        /* parameters of the model */
    int ranks;
    double mem_formula[ZERO_NCAT];     /* bytes per rank, the table above without buffers */
    char mem_formula_text[ZERO_NCAT][24];
    double mem_buffers[ZERO_NCAT];     /* the gathered unit (params), the bucket (grads) */
    double mem_padding[ZERO_NCAT];     /* what padding units to chunk x N adds */
    double comm_formula;               /* ring bytes per step */
    char comm_formula_text[96];
    char total_text[48];               /* the total's formula, "8 Psi + 8 Psi/N" */
    double comm_padding;               /* ring bytes the padding adds */
    double comm_skipped;               /* ring bytes not moved (< 0): stage 3 does not
                                        * gather the embedding for its backward */
} zero_figures;

void zero_figures_compute(const zero_state *z, zero_figures *f);
/* The same from a shard plan alone, before any buffer exists (--dry-run). */
void zero_figures_of_plan(const gpt_layout *g, const shard_plan *p, int stage, zero_figures *f);

/* The run record's lab members, set on `record` (a jansson object). */
void zero_record_members(const zero_state *z, const zero_figures *f, double bucket_mb, json_t *record);

/* Collective: the measured bytes (max over ranks) beside the formula; rank 0 prints. */
void zero_print_summary(const zero_state *z, const zero_figures *f, int steps);

#endif
