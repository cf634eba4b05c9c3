/*
 * standin_rl.c - the RL weight sync's VMM calls against the stand-in
 * driver: what the library itself costs per step, with no GPU.
 *
 * One process plays both sides. The trainer's parameters (the decoder of
 * tools/bench/bench_torch_vmm.py: embedding, LAYERS x 6 tensors, final norm, bf16)
 * lie in two expandable segments, large tensors in 20 MiB chunks, small ones
 * (the norms) in one small-pool chunk; each chunk is exported once. Every
 * step the engine rebuilds each distinct chunk range as PyTorch's
 * ExpandableSegment::fromShared does (reserve, per chunk a received dup of
 * the export imported then closed, map, set access), then drops them all in
 * reverse (unmap and release per chunk, address free). Tensors covering the
 * same chunks share one rebuild, as PyTorch's handle cache makes them;
 * neighbours share their boundary chunk. The stand-in maps 2 MiB per chunk.
 *
 * SHAPE is the order of the rebuilds (the shapes of issue 17):
 *   all       every distinct chunk range rebuilt, then all dropped (above);
 *   one       one tensor at a time: rebuild, drop, next, same order every step
 *             (tensors in one chunk range rebuild it each, as PyTorch's
 *             handle cache is empty again by then);
 *   reversed  one at a time, the order reversed every other step;
 *   shuffled  one at a time, a new order every step;
 *   buckets   the parameters flattened into 512 MiB buckets (one segment of
 *             their own), each rebuilt and dropped in turn;
 *   two       two engines served from one trainer, interleaved: each tensor
 *             rebuilt and dropped once for each, in turn.
 *
 * Prints, after WARMUP untimed steps, the best and median step time, the
 * real driver calls per step and the share of maps that were hits; run it
 * without and with the library preloaded (make bench-standin does both).
 * Figures are this machine's, the stand-in's own cost included: compare runs
 * side by side, not with a GPU.
 *
 * usage: standin_rl [LAYERS [STEPS [SHAPE]]]   (default 22 layers, 1000 steps, all)
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "fake_cuda.h"
#include "fake_vmm.h"
#include "gpu/vmm_pair.h"

#define G FAKEVMM_GRANULARITY
#define CHUNK (20ULL << 20)         /* PyTorch's large-pool chunk */
#define SMALL_LIMIT (1ULL << 20)    /* smaller tensors go to the small pool */
#define MAX_TENSORS 4096
#define MAX_SPAN 64                 /* chunks one tensor may cover */
#define RESERVE (64 * G)            /* the stand-in's stand-in for PyTorch's huge reserve */
#define WARMUP 3
#define BUCKET (512ULL << 20)       /* a flattened bucket */

struct span {
    int pool, first, count; /* pool: 0 large, 1 small, 2 buckets */
};

struct rebuilt {
    CUdeviceptr base;
    CUmemGenericAllocationHandle h[MAX_SPAN];
};

enum shape { ALL, ONE, REVERSED, SHUFFLED, BUCKETS, TWO };
static const char *const shape_names[] = { "all", "one", "reversed", "shuffled", "buckets", "two" };

static struct span spans[MAX_TENSORS];    /* distinct chunk ranges, in order */
static struct span tensors[MAX_TENSORS];  /* every tensor's, in order */
static struct span buckets[MAX_TENSORS];
static struct rebuilt rebuilt[MAX_TENSORS];
static int nspans, ntensors, nbuckets;

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "standin_rl: %s: %d\n", what, (int)rc);
        exit(1);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The chunk range a tensor of bytes placed at *offset covers; moves *offset on. */
static struct span place(uint64_t *offset, uint64_t bytes, uint64_t round, int pool)
{
    uint64_t start = *offset;
    *offset += (bytes + round - 1) / round * round;
    struct span s = { pool, (int)(start / CHUNK), 0 };
    s.count = (int)((*offset + CHUNK - 1) / CHUNK) - s.first;
    return s;
}

static int known(struct span s)
{
    for (int i = 0; i < nspans; i++)
        if (!memcmp(&spans[i], &s, sizeof(s)))
            return 1;
    return 0;
}

