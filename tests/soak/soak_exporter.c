/*
 * soak_exporter.c - an exporter of the soak's fleet: a trainer or a
 * producer that allocates, exports and frees.
 *
 * It publishes on its board slot a pool handle (the buffer every feature is
 * cut from), a few hundred weights (some re-allocated every few seconds, as
 * a trainer re-shares changed ones), a ring of fresh buffers (each freed when
 * the ring comes round: handles seen once), and a VMM segment of chunks
 * exported as fds, handed to any importer that connects to its socket. Now
 * and then it resets its context (everything freed, then made again), and
 * at the end of its life it frees all and exits, or just exits; the
 * supervisor kills some, and puts a new exporter in the slot.
 *
 *     soak exporter RUN SLOT GENERATION SEED
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_vmm.h"
#include "gpu/vmm_pair.h"
#include "soak.h"

#define MIB (1ULL << 20)

static struct {
    struct soak_board *b;
    struct soak_exporter_slot *e;
    uint64_t rnd;
    CUdeviceptr pool, weights[SOAK_MAX_WEIGHTS], fresh[SOAK_FRESH];
    CUmemGenericAllocationHandle chunk[SOAK_MAX_CHUNKS];
    int chunk_fd[SOAK_MAX_CHUNKS];
    int listen_fd;
} x;

/* Allocates and exports bytes; the handle and what it names in *h, not
 * yet published. */
static void alloc_export(struct soak_handle *h, CUdeviceptr *p, size_t bytes)
{
    CUipcMemHandle ih;
    vmm_must(cuMemAlloc(p, bytes), "cuMemAlloc");
    vmm_must(cuIpcGetMemHandle(&ih, *p), "cuIpcGetMemHandle");
    memcpy(h->bytes, ih.reserved, sizeof(h->bytes));
    h->pid = (uint64_t)getpid();
    h->size = bytes;
    if (!fakecuda_allocation_serial(*p, &h->serial))
        vmm_must(CUDA_ERROR_UNKNOWN, "the stand-in's allocation serial");
    atomic_fetch_add(&x.e->allocs, 1);
}

static void free_alloc(CUdeviceptr *p)
{
    if (*p) {
        vmm_must(cuMemFree(*p), "cuMemFree");
        atomic_fetch_add(&x.e->frees, 1);
    }
    *p = 0;
}

/* A published handle is withdrawn (pid 0: importers skip it) before its
 * free, and the free happens outside the slot's write: a free waits for the
 * importers' let-go, and importers must not spin on the slot meanwhile. An
 * importer that copied the handle before may still open it during the free:
 * the program's own race, as in a real fleet. */
static void withdraw(struct soak_handle *h)
{
    soak_write_begin(x.e);
    h->pid = 0;
    soak_write_end(x.e);
}

/* Frees the allocation behind a published handle and publishes a new one of bytes. */
static void replace_alloc(struct soak_handle *h, CUdeviceptr *p, size_t bytes)
{
    struct soak_handle fresh;
    withdraw(h);
    free_alloc(p);
    alloc_export(&fresh, p, bytes);
    soak_write_begin(x.e);
    *h = fresh;
    soak_write_end(x.e);
}

