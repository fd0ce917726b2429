#include "grid.h"
#include "device.h"
#include "mesh.h"
#include "jsonval.h"
#include "theory.h" /* th_stage_layers: the map shows each stage's layers */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- choosing the degrees --------------------------------------------------------- */

/* The omitted degrees (0) share the ranks the given ones leave: every axis
 * but the last takes 2 of them when it can, the last (the data-parallel
 * replicas) the rest. */
static void fill(long long left, int *values, int n) {
    for (int i = 0; i < n - 1; i++)
        if (!values[i]) {
            values[i] = left % 2 == 0 ? 2 : 1;
            left /= values[i];
        }
    if (!values[n - 1]) values[n - 1] = (int)left;
}

grid_dims grid_defaults(int ranks) {
    int v[3] = {0, 0, 0};
    fill(ranks, v, 3);
    return (grid_dims){v[0], v[1], v[2]};
}

void grid_defaults_axes(int ranks, int *values, int n) {
    for (int i = 0; i < n; i++) values[i] = 0;
    fill(ranks, values, n);
}

int grid_choose_axes(run_ctx *ctx, const char *const *names, int *values, int n) {
    const int ranks = ctx->size;
    char rule[96] = "", omitted[96] = "";
    size_t rule_len = 0, omitted_len = 0;
    for (int i = 0; i < n; i++) {
        rule_len += (size_t)snprintf(rule + rule_len, sizeof rule - rule_len, "%s%s", i ? " x " : "", names[i]);
        if (i < n - 1)
            omitted_len += (size_t)snprintf(omitted + omitted_len, sizeof omitted - omitted_len, "%s%s",
                                            !i ? "" : i == n - 2 ? " or " : ", ", names[i]);
        if (!run_flag_given(ctx->argc, ctx->argv, names[i])) values[i] = 0;
    }
    /* Divide the given degrees out one by one: exact, and no product to overflow. */
    long long left = ranks;
    int divides = 1, n_given = 0, n_given_filled = 0;
    double fixed = 1;
    char named[128] = "";
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (!values[i]) continue;
        n_given++;
        n_given_filled += i < n - 1;
        fixed *= values[i];
        if (divides && left % values[i] == 0) left /= values[i];
        else divides = 0;
        len += (size_t)snprintf(named + len, sizeof named - len, "%s%s %d", len ? " x " : "", names[i], values[i]);
    }
    if (!divides) {
        if (n_given > 1) snprintf(named + len, sizeof named - len, " = %.15g", fixed);
        run_check(ctx, 0, "%s does not divide the %d ranks mpirun started (%s must equal the rank count)", named,
                  ranks, rule);
        for (int i = 0; i < n; i++) values[i] = 1;
        return 0;
    }
    fill(left, values, n);
    long long product = 1; /* at most 2^(n-1) x ranks */
    char shown[160] = "";
    len = 0;
    for (int i = 0; i < n; i++) {
        product *= values[i];
        len += (size_t)snprintf(shown + len, sizeof shown - len, "%s%s %d", i ? " x " : "", names[i], values[i]);
    }
    run_check(ctx, product == ranks, "%s = %lld, but mpirun started %d ranks (%s must equal the rank count%s%s%s)",
              shown, product, ranks, rule, n_given_filled == n - 1 ? "" : "; an omitted ",
              n_given_filled == n - 1 ? "" : omitted, n_given_filled == n - 1 ? "" : " is 2 when the ranks allow");
    if (product != ranks)
        for (int i = 0; i < n; i++) values[i] = 1;
    return product == ranks;
}

grid_dims grid_choose(run_ctx *ctx, int tp, int pp, int dp) {
    static const char *const names[3] = {"--tp", "--pp", "--dp"};
    int v[3] = {tp, pp, dp};
    grid_choose_axes(ctx, names, v, 3);
    return (grid_dims){v[0], v[1], v[2]};
}

/* lab06's grid is the mesh's TP x PP x DP case (CP 1): the same numbering */
static mesh_dims mesh_of(grid_dims d) { return (mesh_dims){.size = {d.tp, 1, d.dp, d.pp}, .ep = 1}; }

grid_coord grid_coord_of(grid_dims d, int rank) {
    const mesh_dims m = mesh_of(d);
    const mesh_coord c = mesh_coord_of(&m, rank);
    return (grid_coord){.tp = c.at[MESH_TP], .pp = c.at[MESH_PP], .dp = c.at[MESH_DP]};
}

