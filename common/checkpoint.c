#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"
#include "device.h"
#include "jsonval.h"
#include "mem.h"
#include "paths.h"
#include "sample.h"
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

/* ---- the header: metadata and checksum ------------------------------------------------ */

/* Format 2 (the one written): the checksum covers the metadata as well as the
 * data, so a changed step, shape or hyper-parameter is refused like a flipped
 * weight bit. Format 1 files (a checksum of the data alone) are still read. */
#define FORMAT "parallel-labs-checkpoint-2"
#define FORMAT_1 "parallel-labs-checkpoint-1"
/* The largest header read, as safetensors' own readers (100 MB): beyond it the
 * 8 bytes in front cannot be a header length. */
#define HEADER_MAX_BYTES (100LL << 20)

static int by_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Format 2's checksum, FNV-1a 64: every member of __metadata__ but "checksum",
 * in the byte order of the keys, as the key, a 0 byte, the value, a 0 byte;
 * then the data. Any reader recomputes it from the parsed header (values are
 * strings). */
static uint64_t checksum_v2(json_t *metadata, const void *data, size_t data_bytes) {
    const char **keys = malloc((json_object_size(metadata) + 1) * sizeof *keys), *key;
    if (!keys) die("out of host memory");
    size_t n = 0;
    json_t *value;
    json_object_foreach(metadata, key, value)
        if (strcmp(key, "checksum")) keys[n++] = key;
    qsort(keys, n, sizeof *keys, by_key);
    uint64_t h = FNV1A64_INIT;
    for (size_t i = 0; i < n; i++) {
        value = json_object_get(metadata, keys[i]);
        h = fnv1a64(h, keys[i], strlen(keys[i]) + 1); /* with its terminating 0 */
        h = fnv1a64(h, json_string_value(value), json_string_length(value));
        h = fnv1a64(h, "", 1);
    }
    free(keys);
    return fnv1a64(h, data, data_bytes);
}

/* ---- reading and checking a file ---------------------------------------------------- */

typedef struct {
    int step, format; /* format 1 or 2 */
    char lab[64];
    long params;      /* P */
    float *data;      /* [params | m | v], 3P floats, malloc'd */
    char routing_changed[320]; /* the experts' flags that differ from the file's, "" if none (or not recorded) */
    float *route_bias;         /* --balance bias: the file's [L][E] routing bias, malloc'd; NULL otherwise */
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

static const char *meta(json_t *metadata, const char *key) {
    return json_string_value(json_object_get(metadata, key));
}

static long meta_long(json_t *metadata, const char *key, int *ok) {
    const char *v = meta(metadata, key);
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || errno) *ok = 0;
    return x;
}

/* What the experts' routing flags change against the file's (top-k, capacity
 * factor and scope, aux coefficient, node-limited routing's groups, the bias's
 * speed), as "--top-k 2 -> 1, ..." in buf ("" if nothing, or a dense model).
 * A key the file lacks is compared as `absent`: a file without the groups'
 * keys routed over every expert (0); one without bias_speed had no bias to
 * move (not compared: another --balance is refused, check_routing). */
static void describe_routing_change(json_t *metadata, const gpt_config *cfg, double bias_speed, char *buf,
                                    size_t len) {
    buf[0] = 0;
    if (cfg->experts <= 0) return;
    struct { const char *key, *flag, *absent; char now[32]; } f[7] = {
        {"top_k", "--top-k", NULL, ""}, {"capacity_factor", "--capacity-factor", NULL, ""},
        {"capacity_scope", "--capacity-scope", NULL, ""}, {"aux_loss_coef", "--aux-loss-coef", NULL, ""},
        {"route_groups", "--route-groups", "0", ""}, {"route_max_groups", "--route-max-groups", "0", ""},
        {"bias_speed", "--bias-speed", NULL, ""}};
    snprintf(f[0].now, sizeof f[0].now, "%d", cfg->top_k);
    snprintf(f[1].now, sizeof f[1].now, "%.15g", cfg->capacity_factor); /* the decimal the flag gave */
    snprintf(f[2].now, sizeof f[2].now, "%s", cfg->capacity_per_rank ? "rank" : "sequence");
    snprintf(f[3].now, sizeof f[3].now, "%g", cfg->aux_coef); /* a float: 0.01, not 0.00999999978 */
    snprintf(f[4].now, sizeof f[4].now, "%d", cfg->route_groups);
    snprintf(f[5].now, sizeof f[5].now, "%d", cfg->route_max_groups);
    snprintf(f[6].now, sizeof f[6].now, "%.9g", bias_speed); /* as make_header writes it */
    size_t at = 0;
    for (int i = 0; i < 7 && at < len; i++) {
        const char *was = meta(metadata, f[i].key) ? meta(metadata, f[i].key) : f[i].absent;
        if (!was || !strcmp(was, f[i].now)) continue;
        int k = snprintf(buf + at, len - at, "%s%s %s -> %s", at ? ", " : "", f[i].flag, was, f[i].now);
        at += k > 0 ? (size_t)k : 0;
    }
}

