#include "plan.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double GiB = 1073741824.0;

const char *layout_text(const layout *l, char *buf, int len) {
    char v[16] = "";
    if (l->schedule == TH_SCHED_INTERLEAVED) snprintf(v, sizeof v, " v=%d", l->vp);
    char cp[16] = "", ep[16] = "";
    if (l->cp > 1) snprintf(cp, sizeof cp, " cp=%d", l->cp);
    if (l->ep > 1) snprintf(ep, sizeof ep, " ep=%d", l->ep);
    snprintf(buf, len, "tp=%d%s pp=%d dp=%d%s b=%d m=%d %s%s%s recompute=%s", l->tp, cp, l->pp, l->dp, ep,
             l->micro_batch, l->micro_batches, th_schedule_names[l->schedule], v, l->sp ? " sp" : "",
             recompute_names[l->recompute]);
    return buf;
}

static int by_quality(const void *pa, const void *pb) {
    const estimate *a = pa, *b = pb;
    if (a->fits != b->fits) return b->fits - a->fits;
    double x = a->fits ? a->t_step : a->mem_total - a->mem_limit, y = b->fits ? b->t_step : b->mem_total - b->mem_limit;
    if (x != y) return x < y ? -1 : 1;
    return a->mem_total < b->mem_total ? -1 : a->mem_total > b->mem_total;
}

/* ---- the search, bounded ------------------------------------------------------------
 *
 * The layouts multiply: every t x cp x p x d (x ep) split of the GPUs has up to
 * 324 of micro-batch, schedule, interleaving, SP and recomputation, and a layout
 * costs a loop over its p v rank-chunks (plus, interleaved, a table of blocks in
 * flight of (p v)^2 steps). At the flags' limits (10^6 GPUs with many divisors,
 * 4096 layers) that is 10^7-10^8 layouts. So the search first counts the layouts
 * and their work, which is cheap, and costs them all, in the order below, only
 * when the work is under WORK_CAP (the presets on up to a few thousand GPUs are:
 * the answer is then the exhaustive one). Above it, it costs the most promising
 * splits first until the cap is spent and says so: those whose model states fit
 * (model_states_floor), the fewest model-parallel GPUs t x cp x p first
 * (Narayanan et al. 2021: model parallelism only as far as memory needs it, data
 * parallelism for the rest), then those that cannot fit, the closest first. */

/* Work, in rank-chunks of estimate_layout's loop (about 40 ns each on the
 * course's 2-core machine): a layout's fixed part and its p v rank-chunks; a
 * step of an interleaved in-flight table is about 12 times cheaper than a
 * rank-chunk. WORK_CAP: about a second of costing (tests/test_plan3d.py
 * bounded holds the flags' worst cases to a few seconds). */
enum { LAYOUT_WORK = 60, FLIGHT_STEPS_PER_UNIT = 12 };
static const double WORK_CAP = 2e7;

static double layout_work(const layout *l) {
    return LAYOUT_WORK + (double)l->pp * th_schedule_chunks(l->schedule, l->vp);
}

/* The interleaved schedule's in-flight tables, one per (p, m, v), shared by
 * every layout that has them (an open-addressing hash table). */
typedef struct flight_entry {
    int p, m, v;
    int counted;       /* its work is in a split's count */
    in_flight *table;  /* NULL until a layout is costed with it */
} flight_entry;
typedef struct flight_cache { flight_entry *slot; size_t cap, used; } flight_cache;

static void *checked(void *p) {
    if (!p) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    return p;
}

static flight_entry *flight_find(flight_cache *fc, int p, int m, int v) {
    if (2 * (fc->used + 1) > fc->cap) { /* grow: at most half full */
        flight_cache bigger = {checked(calloc(fc->cap ? 2 * fc->cap : 1024, sizeof *fc->slot)), fc->cap ? 2 * fc->cap : 1024, 0};
        for (size_t i = 0; i < fc->cap; i++)
            if (fc->slot[i].p) *flight_find(&bigger, fc->slot[i].p, fc->slot[i].m, fc->slot[i].v) = fc->slot[i];
        free(fc->slot);
        *fc = bigger;
    }
    size_t h = ((size_t)p * 2654435761u ^ (size_t)m * 40503u ^ (size_t)v * 97u) & (fc->cap - 1);
    while (fc->slot[h].p && !(fc->slot[h].p == p && fc->slot[h].m == m && fc->slot[h].v == v)) h = (h + 1) & (fc->cap - 1);
    if (!fc->slot[h].p) {
        fc->slot[h] = (flight_entry){p, m, v, 0, NULL};
        fc->used++;
    }
    return &fc->slot[h];
}