int grid_rank_of(grid_dims d, grid_coord c) {
    const mesh_dims m = mesh_of(d);
    return mesh_rank_of(&m, (mesh_coord){.at = {c.tp, 0, c.dp, c.pp}});
}

/* ---- the groups ------------------------------------------------------------------ */

void grid_init(process_grid *g, grid_dims dims, comm_backend backend) {
    memset(g, 0, sizeof *g);
    g->dims = dims;
    mesh_init(&g->mesh, mesh_of(dims), backend); /* each group checked against the numbering */
    g->me = grid_coord_of(dims, g->mesh.world.rank);
    g->world = &g->mesh.world;
    g->tp = &g->mesh.axis[MESH_TP];
    g->pipe = &g->mesh.axis[MESH_PP];
    g->dp = &g->mesh.axis[MESH_DP];
}

void grid_free(process_grid *g) { mesh_free(&g->mesh); }

/* ---- the map ---------------------------------------------------------------------- */

/* What each rank tells rank 0: its place in each group and the world ranks of
 * each group's members, as the communicators (not the formula) say. */
static int *gather_groups(process_grid *g, int *fields) {
    const grid_dims d = g->dims;
    *fields = 4 + d.tp + d.pp + d.dp;
    int *mine = malloc(sizeof(int) * (size_t)*fields);
    int *all = g->world->rank == 0 ? malloc(sizeof(int) * (size_t)*fields * (size_t)g->world->size) : NULL;
    if (!mine || (g->world->rank == 0 && !all)) die("out of host memory");
    mine[0] = g->world->rank;
    mine[1] = g->tp->rank;
    mine[2] = g->pipe->rank;
    mine[3] = g->dp->rank;
    MPI_Allgather(&g->world->rank, 1, MPI_INT, mine + 4, 1, MPI_INT, g->tp->mpi);
    MPI_Allgather(&g->world->rank, 1, MPI_INT, mine + 4 + d.tp, 1, MPI_INT, g->pipe->mpi);
    MPI_Allgather(&g->world->rank, 1, MPI_INT, mine + 4 + d.tp + d.pp, 1, MPI_INT, g->dp->mpi);
    MPI_Gather(mine, *fields, MPI_INT, all, *fields, MPI_INT, 0, MPI_COMM_WORLD);
    free(mine);
    return all;
}

/* Every group once, from its member 0: [[0,1],[2,3]]. */
static json_t *json_groups(const int *all, int fields, int ranks, int axis, int offset, int size) {
    json_t *groups = json_array();
    double *members = malloc(sizeof(double) * (size_t)size);
    if (!groups || !members) die("out of host memory");
    for (int r = 0; r < ranks; r++) {
        const int *x = all + (size_t)r * fields;
        if (x[1 + axis] != 0) continue;
        for (int k = 0; k < size; k++) members[k] = x[offset + k];
        jsonval_append(groups, jsonval_integers(members, size));
    }
    free(members);
    return groups;
}

static void print_groups(const char *title, const int *all, int fields, int ranks, int axis, int offset, int size) {
    printf("  %s:", title);
    int shown = 0;
    for (int r = 0; r < ranks; r++) {
        const int *x = all + (size_t)r * fields;
        if (x[1 + axis] != 0) continue;
        if (++shown > 16) { printf(" ..."); break; }
        printf(" [");
        for (int k = 0; k < size; k++) printf("%s%d", k ? " " : "", x[offset + k]);
        printf("]");
    }
    printf("\n");
}

