/*
 * fake_vmm.h - test hooks of the stand-in driver's VMM model (tests/standin/fake_vmm.c,
 * built into the same libcuda.so.1 as tests/standin/fake_cuda.c).
 *
 * The model answers as the H200 driver measured by tests/gpu/vmm_errors.cu
 * does (docs/vmm.md), and counts what a real driver would really have
 * done, so a test can tell a cache hit from driver work.
 */
#ifndef IPCCACHE_TESTS_FAKE_VMM_H
#define IPCCACHE_TESTS_FAKE_VMM_H

#include <stdint.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The allocation granularity the model reports (the H200's). */
#define FAKEVMM_GRANULARITY (2ULL << 20)

struct fakevmm_counters {
    uint64_t creates;           /* successful cuMemCreate */
    uint64_t exports;           /* successful exports (a new fd or fabric handle each) */
    uint64_t import_calls, imports;   /* every import call; successful ones */
    uint64_t reserve_calls, reserves;
    uint64_t map_calls, maps;
    uint64_t set_access_calls, set_accesses;
    uint64_t unmap_calls, unmaps;     /* unmaps: mappings really removed */
    uint64_t release_calls, releases;
    uint64_t address_free_calls, address_frees;
    uint64_t stale_handle_uses; /* a handle never given out or already released:
                                   the real driver crashes on these */
    int64_t live_handles, live_mappings, live_reservations;
};

void fakevmm_get_counters(struct fakevmm_counters *out);
/* Unmaps and address frees under way: with FAKECUDA_VMM_SLOW_UNMAP_MS
 * (FAKECUDA_VMM_SLOW_FREE_MS) set, each cuMemUnmap (cuMemAddressFree) waits
 * that long before it acts, to widen a race window. */
int fakevmm_unmaps_under_way(void);
int fakevmm_frees_under_way(void);

/* Access flags of device dev at ptr (inside a mapping); -1 if unmapped. */
long long fakevmm_access(CUdeviceptr ptr, int dev);

/* 1 when the mapping at ptr is of the allocation handle h names. */
int fakevmm_maps_allocation(CUdeviceptr ptr, CUmemGenericAllocationHandle h);

/* ---- the differential fuzzer's view (tests/fuzz/fuzz_vmm.c) ---- */

/* The allocation (creator's pid, serial) a live handle names, or that the
 * mapping at ptr maps; 0 when there is none. */
int fakevmm_handle_allocation(CUmemGenericAllocationHandle h, uint64_t *pid, uint64_t *serial);
int fakevmm_allocation_at(CUdeviceptr ptr, uint64_t *pid, uint64_t *serial);

/* One piece of live VMM state: a handle (imported or created), a mapping
 * (with its place, size and access per device) or a reservation. */
enum fakevmm_kind { FAKEVMM_IMPORTED, FAKEVMM_CREATED, FAKEVMM_MAPPING, FAKEVMM_RESERVATION };
struct fakevmm_item {
    enum fakevmm_kind kind;
    uint64_t pid, serial, addr, size; /* addr: of a mapping or reservation */
    unsigned long long access[16];
};

/* Copies up to cap live items into out[]; returns how many exist. */
size_t fakevmm_list(struct fakevmm_item *out, size_t cap);

/* Resolver rows of the VMM functions (fake_cuda.c asks): the function for
 * (symbol, version), *known set when the name is a VMM one. */
void *fakevmm_proc(const char *symbol, int version, int *known);

#ifdef __cplusplus
}
#endif

#endif /* IPCCACHE_TESTS_FAKE_VMM_H */