/* The decoder's tensors, in order, as chunk ranges (each and distinct), and
 * as 512 MiB buckets; the chunks the large pool and the buckets need. */
static void lay_out(int layers, int *large_chunks, int *bucket_chunks)
{
    const uint64_t h = 2048, inter = 5632, vocab = 64000, bf16 = 2;
    uint64_t sizes[MAX_TENSORS];
    int n = 0;
    sizes[n++] = vocab * h * bf16;
    for (int l = 0; l < layers && n + 6 < MAX_TENSORS; l++) {
        const uint64_t layer[6] = { 3 * h * h, h * h, 2 * inter * h, h * inter, h, h };
        for (int k = 0; k < 6; k++)
            sizes[n++] = layer[k] * bf16;
    }
    sizes[n++] = h * bf16;
    uint64_t large = 0, small = 0, total = 0;
    for (int i = 0; i < n; i++) {
        int is_small = sizes[i] < SMALL_LIMIT;
        struct span s = is_small ? place(&small, sizes[i], 512, 1)
                                 : place(&large, sizes[i], 2ULL << 20, 0);
        if (s.count > MAX_SPAN) {
            fprintf(stderr, "standin_rl: a tensor covers %d chunks\n", s.count);
            exit(2);
        }
        if (!known(s))
            spans[nspans++] = s;
        tensors[ntensors++] = s;
        total += sizes[i];
    }
    *large_chunks = (int)((large + CHUNK - 1) / CHUNK);
    uint64_t flat = 0; /* each bucket starts on a chunk: its own block */
    for (uint64_t left = total; left > 0;) {
        uint64_t bytes = left < BUCKET ? left : BUCKET;
        buckets[nbuckets++] = place(&flat, (bytes + CHUNK - 1) / CHUNK * CHUNK, CHUNK, 2);
        left -= bytes;
    }
    *bucket_chunks = (int)(flat / CHUNK);
}

