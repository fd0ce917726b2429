#include "jsonval.h"
#include "device.h" /* die */
#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *made(json_t *v) {
    if (!v) die("out of host memory building JSON");
    return v;
}

json_t *jsonval_number(double x) { return made(isfinite(x) ? json_real(x) : json_null()); }

json_t *jsonval_figure(double x) { return isfinite(x) && x == nearbyint(x) ? jsonval_integer(x) : jsonval_number(x); }

json_t *jsonval_integer(double x) {
    if (!isfinite(x) || fabs(x) > 9e18) return made(json_null());
    return made(json_integer((json_int_t)llround(x)));
}

static json_t *array_of(const double *x, int n, json_t *(*value)(double)) {
    json_t *a = made(json_array());
    for (int i = 0; i < n; i++)
        if (json_array_append_new(a, value(x[i])) != 0) die("out of host memory building JSON");
    return a;
}
json_t *jsonval_numbers(const double *x, int n) { return array_of(x, n, jsonval_number); }
json_t *jsonval_integers(const double *x, int n) { return array_of(x, n, jsonval_integer); }
json_t *jsonval_figures(const double *x, int n) { return array_of(x, n, jsonval_figure); }

json_t *jsonval_text(const char *s) {
    if (!s) return made(json_null());
    json_t *v = json_string(s);
    if (v) return v;
    char *ascii = strdup(s); /* not UTF-8: keep the ASCII, mark the rest */
    if (!ascii) die("out of host memory building JSON");
    for (char *p = ascii; *p; p++)
        if ((unsigned char)*p >= 0x80) *p = '?';
    v = made(json_string(ascii));
    free(ascii);
    return v;
}

void jsonval_append(json_t *array, json_t *value) {
    if (json_array_append_new(array, value) != 0) die("out of host memory building JSON");
}

void jsonval_set(json_t *object, const char *key, json_t *value) {
    if (json_object_set_new(object, key, value) != 0) die("cannot set JSON member \"%s\"", key);
}

const char *jsonval_shown(json_t *v, char *buf, size_t len) {
    char *text = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    snprintf(buf, len, "%s", text ? text : "?");
    if (text && strlen(text) >= len && len > 4) strcpy(buf + len - 4, "...");
    free(text);
    return buf;
}
