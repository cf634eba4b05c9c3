/* keyset.h - keyset.c's interface: a small set of 64-byte keys (see there). */
#ifndef IPCC_KEYSET_H
#define IPCC_KEYSET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define IPCC_KEYSET_MAX 64
struct ipcc_keyset {
    unsigned char key[IPCC_KEYSET_MAX][IPCC_HANDLE_BYTES];
    _Atomic size_t n;
};
IPCC_HIDDEN int ipcc_keyset_add(struct ipcc_keyset *s, const void *key);
IPCC_HIDDEN int ipcc_keyset_remove(struct ipcc_keyset *s, const void *key);
IPCC_HIDDEN size_t ipcc_keyset_count(struct ipcc_keyset *s);
IPCC_HIDDEN size_t ipcc_keyset_copy(struct ipcc_keyset *s,
                                    unsigned char (*out)[IPCC_HANDLE_BYTES]);
IPCC_HIDDEN void ipcc_keyset_reset(struct ipcc_keyset *s);
typedef uint64_t (*ipcc_keyset_let_go_fn)(const unsigned char *key, int *in_use, void *arg);
IPCC_HIDDEN uint64_t ipcc_keyset_sweep(struct ipcc_keyset *s, ipcc_keyset_let_go_fn let_go,
                                       void *arg);

#endif
