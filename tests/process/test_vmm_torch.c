/*
 * test_vmm_torch.c - PyTorch's own order of the VMM calls through the cache,
 * against the stand-in driver.
 *
 * c10's ExpandableSegment::fromShared reserves first (the whole address
 * space a segment may grow to, far more than it maps), then imports each
 * chunk (pidfd_getfd: a dup of the exporter's fd), maps the chunks from the
 * start and sets access over the mapped part; its destructor unmaps and
 * releases chunk by chunk, then frees the whole reservation. Each storage
 * shared is its own segment: the chunks covering it. An RL weight sync sends
 * every parameter in one message: segments of the large and the small pool
 * (two reservation sizes) interleaved, neighbours sharing a chunk, all
 * rebuilt before any is dropped, dropped in reverse (a list's teardown).
 *
 * That order is 2.11's, the version measured on a GPU, and 2.15's (read:
 * docs/limits.md#the-vmm-path-is-new); the tests marked 2.15 replay what
 * changed: a segment shared with fabric handles (the handle type travels
 * in the message since 2.13) and the unwind of a failed import.
 */
#include <fcntl.h>

#include "vmm_testutil.h"

#define LARGE_VA (64 * G) /* a large-pool segment's reservation */
#define SMALL_VA (48 * G) /* a small-pool one's */
#define LARGE 7           /* chunks of the trainer's large-pool segment */
#define SMALL 2
#define MAX_CHUNKS 4

/* The trainer's two segments: one export (fd) per chunk. */
struct trainer {
    int large[LARGE], small[SMALL];
    CUmemGenericAllocationHandle large_h[LARGE], small_h[SMALL];
};

/* One shared storage: count chunks of a pool from first on. */
struct param {
    int small, first, count;
};

/* One rebuilt segment in the consumer. */
struct rebuilt {
    CUdeviceptr p;
    uint64_t va;
    int n;
    CUmemGenericAllocationHandle h[MAX_CHUNKS];
};

static void trainer_start(struct trainer *tr)
{
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    for (int i = 0; i < LARGE; i++)
        tr->large[i] = export_fd(tr->large_h[i] = create());
    for (int i = 0; i < SMALL; i++)
        tr->small[i] = export_fd(tr->small_h[i] = create());
}

