/*
 * fuzz.c - one run of the differential fuzzer (driven by tests/fuzz/fuzz.sh).
 *
 * A seed generates a random CUDA program in miniature: 1-8 threads, each with
 * its own devices, contexts and IPC handles, doing opens (aliased handles,
 * bad flags, NULL pointer, zero or garbage handle), closes (proper, in the
 * wrong context, double, unknown pointer), reopens, context create, destroy
 * (some past the library: the stand-in's own export),
 * push, pop, primary retain, release and reset, fork (the child runs a short
 * sub-sequence and exits), the stats signal to itself, resolver lookups, and
 * the VMM path's calls (tests/fuzz/fuzz_vmm.c: imports, reserve, map, access,
 * release, free, whole rebuilds in either order); then, in some seeds, an
 * exporter and importers in processes of their own (tests/fuzz/fuzz_ledger.c). Settings the seed also
 * chooses: small IPCCACHE_* caps (one budget for both paths), a driver
 * without cuCtxGetId, how the driver is reached (resolver v1/v2, dlsym), how
 * often VMM calls come (never, in a quarter of the seeds), IPCCACHE_VMM=0.
 *
 *     fuzz SEED [KEEP]     KEEP: "all" (default), "none", or op numbers "3,7,12"
 *     fuzz SEED count      prints how many ops the seed generates
 *
 * Output is one line per operation: its resolved arguments, its return code
 * and pointer-equality facts that do not depend on addresses. Nothing in it
 * depends on how threads interleave: every thread owns its devices (hence
 * contexts and handles), and logs are printed per thread after the join.
 * At exit, after ipccache's own exit-time release (its atexit handler is
 * registered later than ours, so it runs first), the stand-in driver's live
 * mappings are listed with their references, and its live VMM state (see
 * vmm_final). fuzz.sh runs each seed without
 * and with the preload; any difference in the output is a bug.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fuzz.h"

#define MAX_THREADS 8
#define MAX_OPS 64
#define NHANDLES 6
#define MAX_CTX 8
#define MAX_HELD 256
#define MAX_SEEN 1024
#define LAZY CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
/* Exporters are made up, above any real pid, so a fork child never
 * finds itself the exporter. */
#define EXPORTER_BASE 0x70000000ULL

/* ---- random numbers: splitmix64, reproducible from the seed ------------- */

uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

unsigned pick(uint64_t *s, unsigned n)
{
    return n ? (unsigned)(next_random(s) % n) : 0;
}

/* ---- the driver, reached one of four ways ------------------------------- */

typedef CUresult (*resolver_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static struct {
    void *lib;
    resolver_fn resolve;
    int path; /* 0: resolver, newest ABIs; 1: resolver, oldest; 2: dlsym _v2; 3: dlsym v1 */
    CUresult (*init)(unsigned);
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*primary_reset)(CUdevice);
    CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*ipc_close)(CUdeviceptr);
    void (*make_export_by)(CUipcMemHandle *, uint64_t, uint64_t, uint64_t, uint64_t);
    size_t (*list_mappings)(struct fakecuda_mapping *, size_t);
    unsigned long long (*ctx_serial)(CUcontext);
    /* teardowns no interposer sees (a layer bound to the driver, a static cudart) */
    CUresult (*ctx_destroy_unseen)(CUcontext);
    CUresult (*primary_reset_unseen)(CUdevice);
    int (*refcount)(CUcontext, CUdeviceptr);
} drv;

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

void *must(void *p, const char *what)
{
    if (!p)
        die("cannot find %s", what);
    return p;
}

/* Resolver path: (name, version); dlsym path: new or old exported name. */
void *lookup(const char *name, int old_version, int new_version, const char *new_symbol)
{
    void *fn = NULL;
    if (drv.path >= 2)
        return must(dlsym(drv.lib, drv.path == 2 && new_symbol ? new_symbol : name), name);
    CUdriverProcAddressQueryResult st;
    int version = drv.path == 0 ? new_version : old_version;
    if (drv.resolve(name, &fn, version, 0, &st) != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS)
        die("cuGetProcAddress(%s, %d) failed", name, version);
    return must(fn, name);
}

void *driver_symbol(const char *name)
{
    return must(dlsym(drv.lib, name), name);
}

