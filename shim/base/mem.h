/* mem.h - mem.c's interface: the tables' memory, never the program's allocator. */
#ifndef IPCC_MEM_H
#define IPCC_MEM_H

#include <stddef.h>

#include "common.h"

IPCC_HIDDEN void *ipcc_mem_alloc(size_t n);
IPCC_HIDDEN void *ipcc_mem_calloc(size_t n, size_t size);
IPCC_HIDDEN void *ipcc_mem_realloc(void *p, size_t n);
IPCC_HIDDEN void ipcc_mem_free(void *p);
IPCC_HIDDEN size_t ipcc_mem_mapped(void); /* bytes of pages held from the system */
IPCC_HIDDEN void ipcc_mem_hold(void); /* the fork handlers' */
IPCC_HIDDEN void ipcc_mem_release(void);
IPCC_HIDDEN void ipcc_mem_reset(void);
/* uthash's tables and buckets too: its users include this header first. */
#define uthash_malloc(sz) ipcc_mem_alloc(sz)
#define uthash_free(ptr, sz) ipcc_mem_free(ptr)

#endif