/* --router and --balance (moe.h) change what the weights mean (scores of
 * another function, a router trained with or without an aux term) and the
 * bias is training state: a file is resumed with its own, or refused. A file
 * without the keys was written with softmax and the aux loss. With bias, the
 * file's bias ("route_bias": L x E values, %.9g: exact floats) into out. */
static int check_routing(json_t *metadata, const gpt_config *cfg, ckpt_file *out, const char *path, char *err,
                         size_t errlen) {
    const char *router = meta(metadata, "router") ? meta(metadata, "router") : "softmax";
    const char *balance = meta(metadata, "balance") ? meta(metadata, "balance") : "aux";
    const char *want_router = cfg->router_sigmoid ? "sigmoid" : "softmax", *want_balance = cfg->route_bias ? "bias" : "aux";
    if (strcmp(router, want_router) || strcmp(balance, want_balance))
        return fail(err, errlen, path, "the checkpoint was trained with --router %s --balance %s, the flags say "
                    "--router %s --balance %s (give the file's)", router, balance, want_router, want_balance);
    if (!cfg->route_bias) return 0;
    const long n = (long)cfg->layers * cfg->experts;
    const char *text = meta(metadata, "route_bias");
    if (!text) return fail(err, errlen, path, "__metadata__ has --balance bias but no \"route_bias\"");
    out->route_bias = malloc((size_t)n * sizeof(float));
    if (!out->route_bias) return fail(err, errlen, path, "out of host memory");
    for (long i = 0; i < n; i++) {
        char *end;
        out->route_bias[i] = strtof(text, &end);
        if (end == text || *end != (i + 1 < n ? ',' : 0))
            return fail(err, errlen, path, "__metadata__ \"route_bias\" is not %ld numbers (--layers x --experts)", n);
        text = end + (i + 1 < n);
    }
    return 0;
}

/* A JSON value as short text for a message ("missing" for none). */
static void json_brief(json_t *v, char *buf, size_t len) {
    char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    snprintf(buf, len, "%s", s ? s : "missing");
    free(s);
}

/* A tensor's entry must be {"dtype": "F32", "shape": [rows(, cols)],
 * "data_offsets": [begin, end]} where this model puts it, and nothing else. */
static int check_tensor(json_t *t, const tensor_entry *e, const char *path, char *err, size_t errlen) {
    if (!json_is_object(t)) return fail(err, errlen, path, "tensor %s: its entry is not a JSON object", e->name);
    const char *key;
    json_t *value;
    json_object_foreach(t, key, value)
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return fail(err, errlen, path, "tensor %s has an unknown member \"%s\"", e->name, key);
    const char *dtype = json_string_value(json_object_get(t, "dtype"));
    json_t *shape = json_object_get(t, "shape"), *offsets = json_object_get(t, "data_offsets");
    const int vec = e->cols == 1;
    const long long want[2] = {e->rows, e->cols}, begin = 4LL * e->offset, end = begin + 4LL * e->rows * e->cols;
    int ok = dtype && !strcmp(dtype, "F32") && json_is_array(shape) && json_array_size(shape) == (vec ? 1u : 2u);
    for (size_t d = 0; ok && d < json_array_size(shape); d++)
        ok = json_is_integer(json_array_get(shape, d)) && json_integer_value(json_array_get(shape, d)) == want[d];
    char got[96];
    if (!ok) {
        char wanted[48];
        if (vec) snprintf(wanted, sizeof wanted, "[%ld]", e->rows);
        else snprintf(wanted, sizeof wanted, "[%ld,%ld]", e->rows, e->cols);
        json_brief(shape, got, sizeof got);
        return fail(err, errlen, path, "tensor %s is %s %s, expected F32 %s", e->name, dtype ? dtype : "of no dtype",
                    got, wanted);
    }
    json_t *b = json_array_get(offsets, 0), *z = json_array_get(offsets, 1);
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || !json_is_integer(b) || !json_is_integer(z) ||
        json_integer_value(b) != begin || json_integer_value(z) != end) {
        json_brief(offsets, got, sizeof got);
        return fail(err, errlen, path, "tensor %s is at bytes %s of the data, expected [%lld,%lld]", e->name, got,
                    begin, end);
    }
    return 0;
}

