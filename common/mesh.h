/* The rank mesh of a composed run: every rank at one coordinate of
 * TP x CP x DP x PP, numbered as Megatron-LM numbers them (its default order
 * "tp-cp-ep-dp-pp"), TP fastest, PP slowest:
 *
 *     rank = tp + t x (cp + c x (dp + d x pp))
 *
 * mpirun fills a host with consecutive ranks, so the t ranks of a TP group, which
 * all-reduce inside every layer, share a host and its fastest links; CP's ring
 * (a K/V block per attention) comes next; the pipeline's stages, which send one
 * activation per micro-batch, are t x c x d ranks apart, the ones that may sit
 * on different hosts.
 *
 * Expert parallelism reuses ranks instead of adding an axis (Megatron's MoE
 * "parallel folding", expert tensor parallelism 1): the t x c x d ranks of one
 * pipeline stage run the same layers on different tokens (TP under sequence
 * parallelism a sequence's T/(c t) positions each), and their flat index
 * f = tp + t x (cp + c x dp) is cut into blocks of e consecutive ranks. An EP
 * group (ep) is one block: its e ranks hold different experts and exchange
 * tokens. The ranks at the same place of every block hold the same experts
 * (edp, Megatron's "expert data parallel" group) and sum those experts'
 * gradients. e must divide t x c x d. With experts at t > 1 two more groups:
 * the stage's t x c x d ranks (their replicated tensors, each of whose
 * gradients is partial on a TP rank's positions, are summed over all of them)
 * and a sequence's t x c ranks (the routing's capacity is per whole sequence).
 *
 * A group along an axis holds the ranks that differ only in that coordinate,
 * ordered by it, so a rank's place in each group is its coordinate. */
#ifndef PL_MESH_H
#define PL_MESH_H
#include "comm.h"

typedef enum { MESH_TP, MESH_CP, MESH_DP, MESH_PP, MESH_NAXES } mesh_axis;
extern const char *const mesh_axis_names[MESH_NAXES]; /* "tp", "cp", "dp", "pp" */

typedef struct mesh_dims {
    int size[MESH_NAXES]; /* t, c, d, p: each at least 1 */
    int ep;               /* e: 1 without experts; divides t x c x d */
    int experts;          /* 1: a run with experts (at t > 1: the stage and sequence groups) */
} mesh_dims;
typedef struct mesh_coord { int at[MESH_NAXES]; } mesh_coord;

long long mesh_ranks(const mesh_dims *d); /* t x c x d x p */
mesh_coord mesh_coord_of(const mesh_dims *d, int rank);
int mesh_rank_of(const mesh_dims *d, mesh_coord c);
/* The world ranks of rank's group along axis, in group order (size[axis] of them). */
void mesh_axis_members(const mesh_dims *d, int rank, mesh_axis axis, int *members);
/* The world ranks of rank's EP group (e of them) and of its EDP group (t x c x d / e). */
void mesh_ep_members(const mesh_dims *d, int rank, int *members);
void mesh_edp_members(const mesh_dims *d, int rank, int *members);
/* The world ranks of rank's replica group: the c x d ranks of its (tp, pp), in
 * the order f = cp + c x dp. They hold the same weights (CP splits the
 * positions, DP the rows), so they average their gradients and can shard the
 * optimizer state between them (Megatron's data-parallel group with context
 * parallelism). */
void mesh_replica_members(const mesh_dims *d, int rank, int *members);
/* The world ranks of rank's stage (the t x c x d ranks of its pp, in the order
 * f = tp + t x (cp + c x dp)) and of its sequences (the t x c ranks of its
 * (dp, pp), in the order tp + t x cp: the positions of each of its rows). */
void mesh_stage_members(const mesh_dims *d, int rank, int *members);
void mesh_sequence_members(const mesh_dims *d, int rank, int *members);

typedef struct rank_mesh {
    mesh_dims dims;
    mesh_coord me;
    comm world;
    comm axis[MESH_NAXES]; /* this rank's group along each axis, named by it (comm_set_axis) */
    comm ep, edp;          /* made only when dims.ep > 1 (size 0 otherwise) */
    comm replicas;         /* the replica group, made only when c > 1: mesh_replicas */
    comm stage, sequence;  /* made only with experts at t > 1 (sequence: and c > 1): mesh_stage, mesh_sequence */
} rank_mesh;

/* Collective over MPI_COMM_WORLD, whose size must be mesh_ranks(&dims): this
 * rank's groups, each checked against the formula (the communicators' ranks and
 * members are the coordinates', or the job ends naming the group). */
void mesh_init(rank_mesh *m, mesh_dims dims, comm_backend backend);
void mesh_free(rank_mesh *m);
/* The replica group (mesh_replica_members): the DP group itself when c = 1. */
comm *mesh_replicas(rank_mesh *m);
/* With experts: the stage group (the replicas themselves at t = 1) and the
 * sequence group (the TP group at c = 1, the CP group at t = 1). */
comm *mesh_stage(rank_mesh *m);
comm *mesh_sequence(rank_mesh *m);

#endif
