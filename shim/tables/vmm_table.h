/*
 * vmm_table.h - the VMM kind's table (vmm_table.c: the table and its
 * imports; vmm_ranges.c: reservations, chunks, access, eviction) and the
 * rebuild predictor (vmm_predict.c): pure C, no CUDA, no locking;
 * vmm_table_impl.h is their private part.
 */
#ifndef IPCC_VMM_TABLE_H
#define IPCC_VMM_TABLE_H

#include "base.h"

/* ---- vmm_predict.c: which rebuild follows which (pure C, no CUDA) ------- */

struct ipcc_vmm_successor;
struct ipcc_vmm_predict {
    struct ipcc_vmm_successor *slots;
    size_t cap, n;
};
/* One thread's rebuilds: the last one's key (0: none yet), how many times
 * in a row it came, and the key before that run. */
struct ipcc_vmm_history {
    uint64_t before, last;
    uint64_t run;
};
IPCC_HIDDEN uint64_t ipcc_vmm_rebuild_key(uint64_t key, uint64_t offset, uint64_t handle);
IPCC_HIDDEN void ipcc_vmm_predict_learn(struct ipcc_vmm_predict *p, struct ipcc_vmm_history *h,
                                        uint64_t next);
IPCC_HIDDEN uint64_t ipcc_vmm_predict_next(const struct ipcc_vmm_predict *p,
                                           const struct ipcc_vmm_history *h);
IPCC_HIDDEN void ipcc_vmm_predict_clear(struct ipcc_vmm_predict *p);

/* ---- vmm_table.c, vmm_ranges.c: the table (pure C, no CUDA) ----------- */

/* What identifies one export: the open file description behind a POSIX fd
 * (compared through a dup we keep), or the bytes of a fabric handle. */
struct ipcc_vmm_id {
    int fabric;
    int fd;
    unsigned char bytes[IPCC_HANDLE_BYTES];
};

/* Orders two fds' open file descriptions as kcmp(KCMP_FILE) does:
 * 0 same, -1 / 1 less / greater, or one of these. */
#define IPCC_VMM_UNORDERED 2   /* different, but no order to be had */
#define IPCC_VMM_CMP_FAILED (-2)
typedef int (*ipcc_vmm_cmp_fn)(int fd_a, int fd_b);

/* Whether two fds name one open file description: 1 yes, 0 no, -1 cannot
 * tell here (the comparator answers then). Cheaper than ordering them: what
 * checks a guess. */
typedef int (*ipcc_vmm_same_fn)(int fd_a, int fd_b);

/* Real driver work a table decision needs, run in order outside the lock. */
enum ipcc_vmm_op { IPCC_VMM_UNMAP, IPCC_VMM_FREE, IPCC_VMM_RELEASE };
struct ipcc_vmm_victim {
    enum ipcc_vmm_op op;
    uint64_t addr, size;  /* UNMAP, FREE */
    uint64_t handle;      /* RELEASE */
    int fd;               /* RELEASE: the kept dup to close; -1 none */
};
struct ipcc_vmm_ops {
    struct ipcc_vmm_victim *v;
    size_t n, cap, lost;  /* lost: out of memory, not queued */
};

/* What a call the table looked at needs. */
enum ipcc_vmm_verdict {
    IPCC_VMM_PASS,     /* run the ops, then the real call */
    IPCC_VMM_DONE,     /* answered: CUDA_SUCCESS, nothing for the driver */
    IPCC_VMM_INVALID,  /* answered: CUDA_ERROR_INVALID_VALUE (a range the app freed) */
};

struct ipcc_vmm_access {
    int dev;
    unsigned long long flags;
};

/* Read by the signal handler, so atomic. Idle: imports the app neither holds
 * nor has mapped (bytes known from their first map). */
struct ipcc_vmm_gauges {
    _Atomic uint64_t idle_entries;
    _Atomic uint64_t idle_bytes;
    _Atomic uint64_t idle_reservations;
    _Atomic uint64_t kept_fds; /* dups kept: imports' and those claimed for one */
};

struct ipcc_vmm_table;

IPCC_HIDDEN struct ipcc_vmm_table *ipcc_vmm_table_create(ipcc_vmm_cmp_fn cmp, ipcc_vmm_same_fn same);
IPCC_HIDDEN void ipcc_vmm_table_clear(struct ipcc_vmm_table *t, void (*close_fd)(int));
IPCC_HIDDEN void ipcc_vmm_table_destroy(struct ipcc_vmm_table *t, void (*close_fd)(int));
IPCC_HIDDEN const struct ipcc_vmm_gauges *ipcc_vmm_table_gauges(const struct ipcc_vmm_table *t);
IPCC_HIDDEN size_t ipcc_vmm_table_imports(const struct ipcc_vmm_table *t);
IPCC_HIDDEN int ipcc_vmm_fd_claim(struct ipcc_vmm_table *t, size_t bound);
IPCC_HIDDEN void ipcc_vmm_fd_unclaim(struct ipcc_vmm_table *t);
IPCC_HIDDEN size_t ipcc_vmm_table_fds(const struct ipcc_vmm_table *t);
IPCC_HIDDEN int ipcc_vmm_import_find(struct ipcc_vmm_table *t, const struct ipcc_vmm_id *id,
                                     uint64_t now_ns, uint64_t *handle);
