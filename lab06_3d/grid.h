/* The 3D process grid: t x p x d ranks, each at one coordinate (tp, pp, dp).
 *
 * Ranks are numbered as Megatron-LM numbers them, TP fastest, then DP, then PP:
 *
 *     rank = tp + t x (dp + d x pp)
 *
 * mpirun fills a host with consecutive ranks, so the t ranks of a TP group (the
 * group that all-reduces inside every layer) share a host and its fastest
 * links; the p stages of a pipeline are t x d ranks apart, the ones that may
 * sit on different hosts. Each rank belongs to three groups, each a
 * communicator made by comm_split:
 *
 *   tp    same (pp, dp), ordered by tp: the ranks that split one stage's layers
 *   pipe  same (tp, dp), ordered by pp: one TP rank's stages, which exchange
 *         activations and their gradients
 *   dp    same (tp, pp), ordered by dp: the replicas of one shard of one stage,
 *         which all-reduce its gradient */
#ifndef LAB06_GRID_H
#define LAB06_GRID_H
#include "comm.h"
#include "mesh.h"
#include "run.h"
#include <jansson.h>

typedef struct grid_dims { int tp, pp, dp; } grid_dims;
typedef struct grid_coord { int tp, pp, dp; } grid_coord;

/* The degrees for `ranks` ranks when no grid flag is given: --tp 2 if the rank
 * count is even (else 1), then --pp 2 if what is left is even (else 1), then
 * --dp all the rest. So -n 8 runs 2 x 2 x 2, -n 4 2 x 2 x 1, -n 2 2 x 1 x 1,
 * -n 1 1 x 1 x 1, -n 3 1 x 1 x 3. */
grid_dims grid_defaults(int ranks);

/* The degrees of this run: the grid flags given on ctx's command line keep their parsed
 * values (tp, pp, dp); the omitted ones share, by the same rule, the ranks the
 * given ones leave (-n 8 --dp 4: 2 x 1 x 4). Records a run_check error naming
 * the flags when t x p x d cannot be the rank count (never communicates). */
grid_dims grid_choose(run_ctx *ctx, int tp, int pp, int dp);
/* The same over any n axes named by their flags (lab09: --tp --cp --pp --dp):
 * values[i] the parsed value of names[i], kept where the flag is given; every
 * omitted axis but the last takes 2 of the ranks left when it can, the last
 * the rest. Returns 1, or 0 with a run_check error and every value 1.
 * grid_defaults_axes: the values with no flag given. */
int grid_choose_axes(run_ctx *ctx, const char *const *names, int *values, int n);
void grid_defaults_axes(int ranks, int *values, int n);

grid_coord grid_coord_of(grid_dims dims, int rank);
int grid_rank_of(grid_dims dims, grid_coord c);

typedef struct process_grid {
    grid_dims dims;
    grid_coord me;
    rank_mesh mesh;              /* the groups (common/mesh.h, CP 1) */
    comm *world, *tp, *pipe, *dp; /* the mesh's world and its TP, PP and DP groups */
    comm *cp;                     /* lab09: the CP group (NULL here: no CP axis) */
} process_grid;

/* Collective over MPI_COMM_WORLD: the three groups of this rank. */
void grid_init(process_grid *g, grid_dims dims, comm_backend backend);
void grid_free(process_grid *g);

/* Collective over the world. Rank 0 prints the grid map: which rank holds which
 * (tp, pp, dp) on which host (ctx's hosts: the ranks that share memory, named
 * by MPI_Get_processor_name), each stage's layers of `layers`, the groups as
 * the communicators report them, a warning for each TP group that spans hosts,
 * and one for pipeline boundaries inside a host while TP groups cross hosts.
 * Returns the value of the run record's member "grid" (an object, on every
 * rank, whose reference the caller holds). */
json_t *grid_describe(process_grid *g, int layers, const run_ctx *ctx);

#endif
