/* Byte-level training data: a text file's bytes, or a corpus built in code.
 *
 * The global batch of step s is a pure function of (seed, s): row i starts at
 * an offset drawn from (seed, s, i). A data-parallel rank asks for its rows, a
 * pipeline stage for its micro-batch's rows, and every layout trains on the
 * same tokens.
 *
 * The last 10% of the bytes are held out: no training window reaches into
 * them, so --eval measures the loss on text the model has never seen. */
#ifndef PL_DATA_H
#define PL_DATA_H
#include <stddef.h>
#include <stdint.h>

typedef struct dataset {
    unsigned char *bytes;
    long n;
    long train_n;     /* training windows lie inside [0, train_n); the rest is held out */
    int sequential;   /* 0: random windows; B > 0: a held-out view (data_heldout) whose
                       * batch s, row r is the window starting at (s B + r) x T */
    const char *source; /* "built-in corpus" or the file's path (the caller's string) */
    uint64_t hash;      /* fnv1a64 of the bytes: ranks compare it before training */
} dataset;

/* The largest --data file read (1 GiB): every rank holds all of it in memory. */
#define DATA_MAX_BYTES (1LL << 30)

/* path NULL: the built-in corpus. Returns 0, or -1 with a one-line reason in err
 * (missing, not a regular file, unreadable, larger than DATA_MAX_BYTES, or
 * shorter than seq + 1 bytes). */
int data_load(dataset *d, const char *path, int seq, char *err, size_t errlen);
void data_free(dataset *d);

/* Rows [row_begin, row_begin + rows) of the global batch of `step`:
 * tokens[r*T + t] and targets[r*T + t] = the next byte. Host arrays. */
void data_batch(const dataset *d, uint64_t seed, int step, int row_begin, int rows, int T,
                int *tokens, int *targets);

/* The held-out split as a dataset of its own, for --eval: batch s of `batch`
 * rows holds the fixed sequential windows s x batch .. (s+1) x batch - 1 of T
 * tokens each, read with data_batch like training batches (the seed does not
 * matter). Returns how many whole batches it holds, at most DATA_EVAL_BATCHES:
 * 0 when the data is too short for one (view is then not set). The view
 * shares d's bytes: never data_free it. */
#define DATA_EVAL_BATCHES 8
int data_heldout(const dataset *d, int batch, int T, dataset *view);

/* 64-bit FNV-1a of n bytes, continuing from h (start with FNV1A64_INIT). */
#define FNV1A64_INIT 1469598103934665603ULL
uint64_t fnv1a64(uint64_t h, const void *data, size_t n);

/* The built-in corpus (exposed for tests): the same bytes on every call. */
long data_builtin(unsigned char **out);

#endif
