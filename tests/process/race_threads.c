/*
 * race_threads.c - the legacy hit path under ThreadSanitizer (tests/process/test_tsan.sh
 * builds the library, the stand-in driver and this program with it; Criterion
 * cannot run under it).
 *
 * Threads hammer a few handles on one context, sometimes nested, mostly
 * each its own (lent to it: no lock) and now and then another's (taking it
 * back on the locked path). With an idle cap (the argument, e.g. 2) closes
 * evict other threads' entries too, so that hits, misses, loans, recalls
 * and removals from the table interleave. Any data race is
 * ThreadSanitizer's to report; the counts are checked here: every call
 * succeeds, and afterwards each handle is mapped once by the driver, with
 * exactly the cache's one reference, and no more are idle than the cap.
 *
 * usage: race_threads [MAX_IDLE_ENTRIES]
 * Exit status: 0 fine, 1 a call failed or a count is wrong (said on stderr).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>

#include "fake_cuda.h"

#define THREADS 8
#define ROUNDS 3000
#define HANDLES 4

static CUcontext ctx;

static CUipcMemHandle handle(int i)
{
    CUipcMemHandle h;
    fakecuda_make_foreign_handle(&h, 900 + (uint64_t)i, 1 << 20);
    return h;
}

static void *hammer(void *arg)
{
    long id = (long)arg;
    cuCtxSetCurrent(ctx);
    for (int i = 0; i < ROUNDS; i++) {
        /* Mostly the thread's own handle (its memo), now and then another. */
        int which = i % 5 == 0 ? (int)((i / 5 + id) % HANDLES) : (int)(id % HANDLES);
        CUipcMemHandle h = handle(which);
        CUdeviceptr a = 0, b = 0;
        if (cuIpcOpenMemHandle(&a, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS)
            return (void *)1;
        if (i % 7 == 0 &&
            (cuIpcOpenMemHandle(&b, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS ||
             b != a || cuIpcCloseMemHandle(b) != CUDA_SUCCESS))
            return (void *)2;
        if (cuIpcCloseMemHandle(a) != CUDA_SUCCESS)
            return (void *)3;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    long cap = argc > 1 ? atol(argv[1]) : -1;
    if (cap >= 0)
        setenv("IPCCACHE_MAX_IDLE_ENTRIES", argv[1], 1);
    if (cuInit(0) != CUDA_SUCCESS || cuCtxCreate_v2(&ctx, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "race_threads: no context\n");
        return 1;
    }
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, hammer, (void *)i);
    int failed = 0;
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        if (ret) {
            fprintf(stderr, "race_threads: thread %d failed at step %ld\n", i, (long)ret);
            failed = 1;
        }
    }
    for (int i = 0; i < HANDLES; i++) {
        CUdeviceptr p = 0;
        if (cuIpcOpenMemHandle(&p, handle(i), CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS) {
            fprintf(stderr, "race_threads: handle %d does not open\n", i);
            return 1;
        }
        /* The driver holds one reference: the cache's, lent to this open. */
        if (fakecuda_refcount(NULL, p) != 1) {
            fprintf(stderr, "race_threads: handle %d has %d driver references, not 1\n", i,
                    fakecuda_refcount(NULL, p));
            failed = 1;
        }
        cuIpcCloseMemHandle(p);
    }
    struct fakecuda_counters c;
    fakecuda_get_counters(&c);
    if (cap >= 0 && c.live_mappings > cap) {
        fprintf(stderr, "race_threads: %lld mappings idle, over the cap of %ld\n",
                (long long)c.live_mappings, cap);
        failed = 1;
    }
    return failed;
}
