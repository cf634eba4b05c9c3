/*
 * ledger.c - the release ledger's file, the processes it names, the table of
 * exported allocations and the importers' slots. Requests live in
 * ledger_request.c; the layout in ledger_impl.h.
 *
 * One file per user, "release-ledger-v5" in the per-user directory (0700, so
 * another user can neither read nor write it), opened without following links
 * and refused unless it is a regular file of ours, mode 0600, of the expected
 * size. Without it (no directory, refused, out of memory) nothing breaks:
 * exporters free at once, as without the library, and importers' caps still
 * bound what idle mappings pin.
 *
 * No lock: every slot is claimed with a compare-and-swap on its pid word.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ledger_impl.h"

static struct ipcc_ledger_file *ledger;
static pthread_once_t open_once = PTHREAD_ONCE_INIT;

struct ipcc_ledger_file *ipcc_ledger_file(void)
{
    return ledger;
}

/* ---- futexes in the shared mapping ---------------------------------------- */

void ipcc_futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleeps while *word == seen, at most ns; spurious returns are fine. */
void ipcc_futex_wait(_Atomic uint32_t *word, uint32_t seen, uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL) };
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* ---- the file --------------------------------------------------------------- */

static int open_file(int dir)
{
    int flags = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    int fd = openat(dir, IPCC_LEDGER_NAME, flags | O_CREAT | O_EXCL, 0600);
    if (fd >= 0 && fchmod(fd, 0600) != 0) { /* ours, new: against a strict umask */
        close(fd);
        return -1;
    }
    if (fd < 0 && errno == EEXIST)
        fd = openat(dir, IPCC_LEDGER_NAME, flags);
    return fd;
}

/* A regular file of ours, 0600, of our size or still empty (its creator is
 * about to size it). */
static const char *check_file(int fd)
{
    struct stat st;
    if (ipcc_fstat(fd, &st) != 0)
        return "cannot stat it";
    if (!S_ISREG(st.st_mode))
        return "not a regular file";
    if (st.st_uid != geteuid())
        return "owned by another user";
    if ((st.st_mode & 07777) != 0600)
        return "mode is not 0600";
    if (st.st_size != 0 && (uint64_t)st.st_size != sizeof(struct ipcc_ledger_file))
        return "wrong size (another version?)";
    return NULL;
}

/* Sizes the file with its blocks allocated for real: a sparse file on a
 * full file system would fault (SIGBUS) at the first store to a page.
 * Every opener does it (a no-op once done), so a file sized by a process
 * that found room is never trusted blindly by one that maps it later. */
static int reserve_blocks(int fd)
{
    return posix_fallocate(fd, 0, (off_t)sizeof(struct ipcc_ledger_file));
}

/* The first process to map the file stamps it; any other stamp is refused. */
static const char *check_magic(struct ipcc_ledger_file *f)
{
    uint64_t zero = 0;
    if (atomic_compare_exchange_strong(&f->magic, &zero, IPCC_LEDGER_MAGIC))
        return NULL;
    return zero == IPCC_LEDGER_MAGIC ? NULL : "unknown format";
}

static void say_no_ledger(int level, const char *why)
{
    ipcc_log(level, "release ledger %s not used (%s): frees of exported memory will not wait "
                    "for importers", IPCC_LEDGER_NAME, why);
}

