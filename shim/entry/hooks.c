/*
 * hooks.c - the exported driver entry points, and the one table that lists
 * them. Each wrapper is thin: it forwards to legacy_calls.c (IPC), to the real
 * resolver (cuGetProcAddress), or to the real teardown call, around which
 * importers let go of what was exported in the dying context and its
 * entries are dropped.
 *
 * cuda.h renames several functions to their _v2 spelling; we #undef the
 * renames so both spellings can be defined, each forwarding to the ABI it
 * names (v1 and v2 of these calls share signatures, except the resolver).
 */
#include <cuda.h>

#include "entry.h"

#undef cuIpcOpenMemHandle
#undef cuGetProcAddress
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuMemFree

typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*proc_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
typedef CUresult (*ctx_fn)(CUcontext);
typedef CUresult (*device_fn)(CUdevice);

/* cuda.h declares only the _v2 spelling of these (the 5-argument resolver
 * under either name); the v1 symbols still exist in every driver. */
IPCC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags);
IPCC_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                        unsigned int flags);
IPCC_EXPORT CUresult cuCtxDestroy(CUcontext ctx);
IPCC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
IPCC_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev);
IPCC_EXPORT CUresult cuMemFree(unsigned int dptr); /* the 32-bit CUdeviceptr_v1 ABI */

_Static_assert(IPCC_CUDA_NO_DRIVER == CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
               "base.h's code for 'no driver' is cuda.h's");

/* ---- IPC memory --------------------------------------------------------- */

IPCC_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                        unsigned int flags)
{
    return (CUresult)ipcc_legacy_open_call(IPCC_SLOT_OPEN_V1, (uint64_t *)pdptr, &handle, flags);
}

IPCC_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                           unsigned int flags)
{
    return (CUresult)ipcc_legacy_open_call(IPCC_SLOT_OPEN_V2, (uint64_t *)pdptr, &handle, flags);
}

IPCC_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    return (CUresult)ipcc_legacy_close_call((uint64_t)dptr);
}

/* ---- exported memory: its free waits for importers' idle mappings ------- */

IPCC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    return (CUresult)ipcc_legacy_export_call(handle, (uint64_t)dptr);
}

IPCC_EXPORT CUresult cuMemFree(unsigned int dptr)
{
    return (CUresult)ipcc_legacy_free_call(IPCC_SLOT_MEM_FREE_V1, dptr);
}

IPCC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return (CUresult)ipcc_legacy_free_call(IPCC_SLOT_MEM_FREE_V2, (uint64_t)dptr);
}

/* ---- the resolver ------------------------------------------------------- */

/* Substitutes only on a clean success: a failure, a not-found or too-new
 * status, or a NULL pointer goes back to the caller untouched. The caller's
 * address tells resolve.c whether an interposer below us is asking. */
static void substitute(const char *symbol, void **pfn, int version,
                       const CUdriverProcAddressQueryResult *status, const void *caller)
{
    if (pfn && *pfn && (!status || *status == CU_GET_PROC_ADDRESS_SUCCESS))
        *pfn = ipcc_resolve_substitute(symbol, version, *pfn, caller);
}

IPCC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags)
{
    proc_v1_fn real = (proc_v1_fn)ipcc_real(IPCC_SLOT_PROC_V1);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    CUresult rc = real(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS)
        substitute(symbol, pfn, version, NULL, __builtin_return_address(0));
    return rc;
}

IPCC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status)
{
    proc_v2_fn real = (proc_v2_fn)ipcc_real(IPCC_SLOT_PROC_V2);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    CUresult rc = real(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS)
        substitute(symbol, pfn, version, status, __builtin_return_address(0));
    return rc;
}

/* ---- context teardown: the driver unmaps and frees what the context held */

