#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"
#include "textbuf.h"
#include "device.h"
#include "mem.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The data is written as the host's floats: safetensors is little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c writes fp32 as the host stores it, which must be little-endian"
#endif

#define FORMAT "parallel-labs-checkpoint-1"

/* ---- what a rank holds ---------------------------------------------------------- */

void ckpt_map_add(ckpt_map *m, long local, long global, long n) {
    if (n <= 0) return;
    ckpt_run *last = m->n ? &m->runs[m->n - 1] : NULL;
    if (last && last->local + last->n == local && last->global + last->n == global) {
        last->n += n; /* one run per contiguous piece, however the lab listed it */
        return;
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 16;
        m->runs = realloc(m->runs, (size_t)m->cap * sizeof *m->runs);
        if (!m->runs) die("out of host memory");
    }
    m->runs[m->n++] = (ckpt_run){local, global, n};
}

void ckpt_view_init(ckpt_view *v, float *params, long params_len, float *adam_m, float *adam_v,
                    long moments_len) {
    *v = (ckpt_view){.params = params, .adam_m = adam_m, .adam_v = adam_v,
                     .params_len = params_len, .moments_len = moments_len};
}

static void hold(ckpt_map *m, long len, long local, long global, long n, const char *what) {
    if (local < 0 || global < 0 || local + n > len)
        die("checkpoint view: %s run [%ld, %ld) lies outside the %ld-element buffer", what, local, local + n, len);
    ckpt_map_add(m, local, global, n);
}
void ckpt_hold_params(ckpt_view *v, long local, long global, long n) {
    hold(&v->params_at, v->params_len, local, global, n, "params");
}
void ckpt_hold_moments(ckpt_view *v, long local, long global, long n) {
    hold(&v->moments_at, v->moments_len, local, global, n, "moments");
}
void ckpt_hold(ckpt_view *v, long local, long global, long n) {
    ckpt_hold_params(v, local, global, n);
    ckpt_hold_moments(v, local, global, n);
}

void ckpt_view_range(ckpt_view *v, float *params, float *adam_m, float *adam_v, long begin, long end) {
    ckpt_view_init(v, params, end - begin, adam_m, adam_v, end - begin);
    ckpt_hold(v, 0, begin, end - begin);
}

void ckpt_view_free(ckpt_view *v) {
    free(v->params_at.runs);
    free(v->moments_at.runs);
    memset(v, 0, sizeof *v);
}

/* ---- the tensors of the file ---------------------------------------------------- */

typedef struct {
    char name[96];
    long rows, cols; /* cols == 1: a vector, shape [rows] */
    long offset;     /* in floats from the start of the data */
} tensor_entry;

typedef struct {
    tensor_entry *t;
    int n;
    long params; /* P: floats per section (params, m, v) */
} tensor_table;

typedef struct { tensor_table *table; const char *prefix; long base; int layers; } table_ctx;

static void add_tensor(void *vctx, const tensor_info *t, long offset, int layer) {
    table_ctx *c = vctx;
    tensor_entry *e = &c->table->t[c->table->n++];
    if (layer >= 0 && layer < c->layers) /* model.h's names lack the layer: h.{l}. */
        snprintf(e->name, sizeof e->name, "%sh.%d.%s", c->prefix, layer, t->name);
    else
        snprintf(e->name, sizeof e->name, "%s%s", c->prefix, t->name);
    e->rows = t->rows;
    e->cols = t->cols;
    e->offset = c->base + offset;
}

/* Every tensor of the file in order: parameters, then "optimizer.m." and
 * "optimizer.v." copies, each section laid out as the flat buffer. */
static void tensor_table_init(tensor_table *tt, const gpt_config *cfg) {
    gpt_layout g;
    gpt_layout_init(&g, cfg);
    int per = EMBED_NTENSORS + cfg->layers * LAYER_NTENSORS + HEAD_NTENSORS;
    tt->t = calloc((size_t)per * 3, sizeof *tt->t);
    if (!tt->t) die("out of host memory");
    tt->n = 0;
    tt->params = g.total;
    const char *prefix[3] = {"", "optimizer.m.", "optimizer.v."};
    for (int s = 0; s < 3; s++) {
        table_ctx c = {tt, prefix[s], s * g.total, cfg->layers};
        gpt_for_each_tensor(&g, 0, g.total, add_tensor, &c);
    }
}

