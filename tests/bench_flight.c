/* What the flight recorder costs one operation when nothing goes wrong: the
 * time of flight_begin + flight_end (a ring slot filled, the trace's label read,
 * a clock read, an uncontended mutex twice), on one rank, with the default
 * ring. docs/hangs.md multiplies it by the operations of a step. Not a test:
 * a timing is this machine's.
 *
 *   mpirun -n 1 ./bench_flight [operations, default 2000000] */
#include "comm.h"
#include "device.h"
#include <stdio.h>
#include <stdlib.h>

static double per_op_ns(comm *c, long n) {
    const double t0 = now_seconds();
    for (long i = 0; i < n; i++) flight_end(flight_begin(c, FL_ALLREDUCE, COMM_VALUES, 1000, -1, -1, -1, NULL, NULL, NULL), -1);
    return (now_seconds() - t0) / (double)n * 1e9;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const long n = argc > 1 ? atol(argv[1]) : 2000000;
    flight_hang_timeout = 0; /* no watchdog thread: the bench times the recorder alone */
    comm on;
    comm_init(&on, MPI_COMM_WORLD, COMM_MPI); /* the default ring, 64 operations */
    per_op_ns(&on, n / 10);                   /* warm up */
    double ring = per_op_ns(&on, n);
    comm_free(&on);
    printf("flight recorder: %.1f ns per operation with a ring of %d (%ld operations)\n", ring, flight_records, n);
    MPI_Finalize();
    return 0;
}
