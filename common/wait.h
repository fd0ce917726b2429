/* Waiting for MPI requests without spinning a core. A leaf of common/: MPI and
 * the clock alone, so that the trace, the flight recorder and comm can all wait
 * without depending on each other. The flight recorder watches every wait (its
 * watchdog, flight.h) through the watcher it installs when it starts. */
#ifndef PL_WAIT_H
#define PL_WAIT_H
#include <mpi.h>

typedef struct wait_watcher {
    void (*watch)(double since); /* a wait begun at `since` (now_seconds) goes on: look at its age */
    void (*unwatch)(void);       /* a wait that was watched ended */
    void (*fail)(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* MPI returned an error: ends the job */
} wait_watcher;
/* NULL: no watcher (a failed call then ends the job through die) */
void wait_set_watcher(const wait_watcher *w);

/* Wait for an MPI request without spinning a core (wait.c says why and how).
 * When every rank on each host has a core of its own nobody needs the core,
 * and the wait spins (a large message only moves while someone tests it).
 * comm_init makes the choice (wait_set_spin); the environment variable
 * PL_WAIT=spin|polite overrides it. */
void polite_wait(MPI_Request *req);
/* n requests (at most a send and a receive), st their statuses (for a receive's count) */
void polite_waitall(int n, MPI_Request *reqs, MPI_Status *st);
void wait_set_spin(int spin);
int comm_waits_spin(void); /* the choice in force */

/* rc of an MPI call that must succeed: else the watcher's fail (the flight
 * records of every rank, status 3), naming `call` and MPI's error string */
void wait_mpi_check(int rc, const char *call);

#endif
