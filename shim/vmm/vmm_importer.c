/*
 * vmm_importer.c - the importer's side of the release ledger on the VMM path.
 *
 * At an import miss of a POSIX fd, find which listed export it is: the fd
 * names the same open file description as the exporter's fd of that export,
 * which kcmp(exporter, us, KCMP_FILE, its fd, our fd) tells - one system
 * call (under a microsecond) per export other processes have listed, tried
 * until one matches, and only at misses. A rebuild imports a segment's
 * chunks in the order they were exported, usually to consecutive fd
 * numbers, so the export after the last one matched is tried first: one
 * kcmp per miss then, after a scan of the ledger's memory. The import is
 * then tagged with that export and its
 * exporter watched through ledger_helper.c, exactly as a legacy handle is:
 * the helper thread, asked by the exporter's release (or finding the
 * exporter gone), calls ipcc_vmm_let_go with the tag.
 *
 * Letting go takes the export's idle imports, reservations and kept
 * mappings out of the table under the lock and really releases them after
 * dropping it. Imports the app still holds or maps stay, as the memory
 * would without the cache; the tag is then "doomed": each later release,
 * unmap or address free the table answers itself looks again, so the app's
 * own last release really gives the memory back.
 *
 * Without a match (an exporter without the library, its fd closed, kcmp
 * across processes refused) nothing changes: the caps bound what is kept.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/kcmp.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vmm_impl.h"
#include "budget.h"
#include "ledger.h"

/* Tags released by their exporter while the app still used an import of
 * them. */
static struct ipcc_keyset doomed;
static _Atomic uint64_t ghost;

/* The export this thread's next import most likely is: the next fd number
 * of the exporter whose export it imported last. */
static __thread struct { int32_t pid; int fd; } next_guess;

uint64_t ipcc_vmm_ghost_bytes(void)
{
    return atomic_load_explicit(&ghost, memory_order_relaxed);
}

/* Fork child (entry/wiring.c's list): the parent's imports are gone from
 * the table already. */
void ipcc_vmm_importer_fork_child(void)
{
    next_guess.pid = 0;
    ipcc_keyset_reset(&doomed);
    atomic_store(&ghost, 0);
}

/* ---- at an import miss ------------------------------------------------------ */

struct candidate {
    int fd;       /* ours */
    int guessed;  /* only the guess is compared */
};

/* A listed VMM export of another process whose fd is our fd's file: 1;
 * -1 when its exporter no longer exists (the ledger then frees the entry). */
static int same_file(const struct ipcc_proc *owner, const void *tag, void *arg)
{
    const struct candidate *c = arg;
    int theirs = ipcc_vmm_tag_fd(tag);
    pid_t me = ipcc_vmm_self_pid();
    if (theirs < 0 || owner->pid == me ||
        (c->guessed && (owner->pid != next_guess.pid || theirs != next_guess.fd)))
        return 0;
    int saved_errno = errno; /* the app's */
    long r = syscall(SYS_kcmp, (pid_t)owner->pid, me, KCMP_FILE, theirs, c->fd);
    int gone = r < 0 && errno == ESRCH;
    errno = saved_errno;
    return r == 0 ? 1 : gone ? -1 : 0;
}

static int find_export(int fd, unsigned char *tag, struct ipcc_proc *owner)
{
    struct candidate c = { fd, 1 };
    if (!next_guess.pid || !ipcc_ledger_find_export(same_file, &c, tag, owner)) {
        c.guessed = 0;
        if (!ipcc_ledger_find_export(same_file, &c, tag, owner))
            return 0;
    }
    next_guess.pid = owner->pid;
    next_guess.fd = ipcc_vmm_tag_fd(tag) + 1;
    return 1;
}

/* After a real import of fd (our kept dup) that the table recorded as
 * handle: tags it with its export when some exporter listed it. */
void ipcc_vmm_note_import(struct ipcc_vmm_table *t, uint64_t handle, int fd)
{
    unsigned char tag[IPCC_HANDLE_BYTES];
    struct ipcc_proc owner;
    if (ipcc_config.disabled || !ipcc_config.vmm || !find_export(fd, tag, &owner))
        return;
    ipcc_lock();
    int tagged = ipcc_vmm_import_tag(t, handle, tag);
    ipcc_unlock();
    if (tagged)
        ipcc_ledger_note_import(tag); /* watch the exporter; start the helper */
}

/* ---- letting go --------------------------------------------------------------- */

/* Really releases what the table holds idle of tag; the bytes still in use
 * (*live set when an import is). */
static uint64_t release_idle_of(struct ipcc_vmm_table *t, const void *tag, size_t *live)
{
    struct ipcc_vmm_ops ops = { 0 };
    uint64_t live_bytes = 0;
    *live = 0;
    ipcc_lock();
    size_t n = ipcc_vmm_take_idle_by_tag(t, tag, &ops, live, &live_bytes);
    if (*live && ipcc_keyset_add(&doomed, tag) < 0)
        ipcc_log(IPCC_LOG_DEBUG, "too many released VMM exports still in use; one stays kept");
    ipcc_vmm_close_taken(&ops);
    ipcc_unlock();
    ipcc_vmm_close_run(&ops, 0);
    IPCC_ADD(releases_on_request, n);
    return live_bytes;
}

/* The exporter released (or took with it) the export behind tag. Called by
 * ledger_helper.c for every tag; legacy handles are not ours. */
void ipcc_vmm_let_go(const void *tag)
{
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    size_t live;
    if (!t || ipcc_vmm_tag_fd(tag) < 0)
        return;
    uint64_t bytes = release_idle_of(t, tag, &live);
    if (live)
        atomic_fetch_add(&ghost, bytes);
}

static uint64_t let_go_of_tag(const unsigned char *tag, int *in_use, void *table)
{
    size_t live;
    uint64_t bytes = release_idle_of(table, tag, &live);
    *in_use = live != 0;
    return bytes;
}

/* After the table answered a release, unmap or address free itself: one
 * load, unless an export was released while in use here; then what of it
 * went idle is released for real. */
void ipcc_vmm_after_release(void)
{
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    if (ipcc_keyset_count(&doomed) == 0 || !t)
        return;
    atomic_store(&ghost, ipcc_keyset_sweep(&doomed, let_go_of_tag, t));
}
