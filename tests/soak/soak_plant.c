/*
 * soak_plant.c - faults planted under the library, to prove the soak's
 * verdict sees them (tests/soak/test_soak.sh). Preloaded after
 * libipccache.so, it is the "driver" the library's misses reach:
 *
 *   SOAK_PLANT=leak-fd      every real open keeps an fd open (/dev/null), as
 *                           a library that leaked one per miss would;
 *   SOAK_PLANT=wrong-value  the SOAK_PLANT_AT-th real open (default 100)
 *                           answers a pointer 1 GiB past the mapping, where
 *                           no allocation lies;
 *   SOAK_PLANT=keep-mapping every real close answers success and unmaps
 *                           nothing, as a library that lost track of what
 *                           it keeps would: freed memory stays mapped.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#undef cuIpcOpenMemHandle

#define EXPORT __attribute__((visibility("default")))

typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);

static atomic_long opens;

static CUresult planted(const char *name, CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
    open_fn next = (open_fn)dlsym(RTLD_NEXT, name);
    if (!next)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = next(p, h, flags);
    const char *what = getenv("SOAK_PLANT");
    long n = atomic_fetch_add(&opens, 1) + 1;
    if (what && !strcmp(what, "leak-fd"))
        (void)open("/dev/null", O_RDONLY | O_CLOEXEC);
    const char *at = getenv("SOAK_PLANT_AT");
    if (what && !strcmp(what, "wrong-value") && rc == CUDA_SUCCESS && n == (at ? atol(at) : 100))
        *p += 1ULL << 30;
    return rc;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags);
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags);

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
    return planted("cuIpcOpenMemHandle_v2", p, h, flags);
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
    return planted("cuIpcOpenMemHandle", p, h, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p);

CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    const char *what = getenv("SOAK_PLANT");
    if (what && !strcmp(what, "keep-mapping"))
        return CUDA_SUCCESS;
    CUresult (*next)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(RTLD_NEXT, "cuIpcCloseMemHandle");
    return next ? next(p) : CUDA_ERROR_NOT_FOUND;
}
