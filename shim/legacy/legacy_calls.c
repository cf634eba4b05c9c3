/*
 * legacy_calls.c - opening and closing IPC memory through the cache.
 *
 * The contract is the driver's own: a hit returns the pointer the driver
 * would return and takes a reference; a close drops one; errors are the
 * driver's. Anything we cannot decide exactly goes to the driver untouched.
 *
 * Locking: the table lock is held only around table operations, never
 * across a driver call, so a slow map (milliseconds across GPUs) does not
 * stall other threads' hits. A thread's repeated open and close of one
 * mapping take no lock at all, other threads using it too: the entry is
 * lent to it (tables/legacy_loans.c), one atomic operation per call on a line of
 * its own.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "legacy_impl.h"
#include "budget.h"
#include "ledger.h"

typedef CUresult (*open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*close_fn)(CUdeviceptr);


/* ---- contexts ----------------------------------------------------------- */

/*
 * The key's context is asked of the driver on every call: cuCtxGetId(NULL)
 * answers the id of the calling thread's current context, one call as cheap
 * as cuCtxGetCurrent. Ids are unique for the life of the process, so however
 * a context was torn down (a call that never passed through us included)
 * and whatever context took its address, a key names only mappings made in
 * the current context. Nothing about contexts is remembered between calls.
 */
static int current_context_id(uint64_t *id)
{
    /* The driver's function, once found: it never changes (driver.c pins it). */
    static int (*_Atomic get_id)(void *, unsigned long long *);
    int (*get)(void *, unsigned long long *) = atomic_load_explicit(&get_id, memory_order_relaxed);
    if (__builtin_expect(!get, 0)) {
        get = ipcc_driver()->ctx_get_id;
        if (!get)
            return ipcc_legacy_context_id(NULL, id); /* says once that nothing is cached */
        atomic_store_explicit(&get_id, get, memory_order_relaxed);
    }
    unsigned long long v;
    if (get(NULL, &v) != CUDA_SUCCESS)
        return -1; /* none, or destroyed: the driver answers the call itself */
    *id = v;
    return 0;
}

