/* A growing string for the run record's JSON members and the console tables.
 * (lab03's stage.c has a private twin; common/ could offer one to every lab.) */
#ifndef LAB06_TEXTBUF_H
#define LAB06_TEXTBUF_H
#include <stddef.h>

typedef struct textbuf {
    char *s;      /* always NUL-terminated once anything was added; malloc'd */
    size_t len, cap;
} textbuf;

/* Append printf-style text (aborts the job when out of memory). */
void textbuf_printf(textbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s as a JSON string, quotes and escapes included. */
void textbuf_json_string(textbuf *b, const char *s);

#endif