static void load_driver(void)
{
    drv.lib = must(dlopen("libcuda.so.1", RTLD_NOW), "libcuda.so.1");
    drv.resolve = must(dlsym(drv.lib, "cuGetProcAddress_v2"), "cuGetProcAddress_v2");
    drv.init = lookup("cuInit", 2000, 2000, NULL);
    drv.ctx_create = lookup("cuCtxCreate", 3020, 3020, "cuCtxCreate_v2");
    drv.ctx_destroy = lookup("cuCtxDestroy", 4000, 4000, "cuCtxDestroy_v2");
    drv.ctx_push = lookup("cuCtxPushCurrent", 4000, 4000, "cuCtxPushCurrent_v2");
    drv.ctx_pop = lookup("cuCtxPopCurrent", 4000, 4000, "cuCtxPopCurrent_v2");
    drv.ctx_get_current = lookup("cuCtxGetCurrent", 2000, 2000, NULL);
    drv.primary_retain = lookup("cuDevicePrimaryCtxRetain", 2000, 2000, NULL);
    drv.primary_release = lookup("cuDevicePrimaryCtxRelease", 7000, 11000, "cuDevicePrimaryCtxRelease_v2");
    drv.primary_reset = lookup("cuDevicePrimaryCtxReset", 7000, 11000, "cuDevicePrimaryCtxReset_v2");
    drv.ipc_open = lookup("cuIpcOpenMemHandle", 4010, 11000, "cuIpcOpenMemHandle_v2");
    drv.ipc_close = lookup("cuIpcCloseMemHandle", 4010, 4010, NULL);
    drv.make_export_by = driver_symbol("fakecuda_make_export_by");
    drv.list_mappings = must(dlsym(drv.lib, "fakecuda_list_mappings"), "fakecuda_list_mappings");
    drv.ctx_serial = must(dlsym(drv.lib, "fakecuda_ctx_serial"), "fakecuda_ctx_serial");
    drv.ctx_destroy_unseen = driver_symbol("fakecuda_ctx_destroy_direct");
    drv.primary_reset_unseen = driver_symbol("fakecuda_primary_reset_direct");
    drv.refcount = driver_symbol("fakecuda_refcount");
    vmm_load();
    if (drv.init(0) != CUDA_SUCCESS)
        die("cuInit failed");
}

/* ---- operations ---------------------------------------------------------- */

enum op_kind {
    OP_OPEN, OP_CLOSE, OP_CLOSE_HERE, OP_CLOSE_AGAIN, OP_CLOSE_BOGUS, OP_REOPEN,
    OP_CTX_CREATE, OP_CTX_DESTROY, OP_PUSH, OP_POP,
    OP_PRIMARY_RETAIN, OP_PRIMARY_RELEASE, OP_PRIMARY_RESET,
    OP_FORK, OP_SIGNAL, OP_RESOLVE, OP_VMM, OP_KINDS
};

static const char *const op_names[OP_KINDS] = {
    "open", "close", "close-here", "close-again", "close-bogus", "reopen",
    "ctx-create", "ctx-destroy", "push", "pop",
    "primary-retain", "primary-release", "primary-reset", "fork", "signal", "resolve", "vmm",
};

/* Relative frequencies; a fork child never forks again. The seed sets the
 * VMM path's (0: legacy IPC only, as before it was fuzzed). */
static unsigned op_weights[OP_KINDS] = {
    30, 18, 4, 5, 2, 6, 5, 3, 6, 4, 5, 3, 3, 2, 2, 3, 0,
};

struct op {
    enum op_kind kind;
    uint64_t r; /* resolved against the state when the op runs */
};

static enum op_kind random_kind(uint64_t *s, int in_child)
{
    unsigned total = 0;
    for (int k = 0; k < OP_KINDS; k++)
        total += in_child && k == OP_FORK ? 0 : op_weights[k];
    unsigned x = pick(s, total);
    for (int k = 0; k < OP_KINDS; k++) {
        unsigned w = in_child && k == OP_FORK ? 0 : op_weights[k];
        if (x < w)
            return (enum op_kind)k;
        x -= w;
    }
    return OP_OPEN;
}

/* ---- per-thread state ------------------------------------------------------ */

struct tctx {
    CUcontext h;
    unsigned long long serial;
    int alive;
};

struct held {
    int ctx;
    CUdeviceptr p;
    int handle;
};

