/*
 * testutil.h - helpers shared by the in-process tests (test_e2e), which are
 * linked with libipccache.so ahead of the stand-in driver: the same search
 * order LD_PRELOAD gives.
 */
#ifndef IPCC_TESTUTIL_H
#define IPCC_TESTUTIL_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <cuda.h>

#include "fake_cuda.h"

/* A fresh context on device 0, made current on this thread. */
static inline CUcontext tu_context(void)
{
    CUcontext ctx = NULL;
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    cr_assert_eq(cuCtxCreate_v2(&ctx, 0, 0), CUDA_SUCCESS);
    return ctx;
}

/* A handle exported by "another process" for allocation number serial. */
static inline CUipcMemHandle tu_handle(uint64_t serial, uint64_t bytes)
{
    CUipcMemHandle h;
    fakecuda_make_foreign_handle(&h, serial, bytes);
    return h;
}

/* Runs fn in n threads at once (argument: the thread's index) and joins
 * them; each must return NULL, or the step it failed at. */
#define TU_MAX_THREADS 128
static inline void tu_run_threads(void *(*fn)(void *), int n)
{
    pthread_t t[TU_MAX_THREADS];
    cr_assert_leq(n, TU_MAX_THREADS);
    for (long i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fn, (void *)i), 0);
    for (int i = 0; i < n; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_assert_null(ret, "thread %d failed at step %ld", i, (long)ret);
    }
}

static inline struct fakecuda_counters tu_driver(void)
{
    struct fakecuda_counters c;
    fakecuda_get_counters(&c);
    return c;
}

static inline CUdeviceptr tu_open(CUipcMemHandle h)
{
    CUdeviceptr p = 0;
    cr_assert_eq(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
    cr_assert_neq(p, 0);
    return p;
}

static inline void tu_close(CUdeviceptr p)
{
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
}

/* Reads integer key from the last line of a stats file, the first one past
 * the text after (NULL: from the start); -1 if absent. */
static inline long long tu_stat_after(const char *path, const char *after, const char *key)
{
    char buf[8192] = { 0 }, pat[64];
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[8192];
    while (fgets(line, sizeof(line), f))
        strcpy(buf, line);
    fclose(f);
    const char *from = after ? strstr(buf, after) : buf;
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *at = from ? strstr(from, pat) : NULL;
    return at ? strtoll(at + strlen(pat), NULL, 10) : -1;
}

/* Reads integer key from the last line of a stats file; -1 if absent. */
static inline long long tu_stat(const char *path, const char *key)
{
    return tu_stat_after(path, NULL, key);
}

static char tu_stats_path[512];

static inline void tu_remove_stats_file(void)
{
    unlink(tu_stats_path);
}

/* A private stats file for this test process, in $TMPDIR (the suite gives
 * each run its own), removed when the test process exits. */
static inline const char *tu_stats_file(void)
{
    const char *dir = getenv("TMPDIR");
    snprintf(tu_stats_path, sizeof(tu_stats_path), "%s/ipcc-test-%ld.stats",
             dir && *dir == '/' ? dir : "/tmp", (long)getpid());
    unlink(tu_stats_path);
    setenv("IPCCACHE_STATS_FILE", tu_stats_path, 1);
    atexit(tu_remove_stats_file);
    return tu_stats_path;
}

#endif
