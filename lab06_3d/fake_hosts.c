/* A test helper, not part of the lab: a machine with several hosts, pretended.
 * Preloaded into a lab (LD_PRELOAD), it makes MPI_Get_processor_name report
 * "hostA" for ranks [0, k), "hostB" for [k, 2k), ... with k taken from
 * PL_FAKE_RANKS_PER_HOST, so tests can see the grid map and the warning for a
 * TP group that spans hosts on a single machine. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int MPI_Get_processor_name(char *name, int *resultlen) {
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *k_text = getenv("PL_FAKE_RANKS_PER_HOST");
    int k = k_text ? atoi(k_text) : 0;
    if (k <= 0) return PMPI_Get_processor_name(name, resultlen);
    *resultlen = snprintf(name, MPI_MAX_PROCESSOR_NAME, "host%c", 'A' + rank / k % 26);
    return MPI_SUCCESS;
}
