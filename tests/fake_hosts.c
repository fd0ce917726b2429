/* A test helper, not part of any lab: a machine with several hosts, pretended.
 * Preloaded into a lab (LD_PRELOAD), it makes MPI_Get_processor_name report
 * "hostA" for ranks [0, k), "hostB" for [k, 2k), ... with k taken from
 * PL_FAKE_RANKS_PER_HOST, and MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) group
 * the ranks by those hosts, so tests can see on a single machine what several
 * hosts print: every lab's per-host lines (common/run.c), the grid map and
 * its warnings for a TP group that spans hosts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int ranks_per_host(void) {
    const char *k_text = getenv("PL_FAKE_RANKS_PER_HOST");
    return k_text ? atoi(k_text) : 0;
}

static int fake_host(void) {
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank / ranks_per_host();
}

int MPI_Get_processor_name(char *name, int *resultlen) {
    if (ranks_per_host() <= 0) return PMPI_Get_processor_name(name, resultlen);
    *resultlen = snprintf(name, MPI_MAX_PROCESSOR_NAME, "host%c", 'A' + fake_host() % 26);
    return MPI_SUCCESS;
}

int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm *newcomm) {
    if (ranks_per_host() <= 0 || split_type != MPI_COMM_TYPE_SHARED)
        return PMPI_Comm_split_type(comm, split_type, key, info, newcomm);
    return PMPI_Comm_split(comm, fake_host(), key, newcomm);
}
