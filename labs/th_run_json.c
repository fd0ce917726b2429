/* th_run in a record and back (th_run_json.h). */
#include "th_run_json.h"
#include "device.h"
#include "jsonval.h"
#include "kinds.h"
#include "theory.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a field is held: a whole number (int or long), a number, true/false, or
 * one of a list of names (an int index; the schedule: a name or null). */
typedef enum { F_INT, F_LONG, F_NUMBER, F_BOOL, F_CHOICE, F_SCHEDULE, F_MODEL } field_kind;
typedef struct {
    const char *name;
    field_kind kind;
    size_t offset;
    double lo, hi;            /* whole numbers and numbers: the range */
    const char *const *names; /* F_CHOICE */
    int n_names;
} field;

static const char *const cp_algo_names[] = {"ring", "allgather", "ulysses"};       /* th_cp_algo's order */
static const char *const cp_layout_names[] = {"contiguous", "zigzag"};             /* th_cp_layout's */
#define MAX_COUNT 1e9   /* the labs' largest value of a count flag */
#define MAX_ELEMS 1e18  /* elements of a model: far beyond any run */

#define M(n, k, lo, hi) {#n, k, offsetof(th_model, n), lo, hi, NULL, 0}
static const field model_fields[] = {
    M(vocab, F_LONG, 1, MAX_COUNT), M(seq, F_LONG, 1, MAX_COUNT), M(layers, F_LONG, 1, MAX_COUNT),
    M(d_model, F_LONG, 1, MAX_COUNT), M(heads, F_LONG, 1, MAX_COUNT), M(kv_heads, F_LONG, 1, MAX_COUNT),
    M(ffn, F_LONG, 1, 4 * MAX_COUNT), M(gated_mlp, F_BOOL, 0, 1), M(biases, F_BOOL, 0, 1),
    M(learned_positions, F_BOOL, 0, 1), M(tied_head, F_BOOL, 0, 1), M(experts, F_LONG, 0, MAX_COUNT),
    M(top_k, F_LONG, 0, MAX_COUNT), M(ffn_expert, F_LONG, 0, MAX_COUNT), M(shared_experts, F_LONG, 0, MAX_COUNT),
    M(dense_layers, F_LONG, 0, MAX_COUNT), M(route_max_nodes, F_LONG, 0, MAX_COUNT), M(dropout, F_BOOL, 0, 1),
};
#undef M
#define R(n, k, lo, hi) {#n, k, offsetof(th_run, n), lo, hi, NULL, 0}
static const field run_fields[] = {
    R(ranks, F_INT, 1, 65536), R(cuda, F_BOOL, 0, 1), R(bf16, F_BOOL, 0, 1), R(batch, F_LONG, 1, MAX_COUNT),
    {"model", F_MODEL, offsetof(th_run, model), 0, 0, NULL, 0},
    R(tp, F_INT, 1, 65536), R(pp, F_INT, 1, 65536), R(dp, F_INT, 1, 65536), R(micro_batches, F_INT, 1, MAX_COUNT),
    R(grad_accum, F_INT, 0, MAX_COUNT), {"schedule", F_SCHEDULE, offsetof(th_run, schedule), 0, 0, NULL, 0},
    R(chunks, F_INT, 0, MAX_COUNT), R(zero_stage, F_INT, 0, 3), R(tensor_parallel, F_BOOL, 0, 1),
    R(units, F_INT, 0, MAX_COUNT), R(full_elems, F_NUMBER, 0, MAX_ELEMS), R(largest_unit_elems, F_NUMBER, 0, MAX_ELEMS),
    R(embed_unit_elems, F_NUMBER, 0, MAX_ELEMS), R(sequence_parallel, F_BOOL, 0, 1),
    {"recompute", F_CHOICE, offsetof(th_run, recompute), 0, 0, recompute_names, RECOMPUTE_MODES},
    R(cp, F_INT, 0, 65536), {"cp_algo", F_CHOICE, offsetof(th_run, cp_algo), 0, 0, cp_algo_names, 3},
    {"cp_layout", F_CHOICE, offsetof(th_run, cp_layout), 0, 0, cp_layout_names, 2},
    R(ep, F_INT, 0, 65536), R(capacity_factor, F_NUMBER, 0, INFINITY),
};
#undef R
#define N_OF(a) (int)(sizeof a / sizeof a[0])