static void open_ledger(void)
{
    int dir = ipcc_userdir_open();
    if (dir < 0) {
        ipcc_log(IPCC_LOG_INFO, "no per-user directory: frees of exported memory will not "
                                "wait for importers");
        return;
    }
    int fd = open_file(dir);
    close(dir);
    const char *why = fd < 0 ? strerror(errno) : check_file(fd);
    int no_room = why ? 0 : reserve_blocks(fd);
    void *map = MAP_FAILED;
    if (!why && !no_room) {
        map = mmap(NULL, sizeof(struct ipcc_ledger_file), PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
        why = map == MAP_FAILED ? "cannot map it" : check_magic(map);
    }
    if (fd >= 0)
        close(fd);
    if (no_room) { /* a full disk is the operator's to fix, not a fault of ours */
        say_no_ledger(IPCC_LOG_INFO, strerror(no_room));
        return;
    }
    if (why) {
        if (map != MAP_FAILED)
            munmap(map, sizeof(struct ipcc_ledger_file));
        ipcc_log(IPCC_LOG_WARN, "release ledger %s refused (%s): frees of exported memory "
                                "will not wait for importers", IPCC_LEDGER_NAME, why);
        return;
    }
    ledger = map;
}

/* Opens the ledger at the first use; 1 when it can be used. */
int ipcc_ledger_ready(void)
{
    pthread_once(&open_once, open_ledger);
    return ledger != NULL;
}

/* ---- exported allocations ------------------------------------------------- */

uint32_t ipcc_ledger_handle_hash(const unsigned char *h)
{
    uint32_t x = 2166136261u;
    for (int i = 0; i < IPCC_HANDLE_BYTES; i++)
        x = (x ^ h[i]) * 16777619u;
    return x;
}

/* The i-th entry of the probe sequence that starts at hash. */
static struct ipcc_ledger_export *export_at(uint32_t hash, int i)
{
    return &ledger->exports[(hash + (uint32_t)i) % IPCC_LEDGER_EXPORTS];
}

/* Takes a let-go entry: the compare-and-swap on ready makes one claimer
 * its taker (the owner's pid may be ours, so the pid word cannot); one that
 * took it by its dead owner's pid meanwhile keeps it. */
static int claim_let_go(struct ipcc_ledger_export *e, int32_t owner, int32_t me)
{
    uint32_t let_go = IPCC_EXPORT_LET_GO;
    if (!atomic_compare_exchange_strong(&e->ready, &let_go, IPCC_EXPORT_WRITING))
        return 0;
    return atomic_compare_exchange_strong(&e->pid, &owner, me);
}

/* Takes a free entry, a let-go one, or one whose owner died (without a
 * /proc read: a recycled pid only costs an entry until that process ends
 * too). Pass 0 takes only free entries, pass 1 let-go ones as well: a handle
 * let go of, or whose exporter died, stays known as such (its memory lives
 * while someone maps it, and an import of it must not be kept) as long as
 * the table has room, and after that while the ring of ended listings
 * holds it (ledger_ended.c). */
static int claim_export(struct ipcc_ledger_export *e, int32_t me, int pass)
{
    int32_t owner = atomic_load(&e->pid);
    if (owner != 0 && pass == 0)
        return 0;
    if (owner != 0 && pass == 1 && atomic_load(&e->ready) != IPCC_EXPORT_LET_GO)
        return 0;
    if (owner != 0 && atomic_load(&e->ready) == IPCC_EXPORT_LET_GO) {
        ipcc_ledger_listing_ends(ledger, e);
        return claim_let_go(e, owner, me);
    }
    if (owner != 0 && (owner == me || ipcc_proc_alive(owner, 0)))
        return 0;
    if (owner != 0)
        ipcc_ledger_listing_ends(ledger, e);
    if (!atomic_compare_exchange_strong(&e->pid, &owner, me))
        return 0;
    atomic_store(&e->ready, IPCC_EXPORT_WRITING); /* a dead owner's entry may still say ready */
    return 1;
}

/* Whether e lists handle under our pid, made ours if an earlier process
 * with this pid (pids come round again) listed the same bytes and died
 * without unlisting: importers would take them for the dead one's. */
static int listed_by_me(struct ipcc_ledger_export *e, const void *handle, struct ipcc_proc me)
{
    uint32_t listed = IPCC_EXPORT_LISTED;
    if (atomic_load(&e->pid) != me.pid || atomic_load(&e->ready) != IPCC_EXPORT_LISTED ||
        memcmp(e->handle, handle, IPCC_HANDLE_BYTES) != 0)
        return 0;
    if (atomic_load(&e->start) == me.start)
        return 1;
    if (!atomic_compare_exchange_strong(&e->ready, &listed, IPCC_EXPORT_WRITING))
        return 0;
    atomic_store(&e->start, me.start);
    atomic_store_explicit(&e->ready, IPCC_EXPORT_LISTED, memory_order_release);
    return 1;
}

/* Lists handle as exported by this process; 0, or -1 when the ledger is
 * missing or the handle's probe sequence is full. */
static int list_export(const void *handle)
{
    if (!ipcc_ledger_ready())
        return -1;
    struct ipcc_proc me = ipcc_proc_self();
    uint32_t hash = ipcc_ledger_handle_hash(handle);
    struct ipcc_ledger_export *e;
    for (int i = 0; i < IPCC_LEDGER_PROBES; i++)
        if (listed_by_me(export_at(hash, i), handle, me))
            return 0;
    for (int k = 0; k < 3 * IPCC_LEDGER_PROBES; k++) {
        e = export_at(hash, k % IPCC_LEDGER_PROBES);
        if (!claim_export(e, me.pid, k / IPCC_LEDGER_PROBES))
            continue;
        atomic_store(&e->start, me.start);
        memcpy(e->handle, handle, IPCC_HANDLE_BYTES);
        atomic_store_explicit(&e->ready, IPCC_EXPORT_LISTED, memory_order_release);
        return 0;
    }
    return -1;
}

/* Records that this process exported handle; 0, or -1 (as list_export). */
int ipcc_ledger_publish(const void *handle)
{
    if (list_export(handle) == 0)
        return 0;
    if (ledger)
        atomic_store(&ledger->unpublished, 1);
    return -1;
}

/* The same for a VMM export's tag, which an importer finds only by a scan:
 * one the table has no room for is simply not covered, and importers of
 * legacy handles need not listen to every exporter for it. */
int ipcc_ledger_publish_tag(const void *tag)
{
    return list_export(tag);
}

/* Whether some exporter's handle is missing from the table: then an importer
 * cannot tell who exported what it maps, and must listen to every exporter. */
int ipcc_ledger_unpublished(void)
{
    return ledger && atomic_load(&ledger->unpublished);
}

/* Unlists handle, leaving "let go" in its entry until a new export takes
 * it: an importer that opens the handle before the real free learns that
 * its exporter is freeing it, not that it has none with the library. */
void ipcc_ledger_unpublish(const void *handle)
{
    if (!ledger)
        return;
    int32_t me = ipcc_proc_self().pid;
    uint32_t hash = ipcc_ledger_handle_hash(handle);
    for (int i = 0; i < IPCC_LEDGER_PROBES; i++) {
        struct ipcc_ledger_export *e = export_at(hash, i);
        uint32_t listed = IPCC_EXPORT_LISTED;
        if (atomic_load(&e->pid) == me && memcmp(e->handle, handle, IPCC_HANDLE_BYTES) == 0)
            atomic_compare_exchange_strong(&e->ready, &listed, IPCC_EXPORT_LET_GO);
    }
}

/* Entry e's state if it holds handle (its owner copied to *owner), else
 * IPCC_EXPORT_WRITING. */
static uint32_t entry_of(struct ipcc_ledger_export *e, const void *handle,
                         struct ipcc_proc *owner)
{
    int32_t pid = atomic_load(&e->pid);
    uint32_t state = atomic_load_explicit(&e->ready, memory_order_acquire);
    if (!pid || state == IPCC_EXPORT_WRITING)
        return IPCC_EXPORT_WRITING;
    owner->pid = pid;
    owner->zero_pad = 0;
    owner->start = atomic_load(&e->start);
    int same = memcmp(e->handle, handle, IPCC_HANDLE_BYTES) == 0;
    /* Re-read: the entry may have changed hands while we compared. */
    if (same && atomic_load(&e->ready) == state && atomic_load(&e->pid) == pid)
        return state;
    return IPCC_EXPORT_WRITING;
}

/* Who exported handle (ledger.h): a listing wins over a let-go entry of an
 * earlier export of the same handle. */
int ipcc_ledger_owner(const void *handle, struct ipcc_proc *owner)
{
    if (!ipcc_ledger_ready())
        return 0;
    uint32_t hash = ipcc_ledger_handle_hash(handle);
    struct ipcc_proc who;
    int found = 0;
    for (int i = 0; i < IPCC_LEDGER_PROBES; i++) {
        uint32_t state = entry_of(export_at(hash, i), handle, &who);
        if (state == IPCC_EXPORT_LISTED) {
            *owner = who;
            return 1;
        }
        if (state == IPCC_EXPORT_LET_GO && !found) {
            *owner = who;
            found = IPCC_LEDGER_LET_GO;
        }
    }
    if (!found && ipcc_ledger_listing_ended(ledger, handle)) {
        *owner = (struct ipcc_proc){ 0 }; /* its entry went to another export */
        found = IPCC_LEDGER_LET_GO;
    }
    return found;
}

/* Entry e, listed by dead_pid when a scan found it gone, says "let go". A
 * claim of the entry in the instant between the pid's check and the mark
 * is undone at once; a let-go taker in that instant leaves the new listing
 * unlisted, and its importers let go of it within a second (ledger_helper.c). */
static void let_go_of_dead(struct ipcc_ledger_export *e, int32_t dead_pid)
{
    uint32_t state = IPCC_EXPORT_LISTED;
    if (atomic_load(&e->pid) != dead_pid ||
        !atomic_compare_exchange_strong(&e->ready, &state, IPCC_EXPORT_LET_GO))
        return;
    state = IPCC_EXPORT_LET_GO;
    if (atomic_load(&e->pid) != dead_pid)
        atomic_compare_exchange_strong(&e->ready, &state, IPCC_EXPORT_LISTED);
}

/* Walks every listed export (the VMM path, whose importer knows no handle,
 * only an fd to compare): the first one match() accepts is copied out.
 * Entries of exporters killed before they could unlist would otherwise cost
 * every later scan a system call each, until an export hashed there: match
 * finds them gone and they become "let go", as if unlisted: free to any new
 * export, skipped by later scans, and an import of the handle until then (the
 * memory lives on while someone maps it) learns its exporter let go of it,
 * not that it has none with the library. Only if the entry is still the dead
 * owner's listing: whoever claimed it meanwhile keeps it. */
int ipcc_ledger_find_export(int (*match)(const struct ipcc_proc *owner, const void *handle,
                                         void *arg),
                            void *arg, void *handle, struct ipcc_proc *owner)
{
    if (!ipcc_ledger_ready())
        return 0;
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++) {
        struct ipcc_ledger_export *e = &ledger->exports[i];
        int32_t pid = atomic_load(&e->pid);
        if (!pid || atomic_load_explicit(&e->ready, memory_order_acquire) != IPCC_EXPORT_LISTED)
            continue;
        *owner = (struct ipcc_proc){ .pid = pid, .start = atomic_load(&e->start) };
        memcpy(handle, e->handle, IPCC_HANDLE_BYTES);
        /* The copy counts only if the entry did not change hands meanwhile. */
        if (atomic_load(&e->ready) != IPCC_EXPORT_LISTED || atomic_load(&e->pid) != pid)
            continue;
        int verdict = match(owner, handle, arg);
        if (verdict > 0)
            return 1;
        if (verdict < 0)
            let_go_of_dead(e, pid);
    }
    return 0;
}

