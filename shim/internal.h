/*
 * internal.h - declarations shared between ipccache's source files.
 *
 * Nothing here is exported: the library is built with -fvisibility=hidden and
 * shim/ipccache.map exports only the intercepted driver names and dlsym.
 */
#ifndef IPCC_INTERNAL_H
#define IPCC_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define IPCC_VERSION "0.1.0"
#define IPCC_HIDDEN __attribute__((visibility("hidden")))
#define IPCC_EXPORT __attribute__((visibility("default")))

/* The driver's status codes we produce ourselves (the rest are passed back). */
#define IPCC_CUDA_SUCCESS 0
#define IPCC_CUDA_ERROR_INVALID_VALUE 1

/* ---- cache.c: the table (pure C, no CUDA, no I/O, no locking) ---------- */

#define IPCC_HANDLE_BYTES 64

/* Identity of one mapping as the driver sees it. Zero-filled before use:
 * uthash hashes the raw bytes, padding included. */
struct ipcc_key {
    uint64_t ctx_id;
    uint32_t flags;
    uint32_t zero_pad;
    unsigned char handle[IPCC_HANDLE_BYTES];
    uint32_t hash;      /* of the bytes above, computed outside the lock */
    uint32_t zero_pad2;
};

struct ipcc_entry;

/* What release() found. */
enum ipcc_release_result {
    IPCC_RELEASE_NOT_FOUND,  /* not ours: the driver must answer */
    IPCC_RELEASE_OK,         /* one reference dropped */
    IPCC_RELEASE_PAST_ZERO,  /* was idle: removed; the cache's reference must be
                              * closed and the close passed to the driver */
};

/* An entry removed from the table whose mapping the caller must really close
 * (eviction, exit) or forget (context gone). */
struct ipcc_victim {
    void *ctx;
    uint64_t ctx_id;
    uint64_t dptr;
    uint64_t bytes;
};

struct ipcc_cache;

/* keyset.c: a small set of 64-byte keys (see there). */
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

