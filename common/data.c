#define _POSIX_C_SOURCE 200809L
#include "data.h"
#include "paths.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A corpus a small model can learn within a short run: English-like sentences
 * from a small grammar. Word choice is random, but spelling, spacing, word
 * order and agreement are regular, so the loss falls from ln 256 = 5.5 to
 * about 2 in tens of steps, and a bigger model or a longer run keeps gaining. */
static const char *const subjects[] = {"the cat", "the dog", "a bird", "the old man", "my sister",
    "the teacher", "a small child", "the farmer", "our neighbour", "the king"};
static const char *const verbs[] = {"sees", "likes", "follows", "finds", "helps", "calls",
    "watches", "knows", "feeds", "carries"};
static const char *const objects[] = {"the ball", "a red apple", "the little house", "her friend",
    "the river", "a green hat", "the garden", "his book", "the white horse", "a loaf of bread"};
static const char *const places[] = {"in the morning", "near the sea", "after dinner",
    "at the market", "under the tree", "every day", "in the rain", "on sunday"};

static uint32_t next_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}
#define PICK(arr, s) arr[next_rand(s) % (sizeof arr / sizeof arr[0])]

long data_builtin(unsigned char **out) {
    const long target = 1 << 18; /* 256 KiB */
    char *buf = malloc((size_t)target + 256);
    if (!buf) return -1;
    uint64_t s = 12345;
    long n = 0;
    while (n < target) {
        const char *subj = PICK(subjects, &s);
        int k = (int)(next_rand(&s) % 4);
        if (k == 0)
            n += sprintf(buf + n, "%s %s %s. ", subj, PICK(verbs, &s), PICK(objects, &s));
        else if (k == 1)
            n += sprintf(buf + n, "%s %s %s %s. ", subj, PICK(verbs, &s), PICK(objects, &s), PICK(places, &s));
        else if (k == 2)
            n += sprintf(buf + n, "%s %s %s and %s. ", subj, PICK(verbs, &s), PICK(objects, &s), PICK(objects, &s));
        else
            n += sprintf(buf + n, "%s %s %s, and %s %s it.\n", subj, PICK(verbs, &s), PICK(objects, &s),
                         PICK(subjects, &s), PICK(verbs, &s));
    }
    *out = (unsigned char *)buf;
    return n;
}

/* Hold out the last 10% of the bytes when that makes at least one window;
 * a file too short for that trains on all of it (and --eval refuses it). */
static void hold_out(dataset *d, int seq) {
    long held = d->n / 10;
    d->train_n = held >= seq + 1 ? d->n - held : d->n;
}

int data_load(dataset *d, const char *path, int seq, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    if (!path) {
        d->n = data_builtin(&d->bytes);
        if (d->n < 0) { snprintf(err, errlen, "out of memory building the corpus"); return -1; }
        d->source = "built-in corpus";
        /* as a --data file: one window of T + 1 bytes at least (data_batch would read past the end) */
        if (d->n < (long)seq + 1) {
            snprintf(err, errlen, "--seq %d is longer than the built-in corpus (%ld bytes, need at least --seq + 1 "
                     "= %ld): give a smaller --seq, or --data FILE with more bytes", seq, d->n, (long)seq + 1);
            data_free(d);
            return -1;
        }
    } else {
        d->source = path;
        long long size;
        int fd = path_open_input("--data", path, DATA_MAX_BYTES, &size, err, errlen);
        if (fd < 0) return -1;
        unsigned char *buf = malloc((size_t)size + 1);
        if (!buf) {
            close(fd);
            snprintf(err, errlen, "--data %s: out of memory for %lld bytes", path, size);
            return -1;
        }
        int bad = path_read_exact(fd, buf, (size_t)size);
        close(fd);
        if (bad) {
            free(buf);
            snprintf(err, errlen, "--data %s: read error: %s", path, errno ? strerror(errno) : "the file shrank");
            return -1;
        }
        if (size < (long long)seq + 1) {
            free(buf);
            snprintf(err, errlen, "--data %s: %lld bytes, need at least --seq + 1 = %lld", path, size, (long long)seq + 1);
            return -1;
        }
        d->bytes = buf;
        d->n = (long)size;
    }
    d->hash = fnv1a64(FNV1A64_INIT, d->bytes, (size_t)d->n);
    hold_out(d, seq);
    return 0;
}

uint64_t fnv1a64(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

void data_free(dataset *d) {
    free(d->bytes);
    memset(d, 0, sizeof *d);
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

void data_batch(const dataset *d, uint64_t seed, int step, int row_begin, int rows, int T,
                int *tokens, int *targets) {
    /* start offsets with T + 1 bytes after them, all inside the training part */
    uint64_t windows = (uint64_t)(d->train_n - T);
    for (int r = 0; r < rows; r++) {
        uint64_t row = (uint64_t)(row_begin + r);
        uint64_t start = d->sequential
            ? ((uint64_t)step * (uint64_t)d->sequential + row) * (uint64_t)T
            : mix64(mix64(seed ^ 0xd1b54a32d192ed03ULL) + ((uint64_t)step << 32) + row) % windows;
        for (int t = 0; t < T; t++) {
            tokens[r * T + t] = d->bytes[start + t];
            targets[r * T + t] = d->bytes[start + t + 1];
        }
    }
}

int data_heldout(const dataset *d, int batch, int T, dataset *view) {
    long held = d->n - d->train_n;
    long windows = held > T ? (held - 1) / T : 0; /* window k needs bytes up to (k+1) T + 1 */
    long batches = windows / batch;
    if (batches > DATA_EVAL_BATCHES) batches = DATA_EVAL_BATCHES;
    if (batches < 1) return 0;
    *view = *d;
    view->bytes = d->bytes + d->train_n;
    view->n = view->train_n = held;
    view->sequential = batch;
    return (int)batches;
}
