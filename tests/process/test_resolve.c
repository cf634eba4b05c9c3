/*
 * test_resolve.c - every way a program reaches the driver's IPC functions
 * ends at our wrappers, and everything else is left exactly as it was.
 */
#include "testutil.h"

typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned);
typedef CUresult (*proc_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

int ipcc_test_which(void);
void *ipcc_test_next_from_lib1(void);

static const char *library_of(void *p)
{
    Dl_info info;
    cr_assert(dladdr(p, &info) && info.dli_fname, "no library holds %p", p);
    return info.dli_fname;
}

static void assert_ours(void *p)
{
    cr_assert_not_null(strstr(library_of(p), "libipccache"), "%p is in %s", p, library_of(p));
}

static void assert_drivers(void *p)
{
    cr_assert_not_null(strstr(library_of(p), "libcuda"), "%p is in %s", p, library_of(p));
}

/* What *pfn holds before a lookup: not NULL, so that a wrapper handed out
 * on a failure, or a stale value left in place, shows. */
static void sentinel_fn(void) {}
#define SENTINEL ((void *)sentinel_fn)

static void *resolve(const char *name, int version, CUdriverProcAddressQueryResult *status)
{
    void *p = SENTINEL;
    cr_assert_eq(cuGetProcAddress_v2(name, &p, version, 0, status), CUDA_SUCCESS);
    return p;
}

/* dlsym on the driver's handle gives our wrappers for both spellings. */
Test(resolve, dlsym_on_driver_handle, .timeout = 10)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    cr_assert_not_null(h);
    assert_ours(dlsym(h, "cuIpcOpenMemHandle_v2"));
    assert_ours(dlsym(h, "cuIpcOpenMemHandle"));
    assert_ours(dlsym(h, "cuIpcCloseMemHandle"));
    assert_ours(dlsym(h, "cuGetProcAddress_v2"));
    assert_ours(dlsym(h, "cuGetProcAddress"));
    assert_drivers(dlsym(h, "cuCtxCreate_v2"));
    assert_ours(dlsym(h, "cuIpcGetMemHandle"));
    assert_ours(dlsym(h, "cuMemFree_v2"));
    assert_drivers(dlsym(h, "cuMemAlloc_v2"));
}

/* A name the library does not have stays unfound, with dlerror set. */
Test(resolve, dlsym_missing_name, .timeout = 10)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    dlerror();
    cr_assert_null(dlsym(h, "cuNoSuchFunction"));
    cr_assert_not_null(dlerror());
}

