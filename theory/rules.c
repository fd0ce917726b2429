/* The rules a run's layout must keep (predict.h's th_run_broken_rule): the
 * checks lab07 and lab08 make of their flags before anything runs, kept here
 * once so that plan3d --check refuses a record that no lab could have written
 * by the very rules the labs refuse their flags with. */
#include "predict.h"
#include <stdarg.h>
#include <stdio.h>

/* The numbers a rule names, each as a lab's flag and as the key of a run
 * record's th_run (labs/th_run_json.h, what plan3d --check reads). */
typedef enum { NAME_BATCH, NAME_SEQ, NAME_HEADS, NAME_EXPERTS, NAME_CP, NAME_CP_ALGO, NAME_CP_LAYOUT, NAME_EP } name;
static const char *const flag_names[] = {"--batch", "--seq", "--heads", "--experts", "--cp", "--cp-algo", "--cp-layout",
                                         "--ep"};
static const char *const record_names[] = {"th_run.batch", "th_run.model.seq", "th_run.model.heads",
                                           "th_run.model.experts", "th_run.cp", "th_run.cp_algo", "th_run.cp_layout",
                                           "th_run.ep"};

typedef struct text {
    const char *const *names;
    char *buf;
    int len;
} text;

static const char *broken(const text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *broken(const text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->buf, (size_t)t->len, fmt, ap);
    va_end(ap);
    return t->buf;
}

/* lab07: the ranks in groups of cp, each group every sequence cut into chunks
 * (zig-zag: 2 cp, a rank holding chunks r and 2 cp - 1 - r; contiguous: cp),
 * data parallel over the groups; its layers' MLP is dense (lab09's grid takes
 * experts beside CP, over its EP groups). */
static const char *context_rule(const th_run *r, const text *t) {
    const char *const *n = t->names;
    const int cp = r->cp, zigzag = r->cp_layout == TH_CP_ZIGZAG;
    const long chunks = zigzag ? 2L * cp : cp;
    if (r->model.experts > 0 && !(r->tensor_parallel && r->ep > 0))
        return broken(t, "%s %ld: lab07's context-parallel layers run a dense MLP (experts are lab08's; lab01-lab04 take "
                         "them too)", n[NAME_EXPERTS], r->model.experts);
    if (r->ranks % cp) return broken(t, "%s %d: does not divide the %d ranks", n[NAME_CP], cp, r->ranks);
    /* lab09's CP sits in a TP x PP grid: its data-parallel replicas are the grid's dp, each B/dp rows */
    const int groups = r->tensor_parallel ? r->dp : r->ranks / cp;
    if (groups < 1 || r->batch % groups)
        return broken(t, "%s %ld: not divisible by the %d data-parallel groups (%d ranks over %s %d)", n[NAME_BATCH],
                      r->batch, groups, r->ranks, n[NAME_CP], cp);
    if (r->model.seq % chunks)
        return broken(t, "%s %ld: not divisible by the %ld chunks of %s %s (%s%s %d)", n[NAME_SEQ], r->model.seq, chunks,
                      n[NAME_CP_LAYOUT], zigzag ? "zigzag" : "contiguous", zigzag ? "2 x " : "", n[NAME_CP], cp);
    if (r->cp_algo == TH_CP_ULYSSES && r->model.heads % ((long)cp * (r->tensor_parallel && r->tp > 1 ? r->tp : 1)))
        return broken(t, "%s %ld: not divisible by %s %d (%s ulysses gives each rank heads/N of them)", n[NAME_HEADS],
                      r->model.heads, n[NAME_CP], cp, n[NAME_CP_ALGO]);
    return NULL;
}

/* lab08: the ranks in groups of ep, each holding E/ep experts; every rank its own rows. */
static const char *expert_rule(const th_run *r, const text *t) {
    const char *const *n = t->names;
    const int ep = r->ep;
    if (r->model.experts < 1)
        return broken(t, "%s %ld: lab08 spreads experts over ranks (give E >= 1)", n[NAME_EXPERTS], r->model.experts);
    if (r->ranks % ep) return broken(t, "%s %d: does not divide the %d ranks", n[NAME_EP], ep, r->ranks);
    if (r->model.experts % ep)
        return broken(t, "%s %ld: not divisible by %s %d (each rank holds E/N experts)", n[NAME_EXPERTS],
                      r->model.experts, n[NAME_EP], ep);
    /* lab09's EP sits in a pipeline grid: its dp replicas train their own rows */
    const int rows_groups = r->tensor_parallel ? r->dp : r->ranks;
    if (rows_groups < 1 || r->batch % rows_groups)
        return broken(t, "%s %ld: not divisible by the %d ranks (each trains its own rows)", n[NAME_BATCH], r->batch,
                      rows_groups);
    return NULL;
}

const char *th_run_broken_rule(const th_run *r, th_names names, char *buf, int len) {
    const text t = {names == TH_NAMES_RECORD ? record_names : flag_names, buf, len};
    buf[0] = 0;
    if (r->ranks < 1) return broken(&t, "%d ranks: a run has at least one", r->ranks);
    const char *why = r->cp > 0 ? context_rule(r, &t) : NULL;
    if (!why && r->ep > 0) why = expert_rule(r, &t);
    return why;
}
