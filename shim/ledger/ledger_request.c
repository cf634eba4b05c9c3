/*
 * ledger_request.c - an exporter's "I am freeing the allocation with this
 * handle", and the importers' answers.
 *
 * The exporter picks the importers that may hold the handle (those watching
 * it, alive), posts a request, rings each one's doorbell (a futex in the
 * shared file), and sleeps on the request's answer counter until each has
 * answered, died, or the wait bound passed. An importer answers by storing
 * the request's generation in its own slot, so a late answer can never count
 * for a later request in the same slot.
 *
 * A request whose exporter stopped waiting stays posted: an importer that was
 * stopped or slow still finds it and lets go late. Such slots are reused once
 * every importer asked has answered or died, or, when no slot is left, the
 * oldest first.
 */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "ledger_impl.h"

/* How often a waiting exporter looks for importers that died meanwhile. */
#define LIVENESS_SLICE_NS (5ULL * 1000 * 1000)

/* CLOCK_MONOTONIC is one clock for every process: deadlines are shared. */
/* ---- the exporter ------------------------------------------------------- */

static int watches(struct ipcc_ledger_importer *s, int32_t pid)
{
    if (atomic_load(&s->any))
        return 1;
    for (int w = 0; w < IPCC_LEDGER_WATCH; w++)
        if (atomic_load(&s->watch[w]) == pid)
            return 1;
    return 0;
}

/* The importers, other than us, that may hold our handles, whose pid runs
 * (a signal-0 probe; a recycled pid is found by the wait's first liveness
 * check, which reads start times) and whose helper thread can answer. */
static uint64_t importers_to_ask(struct ipcc_ledger_file *f, struct ipcc_proc me,
                                 int32_t pids[IPCC_LEDGER_IMPORTERS])
{
    uint64_t mask = 0;
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++) {
        struct ipcc_ledger_importer *s = &f->importers[i];
        int32_t pid = atomic_load(&s->pid);
        if (pid == 0 || pid == me.pid || !watches(s, me.pid) || !ipcc_proc_alive(pid, 0) ||
            !ipcc_ledger_helper_runs(s, pid))
            continue;
        pids[i] = pid;
        mask |= 1ULL << i;
    }
    return mask;
}

/* The asked importers that have neither answered generation gen of request
 * r nor (when check_alive) died. pids[] NULL: judge by the slots' owners. */
static uint64_t unanswered(struct ipcc_ledger_file *f, int r, uint32_t gen, uint64_t mask,
                           const int32_t *pids, int check_alive)
{
    uint64_t left = 0;
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++) {
        if (!(mask & (1ULL << i)))
            continue;
        struct ipcc_ledger_importer *s = &f->importers[i];
        int32_t pid = atomic_load(&s->pid);
        if (atomic_load_explicit(&s->acked[r], memory_order_acquire) == gen)
            continue;
        if ((pids && pid != pids[i]) ||
            (check_alive && (!ipcc_proc_alive(pid, atomic_load(&s->start)) ||
                             !ipcc_ledger_helper_runs(s, pid))))
            continue; /* gone, or its slot belongs to a newcomer */
        left |= 1ULL << i;
    }
    return left;
}

/* Takes request r if its state word still reads seen. */
static int take_request(struct ipcc_ledger_request *q, uint32_t seen)
{
    uint32_t writing = (seen & ~3u) | IPCC_REQ_WRITING;
    return atomic_compare_exchange_strong(&q->state, &seen, writing);
}

/* A free request slot, else a finished one nobody waits for, else the
 * oldest abandoned one; -1 if every slot has an exporter waiting on it. */
static int claim_request(struct ipcc_ledger_file *f, uint64_t now)
{
    int oldest = -1;
    uint32_t oldest_seen = 0;
    for (int r = 0; r < IPCC_LEDGER_REQUESTS; r++) {
        uint32_t seen = atomic_load(&f->requests[r].state);
        if (IPCC_REQ_STATE(seen) == IPCC_REQ_FREE && take_request(&f->requests[r], seen))
            return r;
    }
    for (int r = 0; r < IPCC_LEDGER_REQUESTS; r++) {
        struct ipcc_ledger_request *q = &f->requests[r];
        uint32_t seen = atomic_load(&q->state);
        uint64_t deadline = atomic_load(&q->deadline_ns);
        if (IPCC_REQ_STATE(seen) != IPCC_REQ_POSTED || deadline > now)
            continue;
        if (!unanswered(f, r, IPCC_REQ_GEN(seen), atomic_load(&q->expected), NULL, 1) &&
            take_request(q, seen))
            return r;
        if (oldest < 0 || deadline < atomic_load(&f->requests[oldest].deadline_ns)) {
            oldest = r;
            oldest_seen = seen;
        }
    }
    if (oldest >= 0 && take_request(&f->requests[oldest], oldest_seen))
        return oldest;
    return -1;
}

/* Writes the request (its slot is ours: WRITING) and posts it under the
 * next generation; 0 is what a fresh importer slot has acknowledged. */