/* ExpandableSegment::fromShared: reserve, import each chunk, map, set access. */
static void from_shared(const int *fds, int n, uint64_t va, struct rebuilt *r)
{
    r->va = va;
    r->n = n;
    cr_assert_eq(cuMemAddressReserve(&r->p, va, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < n; i++) {
        int fd = dup(fds[i]); /* what pidfd_getfd hands over */
        r->h[i] = import(fd);
        close(fd);
    }
    for (int i = 0; i < n; i++)
        cr_assert_eq(cuMemMap(r->p + (uint64_t)i * G, G, 0, r->h[i], 0), CUDA_SUCCESS);
    CUmemAccessDesc d = access_on(0);
    cr_assert_eq(cuMemSetAccess(r->p, (uint64_t)n * G, &d, 1), CUDA_SUCCESS);
}

/* Its destructor: unmapHandles over the mapped chunks, then the address free. */
static void destroy(struct rebuilt *r)
{
    for (int i = 0; i < r->n; i++) {
        cr_assert_eq(cuMemUnmap(r->p + (uint64_t)i * G, G), CUDA_SUCCESS);
        cr_assert_eq(cuMemRelease(r->h[i]), CUDA_SUCCESS);
    }
    cr_assert_eq(cuMemAddressFree(r->p, r->va), CUDA_SUCCESS);
}

static void rebuild_param(const struct trainer *tr, const struct param *pa, struct rebuilt *r)
{
    const int *fds = pa->small ? tr->small : tr->large;
    from_shared(fds + pa->first, pa->count, pa->small ? SMALL_VA : LARGE_VA, r);
}

/* Every chunk of the rebuilt storage maps the trainer's own memory there. */
static void expect_right_memory(const struct trainer *tr, const struct param *pa,
                                const struct rebuilt *r)
{
    const CUmemGenericAllocationHandle *own = pa->small ? tr->small_h : tr->large_h;
    for (int i = 0; i < pa->count; i++) {
        CUdeviceptr at = r->p + (uint64_t)i * G;
        cr_assert(fakevmm_maps_allocation(at, own[pa->first + i]), "chunk %d of %d", i,
                  pa->first);
        cr_assert_eq(fakevmm_access(at, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    }
}

/* The driver work a step did: 0 everywhere when the step was all hits. */
static uint64_t driver_work(struct fakevmm_counters a, struct fakevmm_counters b)
{
    return (b.imports - a.imports) + (b.reserves - a.reserves) + (b.maps - a.maps) +
           (b.set_accesses - a.set_accesses) + (b.unmaps - a.unmaps) +
           (b.releases - a.releases) + (b.address_frees - a.address_frees);
}

/* One message of params: all rebuilt and checked, then dropped in reverse. */
static uint64_t sync_step(const struct trainer *tr, const struct param *params, int n)
{
    struct rebuilt r[8];
    struct fakevmm_counters before = vmm();
    for (int i = 0; i < n; i++)
        rebuild_param(tr, &params[i], &r[i]);
    for (int i = 0; i < n; i++)
        expect_right_memory(tr, &params[i], &r[i]);
    for (int i = n; i-- > 0;)
        destroy(&r[i]);
    return driver_work(before, vmm());
}

/* A decoder's parameters in one message, as torch.multiprocessing sends a
 * weight sync: from the third step on, no driver work at all. */
Test(vmm_torch, weight_sync_steps_are_all_hits, .timeout = 20)
{
    static const struct param params[] = {
        { 0, 0, 2 }, { 0, 1, 2 }, { 1, 0, 1 }, { 0, 3, 3 }, { 1, 1, 1 }, { 0, 6, 1 },
    };
    const int n = sizeof(params) / sizeof(params[0]);
    struct trainer tr;
    trainer_start(&tr);
    sync_step(&tr, params, n);
    sync_step(&tr, params, n);
    for (int step = 3; step <= 5; step++)
        cr_assert_eq(sync_step(&tr, params, n), 0, "step %d did driver work", step);
    expect_no_stale_handles();
}

/* Features of one pool sent one at a time, alternating between two slices
 * (each rebuilt and dropped before the next): all hits once seen. */
Test(vmm_torch, alternating_features_are_all_hits, .timeout = 20)
{
    static const struct param a = { 0, 0, 2 }, b = { 0, 2, 3 };
    struct trainer tr;
    trainer_start(&tr);
    sync_step(&tr, &a, 1);
    sync_step(&tr, &b, 1);
    sync_step(&tr, &a, 1);
    sync_step(&tr, &b, 1);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(sync_step(&tr, &a, 1), 0, "feature a, round %d", i);
        cr_assert_eq(sync_step(&tr, &b, 1), 0, "feature b, round %d", i);
    }
    expect_no_stale_handles();
}

/* Each storage of params[] rebuilt, checked and dropped before the next (a
 * load_weights generator's order), in order[], each `times` times in a row
 * (two engines served in turn). The step's driver work. */
static uint64_t one_at_a_time_step(const struct trainer *tr, const struct param *params,
                                   const int *order, int n, int times)
{
    struct fakevmm_counters before = vmm();
    for (int i = 0; i < n; i++) {
        for (int e = 0; e < times; e++) {
            struct rebuilt r;
            rebuild_param(tr, &params[order[i]], &r);
            expect_right_memory(tr, &params[order[i]], &r);
            destroy(&r);
        }
    }
    return driver_work(before, vmm());
}

/* Two decoder layers: neighbours share their boundary chunk, the norms
 * share one small-pool chunk (rebuilt once each, in a row). */
static const struct param layers[] = {
    { 0, 0, 2 }, { 0, 1, 1 }, { 0, 1, 3 }, { 0, 3, 2 }, { 1, 0, 1 }, { 1, 0, 1 },
    { 0, 4, 2 }, { 0, 5, 1 }, { 0, 5, 2 }, { 0, 6, 1 }, { 1, 1, 1 }, { 1, 1, 1 },
};
#define NLAYERS ((int)(sizeof(layers) / sizeof(layers[0])))

static void in_order(int *order, int reversed)
{
    for (int i = 0; i < NLAYERS; i++)
        order[i] = reversed ? NLAYERS - 1 - i : i;
}

/* One tensor at a time, the same order every step (issue 17: 4 rebuilds in 5
 * were wrong guesses before): from the third step on no driver work at all;
 * the same with each tensor rebuilt twice in a row (two engines in turn). */
Test(vmm_torch, one_at_a_time_steps_are_all_hits, .timeout = 20)
{
    int order[NLAYERS];
    in_order(order, 0);
    struct trainer tr;
    trainer_start(&tr);
    for (int times = 1; times <= 2; times++) {
        one_at_a_time_step(&tr, layers, order, NLAYERS, times);
        one_at_a_time_step(&tr, layers, order, NLAYERS, times);
        for (int step = 3; step <= 5; step++)
            cr_assert_eq(one_at_a_time_step(&tr, layers, order, NLAYERS, times), 0,
                         "%d engine(s): step %d did driver work", times, step);
    }
    expect_no_stale_handles();
}

/* The order reversed every other step: once both ways are seen, only the
 * turn between them may cost (at most a tenth of a cold step's work);
 * a shuffled order costs a step no more than a step without the cache (the
 * first one: everything real). Every storage maps the right memory. */
Test(vmm_torch, changing_orders_cost_no_more_than_without, .timeout = 20)
{
    int order[NLAYERS];
    struct trainer tr;
    trainer_start(&tr);
    in_order(order, 0);
    uint64_t cold = one_at_a_time_step(&tr, layers, order, NLAYERS, 1);
    for (int step = 2; step <= 4; step++) {
        in_order(order, step % 2);
        one_at_a_time_step(&tr, layers, order, NLAYERS, 1);
    }
    for (int step = 5; step <= 8; step++) {
        in_order(order, step % 2);
        uint64_t work = one_at_a_time_step(&tr, layers, order, NLAYERS, 1);
        cr_assert_leq(work * 10, cold, "reversed, step %d: %lu of %lu", step, (unsigned long)work,
                      (unsigned long)cold);
    }
    unsigned seed = 17;
    for (int step = 0; step < 8; step++) {
        in_order(order, 0);
        for (int i = NLAYERS - 1; i > 0; i--) {
            int j = (int)(rand_r(&seed) % (unsigned)(i + 1)), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        uint64_t work = one_at_a_time_step(&tr, layers, order, NLAYERS, 1);
        cr_assert_leq(work, cold, "shuffled, step %d: %lu of %lu", step, (unsigned long)work,
                      (unsigned long)cold);
    }
    expect_no_stale_handles();
}

/* A message whose segments changed (a chunk replaced, one more storage):
 * whatever the cache handed back, every storage maps the right memory. */
Test(vmm_torch, changed_message_maps_the_right_memory, .timeout = 20)
{
    static const struct param before[] = { { 0, 0, 2 }, { 1, 0, 1 }, { 0, 2, 2 } };
    static const struct param after[] = { { 0, 1, 2 }, { 0, 4, 3 }, { 1, 1, 1 }, { 0, 0, 1 } };
    struct trainer tr;
    trainer_start(&tr);
    for (int i = 0; i < 3; i++)
        sync_step(&tr, before, 3);
    for (int i = 0; i < 3; i++)
        sync_step(&tr, after, 4);
    sync_step(&tr, before, 3);
    expect_no_stale_handles();
}

/* 2.15's fromShared when the import of chunk fail_at fails: the imports made
 * so far are released unmapped (each handle knows it was never mapped), then
 * the reservation freed. unmap_first: 2.11's destructor, which unmapped each
 * imported chunk before its release (the driver: SUCCESS on a reserved but
 * unmapped range). Every answer is the driver's. */
static void failed_from_shared(const int *fds, int fail_at, uint64_t va, int unmap_first)
{
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle h[MAX_CHUNKS], none = 0;
    uint64_t reserves = vmm().reserves;
    cr_assert_eq(cuMemAddressReserve(&p, va, 0, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(vmm().reserves, reserves, "the reserve was not a kept range handed back");
    for (int i = 0; i < fail_at; i++) {
        int fd = dup(fds[i]);
        h[i] = import(fd);
        close(fd);
    }
    int bad = open("/dev/null", O_RDONLY | O_CLOEXEC); /* not an export */
    cr_assert_eq(cuMemImportFromShareableHandle(&none, (void *)(intptr_t)bad,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CUDA_ERROR_UNKNOWN);
    close(bad);
    for (int i = 0; i < fail_at; i++) {
        if (unmap_first)
            cr_assert_eq(cuMemUnmap(p + (uint64_t)i * G, G), CUDA_SUCCESS, "chunk %d", i);
        cr_assert_eq(cuMemRelease(h[i]), CUDA_SUCCESS, "chunk %d", i);
    }
    cr_assert_eq(cuMemAddressFree(p, va), CUDA_SUCCESS);
}

/* A failed rebuild whose reserve the cache answered with a kept range (the
 * one the next rebuild was predicted to map): undone as the driver would,
 * and the rebuilds after it map the right memory and are all hits again by
 * the second. */
Test(vmm_torch, pytorch_2_15_failed_import_unwinds_as_the_driver, .timeout = 20)
{
    static const struct param pa = { 0, 0, 3 };
    struct trainer tr;
    trainer_start(&tr);
    for (int unmap_first = 0; unmap_first < 2; unmap_first++) {
        for (int i = 0; i < 3; i++)
            sync_step(&tr, &pa, 1);
        cr_assert_eq(sync_step(&tr, &pa, 1), 0, "warm");
        failed_from_shared(tr.large, 2, LARGE_VA, unmap_first);
        sync_step(&tr, &pa, 1);
        cr_assert_eq(sync_step(&tr, &pa, 1), 0, "%s unwind: not all hits again",
                     unmap_first ? "2.11's" : "2.15's");
    }
    expect_no_stale_handles();
}

/* 2.13 on: a segment made with fabric handles (a machine with an NVLink
 * fabric) is imported from the 64-byte handles the message carries, no fd:
 * the same order, the same hits. */
static void from_shared_fabric(const CUmemFabricHandle *fh, int n, struct rebuilt *r)
{
    r->va = LARGE_VA;
    r->n = n;
    cr_assert_eq(cuMemAddressReserve(&r->p, LARGE_VA, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < n; i++) {
        CUmemFabricHandle copy = fh[i]; /* read from the message */
        r->h[i] = 0;
        cr_assert_eq(cuMemImportFromShareableHandle(&r->h[i], &copy, CU_MEM_HANDLE_TYPE_FABRIC),
                     CUDA_SUCCESS);
    }
    for (int i = 0; i < n; i++)
        cr_assert_eq(cuMemMap(r->p + (uint64_t)i * G, G, 0, r->h[i], 0), CUDA_SUCCESS);
    CUmemAccessDesc d = access_on(0);
    cr_assert_eq(cuMemSetAccess(r->p, (uint64_t)n * G, &d, 1), CUDA_SUCCESS);
}

Test(vmm_torch, pytorch_2_15_fabric_segments_are_all_hits, .timeout = 20)
{
    struct trainer tr;
    trainer_start(&tr);
    CUmemFabricHandle fh[LARGE];
    for (int i = 0; i < LARGE; i++)
        cr_assert_eq(cuMemExportToShareableHandle(&fh[i], tr.large_h[i], CU_MEM_HANDLE_TYPE_FABRIC,
                                                  0),
                     CUDA_SUCCESS);
    static const struct param params[] = { { 0, 0, 2 }, { 0, 2, 3 }, { 0, 5, 2 } };
    for (int step = 1; step <= 5; step++) {
        struct rebuilt r[3];
        struct fakevmm_counters before = vmm();
        for (int i = 0; i < 3; i++)
            from_shared_fabric(fh + params[i].first, params[i].count, &r[i]);
        for (int i = 0; i < 3; i++)
            expect_right_memory(&tr, &params[i], &r[i]);
        for (int i = 3; i-- > 0;)
            destroy(&r[i]);
        if (step >= 3)
            cr_assert_eq(driver_work(before, vmm()), 0, "step %d did driver work", step);
    }
    expect_no_stale_handles();
}