struct thread {
    int id, nops, first_op, drain;
    struct op ops[MAX_OPS];
    CUipcMemHandle handles[NHANDLES];
    struct tctx ctx[MAX_CTX];
    int nctx;
    struct held held[MAX_HELD], seen[MAX_SEEN];
    int nheld, nseen;
    char *log;
    size_t len, cap;
    pthread_t tid;
    struct fuzz_vmm vmm;
};

static struct thread threads[MAX_THREADS];
int nthreads;
static unsigned char *keep; /* per global op number; NULL: keep all */
static pid_t main_pid;
/* Per thread: raise() runs the handler in the raising thread. */
static __thread volatile sig_atomic_t signals_seen;

void log_line(struct thread *t, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
    if (t->len + len + 1 > t->cap) {
        t->cap = (t->cap + len + 1) * 2;
        t->log = realloc(t->log, t->cap);
        if (!t->log)
            die("out of memory");
    }
    memcpy(t->log + t->len, line, len);
    t->len += len;
    t->log[t->len] = '\0';
}

/* Every thread works on devices 2t and 2t+1 only: the driver's one-context-
 * per-device-per-exporter rule and the primary contexts are then per thread. */
static CUdevice device_of(const struct thread *t, uint64_t r)
{
    return (CUdevice)(2 * t->id + (int)(r % 2));
}

/* Handles: two exporters, a few allocations; some are aliases (one
 * allocation under other bytes: another size field, or another export's
 * nonce). IPCC_FUZZ_NO_ALIASES=1 makes every handle its own allocation, to
 * look past a known aliasing bug. The stand-in refuses a handle whose check
 * words do not match, so each is made by it (fake_cuda.c has the layout). */
static void make_handles(struct thread *t, uint64_t *s)
{
    static const uint64_t sizes[] = { 1 << 20, 2 << 20, 64 << 20 };
    const char *no_aliases = getenv("IPCC_FUZZ_NO_ALIASES");
    int aliases = !no_aliases || strcmp(no_aliases, "1") != 0;
    for (int k = 0; k < NHANDLES; k++) {
        uint64_t serial = 1 + pick(s, 3), size = sizes[pick(s, 3)];
        uint64_t exporter = EXPORTER_BASE + 2 * (uint64_t)t->id + pick(s, 2);
        uint64_t nonce = pick(s, 4) == 0 && aliases ? 1 + pick(s, 1000) : 0;
        drv.make_export_by(&t->handles[k], exporter, aliases ? serial : (uint64_t)k + 1, size, nonce);
    }
}

static int current_ctx(const struct thread *t)
{
    CUcontext c = NULL;
    if (drv.ctx_get_current(&c) != CUDA_SUCCESS || !c)
        return -1;
    for (int i = 0; i < t->nctx; i++)
        if (t->ctx[i].alive && t->ctx[i].h == c)
            return i;
    return -1;
}

/* After any teardown: which of our contexts still exist (serials never
 * repeat, so a reused address does not fool this). */
static void refresh_alive(struct thread *t)
{
    for (int i = 0; i < t->nctx; i++)
        t->ctx[i].alive = t->ctx[i].alive && drv.ctx_serial(t->ctx[i].h) == t->ctx[i].serial;
}

static int remember_ctx(struct thread *t, CUcontext h)
{
    unsigned long long serial = drv.ctx_serial(h);
    for (int i = 0; i < t->nctx; i++)
        if (t->ctx[i].serial == serial)
            return i;
    if (t->nctx == MAX_CTX)
        return -1;
    t->ctx[t->nctx] = (struct tctx){ h, serial, 1 };
    return t->nctx++;
}

/* A context to act on: live ones only with several threads (a dead one's
 * address may already belong to another thread's new context). */
static int choose_ctx(const struct thread *t, uint64_t r)
{
    int idx[MAX_CTX], n = 0;
    for (int i = 0; i < t->nctx; i++)
        if (t->ctx[i].alive || nthreads == 1)
            idx[n++] = i;
    return n ? idx[r % (unsigned)n] : -1;
}

/* ---- the operations ----------------------------------------------------- */

static void drop_held(struct thread *t, int i)
{
    t->held[i] = t->held[--t->nheld];
}

static void add_seen(struct thread *t, int ctx, CUdeviceptr p)
{
    for (int i = 0; i < t->nseen; i++)
        if (t->seen[i].ctx == ctx && t->seen[i].p == p)
            return;
    if (t->nseen < MAX_SEEN)
        t->seen[t->nseen++] = (struct held){ ctx, p, 0 };
}