IPCC_HIDDEN int ipcc_vmm_import_insert(struct ipcc_vmm_table *t, const struct ipcc_vmm_id *id,
                                       uint64_t handle, uint64_t now_ns, uint64_t *cached);
IPCC_HIDDEN enum ipcc_release_result ipcc_vmm_release(struct ipcc_vmm_table *t, uint64_t handle,
                                                      uint64_t now_ns);
IPCC_HIDDEN int ipcc_vmm_import_released(const struct ipcc_vmm_table *t, uint64_t handle);
IPCC_HIDDEN void ipcc_vmm_release_done(struct ipcc_vmm_table *t, uint64_t handle);
IPCC_HIDDEN int ipcc_vmm_reserve_track(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size);
IPCC_HIDDEN int ipcc_vmm_reserve_reuse(struct ipcc_vmm_table *t, uint64_t size, uint64_t align,
                                       const uint64_t *handles, size_t n, uint64_t now_ns,
                                       uint64_t *addr);
IPCC_HIDDEN void ipcc_vmm_rebuild_done(struct ipcc_vmm_table *t, struct ipcc_vmm_history *h,
                                       uint64_t key);
IPCC_HIDDEN int ipcc_vmm_reserve_next(struct ipcc_vmm_table *t, uint64_t size, uint64_t align,
                                      const struct ipcc_vmm_history *h, uint64_t now_ns,
                                      uint64_t *addr);
IPCC_HIDDEN int ipcc_vmm_reserve_mapped(struct ipcc_vmm_table *t, uint64_t raddr,
                                        uint64_t rsize, uint64_t addr, uint64_t handle);
IPCC_HIDDEN enum ipcc_vmm_verdict ipcc_vmm_map(struct ipcc_vmm_table *t, uint64_t addr,
                                               uint64_t size, uint64_t handle, uint64_t now_ns,
                                               struct ipcc_vmm_ops *ops);
IPCC_HIDDEN void ipcc_vmm_map_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                   uint64_t handle);
IPCC_HIDDEN enum ipcc_vmm_verdict ipcc_vmm_unmap(struct ipcc_vmm_table *t, uint64_t addr,
                                                 uint64_t size, uint64_t now_ns,
                                                 struct ipcc_vmm_ops *ops);
IPCC_HIDDEN void ipcc_vmm_unmap_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size);
IPCC_HIDDEN enum ipcc_vmm_verdict ipcc_vmm_set_access(struct ipcc_vmm_table *t, uint64_t addr,
                                                      uint64_t size,
                                                      const struct ipcc_vmm_access *acc,
                                                      size_t n, struct ipcc_vmm_ops *ops);
IPCC_HIDDEN void ipcc_vmm_set_access_done(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                          const struct ipcc_vmm_access *acc, size_t n);
IPCC_HIDDEN int ipcc_vmm_access_seen(const struct ipcc_vmm_table *t, uint64_t addr, int dev,
                                     unsigned long long *flags);
IPCC_HIDDEN enum ipcc_vmm_verdict ipcc_vmm_give_way(struct ipcc_vmm_table *t, uint64_t addr,
                                                    uint64_t size, struct ipcc_vmm_ops *ops);
IPCC_HIDDEN enum ipcc_vmm_verdict ipcc_vmm_free(struct ipcc_vmm_table *t, uint64_t addr,
                                                uint64_t size, uint64_t now_ns,
                                                struct ipcc_vmm_ops *ops);
IPCC_HIDDEN void ipcc_vmm_clear_range(struct ipcc_vmm_table *t, uint64_t addr, uint64_t size,
                                      struct ipcc_vmm_ops *ops);
IPCC_HIDDEN int ipcc_vmm_oldest_idle(const struct ipcc_vmm_table *t, uint64_t *ns);
IPCC_HIDDEN int ipcc_vmm_evict_one(struct ipcc_vmm_table *t, struct ipcc_vmm_ops *ops);

/* vmm_table.c, vmm_ranges.c: imports known to come from the export tag. */
IPCC_HIDDEN int ipcc_vmm_import_tag(struct ipcc_vmm_table *t, uint64_t handle, const void *tag);
IPCC_HIDDEN size_t ipcc_vmm_take_idle_by_tag(struct ipcc_vmm_table *t, const void *tag,
                                             struct ipcc_vmm_ops *ops, size_t *live,
                                             uint64_t *live_bytes);

#endif