/* ---- importers ------------------------------------------------------------ */

/* Whether the slot's helper thread exists and still runs (whether or not
 * it was scheduled yet). Only a
 * live owner's slot is asked (its pid written last, after the helper word
 * was cleared), so a tid read here is its own. */
int ipcc_ledger_helper_runs(struct ipcc_ledger_importer *s, int32_t pid)
{
    int32_t tid = atomic_load_explicit(&s->helper, memory_order_acquire);
    return tid != 0 && (syscall(SYS_tgkill, pid, tid, 0) == 0 || errno != ESRCH);
}

/* The helper was named and is gone: its process exec()ed. A tid of 0 is a
 * helper not named yet (its creator gives the slot back if it cannot
 * start it). */
static int helper_gone(struct ipcc_ledger_importer *s, int32_t pid)
{
    return atomic_load(&s->helper) != 0 && !ipcc_ledger_helper_runs(s, pid);
}

/* Free, or its owner died, or exec()ed (same pid and start time, but its
 * helper thread died with the old image). Our own pid's slot is taken over
 * by someone else, never by us: reclaiming it would write the same pid
 * back, and a compare-and-swap could not tell our claim from theirs.
 *
 * The claim is one compare-and-swap that writes -me: "being claimed by me".
 * Only a positive pid has its start time and helper beside it (written
 * before it), so a claimer never judges a pid by the start time of the
 * owner before it; a claim under way is judged by its pid alone. */