/* Reads path and checks it against the model the flags describe: the 8-byte
 * length and the header first, so a file that is no checkpoint is refused
 * before its data is read; then the data and the checksum. Nothing is kept on
 * error. bias_speed: the run's --bias-speed, compared with the file's. */
static int read_checkpoint(const char *path, const gpt_config *cfg, double bias_speed, ckpt_file *out, char *err,
                           size_t errlen) {
    memset(out, 0, sizeof *out);
    long long size;
    int fd = path_open_input("--resume", path, -1, &size, err, errlen);
    if (fd < 0) return -1;
    int rc = -1;
    char *text = NULL;
    json_t *root = NULL;
    tensor_table tt = {0};
    float *data = NULL;
    unsigned char len8[8];
    if (size < 8) { fail(err, errlen, path, "truncated: %lld bytes, not even the 8-byte header length", size); goto out; }
    if (path_read_exact(fd, len8, 8)) { fail(err, errlen, path, "read error: %s", strerror(errno)); goto out; }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen > (uint64_t)size - 8) {
        fail(err, errlen, path, "truncated or not a safetensors file: the header length says %llu bytes, %lld follow",
             (unsigned long long)hlen, size - 8);
        goto out;
    }
    if (hlen > (uint64_t)HEADER_MAX_BYTES) {
        fail(err, errlen, path, "not a safetensors file: the header length says %llu bytes, more than the %lld "
             "a reader accepts", (unsigned long long)hlen, HEADER_MAX_BYTES);
        goto out;
    }
    text = malloc((size_t)hlen + 1);
    if (!text) { fail(err, errlen, path, "out of host memory for a %llu-byte header", (unsigned long long)hlen); goto out; }
    if (path_read_exact(fd, text, (size_t)hlen)) { fail(err, errlen, path, "read error: %s", strerror(errno)); goto out; }
    json_error_t je;
    root = json_loadb(text, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        if (root) fail(err, errlen, path, "the header is JSON but not an object: not a safetensors file");
        else fail(err, errlen, path, "the header is not valid JSON (%s, at byte %d of %llu): not a safetensors file",
                  je.text, je.position, (unsigned long long)hlen);
        goto out;
    }
    json_t *metadata = json_object_get(root, "__metadata__");
    const char *format = meta(metadata, "format");
    out->format = !format ? 0 : !strcmp(format, FORMAT) ? 2 : !strcmp(format, FORMAT_1) ? 1 : 0;
    if (!out->format) {
        fail(err, errlen, path, "not a parallel-labs checkpoint (__metadata__ format is %s%s%s, expected \"%s\")",
             format ? "\"" : "", format ? format : "missing", format ? "\"" : "", FORMAT);
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(metadata, key, value)
        if (!json_is_string(value)) { fail(err, errlen, path, "__metadata__ \"%s\" is not a string", key); goto out; }
    /* the shape first: a mismatch names the flag, which is what the user can change */
    int ok = 1;
    struct { const char *key, *flag; long want; } shape[] = {
        {"vocab", "vocab", cfg->vocab}, {"layers", "--layers", cfg->layers}, {"d_model", "--d-model", cfg->d_model},
        {"heads", "--heads", cfg->heads}, {"seq", "--seq", cfg->seq}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) {
        long have = meta_long(metadata, shape[i].key, &ok);
        if (!ok) { fail(err, errlen, path, "__metadata__ has no valid \"%s\"", shape[i].key); goto out; }
        if (have != shape[i].want) {
            fail(err, errlen, path, "the checkpoint has %s %ld, the flags say %s %ld (the model shapes must match)",
                 shape[i].flag, have, shape[i].flag, shape[i].want);
            goto out;
        }
    }
    long step = meta_long(metadata, "step", &ok);
    if (!ok || step < 0 || step > 1000000000L) { fail(err, errlen, path, "__metadata__ has no valid \"step\""); goto out; }
    /* the experts: their number is a shape (a file written before they were recorded has none: the
     * tensors below still tell), the routing is not, so a change is said, not refused */
    if (meta(metadata, "experts")) {
        long experts = meta_long(metadata, "experts", &ok);
        if (!ok) { fail(err, errlen, path, "__metadata__ has no valid \"experts\""); goto out; }
        if (experts != cfg->experts) {
            fail(err, errlen, path, "the checkpoint has --experts %ld, the flags say --experts %d (the model shapes "
                 "must match)", experts, cfg->experts);
            goto out;
        }
        /* the experts' other shapes (absent: 0, the dense MLP's width, no shared experts) */
        const struct { const char *key, *flag; int want; } shapes[] = {
            {"expert_width", "--expert-width", cfg->expert_width}, {"shared_experts", "--shared-experts", cfg->shared_experts}};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const long got = meta(metadata, shapes[i].key) ? meta_long(metadata, shapes[i].key, &ok) : 0;
            if (!ok) { fail(err, errlen, path, "__metadata__ has no valid \"%s\"", shapes[i].key); goto out; }
            if (got != shapes[i].want) {
                fail(err, errlen, path, "the checkpoint has %s %ld, the flags say %s %d (the model shapes must match)",
                     shapes[i].flag, got, shapes[i].flag, shapes[i].want);
                goto out;
            }
        }
        describe_routing_change(metadata, cfg, bias_speed, out->routing_changed, sizeof out->routing_changed);
    } else {
        out->routing_changed[0] = 0;
    }
    if (cfg->experts > 0 && check_routing(metadata, cfg, out, path, err, errlen)) goto out;

    /* every tensor where this model puts it, nothing else */
    tensor_table_init(&tt, cfg);
    size_t tensors = json_object_size(root) - (metadata != NULL);
    if (tensors != (size_t)tt.n) { fail(err, errlen, path, "%zu tensors, this model has %d", tensors, tt.n); goto out; }
    for (int i = 0; i < tt.n; i++) {
        json_t *t = json_object_get(root, tt.t[i].name);
        if (!t) { fail(err, errlen, path, "tensor %s is missing", tt.t[i].name); goto out; }
        if (check_tensor(t, &tt.t[i], path, err, errlen)) goto out;
    }
    size_t data_bytes = 3 * (size_t)tt.params * sizeof(float), have = (size_t)size - 8 - (size_t)hlen;
    if (have != data_bytes) {
        fail(err, errlen, path, "%s: %zu bytes of tensor data, the header describes %zu",
             have < data_bytes ? "truncated" : "trailing bytes", have, data_bytes);
        goto out;
    }
    data = malloc(data_bytes);
    if (!data) { fail(err, errlen, path, "out of host memory for %zu bytes of tensors", data_bytes); goto out; }
    if (path_read_exact(fd, data, data_bytes)) {
        fail(err, errlen, path, "read error: %s", errno ? strerror(errno) : "the file shrank while being read");
        goto out;
    }
    const char *sum = meta(metadata, "checksum");
    char computed[40];
    snprintf(computed, sizeof computed, "fnv1a64:%016llx", (unsigned long long)(out->format == 2
             ? checksum_v2(metadata, data, data_bytes) : fnv1a64(FNV1A64_INIT, data, data_bytes)));
    if (!sum || strcmp(sum, computed)) {
        fail(err, errlen, path, "checksum mismatch, the file was changed or corrupted (the header says %s, the %s "
             "give %s)", sum ? sum : "nothing", out->format == 2 ? "metadata and data" : "data", computed);
        goto out;
    }
    out->data = data;
    out->step = (int)step;
    out->params = tt.params;
    snprintf(out->lab, sizeof out->lab, "%s", meta(metadata, "lab") ? meta(metadata, "lab") : "?");
    rc = 0;