/* Opens handle k (or a broken variant) in the current context and logs the
 * result with which held pointer, if any, it equals. */
static void do_open(struct thread *t, uint64_t r)
{
    int k = (int)(r % NHANDLES), variant = (int)((r >> 8) % 16);
    CUipcMemHandle h = t->handles[k];
    unsigned flags = LAZY;
    CUdeviceptr p = 0;
    const char *what = "";
    if (variant == 0)
        flags = 0, what = " flags=0";
    else if (variant == 1)
        memset(&h, 0, sizeof(h)), what = " zero-handle";
    else if (variant == 2)
        h.reserved[0] ^= 0x55, what = " garbage-handle";
    CUresult rc = drv.ipc_open(variant == 3 ? NULL : &p, h, flags);
    if (variant == 3)
        what = " null-pointer";
    int c = current_ctx(t);
    log_line(t, "open h%d%s in c%d -> %d", k, what, c, (int)rc);
    if (rc == CUDA_SUCCESS && variant != 3) {
        int same = -1;
        for (int i = 0; i < t->nheld && same < 0; i++)
            if (t->held[i].ctx == c && t->held[i].p == p)
                same = t->held[i].handle;
        log_line(t, same < 0 ? " new" : " same-as-h%d", same);
        /* whatever tore a context down, what an open returns is mapped here */
        log_line(t, drv.refcount(NULL, p) > 0 ? " mapped" : " NOT-mapped-here");
        if (t->nheld < MAX_HELD)
            t->held[t->nheld++] = (struct held){ c, p, k };
        add_seen(t, c, p);
    }
    log_line(t, "\n");
}

/* Runs fn() with context c current, restoring the caller's after. */
static CUresult with_ctx(struct thread *t, int c, CUresult (*fn)(CUdeviceptr), CUdeviceptr p)
{
    if (c < 0 || !t->ctx[c].alive)
        return (CUresult)-1; /* ours, not the driver's: context gone */
    if (c == current_ctx(t))
        return fn(p);
    CUresult rc = drv.ctx_push(t->ctx[c].h);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = fn(p);
    CUcontext popped;
    drv.ctx_pop(&popped);
    return rc;
}

static CUresult real_close(CUdeviceptr p)
{
    return drv.ipc_close(p);
}

static int close_held(struct thread *t, int i)
{
    CUresult rc = with_ctx(t, t->held[i].ctx, real_close, t->held[i].p);
    log_line(t, "close held h%d of c%d -> %d\n", t->held[i].handle, t->held[i].ctx, (int)rc);
    int k = t->held[i].handle;
    if (rc == CUDA_SUCCESS)
        drop_held(t, i);
    return rc == CUDA_SUCCESS ? k : -1;
}

/* After a close that took one more reference than the held entry itself,
 * forget one other entry for the same mapping. */
static void drop_one_more(struct thread *t, int c, CUdeviceptr p)
{
    for (int i = 0; i < t->nheld; i++)
        if (t->held[i].ctx == c && t->held[i].p == p)
            return drop_held(t, i);
}

/*
 * Pointers are closed only where their value cannot have been reused: a
 * closed mapping's address may be handed out again, and the cache keeping it
 * mapped changes which addresses the driver picks, so a stale pointer would
 * make the two runs differ for no fault of either. Hence "double close" is
 * a second close right after the first, and a held pointer is closed only
 * in its own context ("close-here": without making it current first).
 */
static void do_close(struct thread *t, enum op_kind kind, uint64_t r)
{
    if (kind == OP_CLOSE_BOGUS || t->nheld == 0) {
        CUdeviceptr p = r % 2 ? 0 : 0xdead0000ULL;
        log_line(t, "close bogus %s -> %d\n", p ? "unknown" : "zero", (int)drv.ipc_close(p));
        return;
    }
    int i = (int)(r % (unsigned)t->nheld), c = t->held[i].ctx;
    CUdeviceptr p = t->held[i].p;
    if (kind == OP_CLOSE_HERE) {
        if (c != current_ctx(t) || c < 0)
            return (void)log_line(t, "close-here: h%d is not of the current context\n",
                               t->held[i].handle);
        CUresult rc = drv.ipc_close(p);
        log_line(t, "close-here h%d of c%d -> %d\n", t->held[i].handle, c, (int)rc);
        if (rc == CUDA_SUCCESS)
            drop_held(t, i);
        return;
    }
    if (close_held(t, i) < 0 || kind != OP_CLOSE_AGAIN)
        return;
    CUresult rc = with_ctx(t, c, real_close, p);
    log_line(t, "close again -> %d\n", (int)rc);
    if (rc == CUDA_SUCCESS)
        drop_one_more(t, c, p);
}

