/* The rank mesh (common/mesh.h): for every shape of the world's ranks, the
 * numbering and each group's members by formula; for a few, the communicators
 * mesh_init builds (it checks each against the formula itself) and a sum over
 * each group. Run under mpirun with 1 to 8 ranks. */
#include "mesh.h"
#include "device.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;
#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL: " __VA_ARGS__);                             \
            fprintf(stderr, "\n");                                             \
            failures++;                                                        \
        }                                                                      \
    } while (0)

/* Pure checks of one shape: the numbering is a bijection, an axis group's members
 * differ from the rank in that coordinate only, the EP blocks and EDP groups
 * cut each stage's t x c x d ranks into e x (t c d / e) places, each rank at
 * exactly one, and the stage and sequence groups are the ranks of its pp and of
 * its (dp, pp), in their orders. */
static void check_shape(const mesh_dims *d, int n) {
    const int t = d->size[MESH_TP], c_ = d->size[MESH_CP], plane = c_ * d->size[MESH_DP];
    const int blocks = t * plane / d->ep;
    int *members = malloc(sizeof(int) * (size_t)n), *seen = calloc((size_t)n, sizeof(int));
    for (int r = 0; r < n; r++) {
        const mesh_coord c = mesh_coord_of(d, r);
        CHECK(mesh_rank_of(d, c) == r, "rank %d does not come back from its coordinate", r);
        CHECK(c.at[MESH_TP] == r % d->size[MESH_TP], "rank %d: TP is not the fastest axis", r);
        for (int a = 0; a < MESH_NAXES; a++) {
            mesh_axis_members(d, r, (mesh_axis)a, members);
            for (int i = 0; i < d->size[a]; i++) {
                mesh_coord m = mesh_coord_of(d, members[i]);
                CHECK(m.at[a] == i, "rank %d's %s group: member %d at place %d", r, mesh_axis_names[a], members[i], i);
                m.at[a] = c.at[a];
                CHECK(mesh_rank_of(d, m) == r, "rank %d's %s group: member %d differs elsewhere", r,
                      mesh_axis_names[a], members[i]);
            }
        }
        mesh_ep_members(d, r, members);
        int in_ep = 0;
        for (int i = 0; i < d->ep; i++) {
            const mesh_coord m = mesh_coord_of(d, members[i]);
            CHECK(m.at[MESH_PP] == c.at[MESH_PP], "rank %d's ep group leaves its stage", r);
            in_ep += members[i] == r;
            if (members[0] == r) seen[members[i]]++; /* each block counted once, from its first member */
        }
        CHECK(in_ep == 1, "rank %d is %d times in its own ep group", r, in_ep);
        mesh_edp_members(d, r, members);
        int in_edp = 0;
        for (int i = 0; i < blocks; i++) in_edp += members[i] == r;
        CHECK(in_edp == 1, "rank %d is %d times in its own edp group", r, in_edp);
        mesh_stage_members(d, r, members); /* f = tp + t x (cp + c x dp) */
        for (int f = 0; f < t * plane; f++) {
            const mesh_coord m = mesh_coord_of(d, members[f]);
            CHECK(m.at[MESH_PP] == c.at[MESH_PP] && m.at[MESH_TP] + t * (m.at[MESH_CP] + c_ * m.at[MESH_DP]) == f,
                  "rank %d's stage group: member %d at place %d", r, members[f], f);
        }
        mesh_sequence_members(d, r, members); /* tp + t x cp */
        for (int i = 0; i < t * c_; i++) {
            const mesh_coord m = mesh_coord_of(d, members[i]);
            CHECK(m.at[MESH_PP] == c.at[MESH_PP] && m.at[MESH_DP] == c.at[MESH_DP] &&
                  m.at[MESH_TP] + t * m.at[MESH_CP] == i, "rank %d's sequence group: member %d at place %d", r,
                  members[i], i);
        }
        mesh_replica_members(d, r, members); /* the c x d ranks of its (tp, pp), its place f = cp + c x dp */
        for (int f = 0; f < plane; f++) {
            const mesh_coord m = mesh_coord_of(d, members[f]);
            CHECK(m.at[MESH_TP] == c.at[MESH_TP] && m.at[MESH_PP] == c.at[MESH_PP] &&
                  m.at[MESH_CP] + d->size[MESH_CP] * m.at[MESH_DP] == f,
                  "rank %d's replica group: member %d at place %d", r, members[f], f);
        }
    }
    for (int r = 0; r < n; r++) CHECK(seen[r] == 1, "rank %d is in %d ep blocks", r, seen[r]);
    free(members);
    free(seen);
}