out:
    close(fd);
    free(text);
    json_decref(root);
    tensor_table_free(&tt);
    if (rc) {
        free(data);
        free(out->route_bias);
        out->route_bias = NULL;
    }
    return rc;
}

int ckpt_check_flags(const run_ctx *ctx, char *err, size_t errlen) {
    if (!ctx->opt.resume) return 0;
    ckpt_file f;
    if (read_checkpoint(ctx->opt.resume, &ctx->model, ctx->opt.bias_speed, &f, err, errlen) != 0) return -1;
    free(f.data);
    free(f.route_bias);
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
    if (!ctx->opt.resume) {
        if (ctx->opt.sample > 0) sample_print(ctx, v, 0); /* what the initial weights write */
        return 0;
    }
    ckpt_file f;
    char err[sizeof ctx->error];
    if (read_checkpoint(ctx->opt.resume, &ctx->model, ctx->opt.bias_speed, &f, err, sizeof err) != 0) die("%s", err);
    long P = f.params;
    load_slice(v->params, v->params_len, &v->params_at, f.data, P);
    load_slice(v->adam_m, v->moments_len, &v->moments_at, f.data + P, P);
    load_slice(v->adam_v, v->moments_len, &v->moments_at, f.data + 2 * P, P);
    free(f.data);
    if (f.route_bias) /* --balance bias: the bias goes on from the file's, exactly */
        memcpy(ctx->route_bias, f.route_bias, sizeof(float) * (size_t)ctx->model.layers * ctx->model.experts);
    free(f.route_bias);
    v->first_step = f.step;
    if (ctx->rank == 0) {
        printf("resumed from %s: %d steps done (saved by %s%s); running steps %d-%d\n", ctx->opt.resume, f.step,
               f.lab, f.format == 1 ? ", format 1: its checksum covers the data only" : "", f.step + 1,
               f.step + ctx->opt.steps);
        if (f.routing_changed[0])
            printf("resumed with other routing than the checkpoint's: %s (the weights fit; the router trains on with "
                   "these)\n", f.routing_changed);
        fflush(stdout);
    }
    if (ctx->opt.sample > 0) sample_print(ctx, v, f.step);
    return f.step;
}