static void tensor_table_free(tensor_table *tt) { free(tt->t); }

/* ---- JSON: just enough for a safetensors header ---------------------------------- */


typedef struct { const char *p, *end; } scan;

static void skip_ws(scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int eat(scan *s, char c) {
    skip_ws(s);
    if (s->p < s->end && *s->p == c) { s->p++; return 1; }
    return 0;
}

/* A string into out (NUL-terminated); simple escapes only, \u of ASCII included. */
static int read_string(scan *s, char *out, size_t cap) {
    if (!eat(s, '"')) return 0;
    size_t n = 0;
    while (s->p < s->end && *s->p != '"') {
        char c = *s->p++;
        if (c == '\\') {
            if (s->p >= s->end) return 0;
            c = *s->p++;
            if (c == 'u') {
                unsigned x = 0;
                for (int i = 0; i < 4; i++, s->p++) {
                    if (s->p >= s->end) return 0;
                    char h = *s->p;
                    x = 16 * x + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                }
                if (x > 0x7f) return 0;
                c = (char)x;
            } else if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
            else if (c == 'r') c = '\r';
            else if (c == 'b') c = '\b';
            else if (c == 'f') c = '\f';
        }
        if (n + 1 >= cap) return 0;
        out[n++] = c;
    }
    if (!eat(s, '"')) return 0;
    out[n] = 0;
    return 1;
}

static int read_count(scan *s, long *x) {
    skip_ws(s);
    long v = 0;
    const char *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        if (v > (1L << 50)) return 0;
        v = 10 * v + (*s->p++ - '0');
    }
    *x = v;
    return s->p > start;
}

/* [a, b, ...] of at most max counts; returns how many, -1 on a syntax error. */
static int read_counts(scan *s, long *x, int max) {
    if (!eat(s, '[')) return -1;
    int n = 0;
    if (eat(s, ']')) return 0;
    do {
        long v;
        if (!read_count(s, &v) || n == max) return -1;
        x[n++] = v;
    } while (eat(s, ','));
    return eat(s, ']') ? n : -1;
}

typedef struct {
    char name[96], dtype[16];
    long shape[4], offsets[2];
    int dims, n_offsets;
} header_tensor;

typedef struct {
    header_tensor *t;
    int n, cap;
    char meta_key[32][32], meta_value[32][256];
    int n_meta;
} header;

static const char *meta(const header *h, const char *key) {
    for (int i = 0; i < h->n_meta; i++)
        if (!strcmp(h->meta_key[i], key)) return h->meta_value[i];
    return NULL;
}

/* The header's top-level object: "__metadata__" (string values) and tensors
 * {"dtype", "shape", "data_offsets"}. Returns 0 or -1 with the reason. */
