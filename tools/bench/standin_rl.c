/*
 * standin_rl.c - the RL weight sync's VMM calls against the stand-in
 * driver: what the library itself costs per step, with no GPU.
 *
 * One process plays both sides. The trainer's parameters (the decoder of
 * tools/bench_torch_vmm.py: embedding, LAYERS x 6 tensors, final norm, bf16)
 * lie in two expandable segments, large tensors in 20 MiB chunks, small ones
 * (the norms) in one small-pool chunk; each chunk is exported once. Every
 * step the engine rebuilds each distinct chunk range as PyTorch's
 * ExpandableSegment::fromShared does (reserve, per chunk a received dup of
 * the export imported then closed, map, set access), then drops them all in
 * reverse (unmap and release per chunk, address free). Tensors covering the
 * same chunks share one rebuild, as PyTorch's handle cache makes them;
 * neighbours share their boundary chunk. The stand-in maps 2 MiB per chunk.
 *
 * Prints, after WARMUP untimed steps, the best and median step time and the
 * real driver calls per step; run it without and with the library preloaded
 * (make bench-standin does both). Figures are this machine's, the stand-in's
 * own cost included: compare runs side by side, not with a GPU.
 *
 * usage: standin_rl [LAYERS [STEPS]]     (default 22 layers, 1000 steps)
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

struct span {
    int small, first, count;
};

struct rebuilt {
    CUdeviceptr base;
    CUmemGenericAllocationHandle h[MAX_SPAN];
};

static struct span spans[MAX_TENSORS];
static struct rebuilt rebuilt[MAX_TENSORS];
static int nspans;

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
static struct span place(uint64_t *offset, uint64_t bytes, uint64_t round, int small)
{
    uint64_t start = *offset;
    *offset += (bytes + round - 1) / round * round;
    struct span s = { small, (int)(start / CHUNK), 0 };
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

/* The decoder's tensors, in order, as distinct chunk ranges; the chunks each pool needs. */
static void lay_out(int layers, int *large_chunks)
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
    uint64_t large = 0, small = 0;
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
    }
    *large_chunks = (int)((large + CHUNK - 1) / CHUNK);
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

/* Every tensor's rebuild, PyTorch's way; returns the chunks imported. */
static int rebuild_all(const int *large_fd, int small_fd)
{
    int chunks = 0;
    CUmemAccessDesc access = vmm_rw_on(0);
    for (int i = 0; i < nspans; i++) {
        struct span s = spans[i];
        struct rebuilt *r = &rebuilt[i];
        check(cuMemAddressReserve(&r->base, RESERVE, 0, 0, 0), "cuMemAddressReserve");
        for (int k = 0; k < s.count; k++) {
            int fd = dup(s.small ? small_fd : large_fd[s.first + k]); /* pidfd_getfd's copy */
            check(cuMemImportFromShareableHandle(&r->h[k], (void *)(intptr_t)fd,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                  "cuMemImportFromShareableHandle");
            close(fd);
        }
        for (int k = 0; k < s.count; k++)
            check(cuMemMap(r->base + (uint64_t)k * G, G, 0, r->h[k], 0), "cuMemMap");
        check(cuMemSetAccess(r->base, (uint64_t)s.count * G, &access, 1), "cuMemSetAccess");
        chunks += s.count;
    }
    return chunks;
}

static void drop_all(void)
{
    for (int i = nspans; i-- > 0;) {
        struct rebuilt *r = &rebuilt[i];
        for (int k = 0; k < spans[i].count; k++) {
            check(cuMemUnmap(r->base + (uint64_t)k * G, G), "cuMemUnmap");
            check(cuMemRelease(r->h[k]), "cuMemRelease");
        }
        check(cuMemAddressFree(r->base, RESERVE), "cuMemAddressFree");
    }
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int layers = argc > 1 ? atoi(argv[1]) : 22;
    int steps = argc > 2 ? atoi(argv[2]) : 1000;
    if (layers < 1 || steps < 1) {
        fprintf(stderr, "usage: standin_rl [LAYERS [STEPS]]\n");
        return 2;
    }
    check(cuInit(0), "cuInit");
    CUcontext ctx;
    check(cuCtxCreate_v2(&ctx, 0, 0), "cuCtxCreate");
    int large_chunks = 0;
    lay_out(layers, &large_chunks);
    int *large_fd = calloc((size_t)large_chunks, sizeof(int));
    double *times = calloc((size_t)steps, sizeof(double));
    if (!large_fd || !times)
        return 1;
    for (int c = 0; c < large_chunks; c++)
        large_fd[c] = export_chunk();
    int small_fd = export_chunk();

    struct fakevmm_counters before, after;
    int chunks = 0;
    for (int s = 0; s < WARMUP + steps; s++) {
        if (s == WARMUP)
            fakevmm_get_counters(&before);
        double t0 = now_s();
        chunks = rebuild_all(large_fd, small_fd);
        drop_all();
        if (s >= WARMUP)
            times[s - WARMUP] = now_s() - t0;
    }
    fakevmm_get_counters(&after);
    qsort(times, (size_t)steps, sizeof(double), by_value);
    double per = 1.0 / steps;
    printf("rebuilds_per_step=%d chunks_per_step=%d step_best_us=%.1f step_median_us=%.1f "
           "real_per_step: imports=%.1f reserves=%.1f maps=%.1f set_access=%.1f unmaps=%.1f\n",
           nspans, chunks, times[0] * 1e6, times[steps / 2] * 1e6,
           (double)(after.imports - before.imports) * per,
           (double)(after.reserves - before.reserves) * per,
           (double)(after.maps - before.maps) * per,
           (double)(after.set_accesses - before.set_accesses) * per,
           (double)(after.unmaps - before.unmaps) * per);
    return 0;
}
