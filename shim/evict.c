/*
 * evict.c - really closing mappings the table has given up: idle entries
 * past the caps (least recently used first), and every idle entry at exit.
 *
 * An idle mapping pins the exporter's memory (the docs call freeing exported
 * memory while it is mapped undefined; in practice it stays allocated), so
 * IPCCACHE_MAX_IDLE_BYTES and IPCCACHE_MAX_IDLE_ENTRIES bound what we keep.
 *
 * The driver closes in the current context, so a victim from another context
 * is closed with its own context pushed, and the caller's restored after.
 */
#include <cuda.h>

#include "internal.h"

typedef CUresult (*close_fn)(CUdeviceptr);

#define BATCH 32

/* What closing one victim came to. */
enum close_outcome { CLOSED, FAILED, CONTEXT_GONE };

/* Whether the current context is still the victim's: a context destroyed
 * since the victim was taken may have a successor at its address, whose
 * mappings are not ours to close (the driver unmapped ours with the old). */
static int victim_context_current(const struct ipcc_victim *v)
{
    uint64_t id;
    return ipcc_context_id(v->ctx, &id) == 0 && id == v->ctx_id;
}

static enum close_outcome close_current(close_fn real, const struct ipcc_victim *v)
{
    if (!victim_context_current(v))
        return CONTEXT_GONE;
    CUresult rc = real((CUdeviceptr)v->dptr);
    if (rc != CUDA_SUCCESS)
        ipcc_log(IPCC_LOG_DEBUG, "closing cached mapping 0x%llx failed: error %d",
                 (unsigned long long)v->dptr, (int)rc);
    return rc == CUDA_SUCCESS ? CLOSED : FAILED;
}

/* Closes a victim in its own context, pushed for the call when it is not
 * the current one, and checked once current. */
static enum close_outcome close_in_context(close_fn real, const struct ipcc_victim *v)
{
    const struct ipcc_driver *d = ipcc_driver();
    void *current = NULL;
    if (d->ctx_get_current)
        d->ctx_get_current(&current);
    if (current == v->ctx)
        return close_current(real, v);
    if (!d->ctx_push || !d->ctx_pop)
        return FAILED;
    int rc = d->ctx_push(v->ctx);
    if (rc != CUDA_SUCCESS) /* a dead context is invalid until one reuses its address */
        return rc == CUDA_ERROR_INVALID_CONTEXT ? CONTEXT_GONE : FAILED;
    enum close_outcome out = close_current(real, v);
    void *popped;
    d->ctx_pop(&popped);
    return out;
}

/* Closes each victim's mapping; failures are expected only when the driver
 * is already gone (exit), so they are logged at debug level. A victim whose
 * context died meanwhile died with it: counted as an invalidation. */
void ipcc_close_victims(const struct ipcc_victim *v, size_t n, int evicted)
{
    close_fn real = (close_fn)ipcc_real(IPCC_SLOT_CLOSE);
    if (!real)
        return;
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = ipcc_now_ns();
        enum close_outcome out = close_in_context(real, &v[i]);
        if (out == CONTEXT_GONE)
            IPCC_COUNT(invalidations);
        if (out != CLOSED)
            continue;
        IPCC_ADD(real_close_ns, ipcc_now_ns() - t0);
        IPCC_COUNT(real_close_samples);
        IPCC_COUNT(real_closes);
        if (evicted)
            IPCC_COUNT(evictions);
    }
}

/* What one batch takes from the table: cap victims at most, described in out[]. */
typedef size_t (*take_fn)(struct ipcc_cache *c, const void *arg,
                          struct ipcc_victim *out, size_t cap);

/* Takes victims from the table and closes them, a batch at a time so the lock
 * is never held across a driver call. Returns how many were closed or tried. */
static size_t close_in_batches(take_fn take, const void *arg, int evicted)
{
    struct ipcc_victim victims[BATCH];
    size_t n, total = 0;
    do {
        ipcc_lock();
        n = take(ipcc_table(), arg, victims, BATCH);
        ipcc_unlock();
        ipcc_close_victims(victims, n, evicted);
        total += n;
    } while (n == BATCH);
    return total;
}

struct caps {
    uint64_t max_bytes, max_entries;
};

static size_t take_over_caps(struct ipcc_cache *c, const void *arg,
                             struct ipcc_victim *out, size_t cap)
{
    const struct caps *k = arg;
    return ipcc_cache_evict(c, k->max_bytes, k->max_entries, out, cap);
}

static size_t take_other_contexts(struct ipcc_cache *c, const void *arg,
                                  struct ipcc_victim *out, size_t cap)
{
    return ipcc_cache_evict_other_contexts(c, *(const uint64_t *)arg, out, cap);
}

/* Called after every close that left an entry idle; the common case, under
 * both caps, costs two atomic loads and no lock. */
void ipcc_evict_over_caps(void)
{
    const struct caps k = { ipcc_config.max_idle_bytes, ipcc_config.max_idle_entries };
    if (ipcc_cache_over_caps(ipcc_table(), k.max_bytes, k.max_entries))
        close_in_batches(take_over_caps, &k, 1);
}

/* The driver lets one exporter's handles be open in only one context per
 * device; an idle mapping we keep in another context would make an open
 * fail that succeeds without us. Closes every idle mapping outside
 * keep_ctx_id; returns how many. */
size_t ipcc_release_idle_elsewhere(uint64_t keep_ctx_id)
{
    return close_in_batches(take_other_contexts, &keep_ctx_id, 1);
}

/* At exit: the application is done with idle mappings; give the exporter
 * its memory back while the driver is still up. */
void ipcc_release_all_idle(void)
{
    const struct caps nothing = { 0, 0 };
    close_in_batches(take_over_caps, &nothing, 0);
}
