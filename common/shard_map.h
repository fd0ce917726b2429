/* Which elements of the model's flat layout a rank's buffers hold, and where
 * (a replica, a pipeline stage, ZeRO's chunks, a tensor-parallel rank's rows and
 * columns: one run per contiguous piece), and the gather of those pieces into
 * the whole model on rank 0. The checkpoint (checkpoint.h) saves and resumes
 * through this view; --sample (sample.h) gathers the weights it writes with. */
#ifndef PL_SHARD_MAP_H
#define PL_SHARD_MAP_H

/* Local elements [local, local + n) hold global elements [global, global + n). */
typedef struct ckpt_run { long local, global, n; } ckpt_run;
typedef struct ckpt_map { ckpt_run *runs; int n, cap; } ckpt_map;

typedef struct ckpt_view {
    float *params, *adam_m, *adam_v; /* this rank's device buffers */
    long params_len, moments_len;    /* their lengths in floats (m and v share one) */
    ckpt_map params_at, moments_at;  /* which global elements they hold, and where */
    int first_step;                  /* set by ckpt_resume */
} ckpt_view;

void ckpt_view_init(ckpt_view *v, float *params, long params_len, float *adam_m, float *adam_v,
                    long moments_len);
/* ckpt_view_init + ckpt_hold for buffers that hold one contiguous range of the
 * model, [begin, end), params and moments alike (a replica, a pipeline stage). */
void ckpt_view_range(ckpt_view *v, float *params, float *adam_m, float *adam_v, long begin, long end);
/* The buffers hold global [global, global + n) at local offset `local`: params and
 * moments alike, or only one of them (ZeRO keeps whole parameters but sharded
 * moments). A run that continues the previous one is merged into it. */
void ckpt_hold(ckpt_view *v, long local, long global, long n);
void ckpt_hold_params(ckpt_view *v, long local, long global, long n);
void ckpt_hold_moments(ckpt_view *v, long local, long global, long n);
void ckpt_map_add(ckpt_map *m, long local, long global, long n);
void ckpt_view_free(ckpt_view *v);

/* Collective: the whole model's parameters (fp32 master weights, the flat layout)
 * gathered to rank 0, as ckpt_save gathers them: malloc'd on rank 0, NULL elsewhere. */
float *ckpt_gather_params(ckpt_view *v, long P);
/* The gather's pieces, for ckpt_save, which sends the moments with the
 * parameters: every rank's runs of one map (an element goes to rank 0 from the
 * LOWEST rank that holds it: replicas are identical, so each is sent once). */
typedef struct { ckpt_run *runs; int *count, *first; } shard_runs;
void shard_runs_allgather(const ckpt_map *m, int size, shard_runs *a); /* collective over MPI_COMM_WORLD */
void shard_runs_free(shard_runs *a);
/* The local indices of the elements this rank sends: those of its runs that no
 * lower rank holds. Returns how many; *sel is malloc'd. */
long shard_select_mine(const shard_runs *a, int rank, long P, long **sel);
/* Rank 0: every rank's packed elements where they belong, replaying the same
 * lowest-rank-wins walk the senders made. sections: 1 (params) or 2 (m, v). */
void shard_unpack(const shard_runs *a, int size, long P, const float *recv, const int *displs, const long *counts,
            int sections, float *const *full, const char *what);
/* n floats of a device buffer in host memory, malloc'd */
float *shard_host_copy(const float *dev, long n);

#endif