static int parse_header(const char *json, size_t len, header *h, char *why, size_t whylen) {
    scan s = {json, json + len};
    memset(h, 0, sizeof *h);
    char key[96];
    if (!eat(&s, '{')) goto bad;
    if (eat(&s, '}')) goto done;
    do {
        if (!read_string(&s, key, sizeof key) || !eat(&s, ':')) goto bad;
        if (!strcmp(key, "__metadata__")) {
            if (!eat(&s, '{')) goto bad;
            if (eat(&s, '}')) continue;
            do {
                char k[32], v[256];
                if (!read_string(&s, k, sizeof k) || !eat(&s, ':') || !read_string(&s, v, sizeof v)) goto bad;
                if (h->n_meta < 32) {
                    snprintf(h->meta_key[h->n_meta], sizeof h->meta_key[0], "%s", k);
                    snprintf(h->meta_value[h->n_meta++], sizeof h->meta_value[0], "%s", v);
                }
            } while (eat(&s, ','));
            if (!eat(&s, '}')) goto bad;
            continue;
        }
        if (h->n == h->cap) {
            h->cap = h->cap ? 2 * h->cap : 64;
            h->t = realloc(h->t, (size_t)h->cap * sizeof *h->t);
            if (!h->t) die("out of host memory");
        }
        header_tensor *t = &h->t[h->n++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", key);
        if (!eat(&s, '{')) goto bad;
        do {
            char k[32];
            if (!read_string(&s, k, sizeof k) || !eat(&s, ':')) goto bad;
            if (!strcmp(k, "dtype")) {
                if (!read_string(&s, t->dtype, sizeof t->dtype)) goto bad;
            } else if (!strcmp(k, "shape")) {
                if ((t->dims = read_counts(&s, t->shape, 4)) < 0) goto bad;
            } else if (!strcmp(k, "data_offsets")) {
                if ((t->n_offsets = read_counts(&s, t->offsets, 2)) != 2) goto bad;
            } else {
                goto bad;
            }
        } while (eat(&s, ','));
        if (!eat(&s, '}')) goto bad;
    } while (eat(&s, ','));
    if (!eat(&s, '}')) goto bad;
done:
    skip_ws(&s);
    if (s.p == s.end) return 0;
bad:
    snprintf(why, whylen, "the header is not the JSON of a safetensors file (stops making sense at byte %ld of %zu)",
             (long)(s.p - json), len);
    free(h->t);
    h->t = NULL;
    return -1;
}

/* ---- checksum -------------------------------------------------------------------- */

static uint64_t fnv1a64(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* ---- reading and checking a file ---------------------------------------------------- */

typedef struct {
    int step;
    char lab[64];
    long params;  /* P */
    float *data;  /* [params | m | v], 3P floats (inside `file`) */
    char *file;   /* the whole file */
} ckpt_file;

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    int k = snprintf(err, errlen, "--resume %s: ", path);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < errlen) vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static long meta_long(const header *h, const char *key, int *ok) {
    const char *v = meta(h, key);
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end) *ok = 0;
    return x;
}

/* Reads path whole and checks it against the model the flags describe:
 * the header, the shapes, the size and the checksum. Nothing is kept on error. */
