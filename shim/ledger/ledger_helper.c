/*
 * ledger_helper.c - the importer's side of the release ledger, for both
 * kinds: which exporter each cached handle came from, and the helper thread.
 * What to close is each kind's (legacy_importer.c, vmm_importer.c): they
 * register it (ipcc_ledger_helper_register).
 *
 * At each cached miss the importer learns from the ledger who exported the
 * handle, asks that exporter's frees to ring its doorbell, and looks for
 * exporters that have exited. A helper thread, started with the first such
 * mapping (so that a free while the program still uses it is answered at
 * once, not after the wait bound), sleeps on the
 * doorbell: for each request it closes the idle mappings of that handle, in
 * every context, and answers. Mappings the program still uses are left alone
 * (without the cache the memory stays allocated then too); they are closed
 * for real at the program's last close of them ("doomed" below). Every second
 * the helper also closes the idle mappings of exporters that have exited,
 * and of handles their exporter no longer lists (an import that raced the
 * free: opened after the ask was answered); that look holds the table
 * lock over one ledger lookup per remembered handle (8,192 at most).
 *
 * The table lock is held only to take entries or update the lists here,
 * never across a driver call.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "ledger_impl.h"
#include "stats.h"

static int seen_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (seen_oom = 1)
#include <uthash.h>

#define BATCH 32
#define MAX_EXPORTERS 64
#define MAX_SEEN 8192        /* handles whose exporter we remember */
#define CHECK_EVERY_NS (1000ULL * 1000 * 1000)

/* A handle we mapped, and the exporter it came from. Under the table lock.
 * stamp changes each time a miss records the handle (again): a let-go
 * forgets only the record it found before its closes. */
struct seen {
    unsigned char handle[IPCC_HANDLE_BYTES];
    int exporter;
    uint64_t stamp;
    UT_hash_handle hh;
};

static uint64_t last_stamp;

static struct seen *seen;
static struct { struct ipcc_proc who; size_t handles; } exporters[MAX_EXPORTERS];
/* Our ledger slot, or: not registered yet; being registered by one thread
 * (the others record what they map meanwhile, and the registrar watches it
 * all once the slot is set); registration failed (no ledger, no slot, no
 * helper thread): then this process is as one without the ledger. */
enum { SLOT_NONE = -1, SLOT_REFUSED = -2, SLOT_REGISTERING = -3 };
static _Atomic int slot = SLOT_NONE;
/* Under the table lock: some miss while registering asked for every
 * exporter's frees (a handle the ledger does not know). */
static int want_any;
/* Set by our exit handler, which runs before cudart tears the driver down:
 * from then on the helper makes no driver call. */
static _Atomic int exiting;

/* Each kind's importer side (legacy_importer.c, vmm_importer.c), registered
 * at load by entry/wiring.c: what to close when an exporter lets go. */
#define MAX_KINDS 2
static void (*let_go_of_kind[MAX_KINDS])(const void *handle);

void ipcc_ledger_helper_register(void (*let_go)(const void *handle))
{
    for (int k = 0; k < MAX_KINDS; k++)
        if (!let_go_of_kind[k]) {
            let_go_of_kind[k] = let_go;
            return;
        }
}

/* Whether our exit began: from then on the helper makes no driver call,
 * and a kind closing for it stops between two closes. */
int ipcc_ledger_helper_exiting(void)
{
    return atomic_load(&exiting);
}

/* Lock held: pid's frees stop ringing us, unless we hold handles of
 * another exporter with that pid: a dead one's pid that came round again (a
 * container's pids soon do) is the live one's too, and watches go by pid. */
static void unwatch_unless_reused(int32_t pid)
{
    for (int i = 0; i < MAX_EXPORTERS; i++)
        if (exporters[i].who.pid == pid && exporters[i].handles > 0)
            return;
    if (atomic_load(&slot) >= 0)
        ipcc_ledger_unwatch(atomic_load(&slot), pid);
}

/* Lock held: forgets which exporter handle came from. With unwatch, the
 * handle is let go of: when it was the exporter's last, its frees stop
 * ringing us (else the 16 watched pids fill with exporters we hold nothing
 * of, and from then on every exporter's frees ring us). A record dropped
 * for room keeps the watch: its mapping may still be cached. */
static void forget_seen(struct seen *s, int unwatch)
{
    struct ipcc_proc *who = &exporters[s->exporter].who;
    if (--exporters[s->exporter].handles == 0) {
        int32_t pid = who->pid;
        who->pid = 0;
        if (unwatch)
            unwatch_unless_reused(pid);
    }
    HASH_DEL(seen, s);
    ipcc_mem_free(s);
}

