/*
 * fmt.c - building text into a caller's buffer without stdio or malloc, so
 * that signal handlers and fork children may use it (the stats line, the
 * marker file, file names with a pid in them).
 */
#include <string.h>

#include "fmt.h"

/* Appends what fits; a cut is remembered in o->cut. */
void ipcc_out_str(struct ipcc_out *o, const char *s)
{
    size_t n = strlen(s);
    if (n > o->left) {
        n = o->left;
        o->cut = 1;
    }
    memcpy(o->p, s, n);
    o->p += n;
    o->left -= n;
}

void ipcc_out_u64(struct ipcc_out *o, uint64_t v)
{
    char digits[21];
    int i = (int)sizeof(digits) - 1;
    digits[i] = '\0';
    do {
        digits[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    ipcc_out_str(o, digits + i);
}

/* NUL-terminates; returns 0, or -1 if anything was cut. The buffer must have
 * had one byte more than o->left when the writer was set up. */
int ipcc_out_end(struct ipcc_out *o)
{
    *o->p = '\0';
    return o->cut ? -1 : 0;
}
