/* Waiting for MPI requests without spinning a core (wait.h). */
#define _POSIX_C_SOURCE 200809L
#include "wait.h"
#include "device.h" /* now_seconds, die */
#include <time.h>

static const wait_watcher *watcher;

void wait_set_watcher(const wait_watcher *w) { watcher = w; }

void wait_mpi_check(int rc, const char *call) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    if (watcher) watcher->fail("%s: %s", call, msg);
    die("%s: %s", call, msg);
}

static void watch(double since) {
    if (watcher) watcher->watch(since);
}

static void unwatch(void) {
    if (watcher) watcher->unwatch();
}

/* Whether every rank on this host can have a core of its own; comm_init decides (wait_set_spin). */
static int spare_cores;

/* Blocking MPI waits spin, and a spinning rank on an oversubscribed laptop
 * (mpirun -n 4 on 2 cores) halves the speed of the rank that computes. So when
 * ranks outnumber cores, a short spin keeps latency at a few us when the
 * partner is ready; after that, sleeps backing off from 20 us to MAX_SLEEP give
 * the core away. MPI only moves a large message while someone tests it, so the
 * cap trades the core given away against progress. Measured on 2 cores, lab05
 * -n 4: cap 1 ms 3.8k tok/s, 0.5 ms 5.3k, 0.2 ms 6.8k; a rank sleeping through a
 * 300 ms barrier used 3 %, 6 % and 10-16 % of a core. With a core per rank
 * nobody needs the core: spin, as fast as MPI's own wait (lab05 -n 2: 7.4k ->
 * 13.5k tok/s, lab01 -n 2: 13.1k -> 15.0k). */
#define MAX_SLEEP_NS 200000L

/* MPI_Testall, its error the failed request's own (MPI_ERR_IN_STATUS says only that one failed) */
static void test_all(int n, MPI_Request *reqs, int *done, MPI_Status *st) {
    int rc = MPI_Testall(n, reqs, done, st);
    if (rc == MPI_ERR_IN_STATUS)
        for (int i = 0; i < n; i++)
            if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) rc = st[i].MPI_ERROR;
    wait_mpi_check(rc, "MPI_Testall");
}

/* st: n statuses (at most a send and a receive), for the receive's count. The
 * watchdog (the watcher's watch) looks at the wait's age at every sleep, and every
 * 1024 tests while spinning. */
void polite_waitall(int n, MPI_Request *reqs, MPI_Status *st) {
    if (n > 2) die("polite_waitall: %d requests", n);
    int done = 0;
    double start = now_seconds();
    long spins = 0;
    do {
        test_all(n, reqs, &done, st);
        if (done) {
            if (spins >= 1023) unwatch();
            return;
        }
        if ((++spins & 1023) == 0) watch(start);
    } while (spare_cores || now_seconds() - start < 50e-6);
    long ns = 20000;
    for (;;) {
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL); /* an early wake-up (EINTR) just tests sooner */
        test_all(n, reqs, &done, st);
        if (done) {
            unwatch();
            return;
        }
        watch(start);
        ns = ns * 2 > MAX_SLEEP_NS ? MAX_SLEEP_NS : ns * 2;
    }
}

void wait_set_spin(int spin) { spare_cores = spin; }

int comm_waits_spin(void) { return spare_cores; }

void polite_wait(MPI_Request *req) {
    MPI_Status st; /* not MPI_STATUS_IGNORE: see polite_waitall */
    polite_waitall(1, req, &st);
}