/* Lock held: the stamp of handle's record, 0 when there is none. */
static uint64_t stamp_of(const unsigned char *handle)
{
    struct seen *s;
    HASH_FIND(hh, seen, handle, IPCC_HANDLE_BYTES, s);
    return s ? s->stamp : 0;
}

/* The exporter freed (or took with it) the allocation behind handle: each
 * kind closes its idle mappings of it (a VMM export's tag, a legacy handle),
 * then its record is forgotten, unless a thread of the program opened the
 * handle again while we closed (the driver still mapped it for us) and so
 * recorded it anew: that record must outlive this let-go, or nothing would
 * ever let go of the new mapping. */
static void let_go(const unsigned char *handle)
{
    if (atomic_load(&exiting))
        return;
    ipcc_lock();
    uint64_t before = stamp_of(handle);
    ipcc_unlock();
    for (int k = 0; k < MAX_KINDS && let_go_of_kind[k]; k++)
        let_go_of_kind[k](handle);
    struct seen *s;
    ipcc_lock();
    ipcc_ledger_remember_let_go(handle);
    HASH_FIND(hh, seen, handle, IPCC_HANDLE_BYTES, s);
    if (s && s->stamp == before)
        forget_seen(s, 1);
    ipcc_unlock();
}

/* ---- exporters that exited, handles unlisted --------------------------- */

/* Lock held: up to cap handles that pick(s, i) accepts, forgotten as they
 * are taken. */
static size_t take_handles(int (*pick)(const struct seen *s, int i), int i,
                           unsigned char (*out)[IPCC_HANDLE_BYTES], size_t cap)
{
    struct seen *s, *tmp;
    size_t n = 0;
    HASH_ITER(hh, seen, s, tmp) {
        if (n == cap)
            break;
        if (!pick(s, i))
            continue;
        memcpy(out[n++], s->handle, IPCC_HANDLE_BYTES);
        forget_seen(s, 1);
    }
    return n;
}

/* Lets go of every handle pick(s, i) accepts, a batch at a time: the
 * closes happen without the lock. */
static void let_go_of_picked(int (*pick)(const struct seen *s, int i), int i)
{
    unsigned char handles[BATCH][IPCC_HANDLE_BYTES];
    size_t n;
    do {
        ipcc_lock();
        n = take_handles(pick, i, handles, BATCH);
        ipcc_unlock();
        for (size_t k = 0; k < n; k++)
            let_go(handles[k]);
    } while (n == BATCH);
}

static int of_exporter(const struct seen *s, int i)
{
    return s->exporter == i;
}

/* Whether s's exporter no longer lists its handle: it freed it (or let it
 * go early) without asking us, because our import of it came after our
 * helper had answered its ask, before its free: the program's own race,
 * in which without the cache the importer's close gives the memory back. */
static int unlisted(const struct seen *s, int unused)
{
    (void)unused;
    struct ipcc_proc owner, who = exporters[s->exporter].who;
    return ipcc_ledger_owner(s->handle, &owner) != 1 || owner.pid != who.pid ||
           owner.start != who.start;
}

/* Closes the idle mappings of every exporter that has exited. With quick,
 * only a signal-0 probe (a miss's cost); else the start time as well. */
static void release_dead_exporters(int quick)
{
    struct ipcc_proc who[MAX_EXPORTERS];
    ipcc_lock();
    for (int i = 0; i < MAX_EXPORTERS; i++)
        who[i] = exporters[i].who;
    ipcc_unlock();
    for (int i = 0; i < MAX_EXPORTERS; i++) {
        if (who[i].pid == 0 || ipcc_proc_alive(who[i].pid, quick ? 0 : who[i].start))
            continue;
        let_go_of_picked(of_exporter, i);
        ipcc_lock();
        unwatch_unless_reused(who[i].pid);
        ipcc_unlock();
    }
}

/* ---- the helper thread ----------------------------------------------- */

static void answer_requests(int me)
{
    struct ipcc_ledger_ask ask;
    for (int r = 0; (r = ipcc_ledger_next_ask(me, r, &ask)) >= 0; r++) {
        let_go(ask.handle);
        ipcc_ledger_answer(me, &ask);
    }
}

/* The helper's closes must neither fail nor break a CUDA graph that one of
 * the program's threads is capturing in global mode (the default of
 * PyTorch's torch.cuda.graph): relaxed mode permits them on this thread. */
