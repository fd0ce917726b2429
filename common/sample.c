/* --sample: generation from the whole model on rank 0 (sample.h). */
#include "sample.h"
#include "device.h"
#include "jsonval.h"
#include "mem.h"
#include "model.h"
#include "precision.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLE_RUNS 2 /* before and after training */
static int n_runs, run_steps[SAMPLE_RUNS];
static char *run_texts[SAMPLE_RUNS], *prompt_text;

/* Bytes as a student can read them and JSON can carry (UTF-8): printable ASCII as is,
 * a backslash doubled, newline and tab as \n and \t, any other byte as \xNN. */
static char *escaped(const unsigned char *s, int n) {
    char *out = malloc(4 * (size_t)n + 1), *p = out;
    if (!out) die("out of host memory");
    for (int i = 0; i < n; i++) {
        if (s[i] == '\\') p += sprintf(p, "\\\\");
        else if (s[i] == '\n') p += sprintf(p, "\\n");
        else if (s[i] == '\t') p += sprintf(p, "\\t");
        else if (s[i] >= 32 && s[i] < 127) *p++ = (char)s[i];
        else p += sprintf(p, "\\x%02x", s[i]);
    }
    *p = 0;
    return out;
}

/* splitmix64: a small, seeded generator, the same stream on every machine */
static double uniform01(unsigned long long *state) {
    unsigned long long z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0; /* [0, 1) */
}

void sample_generate(const gpt_config *cfg, const float *weights, const unsigned char *prompt, int len, int n,
                     double temperature, unsigned long long seed, unsigned char *out) {
    gpt_config one = *cfg;
    one.recompute = RECOMPUTE_NONE; /* nothing goes backward */
    gpt_layout g;
    gpt_layout_init(&g, &one);
    const int T = one.seq, V = one.vocab;
    void *params = mem_alloc((size_t)g.total * value_bytes(), MEM_PARAMS);
    float *master = master_alloc(params, g.total);
    mem_to_device(master, weights, (size_t)g.total * sizeof(float));
    params_from_master(params, master, g.total); /* the values lab01's forward reads */
    gpt_acts acts;
    gpt_acts_alloc(&acts, &g, 0, one.layers, 1);
    int *tokens = calloc((size_t)T, sizeof(int)), *context = malloc(sizeof(int) * (size_t)(len + n + 1));
    unsigned char *logits_raw = malloc((size_t)T * V * value_bytes());
    double *p = malloc(sizeof(double) * (size_t)V);
    if (!tokens || !context || !logits_raw || !p) die("out of host memory");
    for (int i = 0; i < len; i++) context[i] = prompt[i];
    mem_to_device(acts.targets, tokens, sizeof(int) * (size_t)T); /* the loss is not read */
    for (int k = 0; k < n; k++) {
        /* the last T bytes of the text so far (a byte when there is none: the model needs one position) */
        int have = len + k, w = have < T ? have : T, first = have - w;
        if (w == 0) { context[0] = '\n'; w = have = 1; first = 0; }
        memset(tokens, 0, sizeof(int) * (size_t)T); /* causal: positions after w - 1 do not change it */
        for (int t = 0; t < w; t++) tokens[t] = context[first + t];
        mem_to_device(acts.tokens, tokens, sizeof(int) * (size_t)T);
        gpt_forward(&g, params, &acts);
        mem_to_host(logits_raw, acts.logits, (size_t)T * V * value_bytes());
        double best = -INFINITY;
        int pick = 0;
        for (int v = 0; v < V; v++) {
            long at = (long)(w - 1) * V + v;
            p[v] = g_precision == PREC_BF16 ? float_from_bf16(((uint16_t *)logits_raw)[at])
                                            : ((float *)logits_raw)[at];
            if (p[v] > best) { best = p[v]; pick = v; } /* greedy: the first of the largest */
        }
        if (temperature > 0) {
            double sum = 0;
            for (int v = 0; v < V; v++) sum += p[v] = exp((p[v] - best) / temperature);
            double u = uniform01(&seed) * sum, c = 0;
            for (pick = 0; pick < V - 1; pick++)
                if ((c += p[pick]) > u) break;
        }
        context[have] = pick;
        out[k] = (unsigned char)pick;
    }
    free(tokens); free(context); free(logits_raw); free(p);
    gpt_acts_free(&acts);
    master_free(master, params);
    mem_free(params);
}

void sample_print(run_ctx *ctx, ckpt_view *v, int step) {
    gpt_layout g;
    gpt_layout_init(&g, &ctx->model);
    float *weights = ckpt_gather_params(v, g.total);
    if (ctx->rank != 0) return;
    const run_options *o = &ctx->opt;
    const unsigned char *prompt = (const unsigned char *)o->prompt;
    int len = o->prompt ? (int)strlen(o->prompt) : 0;
    if (!o->prompt) { /* the first line of the training data */
        prompt = ctx->data.bytes;
        while (len < ctx->data.n && len < 200 && prompt[len] != '\n') len++;
    }
    unsigned char *out = malloc((size_t)o->sample + 1);
    if (!out) die("out of host memory");
    size_t peaks[MEM_NCAT + 1];
    mem_peaks_get(peaks);
    sample_generate(&ctx->model, weights, prompt, len, o->sample, o->temperature, (unsigned long long)o->seed, out);
    mem_peaks_set(peaks);
    free(weights);
    char *p = escaped(prompt, len), *text = escaped(out, o->sample);
    char how[48];
    if (o->temperature > 0) snprintf(how, sizeof how, "temperature %g, seed %d", o->temperature, o->seed);
    else snprintf(how, sizeof how, "greedy");
    printf("sample after %d step%s (%s, %d bytes after the prompt \"%s\"): %s\n", step, step == 1 ? "" : "s", how,
           o->sample, p, text);
    fflush(stdout);
    free(out);
    if (n_runs < SAMPLE_RUNS) {
        run_steps[n_runs] = step;
        run_texts[n_runs++] = text;
    } else free(text);
    free(prompt_text);
    prompt_text = p;
}

json_t *sample_record(void) {
    json_t *r = json_object(), *steps = json_array(), *texts = json_array();
    if (!r || !steps || !texts) die("out of host memory");
    for (int i = 0; i < n_runs; i++) {
        jsonval_append(steps, json_integer(run_steps[i]));
        jsonval_append(texts, jsonval_text(run_texts[i]));
    }
    jsonval_set(r, "prompt", jsonval_text(prompt_text));
    jsonval_set(r, "steps", steps);
    jsonval_set(r, "texts", texts);
    return r;
}
