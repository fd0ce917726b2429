/* plan3d --calibrate: this machine's rates, measured, saved and read back
 * (plan3d --check predicts the labs' clocks with them; the "cpu" cluster preset). */
#ifndef PLAN3D_CALIBRATE_H
#define PLAN3D_CALIBRATE_H
#include "presets.h"
#include <stddef.h>

/* This machine as plan3d --calibrate measured it. */
enum { CAL_C = 4, CAL_N = 3 };
typedef struct calibration {
    int cores;
    double d_model[CAL_C], tokens[CAL_N];  /* the grid the model rate was measured on */
    double gflops[CAL_C][CAL_N];           /* the course's forward + backward, model FLOP/s / 1e9 */
    double sgemm_gflops;                   /* one thread, 512 x 512 x 512 */
    double adamw_ns;                       /* AdamW per parameter */
    double p2p_us, p2p_gbs;                /* comm_sendrecv between two ranks */
    double allreduce_us, allreduce_gbs;    /* comm_allreduce of two ranks: per ring step, ring bytes */
} calibration;

/* mpirun -n 2 ./plan3d --calibrate: measures, writes `path` (JSON), prints it. */
int calibrate_machine(const char *path, int argc, char **argv);
/* 1 if `path` holds a calibration, 0 if there is no such file, -1 (why in
 * err, one line naming --calibration) if it is not a regular file or not a
 * calibration. */
int calibration_load(const char *path, calibration *cal, char *err, size_t errlen);
/* The course's model FLOP rate at d_model C and `tokens` rows x seq per rank
 * (log-bilinear on the grid, held at its edges). */
double calibration_rate(const calibration *cal, double d_model, double tokens);
/* The "cpu" cluster preset filled from the calibration for model m: 1, or as calibration_load. */
int calibration_cluster(const char *path, const th_model *m, cluster *c, char *err, size_t errlen);

#endif
