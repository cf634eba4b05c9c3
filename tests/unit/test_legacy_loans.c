/*
 * test_legacy_loans.c - entries lent to threads, the table alone: a
 * thread's calls on its loan, its loan taken back by itself and by other
 * threads, an owner's calls racing recalls, what a recall folds back (idle
 * time, the top list), lending with the budget full, and a fork child's
 * slots.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "legacy_table.h"

#define CTX 1
#define ROOM 1000000

static struct ipcc_legacy_table *cache;

static void setup(void)
{
    cache = ipcc_legacy_table_create();
    cr_assert_not_null(cache);
}

static void teardown(void)
{
    ipcc_legacy_table_destroy(cache);
}

TestSuite(legacy_loans, .init = setup, .fini = teardown, .timeout = 10);

static unsigned char *handle(unsigned char tag)
{
    static _Thread_local unsigned char bytes[IPCC_HANDLE_BYTES];
    memset(bytes, 0, sizeof(bytes));
    bytes[0] = tag;
    return bytes;
}

static uint64_t dptr_of(unsigned char tag)
{
    return 0x100000ULL * tag;
}

/* The calling thread takes a reference of entry tag (inserting it if new)
 * and is lent it, as legacy_calls.c does on a miss or a locked hit. */
static void take_and_borrow(unsigned char tag)
{
    struct ipcc_legacy_key k;
    uint64_t p;
    ipcc_legacy_key_init(&k, CTX, handle(tag), 1);
    if (!ipcc_legacy_find(cache, &k, &p))
        cr_assert_eq(ipcc_legacy_insert(cache, &k, NULL, dptr_of(tag), 4096, 1, &p), 1);
    cr_assert_eq(ipcc_legacy_loan_lend_recent(cache, 2, ROOM, ROOM), 1, "entry %d lent", tag);
}

static int open_lent(unsigned char tag)
{
    uint64_t p = 0;
    int hit = ipcc_legacy_loan_open(CTX, handle(tag), 1, &p);
    cr_assert(!hit || p == dptr_of(tag));
    return hit;
}

static int close_lent(unsigned char tag)
{
    return ipcc_legacy_loan_close(CTX, dptr_of(tag), 3);
}

/* A thread's open and close of its loan answer without the table. */
Test(legacy_loans, a_loan_answers_its_threads_calls)
{
    take_and_borrow(1);
    cr_assert_eq(open_lent(1), 1);
    cr_assert_eq(close_lent(1), 1);
    cr_assert_eq(close_lent(1), 1, "the reference taken when lent");
    cr_assert_eq(close_lent(1), 0, "none left: past zero is the table's to answer");
    cr_assert_eq(open_lent(2), 0, "another handle");
}

/* Lending the thread another entry takes back its own loan; so does
 * returning it (a call whose order matters, or thread exit). */
Test(legacy_loans, own_loan_comes_back)
{
    take_and_borrow(1);
    take_and_borrow(2);
    cr_assert_eq(open_lent(1), 0);
    cr_assert_eq(open_lent(2), 1);
    ipcc_legacy_loan_return(cache, 0);
    cr_assert_eq(open_lent(2), 0);
}

/* ---- other threads' loans -------------------------------------------------- */

static pthread_barrier_t step;

/* Borrows entry (long)arg, then waits while the main thread recalls it, then
 * reports whether its loan still answered. */
static void *borrow_then_try(void *arg)
{
    unsigned char tag = (unsigned char)(long)arg;
    ipcc_lock();
    take_and_borrow(tag);
    ipcc_unlock();
    pthread_barrier_wait(&step); /* lent */
    pthread_barrier_wait(&step); /* recalled */
    return (void *)(long)(open_lent(tag) || close_lent(tag));
}

static void start_borrowers(pthread_t *t, const long *tags, int n)
{
    pthread_barrier_init(&step, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, borrow_then_try, (void *)tags[i]);
    pthread_barrier_wait(&step);
}

