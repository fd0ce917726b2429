/* JSON values from the labs' C values, through jansson (the run record, the
 * Chrome trace and checkpoint headers are all written and read with it).
 *
 * jansson refuses what JSON cannot hold: json_real(NaN) and json_string() of
 * bytes that are not UTF-8 return NULL. These helpers turn such values into
 * what JSON can say (null; '?' for the bad bytes), so a record is always valid
 * JSON, and abort the job (die) only when memory runs out. */
#ifndef PL_JSONVAL_H
#define PL_JSONVAL_H
#include <jansson.h>

/* A real, or null when x is NaN or infinite. */
json_t *jsonval_number(double x);
/* A figure as "%g" prints it: a whole number as an integer (byte counts,
 * calls, a flag's 0), anything else a real; null when not finite. */
json_t *jsonval_figure(double x);
/* x rounded to an integer (byte counts kept in doubles), or null when not finite. */
json_t *jsonval_integer(double x);
/* [x0, x1, ...] with jsonval_number, jsonval_integer or jsonval_figure. */
json_t *jsonval_numbers(const double *x, int n);
json_t *jsonval_integers(const double *x, int n);
json_t *jsonval_figures(const double *x, int n);
/* A string: s itself when it is UTF-8 (file names usually are), else a copy with
 * every byte >= 0x80 as '?'; NULL s gives null. */
json_t *jsonval_text(const char *s);
/* array += value (the reference to value is taken). */
void jsonval_append(json_t *array, json_t *value);
/* object[key] = value (the reference to value is taken). */
void jsonval_set(json_t *object, const char *key, json_t *value);
/* A value as a message quotes it: its JSON, cut short with "..." to fit buf. */
const char *jsonval_shown(json_t *v, char *buf, size_t len);

#endif