/* ---- save: gather to rank 0, write atomically ------------------------------------------ */

/* Temporary file, fsync, rename: a crash leaves the old file or the new one,
 * never half of one. The data goes to a file without a name, which the
 * kernel frees when the process dies in any way (path_create_for_rename: a
 * SIGTERM or Ctrl-C to mpirun ends a rank mid-write with SIGKILL); only when it
 * is on disk does it get the temporary name (path_temp_name), for the rename.
 * A named temporary is removed on every error and on SIGINT/SIGTERM, and a
 * save removes the temporaries of earlier saves that were killed. */
static void write_file(const char *path, const char *header, size_t header_len, const float *data,
                       size_t data_bytes) {
    path_remove_stale_temps(path);
    char *tmp = path_temp_name(path);
    path_remove_on_signal(tmp);
    int named, fd = path_create_for_rename(path, tmp, &named);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0) close(fd);
        if (named) unlink(tmp);
        die("open(%s%s) for the checkpoint: %s", named ? tmp : path, named ? "" : "'s folder, O_TMPFILE", strerror(e));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header_len >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(header, 1, header_len, f) != header_len ||
        fwrite(data, 1, data_bytes, f) != data_bytes || fflush(f) != 0) {
        int e = errno;
        fclose(f);
        unlink(tmp);
        die("fwrite(%s) of the checkpoint: %s", tmp, strerror(e));
    }
    if (fsync(fileno(f)) != 0) { int e = errno; fclose(f); unlink(tmp); die("fsync(%s): %s", tmp, strerror(e)); }
    if (path_name_for_rename(fileno(f), tmp, named) != 0) {
        int e = errno;
        fclose(f);
        die("linkat(%s) of the checkpoint: %s", tmp, strerror(e));
    }
    if (fclose(f) != 0) { int e = errno; unlink(tmp); die("fclose(%s): %s", tmp, strerror(e)); }
    if (rename(tmp, path) != 0) { int e = errno; unlink(tmp); die("rename(%s, %s): %s", tmp, path, strerror(e)); }
    path_remove_on_signal(NULL);
    free(tmp);
    /* and the rename itself on disk */
    char *dir = path_folder(path);
    int dir_fd = open(dir, O_RDONLY);
    if (dir_fd >= 0) {
        fsync(dir_fd); /* best effort: some file systems refuse fsync on a folder */
        close(dir_fd);
    }
    free(dir);
}