static CUresult destroy_context(int slot, CUcontext ctx)
{
    ctx_fn real = (ctx_fn)ipcc_real(slot);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    uint64_t id = 0;
    /* Only a process that cached or exported something (either made the
     * table) needs to look. */
    int known = ctx && ipcc_budget_legacy() && ipcc_legacy_context_id(ctx, &id) == 0;
    if (known)
        ipcc_legacy_exporter_teardown(id); /* importers let go first, as at a free */
    CUresult rc = real(ctx);
    if (rc == CUDA_SUCCESS && known)
        ipcc_legacy_forget_context(id);
    return rc;
}

IPCC_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    return destroy_context(IPCC_SLOT_CTX_DESTROY_V1, ctx);
}

IPCC_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    return destroy_context(IPCC_SLOT_CTX_DESTROY_V2, ctx);
}

/* A primary context dies on reset, and on the release that drops its last
 * reference; which one happened is the driver's business, so check them. */
static CUresult primary_teardown(int slot, CUdevice dev)
{
    device_fn real = (device_fn)ipcc_real(slot);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    CUresult rc = real(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ipcc_budget_legacy())
        ipcc_legacy_sweep_contexts();
    ipcc_legacy_exporter_sweep(); /* before the call returns: the memory is back */
    return rc;
}

IPCC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_teardown(IPCC_SLOT_PRIMARY_RELEASE_V1, dev);
}

IPCC_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_teardown(IPCC_SLOT_PRIMARY_RELEASE_V2, dev);
}

IPCC_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_teardown(IPCC_SLOT_PRIMARY_RESET_V1, dev);
}

IPCC_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_teardown(IPCC_SLOT_PRIMARY_RESET_V2, dev);
}

/* ---- VMM sharing (PyTorch expandable segments): vmm_calls.c ------------- */

/* A VMM call that may leave something idle, by a thread that was lent a
 * legacy entry (tables/legacy_loans.c): its later lent closes must count as
 * after it in the one LRU order, and their own clock is coarse. One load
 * otherwise. */
static CUresult after_vmm_idle(CUresult rc)
{
    if (ipcc_legacy_loan_held())
        ipcc_legacy_loan_floor(ipcc_clock_ns());
    return rc;
}

IPCC_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                    void *os_handle,
                                                    CUmemAllocationHandleType type)
{
    return (CUresult)ipcc_vmm_import_call((uint64_t *)handle, os_handle, (int)type);
}

IPCC_EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle,
                                                  CUmemAllocationHandleType type,
                                                  unsigned long long flags)
{
    return (CUresult)ipcc_vmm_export_call(out, handle, (int)type, flags);
}

IPCC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    return after_vmm_idle((CUresult)ipcc_vmm_release_call(handle));
}

IPCC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
                                         CUdeviceptr addr, unsigned long long flags)
{
    return (CUresult)ipcc_vmm_reserve_call((uint64_t *)ptr, size, align, addr, flags);
}

IPCC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    return after_vmm_idle((CUresult)ipcc_vmm_free_call(ptr, size));
}

IPCC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    return (CUresult)ipcc_vmm_map_call(ptr, size, offset, handle, flags);
}

IPCC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    return after_vmm_idle((CUresult)ipcc_vmm_unmap_call(ptr, size));
}

IPCC_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                    size_t count)
{
    return (CUresult)ipcc_vmm_set_access_call(ptr, size, desc, count);
}

IPCC_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                    CUdeviceptr ptr)
{
    return (CUresult)ipcc_vmm_get_access_call(flags, location, ptr);
}

/* ---- the table ---------------------------------------------------------- */

/* One row per line of hooks.def: every slot has a row, each row its wrapper. */
struct ipcc_hook ipcc_hooks[IPCC_SLOT_COUNT] = {
#define IPCC_HOOK(slot, sym, proc, ver) \
    [IPCC_SLOT_##slot] = { .symbol = #sym, .proc_name = #proc, .since = ver, .wrapper = (void *)sym },
#include "hooks.def"
#undef IPCC_HOOK
};
