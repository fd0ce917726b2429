/* The 3D summary: the traffic of each group kind (TP all-reduces, PP sends and
 * receives, DP all-reduce) measured beside its formula, and memory per rank. */
#ifndef LAB06_REPORT3D_H
#define LAB06_REPORT3D_H
#include "executor.h"
#include "grid.h"
#include "run.h"
#include "tp.h"
#include <jansson.h>

enum { GROUP_TP, GROUP_PP, GROUP_DP, GROUP_CP, GROUP_KINDS }; /* CP: lab09's grids only (process_grid.cp) */

/* One group kind on one rank, per step. */
typedef struct group_traffic {
    double calls, payload, ring, seconds;          /* measured by the communicator */
    double calls_formula, payload_formula, ring_formula;
} group_traffic;

/* Add to t what communicator c counted, per step over `steps` (every kind:
 * calls, payload, ring bytes as run_finish counts them, seconds). */
void group_traffic_measure(const comm *c, int steps, group_traffic *t);

/* CP's exchanges per step of a rank whose chunks hold `layers` layers, by
 * kind (lab07's per layer and micro-batch, theory/context.c: K|V blocks of
 * the stage's heads over its positions; --recompute runs the forward's again):
 * what report3d prints for lab09's CP group, and lab09's experts table too;
 * model: the whole model's config (its head size). */
void report3d_cp_traffic(const pipeline_stage *st, const gpt_config *model, int N, int layers, int m,
                         th_traffic per_kind[COLL_NKINDS]);

typedef struct report3d {
    int ranks;
    double *rows;      /* rank 0: every rank's figures (report3d.c lays them out) */
    const char *acts_formula; /* how the activations' formula counts: the schedule's blocks in flight */
    double formula_ring_bytes; /* the busiest rank's ring traffic by the formulas, as
                                * run_finish sums the measured one (per kind, max over ranks) */
    int sequence_parallel, recompute_full; /* how the TP groups ran: the lines' formulas */
    int zero_stage;             /* --zero-stage 1: DP's reduce-scatter + all-gather, the optimizer lines */
    double optim_bytes_per_elem; /* K: 8 in fp32, 12 in bf16 (theory.h) */
    int kinds;                  /* GROUP_CP + 1 with a CP group, else GROUP_CP */
    int cp_algo;                /* th_cp_algo, with a CP group */
} report3d;

/* Collective over the grid, after the last step: measures and computes every
 * rank's figures and gathers them to rank 0; the activation formula is the
 * schedule's blocks in flight on the rank's chunks (pipeline_acts_formula_bytes). */
void report3d_gather(report3d *r, process_grid *g, const pipeline_rank *pr, const run_ctx *ctx);
/* Rank 0: the run record's members of those figures, set on `record` (the
 * traffic per group kind, the layers, parameter and activation bytes per rank);
 * the other ranks, and an r never gathered ({0}), set none. */
void report3d_record(const report3d *r, const process_grid *g, json_t *record);
/* Rank 0: the 3D lines of the summary. */
void report3d_print(const report3d *r, const process_grid *g);
void report3d_free(report3d *r);

#endif