static void flight_free(flight_cache *fc) {
    for (size_t i = 0; i < fc->cap; i++) free(fc->slot[i].table);
    free(fc->slot);
}

static double flight_work(const layout *l) {
    const double pv = (double)l->pp * l->vp;
    return pv * pv / FLIGHT_STEPS_PER_UNIT;
}

/* One t x cp x p x d (x ep) split of the GPUs. */
typedef struct split {
    int t, cp, p, d, ep;
    long layouts;         /* its layouts that divide the model and batch */
    double work;          /* of costing them (the in-flight tables it is the first to need included) */
    int order_class;      /* bounded search: 0 its model states fit, 1 they do not */
    double order_key;     /* bounded search: t x cp x p (class 0), its model states floor (class 1) */
    long index;           /* its place in the exhaustive search's order */
} split;

typedef struct search {
    const th_model *m;
    const cluster *c;
    const training *tr;
    const constraints *k;
    plan_result *r;
    int cap;
    flight_cache flights;
    int costing;          /* 0: count each split's layouts and work; 1: cost them */
    double work_left;     /* costing a bounded search: < 0 once the cap is spent; unbounded: infinite */
} search;

static void push(search *s, const estimate *e) {
    plan_result *r = s->r;
    if (r->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        r->all = checked(realloc(r->all, sizeof *r->all * (size_t)s->cap));
    }
    r->all[r->n++] = *e;
}

/* Every micro-batch, schedule, SP and recomputation of one split: counted, or costed. */
static void search_one(search *s, split *sp) {
    static const int batches[] = {1, 2, 4, 8, 16, 32}, chunks[] = {2, 3, 4, 6, 8};
    const constraints *k = s->k;
    const int t = sp->t, cp = sp->cp, p = sp->p, d = sp->d, ep = sp->ep;
    /* SP and recomputation: the rules of a layout do not depend on them, but
     * for EP folded over TP (ep_folds_tp), which needs SP */
    const int needs_fold = ((long)d * cp) % ep != 0;
    int sps[2], n_sp = 0, rcs[3], n_rc = 0;
    for (int x = 0; x <= 1; x++)
        if ((k->sp >= 0 ? x == k->sp : !(x && t == 1)) && !(needs_fold && !x)) sps[n_sp++] = x;
    if (!n_sp) return;
    for (int x = 0; x < 3; x++)
        if (k->recompute < 0 || x == k->recompute) rcs[n_rc++] = x;
    for (int bi = 0; bi < 6; bi++) {
        int b = k->micro_batch ? k->micro_batch : batches[bi];
        if (k->micro_batch && bi) break;
        for (int sc = 0; sc < TH_NSCHED; sc++) {
            if (k->schedule >= 0 ? sc != k->schedule : (p == 1 && sc != TH_SCHED_1F1B)) continue;
            for (int vi = 0; vi < 5; vi++) {
                int v = sc != TH_SCHED_INTERLEAVED ? 1 : k->vp ? k->vp : chunks[vi];
                if ((sc != TH_SCHED_INTERLEAVED || k->vp) && vi) break;
                layout l = {t, p, d, cp, ep, b, 0, sc, v, sps[0], RECOMPUTE_NONE};
                l.micro_batches = d * b > 0 ? (int)(s->tr->global_batch / ((long)d * b)) : 0;
                if (!layout_divides(s->m, s->c, s->tr, &l)) {
                    if (!s->costing) s->r->rejected_shape += n_sp * n_rc;
                    continue;
                }
                const int shared_table = sc == TH_SCHED_INTERLEAVED && p > 1;
                flight_entry *fe = shared_table ? flight_find(&s->flights, p, l.micro_batches, v) : NULL;
                const double work = layout_work(&l);
                if (!s->costing) {
                    sp->layouts += n_sp * n_rc;
                    sp->work += n_sp * n_rc * work;
                    if (fe && !fe->counted) { fe->counted = 1; sp->work += flight_work(&l); }
                    continue;
                }
                for (int i = 0; i < n_sp; i++)
                    for (int j = 0; j < n_rc; j++) {
                        /* a bounded search stops at the first layout over the cap (and costs one at least) */
                        s->work_left -= work + (fe && !fe->table ? flight_work(&l) : 0);
                        if (s->work_left < 0 && s->r->n) return;
                        if (fe && !fe->table) {
                            fe->table = checked(malloc(sizeof *fe->table * (size_t)p * v));
                            in_flight_table(TH_SCHED_INTERLEAVED, p, l.micro_batches, v, fe->table);
                        }
                        l.sp = sps[i];
                        l.recompute = rcs[j];
                        estimate e;
                        estimate_layout(s->m, s->c, s->tr, &l, fe ? fe->table : NULL, &e);
                        push(s, &e);
                        s->r->n_fit += e.fits;
                    }
            }
        }
    }
}