static void finish_borrowers(pthread_t *t, int n)
{
    pthread_barrier_wait(&step);
    for (int i = 0; i < n; i++) {
        void *answered;
        pthread_join(t[i], &answered);
        cr_assert_null(answered, "borrower %d: its loan answered after the recall", i);
    }
    pthread_barrier_destroy(&step);
}

/* The main thread drops the context, which removes n entries. */
static void drop_context(size_t n)
{
    ipcc_lock();
    cr_assert_eq(ipcc_legacy_drop_context(cache, CTX, NULL, 0), n);
    ipcc_unlock();
}

/* Dropping a context takes back other threads' loans of it (two threads,
 * two entries, one shared): their loans answer no more. */
Test(legacy_loans, recall_takes_back_other_threads_loans)
{
    pthread_t t[3];
    const long tags[3] = { 1, 2, 2 };
    start_borrowers(t, tags, 3);
    drop_context(2);
    finish_borrowers(t, 3);
}

/* Borrows entry 1; after the main thread's recall, finds its loan gone,
 * takes the entry on the locked path (lent again) and reports whether the
 * new loan answers. */
static void *borrow_again(void *arg)
{
    (void)arg;
    ipcc_lock();
    take_and_borrow(1);
    ipcc_unlock();
    pthread_barrier_wait(&step); /* lent */
    pthread_barrier_wait(&step); /* recalled */
    if (open_lent(1))
        return (void *)1;
    ipcc_lock();
    take_and_borrow(1);
    ipcc_unlock();
    return (void *)(long)(open_lent(1) && close_lent(1) && close_lent(1) ? 0 : 2);
}

/* A loan lent again after another thread's recall answers its thread's
 * calls. */
Test(legacy_loans, loan_lent_again_after_a_recall_answers)
{
    pthread_t t;
    pthread_barrier_init(&step, NULL, 2);
    pthread_create(&t, NULL, borrow_again, NULL);
    pthread_barrier_wait(&step);
    ipcc_lock();
    ipcc_legacy_loan_recall_all(cache);
    ipcc_unlock();
    pthread_barrier_wait(&step);
    void *ret;
    pthread_join(t, &ret);
    cr_assert_null(ret, "step %ld: %s", (long)ret,
                   (long)ret == 1 ? "the recalled loan answered" : "the new loan did not answer");
    pthread_barrier_destroy(&step);
}

/* ---- an owner's calls racing recalls ---------------------------------------- */

static _Atomic int owner_stop;
static _Atomic long owner_lends; /* loans its locked path made it: one per recall seen */

/* Opens and closes entry 1 until told to stop, on its loan while it has one,
 * else on the locked path (which lends it again); non-NULL if a call failed. */
static void *hit_while_recalled(void *arg)
{
    (void)arg;
    struct ipcc_legacy_key k;
    ipcc_legacy_key_init(&k, CTX, handle(1), 1);
    void *failed = NULL;
    while (!atomic_load_explicit(&owner_stop, memory_order_relaxed) && !failed) {
        uint64_t p;
        if (!open_lent(1)) {
            ipcc_lock();
            if (!ipcc_legacy_find(cache, &k, &p))
                failed = (void *)1;
            else
                atomic_fetch_add(&owner_lends, ipcc_legacy_loan_lend_recent(cache, 2, ROOM, ROOM));
            ipcc_unlock();
        }
        if (!close_lent(1)) {
            ipcc_lock();
            if (ipcc_legacy_release(cache, CTX, dptr_of(1), 3) != IPCC_RELEASE_OK)
                failed = (void *)2;
            ipcc_unlock();
        }
    }
    return failed;
}

/* One thread hits its loan while another recalls it again and again,
 * sleeping between recalls so that its wake-ups preempt the owner anywhere,
 * mid-call too (on one processor as on many): an update the owner makes
 * after a recall fails, so none is lost or made on a loan already taken
 * back (which would crash the next recall). Afterwards the entry is idle
 * with every reference closed. */