json_t *grid_describe(process_grid *g, int layers, const run_ctx *ctx) {
    const grid_dims d = g->dims;
    const int ranks = g->world->size;
    /* hosts as run_setup found them: the ranks that share memory, named by MPI_Get_processor_name */
#define HOST(r) run_host_label(ctx, r)
#define SAME_HOST(a, b) (ctx->host_of_rank[a] == ctx->host_of_rank[b])
    int fields;
    int *all = gather_groups(g, &fields);
    const int n_hosts = ctx->hosts;
    /* TP groups that span hosts (from their members as the communicators
     * report them): those carry their per-layer all-reduces over the network.
     * other[r]: for member 0 of such a group, a member on another host, else -1. */
    int spans = 0, *other = malloc(sizeof(int) * (size_t)ranks);
    if (!other) die("out of host memory");
    for (int r = 0; r < ranks; r++) {
        other[r] = -1;
        const int *x = all ? all + (size_t)r * fields : NULL;
        if (!x || x[1] != 0) continue;
        for (int k = 1; k < d.tp && other[r] < 0; k++)
            if (!SAME_HOST(r, x[4 + k])) other[r] = x[4 + k];
        spans |= other[r] >= 0;
    }

    /* Pipeline boundaries inside a host while TP groups cross hosts: the grid
     * upside down, the host's fast links carrying one activation per
     * micro-batch and the network the all-reduces of every layer. */
    int inside = 0, inside_a = -1, inside_b = -1;
    for (int r = 0; r < ranks && spans && all; r++) {
        const int *x = all + (size_t)r * fields;
        if (x[2] != 0) continue; /* each pipeline once, from its first stage */
        for (int k = 0; k + 1 < d.pp; k++) {
            const int a = x[4 + d.tp + k], c = x[4 + d.tp + k + 1];
            if (!SAME_HOST(a, c)) continue;
            if (!inside++) { inside_a = a; inside_b = c; }
        }
    }
    /* whether every host holds one block of consecutive ranks (a launcher that
     * deals ranks round robin does not), and each host's rank count: the fixes */
    int blocks = 1, dealt = -1;
    for (int r = 1; r < ranks; r++)
        if (!SAME_HOST(r, r - 1) && ctx->host_of_rank[r] != r && blocks) { blocks = 0; dealt = ctx->host_of_rank[r]; }
    char dealt_ranks[64] = "";
    for (int r = 0, len = 0, shown = 0; !blocks && r < ranks; r++) {
        if (ctx->host_of_rank[r] != dealt) continue;
        if (++shown > 4) { snprintf(dealt_ranks + len, sizeof dealt_ranks - (size_t)len, ",..."); break; }
        len += snprintf(dealt_ranks + len, sizeof dealt_ranks - (size_t)len, "%s%d", shown > 1 ? "," : "", r);
    }
    /* each host's rank count, for the fix by --tp: one dividing all of them */
    char sizes[96] = "";
    int largest_host = 0;
    for (int r = 0, shown = 0, len = 0; r < ranks; r++) {
        if (ctx->host_of_rank[r] != r) continue; /* each host once, at its first rank */
        int n = 0;
        for (int q = 0; q < ranks; q++) n += SAME_HOST(q, r);
        if (n > largest_host) largest_host = n;
        if (++shown > 9) continue;
        if (shown == 9) snprintf(sizes + len, sizeof sizes - (size_t)len, " ...");
        else len += snprintf(sizes + len, sizeof sizes - (size_t)len, "%s%d", shown > 1 ? " " : "", n);
    }

    json_t *grid = json_object(), *by_rank = json_array();
    if (!grid || !by_rank) die("out of host memory");
    jsonval_set(grid, "tp", json_integer(d.tp));
    jsonval_set(grid, "pp", json_integer(d.pp));
    jsonval_set(grid, "dp", json_integer(d.dp));
    jsonval_set(grid, "order", jsonval_text("rank = tp + t*(dp + d*pp)"));
    jsonval_set(grid, "hosts", json_integer(n_hosts));
    jsonval_set(grid, "tp_group_spans_hosts", json_boolean(spans));
    jsonval_set(grid, "pipeline_boundaries_inside_hosts_while_tp_spans", json_integer(inside));
    for (int r = 0; r < ranks; r++) {
        grid_coord c = grid_coord_of(d, r);
        const int *x = all ? all + (size_t)r * fields : NULL;
        /* the coordinate is the rank's place in each communicator, as reported */
        json_t *place = json_object();
        if (!place) die("out of host memory");
        jsonval_append(by_rank, place);
        jsonval_set(place, "rank", json_integer(r));
        jsonval_set(place, "tp", json_integer(x ? x[1] : c.tp));
        jsonval_set(place, "pp", json_integer(x ? x[2] : c.pp));
        jsonval_set(place, "dp", json_integer(x ? x[3] : c.dp));
        jsonval_set(place, "host", jsonval_text(HOST(r)));
    }
    jsonval_set(grid, "ranks", by_rank);
    if (all) {
        jsonval_set(grid, "tp_groups", json_groups(all, fields, ranks, 0, 4, d.tp));
        jsonval_set(grid, "pp_groups", json_groups(all, fields, ranks, 1, 4 + d.tp, d.pp));
        jsonval_set(grid, "dp_groups", json_groups(all, fields, ranks, 2, 4 + d.tp + d.pp, d.dp));
    }

    if (g->world->rank == 0) {
        printf("3D grid: --tp %d x --pp %d x --dp %d = %d rank%s on %d host%s | rank = tp + %d x (dp + %d x pp): "
               "TP fastest, then DP, then PP\n", d.tp, d.pp, d.dp, ranks, ranks == 1 ? "" : "s", n_hosts,
               n_hosts == 1 ? "" : "s", d.tp, d.dp);
        printf("  a row is a pipeline stage, a column a data-parallel replica, [...] a TP group (its host)\n");
        for (int pp = 0; pp < d.pp; pp++) {
            int lo, hi;
            th_stage_layers(layers, d.pp, pp, &lo, &hi);
            printf("  stage %d, layers [%d,%d):", pp, lo, hi);
            for (int dp = 0; dp < d.dp && dp < 8; dp++) {
                int first = grid_rank_of(d, (grid_coord){0, pp, dp});
                printf("  dp %d [", dp);
                for (int t = 0; t < d.tp; t++) printf("%s%d", t ? " " : "", grid_rank_of(d, (grid_coord){t, pp, dp}));
                printf("] (%s%s)", HOST(first), other[first] >= 0 ? "+..." : "");
            }
            printf("%s\n", d.dp > 8 ? "  ..." : "");
        }
        printf("  rank   tp pp dp  host\n");
        for (int r = 0; r < ranks; r++) {
            if (r == 32 && ranks > 33) { printf("  ... (%d more ranks in the record)\n", ranks - 32); break; }
            const int *x = all + (size_t)r * fields;
            printf("  %4d   %2d %2d %2d  %s\n", r, x[1], x[2], x[3], HOST(r));
        }
        print_groups("TP groups (all-reduce inside every layer)", all, fields, ranks, 0, 4, d.tp);
        print_groups("pipelines (send/recv between stages)", all, fields, ranks, 1, 4 + d.tp, d.pp);
        print_groups("DP groups (all-reduce gradients once per step)", all, fields, ranks, 2, 4 + d.tp + d.pp, d.dp);
        int shown_spans = 0, n_spans = 0;
        for (int r = 0; r < ranks; r++) n_spans += other[r] >= 0;
        for (int r = 0; r < ranks; r++) {
            if (other[r] < 0) continue;
            if (++shown_spans > 8) {
                printf("warning: ... and %d more TP groups span hosts\n", n_spans - 8);
                break;
            }
            printf("warning: the TP group of rank %d spans hosts %s and %s: its 4 all-reduces per layer and "
                   "micro-batch would cross the network; ", r, HOST(r), HOST(other[r]));
            if (d.tp > largest_host) /* no placement can help: the group is larger than a host */
                printf("--tp %d is more than the %d ranks of the largest host: a --tp that divides every host's "
                       "rank count (%s) keeps each TP group inside a host\n", d.tp, largest_host, sizes);
            else
                printf("give each host a multiple of --tp %d consecutive ranks (mpirun -ppn, srun "
                       "--ntasks-per-node, Open MPI --map-by ppr:N:node)\n", d.tp);
        }
        if (inside) {
            printf("warning: %d pipeline boundar%s inside a host while TP groups cross hosts (stages %d and %d, ranks %d "
                   "and %d, both on %s): the host's fast links carry one activation per micro-batch and the network "
                   "the all-reduces of every layer, the wrong way round; ", inside, inside == 1 ? "y is" : "ies are",
                   all[(size_t)inside_a * fields + 2], all[(size_t)inside_b * fields + 2], inside_a, inside_b,
                   HOST(inside_a));
            if (!blocks)
                printf("the launcher dealt the ranks round robin (%s holds ranks %s): place them in blocks, "
                       "a multiple of --tp %d per host (mpirun -ppn N or host:N in the hostfile, srun "
                       "--distribution=block, Open MPI --map-by slot)\n", HOST(dealt), dealt_ranks, d.tp);
            else
                printf("a --tp that divides every host's rank count (%s), or hosts of a multiple of --tp %d ranks "
                       "(-ppn), puts every TP group inside a host and the stages across\n", sizes, d.tp);
        }
        fflush(stdout);
    }
#undef HOST
#undef SAME_HOST
    free(other);
    free(all);
    return grid;
}
