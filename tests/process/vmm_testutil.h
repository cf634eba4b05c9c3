/*
 * vmm_testutil.h - the VMM helpers shared by the in-process tests
 * (test_vmm.c, test_budget.c): an exporter's segment made in process, and
 * the consumer's rebuild and release of it (PyTorch's ExpandableSegment).
 */
#ifndef IPCC_VMM_TESTUTIL_H
#define IPCC_VMM_TESTUTIL_H

#include "testutil.h"
#include "fake_vmm.h"
#include "gpu/vmm_pair.h"

#define G FAKEVMM_GRANULARITY
#define CHUNKS 3

static inline CUmemGenericAllocationHandle create(void)
{
    CUmemAllocationProp prop = vmm_fd_prop();
    CUmemGenericAllocationHandle h = 0;
    cr_assert_eq(cuMemCreate(&h, G, &prop, 0), CUDA_SUCCESS);
    return h;
}

static inline int export_fd(CUmemGenericAllocationHandle h)
{
    int fd = -1;
    cr_assert_eq(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_SUCCESS);
    return fd;
}

static inline CUmemGenericAllocationHandle import(int fd)
{
    CUmemGenericAllocationHandle h = 0;
    cr_assert_eq(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CUDA_SUCCESS);
    return h;
}

static inline struct fakevmm_counters vmm(void)
{
    struct fakevmm_counters c;
    fakevmm_get_counters(&c);
    return c;
}

#define access_on vmm_rw_on

/* The consumer's rebuild of a segment (c10's ExpandableSegment::fromShared)
 * from fds[], access for devices 0..ndev-1; returns the range. */
static inline CUdeviceptr rebuild(const int *fds, CUmemGenericAllocationHandle *h, int ndev)
{
    for (int i = 0; i < CHUNKS; i++)
        h[i] = import(fds[i]);
    CUdeviceptr p = 0;
    cr_assert_eq(cuMemAddressReserve(&p, 4 * G, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < CHUNKS; i++)
        cr_assert_eq(cuMemMap(p + i * G, G, 0, h[i], 0), CUDA_SUCCESS);
    CUmemAccessDesc d[2] = { access_on(0), access_on(1) };
    cr_assert_eq(cuMemSetAccess(p, CHUNKS * G, d, (size_t)ndev), CUDA_SUCCESS);
    return p;
}

/* Its release (unmapHandles). */
static inline void drop(CUdeviceptr p, const CUmemGenericAllocationHandle *h)
{
    for (int i = 0; i < CHUNKS; i++) {
        cr_assert_eq(cuMemUnmap(p + i * G, G), CUDA_SUCCESS);
        cr_assert_eq(cuMemRelease(h[i]), CUDA_SUCCESS);
    }
    cr_assert_eq(cuMemAddressFree(p, 4 * G), CUDA_SUCCESS);
}

/* An exporter's segment: CHUNKS allocations, one fd each. */
static inline void exporter(int *fds)
{
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    for (int i = 0; i < CHUNKS; i++)
        fds[i] = export_fd(create());
}

/* An exporter's segment, rebuilt and released once: now kept, idle. */
static inline CUdeviceptr kept_segment(int *fds, CUmemGenericAllocationHandle *h)
{
    exporter(fds);
    CUdeviceptr p = rebuild(fds, h, 1);
    drop(p, h);
    return p;
}

static inline void expect_no_stale_handles(void)
{
    cr_assert_eq(vmm().stale_handle_uses, 0, "a handle the driver no longer knows was passed");
}

#endif
