/* The models and clusters plan3d knows by name, each with where its figures
 * come from. */
#ifndef PLAN3D_PRESETS_H
#define PLAN3D_PRESETS_H
#include "theory.h"

typedef struct model_preset {
    const char *name;
    th_model m;
    const char *about; /* the architecture, where it differs from GPT's, and the source */
} model_preset;

/* A cluster of identical nodes; bandwidths per GPU and per direction. */
typedef struct cluster {
    const char *name;
    int gpus, gpus_per_node;
    double mem_gib;            /* memory per GPU */
    double bf16_tflops;        /* dense peak, bf16 tensor cores */
    double fp32_tflops;        /* dense peak for fp32 training (TF32 tensor cores on GPUs) */
    double efficiency;         /* the fraction of peak the layers' compute reaches (stated, see presets.c) */
    double intra_gbs, intra_us; /* inside a node (NVLink): GB/s per GPU one way, latency per step */
    double inter_gbs, inter_us; /* between nodes: each GPU's own NIC */
    double hbm_gbs;            /* memory bandwidth: the optimizer step is bound by it */
    int cores;                 /* the CPU "cluster": cores shared by the ranks (0: a GPU each) */
    const char *source;
} cluster;

extern const model_preset model_presets[];
extern const int n_model_presets;
extern const cluster cluster_presets[];
extern const int n_cluster_presets;

/* NULL if unknown. */
const model_preset *find_model(const char *name);
const cluster *find_cluster(const char *name);

#endif
