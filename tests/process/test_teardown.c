/*
 * test_teardown.c - a context that dies takes its mappings with it; the
 * cache must never hand out a mapping of a dead context, even when a new
 * context appears at the same address.
 */
#include "testutil.h"

static CUcontext retained_primary(void)
{
    CUcontext pctx = NULL;
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&pctx, 0), CUDA_SUCCESS);
    cr_assert_eq(cuCtxSetCurrent(pctx), CUDA_SUCCESS);
    return pctx;
}

static CUcontext new_context(void)
{
    CUcontext ctx = NULL;
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    cr_assert_eq(cuCtxCreate_v2(&ctx, 0, 0), CUDA_SUCCESS);
    return ctx;
}

struct teardown {
    CUcontext (*create)(void);  /* a context on device 0, made current */
    void (*kill)(CUcontext);
};

/*
 * A context's teardown makes the cache forget its entries, not merely stop
 * reaching them. With room for two idle entries: an idle B in a live context,
 * an idle A in the doomed one; after the teardown a third idle entry in the
 * live context must leave B cached (a leftover A would count, and push B
 * out first). Then a context born at the doomed one's address maps A afresh.
 */
static void expect_forgotten(const struct teardown *t)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "2", 1);
    CUcontext doomed = t->create(), live = NULL;
    CUipcMemHandle a = tu_handle(20, 4096);
    cr_assert_eq(cuCtxCreate_v2(&live, 0, 1), CUDA_SUCCESS);
    CUdeviceptr b = tu_open(tu_handle(21, 4096));
    tu_close(b);
    cr_assert_eq(cuCtxSetCurrent(doomed), CUDA_SUCCESS);
    tu_close(tu_open(a));
    t->kill(doomed);
    cr_assert_eq(cuCtxSetCurrent(live), CUDA_SUCCESS);
    tu_close(tu_open(tu_handle(22, 4096)));
    cr_assert_eq(fakecuda_refcount(live, b), 1, "the dead context's entry took B's room");

    CUcontext born = t->create();
    cr_assert_eq(born, doomed, "the stand-in reuses the address, as drivers may");
    uint64_t maps = tu_driver().maps;
    CUdeviceptr p = tu_open(a);
    cr_assert_eq(tu_driver().maps, maps + 1, "a real map in the new context");
    cr_assert_eq(fakecuda_refcount(born, p), 1);
}

static void destroy(CUcontext ctx)
{
    cr_assert_eq(cuCtxDestroy(ctx), CUDA_SUCCESS);
}

static void reset_primary(CUcontext ctx)
{
    (void)ctx;
    cr_assert_eq(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
}

static void release_primary(CUcontext ctx)
{
    (void)ctx;
    cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

/* A destroyed context's entries are forgotten; its successor maps afresh. */
Test(teardown, destroyed_context_never_returns_dead_mapping, .timeout = 10)
{
    expect_forgotten(&(struct teardown){ new_context, destroy });
}

/* A reset primary context (cudaDeviceReset) is forgotten the same way. */
Test(teardown, primary_reset_forgets_mappings, .timeout = 10)
{
    expect_forgotten(&(struct teardown){ retained_primary, reset_primary });
}

/* So is one whose last reference was released. */
Test(teardown, primary_release_to_zero_forgets_mappings, .timeout = 10)
{
    expect_forgotten(&(struct teardown){ retained_primary, release_primary });
}

/* A release that leaves the primary context alive keeps its entries. */
Test(teardown, primary_release_not_last_keeps_mappings, .timeout = 10)
{
    CUcontext pctx = NULL;
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&pctx, 0), CUDA_SUCCESS);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&pctx, 0), CUDA_SUCCESS);
    cr_assert_eq(cuCtxSetCurrent(pctx), CUDA_SUCCESS);
    CUipcMemHandle h = tu_handle(23, 4096);
    tu_close(tu_open(h));
    cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    tu_close(tu_open(h));
    cr_assert_eq(tu_driver().maps, 1);
}

/* Destroying one context leaves another context's entries alone. */
Test(teardown, other_contexts_survive, .timeout = 10)
{
    CUcontext c1 = tu_context();
    CUipcMemHandle h = tu_handle(24, 4096);
    tu_close(tu_open(h));
    CUcontext c2 = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 1), CUDA_SUCCESS);
    tu_close(tu_open(h));
    cr_assert_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
    cr_assert_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    tu_close(tu_open(h));
    cr_assert_eq(tu_driver().maps, 2);
}

/* A new context at a dead one's address has its own identity: a later sweep
 * (any primary release) keeps its entries, and reference counts stay exact. */
Test(teardown, reused_address_keeps_its_own_identity, .timeout = 10)
{
    CUcontext c1 = tu_context();
    CUipcMemHandle h = tu_handle(25, 4096);
    tu_close(tu_open(h));
    cr_assert_eq(cuCtxDestroy(c1), CUDA_SUCCESS);
    CUcontext c2 = NULL, other = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(c1, c2);
    CUdeviceptr a = tu_open(h), b = tu_open(h);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&other, 1), CUDA_SUCCESS);
    cr_assert_eq(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS); /* triggers a sweep */
    cr_assert_eq(cuCtxSetCurrent(c2), CUDA_SUCCESS);
    tu_close(a);
    tu_close(b);
    cr_assert_eq(fakecuda_refcount(c2, a), 1, "the cache still holds its one reference");
}

/* Without cuCtxGetId, a release that leaves the primary context alive
 * leaves the application's mappings alone: both closes succeed. */
Test(teardown, primary_release_not_last_without_context_ids, .timeout = 10)
{
    setenv("FAKECUDA_NO_CTXGETID", "1", 1);
    CUcontext pctx = retained_primary();
    cr_assert_eq(cuDevicePrimaryCtxRetain(&pctx, 0), CUDA_SUCCESS);
    CUipcMemHandle h = tu_handle(29, 4096);
    CUdeviceptr a = tu_open(h), b = tu_open(h);
    cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    tu_close(a);
    cr_assert_eq(fakecuda_refcount(pctx, b), 1, "still mapped for the second open");
    tu_close(b);
    cr_assert_eq(fakecuda_refcount(pctx, b), 0);
}
