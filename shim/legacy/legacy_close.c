/*
 * legacy_close.c - really closing legacy IPC mappings the cache has given
 * up (idle_budget.c chose them, or the exporter asked for them back).
 *
 * The driver closes in the current context, so a victim from another context
 * is closed with its own context pushed, and the caller's restored after.
 */
#include <cuda.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "legacy_impl.h"

typedef CUresult (*close_fn)(CUdeviceptr);

/* ---- contexts (legacy_calls.c, the closes here and the sweeps) --------- */

/* Said once, the first time a call finds no context ids. */
static void say_no_context_ids(void)
{
    static _Atomic int said;
    if (!atomic_exchange_explicit(&said, 1, memory_order_relaxed))
        ipcc_log(IPCC_LOG_INFO, "the driver has no cuCtxGetId (CUDA before 12.0); "
                                "nothing is cached, every call goes to the driver");
}

/* A context's identity for the key. cuCtxGetId (driver >= 12.0) is unique
 * for the life of the process, so a new context at a dead one's address, or
 * a reset primary context, never matches old entries. Without it a context
 * cannot be told from its successor at the same address, so nothing is
 * cached (-1: the caller passes the call through). */
int ipcc_legacy_context_id(void *ctx, uint64_t *id)
{
    const struct ipcc_driver *d = ipcc_driver();
    if (!d->ctx_get_id) {
        say_no_context_ids();
        return -1;
    }
    unsigned long long v;
    if (d->ctx_get_id(ctx, &v) != CUDA_SUCCESS)
        return -1;
    *id = v;
    return 0;
}

/* Whether ctx still answers to id: 0 once it was torn down, a newer context
 * at its address (a reset primary one included) answering another. */
int ipcc_legacy_context_is(void *ctx, uint64_t id)
{
    uint64_t now;
    return ipcc_legacy_context_id(ctx, &now) == 0 && now == id;
}

/* After a primary context release or reset: gone(id) for each context list
 * names that no longer answers to its id (the cache's entries' contexts, or
 * those exports were made in). list holds no lock once it returns: gone
 * takes the table lock and calls the driver. */
void ipcc_legacy_sweep_dead_contexts(ipcc_legacy_context_list list, ipcc_legacy_context_gone gone)
{
    enum { MAX_CONTEXTS = 64 };
    void *ctxs[MAX_CONTEXTS];
    uint64_t ids[MAX_CONTEXTS];
    size_t n = list(ctxs, ids, MAX_CONTEXTS);
    for (size_t i = 0; i < n; i++)
        if (!ipcc_legacy_context_is(ctxs[i], ids[i]))
            gone(ids[i]);
}

/* ---- mappings being closed --------------------------------------------- */

/*
 * A victim leaves the table under the lock and is closed after it. Until
 * then the driver still holds the cache's reference, so an application's
 * extra close of that pointer meanwhile (one the driver alone would refuse)
 * would drop the cache's reference and succeed. Victims are listed here
 * until their close is done, and such a close waits for it. Fixed slots:
 * more closes in flight at once than slots leaves the rest unlisted (the
 * race above, for them only). All three calls need the table lock.
 */
#define CLOSING_SLOTS 128
static struct {
    uint64_t ctx_id, dptr;
    int used;
    unsigned char handle[IPCC_HANDLE_BYTES]; /* the victim's, for a give-way's wait */
} closing[CLOSING_SLOTS];

void ipcc_legacy_close_taken(const struct ipcc_legacy_victim *v, size_t n)
{
    for (size_t i = 0, s = 0; i < n; i++) {
        while (s < CLOSING_SLOTS && closing[s].used)
            s++;
        if (s == CLOSING_SLOTS)
            return;
        closing[s].ctx_id = v[i].ctx_id;
        closing[s].dptr = v[i].dptr;
        memcpy(closing[s].handle, v[i].handle, IPCC_HANDLE_BYTES);
        closing[s].used = 1;
    }
}

static int closing_slot(uint64_t ctx_id, uint64_t dptr)
{
    for (int s = 0; s < CLOSING_SLOTS; s++)
        if (closing[s].used && closing[s].ctx_id == ctx_id && closing[s].dptr == dptr)
            return s;
    return -1;
}

void ipcc_legacy_close_untaken(const struct ipcc_legacy_victim *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int s = closing_slot(v[i].ctx_id, v[i].dptr);
        if (s >= 0)
            closing[s].used = 0;
    }
}

int ipcc_legacy_close_pending(uint64_t ctx_id, uint64_t dptr)
{
    return closing_slot(ctx_id, dptr) >= 0;
}

/* The cache is really closing this mapping in another thread (eviction, an
 * exporter's request, a close past zero): the driver still holds the cache's
 * reference, so answering a close now would take it. Waits for that close;
 * it never waits on anything of ours. Called without the lock. */
void ipcc_legacy_close_wait(uint64_t ctx_id, uint64_t dptr)
{
    int listed;
    do {
        sched_yield();
        ipcc_lock();
        listed = ipcc_legacy_close_pending(ctx_id, dptr);
        ipcc_unlock();
    } while (listed);
}