/* The divisors of n, ascending (n <= 10^6 GPUs: at most 240 of them). */
static int *divisors_of(int n, int *count) {
    int *below = checked(malloc(sizeof(int) * 2048)), *above = below + 1024, nb = 0, na = 0;
    for (int x = 1; (long)x * x <= n; x++)
        if (n % x == 0) {
            below[nb++] = x;
            if (x != n / x) above[na++] = n / x;
        }
    for (int i = na - 1; i >= 0; i--) below[nb++] = above[i];
    *count = nb;
    return below;
}

/* Every t x cp x p x d (x ep) split the rules and the fixed flags allow, in the exhaustive search's order
 * (each degree ascending, t outermost). */
static split *all_splits(const th_model *m, const cluster *c, const constraints *k, long *n_splits) {
    long n = 0, cap = 256;
    split *all = checked(malloc(sizeof *all * (size_t)cap));
    int n_div, n_ep = 0;
    int *div = divisors_of(c->gpus, &n_div);
    /* EP: a divisor of the routed experts (1 for a dense model), or the one fixed */
    const int top_ep = m->experts > 0 ? (int)m->experts : 1;
    int *eps = checked(malloc(sizeof(int) * (size_t)top_ep));
    for (int ep = 1; ep <= top_ep; ep++)
        if (k->ep ? ep == k->ep : m->experts <= 0 || m->experts % ep == 0) eps[n_ep++] = ep;
    for (int i = 0; i < n_div; i++) {
        const int t = div[i];
        if (k->tp && t != k->tp) continue;
        /* a TP group inside a node must not straddle two: t divides the node's GPUs */
        if (!k->tp && !k->tp_across_nodes && (t > c->gpus_per_node || c->gpus_per_node % t)) continue;
        for (int j = 0; j < n_div && div[j] <= c->gpus / t; j++) {
            const int cp = div[j];
            /* the ring's zig-zag layout cuts the sequence into 2 cp chunks */
            if ((c->gpus / t) % cp || (k->cp && cp != k->cp) || (cp > 1 && m->seq % (2L * cp))) continue;
            for (int q = 0; q < n_div && div[q] <= c->gpus / (t * cp); q++) {
                const int p = div[q];
                if ((c->gpus / (t * cp)) % p || (k->pp && p != k->pp) || p > m->layers) continue;
                int d = c->gpus / (t * cp * p);
                if (k->dp && d != k->dp) continue;
                /* EP's group is carved from the DP x CP ranks, or with SP the TP x DP x CP ranks */
                for (int e = 0; e < n_ep; e++) {
                    if (((long)t * d * cp) % eps[e]) continue; /* search_one keeps SP on where it folds */
                    if (n == cap) all = checked(realloc(all, sizeof *all * (size_t)(cap *= 2)));
                    all[n] = (split){t, cp, p, d, eps[e], 0, 0, 0, 0, n};
                    n++;
                }
            }
        }
    }
    free(div);
    free(eps);
    *n_splits = n;
    return all;
}