IPCC_HIDDEN struct ipcc_cache *ipcc_cache_create(void);
IPCC_HIDDEN void ipcc_cache_destroy(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_cache_clear(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_key_init(struct ipcc_key *k, uint64_t ctx_id,
                               const void *handle, uint32_t flags);
IPCC_HIDDEN int ipcc_cache_acquire(struct ipcc_cache *c, const struct ipcc_key *k,
                                   uint64_t *dptr);
IPCC_HIDDEN int ipcc_cache_recent_is(uint64_t ctx_id, const void *handle, uint32_t flags);
IPCC_HIDDEN int ipcc_cache_acquire_recent(struct ipcc_cache *c, uint64_t *dptr);
/* Entries lent to a thread (cache.c): its hits and closes of it take no lock. */
struct ipcc_cache_totals {
    uint64_t live, idle, idle_bytes;
};
IPCC_HIDDEN int ipcc_cache_recent_lendable(struct ipcc_cache *c);
IPCC_HIDDEN int ipcc_cache_lend_recent(struct ipcc_cache *c, uint64_t now_ns,
                                       uint64_t room_entries, uint64_t room_bytes);
IPCC_HIDDEN int ipcc_cache_open_lent(struct ipcc_cache *c, uint64_t ctx_id, const void *handle,
                                     uint32_t flags, uint64_t *dptr);
IPCC_HIDDEN int ipcc_cache_close_lent(struct ipcc_cache *c, uint64_t ctx_id, uint64_t dptr,
                                      uint64_t now_ns);
IPCC_HIDDEN void ipcc_cache_return_lent(struct ipcc_cache *c, int give_up);
IPCC_HIDDEN void ipcc_cache_lent_totals(uint64_t *entries, uint64_t *bytes);
IPCC_HIDDEN void ipcc_cache_gauges_now(const struct ipcc_cache *c, struct ipcc_cache_totals *out);
IPCC_HIDDEN void ipcc_cache_lent_fork_child(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_cache_recall_all(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_cache_lent_floor(uint64_t now_ns);
IPCC_HIDDEN int ipcc_cache_has_lent(void);
IPCC_HIDDEN int ipcc_cache_insert(struct ipcc_cache *c, const struct ipcc_key *k,
                                  void *ctx, uint64_t dptr, uint64_t bytes,
                                  uint64_t now_ns, uint64_t *cached_dptr);
IPCC_HIDDEN enum ipcc_release_result ipcc_cache_release(struct ipcc_cache *c,
                                                        uint64_t ctx_id,
                                                        uint64_t dptr, uint64_t now_ns);
IPCC_HIDDEN int ipcc_cache_oldest_idle(const struct ipcc_cache *c, uint64_t *ns);
IPCC_HIDDEN size_t ipcc_cache_evict(struct ipcc_cache *c, uint64_t max_idle_bytes,
                                    uint64_t max_idle_entries,
                                    struct ipcc_victim *out, size_t cap);
IPCC_HIDDEN int ipcc_cache_over_caps(const struct ipcc_cache *c, uint64_t max_bytes,
                                     uint64_t max_entries);
IPCC_HIDDEN size_t ipcc_cache_evict_other_contexts(struct ipcc_cache *c, uint64_t keep_ctx_id,
                                                   struct ipcc_victim *out, size_t cap);
IPCC_HIDDEN size_t ipcc_cache_drop_ctx(struct ipcc_cache *c, uint64_t ctx_id,
                                       struct ipcc_victim *out, size_t cap);
IPCC_HIDDEN size_t ipcc_cache_contexts(struct ipcc_cache *c, void **ctxs,
                                       uint64_t *ids, size_t cap);
IPCC_HIDDEN size_t ipcc_cache_count(const struct ipcc_cache *c);

/* Totals the cache keeps; read by the signal handler, so atomic. */
struct ipcc_cache_gauges {
    _Atomic uint64_t live;
    _Atomic uint64_t idle;
    _Atomic uint64_t idle_bytes;
};
IPCC_HIDDEN const struct ipcc_cache_gauges *ipcc_cache_gauges(const struct ipcc_cache *c);

/* A few entries mirrored into fixed slots so the signal handler can list them
 * without taking the lock. Fields may be momentarily inconsistent. */
#define IPCC_TOP_SLOTS 16
struct ipcc_top_slot {
    _Atomic int used;
    _Atomic uint64_t ctx_id;
    _Atomic uint64_t hits;
    _Atomic uint64_t refs;
    _Atomic uint64_t bytes;
    _Atomic uint64_t created_ns;
} __attribute__((aligned(64))); /* a line each: threads hitting two entries do not share one */
IPCC_HIDDEN const struct ipcc_top_slot *ipcc_cache_top(const struct ipcc_cache *c);

/* ---- vmm_imports.c, vmm_ranges.c: the VMM path's table (pure C, no CUDA) -- */

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
};

struct ipcc_vmm_table;

IPCC_HIDDEN struct ipcc_vmm_table *ipcc_vmm_table_create(ipcc_vmm_cmp_fn cmp, ipcc_vmm_same_fn same);
IPCC_HIDDEN void ipcc_vmm_table_clear(struct ipcc_vmm_table *t, void (*close_fd)(int));
IPCC_HIDDEN void ipcc_vmm_table_destroy(struct ipcc_vmm_table *t, void (*close_fd)(int));
IPCC_HIDDEN const struct ipcc_vmm_gauges *ipcc_vmm_table_gauges(const struct ipcc_vmm_table *t);
IPCC_HIDDEN size_t ipcc_vmm_table_imports(const struct ipcc_vmm_table *t);
IPCC_HIDDEN int ipcc_vmm_ops_push(struct ipcc_vmm_ops *o, enum ipcc_vmm_op op, uint64_t addr,
                                  uint64_t size, uint64_t handle, int fd);
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
IPCC_HIDDEN int ipcc_vmm_reserve_next(struct ipcc_vmm_table *t, uint64_t size, uint64_t align,
                                      const uint64_t *handles, size_t n, uint64_t after,
                                      uint64_t now_ns, uint64_t *addr);
IPCC_HIDDEN uint64_t ipcc_vmm_reserve_mapped(struct ipcc_vmm_table *t, uint64_t raddr,
                                             uint64_t rsize, uint64_t addr, uint64_t handle,
                                             uint64_t after);
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

/* ---- vmm.c: the VMM sharing path through the cache ---------------------- */

/* Each takes the driver function's own arguments (handles and pointers as
 * 64-bit integers) and returns its CUresult. */
IPCC_HIDDEN int ipcc_vmm_import_call(uint64_t *handle, void *os_handle, int type);
IPCC_HIDDEN int ipcc_vmm_reserve_call(uint64_t *ptr, size_t size, size_t align, uint64_t addr,
                                      unsigned long long flags);
IPCC_HIDDEN int ipcc_vmm_free_call(uint64_t ptr, size_t size);
IPCC_HIDDEN int ipcc_vmm_map_call(uint64_t ptr, size_t size, size_t offset, uint64_t handle,
                                  unsigned long long flags);
IPCC_HIDDEN int ipcc_vmm_unmap_call(uint64_t ptr, size_t size);
IPCC_HIDDEN int ipcc_vmm_set_access_call(uint64_t ptr, size_t size, const void *desc,
                                         size_t count);
IPCC_HIDDEN int ipcc_vmm_get_access_call(unsigned long long *flags, const void *location,
                                         uint64_t ptr);
IPCC_HIDDEN int ipcc_vmm_release_call(uint64_t handle);
IPCC_HIDDEN void ipcc_vmm_fork_child(void);  /* forgets this thread's recent imports */

/* ---- vmm_identity.c: what identifies an export -------------------------- */

IPCC_HIDDEN int ipcc_vmm_kcmp(int fd_a, int fd_b);  /* an ipcc_vmm_cmp_fn */
IPCC_HIDDEN int ipcc_vmm_same_file(int fd_a, int fd_b); /* an ipcc_vmm_same_fn */
IPCC_HIDDEN int ipcc_vmm_id_of(struct ipcc_vmm_id *id, void *os_handle, int type);
IPCC_HIDDEN int ipcc_vmm_identity_works(const struct ipcc_vmm_id *id);
IPCC_HIDDEN void ipcc_vmm_identity_fork_child(void); /* forgets the pid kcmp uses */
IPCC_HIDDEN int32_t ipcc_vmm_self_pid(void);         /* getpid, asked once per process */

/* ---- vmm_evict.c: really releasing what the VMM table gave up ---------- */

IPCC_HIDDEN void ipcc_vmm_run_ops(struct ipcc_vmm_ops *ops, int evicted);

/* ---- tables.c: the layer below both kinds; the one idle budget ----------- */

IPCC_HIDDEN int ipcc_tables_start(void);
IPCC_HIDDEN struct ipcc_vmm_table *ipcc_tables_vmm_start(void);
IPCC_HIDDEN struct ipcc_cache *ipcc_table(void);          /* legacy; NULL before start */
IPCC_HIDDEN struct ipcc_vmm_table *ipcc_vmm_table(void);  /* NULL until an import */
IPCC_HIDDEN void ipcc_tables_fork_child(void);

/* Both kinds' gauges, read at one moment (fields may be momentarily
 * inconsistent). idle and idle_bytes count both kinds; vmm_* the VMM part. */
struct ipcc_tables_gauges {
    uint64_t live, idle, idle_bytes, vmm_idle, vmm_idle_bytes;
};
IPCC_HIDDEN void ipcc_tables_gauges(struct ipcc_tables_gauges *out);
IPCC_HIDDEN const struct ipcc_top_slot *ipcc_tables_top(void);

/* What an eviction keeps to: the caps, or nothing at all (all). */
struct ipcc_budget {
    uint64_t max_bytes, max_entries;
    int all;
};
IPCC_HIDDEN int ipcc_tables_over_budget(uint64_t max_bytes, uint64_t max_entries);
IPCC_HIDDEN void ipcc_tables_room(uint64_t max_bytes, uint64_t max_entries, uint64_t *room_bytes,
                                  uint64_t *room_entries);
IPCC_HIDDEN size_t ipcc_tables_take_idle(const struct ipcc_budget *b, struct ipcc_victim *out,
                                         size_t cap, size_t *nout, struct ipcc_vmm_ops *ops);

/* ---- fmt.c: text without stdio, for signal handlers and fork children -- */

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

/* ---- config.c ------------------------------------------------------------ */

enum ipcc_log_level { IPCC_LOG_ERROR, IPCC_LOG_WARN, IPCC_LOG_INFO, IPCC_LOG_DEBUG };

struct ipcc_config {
    int disabled;
    int vmm;                 /* cache the VMM path too (IPCCACHE_VMM) */
    uint64_t max_idle_bytes;
    uint64_t max_idle_entries;
    enum ipcc_log_level log_level;
    int stats_signal;        /* 0: no handler */
    int stats_signal_explicit; /* set in the environment: may replace SIG_IGN */
    int stats_at_exit;
    int strict;
    char stats_file[512];    /* as written, %p not expanded; empty: none */
    char stats_dir[256];     /* empty: the per-user directory (userdir.c) */
    uint64_t release_wait_ms; /* an exporter's free waits this long for importers */
};

IPCC_HIDDEN extern struct ipcc_config ipcc_config;
IPCC_HIDDEN void ipcc_config_load(void);
IPCC_HIDDEN int ipcc_config_disabled_early(void);
IPCC_HIDDEN int ipcc_parse_bool(const char *s, int *out);
IPCC_HIDDEN int ipcc_parse_size(const char *s, uint64_t *out);
IPCC_HIDDEN int ipcc_parse_count(const char *s, uint64_t *out);
IPCC_HIDDEN int ipcc_parse_signal(const char *s, int *out);
IPCC_HIDDEN int ipcc_parse_log_level(const char *s, enum ipcc_log_level *out);
IPCC_HIDDEN int ipcc_config_stats_path(const char *pattern, long pid, char *out, size_t cap);

/* ---- userdir.c: the per-user directory, and files opened safely -------- */

struct stat;
IPCC_HIDDEN int ipcc_fstat(int fd, struct stat *st);
IPCC_HIDDEN int ipcc_userdir_open(void);
IPCC_HIDDEN int ipcc_userdir_path(char *out, size_t cap);
IPCC_HIDDEN int ipcc_dir_open_checked(const char *path);
IPCC_HIDDEN int ipcc_file_open_checked(int dirfd, const char *name, int flags);

/* ---- marker.c: "this process answers the stats signal" ----------------- */

IPCC_HIDDEN int ipcc_marker_write(int sig, const char *request_dir);

/* One IPCCACHE_* variable: its parser (0 or -1) and its documentation. */
struct ipcc_setting {
    const char *name;
    int (*set)(const char *value);
    const char *expect;        /* completes "expected ..." */
    const char *default_text;  /* as the variable would spell it; "" means unset */
    const char *meaning;
};
IPCC_HIDDEN const struct ipcc_setting *ipcc_config_table(size_t *count);

/* ---- log.c --------------------------------------------------------------- */

IPCC_HIDDEN void ipcc_log(enum ipcc_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- stats.c ------------------------------------------------------------- */

/* Each call is counted once, by outcome; totals (opens, closes,
 * passthrough) are sums computed by the reader. */
struct ipcc_counters {
    _Atomic uint64_t hits, misses, open_passthrough;
    _Atomic uint64_t close_cached, close_passthrough, close_past_zero;
    _Atomic uint64_t real_opens, real_closes, evictions, invalidations, errors;
    _Atomic uint64_t real_open_ns, real_open_samples;
    _Atomic uint64_t real_close_ns, real_close_samples;
    _Atomic uint64_t vmm_imports, vmm_import_hits, vmm_maps, vmm_map_hits, vmm_access_skips;
    _Atomic uint64_t releases_on_request; /* idle mappings closed for their exporter */
};

/* Counters are striped: each thread adds to its own cache line, so threads
 * hitting the cache at once do not fight over the counters' line. Readers
 * sum the stripes. */
#define IPCC_STRIPES 64
struct ipcc_counter_stripe {
    struct ipcc_counters c;
} __attribute__((aligned(128)));

IPCC_HIDDEN extern struct ipcc_counter_stripe ipcc_stripes[IPCC_STRIPES];
IPCC_HIDDEN struct ipcc_counters *ipcc_my_stripe(void);
IPCC_HIDDEN uint64_t ipcc_stat_sum(size_t field_offset);
#define IPCC_ADD(field, n) \
    atomic_fetch_add_explicit(&ipcc_my_stripe()->field, (n), memory_order_relaxed)
#define IPCC_COUNT(field) IPCC_ADD(field, 1)
#define IPCC_TOTAL(field) ipcc_stat_sum(offsetof(struct ipcc_counters, field))

IPCC_HIDDEN uint64_t ipcc_now_ns(void);
IPCC_HIDDEN void ipcc_stats_reset(void);
IPCC_HIDDEN void ipcc_stats_install_handler(void);
IPCC_HIDDEN void ipcc_stats_write_line(void);
IPCC_HIDDEN size_t ipcc_stats_format(char *buf, size_t cap);

/* ---- resolve.c: finding the real driver and our hook table -------------- */

/* Real driver entry points the cache itself needs (never hooked ones). */
struct ipcc_driver {
    int (*ctx_get_current)(void **ctx);
    int (*ctx_get_id)(void *ctx, unsigned long long *id);
    int (*ctx_push)(void *ctx);
    int (*ctx_pop)(void **ctx);
    int (*mem_get_range)(uint64_t *base, size_t *size, uint64_t dptr);
    int (*thread_capture_mode)(int *mode); /* cuThreadExchangeStreamCaptureMode */
};

IPCC_HIDDEN const struct ipcc_driver *ipcc_driver(void);
IPCC_HIDDEN void *ipcc_real(int slot);
IPCC_HIDDEN extern void *(*ipcc_real_dlsym)(void *, const char *);
IPCC_HIDDEN void *ipcc_dlsym_hook(void *handle, const char *name, const void *caller);

/* Slots of the hook table; resolve.c owns the table, hooks.c the wrappers. */
enum ipcc_slot {
    IPCC_SLOT_OPEN_V1,
    IPCC_SLOT_OPEN_V2,
    IPCC_SLOT_CLOSE,
    IPCC_SLOT_PROC_V1,
    IPCC_SLOT_PROC_V2,
    IPCC_SLOT_CTX_DESTROY_V1,
    IPCC_SLOT_CTX_DESTROY_V2,
    IPCC_SLOT_PRIMARY_RELEASE_V1,
    IPCC_SLOT_PRIMARY_RELEASE_V2,
    IPCC_SLOT_PRIMARY_RESET_V1,
    IPCC_SLOT_PRIMARY_RESET_V2,
    IPCC_SLOT_VMM_IMPORT,
    IPCC_SLOT_VMM_RESERVE,
    IPCC_SLOT_VMM_FREE,
    IPCC_SLOT_VMM_MAP,
    IPCC_SLOT_VMM_UNMAP,
    IPCC_SLOT_VMM_SET_ACCESS,
    IPCC_SLOT_VMM_GET_ACCESS,
    IPCC_SLOT_VMM_RELEASE,
    IPCC_SLOT_IPC_GET,
    IPCC_SLOT_MEM_FREE_V1,
    IPCC_SLOT_MEM_FREE_V2,
    IPCC_SLOT_VMM_EXPORT,
    IPCC_SLOT_COUNT
};

/* One row per exported wrapper: the one table every resolver path uses. */
struct ipcc_hook {
    const char *symbol;     /* exported name, as dlsym is asked for it */
    const char *proc_name;  /* name cuGetProcAddress is asked for */
    int since;              /* first CUDA version whose ABI this row is */
    void *wrapper;
    void *_Atomic real;
};

IPCC_HIDDEN extern struct ipcc_hook ipcc_hooks[IPCC_SLOT_COUNT];
IPCC_HIDDEN void *ipcc_resolve_substitute(const char *symbol, int version, void *real,
                                         const void *caller);

/* ---- mappings.c: open and close through the cache ----------------------- */

IPCC_HIDDEN int ipcc_open(int slot, uint64_t *pdptr, const void *handle, unsigned flags);
IPCC_HIDDEN int ipcc_close(uint64_t dptr);
IPCC_HIDDEN int ipcc_context_id(void *ctx, uint64_t *id);
IPCC_HIDDEN void ipcc_forget_context(uint64_t ctx_id);
IPCC_HIDDEN void ipcc_contexts_changing(void);
IPCC_HIDDEN void ipcc_sweep_dead_contexts(void);

/* ---- mappings_evict.c: really closing legacy mappings given up ---------- */

IPCC_HIDDEN void ipcc_closing_add(const struct ipcc_victim *v, size_t n);
IPCC_HIDDEN void ipcc_closing_remove(const struct ipcc_victim *v, size_t n);
IPCC_HIDDEN int ipcc_closing_has(uint64_t ctx_id, uint64_t dptr);
IPCC_HIDDEN void ipcc_closing_reset(void);
IPCC_HIDDEN void ipcc_close_listed_victims(const struct ipcc_victim *v, size_t n, int evicted);
IPCC_HIDDEN void ipcc_close_victims(const struct ipcc_victim *v, size_t n, int evicted);

/* ---- evict.c: the one budget, enforced for both kinds -------------------- */

IPCC_HIDDEN void ipcc_evict_over_caps(void);
IPCC_HIDDEN void ipcc_give_way_all(void);
IPCC_HIDDEN void ipcc_release_all_idle(void);
IPCC_HIDDEN size_t ipcc_release_idle_elsewhere(uint64_t keep_ctx_id);

/* ---- lifecycle.c --------------------------------------------------------- */

IPCC_HIDDEN void ipcc_lifecycle_start(void);
IPCC_HIDDEN void ipcc_atexit(void (*fn)(void));

/* ---- lock.c -------------------------------------------------------------- */

IPCC_HIDDEN void ipcc_lock(void);
IPCC_HIDDEN void ipcc_unlock(void);
IPCC_HIDDEN int ipcc_lock_try(void);
IPCC_HIDDEN void ipcc_lock_reset(void);

/* ---- the release ledger: exporters' frees reach importers' idle mappings --
 * (ledger.c, ledger_request.c, exporter.c, release_helper.c; README "Idle
 * mappings and the exporter's free"). */

#define IPCC_LEDGER_IMPORTERS 64
#define IPCC_LEDGER_REQUESTS 64

/* A process as the ledger names it: a pid alone may be reused, so with its
 * start time (clock ticks after boot, /proc/<pid>/stat field 22). */
struct ipcc_proc {
    int32_t pid;
    uint32_t zero_pad;
    uint64_t start;
};

/* userdir.c: the checked 0700 per-user directory, O_DIRECTORY fd or -1. */
IPCC_HIDDEN int ipcc_userdir_open(void);

/* ledger.c: the file, process identity, exports and importer slots. */
IPCC_HIDDEN int ipcc_ledger_ready(void);
IPCC_HIDDEN struct ipcc_proc ipcc_proc_self(void);
IPCC_HIDDEN uint64_t ipcc_proc_start(int32_t pid);
IPCC_HIDDEN int ipcc_proc_alive(int32_t pid, uint64_t start);
IPCC_HIDDEN int ipcc_ledger_publish(const void *handle);
IPCC_HIDDEN void ipcc_ledger_unpublish(const void *handle);
IPCC_HIDDEN int ipcc_ledger_owner(const void *handle, struct ipcc_proc *owner);
IPCC_HIDDEN int ipcc_ledger_unpublished(void);
IPCC_HIDDEN int ipcc_ledger_register(void);
IPCC_HIDDEN void ipcc_ledger_unregister(int slot);
IPCC_HIDDEN void ipcc_ledger_watch(int slot, int32_t exporter_pid);
IPCC_HIDDEN void ipcc_ledger_unwatch(int slot, int32_t exporter_pid);
IPCC_HIDDEN uint32_t ipcc_ledger_doorbell(int slot);
IPCC_HIDDEN void ipcc_ledger_sleep(int slot, uint32_t seen, uint64_t ns);

/* ledger_request.c: one exporter's "let go of this handle", and answers. */
struct ipcc_ledger_ask {
    int index;
    uint32_t gen;
    unsigned char handle[IPCC_HANDLE_BYTES];
};
IPCC_HIDDEN int ipcc_ledger_release(const void *handle, uint64_t wait_ns);
IPCC_HIDDEN int ipcc_ledger_next_ask(int slot, int from, struct ipcc_ledger_ask *ask);
IPCC_HIDDEN void ipcc_ledger_answer(int slot, const struct ipcc_ledger_ask *ask);

/* exporter.c: cuIpcGetMemHandle and cuMemFree{,_v2} of exported memory. */
IPCC_HIDDEN int ipcc_exporter_get_handle(void *handle, uint64_t dptr);
IPCC_HIDDEN int ipcc_exporter_free(int slot, uint64_t dptr);

/* release_helper.c: the importer's side. */
IPCC_HIDDEN void ipcc_ghost_note_open(const void *handle);
IPCC_HIDDEN void ipcc_ghost_after_close(void);
IPCC_HIDDEN uint64_t ipcc_ghost_bytes(void);

/* cache.c: idle entries of one exporter's allocation, in any context. */
IPCC_HIDDEN size_t ipcc_cache_take_idle_by_handle(struct ipcc_cache *c, const void *handle,
                                                  struct ipcc_victim *out, size_t cap,
                                                  uint64_t *live_bytes);

/* ---- the release ledger on the VMM path (vmm_exporter.c, vmm_ghost.c) ----
 * An exported POSIX fd is published as a tag: 64 bytes naming the exporter
 * (pid, start time), the fd number it got and a serial; an importer finds
 * the tag of an fd it imports by comparing that fd with kcmp. */
IPCC_HIDDEN int ipcc_vmm_export_call(void *out, uint64_t handle, int type,
                                     unsigned long long flags);
IPCC_HIDDEN void ipcc_vmm_exporter_release(uint64_t handle);
IPCC_HIDDEN int ipcc_vmm_tag_fd(const void *tag);  /* -1: not a VMM tag */
IPCC_HIDDEN void ipcc_vmm_ghost_note_import(struct ipcc_vmm_table *t, uint64_t handle, int fd);
IPCC_HIDDEN void ipcc_vmm_ghost_let_go(const void *tag);
IPCC_HIDDEN void ipcc_vmm_ghost_after_release(void);
IPCC_HIDDEN uint64_t ipcc_vmm_ghost_bytes(void);
/* ledger.c: the first listed export match() accepts (returns 1); 1 with it
 * copied. match returns -1 when the owner no longer exists: the entry is
 * freed, so that later scans skip it. */
IPCC_HIDDEN int ipcc_ledger_publish_tag(const void *tag);
IPCC_HIDDEN int ipcc_ledger_find_export(int (*match)(const struct ipcc_proc *owner,
                                                     const void *handle, void *arg),
                                        void *arg, void *handle, struct ipcc_proc *owner);
/* vmm_imports.c, vmm_ranges.c: imports known to come from the export tag. */
IPCC_HIDDEN int ipcc_vmm_import_tag(struct ipcc_vmm_table *t, uint64_t handle, const void *tag);
IPCC_HIDDEN size_t ipcc_vmm_take_idle_by_tag(struct ipcc_vmm_table *t, const void *tag,
                                             struct ipcc_vmm_ops *ops, size_t *live,
                                             uint64_t *live_bytes);

#endif
