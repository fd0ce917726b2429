#include "textbuf.h"
#include "device.h" /* die */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void textbuf_printf(textbuf *b, const char *fmt, ...) {
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) die("textbuf_printf: formatting failed");
        if (b->s && (size_t)k < room) {
            b->len += (size_t)k;
            return;
        }
        b->cap = 2 * b->cap + (size_t)k + 64;
        b->s = realloc(b->s, b->cap);
        if (!b->s) die("out of host memory");
        b->s[b->len] = 0;
    }
}

char *text_format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) die("out of host memory");
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

void textbuf_json_string(textbuf *b, const char *s) {
    textbuf_printf(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') textbuf_printf(b, "\\%c", c);
        else if (c < 0x20) textbuf_printf(b, "\\u%04x", c);
        else textbuf_printf(b, "%c", c);
    }
    textbuf_printf(b, "\"");
}