static void relax_capture_mode(void)
{
    int mode = 2; /* CU_STREAM_CAPTURE_MODE_RELAXED */
    if (ipcc_driver()->thread_capture_mode)
        ipcc_driver()->thread_capture_mode(&mode);
}

static void *helper_main(void *arg)
{
    int me = (int)(intptr_t)arg;
    relax_capture_mode();
    uint64_t last_check = ipcc_clock_ns();
    while (!atomic_load(&exiting)) {
        uint32_t rung = ipcc_ledger_doorbell(me);
        answer_requests(me);
        if (ipcc_clock_ns() - last_check >= CHECK_EVERY_NS) {
            release_dead_exporters(0);
            let_go_of_picked(unlisted, 0);
            last_check = ipcc_clock_ns();
        }
        ipcc_ledger_sleep(me, rung, CHECK_EVERY_NS);
    }
    return NULL;
}

/* The kernel's id of thread t, which exists once pthread_create returned
 * (scheduled yet or not), without waiting for it to run: its CPU-time
 * clock id encodes it, by the kernel's ABI (~tid << 3 | per-thread 4 |
 * sched 2) that glibc, musl and bionic compute it with. 0 if it does not. */
static int32_t tid_of(pthread_t t)
{
    clockid_t clock;
    if (pthread_getcpuclockid(t, &clock) != 0 || (clock & 7) != 6)
        return 0;
    long tid = ~((long)clock >> 3);
    return tid > 0 && tid <= INT32_MAX ? (int32_t)tid : 0;
}

/* Deaf to every signal: the program's handlers run on its own threads as
 * before. The caller's mask is restored at once. Joinable until named, so
 * that t stays valid. Exporters ask the slot from the naming on, and wait
 * for it as for any slow helper: the first miss never waits for the thread
 * to be scheduled. 0, or the error of pthread_create. */
static int start_helper(int me)
{
    sigset_t all, saved;
    pthread_t t;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = pthread_create(&t, NULL, helper_main, (void *)(intptr_t)me);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (rc != 0)
        return rc;
    int32_t tid = tid_of(t);
    pthread_detach(t);
    if (tid)
        ipcc_ledger_name_helper(me, tid);
    else /* never asked: as without the ledger, the caps bound what it keeps */
        ipcc_log(IPCC_LOG_INFO, "cannot tell the release helper thread's id; exporters' frees "
                                "do not wait for this process");
    return 0;
}

/* The slot first, so that no exporter asks us any more; then the helper
 * stops before its next driver call. */
static void unregister_at_exit(void)
{
    ipcc_ledger_unregister(atomic_load(&slot));
    atomic_store(&exiting, 1);
}

/* Fork child (entry/wiring.c's list): no helper runs here and the slot is
 * the parent's. */
void ipcc_ledger_helper_fork_child(void)
{
    struct seen *s, *tmp;
    HASH_ITER(hh, seen, s, tmp) {
        HASH_DEL(seen, s);
        ipcc_mem_free(s);
    }
    memset(exporters, 0, sizeof(exporters));
    want_any = 0;
    atomic_store(&slot, SLOT_NONE);
}

/* Lock held: slot me watches every exporter we hold handles of, and every
 * exporter if a miss asked for that before me was set. */
static void watch_recorded(int me)
{
    for (int i = 0; i < MAX_EXPORTERS; i++)
        if (exporters[i].who.pid != 0 && exporters[i].handles > 0)
            ipcc_ledger_watch(me, exporters[i].who.pid);
    if (want_any)
        ipcc_ledger_watch(me, 0);
}

/* Lock held: exporter pid's frees ring us (0: every exporter's); while our
 * slot is being registered, the registrar's watch_recorded does it. */
static void watch_locked(int32_t pid)
{
    int me = atomic_load(&slot);
    if (me >= 0)
        ipcc_ledger_watch(me, pid);
    else if (pid == 0)
        want_any = 1;
}

/* The first time only: a ledger slot, and the thread that answers on it.
 * Another thread's call meanwhile returns SLOT_REGISTERING at once. */