Test(legacy_loans, recalls_racing_an_owner_lose_no_update, .timeout = 60)
{
    uint64_t p;
    struct ipcc_legacy_key k;
    ipcc_legacy_key_init(&k, CTX, handle(1), 1);
    cr_assert_eq(ipcc_legacy_insert(cache, &k, NULL, dptr_of(1), 4096, 1, &p), 1);
    cr_assert_eq(ipcc_legacy_release(cache, CTX, dptr_of(1), 1), IPCC_RELEASE_OK);
    pthread_t owner;
    pthread_create(&owner, NULL, hit_while_recalled, NULL);
    for (int i = 0; i < 3000; i++) {
        ipcc_lock();
        ipcc_legacy_loan_recall_all(cache);
        ipcc_unlock();
        nanosleep(&(struct timespec){ 0, 10000 }, NULL);
    }
    atomic_store(&owner_stop, 1);
    void *failed;
    pthread_join(owner, &failed);
    cr_assert_null(failed, "the owner's locked call %ld failed", (long)failed);
    cr_assert_gt(atomic_load(&owner_lends), 100, "the owner was lent and recalled");
    ipcc_legacy_loan_recall_all(cache);
    struct ipcc_legacy_totals t;
    ipcc_legacy_gauges_now(cache, &t);
    cr_assert_eq(t.live, 0, "a reference left after %ld loans", atomic_load(&owner_lends));
    cr_assert_eq(t.idle, 1);
    cr_assert_eq(ipcc_legacy_release(cache, CTX, dptr_of(1), 4), IPCC_RELEASE_PAST_ZERO);
}

/* ---- what a recall folds back ------------------------------------------------ */

/* Runs fn in a thread of its own and joins it. */
static void in_thread(void *(*fn)(void *))
{
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, NULL), 0);
    pthread_join(t, NULL);
}

/* The calling thread takes a reference of entry tag at time now and is lent
 * it, with no room left in the budget (an entry lent already needs none):
 * 1 when lent. */
static int take_and_borrow_full(unsigned char tag, uint64_t now)
{
    struct ipcc_legacy_key k;
    uint64_t p;
    ipcc_legacy_key_init(&k, CTX, handle(tag), 1);
    cr_assert_eq(ipcc_legacy_find(cache, &k, &p), 1, "entry %d cached", tag);
    return ipcc_legacy_loan_lend_recent(cache, now, 0, 0);
}

/* Lent entry 1, closes it at 10 (its slot's last close); the loan stays. */
static void *borrow_and_close_at_10(void *arg)
{
    (void)arg;
    ipcc_lock();
    take_and_borrow(1);
    ipcc_unlock();
    cr_assert_eq(ipcc_legacy_loan_close(CTX, dptr_of(1), 10), 1);
    return NULL;
}

/* Entry tag, inserted and closed at now: idle since then. */
static void idle_at(unsigned char tag, uint64_t now)
{
    struct ipcc_legacy_key k;
    uint64_t p;
    ipcc_legacy_key_init(&k, CTX, handle(tag), 1);
    cr_assert_eq(ipcc_legacy_insert(cache, &k, NULL, dptr_of(tag), 4096, now, &p), 1);
    cr_assert_eq(ipcc_legacy_release(cache, CTX, dptr_of(tag), now), IPCC_RELEASE_OK);
}

/* An entry lent to two threads went idle at its latest close (30, by the
 * main thread, whose slot is recalled first), not at the other slot's older
 * one (10): entry 3, idle since 20 between them, is the one evicted. */
