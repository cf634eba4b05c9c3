/*
 * base.h - the basics every layer uses: settings, messages, the table lock,
 * text without stdio, the per-user folder, a small key set, processes, and
 * the real driver. Nothing here calls up: the hook table's rows are the
 * entry layer's, registered with driver.c at load (entry/wiring.c). No CUDA
 * header: the pure tables include this.
 */
#ifndef IPCC_BASE_H
#define IPCC_BASE_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define IPCC_VERSION "0.1.0"
#define IPCC_HIDDEN __attribute__((visibility("hidden")))
#define IPCC_EXPORT __attribute__((visibility("default")))

/* The driver's status code we produce ourselves when there is no driver:
 * CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, nothing to forward to (hooks.c
 * checks it against cuda.h). */
#define IPCC_CUDA_NO_DRIVER 302

/* The one clock: CLOCK_MONOTONIC is the same in every process, so the
 * ledger's deadlines and the table's ages compare across them. */
static inline uint64_t ipcc_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The same clock to a tick's resolution, at a fraction of the cost: only a
 * lent close (no lock) is ordered by it; the order it gives is the loans'
 * protocol comment's (tables/legacy_loans.c). */
static inline uint64_t ipcc_clock_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The bytes of a legacy IPC handle; a VMM export tag and every key of the
 * ledger and the key sets have as many. */
#define IPCC_HANDLE_BYTES 64

/* What a table's release found (both kinds' tables). */
enum ipcc_release_result {
    IPCC_RELEASE_NOT_FOUND,  /* not ours: the driver must answer */
    IPCC_RELEASE_OK,         /* one reference dropped */
    IPCC_RELEASE_PAST_ZERO,  /* was idle: removed; the cache's reference must be
                              * closed and the close passed to the driver */
};

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
IPCC_HIDDEN void ipcc_config_say_disabled(void);
IPCC_HIDDEN int ipcc_parse_bool(const char *s, int *out);
IPCC_HIDDEN int ipcc_parse_size(const char *s, uint64_t *out);
IPCC_HIDDEN int ipcc_parse_count(const char *s, uint64_t *out);
IPCC_HIDDEN int ipcc_parse_signal(const char *s, int *out);
IPCC_HIDDEN int ipcc_parse_log_level(const char *s, enum ipcc_log_level *out);
IPCC_HIDDEN int ipcc_config_stats_path(const char *pattern, long pid, char *out, size_t cap);

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

/* ---- userdir.c: the per-user directory, and files opened safely -------- */

struct stat;
IPCC_HIDDEN int ipcc_fstat(int fd, struct stat *st);
IPCC_HIDDEN int ipcc_userdir_open(void);
IPCC_HIDDEN int ipcc_userdir_path(char *out, size_t cap);
IPCC_HIDDEN int ipcc_dir_open_checked(const char *path);
IPCC_HIDDEN int ipcc_file_open_checked(int dirfd, const char *name, int flags);

/* ---- lock.c -------------------------------------------------------------- */

IPCC_HIDDEN void ipcc_lock(void);
IPCC_HIDDEN void ipcc_unlock(void);
IPCC_HIDDEN int ipcc_lock_try(void);
IPCC_HIDDEN void ipcc_lock_reset(void);
/* Around a C library call whose lock a fork would copy held (lock.c). */
IPCC_HIDDEN void ipcc_fork_guard_enter(sigset_t *saved);
IPCC_HIDDEN void ipcc_fork_guard_leave(const sigset_t *saved);
IPCC_HIDDEN void ipcc_fork_guard_hold(void);
IPCC_HIDDEN void ipcc_fork_guard_release(void);
IPCC_HIDDEN void ipcc_fork_guard_reset(void);
IPCC_HIDDEN void ipcc_fork_guard_close(void); /* the fork handler of start's */
IPCC_HIDDEN void ipcc_fork_guard_open(void);

/* ---- mem.c: the tables' memory, never the program's allocator --------- */

IPCC_HIDDEN void *ipcc_mem_alloc(size_t n);
IPCC_HIDDEN void *ipcc_mem_calloc(size_t n, size_t size);
IPCC_HIDDEN void *ipcc_mem_realloc(void *p, size_t n);
IPCC_HIDDEN void ipcc_mem_free(void *p);
IPCC_HIDDEN void ipcc_mem_hold(void); /* the fork handlers' */
IPCC_HIDDEN void ipcc_mem_release(void);
IPCC_HIDDEN void ipcc_mem_reset(void);
/* uthash's tables and buckets too: its users include this header first. */
#define uthash_malloc(sz) ipcc_mem_alloc(sz)
#define uthash_free(ptr, sz) ipcc_mem_free(ptr)

/* ---- proc.c: processes named by pid and start time; exit handlers ------- */

/* A process as the ledger names it: a pid alone may be reused, so with its
 * start time (clock ticks after boot, /proc/<pid>/stat field 22). */
struct ipcc_proc {
    int32_t pid;
    uint32_t zero_pad;
    uint64_t start;
};
IPCC_HIDDEN struct ipcc_proc ipcc_proc_self(void);
IPCC_HIDDEN uint64_t ipcc_proc_start(int32_t pid);
IPCC_HIDDEN int ipcc_proc_alive(int32_t pid, uint64_t start);
IPCC_HIDDEN void ipcc_atexit(void (*fn)(void));

/* ---- driver.c: the real driver, and the rows of the hook table ----------- */

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

/* Slots of the hook table, one per row of hooks.def; resolve.c owns the
 * table, hooks.c the wrappers. */
enum ipcc_slot {
#define IPCC_HOOK(slot, sym, proc, since) IPCC_SLOT_##slot,
#include "hooks.def"
#undef IPCC_HOOK
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

/* driver.c: the table hooks.c defines, registered at load (entry/wiring.c);
 * NULL before. */
IPCC_HIDDEN void ipcc_hooks_register(struct ipcc_hook *table);
IPCC_HIDDEN struct ipcc_hook *ipcc_hook_table(void);
IPCC_HIDDEN void ipcc_remember_real(struct ipcc_hook *h, void *real);
IPCC_HIDDEN void ipcc_ensure_real_dlsym(void);
struct link_map;
IPCC_HIDDEN struct link_map *ipcc_object_of(const void *addr);

#endif