static int read_checkpoint(const char *path, const gpt_config *cfg, ckpt_file *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, errlen, path, "%s", strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return fail(err, errlen, path, "not a regular file");
    }
    size_t size = (size_t)st.st_size;
    char *file = malloc(size + 1);
    if (!file) { fclose(f); return fail(err, errlen, path, "out of host memory reading %zu bytes", size); }
    size_t got = fread(file, 1, size, f);
    int read_error = ferror(f);
    fclose(f);
    if (read_error || got != size) { free(file); return fail(err, errlen, path, "read error"); }

    int rc = -1;
    header h = {0};
    tensor_table tt = {0};
    if (size < 8) { fail(err, errlen, path, "truncated: %zu bytes, not even the 8-byte header length", size); goto out; }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (unsigned char)file[i];
    if (hlen > size - 8) {
        fail(err, errlen, path, "truncated or not a safetensors file: the header length says %llu bytes, %zu follow",
             (unsigned long long)hlen, size - 8);
        goto out;
    }
    char why[160];
    if (parse_header(file + 8, (size_t)hlen, &h, why, sizeof why) != 0) { fail(err, errlen, path, "%s", why); goto out; }
    const char *format = meta(&h, "format");
    if (!format || strcmp(format, FORMAT)) {
        fail(err, errlen, path, "not a parallel-labs checkpoint (__metadata__ format is %s%s%s, expected \"%s\")",
             format ? "\"" : "", format ? format : "missing", format ? "\"" : "", FORMAT);
        goto out;
    }
    /* the shape first: a mismatch names the flag, which is what the user can change */
    int ok = 1;
    struct { const char *key, *flag; long want; } shape[] = {
        {"vocab", "vocab", cfg->vocab}, {"layers", "--layers", cfg->layers}, {"d_model", "--d-model", cfg->d_model},
        {"heads", "--heads", cfg->heads}, {"seq", "--seq", cfg->seq}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) {
        long have = meta_long(&h, shape[i].key, &ok);
        if (!ok) { fail(err, errlen, path, "__metadata__ has no valid \"%s\"", shape[i].key); goto out; }
        if (have != shape[i].want) {
            fail(err, errlen, path, "the checkpoint has %s %ld, the flags say %s %ld (the model shapes must match)",
                 shape[i].flag, have, shape[i].flag, shape[i].want);
            goto out;
        }
    }
    long step = meta_long(&h, "step", &ok);
    if (!ok || step < 0 || step > 1000000000L) { fail(err, errlen, path, "__metadata__ has no valid \"step\""); goto out; }

    /* every tensor where this model puts it, nothing else */
    tensor_table_init(&tt, cfg);
    if (h.n != tt.n) { fail(err, errlen, path, "%d tensors, this model has %d", h.n, tt.n); goto out; }
    for (int i = 0; i < tt.n; i++) {
        const tensor_entry *e = &tt.t[i];
        const header_tensor *t = strcmp(h.t[i].name, e->name) ? NULL : &h.t[i];
        for (int j = 0; !t && j < h.n; j++)
            if (!strcmp(h.t[j].name, e->name)) t = &h.t[j];
        if (!t) { fail(err, errlen, path, "tensor %s is missing", e->name); goto out; }
        int vec = e->cols == 1;
        if (strcmp(t->dtype, "F32") || t->dims != (vec ? 1 : 2) || t->shape[0] != e->rows ||
            (!vec && t->shape[1] != e->cols)) {
            char want[48], got[96] = "";
            if (vec) snprintf(want, sizeof want, "[%ld]", e->rows);
            else snprintf(want, sizeof want, "[%ld, %ld]", e->rows, e->cols);
            for (int d = 0; d < t->dims; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%ld", d ? ", " : "", t->shape[d]);
            fail(err, errlen, path, "tensor %s is %s [%s], expected F32 %s", e->name, t->dtype, got, want);
            goto out;
        }
        long b = 4 * e->offset, n = 4 * e->rows * e->cols;
        if (t->offsets[0] != b || t->offsets[1] != b + n) {
            fail(err, errlen, path, "tensor %s is at bytes [%ld, %ld) of the data, expected [%ld, %ld)", e->name,
                 t->offsets[0], t->offsets[1], b, b + n);
            goto out;
        }
    }
    size_t data_bytes = 3 * (size_t)tt.params * sizeof(float), have = size - 8 - (size_t)hlen;
    if (have != data_bytes) {
        fail(err, errlen, path, "%s: %zu bytes of tensor data, the header describes %zu",
             have < data_bytes ? "truncated" : "trailing bytes", have, data_bytes);
        goto out;
    }
    const char *sum = meta(&h, "checksum");
    char computed[40];
    snprintf(computed, sizeof computed, "fnv1a64:%016llx",
             (unsigned long long)fnv1a64(file + 8 + hlen, data_bytes));
    if (!sum || strcmp(sum, computed)) {
        fail(err, errlen, path, "checksum mismatch, the data is corrupted (header says %s, the data gives %s)",
             sum ? sum : "nothing", computed);
        goto out;
    }
    /* the data starts at 8 + hlen, which need not be 4-aligned for another writer */
    if ((8 + hlen) % sizeof(float)) {
        memmove(file, file + 8 + hlen, data_bytes);
        out->data = (float *)file;
    } else {
        out->data = (float *)(file + 8 + hlen);
    }
    out->file = file;
    out->step = (int)step;
    out->params = tt.params;
    snprintf(out->lab, sizeof out->lab, "%s", meta(&h, "lab") ? meta(&h, "lab") : "?");
    rc = 0;
out:
    free(h.t);
    tensor_table_free(&tt);
    if (rc) free(file);
    return rc;
}