static json_t *encode(const void *base, const field *f, int n) {
    json_t *o = json_object();
    if (!o) die("out of host memory");
    for (int i = 0; i < n; i++) {
        const char *at = (const char *)base + f[i].offset;
        json_t *v = NULL;
        switch (f[i].kind) {
        case F_INT: v = json_integer(*(const int *)at); break;
        case F_LONG: v = json_integer(*(const long *)at); break;
        case F_NUMBER: v = jsonval_number(*(const double *)at); break;
        case F_BOOL: v = json_boolean(*(const int *)at); break;
        case F_CHOICE: v = jsonval_text(f[i].names[*(const int *)at]); break;
        case F_SCHEDULE: v = *(const char *const *)at ? jsonval_text(*(const char *const *)at) : json_null(); break;
        case F_MODEL: v = encode(at, model_fields, N_OF(model_fields)); break;
        }
        jsonval_set(o, f[i].name, v);
    }
    return o;
}

json_t *th_run_to_json(const th_run *r) { return encode(r, run_fields, N_OF(run_fields)); }

static int problem(char *why, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return 0;
}

/* v's index among names, -1 when it is none of them; and the names as a message lists them */
static int choice_of(json_t *v, const char *const *names, int n) {
    for (int k = 0; k < n; k++)
        if (json_is_string(v) && !strcmp(json_string_value(v), names[k])) return k;
    return -1;
}
static const char *names_text(const char *const *names, int n, char *buf, size_t len) {
    buf[0] = 0;
    for (int j = 0; j < n; j++) snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", j ? "|" : "", names[j]);
    return buf;
}

static int decode(json_t *o, const char *path, void *base, const field *f, int n, char *why, size_t len) {
    if (!json_is_object(o)) return problem(why, len, o ? "%s: must be an object" : "%s is missing", path);
    for (int i = 0; i < n; i++) {
        char *at = (char *)base + f[i].offset, text[64], here[96], list[128];
        snprintf(here, sizeof here, "%s.%s", path, f[i].name);
        json_t *v = json_object_get(o, f[i].name);
        if (!v) return problem(why, len, "%s is missing", here);
        const double x = json_is_number(v) ? json_number_value(v) : NAN;
        switch (f[i].kind) {
        case F_INT:
        case F_LONG:
            if (!(x >= f[i].lo && x <= f[i].hi && x == floor(x)))
                return problem(why, len, "%s %s: must be a whole number from %.0f to %.0f", here, jsonval_shown(v, text, sizeof text),
                               f[i].lo, f[i].hi);
            if (f[i].kind == F_INT) *(int *)at = (int)x;
            else *(long *)at = (long)x;
            break;
        case F_NUMBER:
            if (!(x >= f[i].lo && x <= f[i].hi))
                return problem(why, len, "%s %s: must be a number from %g to %g", here, jsonval_shown(v, text, sizeof text), f[i].lo,
                               f[i].hi);
            *(double *)at = x;
            break;
        case F_BOOL:
            if (!json_is_boolean(v)) return problem(why, len, "%s %s: must be true or false", here, jsonval_shown(v, text, sizeof text));
            *(int *)at = json_is_true(v);
            break;
        case F_CHOICE: {
            const int k = choice_of(v, f[i].names, f[i].n_names);
            if (k < 0)
                return problem(why, len, "%s %s: must be one of %s", here, jsonval_shown(v, text, sizeof text),
                               names_text(f[i].names, f[i].n_names, list, sizeof list));
            *(int *)at = k;
            break;
        }
        case F_SCHEDULE: {
            const int k = choice_of(v, th_schedule_names, TH_NSCHED);
            if (!json_is_null(v) && k < 0)
                return problem(why, len, "%s %s: must be null (no executor) or one of %s", here,
                               jsonval_shown(v, text, sizeof text), names_text(th_schedule_names, TH_NSCHED, list, sizeof list));
            *(const char **)at = k < 0 ? NULL : th_schedule_names[k]; /* a name that outlives the record */
            break;
        }
        case F_MODEL:
            if (!decode(v, here, at, model_fields, N_OF(model_fields), why, len)) return 0;
            break;
        }
    }
    return 1;
}

int th_run_from_json(json_t *o, th_run *r, char *why, size_t len) {
    memset(r, 0, sizeof *r);
    return decode(o, "th_run", r, run_fields, N_OF(run_fields), why, len);
}