static int claim_importer(struct ipcc_ledger_importer *s, int32_t me)
{
    int32_t owner = atomic_load(&s->pid);
    if (owner == me || owner == -me)
        return 0;
    if (owner < 0 && ipcc_proc_alive(-owner, 0))
        return 0;
    if (owner > 0 && ipcc_proc_alive(owner, atomic_load(&s->start)) &&
        !helper_gone(s, owner))
        return 0;
    return atomic_compare_exchange_strong(&s->pid, &owner, -me);
}

/* Takes an importer slot for this process: its index, -1 without a ledger,
 * -2 when 64 live importers hold every slot. Readers see our pid only once
 * the slot is reset and names our start time. */
int ipcc_ledger_register(void)
{
    if (!ipcc_ledger_ready())
        return -1;
    struct ipcc_proc me = ipcc_proc_self();
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++) {
        struct ipcc_ledger_importer *s = &ledger->importers[i];
        if (!claim_importer(s, me.pid))
            continue;
        atomic_store(&s->helper, 0);
        atomic_store(&s->any, 0);
        for (int w = 0; w < IPCC_LEDGER_WATCH; w++)
            atomic_store(&s->watch[w], 0);
        for (int r = 0; r < IPCC_LEDGER_REQUESTS; r++)
            atomic_store(&s->acked[r], 0);
        atomic_store(&s->start, me.start);
        int32_t claiming = -me.pid; /* fails only if another claimer judged us gone */
        if (atomic_compare_exchange_strong(&s->pid, &claiming, me.pid))
            return i;
    }
    return -2;
}