int ckpt_check_flags(const run_ctx *ctx, char *err, size_t errlen) {
    const run_options *o = &ctx->opt;
    if (o->resume) {
        ckpt_file f;
        if (read_checkpoint(o->resume, &ctx->model, &f, err, errlen) != 0) return -1;
        free(f.file);
    }
    if (o->save) {
        /* the folder must take the temporary file and the rename; nothing is created yet */
        char dir[512];
        snprintf(dir, sizeof dir, "%s", o->save);
        char *slash = strrchr(dir, '/');
        if (slash == dir) dir[1] = 0;
        else if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        struct stat st;
        if (stat(o->save, &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "--save %s: is a folder, give a file name", o->save);
            return -1;
        }
        if (access(dir, W_OK) != 0) {
            snprintf(err, errlen, "--save %s: cannot write in %s: %s", o->save, dir, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* ---- resume: every rank takes its slice --------------------------------------------- */

/* Copy the global elements the map lists into the device buffer; elements no
 * run covers (ZeRO's padding) keep what they held. */
static void load_slice(float *dev, long len, const ckpt_map *m, const float *global, long P) {
    if (len <= 0) return;
    float *host = malloc((size_t)len * sizeof(float));
    if (!host) die("out of host memory loading a checkpoint");
    mem_to_host(host, dev, (size_t)len * sizeof(float));
    for (int i = 0; i < m->n; i++) {
        const ckpt_run *r = &m->runs[i];
        if (r->global + r->n > P) die("checkpoint view: global run [%ld, %ld) beyond the model's %ld", r->global,
                                      r->global + r->n, P);
        memcpy(host + r->local, global + r->global, (size_t)r->n * sizeof(float));
    }
    mem_to_device(dev, host, (size_t)len * sizeof(float));
    free(host);
}

int ckpt_resume(run_ctx *ctx, ckpt_view *v) {
    v->first_step = 0;
    if (!ctx->opt.resume) return 0;
    ckpt_file f;
    char err[600];
    if (read_checkpoint(ctx->opt.resume, &ctx->model, &f, err, sizeof err) != 0) die("%s", err);
    long P = f.params;
    load_slice(v->params, v->params_len, &v->params_at, f.data, P);
    load_slice(v->adam_m, v->moments_len, &v->moments_at, f.data + P, P);
    load_slice(v->adam_v, v->moments_len, &v->moments_at, f.data + 2 * P, P);
    free(f.file);
    v->first_step = f.step;
    if (ctx->rank == 0) {
        printf("resumed from %s: %d steps done (saved by %s); running steps %d-%d\n", ctx->opt.resume, f.step,
               f.lab, f.step + 1, f.step + ctx->opt.steps);
        fflush(stdout);
    }
    return f.step;
}

/* ---- save: gather to rank 0, write atomically ------------------------------------------ */

/* Every rank's runs of one map, so each can tell which of its elements a lower
 * rank saves already: an element goes into the file from the LOWEST rank that
 * holds it (replicas are identical; this sends each element once). */
typedef struct { ckpt_run *runs; int *count, *first; } all_runs;

static void allgather_runs(const ckpt_map *m, int size, all_runs *a) {
    _Static_assert(sizeof(ckpt_run) == 3 * sizeof(long), "ckpt_run travels as 3 longs");
    a->count = malloc(sizeof(int) * (size_t)size);
    a->first = malloc(sizeof(int) * (size_t)size);
    int *longs = malloc(sizeof(int) * (size_t)size), *displs = malloc(sizeof(int) * (size_t)size);
    if (!a->count || !a->first || !longs || !displs) die("out of host memory");
    int mine = 3 * m->n, total = 0;
    MPI_Allgather(&mine, 1, MPI_INT, longs, 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) {
        displs[r] = total;
        a->count[r] = longs[r] / 3;
        a->first[r] = total / 3;
        total += longs[r];
    }
    a->runs = malloc(sizeof(long) * (size_t)(total + 1));
    if (!a->runs) die("out of host memory");
    MPI_Allgatherv(m->runs, mine, MPI_LONG, a->runs, longs, displs, MPI_LONG, MPI_COMM_WORLD);
    free(longs);
    free(displs);
}

static void all_runs_free(all_runs *a) {
    free(a->runs);
    free(a->count);
    free(a->first);
}

/* The local indices of the elements this rank must send: those of its runs
 * that no lower rank holds. Returns how many; *sel is malloc'd. */
static long select_mine(const all_runs *a, int rank, long P, long **sel) {
    unsigned char *covered = calloc((size_t)P + 1, 1);
    long held = 0;
    for (int i = 0; i < a->count[rank]; i++) held += a->runs[a->first[rank] + i].n;
    *sel = malloc(sizeof(long) * (size_t)(held + 1));
    if (!covered || !*sel) die("out of host memory");
    for (int q = 0; q < rank; q++)
        for (int i = 0; i < a->count[q]; i++) {
            const ckpt_run *r = &a->runs[a->first[q] + i];
            memset(covered + r->global, 1, (size_t)r->n);
        }
    long k = 0;
    for (int i = 0; i < a->count[rank]; i++) {
        const ckpt_run *r = &a->runs[a->first[rank] + i];
        if (r->global + r->n > P) die("checkpoint view: global run [%ld, %ld) beyond the model's %ld", r->global,
                                      r->global + r->n, P);
        for (long j = 0; j < r->n; j++)
            if (!covered[r->global + j]) {
                covered[r->global + j] = 1;
                (*sel)[k++] = r->local + j;
            }
    }
    free(covered);
    return k;
}

/* Rank 0: put every rank's packed elements where they belong, replaying the
 * same lowest-rank-wins walk the senders made. sections: 1 (params) or 2 (m, v). */
static void unpack(const all_runs *a, int size, long P, const float *recv, const int *displs,
                   const long *counts, int sections, float *const *full, const char *what) {
    unsigned char *covered = calloc((size_t)P + 1, 1);
    if (!covered) die("out of host memory");
    long filled = 0;
    for (int q = 0; q < size; q++) {
        long k = 0;
        for (int i = 0; i < a->count[q]; i++) {
            const ckpt_run *r = &a->runs[a->first[q] + i];
            for (long j = 0; j < r->n; j++) {
                long g = r->global + j;
                if (covered[g]) continue;
                covered[g] = 1;
                for (int s = 0; s < sections; s++) full[s][g] = recv[displs[q] + s * counts[q] + k];
                k++;
            }
        }
        filled += k;
    }
    free(covered);
    if (filled != P) die("checkpoint: the ranks hold %ld of the %ld %s elements (a lab's view misses some)",
                         filled, P, what);
}

static void write_file(const char *path, const textbuf *header, const float *data, size_t data_bytes) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) die("fopen(%s) for the checkpoint: %s", tmp, strerror(errno));
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(header->len >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(header->s, 1, header->len, f) != header->len ||
        fwrite(data, 1, data_bytes, f) != data_bytes || fflush(f) != 0) {
        int e = errno;
        fclose(f);
        unlink(tmp);
        die("fwrite(%s) of the checkpoint: %s", tmp, strerror(e));
    }
    /* on disk before the rename: a crash leaves the old file or the new one, never half of one */
    if (fsync(fileno(f)) != 0) { int e = errno; fclose(f); unlink(tmp); die("fsync(%s): %s", tmp, strerror(e)); }
    if (fclose(f) != 0) { int e = errno; unlink(tmp); die("fclose(%s): %s", tmp, strerror(e)); }
    if (rename(tmp, path) != 0) { int e = errno; unlink(tmp); die("rename(%s, %s): %s", tmp, path, strerror(e)); }
    /* and the rename itself on disk */
    char dir[600];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        fsync(fd); /* best effort: some file systems refuse fsync on a folder */
        close(fd);
    }
}

static textbuf make_header(const run_ctx *ctx, int step, const tensor_table *tt, uint64_t checksum) {
    const run_options *o = &ctx->opt;
    const adamw_config *a = &ctx->adamw;
    textbuf b = {0};
    textbuf_printf(&b, "{\"__metadata__\":{\"format\":\"%s\",\"step\":\"%d\",\"vocab\":\"%d\",\"layers\":\"%d\","
            "\"d_model\":\"%d\",\"heads\":\"%d\",\"seq\":\"%d\",\"batch\":\"%d\",\"seed\":\"%d\",\"lr\":\"%.9g\","
            "\"weight_decay\":\"%.9g\",\"clip\":\"%.9g\",\"beta1\":\"%g\",\"beta2\":\"%g\",\"eps\":\"%g\","
            "\"lab\":",
        FORMAT, step, ctx->model.vocab, o->layers, o->d_model, o->heads, o->seq, o->batch, o->seed, o->lr,
        o->weight_decay, o->clip, a->beta1, a->beta2, a->eps);
    textbuf_json_string(&b, ctx->lab.name);
    textbuf_printf(&b, ",\"ranks\":\"%d\",\"data\":", ctx->size);
    textbuf_json_string(&b, ctx->data.source);
    textbuf_printf(&b, ",\"checksum\":\"fnv1a64:%016llx\"}", (unsigned long long)checksum);
    for (int i = 0; i < tt->n; i++) {
        const tensor_entry *e = &tt->t[i];
        long begin = 4 * e->offset, end = begin + 4 * e->rows * e->cols;
        if (e->cols == 1)
            textbuf_printf(&b, ",\n\"%s\":{\"dtype\":\"F32\",\"shape\":[%ld],\"data_offsets\":[%ld,%ld]}", e->name, e->rows,
                begin, end);
        else
            textbuf_printf(&b, ",\n\"%s\":{\"dtype\":\"F32\",\"shape\":[%ld,%ld],\"data_offsets\":[%ld,%ld]}", e->name,
                e->rows, e->cols, begin, end);
    }
    textbuf_printf(&b, "}");
    /* pad with spaces so the data starts 8-byte aligned, as safetensors writers do */
    while ((8 + b.len) % 8) textbuf_printf(&b, " ");
    return b;
}

static float *host_copy(const float *dev, long n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!h) die("out of host memory saving a checkpoint");
    if (n > 0) mem_to_host(h, dev, (size_t)n * sizeof(float));
    return h;
}