static void make_segment(void)
{
    CUmemAllocationProp prop = vmm_fd_prop();
    for (unsigned k = 0; k < x.e->nchunks; k++) {
        uint64_t pid;
        vmm_must(cuMemCreate(&x.chunk[k], FAKEVMM_GRANULARITY, &prop, 0), "cuMemCreate");
        vmm_must(cuMemExportToShareableHandle(&x.chunk_fd[k], x.chunk[k],
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 "cuMemExportToShareableHandle");
        fakevmm_handle_allocation(x.chunk[k], &pid, &x.e->chunk_serial[k]);
    }
    atomic_fetch_add(&x.e->vmm_epoch, 1);
}

/* Everything allocated, then published in one write (at start and after a reset). */
static void make_all(void)
{
    static struct soak_handle weights[SOAK_MAX_WEIGHTS];
    struct soak_handle pool;
    alloc_export(&pool, &x.pool, 256 * MIB);
    for (unsigned i = 0; i < x.e->nweights; i++)
        alloc_export(&weights[i], &x.weights[i], (1 + soak_pick(&x.rnd, 8)) * MIB);
    soak_write_begin(x.e);
    x.e->pool = pool;
    memcpy(x.e->weights, weights, sizeof(weights[0]) * x.e->nweights);
    make_segment();
    atomic_store(&x.e->pid, (int32_t)getpid());
    soak_write_end(x.e);
}

/* Everything withdrawn in one write, then freed. */
static void free_all(void)
{
    soak_write_begin(x.e);
    x.e->pool.pid = 0;
    for (unsigned i = 0; i < x.e->nweights; i++)
        x.e->weights[i].pid = 0;
    for (int i = 0; i < SOAK_FRESH; i++)
        x.e->fresh[i].pid = 0;
    soak_write_end(x.e);
    free_alloc(&x.pool);
    for (unsigned i = 0; i < x.e->nweights; i++)
        free_alloc(&x.weights[i]);
    for (int i = 0; i < SOAK_FRESH; i++)
        free_alloc(&x.fresh[i]);
    for (unsigned k = 0; k < x.e->nchunks; k++) {
        vmm_must(cuMemRelease(x.chunk[k]), "cuMemRelease");
        close(x.chunk_fd[k]);
    }
}

/* A new buffer in the ring's next place; the one it replaces is freed. */
static void fresh_buffer(void)
{
    uint64_t n = atomic_load(&x.e->fresh_next);
    int i = (int)(n % SOAK_FRESH);
    replace_alloc(&x.e->fresh[i], &x.fresh[i], (2 + soak_pick(&x.rnd, 6)) * MIB);
    atomic_store(&x.e->fresh_next, n + 1);
}

/* A trainer's step changed some weights: freed and shared again. */
static void reshare_weights(void)
{
    unsigned n = 1 + soak_pick(&x.rnd, x.e->nweights / 8 + 1);
    for (unsigned k = 0; k < n; k++) {
        unsigned i = soak_pick(&x.rnd, x.e->nweights);
        replace_alloc(&x.e->weights[i], &x.weights[i], (1 + soak_pick(&x.rnd, 8)) * MIB);
    }
}

static void reset_context(void)
{
    CUcontext ctx;
    free_all();
    vmm_must(cuDevicePrimaryCtxReset(0), "cuDevicePrimaryCtxReset");
    vmm_must(cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
    vmm_must(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    atomic_fetch_add(&x.e->resets, 1);
    make_all();
}

/* An importer connected: its copies of the segment's fds, and what each names. */
static void serve_fds(void)
{
    int c = accept4(x.listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
        return;
    uint64_t msg[2 + SOAK_MAX_CHUNKS] = { (uint64_t)getpid(), atomic_load(&x.e->vmm_epoch) };
    memcpy(&msg[2], x.e->chunk_serial, sizeof(uint64_t) * x.e->nchunks);
    soak_send_fds(c, msg, sizeof(msg), x.chunk_fd, (int)x.e->nchunks);
    close(c);
}

static void listen_on(const char *run, int slot, unsigned generation)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    soak_socket_path(a.sun_path, sizeof(a.sun_path), run, slot, generation);
    unlink(a.sun_path);
    x.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (x.listen_fd < 0 || bind(x.listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(x.listen_fd, 64) != 0) {
        perror("soak: exporter socket");
        exit(2);
    }
}

int soak_exporter_main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    char board[4096];
    snprintf(board, sizeof(board), "%s/board", argv[0]);
    x.b = soak_board_map(board, 0);
    int slot = atoi(argv[1]);
    unsigned generation = (unsigned)atoi(argv[2]);
    x.rnd = strtoull(argv[3], NULL, 0) ^ ((uint64_t)slot << 32) ^ generation;
    if (!x.b || slot < 0 || slot >= SOAK_MAX_EXPORTERS)
        return 2;
    x.e = &x.b->exp[slot];
    if (atomic_load(&x.e->seq) & 1) /* the one before was killed while writing */
        atomic_fetch_add(&x.e->seq, 1);
    listen_on(argv[0], slot, generation);
    vmm_start_cuda();
    soak_write_begin(x.e);
    x.e->nweights = 64 + soak_pick(&x.rnd, SOAK_MAX_WEIGHTS - 63);
    x.e->nchunks = 4 + soak_pick(&x.rnd, SOAK_MAX_CHUNKS - 3);
    atomic_store(&x.e->generation, generation);
    soak_write_end(x.e);
    make_all();

    double now = soak_now(), end = now + 5 + soak_pick(&x.rnd, 36);
    if (getenv("SOAK_STEADY")) /* the soak's own tests: a life as long as the run */
        end = 1e30;
    double next_fresh = now, next_reshare = now + 1, next_reset = now + 4 + soak_pick(&x.rnd, 30);
    struct pollfd p = { x.listen_fd, POLLIN, 0 };
    while (!atomic_load(&x.b->exporters_stop) && now < end) {
        if (poll(&p, 1, 2) > 0)
            serve_fds();
        now = soak_now();
        if (now >= next_fresh) {
            fresh_buffer();
            next_fresh = now + 0.02;
        }
        if (now >= next_reshare) {
            reshare_weights();
            next_reshare = now + 1 + soak_pick(&x.rnd, 3);
        }
        if (now >= next_reset && !getenv("SOAK_STEADY")) {
            reset_context();
            next_reset = now + 10 + soak_pick(&x.rnd, 30);
        }
    }
    /* The last exporter's free is what the verdict's pinned bytes follow;
     * otherwise half the lives end without freeing, as crashes and quick exits do. */
    if (atomic_load(&x.b->exporters_stop) || soak_pick(&x.rnd, 2))
        free_all();
    return 0;
}