/* The current context itself, for a miss's entry (its closes push it). */
static void *current_context(void)
{
    const struct ipcc_driver *d = ipcc_driver();
    void *ctx = NULL;
    if (!d->ctx_get_current || d->ctx_get_current(&ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
}

/* ---- pass-through ------------------------------------------------------- */

static CUresult count_result(CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        IPCC_COUNT(errors);
    return rc;
}

static CUresult passthrough_open(open_fn real, CUdeviceptr *pdptr, CUipcMemHandle h,
                                 unsigned flags)
{
    IPCC_COUNT(open_passthrough);
    return count_result(real(pdptr, h, flags));
}

static CUresult passthrough_close(close_fn real, CUdeviceptr dptr)
{
    IPCC_COUNT(close_passthrough);
    return count_result(real(dptr));
}

/* A real close made by the cache itself, timed for the stats. */
static CUresult timed_real_close(close_fn real, CUdeviceptr dptr)
{
    uint64_t t0 = ipcc_clock_ns();
    CUresult rc = real(dptr);
    if (rc == CUDA_SUCCESS) {
        IPCC_ADD(real_close_ns, ipcc_clock_ns() - t0);
        IPCC_COUNT(real_close_samples);
        IPCC_COUNT(real_closes);
    }
    return rc;
}

/* ---- open --------------------------------------------------------------- */

static void lend_here(void);

static uint64_t mapping_bytes(uint64_t dptr)
{
    const struct ipcc_driver *d = ipcc_driver();
    size_t size = 0;
    if (!d->mem_get_range || d->mem_get_range(NULL, &size, dptr) != CUDA_SUCCESS)
        return 0;
    return size;
}

/* After the driver refused a map: whether a mapping of ours in another
 * context (one process maps an exporter's handles in one context per
 * device) may have been in the way and is gone now: only those of the same
 * allocation or exporter (legacy_give_way.c). Idle ones are closed here;
 * those another thread is already closing are waited for, since without the
 * cache they would have been gone before this open; and one whose close
 * ended after the driver refused but before this looked shows only in the
 * count of ended closes (closes_before: that count before the open). */
static int gave_way_elsewhere(const struct ipcc_legacy_key *key, uint64_t closes_before)
{
    struct ipcc_legacy_way way;
    ipcc_legacy_way_of(&way, key->ctx_id, key->handle);
    size_t closed = ipcc_legacy_close_in_the_way(&way);
    size_t waited = ipcc_legacy_close_wait_in_the_way(&way);
    return closed + waited > 0 || ipcc_legacy_closes_ended() != closes_before;
}

/* Not cached: map for real, then record the mapping. If the table already
 * holds that mapping (another thread's miss on the same key got in first, or
 * another handle the driver resolved to the same pointer), share its entry
 * and give back the driver reference this call took: an entry holds one. */
static CUresult open_miss(open_fn real, const struct ipcc_legacy_key *key, void *ctx,
                          CUdeviceptr *pdptr, CUipcMemHandle h, unsigned flags)
{
    if (!ctx)
        return passthrough_open(real, pdptr, h, flags);
    IPCC_COUNT(misses);
    uint64_t t0 = ipcc_clock_ns(), closes_before = ipcc_legacy_closes_ended();
    CUresult rc = real(pdptr, h, flags);
    if (rc == CUDA_ERROR_INVALID_HANDLE && gave_way_elsewhere(key, closes_before)) {
        t0 = ipcc_clock_ns();
        rc = real(pdptr, h, flags);
    }
    if (rc != CUDA_SUCCESS)
        return count_result(rc);
    IPCC_ADD(real_open_ns, ipcc_clock_ns() - t0);
    IPCC_COUNT(real_open_samples);
    IPCC_COUNT(real_opens);

    uint64_t dptr = *pdptr, cached = 0;
    uint64_t bytes = mapping_bytes(dptr);
    ipcc_lock();
    int inserted = ipcc_legacy_insert(ipcc_budget_legacy(), key, ctx, dptr, bytes, ipcc_clock_ns(),
                                      &cached);
    if (inserted >= 0)
        lend_here();
    ipcc_unlock();
    if (inserted > 0)
        ipcc_ledger_note_import(key->handle);
    if (inserted == 0) {
        timed_real_close((close_fn)ipcc_real(IPCC_SLOT_CLOSE), dptr);
        *pdptr = cached;
    } else if (inserted < 0) {
        ipcc_log(IPCC_LOG_WARN, "out of memory; mapping 0x%llx is not cached",
                 (unsigned long long)dptr);
    }
    return CUDA_SUCCESS;
}

/* The real function for a call the cache cannot answer itself; NULL only
 * when no driver is loaded at all. */
static open_fn real_open(int slot)
{
    return (open_fn)ipcc_real(slot);
}

static CUresult open_uncached(int slot, CUdeviceptr *pdptr, const CUipcMemHandle *h,
                              unsigned flags)
{
    open_fn real = real_open(slot);
    return real ? passthrough_open(real, pdptr, *h, flags) : IPCC_CUDA_NO_DRIVER;
}

/* ---- lending: a thread's repeat hits of one entry take no lock ---------- */

static pthread_key_t lent_key;
static int lent_key_made;

/* A thread's exit watch (lend_here's): not asked for yet, armed, or run. */
enum { WATCH_NONE, WATCH_ARMED, WATCH_RAN };

/* A thread that ends gives its loan back (its references stay counted) and
 * is never lent again: an IPC call from an exit destructor run after this
 * one would take a slot that nothing gives back. */
static void return_at_thread_exit(void *watch)
{
    *(int *)watch = WATCH_RAN;
    ipcc_lock();
    ipcc_legacy_loan_return(ipcc_budget_legacy(), 1);
    ipcc_unlock();
}

static void make_lent_key(void)
{
    lent_key_made = pthread_key_create(&lent_key, return_at_thread_exit) == 0;
}

/* Lock held, after this thread's hit or insert: lends it the entry if the
 * idle budget has room for it (tables/legacy_loans.c says why). Without a way to give it
 * back at thread exit, or once that has run, nothing is lent. */
static void lend_here(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    static __thread int watched __attribute__((tls_model("initial-exec")));
    uint64_t room_bytes, room_entries;
    if (!ipcc_legacy_loan_lendable(ipcc_budget_legacy()))
        return;
    pthread_once(&once, make_lent_key);
    if (!lent_key_made || watched == WATCH_RAN ||
        (watched == WATCH_NONE && pthread_setspecific(lent_key, &watched) != 0))
        return;
    watched = WATCH_ARMED;
    ipcc_budget_room(ipcc_config.max_idle_bytes, ipcc_config.max_idle_entries, &room_bytes,
                     &room_entries);
    ipcc_legacy_loan_lend_recent(ipcc_budget_legacy(), ipcc_clock_ns(), room_entries, room_bytes);
}

/* The thread's last hit again: no hash, no search. */
static int open_recent(uint64_t ctx_id, const CUipcMemHandle *h, unsigned flags, uint64_t *dptr)
{
    if (!ipcc_legacy_recent_is(ctx_id, h->reserved, flags))
        return 0;
    ipcc_lock();
    int hit = ipcc_legacy_find_recent(ipcc_budget_legacy(), dptr);
    if (hit)
        lend_here();
    ipcc_unlock();
    if (hit)
        IPCC_COUNT(hits_locked);
    return hit;
}

static int open_cached(uint64_t ctx_id, const CUipcMemHandle *h, unsigned flags, uint64_t *dptr)
{
    struct ipcc_legacy_key key;
    ipcc_legacy_key_init(&key, ctx_id, h->reserved, flags);
    ipcc_lock();
    int hit = ipcc_legacy_find(ipcc_budget_legacy(), &key, dptr);
    if (hit)
        lend_here();
    ipcc_unlock();
    if (hit)
        IPCC_COUNT(hits_locked);
    return hit;
}

/* The hit path touches neither the real function nor a copy of the handle. */
int ipcc_legacy_open_call(int slot, uint64_t *pdptr_u64, const void *handle_bytes, unsigned flags)
{
    CUdeviceptr *pdptr = (CUdeviceptr *)pdptr_u64;
    const CUipcMemHandle *h = handle_bytes;
    ipcc_lifecycle_start();

    uint64_t ctx_id;
    if (ipcc_config.disabled || !pdptr || current_context_id(&ctx_id) < 0)
        return open_uncached(slot, pdptr, h, flags);

    uint64_t dptr;
    if (ipcc_legacy_loan_open(ctx_id, h->reserved, flags, &dptr) ||
        open_recent(ctx_id, h, flags, &dptr) || open_cached(ctx_id, h, flags, &dptr)) {
        IPCC_COUNT(hits);
        *pdptr = (CUdeviceptr)dptr;
        return CUDA_SUCCESS;
    }
    struct ipcc_legacy_key key;
    ipcc_legacy_key_init(&key, ctx_id, h->reserved, flags);
    open_fn real = real_open(slot);
    return real ? open_miss(real, &key, current_context(), pdptr, *h, flags) : IPCC_CUDA_NO_DRIVER;
}

/* ---- close -------------------------------------------------------------- */

/* The program's last close of a mapping its exporter freed while it was in
 * use (the table removed it): without the cache this close would give the
 * memory back, so it does. */
static CUresult close_doomed(close_fn real, const struct ipcc_legacy_victim *self)
{
    CUresult rc = timed_real_close(real, (CUdeviceptr)self->dptr);
    ipcc_lock();
    ipcc_legacy_close_untaken(self, 1);
    ipcc_unlock();
    IPCC_COUNT(releases_on_request);
    return count_result(rc);
}

int ipcc_legacy_close_call(uint64_t dptr)
{
    ipcc_lifecycle_start();
    uint64_t ctx_id;
    /* A current context means a driver, hence a real close to call. A close
     * in a context whose id the table never saw (the one that opened was
     * torn down past us) finds nothing here: the driver answers it. */
    int cached = !ipcc_config.disabled && current_context_id(&ctx_id) == 0;
    /* The budget had room for it idle when it was lent: nothing to evict. */
    if (cached && ipcc_legacy_loan_close(ctx_id, dptr, ipcc_clock_coarse_ns())) {
        IPCC_COUNT(close_cached);
        return CUDA_SUCCESS;
    }
    close_fn real = (close_fn)ipcc_real(IPCC_SLOT_CLOSE);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    if (!cached)
        return passthrough_close(real, (CUdeviceptr)dptr);

    /* listed, never closed as a victim */
    const struct ipcc_legacy_victim self = { .ctx_id = ctx_id, .dptr = dptr };
    ipcc_lock();
    enum ipcc_release_result r =
        ipcc_legacy_release(ipcc_budget_legacy(), ctx_id, dptr, ipcc_clock_ns());
    /* The cache is closing this mapping elsewhere too (an entry taken before
     * the program opened it again: the driver handed back the same mapping),
     * so the driver holds that close's reference until it ends. */
    int closing = (r == IPCC_RELEASE_NOT_FOUND || r == IPCC_RELEASE_PAST_ZERO) &&
                  ipcc_legacy_close_pending(ctx_id, dptr);
    if (r == IPCC_RELEASE_PAST_ZERO || r == IPCC_RELEASE_LAST)
        ipcc_legacy_close_taken(&self, 1);
    ipcc_unlock();
    switch (r) {
    case IPCC_RELEASE_NOT_FOUND:
        if (closing)
            ipcc_legacy_close_wait(ctx_id, dptr);
        return passthrough_close(real, (CUdeviceptr)dptr);
    case IPCC_RELEASE_PAST_ZERO:
        /* Every reference cached opens took is closed: this one is the
         * application's own (opened past the cache) or none. The entry is
         * gone; give its reference back, then let the driver answer. */
        IPCC_COUNT(close_past_zero);
        timed_real_close(real, (CUdeviceptr)dptr);
        ipcc_lock();
        ipcc_legacy_close_untaken(&self, 1);
        ipcc_unlock();
        if (closing)
            ipcc_legacy_close_wait(ctx_id, dptr);
        return count_result(real((CUdeviceptr)dptr));
    case IPCC_RELEASE_LAST:
        return close_doomed(real, &self);
    case IPCC_RELEASE_OK:
        break;
    }
    IPCC_COUNT(close_cached);
    ipcc_budget_evict_over_caps();
    return CUDA_SUCCESS;
}

/* ---- context teardown --------------------------------------------------- */

/* The context is gone and the driver unmapped its mappings with it: forget
 * them, closing nothing. */
void ipcc_legacy_forget_context(uint64_t ctx_id)
{
    if (!ipcc_budget_legacy())
        return;
    ipcc_lock();
    size_t n = ipcc_legacy_drop_context(ipcc_budget_legacy(), ctx_id, NULL, 0);
    ipcc_unlock();
    IPCC_ADD(invalidations, n);
}

/* The contexts the cache holds entries of. */
static size_t cached_contexts(void **ctxs, uint64_t *ids, size_t cap)
{
    ipcc_lock();
    size_t n = ipcc_legacy_contexts(ipcc_budget_legacy(), ctxs, ids, cap);
    ipcc_unlock();
    return n;
}

/* After a primary context release or reset: drop the entries of every
 * context that no longer answers to its id. */
void ipcc_legacy_sweep_contexts(void)
{
    if (ipcc_budget_legacy())
        ipcc_legacy_sweep_dead_contexts(cached_contexts, ipcc_legacy_forget_context);
}