void ckpt_save(run_ctx *ctx, ckpt_view *v, const char *path, int step) {
    double t0 = now_seconds();
    int rank = ctx->rank, size = ctx->size;
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    const long P = g.total;

    /* what this rank sends: its params no lower rank holds, then m and v likewise */
    all_runs pa, ma;
    allgather_runs(&v->params_at, size, &pa);
    allgather_runs(&v->moments_at, size, &ma);
    long *psel, *msel;
    long np = select_mine(&pa, rank, P, &psel), nm = select_mine(&ma, rank, P, &msel);
    float *hp = host_copy(v->params, v->params_len), *hm = host_copy(v->adam_m, v->moments_len),
          *hv = host_copy(v->adam_v, v->moments_len);
    float *send = malloc(sizeof(float) * (size_t)(np + 2 * nm + 1));
    if (!send) die("out of host memory");
    for (long k = 0; k < np; k++) send[k] = hp[psel[k]];
    for (long k = 0; k < nm; k++) {
        send[np + k] = hm[msel[k]];
        send[np + nm + k] = hv[msel[k]];
    }
    free(hp); free(hm); free(hv); free(psel); free(msel);

    long mine[2] = {np, nm}, *counts = rank == 0 ? malloc(sizeof(long) * 2 * (size_t)size) : NULL;
    MPI_Gather(mine, 2, MPI_LONG, counts, 2, MPI_LONG, 0, MPI_COMM_WORLD);
    int *recv_counts = NULL, *displs = NULL;
    float *recv = NULL, *data = NULL;
    if (rank == 0) {
        recv_counts = malloc(sizeof(int) * (size_t)size);
        displs = malloc(sizeof(int) * (size_t)size);
        long total = 0;
        for (int q = 0; q < size; q++) {
            long n = counts[2 * q] + 2 * counts[2 * q + 1];
            if (total + n > 0x7fffffffL) die("checkpoint: the model is too large for one MPI_Gatherv");
            recv_counts[q] = (int)n;
            displs[q] = (int)total;
            total += n;
        }
        recv = malloc(sizeof(float) * (size_t)(total + 1));
        data = malloc(sizeof(float) * 3 * (size_t)P);
        if (!recv_counts || !displs || !recv || !data) die("out of host memory");
    }
    MPI_Gatherv(send, (int)(np + 2 * nm), MPI_FLOAT, recv, recv_counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
    free(send);

    if (rank == 0) {
        /* one displacement table per section: a rank's params, then its m, then its v */
        long *pc = malloc(sizeof(long) * (size_t)size), *mc = malloc(sizeof(long) * (size_t)size);
        int *mdispls = malloc(sizeof(int) * (size_t)size);
        for (int q = 0; q < size; q++) {
            pc[q] = counts[2 * q];
            mc[q] = counts[2 * q + 1];
            mdispls[q] = displs[q] + (int)pc[q];
        }
        float *params_full[1] = {data}, *moments_full[2] = {data + P, data + 2 * P};
        unpack(&pa, size, P, recv, displs, pc, 1, params_full, "parameter");
        unpack(&ma, size, P, recv, mdispls, mc, 2, moments_full, "AdamW moment");
        free(pc); free(mc); free(mdispls);

        size_t data_bytes = 3 * (size_t)P * sizeof(float);
        tensor_table tt;
        tensor_table_init(&tt, &ctx->model);
        textbuf header = make_header(ctx, step, &tt, fnv1a64(data, data_bytes));
        write_file(path, &header, data, data_bytes);
        tensor_table_free(&tt);
        char mb[16];
        printf("checkpoint: %d steps saved to %s (%sB, %.0f ms)\n", step, path,
               human((double)(8 + header.len + data_bytes), mb), 1e3 * (now_seconds() - t0));
        fflush(stdout);
        free(header.s);
    }
    free(counts); free(recv_counts); free(displs); free(recv); free(data);
    all_runs_free(&pa);
    all_runs_free(&ma);
}

void ckpt_step_done(run_ctx *ctx, ckpt_view *v, int steps_done) {
    const run_options *o = &ctx->opt;
    if (!o->save) return;
    int last = steps_done == v->first_step + o->steps;
    if (last || (o->save_every > 0 && steps_done % o->save_every == 0)) ckpt_save(ctx, v, o->save, steps_done);
}

/* ---- --eval --------------------------------------------------------------------------- */

void ckpt_print_eval(const run_ctx *ctx, double eval_loss) {
    dataset heldout;
    int batches = data_heldout(&ctx->data, ctx->opt.batch, ctx->opt.seq, &heldout);
    if (ctx->rank != 0) return;
    printf("eval: loss %.4f on held-out data never trained on (%d batches of %d x %d tokens from the last %ld bytes)\n",
           eval_loss, batches, ctx->opt.batch, ctx->opt.seq, heldout.n);
    fflush(stdout);
}

/* ---- the record ---------------------------------------------------------------------- */

char *ckpt_record_json(const run_ctx *ctx, const ckpt_view *v, double eval_loss, const char *lab_extra) {
    const run_options *o = &ctx->opt;
    textbuf b = {0};
    textbuf_printf(&b, "%s%s\"first_step\":%d,\"resumed_from\":", lab_extra ? lab_extra : "",
        lab_extra && lab_extra[0] ? "," : "", v->first_step);
    if (o->resume) textbuf_json_string(&b, o->resume);
    else textbuf_printf(&b, "null");
    textbuf_printf(&b, ",\"saved_to\":");
    if (o->save) textbuf_json_string(&b, o->save);
    else textbuf_printf(&b, "null");
    if (eval_loss >= 0) textbuf_printf(&b, ",\"eval_loss\":%.17g", eval_loss);
    else textbuf_printf(&b, ",\"eval_loss\":null");
    return b.s;
}