/* The resolver picks the ABI for the requested version, as the driver does. */
Test(resolve, resolver_versions_pick_abi, .timeout = 10)
{
    CUdriverProcAddressQueryResult st = 99;
    void *v2 = resolve("cuIpcOpenMemHandle", 11000, &st);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
    cr_assert_eq(v2, dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle_v2"));
    void *v1 = resolve("cuIpcOpenMemHandle", 4010, &st);
    cr_assert_eq(v1, dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle"));
    cr_assert_neq(v1, v2);
    assert_ours(resolve("cuIpcCloseMemHandle", 4010, &st));
    cr_assert_eq(resolve("cuGetProcAddress", 12000, &st), dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
    cr_assert_eq(resolve("cuGetProcAddress", 11030, &st), dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
    assert_ours(resolve("cuCtxDestroy", 4000, &st));
    assert_ours(resolve("cuDevicePrimaryCtxReset", 11000, &st));
    assert_drivers(resolve("cuCtxCreate", 12000, &st));
    /* cudart asks for cuMemFree at 3020: the 64-bit ABI, whose wrapper sees an exporter's free. */
    cr_assert_eq(resolve("cuMemFree", 3020, &st), dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
}

/* Not-found and too-new answers come back untouched, pointer NULL. */
Test(resolve, resolver_statuses_pass_through, .timeout = 10)
{
    CUdriverProcAddressQueryResult st = 99;
    cr_assert_null(resolve("cuIpcOpenMemHandle", 4000, &st));
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    cr_assert_null(resolve("cuNoSuchFunction", 12000, &st));
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    cr_assert_null(resolve("", 0, &st), "cudart's first probe");
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

/* A version above the driver's, or bad flags, is the driver's error; the
 * driver leaves *pfn as it was, and so must we (no wrapper handed out). */
Test(resolve, resolver_error_untouched, .timeout = 10)
{
    proc_v1_fn v1 = (proc_v1_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress");
    void *p = SENTINEL;
    cr_assert_eq(cuGetProcAddress_v2("cuIpcOpenMemHandle", &p, 99000, 0, NULL),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(p, SENTINEL);
    cr_assert_eq(cuGetProcAddress_v2("cuIpcOpenMemHandle", &p, 12000, 7, NULL),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(p, SENTINEL);
    cr_assert_eq(v1("cuIpcCloseMemHandle", &p, 99000, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(p, SENTINEL);
}

/* The 4-argument resolver substitutes too, and a nested lookup stays ours. */
Test(resolve, resolver_v1_and_nested, .timeout = 10)
{
    proc_v1_fn v1 = (proc_v1_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress");
    void *p = SENTINEL;
    cr_assert_eq(v1("cuIpcOpenMemHandle", &p, 11000, 0), CUDA_SUCCESS);
    assert_ours(p);
    proc_v2_fn nested = resolve("cuGetProcAddress", 12000, NULL);
    cr_assert_eq(nested("cuIpcCloseMemHandle", &p, 4010, 0, NULL), CUDA_SUCCESS);
    assert_ours(p);
}

/* cudart's exact sequence: dlopen, dlsym the resolver, resolve at 11000. */
Test(resolve, cudart_sequence_is_cached, .timeout = 10)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    proc_v2_fn gpa = (proc_v2_fn)dlsym(h, "cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult st;
    void *p = SENTINEL;
    cr_assert_eq(gpa("", &p, 0, 0, &st), CUDA_SUCCESS);
    cr_assert_null(p);
    open_fn open = NULL;
    CUresult (*close)(CUdeviceptr) = NULL;
    cr_assert_eq(gpa("cuIpcOpenMemHandle", (void **)&open, 11000, 0, &st), CUDA_SUCCESS);
    cr_assert_eq(gpa("cuIpcCloseMemHandle", (void **)&close, 4010, 0, &st), CUDA_SUCCESS);
    tu_context();
    CUipcMemHandle handle = tu_handle(40, 4096);
    for (int i = 0; i < 10; i++) {
        CUdeviceptr d = 0;
        cr_assert_eq(open(&d, handle, 1), CUDA_SUCCESS);
        cr_assert_eq(close(d), CUDA_SUCCESS);
    }
    cr_assert_eq(tu_driver().maps, 1);
    cr_assert_eq(tu_driver().open_calls, 1, "one application call is one driver call at most");
}

/* RTLD_NEXT asked from another library is relative to that library. */
Test(resolve, rtld_next_from_a_library, .timeout = 10)
{
    int (*next)(void) = (int (*)(void))ipcc_test_next_from_lib1();
    cr_assert_not_null(next);
    cr_assert_eq(next(), 2, "RTLD_NEXT from library 1 must find library 2");
}

/* RTLD_NEXT and RTLD_DEFAULT asked from the program keep their meaning. */
Test(resolve, rtld_next_from_the_program, .timeout = 10)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "ipcc_test_which");
    cr_assert_not_null(next);
    cr_assert_eq(next(), 1);
    cr_assert_eq(dlsym(RTLD_DEFAULT, "ipcc_test_which"), (void *)ipcc_test_which);
    cr_assert_eq(dlsym(RTLD_DEFAULT, "malloc"), (void *)malloc);
}

/* With IPCCACHE_DISABLE=1 the resolver and dlsym hand out the driver's own. */
Test(resolve, disabled_hands_out_driver_functions, .timeout = 10)
{
    setenv("IPCCACHE_DISABLE", "1", 1);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    assert_drivers(dlsym(h, "cuIpcOpenMemHandle_v2"));
    assert_drivers(resolve("cuIpcOpenMemHandle", 11000, NULL));
}
