/* The rank mesh (mesh.h). */
#include "mesh.h"
#include "run.h" /* die */
#include <stdlib.h>
#include <string.h>

const char *const mesh_axis_names[MESH_NAXES] = {"tp", "cp", "dp", "pp"};

long long mesh_ranks(const mesh_dims *d) {
    long long n = 1;
    for (int a = 0; a < MESH_NAXES; a++) n *= d->size[a];
    return n;
}

mesh_coord mesh_coord_of(const mesh_dims *d, int rank) {
    mesh_coord c;
    for (int a = 0; a < MESH_NAXES; a++) { /* the axes in order, fastest first */
        c.at[a] = rank % d->size[a];
        rank /= d->size[a];
    }
    return c;
}

int mesh_rank_of(const mesh_dims *d, mesh_coord c) {
    int rank = 0;
    for (int a = MESH_NAXES - 1; a >= 0; a--) rank = rank * d->size[a] + c.at[a];
    return rank;
}

void mesh_axis_members(const mesh_dims *d, int rank, mesh_axis axis, int *members) {
    mesh_coord c = mesh_coord_of(d, rank);
    for (int i = 0; i < d->size[axis]; i++) {
        c.at[axis] = i;
        members[i] = mesh_rank_of(d, c);
    }
}

/* The tp x cp x dp ranks of one stage: the flat index f = tp + t x (cp + c x dp) and back. */
static int stage_index(const mesh_dims *d, mesh_coord c) {
    return c.at[MESH_TP] + d->size[MESH_TP] * (c.at[MESH_CP] + d->size[MESH_CP] * c.at[MESH_DP]);
}
static int at_stage_index(const mesh_dims *d, mesh_coord c, int f) {
    c.at[MESH_TP] = f % d->size[MESH_TP];
    f /= d->size[MESH_TP];
    c.at[MESH_CP] = f % d->size[MESH_CP];
    c.at[MESH_DP] = f / d->size[MESH_CP];
    return mesh_rank_of(d, c);
}
static int stage_size(const mesh_dims *d) { return d->size[MESH_TP] * d->size[MESH_CP] * d->size[MESH_DP]; }

void mesh_ep_members(const mesh_dims *d, int rank, int *members) {
    const mesh_coord c = mesh_coord_of(d, rank);
    const int block = stage_index(d, c) / d->ep;
    for (int i = 0; i < d->ep; i++) members[i] = at_stage_index(d, c, block * d->ep + i);
}

void mesh_edp_members(const mesh_dims *d, int rank, int *members) {
    const mesh_coord c = mesh_coord_of(d, rank);
    const int place = stage_index(d, c) % d->ep, blocks = stage_size(d) / d->ep;
    for (int i = 0; i < blocks; i++) members[i] = at_stage_index(d, c, i * d->ep + place);
}

void mesh_stage_members(const mesh_dims *d, int rank, int *members) {
    const mesh_coord c = mesh_coord_of(d, rank);
    for (int f = 0; f < stage_size(d); f++) members[f] = at_stage_index(d, c, f);
}

/* The ranks that differ from rank only in axes a and b, in the order a + size[a] x b. */
static void plane_members(const mesh_dims *d, int rank, mesh_axis a, mesh_axis b, int *members) {
    mesh_coord c = mesh_coord_of(d, rank);
    for (int i = 0; i < d->size[a] * d->size[b]; i++) {
        c.at[a] = i % d->size[a];
        c.at[b] = i / d->size[a];
        members[i] = mesh_rank_of(d, c);
    }
}
static int plane_place(const mesh_dims *d, mesh_coord c, mesh_axis a, mesh_axis b) { return c.at[a] + d->size[a] * c.at[b]; }

void mesh_sequence_members(const mesh_dims *d, int rank, int *members) { plane_members(d, rank, MESH_TP, MESH_CP, members); }

void mesh_replica_members(const mesh_dims *d, int rank, int *members) { plane_members(d, rank, MESH_CP, MESH_DP, members); }

