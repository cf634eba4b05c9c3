/*
 * test_budget.c - one idle budget for both kinds of mapping: legacy idle
 * mappings and idle VMM imports count together under
 * IPCCACHE_MAX_IDLE_ENTRIES and IPCCACHE_MAX_IDLE_BYTES, and the least
 * recently used idle thing of either kind is evicted first.
 */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "vmm_testutil.h"

/* One legacy mapping of the given size, opened and closed: idle. */
static CUdeviceptr idle_legacy(uint64_t serial, uint64_t bytes)
{
    CUdeviceptr p = tu_open(tu_handle(serial, bytes));
    tu_close(p);
    return p;
}

/* In a fresh context: a legacy mapping goes idle, then a VMM segment (its
 * CHUNKS imports). Returns the legacy mapping. */
static CUdeviceptr legacy_then_segment(uint64_t serial, uint64_t bytes)
{
    tu_context();
    CUdeviceptr a = idle_legacy(serial, bytes);
    int fds[CHUNKS];
    CUmemGenericAllocationHandle h[CHUNKS];
    kept_segment(fds, h);
    return a;
}

/* A legacy idle mapping is evicted to make room for a VMM segment's idle
 * imports when together they pass the entry cap. */
Test(budget, legacy_idle_mapping_makes_room_for_vmm, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "3", 1);
    CUdeviceptr a = legacy_then_segment(60, 4096);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0, "the older legacy mapping went");
    cr_assert_eq(tu_driver().unmaps, 1);
    cr_assert_eq(vmm().unmaps, 0, "the segment is kept");
    cr_assert_eq(vmm().live_handles, 2 * CHUNKS, "exporter's and kept imports");
}

/* A VMM segment idle the longest is evicted to make room for a legacy idle
 * mapping when together they pass the entry cap. */
Test(budget, vmm_segment_makes_room_for_legacy, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "3", 1);
    tu_context();
    int fds[CHUNKS];
    CUmemGenericAllocationHandle h[CHUNKS];
    kept_segment(fds, h);
    CUdeviceptr a = idle_legacy(61, 4096);
    cr_assert_eq(vmm().unmaps, CHUNKS, "the older segment went, whole");
    cr_assert_eq(vmm().live_handles, CHUNKS, "only the exporter's");
    cr_assert_eq(fakecuda_refcount(NULL, a), 1, "the legacy mapping is kept");
    cr_assert_eq(tu_driver().unmaps, 0);
    expect_no_stale_handles();
}

/* The byte cap adds legacy mapping sizes and VMM imports' mapped sizes. */
Test(budget, byte_cap_counts_both_kinds, .timeout = 10)
{
    char cap[32];
    snprintf(cap, sizeof(cap), "%llu", (unsigned long long)(CHUNKS * G + G / 2));
    setenv("IPCCACHE_MAX_IDLE_BYTES", cap, 1);
    CUdeviceptr a = legacy_then_segment(62, G);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0, "G + CHUNKS * G is over the cap");
    cr_assert_eq(vmm().unmaps, 0);
}

/* Eviction follows recency across kinds: legacy a, then the segment, then
 * legacy b went idle; over the cap a goes first, then the segment, b stays. */
Test(budget, least_recently_used_across_kinds, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "4", 1);
    CUdeviceptr a = legacy_then_segment(63, 4096);
    cr_assert_eq(tu_driver().unmaps, 0, "four idle things fit");
    CUdeviceptr b = idle_legacy(64, 4096);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0, "a was idle the longest");
    cr_assert_eq(vmm().unmaps, 0);
    CUdeviceptr c = idle_legacy(65, 4096);
    cr_assert_eq(vmm().unmaps, CHUNKS, "then the segment");
    cr_assert_eq(fakecuda_refcount(NULL, b), 1);
    cr_assert_eq(fakecuda_refcount(NULL, c), 1);
    expect_no_stale_handles();
}

/* The stats' idle and idle_bytes are the budget's totals, both kinds;
 * vmm_idle_bytes is the VMM part; vmm_fds the dups its idle imports keep. */
Test(budget, stats_idle_counts_both_kinds, .timeout = 10)
{
    const char *path = tu_stats_file();
    legacy_then_segment(66, 1 << 20);
    raise(SIGUSR1);
    cr_assert_eq(tu_stat(path, "idle"), 1 + CHUNKS);
    cr_assert_eq(tu_stat(path, "idle_bytes"), (1 << 20) + CHUNKS * G);
    cr_assert_eq(tu_stat(path, "vmm_idle_bytes"), CHUNKS * G);
    cr_assert_eq(tu_stat(path, "vmm_fds"), CHUNKS);
}


/* ---- a lent close after a VMM call -------------------------------------- */

static uint64_t coarse_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* One round, in a child forked before any CUDA call (a fresh library):
 * a legacy mapping lent to this thread, a VMM import that goes idle (its
 * release), then the lent mapping closed. Over the cap by one, the import
 * is the older and goes; the mapping stays. A lent close reads a coarse
 * clock, so this holds only because the release moved this thread's floor
 * past it. Exit 0: held; 1: the mapping went; 2: the coarse clock ticked
 * inside the round (which orders it rightly anyway: nothing decided);
 * 3: a call failed. No Criterion assertion here: this is a child. */
static int lent_close_round(void)
{
    CUcontext ctx;
    CUdeviceptr a, b;
    CUmemAllocationProp prop = vmm_fd_prop();
    CUmemGenericAllocationHandle made, got;
    int fd = -1;
    CUipcMemHandle h = tu_handle(70, 4096);
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuIpcOpenMemHandle_v2(&a, h, 1) ||
        cuIpcCloseMemHandle(a) || cuIpcOpenMemHandle_v2(&a, h, 1)) /* the hit: lent */
        return 3;
    if (cuMemCreate(&made, G, &prop, 0) ||
        cuMemExportToShareableHandle(&fd, made, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
        return 3;
    uint64_t tick = coarse_now();
    if (cuMemImportFromShareableHandle(&got, (void *)(intptr_t)fd,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
        cuMemRelease(got) || cuIpcCloseMemHandle(a))
        return 3;
    if (coarse_now() != tick)
        return 2;
    if (cuIpcOpenMemHandle_v2(&b, tu_handle(71, 4096), 1) || cuIpcCloseMemHandle(b))
        return 3; /* over the cap of two by one */
    return fakecuda_refcount(NULL, a) == 1 ? 0 : 1;
}

/* A thread's lent close after its VMM call left something idle is the newer
 * of the two, though lent closes read a coarse clock: over the cap the VMM
 * import goes, not the legacy mapping. Rounds until one is not disturbed by
 * the coarse clock's tick (nearly always the first). */
Test(budget, lent_close_after_a_vmm_release_is_the_newer, .timeout = 30)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "2", 1);
    for (int round = 0; round < 200; round++) {
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
            _exit(lent_close_round());
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status), "the round ended by signal (%#x)", status);
        if (WEXITSTATUS(status) == 2)
            continue;
        cr_assert_eq(WEXITSTATUS(status), 0,
                     "1: the lent mapping went before the older VMM import; 3: a call failed");
        return;
    }
    cr_assert_fail("every round saw the coarse clock tick");
}
