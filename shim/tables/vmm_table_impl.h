/*
 * vmm_table_impl.h - what the VMM table's files share (vmm_table.c: the
 * table and its imports; vmm_ranges.c: reservations, chunks, access,
 * eviction). Private to the folder; the table's interface is vmm_table.h.
 */
#ifndef IPCC_VMM_TABLE_IMPL_H
#define IPCC_VMM_TABLE_IMPL_H

#include "vmm_table.h"

#define IPCC_VMM_MAX_ACCESS 8 /* devices whose access a chunk remembers */

struct ipcc_vmm_import {
    struct ipcc_vmm_id id;     /* id.fd: our kept dup */
    uint64_t handle;
    uint64_t refs;             /* the app's unreleased imports */
    uint64_t live_pins;        /* adopted chunks */
    uint64_t kept_pins;        /* kept chunks */
    uint64_t bytes;            /* known from the first map: 0 before */
    uint64_t last_ns;
    int counted;               /* in the idle gauges */
    uint64_t counted_bytes;
    int tagged;                /* tag: the export it came from (vmm_importer.c) */
    struct ipcc_vmm_import *next_found; /* found right after this one last time */
    unsigned char tag[IPCC_HANDLE_BYTES];
};

struct ipcc_vmm_grant {
    int dev;
    unsigned long long flags;
};

struct ipcc_vmm_chunk {
    uint64_t addr, size;
    struct ipcc_vmm_import *imp;       /* NULL: a handle not from our imports */
    int adopted;
    int naccess;               /* -1: more devices than we remember */
    struct ipcc_vmm_grant access[IPCC_VMM_MAX_ACCESS];
    /* What the app set since it mapped the chunk (its view: a kept chunk
     * mapped again keeps its real access, the app's new mapping has none);
     * nseen -1: unknown, the driver answers. */
    int nseen;
    struct ipcc_vmm_grant seen[IPCC_VMM_MAX_ACCESS];
};

struct ipcc_vmm_range {
    uint64_t addr, size;
    uint64_t key;                      /* what the app mapped since it got it (vmm_predict.c) */
    int idle;
    int blind;                         /* tracked only from a map into it: may hold mappings never seen */
    uint64_t last_ns;
    struct ipcc_vmm_chunk *chunks;     /* sorted by address */
    size_t n, cap;
};

struct ipcc_vmm_table {
    ipcc_vmm_cmp_fn cmp;
    ipcc_vmm_same_fn same;             /* NULL: cmp checks guesses too */
    struct ipcc_vmm_import **by_id, **by_handle;
    struct ipcc_vmm_import *last_found; /* the import found or recorded last */
    size_t nimports, capimports, caphandles;
    struct ipcc_vmm_range **res;
    size_t nres, capres;
    struct ipcc_vmm_predict predict;   /* which rebuild follows which */
    uint64_t *releasing;               /* dropped imports' handles until really released */
    size_t nreleasing, capreleasing;
    struct ipcc_vmm_gauges gauges;
};

IPCC_HIDDEN int ipcc_vmm_ops_push(struct ipcc_vmm_ops *o, enum ipcc_vmm_op op, uint64_t addr,
                                  uint64_t size, uint64_t handle, int fd);
IPCC_HIDDEN int ipcc_vmm_grow(void **arr, size_t *cap, size_t need, size_t elem);
IPCC_HIDDEN void ipcc_vmm_gauge_add(_Atomic uint64_t *g, int64_t n);
IPCC_HIDDEN void ipcc_vmm_account(struct ipcc_vmm_table *t, struct ipcc_vmm_import *m);
IPCC_HIDDEN struct ipcc_vmm_import *ipcc_vmm_import_of(const struct ipcc_vmm_table *t,
                                                       uint64_t handle);
IPCC_HIDDEN void ipcc_vmm_drop_import(struct ipcc_vmm_table *t, struct ipcc_vmm_import *m,
                                      struct ipcc_vmm_ops *ops);
IPCC_HIDDEN int ipcc_vmm_import_lone_idle(const struct ipcc_vmm_import *m);

#endif