/* The group of `members` (the mesh's formula for this rank's group of `name`), with this rank at `place`:
 * a formula that left the rank out, or put it elsewhere, would train the wrong groups without any error. */
static void make_group(const comm *world, comm *g, const char *name, const int *members, int size, int place) {
    if (members[place] != world->rank)
        die("mesh_init: rank %d's %s group puts world rank %d at its place %d", world->rank, name, members[place],
            place);
    comm_group(world, members, size, g);
    comm_set_axis(g, name);
}

void mesh_init(rank_mesh *m, mesh_dims dims, comm_backend backend) {
    memset(m, 0, sizeof *m);
    m->dims = dims;
    comm_init(&m->world, MPI_COMM_WORLD, backend);
    comm_set_axis(&m->world, "world");
    if (mesh_ranks(&dims) != m->world.size)
        die("mesh_init: the mesh has %lld ranks, the world %d", mesh_ranks(&dims), m->world.size);
    const int r = m->world.rank, t = dims.size[MESH_TP], c = dims.size[MESH_CP], plane = c * dims.size[MESH_DP];
    const int stage = t * plane;
    if (dims.ep < 1 || stage % dims.ep != 0) die("mesh_init: ep %d does not divide tp x cp x dp = %d", dims.ep, stage);
    m->me = mesh_coord_of(&dims, r);
    int *members = malloc(sizeof(int) * (size_t)m->world.size);
    if (!members) die("out of host memory");
    for (int a = 0; a < MESH_NAXES; a++) {
        mesh_axis_members(&dims, r, (mesh_axis)a, members);
        make_group(&m->world, &m->axis[a], mesh_axis_names[a], members, dims.size[a], m->me.at[a]);
    }
    const int f = stage_index(&dims, m->me);
    if (c > 1) {
        mesh_replica_members(&dims, r, members);
        make_group(&m->world, &m->replicas, "cpdp", members, plane, plane_place(&dims, m->me, MESH_CP, MESH_DP));
    }
    if (dims.ep > 1) {
        mesh_ep_members(&dims, r, members);
        make_group(&m->world, &m->ep, "ep", members, dims.ep, f % dims.ep);
        mesh_edp_members(&dims, r, members);
        make_group(&m->world, &m->edp, "edp", members, stage / dims.ep, f / dims.ep);
    }
    if (dims.experts && t > 1) {
        mesh_stage_members(&dims, r, members);
        make_group(&m->world, &m->stage, "stage", members, stage, f);
        if (c > 1) {
            mesh_sequence_members(&dims, r, members);
            make_group(&m->world, &m->sequence, "seq", members, t * c, plane_place(&dims, m->me, MESH_TP, MESH_CP));
        }
    }
    free(members);
}

void mesh_free(rank_mesh *m) {
    const int t = m->dims.size[MESH_TP];
    if (m->dims.experts && t > 1 && m->dims.size[MESH_CP] > 1) comm_free(&m->sequence);
    if (m->dims.experts && t > 1) comm_free(&m->stage);
    if (m->dims.ep > 1) {
        comm_free(&m->edp);
        comm_free(&m->ep);
    }
    if (m->dims.size[MESH_CP] > 1) comm_free(&m->replicas);
    for (int a = MESH_NAXES - 1; a >= 0; a--) comm_free(&m->axis[a]);
    comm_free(&m->world);
}

comm *mesh_replicas(rank_mesh *m) { return m->dims.size[MESH_CP] > 1 ? &m->replicas : &m->axis[MESH_DP]; }

comm *mesh_stage(rank_mesh *m) { return m->dims.size[MESH_TP] > 1 ? &m->stage : mesh_replicas(m); }

comm *mesh_sequence(rank_mesh *m) {
    return m->dims.size[MESH_TP] == 1 ? &m->axis[MESH_CP] : m->dims.size[MESH_CP] == 1 ? &m->axis[MESH_TP] : &m->sequence;
}
