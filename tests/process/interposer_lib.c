/*
 * interposer_lib.c - a second CUDA interposer, preloaded next to ipccache in
 * either order, as a tracer or a GPU-sharing layer would be. It wraps the IPC
 * open and close, counts the calls, and forwards them to the next
 * definition, found the way such libraries find it:
 *
 *   built plain:               dlsym(RTLD_NEXT, name)
 *   built with LOOKUP_HANDLE:  dlsym(dlopen("libcuda.so.1", RTLD_NOLOAD), name)
 *   built with LOOKUP_RESOLVER: the linked cuGetProcAddress_v2 (the first
 *                              definition in load order)
 *
 * Built with HOOK_RESOLVER it exports no IPC names: it wraps the resolver
 * (cuGetProcAddress_v2) and hands out its own wrappers, as tracers that
 * follow cudart's lookups do; they still forward by RTLD_NEXT.
 *
 * A call that comes back into this library while it is already forwarding
 * is recursion (the next function led back here): it is counted and fails
 * at once, so a test sees it instead of a stack overflow.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define RECURSED CUDA_ERROR_NOT_PERMITTED

typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*close_fn)(CUdeviceptr);
typedef CUresult (*resolver_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

struct interposer_counts {
    long opens, closes, reentries;
};

static atomic_long opens, closes, reentries;
static __thread int depth;

EXPORT void interposer_counts(struct interposer_counts *out);

EXPORT void interposer_counts(struct interposer_counts *out)
{
    out->opens = atomic_load(&opens);
    out->closes = atomic_load(&closes);
    out->reentries = atomic_load(&reentries);
}

static void *next(const char *name)
{
#if defined(LOOKUP_HANDLE)
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *p = driver ? dlsym(driver, name) : NULL;
    if (driver)
        dlclose(driver);
    return p;
#elif defined(LOOKUP_RESOLVER)
    resolver_fn resolve = (resolver_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    int open = strcmp(name, "cuIpcOpenMemHandle_v2") == 0;
    void *p = NULL;
    if (!resolve || resolve(open ? "cuIpcOpenMemHandle" : name, &p, open ? 11000 : 4010, 0,
                            NULL) != CUDA_SUCCESS)
        return NULL;
    return p;
#else
    return dlsym(RTLD_NEXT, name);
#endif
}

/* 1 when this thread is already inside one of our wrappers. */
static int entering(void)
{
    if (depth++ == 0)
        return 0;
    atomic_fetch_add(&reentries, 1);
    return 1;
}

static CUresult open_wrapper(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    CUresult rc = RECURSED;
    atomic_fetch_add(&opens, 1);
    if (!entering()) {
        open_fn real = (open_fn)next("cuIpcOpenMemHandle_v2");
        rc = real ? real(pdptr, handle, flags) : CUDA_ERROR_NOT_FOUND;
    }
    depth--;
    return rc;
}

static CUresult close_wrapper(CUdeviceptr dptr)
{
    CUresult rc = RECURSED;
    atomic_fetch_add(&closes, 1);
    if (!entering()) {
        close_fn real = (close_fn)next("cuIpcCloseMemHandle");
        rc = real ? real(dptr) : CUDA_ERROR_NOT_FOUND;
    }
    depth--;
    return rc;
}

#ifdef HOOK_RESOLVER
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    resolver_fn real = (resolver_fn)dlsym(RTLD_NEXT, "cuGetProcAddress_v2");
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real(symbol, pfn, version, flags, status);
    if (rc != CUDA_SUCCESS || !symbol || !pfn || !*pfn)
        return rc;
    if (strcmp(symbol, "cuIpcOpenMemHandle") == 0 && version >= 11000)
        *pfn = (void *)open_wrapper;
    else if (strcmp(symbol, "cuIpcCloseMemHandle") == 0)
        *pfn = (void *)close_wrapper;
    return rc;
}
#else
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                      unsigned int flags)
{
    return open_wrapper(pdptr, handle, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    return close_wrapper(dptr);
}
#endif