/* Close a held pointer properly, then open its handle again there. */
static void do_reopen(struct thread *t, uint64_t r)
{
    if (t->nheld == 0)
        return (void)log_line(t, "reopen: nothing held\n");
    int i = (int)(r % (unsigned)t->nheld), c = t->held[i].ctx;
    int k = close_held(t, i);
    if (k < 0 || !t->ctx[c].alive)
        return;
    CUresult rc = drv.ctx_push(t->ctx[c].h);
    if (rc != CUDA_SUCCESS)
        return (void)log_line(t, "reopen push c%d -> %d\n", c, (int)rc);
    do_open(t, (uint64_t)k | (5ULL << 8)); /* variant 5: a plain open */
    CUcontext popped;
    drv.ctx_pop(&popped);
}

/* One teardown in four goes past the library. */
static int unseen(uint64_t r)
{
    return ((r >> 20) & 3) == 0;
}

static void do_ctx_op(struct thread *t, enum op_kind kind, uint64_t r)
{
    CUcontext h = NULL;
    CUresult rc;
    int c = choose_ctx(t, r >> 4);
    switch (kind) {
    case OP_CTX_CREATE:
        if (t->nctx == MAX_CTX)
            return (void)log_line(t, "ctx-create: enough contexts\n");
        rc = drv.ctx_create(&h, 0, device_of(t, r));
        log_line(t, "ctx-create on d%d -> %d as c%d\n", (int)(r % 2), (int)rc,
              rc == CUDA_SUCCESS ? remember_ctx(t, h) : -1);
        break;
    case OP_CTX_DESTROY:
        if (c < 0)
            return (void)log_line(t, "ctx-destroy: no context\n");
        rc = (unseen(r) ? drv.ctx_destroy_unseen : drv.ctx_destroy)(t->ctx[c].h);
        refresh_alive(t);
        log_line(t, "ctx-destroy c%d%s -> %d\n", c, unseen(r) ? " unseen" : "", (int)rc);
        if (unseen(r) && t->nctx < MAX_CTX) /* and goes on in a new one, often at its address */
            do_ctx_op(t, OP_CTX_CREATE, r);
        break;
    case OP_PUSH:
        if (c < 0)
            return (void)log_line(t, "push: no context\n");
        if (!t->ctx[c].alive) /* the driver accepts it, then aborts the process */
            return (void)log_line(t, "push: c%d is dead\n", c);
        rc = drv.ctx_push(t->ctx[c].h);
        log_line(t, "push c%d -> %d now c%d\n", c, (int)rc, current_ctx(t));
        break;
    default:
        rc = drv.ctx_pop(&h);
        log_line(t, "pop -> %d now c%d\n", (int)rc, current_ctx(t));
        break;
    }
}

static void do_primary(struct thread *t, enum op_kind kind, uint64_t r)
{
    CUdevice dev = device_of(t, r);
    CUcontext h = NULL;
    CUresult rc;
    if (kind == OP_PRIMARY_RETAIN) {
        rc = drv.primary_retain(&h, dev);
        log_line(t, "primary-retain d%d -> %d as c%d\n", (int)(r % 2), (int)rc,
              rc == CUDA_SUCCESS ? remember_ctx(t, h) : -1);
        return;
    }
    int past = kind == OP_PRIMARY_RESET && unseen(r);
    rc = kind == OP_PRIMARY_RELEASE ? drv.primary_release(dev)
         : (past ? drv.primary_reset_unseen : drv.primary_reset)(dev);
    refresh_alive(t);
    log_line(t, "%s d%d%s -> %d\n", op_names[kind], (int)(r % 2), past ? " unseen" : "", (int)rc);
    if (past) { /* a runtime's reset, then its next call: the primary again, current */
        rc = drv.primary_retain(&h, dev);
        int c = rc == CUDA_SUCCESS ? remember_ctx(t, h) : -1;
        CUresult pushed = rc == CUDA_SUCCESS ? drv.ctx_push(h) : rc;
        log_line(t, "primary-retain d%d -> %d as c%d, push -> %d now c%d\n", (int)(r % 2), (int)rc, c,
                 (int)pushed, current_ctx(t));
    }
}