/* The header: __metadata__ (strings, as safetensors wants) with format 2's
 * checksum, then every tensor in file order, padded with spaces so the data
 * starts 8-byte aligned as safetensors writers do. malloc'd, *len bytes. */
static char *make_header(const run_ctx *ctx, int step, const tensor_table *tt, const float *data,
                         size_t data_bytes, size_t *len) {
    const run_options *o = &ctx->opt;
    const adamw_config *a = &ctx->adamw;
    json_t *m = json_object(), *root = json_object();
    if (!m || !root) die("out of host memory");
    char v[64];
#define META(key, ...) (snprintf(v, sizeof v, __VA_ARGS__), jsonval_set(m, key, jsonval_text(v)))
    META("format", "%s", FORMAT);
    META("step", "%d", step);
    META("vocab", "%d", ctx->model.vocab);
    META("layers", "%d", o->layers);
    META("d_model", "%d", o->d_model);
    META("heads", "%d", o->heads);
    META("seq", "%d", o->seq);
    META("batch", "%d", o->batch);
    META("seed", "%d", o->seed);
    META("lr", "%.9g", o->lr);
    META("weight_decay", "%.9g", o->weight_decay);
    META("clip", "%.9g", o->clip);
    META("beta1", "%g", a->beta1);
    META("beta2", "%g", a->beta2);
    META("eps", "%g", a->eps);
    /* the experts: their number is part of the shape, the routing is said on a resume that changes it */
    META("experts", "%d", ctx->model.experts);
    META("top_k", "%d", ctx->model.top_k);
    if (ctx->model.experts > 0 && ctx->model.expert_width > 0) META("expert_width", "%d", ctx->model.expert_width);
    if (ctx->model.experts > 0 && ctx->model.shared_experts > 0) META("shared_experts", "%d", ctx->model.shared_experts);
    META("capacity_factor", "%.15g", ctx->model.capacity_factor);
    jsonval_set(m, "capacity_scope", jsonval_text(ctx->model.capacity_per_rank ? "rank" : "sequence"));
    META("aux_loss_coef", "%g", ctx->model.aux_coef);
    if (ctx->model.experts > 0 && ctx->model.route_groups > 0) { /* node-limited routing, only when chosen */
        META("route_groups", "%d", ctx->model.route_groups);
        META("route_max_groups", "%d", ctx->model.route_max_groups);
    }
    /* DeepSeek-V3's routing, only when chosen (a file of the defaults stays as it was): refused on a resume
     * with other flags; the bias is training state, each value with 9 digits (exact for a float) */
    if (ctx->model.experts > 0 && ctx->model.router_sigmoid) jsonval_set(m, "router", jsonval_text("sigmoid"));
    if (ctx->model.experts > 0 && ctx->model.route_bias) {
        jsonval_set(m, "balance", jsonval_text("bias"));
        META("bias_speed", "%.9g", o->bias_speed);
        const long n = (long)o->layers * ctx->model.experts;
        char *list = malloc((size_t)n * 18 + 1);
        if (!list) die("out of host memory");
        size_t at = 0;
        for (long i = 0; i < n; i++) at += (size_t)sprintf(list + at, "%s%.9g", i ? "," : "", ctx->model.route_bias[i]);
        list[at] = 0;
        jsonval_set(m, "route_bias", jsonval_text(list));
        free(list);
    }
    jsonval_set(m, "lab", jsonval_text(ctx->lab.name));
    META("ranks", "%d", ctx->size);
    jsonval_set(m, "data", jsonval_text(ctx->data.source));
    META("checksum", "fnv1a64:%016llx", (unsigned long long)checksum_v2(m, data, data_bytes));
#undef META
    jsonval_set(root, "__metadata__", m);
    for (int i = 0; i < tt->n; i++) {
        const tensor_entry *e = &tt->t[i];
        json_int_t begin = 4 * (json_int_t)e->offset, end = begin + 4 * (json_int_t)e->rows * e->cols;
        json_t *t = e->cols == 1
            ? json_pack("{s:s,s:[I],s:[I,I]}", "dtype", "F32", "shape", (json_int_t)e->rows, "data_offsets", begin, end)
            : json_pack("{s:s,s:[I,I],s:[I,I]}", "dtype", "F32", "shape", (json_int_t)e->rows, (json_int_t)e->cols,
                        "data_offsets", begin, end);
        if (!t) die("out of host memory");
        jsonval_set(root, e->name, t);
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) die("out of host memory");
    size_t n = strlen(text);
    text = realloc(text, n + 8);
    if (!text) die("out of host memory");
    while ((8 + n) % 8) text[n++] = ' ';
    text[n] = 0;
    *len = n;
    return text;
}