/* mesh_init's groups (each checked against the formula inside) and a sum over each */
static void check_groups(mesh_dims d) {
    rank_mesh m;
    mesh_init(&m, d, COMM_MPI);
    for (int a = 0; a < MESH_NAXES; a++) {
        double x = m.world.rank, want = 0;
        int *members = malloc(sizeof(int) * (size_t)d.size[a]);
        mesh_axis_members(&d, m.world.rank, (mesh_axis)a, members);
        for (int i = 0; i < d.size[a]; i++) want += members[i];
        comm_allreduce_host(&m.axis[a], &x, 1);
        CHECK(x == want, "rank %d: the sum of its %s group's world ranks is %g, not %g", m.world.rank,
              mesh_axis_names[a], x, want);
        free(members);
    }
    /* the replica group: the c x d ranks of this (tp, pp), summed */
    const int plane = d.size[MESH_CP] * d.size[MESH_DP];
    int *members = malloc(sizeof(int) * (size_t)plane);
    mesh_replica_members(&d, m.world.rank, members);
    double x = m.world.rank, want = 0;
    for (int f = 0; f < plane; f++) want += members[f];
    comm_allreduce_host(mesh_replicas(&m), &x, 1);
    CHECK(x == want, "rank %d: the sum of its replica group's world ranks is %g, not %g", m.world.rank, x, want);
    free(members);
    if (d.experts) { /* the stage's and the sequence's groups, summed */
        const int t = d.size[MESH_TP], sizes[2] = {t * plane, t * d.size[MESH_CP]};
        for (int g = 0; g < 2; g++) {
            members = malloc(sizeof(int) * (size_t)sizes[g]);
            (g ? mesh_sequence_members : mesh_stage_members)(&d, m.world.rank, members);
            x = m.world.rank, want = 0;
            for (int i = 0; i < sizes[g]; i++) want += members[i];
            comm_allreduce_host(g ? mesh_sequence(&m) : mesh_stage(&m), &x, 1);
            CHECK(x == want, "rank %d: the sum of its %s group's world ranks is %g, not %g", m.world.rank,
                  g ? "sequence" : "stage", x, want);
            free(members);
        }
    }
    mesh_free(&m);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int shapes = 0;
    for (int t = 1; t <= n; t++)
        for (int c = 1; c <= n; c++)
            for (int d = 1; d <= n; d++)
                for (int p = 1; p <= n; p++) {
                    if (t * c * d * p != n) continue;
                    for (int e = 1; e <= t * c * d; e++) {
                        if ((t * c * d) % e) continue;
                        const mesh_dims dims = {.size = {t, c, d, p}, .ep = e};
                        CHECK(mesh_ranks(&dims) == n, "mesh_ranks");
                        check_shape(&dims, n);
                        shapes++;
                    }
                }
    /* by hand, on 8 ranks tp2 x cp2 x dp2 with ep 2: rank 5 is (tp 1, cp 0, dp 1), stage index 5: its EP
     * block holds places 4, 5 (ranks 4, 5), its EDP group the second place of each block (ranks 1, 3, 5, 7),
     * its sequences the t x c ranks of dp 1 (4, 5, 6, 7) */
    if (n == 8) {
        const mesh_dims d = {.size = {2, 2, 2, 1}, .ep = 2, .experts = 1};
        int ep[2], edp[4], seq[4];
        mesh_ep_members(&d, 5, ep);
        mesh_edp_members(&d, 5, edp);
        mesh_sequence_members(&d, 5, seq);
        CHECK(ep[0] == 4 && ep[1] == 5, "rank 5's ep group is {%d,%d}, not {4,5}", ep[0], ep[1]);
        CHECK(edp[0] == 1 && edp[1] == 3 && edp[2] == 5 && edp[3] == 7, "rank 5's edp group is {%d,%d,%d,%d}, not "
              "{1,3,5,7}", edp[0], edp[1], edp[2], edp[3]);
        CHECK(seq[0] == 4 && seq[3] == 7, "rank 5's sequence group is {%d..%d}, not {4..7}", seq[0], seq[3]);
        check_groups(d);
        check_groups((mesh_dims){.size = {1, 2, 2, 2}, .ep = 4});
        check_groups((mesh_dims){.size = {2, 1, 2, 2}, .ep = 2, .experts = 1});
    }
    if (n == 6) check_groups((mesh_dims){.size = {1, 3, 2, 1}, .ep = 3});
    check_groups((mesh_dims){.size = {1, 1, n, 1}, .ep = 1});
    int all_failures = 0;
    MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d shapes of %d ranks, %d failures\n", all_failures ? "FAIL" : "passed", shapes, n,
                          all_failures);
    MPI_Finalize();
    return all_failures ? 1 : 0;
}