static void on_signal(int sig)
{
    (void)sig;
    signals_seen++;
}

static void do_signal(struct thread *t)
{
    sig_atomic_t before = signals_seen;
    raise(SIGUSR1);
    log_line(t, "signal: handler ran %d time(s)\n", (int)(signals_seen - before));
}

/* A lookup as cudart or cuda-python makes it, some of them bad: what comes
 * back must be the driver's answer, with a wrapper only where the driver
 * handed out a function. The output pointer starts as a sentinel. */
static void do_resolve(struct thread *t, uint64_t r)
{
    static const char *const names[] = { "cuIpcOpenMemHandle", "cuIpcCloseMemHandle",
                                         "cuCtxDestroy", "cuDevicePrimaryCtxReset",
                                         "cuInit", "cuNoSuchFunction" };
    static const int versions[] = { 0, 4010, 11000, 12000, 99999 };
    static const cuuint64_t flags[] = { 0, 1, 2, 7 };
    const char *name = names[r % 6];
    int version = versions[(r >> 4) % 5], with_status = (int)((r >> 8) % 2);
    cuuint64_t f = flags[(r >> 12) % 4];
    void *sentinel = (void *)&t->handles[0], *fn = sentinel;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)77;
    CUresult rc = drv.resolve(name, &fn, version, f, with_status ? &st : NULL);
    log_line(t, "resolve %s v%d flags=%d%s -> %d status=%d fn=%s\n", name, version, (int)f,
             with_status ? "" : " no-status", (int)rc, (int)st,
             fn == sentinel ? "untouched" : fn ? "set" : "null");
}

static void run_op(struct thread *t, const struct op *op, int in_child);

/*
 * A real driver is unusable in a fork child; the stand-in keeps working on a
 * copy of the parent's state, which ipccache rightly forgets. So the child
 * touches none of the parent's contexts, mappings or exporters: it starts
 * with a context of its own and handles of other exporters.
 */
static void become_child(struct thread *t)
{
    t->log = NULL, t->len = t->cap = 0;
    t->nctx = t->nheld = t->nseen = 0;
    for (int k = 0; k < NHANDLES; k++) {
        uint64_t exporter, bytes, nonce, serial;
        const char *b = t->handles[k].reserved;
        memcpy(&exporter, b + 8, 8), memcpy(&bytes, b + 16, 8);
        memcpy(&nonce, b + 24, 8), memcpy(&serial, b + 32, 8);
        drv.make_export_by(&t->handles[k], exporter + 2 * MAX_THREADS, serial, bytes, nonce);
    }
    vmm_child(&t->vmm);
}

/* The child runs a few ops of its own, sends its log up a pipe and exits
 * normally (ipccache's exit path runs there too). */
static void run_child(struct thread *t, uint64_t r, int fd)
{
    uint64_t s = r;
    become_child(t);
    struct op first = { OP_CTX_CREATE, next_random(&s) };
    int n = 1 + (int)pick(&s, 6);
    for (int i = 0; i <= n; i++) {
        struct op op = { random_kind(&s, 1), next_random(&s) };
        log_line(t, "  child: ");
        run_op(t, i == 0 ? &first : &op, 1);
    }
    ssize_t ignored = write(fd, t->log, t->len);
    (void)ignored;
    exit(0);
}

/* ASan's allocator has no fork handlers: a child forked while another
 * thread holds its lock hangs in its first malloc. */
#if defined(__SANITIZE_ADDRESS__)
#define FORK_NEEDS_ONE_THREAD 1
#else
#define FORK_NEEDS_ONE_THREAD 0
#endif

