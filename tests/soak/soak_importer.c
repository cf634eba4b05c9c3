/*
 * soak_importer.c - an importer of the soak's fleet: a scheduler or an
 * engine that opens what the exporters publish, uses it and closes it.
 *
 * Each of its threads loops over a mix: the pool handle of a random
 * exporter opened (one to three references), its bytes checked, closed (most
 * of the opens, nearly all hits); a fresh buffer, opened once and never
 * again, sometimes closed twice; every second or two a weight sync (all of an
 * exporter's weights opened in order, checked, closed in order or reversed);
 * now and then a call the driver refuses. The first thread also rebuilds VMM
 * segments (soak_rebuild.c), and in some importers forks a child that opens
 * pools for a moment, or resets the primary context while the others wait.
 * Every return code and value goes through the shadow model (soak_model.c).
 *
 *     soak importer RUN SLOT SEED THREADS NOFILE FORKS RESETS
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/vmm_pair.h"
#include "soak_model.h"

#define LAZY CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

static struct {
    struct soak_board *b;
    struct soak_importer_slot *me;
    const char *run;
    uint64_t seed;
    int threads, forks, resets;
    pthread_rwlock_t ctx_lock;       /* ops read-locked; a reset or a fork write-locks */
    _Atomic unsigned ctx_epoch;
    CUcontext ctx;
    _Atomic uint64_t fresh_claimed[SOAK_MAX_EXPORTERS]; /* newest fresh buffer taken here */
} im;

struct worker {
    int id;
    uint64_t rnd;
    unsigned epoch;
    struct soak_counts *c;
    double next_sync, next_rebuild, next_fork, next_reset;
};

static void copy_pool(struct soak_exporter_slot *e, void *out)
{
    *(struct soak_handle *)out = e->pool;
}

static int exporters(void)
{
    return (int)im.b->nexporters;
}

static CUresult open_handle(const struct soak_handle *h, CUdeviceptr *p)
{
    CUipcMemHandle ih;
    memcpy(ih.reserved, h->bytes, sizeof(ih.reserved));
    return cuIpcOpenMemHandle(p, ih, LAZY);
}

/* One to three references to a pool, each checked, then closed. */
static void pool_op(struct worker *w)
{
    struct soak_handle h;
    if (!soak_read_slot(&im.b->exp[soak_pick(&w->rnd, (unsigned)exporters())], copy_pool, &h) ||
        !h.pid) /* withdrawn: being freed */
        return;
    CUdeviceptr p[3];
    int refs = 1 + (soak_pick(&w->rnd, 8) == 0) * (1 + (int)soak_pick(&w->rnd, 2)), held = 0;
    for (int i = 0; i < refs; i++) {
        atomic_fetch_add_explicit(&w->c->opens, 1, memory_order_relaxed);
        if (soak_check_open(w->c, open_handle(&h, &p[held]), h.pid, "open of a pool")) {
            soak_check_value(w->c, p[held] + soak_pick(&w->rnd, (unsigned)h.size), h.pid, h.serial,
                             "a pool");
            held++;
        }
    }
    while (held-- > 0)
        soak_check_rc(w->c, SOAK_CLOSE, cuIpcCloseMemHandle(p[held]), "close of a pool");
}

struct fresh_pick { uint64_t n; struct soak_handle h; };
static void copy_fresh(struct soak_exporter_slot *e, void *out)
{
    struct fresh_pick *f = out;
    f->n = atomic_load(&e->fresh_next);
    if (f->n)
        f->h = e->fresh[(f->n - 1) % SOAK_FRESH];
}

/* The newest fresh buffer of an exporter, if no thread here took it yet:
 * opened once, checked, closed; a second close must fail. */
static void fresh_op(struct worker *w)
{
    int e = (int)soak_pick(&w->rnd, (unsigned)exporters());
    struct fresh_pick f;
    if (!soak_read_slot(&im.b->exp[e], copy_fresh, &f) || !f.n || !f.h.pid)
        return;
    uint64_t seen = atomic_load(&im.fresh_claimed[e]);
    if (seen >= f.n || !atomic_compare_exchange_strong(&im.fresh_claimed[e], &seen, f.n))
        return; /* taken here already, or a newer one was (never go back: it could be taken twice) */
    CUdeviceptr p;
    atomic_fetch_add_explicit(&w->c->opens, 1, memory_order_relaxed);
    if (!soak_check_open(w->c, open_handle(&f.h, &p), f.h.pid, "open of a fresh buffer"))
        return;
    soak_check_value(w->c, p + soak_pick(&w->rnd, (unsigned)f.h.size), f.h.pid, f.h.serial,
                     "a fresh buffer");
    soak_check_rc(w->c, SOAK_CLOSE, cuIpcCloseMemHandle(p), "close of a fresh buffer");
    /* Only where no other thread could map something at p meanwhile (the
     * driver hands a freed address to the next mapping): one thread, no fork. */
    if (im.threads == 1 && !im.forks && soak_pick(&w->rnd, 4) == 0)
        soak_check_rc(w->c, SOAK_CLOSE_AGAIN, cuIpcCloseMemHandle(p), "second close of a fresh buffer");
}