static int by_promise(const void *pa, const void *pb) {
    const split *a = pa, *b = pb;
    if (a->order_class != b->order_class) return a->order_class - b->order_class;
    if (a->order_key != b->order_key) return a->order_key < b->order_key ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

void plan_search(const th_model *m, const cluster *c, const training *tr, const constraints *k, plan_result *r) {
    memset(r, 0, sizeof *r);
    search s = {m, c, tr, k, r, 0, {0}, 0, 0};
    long n_splits;
    split *splits = all_splits(m, c, k, &n_splits);
    for (long i = 0; i < n_splits; i++) {
        search_one(&s, &splits[i]);
        r->layouts += splits[i].layouts;
        r->work += splits[i].work;
    }
    r->splits = n_splits;
    r->bounded = r->work > WORK_CAP;
    s.costing = 1;
    s.work_left = r->bounded ? WORK_CAP : INFINITY;
    if (r->bounded) {
        const double limit = c->mem_gib * 1073741824.0 * (1 - tr->headroom);
        for (long i = 0; i < n_splits; i++) {
            split *x = &splits[i];
            const layout l = {x->t, x->p, x->d, x->cp, x->ep, 1, 1, TH_SCHED_1F1B, 1, 0, RECOMPUTE_NONE};
            const double floor = model_states_floor(m, tr, &l);
            x->order_class = floor > limit;
            x->order_key = x->order_class ? floor : (double)x->t * x->cp * x->p;
        }
        qsort(splits, (size_t)n_splits, sizeof *splits, by_promise);
    }
    for (long i = 0; i < n_splits && s.work_left >= 0; i++, r->splits_costed++) search_one(&s, &splits[i]);
    free(splits);
    flight_free(&s.flights);
    if (r->n) qsort(r->all, (size_t)r->n, sizeof *r->all, by_quality);
}

void plan_free(plan_result *r) {
    free(r->all);
    memset(r, 0, sizeof *r);
}

void plan_print_header(FILE *f, const char *name, const th_model *m, const cluster *c, const training *tr) {
    th_params pc = th_param_counts(m);
    double peak = tr->precision == PREC_BF16 ? c->bf16_tflops : c->fp32_tflops;
    char wide[48] = "";
    if (m->head_dim > 0) snprintf(wide, sizeof wide, " of %ld", m->head_dim);
    fprintf(f, "model    %s: %.4g B parameters | %ld layers, d_model %ld, %ld heads%s (%ld K/V), ffn %ld%s, seq %ld, vocab %ld\n",
            name, pc.total / 1e9, m->layers, m->d_model, m->heads, wide, m->kv_heads, m->ffn,
            m->gated_mlp ? " (SwiGLU)" : "", m->seq, m->vocab);
    if (m->experts > 0)
        fprintf(f, "experts  %ld routed, top-%ld, %ld shared, each ffn %ld, %ld of %ld layers MoE | %.4g B total, "
                   "%.4g B active per token (%.3g B of routed experts per MoE layer)\n",
                m->experts, m->top_k, m->shared_experts, m->ffn_expert > 0 ? m->ffn_expert : m->ffn,
                (long)th_moe_layers(m, 0, (int)m->layers), m->layers, pc.total / 1e9, pc.active / 1e9,
                pc.layer_experts / 1e9);
    fprintf(f, "cluster  %d x %s, %d per node | %.4g GiB, %.4g TFLOP/s dense %s at efficiency %.2f | inside %.4g GB/s %.3g us, "
               "between %.4g GB/s %.3g us per GPU\n",
            c->gpus, c->name, c->gpus_per_node, c->mem_gib, peak, tr->precision == PREC_BF16 ? "bf16" : "fp32",
            c->efficiency, c->intra_gbs, c->intra_us, c->inter_gbs, c->inter_us);
    fprintf(f, "training global batch %ld sequences (%.3gM tokens) | %s (%g bytes of model state per parameter) | "
               "ZeRO stage %d | DP overlap %.2f | %.0f%% of memory kept free%s%s\n",
            tr->global_batch, tr->global_batch * (double)m->seq / 1e6,
            tr->precision == PREC_BF16 ? "bf16 mixed precision" : "fp32",
            th_param_bytes(tr->precision) + th_grad_bytes(tr->precision) + th_optim_bytes(tr->precision), tr->zero_stage,
            tr->dp_overlap, 100 * tr->headroom, tr->recompute_modules ? " | recomputed beside none or selective: " : "",
            tr->recompute_modules ? recompute_modules_text(tr->recompute_modules) : "");
}

void plan_print_bound(FILE *f, const plan_result *r) {
    if (!r->bounded) return;
    fprintf(f, "search bounded: the %ld valid layouts of %ld splits of the GPUs are %.0f times the work of a search (about "
               "a second); costed: %d layouts of the first %ld splits, those whose model states fit first, fewest "
               "t x cp x p GPUs first, then the others, closest to fitting first; %ld layouts not costed, the best may be "
               "among them (--tp, --cp, --pp, --dp, --micro-batch or --schedule narrow the search)\n",
            r->layouts, r->splits, r->work / WORK_CAP, r->n, r->splits_costed, r->layouts - r->n);
}

void plan_print_table(FILE *f, const plan_result *r, int top) {
    fprintf(f, "\n%d layouts: %d fit, %d do not (and %ld combinations cannot divide the model or batch)\n", r->n, r->n_fit,
            r->n - r->n_fit, r->rejected_shape);
    plan_print_bound(f, r);
    fprintf(f, "  #  tp  cp  pp   dp  ep  b    m schedule     v sp recompute | params  grads  optim   acts  total GiB |"
               " step s = compute +    TP +  CP +  EP +    PP + bubble +    DP +   opt |  tok/s    MFU\n");
    for (int i = 0; i < r->n && i < top; i++) {
        const estimate *e = &r->all[i];
        const layout *l = &e->l;
        fprintf(f, "%3d %3d %3d %3d %4d %3d %2d %4d %-12s %1d %2s %-9s | %6.1f %6.1f %6.1f %6.1f %6.1f%s    | %6.2f = %7.2f "
                   "%7.2f %5.2f %5.2f %7.2f %6.2f %7.2f %5.2f | %6.3g %5.1f%%\n",
                i + 1, l->tp, l->cp, l->pp, l->dp, l->ep, l->micro_batch, l->micro_batches, th_schedule_names[l->schedule],
                l->vp, l->sp ? "on" : "-", recompute_names[l->recompute], e->mem[MEM_PARAMS] / GiB,
                e->mem[MEM_GRADS] / GiB, e->mem[MEM_OPTIM] / GiB, e->mem[MEM_ACTS] / GiB, e->mem_total / GiB,
                e->fits ? " " : "!", e->t_step, e->t_compute, e->t_tp, e->t_cp, e->t_ep, e->t_pp, e->t_bubble, e->t_dp,
                e->t_optim, e->tokens_per_s, 100 * e->mfu);
    }
}

void plan_print_winner(FILE *f, const estimate *e, const cluster *c) {
    char lt[160];
    fprintf(f, "\nbest: %s\n", layout_text(&e->l, lt, sizeof lt));
    fprintf(f, "  memory per GPU (stage %d, the fullest): params %.2f + grads %.2f + optimizer %.2f + activations %.2f "
               "(in flight: %.3g micro-batches' worth) + comm %.2f + workspace %.2f = %.2f GiB of %.2f usable\n",
            e->fullest_stage, e->mem[MEM_PARAMS] / GiB, e->mem[MEM_GRADS] / GiB, e->mem[MEM_OPTIM] / GiB,
            e->mem[MEM_ACTS] / GiB,
            th_acts_in_flight(e->l.schedule, e->l.pp, e->fullest_stage, e->l.micro_batches, e->l.vp),
            e->mem[MEM_COMM] / GiB, e->mem[MEM_WORKSPACE] / GiB, e->mem_total / GiB, e->mem_limit / GiB);
    fprintf(f, "  one micro-batch on the busiest stage (%d layers): forward %.1f ms, input-gradient %.1f ms, weight-gradient "
               "%.1f ms (TP and PP traffic included)\n",
            e->stage_layers_max, 1e3 * e->tF, 1e3 * e->tB, 1e3 * e->tW);
    fprintf(f, "  step %.3f s: compute %.3f (at %.0f%% of peak) + TP %.3f + CP %.3f + EP %.3f + PP %.3f + bubble %.3f "
               "(%.1f%% of the step) + exposed DP %.3f + optimizer %.3f\n",
            e->t_step, e->t_compute, 100 * c->efficiency, e->t_tp, e->t_cp, e->t_ep, e->t_pp, e->t_bubble,
            100 * e->t_bubble / e->t_step, e->t_dp, e->t_optim);
    fprintf(f, "  traffic per GPU per step (ring bytes): TP %.3g GB, CP %.3g GB (ring attention, K and V forward, dK and "
               "dV back), EP %.3g GB (all-to-all), PP %.3g GB, DP %.3g GB\n",
            e->tp_bytes / 1e9, e->cp_bytes / 1e9, e->ep_bytes / 1e9, e->pp_bytes / 1e9, e->dp_bytes / 1e9);
    if (e->l.ep > 1)
        fprintf(f, "  EP between nodes: %.3g GB per GPU per step, %.3g copies of a token's row per all-to-all (%s)\n",
                e->ep_node_bytes / 1e9, e->ep_node_copies,
                e->ep_node_limit <= 0  ? "a copy per choice"
                : e->ep_node_dispatch ? "a per-node dispatch: once to each node a token reaches"
                                      : "node-limited routing: once to each node a token reaches");
    if (e->l.ep > 1 || e->expert_params > 0)
        fprintf(f, "  experts: %.3g B routed-expert parameters on the fullest GPU (1/%d of its stage's), their states "
                   "over %d ranks holding the same experts\n",
                e->expert_params / 1e9, e->l.ep, expert_data_ranks(&e->l));
    fprintf(f, "  %.4g tokens/s, %.1f TFLOP/s per GPU of model FLOPs (%.1f with recomputation), MFU %.1f%%\n",
            e->tokens_per_s, e->model_flops / e->t_step / c->gpus / 1e12, e->hw_flops / e->t_step / c->gpus / 1e12,
            100 * e->mfu);
}

/* The best layout (fitting first) whose key is 1, else NULL. */
static const estimate *best_with(const plan_result *r, int (*ok)(const layout *l)) {
    for (int i = 0; i < r->n; i++)
        if (ok(&r->all[i].l)) return &r->all[i];
    return NULL;
}
static int no_cp(const layout *l) { return l->cp == 1; }
static int no_ep(const layout *l) { return l->ep == 1; }

/* cat: the memory category the knob divides (CP: activations), or -1: the model states (EP: the experts') */
static double mem_of(const estimate *e, int cat) {
    return cat >= 0 ? e->mem[cat] : e->mem[MEM_PARAMS] + e->mem[MEM_GRADS] + e->mem[MEM_OPTIM];
}

static void why_one(FILE *f, const plan_result *r, const char *name, int value, int (*without)(const layout *l), int cat,
                    const char *what) {
    const estimate *w = &r->all[0], *b = best_with(r, without);
    char lt[160];
    if (value <= 1) return;
    if (!b) {
        fprintf(f, "  why %s=%d: no layout without it divides the model and the GPUs\n", name, value);
        return;
    }
    layout_text(&b->l, lt, sizeof lt);
    if (!b->fits)
        fprintf(f, "  why %s=%d: without it nothing fits: the closest layout (%s) needs %.1f GiB per GPU, its %s %.1f GiB, "
                   "of %.1f usable; with %s=%d the %s take %.1f GiB\n",
                name, value, lt, b->mem_total / GiB, what, mem_of(b, cat) / GiB, b->mem_limit / GiB, name, value, what,
                mem_of(w, cat) / GiB);
    else {
        /* does memory force recomputation without the knob? */
        int only_full = 1;
        for (int i = 0; i < r->n; i++)
            if (without(&r->all[i].l) && r->all[i].fits && r->all[i].l.recompute != RECOMPUTE_FULL) only_full = 0;
        fprintf(f, "  why %s=%d: the best layout without it (%s, %s %.1f GiB) takes %.3f s a step, %.0f%% more than "
                   "%.3f s (%s here %.1f GiB)%s\n",
                name, value, lt, what, mem_of(b, cat) / GiB, b->t_step, 100 * (b->t_step / w->t_step - 1), w->t_step, what,
                mem_of(w, cat) / GiB,
                only_full && w->l.recompute != RECOMPUTE_FULL ? "; without it only full recomputation fits" : "");
    }
}

void plan_print_why(FILE *f, const plan_result *r, const constraints *k) {
    if (!r->n_fit) return;
    if (!k->cp) why_one(f, r, "cp", r->all[0].l.cp, no_cp, MEM_ACTS, "activations");
    if (!k->ep) why_one(f, r, "ep", r->all[0].l.ep, no_ep, -1, "model states");
}

/* For one knob, the best layout at each of its values. */
typedef int (*knob_fn)(const layout *l);
static int knob_tp(const layout *l) { return l->tp; }
static int knob_pp(const layout *l) { return l->pp; }
static int knob_cp(const layout *l) { return l->cp; }
static int knob_ep(const layout *l) { return l->ep; }
static int knob_b(const layout *l) { return l->micro_batch; }
static int knob_sched(const layout *l) { return l->schedule * 100 + (l->schedule == TH_SCHED_INTERLEAVED ? l->vp : 0); }
static int knob_sp(const layout *l) { return l->sp; }
static int knob_rc(const layout *l) { return l->recompute; }

static void explain_knob(FILE *f, const plan_result *r, const char *name, knob_fn key) {
    int seen[256], n_seen = 0;
    fprintf(f, "  %-12s", name);
    for (int i = 0; i < r->n; i++) { /* sorted best first: the first of each value is its best */
        int k = key(&r->all[i].l), dup = 0;
        for (int j = 0; j < n_seen; j++) dup |= seen[j] == k;
        if (dup || n_seen == 256) continue;
        seen[n_seen++] = k;
    }
    /* in the knob's own order */
    for (int a = 0; a < n_seen; a++)
        for (int b = a + 1; b < n_seen; b++)
            if (seen[b] < seen[a]) { int x = seen[a]; seen[a] = seen[b]; seen[b] = x; }
    for (int j = 0; j < n_seen; j++)
        for (int i = 0; i < r->n; i++) {
            const estimate *e = &r->all[i];
            if (key(&e->l) != seen[j]) continue;
            char label[32];
            if (key == knob_sched && e->l.schedule == TH_SCHED_INTERLEAVED)
                snprintf(label, sizeof label, "interleaved v=%d", e->l.vp);
            else if (key == knob_sched) snprintf(label, sizeof label, "%s", th_schedule_names[e->l.schedule]);
            else if (key == knob_rc) snprintf(label, sizeof label, "%s", recompute_names[e->l.recompute]);
            else if (key == knob_sp) snprintf(label, sizeof label, "%s", e->l.sp ? "on" : "off");
            else snprintf(label, sizeof label, "%d", seen[j]);
            if (e->fits) fprintf(f, " | %s: %.2f s%s", label, e->t_step, i == 0 ? " (best)" : "");
            else fprintf(f, " | %s: needs %.1f GiB, %.1f over", label, e->mem_total / GiB, (e->mem_total - e->mem_limit) / GiB);
            break;
        }
    fprintf(f, "\n");
}

void plan_print_explain(FILE *f, const plan_result *r) {
    if (r->bounded) plan_print_bound(f, r);
    fprintf(f, "\nhow the best was reached: %d layouts estimated (every t dividing the GPUs and the heads, within a node "
               "unless --tp-across-nodes; every cp dividing the sequence into 2 cp chunks; every p; d the rest; every ep "
               "dividing the experts and cp x d (with SP t x cp x d: EP folded over TP); micro-batches of 1-32 sequences; each schedule; SP on and "
               "off; three recomputation modes); %d fit. For each knob, the best layout with that value (its step time, "
               "or how far the best of them is over the memory):\n", r->n, r->n_fit);
    explain_knob(f, r, "tp", knob_tp);
    explain_knob(f, r, "cp", knob_cp);
    explain_knob(f, r, "pp", knob_pp);
    explain_knob(f, r, "ep", knob_ep);
    explain_knob(f, r, "micro-batch", knob_b);
    explain_knob(f, r, "schedule", knob_sched);
    explain_knob(f, r, "sp", knob_sp);
    explain_knob(f, r, "recompute", knob_rc);
    if (r->n_fit) {
        const estimate *w = &r->all[0];
        fprintf(f, "  the winner's step: %.0f%% compute, %.0f%% TP, %.0f%% CP, %.0f%% EP, %.0f%% PP, %.0f%% bubble, %.0f%% DP, "
                   "%.0f%% optimizer\n",
                100 * w->t_compute / w->t_step, 100 * w->t_tp / w->t_step, 100 * w->t_cp / w->t_step,
                100 * w->t_ep / w->t_step, 100 * w->t_pp / w->t_step,
                100 * w->t_bubble / w->t_step, 100 * w->t_dp / w->t_step, 100 * w->t_optim / w->t_step);
    }
}

int plan_write_json(const char *path, const char *name, const th_model *m, const cluster *c, const training *tr,
                    const plan_result *r) {
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    th_params pc = th_param_counts(m);
    fprintf(f, "{\"model\":{\"name\":\"%s\",\"params\":%.0f,\"active_params\":%.0f,\"flops_per_token\":%.6g,\"experts\":%ld,\"layers\":%ld,\"d_model\":%ld,\"heads\":%ld,\"kv_heads\":%ld,"
               "\"ffn\":%ld,\"seq\":%ld,\"vocab\":%ld},\n",
            name, pc.total, pc.active, th_flops_per_token(m), m->experts, m->layers, m->d_model, m->heads, m->kv_heads, m->ffn, m->seq, m->vocab);
    fprintf(f, "\"cluster\":{\"name\":\"%s\",\"gpus\":%d,\"gpus_per_node\":%d,\"mem_gib\":%g,\"efficiency\":%g},\n", c->name,
            c->gpus, c->gpus_per_node, c->mem_gib, c->efficiency);
    fprintf(f, "\"training\":{\"global_batch\":%ld,\"precision\":\"%s\",\"zero_stage\":%d,\"ep_dispatch\":\"%s\","
               "\"recompute_modules\":\"%s\"},\n",
            tr->global_batch, tr->precision == PREC_BF16 ? "bf16" : "fp32", tr->zero_stage,
            tr->ep_per_node ? "per-node" : "per-choice",
            recompute_modules_text(tr->recompute_modules));
    fprintf(f, "\"search\":{\"bounded\":%s,\"valid_layouts\":%ld,\"costed_layouts\":%d,\"splits\":%ld,\"splits_costed\":%ld,"
               "\"work_over_cap\":%.4g},\n\"layouts\":[",
            r->bounded ? "true" : "false", r->layouts, r->n, r->splits, r->splits_costed, r->work / WORK_CAP);
    for (int i = 0; i < r->n; i++) {
        const estimate *e = &r->all[i];
        const layout *l = &e->l;
        char lt[160];
        fprintf(f, "%s\n{\"rank\":%d,\"winner\":%s,\"label\":\"%s\",\"tp\":%d,\"cp\":%d,\"pp\":%d,\"dp\":%d,\"ep\":%d,\"micro_batch\":%d,"
                   "\"micro_batches\":%d,\"schedule\":\"%s\",\"vp\":%d,\"sp\":%d,\"recompute\":\"%s\",\"fits\":%s,\"mem_bytes\":{",
                i ? "," : "", i + 1, i == 0 && e->fits ? "true" : "false", layout_text(l, lt, sizeof lt), l->tp, l->cp, l->pp,
                l->dp, l->ep, l->micro_batch, l->micro_batches, th_schedule_names[l->schedule], l->vp, l->sp,
                recompute_names[l->recompute], e->fits ? "true" : "false");
        for (int k = 0; k < MEM_NCAT; k++) fprintf(f, "%s\"%s\":%.0f", k ? "," : "", mem_category_names[k], e->mem[k]);
        fprintf(f, "},\"mem_total_bytes\":%.0f,\"mem_limit_bytes\":%.0f,\"step_s\":%.6g,\"compute_s\":%.6g,\"tp_s\":%.6g,"
                   "\"pp_s\":%.6g,\"bubble_s\":%.6g,\"dp_s\":%.6g,\"optimizer_s\":%.6g,\"cp_s\":%.6g,\"ep_s\":%.6g,\"tokens_per_s\":%.6g,\"mfu\":%.4f}",
                e->mem_total, e->mem_limit, e->t_step, e->t_compute, e->t_tp, e->t_pp, e->t_bubble, e->t_dp, e->t_optim,
                e->t_cp, e->t_ep, e->tokens_per_s, e->mfu);
    }
    fprintf(f, "\n]}\n");
    return fclose(f) == 0;
}