/* Names the slot's helper thread (by its creator, before it may have run:
 * the thread exists from then on); from now on the slot is asked while
 * that thread lives. */
void ipcc_ledger_name_helper(int slot, int32_t tid)
{
    atomic_store_explicit(&ledger->importers[slot].helper, tid, memory_order_release);
}

/* Gives the slot back, if it is still ours. Never blocks (exit path). The
 * helper word is cleared first: a newcomer's slot must not look like one
 * whose helper died. */
void ipcc_ledger_unregister(int slot)
{
    if (!ledger || slot < 0)
        return;
    struct ipcc_ledger_importer *s = &ledger->importers[slot];
    int32_t me = ipcc_proc_self().pid;
    if (atomic_load(&s->pid) != me)
        return;
    atomic_store(&s->helper, 0);
    atomic_compare_exchange_strong(&s->pid, &me, 0);
}

/* Asks exporter_pid's frees to wake this slot; 0 (or a full list) means
 * "every exporter's". */
void ipcc_ledger_watch(int slot, int32_t exporter_pid)
{
    struct ipcc_ledger_importer *s = &ledger->importers[slot];
    for (int w = 0; exporter_pid && w < IPCC_LEDGER_WATCH; w++)
        if (atomic_load(&s->watch[w]) == exporter_pid)
            return;
    for (int w = 0; exporter_pid && w < IPCC_LEDGER_WATCH; w++) {
        int32_t empty = 0;
        if (atomic_compare_exchange_strong(&s->watch[w], &empty, exporter_pid))
            return;
    }
    atomic_store(&s->any, 1);
}

void ipcc_ledger_unwatch(int slot, int32_t exporter_pid)
{
    struct ipcc_ledger_importer *s = &ledger->importers[slot];
    for (int w = 0; w < IPCC_LEDGER_WATCH; w++) {
        int32_t pid = exporter_pid;
        atomic_compare_exchange_strong(&s->watch[w], &pid, 0);
    }
}

uint32_t ipcc_ledger_doorbell(int slot)
{
    return atomic_load_explicit(&ledger->importers[slot].doorbell, memory_order_acquire);
}

/* The helper's sleep: until an exporter rings, or ns pass. */
void ipcc_ledger_sleep(int slot, uint32_t seen, uint64_t ns)
{
    ipcc_futex_wait(&ledger->importers[slot].doorbell, seen, ns);
}