struct weights { unsigned n; struct soak_handle h[SOAK_MAX_WEIGHTS]; };
static void copy_weights(struct soak_exporter_slot *e, void *out)
{
    struct weights *ws = out;
    ws->n = e->nweights;
    memcpy(ws->h, e->weights, sizeof(ws->h[0]) * ws->n);
}

/* An engine receives a trainer's weights: all opened in order, then closed. */
static void sync_op(struct worker *w)
{
    static __thread struct weights ws;
    static __thread CUdeviceptr p[SOAK_MAX_WEIGHTS];
    if (!soak_read_slot(&im.b->exp[soak_pick(&w->rnd, (unsigned)exporters())], copy_weights, &ws))
        return;
    unsigned held = 0;
    for (unsigned i = 0; i < ws.n; i++) {
        if (!ws.h[i].pid) /* withdrawn: being freed and shared again */
            continue;
        atomic_fetch_add_explicit(&w->c->opens, 1, memory_order_relaxed);
        if (soak_check_open(w->c, open_handle(&ws.h[i], &p[held]), ws.h[i].pid, "open of a weight") &&
            soak_check_value(w->c, p[held], ws.h[i].pid, ws.h[i].serial, "a weight"))
            held++;
    }
    int reversed = (int)soak_pick(&w->rnd, 2);
    for (unsigned i = 0; i < held; i++)
        soak_check_rc(w->c, SOAK_CLOSE, cuIpcCloseMemHandle(p[reversed ? held - 1 - i : i]),
                      "close of a weight");
    atomic_fetch_add_explicit(&w->c->syncs, 1, memory_order_relaxed);
}

/* A call the driver refuses: other flags, a damaged handle, an unknown pointer. */
static void refused_op(struct worker *w)
{
    struct soak_handle h;
    CUdeviceptr p = 0;
    unsigned kind = soak_pick(&w->rnd, 3);
    if (kind < 2 && (!soak_read_slot(&im.b->exp[soak_pick(&w->rnd, (unsigned)exporters())], copy_pool, &h) ||
                     !h.pid))
        return;
    if (kind == 0) {
        CUipcMemHandle ih;
        memcpy(ih.reserved, h.bytes, sizeof(ih.reserved));
        soak_check_rc(w->c, SOAK_OPEN_BAD_FLAGS, cuIpcOpenMemHandle(&p, ih, 0), "open with flags 0");
    } else if (kind == 1) {
        h.bytes[40 + soak_pick(&w->rnd, 24)] ^= 0x5a; /* a check word */
        soak_check_rc(w->c, SOAK_OPEN_CORRUPT, open_handle(&h, &p), "open of a damaged handle");
    } else {
        soak_check_rc(w->c, SOAK_CLOSE_BOGUS, cuIpcCloseMemHandle(0x1000 + 8 * soak_pick(&w->rnd, 1024)),
                      "close of an unknown pointer");
    }
    if (p && kind < 2) /* the driver mapped it after all: counted above; give it back */
        cuIpcCloseMemHandle(p);
}

/* The primary context reset while every other thread waits, holding nothing. */
static void reset_op(struct worker *w)
{
    pthread_rwlock_wrlock(&im.ctx_lock);
    soak_rebuild_forget();
    vmm_must(cuDevicePrimaryCtxReset(0), "cuDevicePrimaryCtxReset");
    vmm_must(cuDevicePrimaryCtxRetain(&im.ctx, 0), "cuDevicePrimaryCtxRetain");
    vmm_must(cuCtxSetCurrent(im.ctx), "cuCtxSetCurrent");
    w->epoch = atomic_fetch_add(&im.ctx_epoch, 1) + 1;
    atomic_fetch_add_explicit(&w->c->resets, 1, memory_order_relaxed);
    pthread_rwlock_unlock(&im.ctx_lock);
}