void ckpt_save(run_ctx *ctx, ckpt_view *v, const char *path, int step) {
    double t0 = now_seconds();
    int rank = ctx->rank, size = ctx->size;
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    const long P = g.total;

    /* what this rank sends: its params no lower rank holds, then m and v likewise */
    shard_runs pa, ma;
    shard_runs_allgather(&v->params_at, size, &pa);
    shard_runs_allgather(&v->moments_at, size, &ma);
    long *psel, *msel;
    long np = shard_select_mine(&pa, rank, P, &psel), nm = shard_select_mine(&ma, rank, P, &msel);
    float *hp = shard_host_copy(v->params, v->params_len), *hm = shard_host_copy(v->adam_m, v->moments_len),
          *hv = shard_host_copy(v->adam_v, v->moments_len);
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
        shard_unpack(&pa, size, P, recv, displs, pc, 1, params_full, "parameter");
        shard_unpack(&ma, size, P, recv, mdispls, mc, 2, moments_full, "AdamW moment");
        free(pc); free(mc); free(mdispls);

        size_t data_bytes = 3 * (size_t)P * sizeof(float);
        tensor_table tt;
        tensor_table_init(&tt, &ctx->model);
        size_t header_len;
        char *header = make_header(ctx, step, &tt, data, data_bytes, &header_len);
        write_file(path, header, header_len, data, data_bytes);
        tensor_table_free(&tt);
        char mb[16];
        printf("checkpoint: %d steps saved to %s (%sB, %.0f ms)\n", step, path,
               human((double)(8 + header_len + data_bytes), mb), 1e3 * (now_seconds() - t0));
        fflush(stdout);
        free(header);
    }
    free(counts); free(recv_counts); free(displs); free(recv); free(data);
    shard_runs_free(&pa);
    shard_runs_free(&ma);
}

void ckpt_step_done(run_ctx *ctx, ckpt_view *v, int steps_done) {
    const run_options *o = &ctx->opt;
    /* interrupted (run_step_end agreed on it): this step is the last one, saved as the end would be
     * (--resume continues from it) */
    const int interrupted = ctx->interrupted;
    if (o->sample > 0 && steps_done == v->first_step + o->steps) sample_print(ctx, v, steps_done);
    if (!o->save) return;
    int last = steps_done == v->first_step + o->steps || interrupted;
    if (last || (o->save_every > 0 && steps_done % o->save_every == 0)) ckpt_save(ctx, v, o->save, steps_done);
}

/* ---- --eval --------------------------------------------------------------------------- */

double ckpt_print_eval(const run_ctx *ctx, double eval_loss) {
    dataset heldout;
    int batches = data_heldout(&ctx->data, ctx->opt.batch, ctx->opt.seq, &heldout);
    if (ctx->rank != 0) return eval_loss;
    printf("eval: loss %.4f on held-out data never trained on (%d batches of %d x %d tokens from the last %ld bytes)\n",
           eval_loss, batches, ctx->opt.batch, ctx->opt.seq, heldout.n);
    fflush(stdout);
    return eval_loss;
}

/* ---- the record ---------------------------------------------------------------------- */

void ckpt_record_members(const run_ctx *ctx, const ckpt_view *v, double eval_loss, json_t *r) {
    const run_options *o = &ctx->opt;
    jsonval_set(r, "first_step", json_integer(v->first_step));
    jsonval_set(r, "resumed_from", jsonval_text(o->resume));
    jsonval_set(r, "saved_to", jsonval_text(o->save));
    jsonval_set(r, "eval_loss", eval_loss >= 0 ? jsonval_number(eval_loss) : json_null());
    if (o->sample > 0) jsonval_set(r, "sample", sample_record());
}