static void do_fork(struct thread *t, uint64_t r)
{
    if (FORK_NEEDS_ONE_THREAD && nthreads > 1)
        return (void)log_line(t, "fork: skipped (sanitizer build, several threads)\n");
    int fds[2];
    if (pipe(fds) != 0)
        die("pipe failed");
    pid_t pid = fork();
    if (pid < 0)
        die("fork failed");
    if (pid == 0) {
        close(fds[0]);
        run_child(t, r, fds[1]);
    }
    close(fds[1]);
    log_line(t, "fork\n");
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf) - 1)) > 0) {
        buf[n] = '\0';
        log_line(t, "%s", buf);
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    log_line(t, "fork: child %s %d\n", WIFEXITED(status) ? "exited" : "killed by signal",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

static void run_op(struct thread *t, const struct op *op, int in_child)
{
    switch (op->kind) {
    case OP_OPEN: do_open(t, op->r); break;
    case OP_CLOSE: case OP_CLOSE_HERE: case OP_CLOSE_AGAIN: case OP_CLOSE_BOGUS:
        do_close(t, op->kind, op->r);
        break;
    case OP_REOPEN: do_reopen(t, op->r); break;
    case OP_CTX_CREATE: case OP_CTX_DESTROY: case OP_PUSH: case OP_POP:
        do_ctx_op(t, op->kind, op->r);
        break;
    case OP_PRIMARY_RETAIN: case OP_PRIMARY_RELEASE: case OP_PRIMARY_RESET:
        do_primary(t, op->kind, op->r);
        break;
    case OP_FORK:
        if (!in_child)
            do_fork(t, op->r);
        break;
    case OP_SIGNAL: do_signal(t); break;
    case OP_RESOLVE: do_resolve(t, op->r); break;
    case OP_VMM: vmm_op(t, &t->vmm, op->r); break;
    case OP_KINDS: break;
    }
}

/* The app gives back everything it can: every pointer it ever got, closed
 * in its context until the driver (or the cache) says no more. Which
 * addresses those were may differ between the runs (see do_close); how many
 * references each context gave back may not. */
static void drain(struct thread *t)
{
    for (int c = 0; c < t->nctx; c++) {
        int n = 0;
        for (int i = 0; i < t->nseen && t->ctx[c].alive; i++)
            if (t->seen[i].ctx == c)
                while (n < 4096 && with_ctx(t, c, real_close, t->seen[i].p) == CUDA_SUCCESS)
                    n++;
        if (t->ctx[c].alive)
            log_line(t, "drain c%d: %d close(s)\n", c, n);
    }
    vmm_drain(t, &t->vmm);
}

static void *thread_main(void *arg)
{
    struct thread *t = arg;
    for (int i = 0; i < t->nops; i++) {
        if (keep && !keep[t->first_op + i])
            continue;
        log_line(t, "t%d #%d ", t->id, t->first_op + i);
        run_op(t, &t->ops[i], 0);
    }
    if (t->drain)
        drain(t);
    vmm_end(t, &t->vmm);
    return NULL;
}

/* ---- the end: what the driver still holds ------------------------------ */

static const char *ctx_name(unsigned long long serial, int *owner, char *buf, size_t cap)
{
    for (int t = 0; t < nthreads; t++)
        for (int i = 0; i < threads[t].nctx; i++)
            if (threads[t].ctx[i].serial == serial) {
                snprintf(buf, cap, "t%d.c%d", t, i);
                *owner = t;
                return buf;
            }
    *owner = -1;
    return "unknown";
}

static int compare_lines(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* Runs after ipccache's exit-time release. Mappings of a thread that
 * drained are listed with their exact reference count (it should be none);
 * others only as live, since a cache legitimately holds one reference
 * where the app holds several. */
static void final_mappings(void)
{
    enum { MAX_MAPS = 512 };
    static struct fakecuda_mapping maps[MAX_MAPS];
    static char lines[MAX_MAPS][96];
    if (getpid() != main_pid)
        return;
    size_t n = drv.list_mappings(maps, MAX_MAPS);
    if (n > MAX_MAPS)
        n = MAX_MAPS;
    for (size_t i = 0; i < n; i++) {
        char name[32];
        int owner;
        const char *cn = ctx_name(maps[i].ctx_serial, &owner, name, sizeof(name));
        char refs[16] = "live";
        if (owner >= 0 && threads[owner].drain)
            snprintf(refs, sizeof(refs), "%d", maps[i].refs);
        snprintf(lines[i], sizeof(lines[i]), "final %s exporter%llu alloc%llu refs=%s", cn,
                 (unsigned long long)(maps[i].exporter_pid - EXPORTER_BASE),
                 (unsigned long long)maps[i].alloc_serial, refs);
    }
    qsort(lines, n, sizeof(lines[0]), compare_lines);
    for (size_t i = 0; i < n; i++)
        printf("%s\n", lines[i]);
    printf("final: %zu mapping(s)\n", n);
    struct fuzz_vmm *all[MAX_THREADS];
    for (int t = 0; t < nthreads; t++)
        all[t] = &threads[t].vmm;
    vmm_final(all, nthreads);
    fflush(stdout);
}

/* ---- setup from the seed ------------------------------------------------- */

static void setenv_u(const char *name, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    setenv(name, buf, 1);
}

/* Settings read later by the stand-in and by ipccache (at its first call). */
static void choose_settings(uint64_t *s)
{
    static const uint64_t caps_bytes[] = { 0, 1 << 20, 3 << 20, 64 << 20 };
    setenv_u("FAKECUDA_DEVICES", 2 * MAX_THREADS);
    if (pick(s, 4) == 0)
        setenv("FAKECUDA_NO_CTXGETID", "1", 1);
    if (pick(s, 2) == 0) {
        setenv_u("IPCCACHE_MAX_IDLE_ENTRIES", pick(s, 4));
        setenv_u("IPCCACHE_MAX_IDLE_BYTES", caps_bytes[pick(s, 4)]);
    }
    drv.path = (int)pick(s, 4);
    static const unsigned vmm_weights[] = { 0, 15, 40, 100 };
    op_weights[OP_VMM] = vmm_weights[pick(s, 4)];
    if (pick(s, 8) == 0)
        setenv("IPCCACHE_VMM", "0", 1);
    printf("settings: no_ctxgetid=%s max_idle_entries=%s max_idle_bytes=%s path=%d vmm=%u%s\n",
           getenv("FAKECUDA_NO_CTXGETID") ? "1" : "0",
           getenv("IPCCACHE_MAX_IDLE_ENTRIES") ? getenv("IPCCACHE_MAX_IDLE_ENTRIES") : "-",
           getenv("IPCCACHE_MAX_IDLE_BYTES") ? getenv("IPCCACHE_MAX_IDLE_BYTES") : "-", drv.path,
           op_weights[OP_VMM], getenv("IPCCACHE_VMM") ? " IPCCACHE_VMM=0" : "");
}

static int generate(uint64_t seed)
{
    uint64_t s = seed;
    choose_settings(&s);
    nthreads = pick(&s, 3) == 0 ? 1 : 1 + (int)pick(&s, MAX_THREADS);
    int total = 0;
    for (int i = 0; i < nthreads; i++) {
        struct thread *t = &threads[i];
        t->id = i;
        t->nops = 5 + (int)pick(&s, MAX_OPS - 5);
        t->first_op = total;
        t->drain = pick(&s, 2) != 0;
        for (int k = 0; k < t->nops; k++)
            t->ops[k] = (struct op){ random_kind(&s, 0), next_random(&s) };
        total += t->nops;
    }
    return total;
}

static void parse_keep(const char *arg, int total)
{
    if (strcmp(arg, "all") == 0)
        return;
    keep = calloc((size_t)total + 1, 1);
    if (!keep)
        die("out of memory");
    if (strcmp(arg, "none") == 0)
        return;
    for (const char *p = arg; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= total)
            die("bad op list \"%s\"", arg);
        keep[v] = 1;
        p = *end == ',' ? end + 1 : end;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3)
        die("usage: fuzz SEED [all|count|N,N,...]");
    uint64_t seed = strtoull(argv[1], NULL, 0);
    main_pid = getpid();
    /* Ours runs after any exit handler ipccache registers later. */
    atexit(final_mappings);
    signal(SIGUSR1, on_signal);
    int total = generate(seed);
    if (argc == 3 && strcmp(argv[2], "count") == 0) {
        printf("ops=%d\n", total);
        fflush(stdout);
        _exit(0);
    }
    parse_keep(argc == 3 ? argv[2] : "all", total);
    load_driver();
    for (int i = 0; i < nthreads; i++) {
        make_handles(&threads[i], &(uint64_t){ seed ^ (0x1000u + (unsigned)i) });
        vmm_start(&threads[i].vmm, i);
    }
    printf("seed %llu: %d thread(s), %d op(s)\n", (unsigned long long)seed, nthreads, total);
    fflush(stdout);
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&threads[i].tid, NULL, thread_main, &threads[i]) != 0)
            die("pthread_create failed");
    /* Nothing is buffered on stdout while a thread may fork. */
    for (int i = 0; i < nthreads; i++)
        pthread_join(threads[i].tid, NULL);
    for (int i = 0; i < nthreads; i++)
        fputs(threads[i].log ? threads[i].log : "", stdout);
    fflush(stdout);
    ledger_peers(seed);
    return 0;
}