/* A child (a data loader, a tokenizer worker) opens pools for a moment. */
static void fork_op(struct worker *w)
{
    pthread_rwlock_wrlock(&im.ctx_lock);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct worker child = { .rnd = w->rnd ^ 0xc41d, .c = &im.me->t[SOAK_THREADS] };
        for (int i = 0; i < 200; i++)
            pool_op(&child);
        exit(0); /* the library's exit handlers run, as at a program's end */
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
    atomic_fetch_add_explicit(&w->c->forks, 1, memory_order_relaxed);
    pthread_rwlock_unlock(&im.ctx_lock);
}

static void one_op(struct worker *w, double now)
{
    unsigned r = soak_pick(&w->rnd, 1000);
    if (now >= w->next_sync) {
        sync_op(w);
        w->next_sync = now + 1 + soak_pick(&w->rnd, 1000) / 1000.0;
    } else if (w->id == 0 && now >= w->next_rebuild) {
        soak_rebuild(im.b, im.run, (int)soak_pick(&w->rnd, (unsigned)exporters()), &w->rnd, w->c);
        w->next_rebuild = now + 0.05;
    } else if (r < 2) {
        refused_op(w);
    } else if (r < 40) {
        fresh_op(w);
    } else {
        pool_op(w);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    double now = soak_now();
    w->next_sync = now + soak_pick(&w->rnd, 2000) / 1000.0;
    w->next_fork = now + 3 + soak_pick(&w->rnd, 5);
    w->next_reset = now + 5 + soak_pick(&w->rnd, 10);
    while (atomic_load_explicit(&im.b->phase, memory_order_relaxed) == SOAK_RUN) {
        pthread_rwlock_rdlock(&im.ctx_lock);
        unsigned epoch = atomic_load(&im.ctx_epoch);
        if (epoch != w->epoch) { /* the context was reset: the new one made current here */
            vmm_must(cuCtxSetCurrent(im.ctx), "cuCtxSetCurrent");
            w->epoch = epoch;
        }
        for (int i = 0; i < 64; i++)
            one_op(w, now);
        pthread_rwlock_unlock(&im.ctx_lock);
        now = soak_now();
        if (w->id == 0 && im.forks && now >= w->next_fork) {
            fork_op(w);
            w->next_fork = now + 3 + soak_pick(&w->rnd, 5);
        }
        if (w->id == 0 && im.resets && now >= w->next_reset) {
            reset_op(w);
            w->next_reset = now + 5 + soak_pick(&w->rnd, 10);
        }
    }
    return NULL;
}

int soak_importer_main(int argc, char **argv)
{
    if (argc != 7)
        return 2;
    char board[4096];
    snprintf(board, sizeof(board), "%s/board", argv[0]);
    im.run = argv[0];
    im.b = soak_board_map(board, 0);
    int slot = atoi(argv[1]);
    im.seed = strtoull(argv[2], NULL, 0);
    im.threads = atoi(argv[3]);
    long nofile = atol(argv[4]);
    im.forks = atoi(argv[5]);
    im.resets = atoi(argv[6]);
    if (!im.b || slot < 0 || slot >= SOAK_MAX_IMPORTERS || im.threads < 1 || im.threads > SOAK_THREADS)
        return 2;
    if (nofile > 0) { /* fd pressure: a low soft limit, as plain torch.multiprocessing keeps */
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = (rlim_t)nofile;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    im.me = &im.b->imp[slot];
    struct rlimit now;
    getrlimit(RLIMIT_NOFILE, &now);
    atomic_store(&im.me->fd_limit, now.rlim_cur > INT32_MAX ? INT32_MAX : (int32_t)now.rlim_cur);
    pthread_rwlock_init(&im.ctx_lock, NULL);
    im.ctx = vmm_start_cuda();
    atomic_store(&im.me->pid, (int32_t)getpid());
    struct worker w[SOAK_THREADS];
    pthread_t tid[SOAK_THREADS];
    for (int i = 0; i < im.threads; i++) {
        /* A thread of its own makes the context current first (epoch differs). */
        w[i] = (struct worker){ .id = i, .rnd = im.seed ^ ((uint64_t)slot << 40) ^ (uint64_t)i,
                                .c = &im.me->t[i], .epoch = i ? ~0u : 0 };
        if (i > 0 && pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0)
            return 3;
    }
    worker_main(&w[0]);
    for (int i = 1; i < im.threads; i++)
        pthread_join(tid[i], NULL);
    soak_rebuild_forget();
    atomic_store(&im.me->done, 1);
    while (atomic_load(&im.b->phase) != SOAK_STOP_ALL)
        soak_sleep_ms(10);
    return 0;
}
