/*
 * standin_hits.c - the legacy hit pair (cuIpcOpenMemHandle + close of a
 * cached handle) against the stand-in driver: what the library itself costs
 * per pair, alone and with threads, with no GPU.
 *
 * The stand-in's cuCtxGetCurrent is a thread-local read, so with the library
 * preloaded the time is almost all the library's; without it every pair is
 * the stand-in's own (locked) open and close, shown for scale only. Each
 * thread makes the one context current and does PAIRS pairs, timed as a
 * whole (one clock reading per thread at each end), on one handle shared by
 * all threads ("same") or on a handle of its own ("different"). One warm-up
 * pair per handle is untimed (the miss). Prints one line per case:
 *
 *   same threads=4 pairs=2000000 ns_per_pair=... mpairs_per_s=... driver_opens=0
 *
 * ns_per_pair is wall time x threads / pairs (per thread, what one pair costs
 * it); mpairs_per_s is the aggregate. Figures are this machine's: compare
 * runs side by side, never with a GPU.
 *
 * usage: standin_hits [PAIRS_PER_THREAD [THREADS,...]]  (default 1000000; 1,2,4,8,16)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "fake_cuda.h"

#define MAX_THREADS 64

static CUcontext ctx;
static long pairs_per_thread = 1000000;
static pthread_barrier_t start_line;
static CUipcMemHandle handles[MAX_THREADS];

struct worker {
    int handle;
    uint64_t t0, t1;
    int failed;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int pair(const CUipcMemHandle *h)
{
    CUdeviceptr p = 0;
    if (cuIpcOpenMemHandle(&p, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS)
        return -1;
    return cuIpcCloseMemHandle(p) == CUDA_SUCCESS ? 0 : -1;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    const CUipcMemHandle *h = &handles[w->handle];
    cuCtxSetCurrent(ctx);
    pthread_barrier_wait(&start_line);
    w->t0 = now_ns();
    for (long i = 0; i < pairs_per_thread && !w->failed; i++)
        w->failed = pair(h) != 0;
    w->t1 = now_ns();
    return NULL;
}

/* n threads, on one handle (distinct = 0) or one each; returns 0 if all went well. */
static int run_case(int n, int distinct)
{
    pthread_t t[MAX_THREADS];
    struct worker w[MAX_THREADS];
    struct fakecuda_counters before, after;
    for (int i = 0; i < n; i++)
        if (pair(&handles[distinct ? i : 0]) != 0) /* the miss, untimed */
            return -1;
    fakecuda_get_counters(&before);
    pthread_barrier_init(&start_line, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        w[i] = (struct worker){ .handle = distinct ? i : 0 };
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    uint64_t first = UINT64_MAX, last = 0;
    int failed = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        first = w[i].t0 < first ? w[i].t0 : first;
        last = w[i].t1 > last ? w[i].t1 : last;
        failed |= w[i].failed;
    }
    pthread_barrier_destroy(&start_line);
    fakecuda_get_counters(&after);
    double wall = (double)(last - first), total = (double)pairs_per_thread * n;
    printf("%s threads=%d pairs=%.0f ns_per_pair=%.1f mpairs_per_s=%.2f driver_opens=%llu%s\n",
           distinct ? "different" : "same", n, total, wall * n / total, total / wall * 1e3,
           (unsigned long long)(after.open_calls - before.open_calls), failed ? " FAILED" : "");
    return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
    int threads[MAX_THREADS], nthreads = 0;
    if (argc > 1)
        pairs_per_thread = atol(argv[1]);
    char list[256] = "1,2,4,8,16";
    if (argc > 2)
        snprintf(list, sizeof(list), "%s", argv[2]);
    for (char *s = strtok(list, ","); s && nthreads < MAX_THREADS; s = strtok(NULL, ","))
        if (atoi(s) >= 1 && atoi(s) <= MAX_THREADS)
            threads[nthreads++] = atoi(s);
    if (pairs_per_thread <= 0 || nthreads == 0) {
        fprintf(stderr, "usage: standin_hits [PAIRS_PER_THREAD [THREADS,...]]\n");
        return 2;
    }
    if (cuInit(0) != CUDA_SUCCESS || cuCtxCreate_v2(&ctx, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "standin_hits: no context\n");
        return 1;
    }
    for (int i = 0; i < MAX_THREADS; i++)
        fakecuda_make_foreign_handle(&handles[i], 7000 + (uint64_t)i, 1 << 20);
    int rc = 0;
    for (int distinct = 0; distinct <= 1; distinct++)
        for (int i = 0; i < nthreads; i++)
            rc |= run_case(threads[i], distinct);
    return rc ? 1 : 0;
}