static int export_chunk(void)
{
    CUmemAllocationProp prop = vmm_fd_prop();
    CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    check(cuMemCreate(&h, G, &prop, 0), "cuMemCreate");
    check(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle");
    return fd;
}

static int *pool_fds[3];
static int rebuilds; /* this step's */

/* One chunk range's rebuild, PyTorch's way (ExpandableSegment::fromShared). */
static void rebuild(struct span s, struct rebuilt *r)
{
    CUmemAccessDesc access = vmm_rw_on(0);
    rebuilds++;
    check(cuMemAddressReserve(&r->base, RESERVE, 0, 0, 0), "cuMemAddressReserve");
    for (int k = 0; k < s.count; k++) {
        int fd = dup(pool_fds[s.pool][s.pool == 1 ? 0 : s.first + k]); /* pidfd_getfd's copy */
        check(cuMemImportFromShareableHandle(&r->h[k], (void *)(intptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              "cuMemImportFromShareableHandle");
        close(fd);
    }
    for (int k = 0; k < s.count; k++)
        check(cuMemMap(r->base + (uint64_t)k * G, G, 0, r->h[k], 0), "cuMemMap");
    check(cuMemSetAccess(r->base, (uint64_t)s.count * G, &access, 1), "cuMemSetAccess");
}

static void drop(struct span s, struct rebuilt *r)
{
    for (int k = 0; k < s.count; k++) {
        check(cuMemUnmap(r->base + (uint64_t)k * G, G), "cuMemUnmap");
        check(cuMemRelease(r->h[k]), "cuMemRelease");
    }
    check(cuMemAddressFree(r->base, RESERVE), "cuMemAddressFree");
}

/* Every distinct range rebuilt, then all dropped in reverse. */
static int rebuild_all(void)
{
    int chunks = 0;
    for (int i = 0; i < nspans; i++) {
        rebuild(spans[i], &rebuilt[i]);
        chunks += spans[i].count;
    }
    for (int i = nspans; i-- > 0;)
        drop(spans[i], &rebuilt[i]);
    return chunks;
}

/* The ranges in list[] rebuilt and dropped one at a time, order[] giving
 * the order, each `times` times in a row (the engines served in turn). */
static int one_at_a_time(const struct span *list, const int *order, int n, int times)
{
    int chunks = 0;
    for (int i = 0; i < n; i++) {
        for (int e = 0; e < times; e++) {
            rebuild(list[order[i]], &rebuilt[0]);
            drop(list[order[i]], &rebuilt[0]);
            chunks += list[order[i]].count;
        }
    }
    return chunks;
}

/* This step's order of n rebuilds for shape. */
static void order_of(enum shape shape, int step, int *order, int n)
{
    for (int i = 0; i < n; i++)
        order[i] = shape == REVERSED && step % 2 ? n - 1 - i : i;
    for (int i = n - 1; shape == SHUFFLED && i > 0; i--) {
        int j = rand() % (i + 1), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
}

/* One step of shape; returns the chunks mapped. */
static int play(enum shape shape, int step, int *order)
{
    if (shape == ALL)
        return rebuild_all();
    const struct span *list = shape == BUCKETS ? buckets : tensors;
    int n = shape == BUCKETS ? nbuckets : ntensors;
    order_of(shape, step, order, n);
    return one_at_a_time(list, order, n, shape == TWO ? 2 : 1);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int shape_of(const char *name)
{
    for (int i = 0; i < (int)(sizeof(shape_names) / sizeof(*shape_names)); i++)
        if (!strcmp(name, shape_names[i]))
            return i;
    return -1;
}

int main(int argc, char **argv)
{
    int layers = argc > 1 ? atoi(argv[1]) : 22;
    int steps = argc > 2 ? atoi(argv[2]) : 1000;
    int shape = argc > 3 ? shape_of(argv[3]) : ALL;
    if (layers < 1 || steps < 1 || shape < 0) {
        fprintf(stderr, "usage: standin_rl [LAYERS [STEPS [all|one|reversed|shuffled|buckets|two]]]\n");
        return 2;
    }
    srand(17);
    check(cuInit(0), "cuInit");
    CUcontext ctx;
    check(cuCtxCreate_v2(&ctx, 0, 0), "cuCtxCreate");
    int large_chunks = 0, bucket_chunks = 0;
    lay_out(layers, &large_chunks, &bucket_chunks);
    pool_fds[0] = calloc((size_t)large_chunks, sizeof(int));
    pool_fds[1] = calloc(1, sizeof(int));
    pool_fds[2] = calloc((size_t)bucket_chunks, sizeof(int));
    double *times = calloc((size_t)steps, sizeof(double));
    int *order = calloc(MAX_TENSORS, sizeof(int));
    if (!pool_fds[0] || !pool_fds[1] || !pool_fds[2] || !times || !order)
        return 1;
    for (int c = 0; c < large_chunks; c++)
        pool_fds[0][c] = export_chunk();
    pool_fds[1][0] = export_chunk();
    for (int c = 0; shape == BUCKETS && c < bucket_chunks; c++)
        pool_fds[2][c] = export_chunk();

    struct fakevmm_counters before, after;
    int chunks = 0;
    for (int s = 0; s < WARMUP + steps; s++) {
        if (s == WARMUP)
            fakevmm_get_counters(&before);
        double t0 = now_s();
        rebuilds = 0;
        chunks = play((enum shape)shape, s, order);
        if (s >= WARMUP)
            times[s - WARMUP] = now_s() - t0;
    }
    fakevmm_get_counters(&after);
    qsort(times, (size_t)steps, sizeof(double), by_value);
    double per = 1.0 / steps;
    double maps = (double)(after.maps - before.maps) * per;
    printf("shape=%s rebuilds_per_step=%d chunks_per_step=%d step_best_us=%.1f step_median_us=%.1f "
           "map_hits=%.1f%% real_per_step: imports=%.1f reserves=%.1f maps=%.1f set_access=%.1f "
           "unmaps=%.1f frees=%.1f\n",
           shape_names[shape], rebuilds, chunks, times[0] * 1e6, times[steps / 2] * 1e6,
           100.0 * (1.0 - maps / chunks), (double)(after.imports - before.imports) * per,
           (double)(after.reserves - before.reserves) * per, maps,
           (double)(after.set_accesses - before.set_accesses) * per,
           (double)(after.unmaps - before.unmaps) * per,
           (double)(after.address_frees - before.address_frees) * per);
    return 0;
}
