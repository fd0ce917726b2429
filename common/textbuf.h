/* A growing string, for the run record's JSON members, checkpoint headers and
 * console tables. Start with `textbuf b = {0};`, free(b.s) when done. */
#ifndef PL_TEXTBUF_H
#define PL_TEXTBUF_H
#include <stddef.h>

typedef struct textbuf {
    char *s;      /* always NUL-terminated once anything was added; malloc'd */
    size_t len, cap;
} textbuf;

/* Append printf-style text (aborts the job when out of memory). */
void textbuf_printf(textbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A malloc'd string, printf-style (aborts the job when out of memory). */
char *text_format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Append s as a JSON string, quotes and escapes included. */
void textbuf_json_string(textbuf *b, const char *s);

#endif