/* Waits for the closes other threads had in flight, when called, in any
 * context but keep_ctx_id's, of mappings in_the_way accepts (asked under the
 * lock); returns how many. Called without the lock. */
size_t ipcc_legacy_close_wait_elsewhere(uint64_t keep_ctx_id,
                                        ipcc_legacy_handle_test in_the_way, void *arg)
{
    struct { uint64_t ctx_id, dptr; } in_flight[CLOSING_SLOTS];
    size_t n = 0;
    ipcc_lock();
    for (int s = 0; s < CLOSING_SLOTS; s++)
        if (closing[s].used && closing[s].ctx_id != keep_ctx_id &&
            in_the_way(closing[s].handle, arg)) {
            in_flight[n].ctx_id = closing[s].ctx_id;
            in_flight[n++].dptr = closing[s].dptr;
        }
    ipcc_unlock();
    for (size_t i = 0; i < n; i++)
        ipcc_legacy_close_wait(in_flight[i].ctx_id, in_flight[i].dptr);
    return n;
}

/* Fork child: the closes in flight were the parent's threads'. */
void ipcc_legacy_close_fork_child(void)
{
    for (int s = 0; s < CLOSING_SLOTS; s++)
        closing[s].used = 0;
}

static void close_victims(const struct ipcc_legacy_victim *v, size_t n, int evicted);

/* How many victims' closes have ended, counted before they are unlisted: an
 * open the driver refused while one was in flight, which finds it neither
 * idle nor listed once it looks, tells by this count that it ended since. */
static _Atomic uint64_t closes_ended;

uint64_t ipcc_legacy_closes_ended(void)
{
    return atomic_load(&closes_ended);
}

/* Closes victims the caller took from the table under the lock and listed
 * as closing before it unlocked; unlists them after. */
void ipcc_legacy_close_run(const struct ipcc_legacy_victim *v, size_t n, int evicted)
{
    close_victims(v, n, evicted);
    if (n == 0)
        return;
    atomic_fetch_add(&closes_ended, n);
    ipcc_lock();
    ipcc_legacy_close_untaken(v, n);
    ipcc_unlock();
}

/* ---- closing ------------------------------------------------------------- */

/* What closing one victim came to. */
enum close_outcome { CLOSED, FAILED, CONTEXT_GONE };

/* Whether the current context is still the victim's: a context destroyed
 * since the victim was taken may have a successor at its address, whose
 * mappings are not ours to close (the driver unmapped ours with the old).
 * Asked of the current context (NULL), the one the close would act in, so
 * the answer never rests on what the driver says of a dead pointer. */
static int victim_context_current(const struct ipcc_legacy_victim *v)
{
    uint64_t id;
    return ipcc_legacy_context_id(NULL, &id) == 0 && id == v->ctx_id;
}

static enum close_outcome close_current(close_fn real, const struct ipcc_legacy_victim *v)
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
static enum close_outcome close_in_context(close_fn real, const struct ipcc_legacy_victim *v)
{
    const struct ipcc_driver *d = ipcc_driver();
    void *current = NULL;
    if (d->ctx_get_current)
        d->ctx_get_current(&current);
    if (current == v->ctx)
        return close_current(real, v);
    if (!d->ctx_push || !d->ctx_pop)
        return FAILED;
    /* The driver accepts a push of a destroyed context's pointer and aborts the
     * process at the next call (H200, driver 580): ask the pointer's id first
     * (a dead one is refused, a successor at its address has another id). */
    uint64_t id;
    if (ipcc_legacy_context_id(v->ctx, &id) < 0 || id != v->ctx_id)
        return CONTEXT_GONE;
    int rc = d->ctx_push(v->ctx);
    if (rc != CUDA_SUCCESS)
        return rc == CUDA_ERROR_INVALID_CONTEXT || rc == CUDA_ERROR_CONTEXT_IS_DESTROYED
                   ? CONTEXT_GONE : FAILED;
    enum close_outcome out = close_current(real, v);
    void *popped;
    d->ctx_pop(&popped);
    return out;
}

/* Closes each victim's mapping; failures are expected only when the driver
 * is already gone (exit), so they are logged at debug level. A victim whose
 * context died meanwhile died with it: counted as an invalidation. */
static void close_victims(const struct ipcc_legacy_victim *v, size_t n, int evicted)
{
    close_fn real = (close_fn)ipcc_real(IPCC_SLOT_CLOSE);
    if (!real)
        return;
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = ipcc_clock_ns();
        enum close_outcome out = close_in_context(real, &v[i]);
        if (out == CONTEXT_GONE)
            IPCC_COUNT(invalidations);
        if (out != CLOSED)
            continue;
        IPCC_ADD(real_close_ns, ipcc_clock_ns() - t0);
        IPCC_COUNT(real_close_samples);
        IPCC_COUNT(real_closes);
        if (evicted)
            IPCC_COUNT(evictions);
    }
}
