/* fmt.h - fmt.c's interface: text without stdio, for signal handlers and fork children. */
#ifndef IPCC_FMT_H
#define IPCC_FMT_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Writes at p, at most left bytes; cut is set when something did not fit. */
struct ipcc_out {
    char *p;
    size_t left;
    int cut;
};
#define IPCC_OUT(buf) { (buf), sizeof(buf) - 1, 0 } /* room for the NUL */
IPCC_HIDDEN void ipcc_out_str(struct ipcc_out *o, const char *s);
IPCC_HIDDEN void ipcc_out_u64(struct ipcc_out *o, uint64_t v);
IPCC_HIDDEN int ipcc_out_end(struct ipcc_out *o);

#endif
