/*
 * vmm_close.c - really releasing what the VMM table gave up: the orders a
 * decision queued (a kept mapping in the app's way) or an eviction took
 * (idle_budget.c: the one budget, out of memory, exit).
 *
 * Never under the lock: the table hands out its orders, the lock is dropped,
 * then the driver is called. None of these calls needs a current context
 * (measured), so no context is switched.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "vmm_impl.h"
#include "budget.h"

typedef CUresult (*range_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);


/* ---- unmaps and frees under way ------------------------------------------ */

/*
 * A kept chunk leaves the table under the lock and is unmapped after it (by
 * the helper thread answering an exporter, by an eviction). Until then the
 * driver still has it mapped, so an app's call on that range meanwhile, one
 * the table no longer has a reason to answer, would get the driver's
 * refusal: PyTorch's segment teardown frees the range right after its
 * release, the moment an exporter's release makes the helper let go. The
 * same for a kept range's real free: until it is done the driver still
 * holds the range, and a reserve hinted there would land elsewhere (without
 * the cache the app's free had given the address back). Such orders are
 * listed from when they are taken until done, and a call the table passes
 * to the driver first waits for those in its range (never on anything of
 * ours: only on the driver's unmap or free). Fixed slots, as for legacy
 * closes (legacy_close.c): past them, the race above for the rest only.
 */
#define UNDER_WAY_SLOTS 128
static struct {
    uint64_t addr, size;
    enum ipcc_vmm_op op;
    int used;
} under_way[UNDER_WAY_SLOTS];
static _Atomic int under_ways; /* listed: none is the one-load fast path */

/* Lock held: the ops' unmaps and frees are under way from now on. */
void ipcc_vmm_close_taken(const struct ipcc_vmm_ops *ops)
{
    for (size_t i = 0, s = 0; i < ops->n; i++) {
        if (ops->v[i].op == IPCC_VMM_RELEASE)
            continue;
        while (s < UNDER_WAY_SLOTS && under_way[s].used)
            s++;
        if (s == UNDER_WAY_SLOTS)
            return;
        under_way[s].addr = ops->v[i].addr;
        under_way[s].size = ops->v[i].size;
        under_way[s].op = ops->v[i].op;
        under_way[s].used = 1;
        atomic_fetch_add(&under_ways, 1);
    }
}

static void op_done(const struct ipcc_vmm_victim *v)
{
    ipcc_lock();
    for (int s = 0; s < UNDER_WAY_SLOTS; s++) {
        if (under_way[s].used && under_way[s].op == v->op && under_way[s].addr == v->addr &&
            under_way[s].size == v->size) {
            under_way[s].used = 0;
            atomic_fetch_sub(&under_ways, 1);
            break;
        }
    }
    ipcc_unlock();
}

/* Whether an order of a kind in kinds (1 << op) is under way in the range. */
static int under_way_in(uint64_t addr, uint64_t size, unsigned kinds)
{
    int busy = 0;
    ipcc_lock();
    for (int s = 0; s < UNDER_WAY_SLOTS && !busy; s++)
        busy = under_way[s].used && (kinds & 1u << under_way[s].op) &&
               under_way[s].addr < addr + size && addr < under_way[s].addr + under_way[s].size;
    ipcc_unlock();
    return busy;
}

static void wait_under_way_in(uint64_t addr, uint64_t size, unsigned kinds)
{
    while (atomic_load_explicit(&under_ways, memory_order_acquire) &&
           under_way_in(addr, size, kinds))
        sched_yield();
}

/* Before the app's call on [addr, addr+size) goes to the driver. */
void ipcc_vmm_close_wait(uint64_t addr, uint64_t size)
{
    wait_under_way_in(addr, size, 1u << IPCC_VMM_UNMAP | 1u << IPCC_VMM_FREE);
}

/* Before a kept range's own free: only unmaps in it (its own free is listed). */
static void wait_unmaps_in(uint64_t addr, uint64_t size)
{
    wait_under_way_in(addr, size, 1u << IPCC_VMM_UNMAP);
}

/* Fork child: the orders under way were the parent's threads'. */
void ipcc_vmm_close_fork_child(void)
{
    memset(under_way, 0, sizeof(under_way));
    atomic_store(&under_ways, 0);
}

/* The app's calls with this handle value are the driver's again. */
static void release_done(uint64_t handle)
{
    ipcc_lock();
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    if (t)
        ipcc_vmm_release_done(t, handle);
    ipcc_unlock();
}

static void run_op(const struct ipcc_vmm_victim *v, int evicted)
{
    CUresult rc = CUDA_SUCCESS;
    if (v->op == IPCC_VMM_UNMAP) {
        range_fn f = (range_fn)ipcc_real(IPCC_SLOT_VMM_UNMAP);
        rc = f ? f(v->addr, v->size) : IPCC_CUDA_NO_DRIVER;
        op_done(v);
    } else if (v->op == IPCC_VMM_FREE) {
        range_fn f = (range_fn)ipcc_real(IPCC_SLOT_VMM_FREE);
        wait_unmaps_in(v->addr, v->size); /* another thread's, taken earlier */
        rc = f ? f(v->addr, v->size) : IPCC_CUDA_NO_DRIVER;
        op_done(v);
    } else {
        release_fn f = (release_fn)ipcc_real(IPCC_SLOT_VMM_RELEASE);
        rc = f ? f(v->handle) : IPCC_CUDA_NO_DRIVER;
        release_done(v->handle);
        if (v->fd >= 0)
            ipcc_fd_close_ours(v->fd); /* a number the program took since stays its own */
        if (rc == CUDA_SUCCESS && evicted)
            IPCC_COUNT(evictions);
    }
    if (rc != CUDA_SUCCESS)
        ipcc_log(IPCC_LOG_DEBUG, "releasing a kept VMM resource failed: error %d", (int)rc);
}

/* Runs the table's orders and frees them: the unmaps first, then the
 * address frees, then the releases. A free waits for the unmaps in its range
 * that other threads took earlier (a kept chunk of a range still live then);
 * its own are done by then, so no two threads wait on each other. */
void ipcc_vmm_close_run(struct ipcc_vmm_ops *ops, int evicted)
{
    static const enum ipcc_vmm_op phases[] = { IPCC_VMM_UNMAP, IPCC_VMM_FREE, IPCC_VMM_RELEASE };
    for (size_t p = 0; p < sizeof(phases) / sizeof(phases[0]); p++)
        for (size_t i = 0; i < ops->n; i++)
            if (ops->v[i].op == phases[p])
                run_op(&ops->v[i], evicted);
    if (ops->lost)
        ipcc_log(IPCC_LOG_WARN, "out of memory; %zu kept VMM resources stay until exit",
                 ops->lost);
    ipcc_mem_free(ops->v);
    ops->v = NULL;
    ops->n = ops->cap = ops->lost = 0;
}