static int my_slot(void)
{
    int s = atomic_load(&slot);
    if (s != SLOT_NONE)
        return s;
    if (!atomic_compare_exchange_strong(&slot, &s, SLOT_REGISTERING))
        return s; /* another thread is at it, or was */
    s = ipcc_ledger_register();
    if (s == -2)
        ipcc_log(IPCC_LOG_INFO, "release ledger: all %d importer slots are held by live "
                                "processes; this one's idle mappings are bounded by the caps "
                                "only", IPCC_LEDGER_IMPORTERS);
    int rc = s < 0 ? -1 : start_helper(s);
    if (rc > 0) { /* nobody would answer: exporters must not wait for us */
        ipcc_ledger_unregister(s);
        ipcc_log(IPCC_LOG_INFO, "cannot start the release helper thread (%s); this process "
                                "does not use the release ledger: its idle mappings are "
                                "bounded by the caps only", strerror(rc));
    }
    if (rc != 0) {
        atomic_store(&slot, SLOT_REFUSED);
        return SLOT_REFUSED;
    }
    ipcc_lock();
    atomic_store(&slot, s);
    watch_recorded(s);
    ipcc_unlock();
    ipcc_atexit(unregister_at_exit);
    return s;
}

/* ---- at each miss ------------------------------------------------------ */

/* Lock held: the index of exporter who, added if new; -1 when full. */
static int exporter_index(struct ipcc_proc who)
{
    int free_at = -1;
    for (int i = 0; i < MAX_EXPORTERS; i++) {
        if (exporters[i].who.pid == who.pid && exporters[i].who.start == who.start)
            return i;
        if (exporters[i].who.pid == 0 && free_at < 0)
            free_at = i;
    }
    if (free_at >= 0) {
        exporters[free_at].who = who;
        exporters[free_at].handles = 0;
    }
    return free_at;
}

/* Remembers that handle came from owner, and asks owner's frees to ring
 * us (watch_locked): under the lock, so that a let-go of owner's last other
 * handle cannot unwatch it in between. The oldest record goes when full. 0 when
 * it could not be remembered. */
static int record(const void *handle, struct ipcc_proc owner)
{
    struct seen *s;
    ipcc_lock();
    HASH_FIND(hh, seen, handle, IPCC_HANDLE_BYTES, s);
    if (s)
        s->stamp = ++last_stamp;
    int i = s ? -1 : exporter_index(owner);
    if (i >= 0 && (s = ipcc_mem_calloc(1, sizeof(*s))) != NULL) {
        if (HASH_COUNT(seen) >= MAX_SEEN)
            forget_seen(seen, 0);
        memcpy(s->handle, handle, IPCC_HANDLE_BYTES);
        s->exporter = i;
        s->stamp = ++last_stamp;
        exporters[i].handles++;
        seen_oom = 0;
        HASH_ADD(hh, seen, handle, IPCC_HANDLE_BYTES, s);
        if (seen_oom) { /* not in the table: undo by hand */
            if (--exporters[i].handles == 0)
                exporters[i].who.pid = 0;
            ipcc_mem_free(s);
            s = NULL;
        }
    }
    if (s)
        watch_locked(owner.pid);
    ipcc_unlock();
    return s != NULL;
}

/* Lock held: which exporter handle came from, as the ledger said at our miss
 * of it; 0 when it did not say (an exporter without the library, or a record
 * forgotten). */
int ipcc_ledger_import_exporter(const void *handle, struct ipcc_proc *who)
{
    struct seen *s;
    HASH_FIND(hh, seen, handle, IPCC_HANDLE_BYTES, s);
    if (!s)
        return 0;
    *who = exporters[s->exporter].who;
    return 1;
}

/* Called after a miss whose real open was cached: from now on the exporter
 * of handle rings us when it frees it. Exporters that exited meanwhile lose
 * their idle mappings here. A handle its exporter let go of (opened between
 * its unlisting and its real free) is let go of at once: our mapping, in use,
 * is doomed, so the program's close frees it, as without the cache; so is one
 * we let go of before that the ledger no longer knows. A handle
 * the ledger does not know comes from an
 * exporter without the library (nothing will ask), unless some exporter
 * could not list its handles: then every exporter's frees ring us. */
void ipcc_ledger_note_import(const void *handle)
{
    if (ipcc_config.disabled || !ipcc_ledger_ready())
        return;
    struct ipcc_proc owner;
    int known = ipcc_ledger_owner(handle, &owner);
    if (!known) {
        ipcc_lock();
        if (ipcc_ledger_was_let_go(handle))
            known = IPCC_LEDGER_LET_GO; /* freed, its entry taken over since */
        ipcc_unlock();
    }
    if (known == IPCC_LEDGER_LET_GO) { /* its free is under way: no one will ask */
        let_go(handle);
        return;
    }
    if (!known && !ipcc_ledger_unpublished())
        return;
    if (my_slot() == SLOT_REFUSED)
        return;
    if (!known || !record(handle, owner)) { /* unknown or unremembered: every exporter's frees */
        ipcc_lock();
        watch_locked(0);
        ipcc_unlock();
    }
    release_dead_exporters(1);
}