Test(legacy_loans, recall_keeps_the_latest_close)
{
    take_and_borrow(9); /* the main thread's slot comes first */
    idle_at(1, 1);
    in_thread(borrow_and_close_at_10);
    idle_at(3, 20);
    cr_assert_eq(take_and_borrow_full(1, 25), 1);
    cr_assert_eq(ipcc_legacy_loan_close(CTX, dptr_of(1), 30), 1);
    ipcc_legacy_loan_recall_all(cache);
    uint64_t oldest = 0;
    cr_assert_eq(ipcc_legacy_oldest_idle(cache, &oldest), 1);
    cr_assert_eq(oldest, 20, "entry 1 went idle at %llu, before entry 3",
                 (unsigned long long)oldest);
    struct ipcc_legacy_victim v;
    cr_assert_eq(ipcc_legacy_evict(cache, ROOM, 1, &v, 1), 1);
    cr_assert_eq(v.dptr, dptr_of(3));
}

/* The references the top list shows for the table's one entry. */
static uint64_t top_refs(void)
{
    static struct ipcc_top_slot top[IPCC_TOP_SLOTS];
    ipcc_legacy_top_now(cache, top);
    for (int i = 0; i < IPCC_TOP_SLOTS; i++)
        if (top[i].used)
            return top[i].refs;
    cr_assert_fail("the entry has no top slot");
    return 0;
}

/* A recalled loan's references show in the top list: the program holds
 * both (the one taken when lent and one more). */
Test(legacy_loans, recall_shows_its_references_in_the_top_list)
{
    struct ipcc_legacy_key k;
    uint64_t p;
    ipcc_legacy_key_init(&k, CTX, handle(1), 1);
    cr_assert_eq(ipcc_legacy_insert(cache, &k, NULL, dptr_of(1), 4096, 1, &p), 1);
    cr_assert_eq(ipcc_legacy_loan_lend_recent(cache, 2, ROOM, ROOM), 1);
    cr_assert_eq(open_lent(1), 1);
    cr_assert_eq(top_refs(), 2, "while lent");
    ipcc_legacy_loan_recall_all(cache);
    cr_assert_eq(top_refs(), 2, "after the recall");
}

/* Lent entry 1 (it stays lent: nothing returns it). */
static void *borrow_1(void *arg)
{
    (void)arg;
    ipcc_lock();
    take_and_borrow(1);
    ipcc_unlock();
    return NULL;
}

/* An entry lent to one thread is lent to a second with the budget full: it
 * is counted idle once, already. */
Test(legacy_loans, shared_entry_lent_with_the_budget_full)
{
    in_thread(borrow_1);
    cr_assert_eq(take_and_borrow_full(1, 3), 1, "the second thread was not lent it");
    cr_assert_eq(open_lent(1), 1);
}

/* ---- fork child ---------------------------------------------------------------- */

/* After a fork the forking thread takes a slot of its own again: a thread of
 * the child lent one entry and the forking thread lent another count each
 * reference on its own entry. */
Test(legacy_loans, fork_child_threads_keep_their_own_slots)
{
    take_and_borrow(1); /* the forking thread's slot */
    ipcc_legacy_loan_fork_child(cache);
    ipcc_legacy_table_clear(cache);
    pthread_t t;
    pthread_barrier_init(&step, NULL, 2);
    pthread_create(&t, NULL, borrow_then_try, (void *)2L); /* a thread of the child */
    pthread_barrier_wait(&step);
    take_and_borrow(3);
    pthread_barrier_wait(&step);
    void *opened;
    pthread_join(t, &opened);
    pthread_barrier_destroy(&step);
    cr_assert_eq((long)opened, 1, "the thread's loan of entry 2 answered");
    ipcc_legacy_loan_recall_all(cache);
    for (unsigned char tag = 2; tag <= 3; tag++) {
        int refs = 0;
        while (ipcc_legacy_release(cache, CTX, dptr_of(tag), 4) == IPCC_RELEASE_OK)
            refs++;
        cr_assert_eq(refs, tag == 2 ? 2 : 1, "entry %d had %d references", tag, refs);
    }
}