static uint32_t post(struct ipcc_ledger_request *q, struct ipcc_proc me, const void *handle,
                     uint64_t mask, uint64_t deadline)
{
    atomic_store(&q->pid, me.pid);
    atomic_store(&q->start, me.start);
    memcpy(q->handle, handle, IPCC_HANDLE_BYTES);
    atomic_store(&q->expected, mask);
    atomic_store(&q->deadline_ns, deadline);
    uint32_t gen = (IPCC_REQ_GEN(atomic_load(&q->state)) + 1) & (UINT32_MAX >> 2);
    gen += gen == 0;
    atomic_store_explicit(&q->state, gen << 2 | IPCC_REQ_POSTED, memory_order_release);
    return gen;
}

/* Frees request q if it is still generation gen: an exporter that was
 * stopped past its deadline may find its slot taken by another exporter's
 * live request, which it must leave posted. */
static void finish_request(struct ipcc_ledger_request *q, uint32_t gen)
{
    uint32_t mine = gen << 2 | IPCC_REQ_POSTED;
    atomic_compare_exchange_strong_explicit(&q->state, &mine, gen << 2 | IPCC_REQ_FREE,
                                            memory_order_release, memory_order_relaxed);
}

static void ring(struct ipcc_ledger_file *f, uint64_t mask)
{
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++) {
        if (!(mask & (1ULL << i)))
            continue;
        atomic_fetch_add_explicit(&f->importers[i].doorbell, 1, memory_order_release);
        ipcc_futex_wake(&f->importers[i].doorbell);
    }
}

/*
 * Called by an exporter about to free the allocation behind handle: asks
 * every live importer that may hold it to close its idle mappings of it, and
 * waits until they have answered, at most wait_ns. Returns how many asked
 * importers did not answer in time (0: all did, or there were none), or -1
 * when the ledger is missing or full (nothing was asked).
 */
int ipcc_ledger_release(const void *handle, uint64_t wait_ns)
{
    if (!ipcc_ledger_ready())
        return -1;
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    struct ipcc_proc me = ipcc_proc_self();
    int32_t pids[IPCC_LEDGER_IMPORTERS] = { 0 };
    uint64_t mask = importers_to_ask(f, me, pids);
    if (!mask)
        return 0; /* the common case for memory nobody imported */
    uint64_t now = ipcc_clock_ns(), deadline = now + wait_ns;
    int r = claim_request(f, now);
    if (r < 0)
        return -1;
    struct ipcc_ledger_request *q = &f->requests[r];
    uint32_t gen = post(q, me, handle, mask, deadline);
    ring(f, mask);

    uint64_t left = mask;
    int check_alive = 0;
    while ((left = unanswered(f, r, gen, left, pids, check_alive)) != 0 &&
           (now = ipcc_clock_ns()) < deadline) {
        uint32_t seen = atomic_load_explicit(&q->answers, memory_order_acquire);
        left = unanswered(f, r, gen, left, pids, 0); /* an answer may have come meanwhile */
        if (!left)
            break;
        uint64_t nap = deadline - now < LIVENESS_SLICE_NS ? deadline - now : LIVENESS_SLICE_NS;
        ipcc_futex_wait(&q->answers, seen, nap);
        check_alive = 1;
    }
    if (!left)
        finish_request(q, gen);
    return __builtin_popcountll(left);
}

/* ---- the importer ------------------------------------------------------- */

/* The first posted request at index >= from that slot has not answered yet,
 * copied into *ask; its index, or -1 when there is none. */
int ipcc_ledger_next_ask(int slot, int from, struct ipcc_ledger_ask *ask)
{
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    if (!f || slot < 0)
        return -1;
    struct ipcc_ledger_importer *s = &f->importers[slot];
    for (int r = from < 0 ? 0 : from; r < IPCC_LEDGER_REQUESTS; r++) {
        struct ipcc_ledger_request *q = &f->requests[r];
        uint32_t seen = atomic_load_explicit(&q->state, memory_order_acquire);
        uint32_t gen = IPCC_REQ_GEN(seen);
        if (IPCC_REQ_STATE(seen) != IPCC_REQ_POSTED || atomic_load(&s->acked[r]) == gen)
            continue;
        memcpy(ask->handle, q->handle, IPCC_HANDLE_BYTES);
        atomic_thread_fence(memory_order_acquire);
        /* The copy counts only if the request did not change under it. */
        if (atomic_load(&q->state) != seen)
            continue;
        ask->index = r;
        ask->gen = gen;
        return r;
    }
    return -1;
}

/* Tells the exporter of ask that this slot's idle mappings of it are closed. */
void ipcc_ledger_answer(int slot, const struct ipcc_ledger_ask *ask)
{
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    struct ipcc_ledger_request *q = &f->requests[ask->index];
    atomic_store_explicit(&f->importers[slot].acked[ask->index], ask->gen, memory_order_release);
    atomic_fetch_add_explicit(&q->answers, 1, memory_order_release);
    ipcc_futex_wake(&q->answers);
}
