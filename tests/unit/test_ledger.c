/*
 * test_ledger.c - the release ledger alone: its file, process identities,
 * exported handles, importer slots, and requests with their answers. No
 * CUDA; importers are fork children of the test process, which share the
 * ledger's mapping exactly as separate processes would.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ledger.h"
#include "ledger_impl.h"

#define FOREVER_NS (60ULL * 1000 * 1000 * 1000)

static char dir[64];
static char ledger_path[128];

static void setup(void)
{
    const char *t = getenv("TMPDIR"); /* the run's own folder (tests/run.sh) */
    if ((size_t)snprintf(dir, sizeof(dir), "%s/ipcc-ledger-XXXXXX", t && *t ? t : "/tmp") >= sizeof(dir))
        strcpy(dir, "/tmp/ipcc-ledger-XXXXXX"); /* a long TMPDIR: the paths below must fit */
    cr_assert_not_null(mkdtemp(dir));
    setenv("XDG_RUNTIME_DIR", dir, 1);
    snprintf(ledger_path, sizeof(ledger_path), "%s/ipccache/" IPCC_LEDGER_NAME, dir);
}

static void teardown(void)
{
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* Refusals warn on stderr: captured, and checked. */
static void setup_quiet(void)
{
    setup();
    cr_redirect_stderr();
}

TestSuite(ledger, .init = setup, .fini = teardown, .timeout = 10);

static void handle_of(unsigned char h[IPCC_HANDLE_BYTES], unsigned char tag)
{
    memset(h, 0, IPCC_HANDLE_BYTES);
    h[0] = tag;
    h[63] = (unsigned char)~tag; /* the last byte counts too */
}

/* Creates the per-user directory and a file in place of the ledger. */
static void plant(void (*make)(const char *path))
{
    char sub[96];
    snprintf(sub, sizeof(sub), "%s/ipccache", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    make(ledger_path);
}

static void expect_refused(const char *why)
{
    cr_assert_eq(ipcc_ledger_ready(), 0);
    cr_assert_eq(ipcc_ledger_release("x", 0), -1);
    char buf[512] = { 0 };
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    cr_assert_not_null(strstr(buf, why), "stderr: %s", buf);
    cr_assert_not_null(strstr(buf, "ipccache: warning: release ledger"), "stderr: %s", buf);
}

/* ---- the file ------------------------------------------------------------- */

Test(ledger, file_is_ours_0600_and_sized)
{
    /* The first use creates the ledger 0600 and of the layout's size, whatever the umask. */
    char sub[96];
    snprintf(sub, sizeof(sub), "%s/ipccache", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    umask(0277); /* would leave the creator read-only */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct stat st;
    cr_assert_eq(lstat(ledger_path, &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    cr_assert_eq(st.st_mode & 07777, 0600);
    cr_assert_eq((size_t)st.st_size, sizeof(struct ipcc_ledger_file));
    cr_assert_eq(atomic_load(&ipcc_ledger_file()->magic), IPCC_LEDGER_MAGIC);
}

static void make_symlink(const char *path) { cr_assert_eq(symlink("/etc/passwd", path), 0); }
static void make_fifo(const char *path) { cr_assert_eq(mkfifo(path, 0600), 0); }

static void make_mode_0644(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fchmod(fd, 0644), 0);
    close(fd);
}

static void make_wrong_size(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 4096), 0);
    close(fd);
}

static void make_foreign_magic(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    uint64_t other = 0x1234;
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, sizeof(struct ipcc_ledger_file)), 0);
    cr_assert_eq(pwrite(fd, &other, sizeof(other), 0), (ssize_t)sizeof(other));
    close(fd);
}

Test(ledger, symlink_is_refused, .init = setup_quiet)
{
    /* A link planted in place of the ledger is never followed. */
    plant(make_symlink);
    expect_refused("refused");
}

Test(ledger, fifo_is_refused_without_blocking, .init = setup_quiet, .timeout = 10)
{
    /* A FIFO in place of the ledger neither blocks the open nor is used. */
    plant(make_fifo);
    expect_refused("not a regular file");
}

Test(ledger, loose_mode_is_refused, .init = setup_quiet)
{
    /* A ledger others could read is refused. */
    plant(make_mode_0644);
    expect_refused("mode is not 0600");
}

Test(ledger, wrong_size_is_refused, .init = setup_quiet)
{
    /* A ledger of another layout's size is refused. */
    plant(make_wrong_size);
    expect_refused("wrong size");
}

Test(ledger, foreign_format_is_refused, .init = setup_quiet)
{
    /* A ledger stamped by another format is refused. */
    plant(make_foreign_magic);
    expect_refused("unknown format");
}

/* ---- processes -------------------------------------------------------------- */

static pid_t reaped_child(void)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

Test(ledger, process_identity_needs_pid_and_start_time)
{
    /* A process is alive only with its own start time; an exited one is not. */
    struct ipcc_proc me = ipcc_proc_self();
    cr_assert_eq(me.pid, getpid());
    cr_assert_neq(me.start, 0);
    cr_assert(ipcc_proc_alive(me.pid, me.start));
    cr_assert(ipcc_proc_alive(me.pid, 0));
    cr_assert_not(ipcc_proc_alive(me.pid, me.start + 1));
    cr_assert_not(ipcc_proc_alive(reaped_child(), 0));
    cr_assert_eq(ipcc_proc_start(reaped_child()), 0);
}

Test(ledger, fork_child_is_another_process)
{
    /* The identity is recomputed in a fork child, which has its own pid. */
    struct ipcc_proc parent = ipcc_proc_self();
    pid_t pid = fork();
    if (pid == 0)
        _exit(ipcc_proc_self().pid == getpid() && ipcc_proc_self().pid != parent.pid ? 0 : 1);
    int status;
    waitpid(pid, &status, 0);
    cr_assert_eq(status, 0);
}

/* ---- exported handles ------------------------------------------------------- */

Test(ledger, exported_handle_names_its_exporter)
{
    /* A published handle names this process; an unknown one nobody; an unpublished one says its exporter let go of it, until it is published again. */
    unsigned char a[IPCC_HANDLE_BYTES], b[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    handle_of(a, 1);
    handle_of(b, 2);
    cr_assert_eq(ipcc_ledger_publish(a), 0);
    cr_assert_eq(ipcc_ledger_publish(a), 0);
    cr_assert_eq(ipcc_ledger_owner(a, &who), 1);
    cr_assert_eq(who.pid, getpid());
    cr_assert_eq(who.start, ipcc_proc_self().start);
    cr_assert_eq(ipcc_ledger_owner(b, &who), 0);
    cr_assert_eq(ipcc_ledger_unpublished(), 0);
    ipcc_ledger_unpublish(a);
    cr_assert_eq(ipcc_ledger_owner(a, &who), IPCC_LEDGER_LET_GO);
    cr_assert_eq(who.pid, getpid());
    cr_assert_eq(ipcc_ledger_publish(a), 0);
    cr_assert_eq(ipcc_ledger_owner(a, &who), 1);
}

Test(ledger, listing_left_under_our_pid_by_an_earlier_process_names_us)
{
    /* An earlier process with this pid (pids come round again) listed the same handle bytes and died without unlisting: our export of them names this process, start time included (the old code took that listing for ours, so importers took the handle for the dead one's, let go of it within a second and, with it, stopped listening to our frees). */
    unsigned char a[IPCC_HANDLE_BYTES];
    struct ipcc_proc who, me = ipcc_proc_self();
    cr_assert_neq(me.start, 0, "no /proc: start times unknown");
    handle_of(a, 5);
    cr_assert_eq(ipcc_ledger_publish(a), 0);
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++)
        if (memcmp(f->exports[i].handle, a, IPCC_HANDLE_BYTES) == 0)
            atomic_store(&f->exports[i].start, me.start - 1);
    cr_assert_eq(ipcc_ledger_publish(a), 0);
    cr_assert_eq(ipcc_ledger_owner(a, &who), 1);
    cr_assert_eq(who.pid, me.pid);
    cr_assert_eq(who.start, me.start);
}

Test(ledger, let_go_entries_are_taken_by_new_exports)
{
    /* Entries whose live exporter let go of their handle are free for any new export. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++) {
        atomic_store(&f->exports[i].pid, getppid());
        atomic_store(&f->exports[i].ready, IPCC_EXPORT_LET_GO);
    }
    unsigned char h[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    handle_of(h, 4);
    cr_assert_eq(ipcc_ledger_publish(h), 0);
    cr_assert_eq(ipcc_ledger_owner(h, &who), 1);
    cr_assert_eq(who.pid, getpid());
}

Test(ledger, let_go_handle_stays_known_while_a_free_entry_is_near)
{
    /* The soak's pinned memory: a new export took the entry of a handle just let go of, while a free one was next to it; an import of the let-go handle then (its memory lives while someone maps it) was unknown, and kept as one of an exporter without the library. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    unsigned char a[IPCC_HANDLE_BYTES], b[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    handle_of(a, 7);
    uint32_t at = ipcc_ledger_handle_hash(a) % IPCC_LEDGER_EXPORTS;
    uint32_t n = 0;
    do { /* a handle whose probe sequence starts at a's entry */
        handle_of(b, 8);
        memcpy(b + 1, &n, sizeof(n));
        n++;
    } while (ipcc_ledger_handle_hash(b) % IPCC_LEDGER_EXPORTS != at);
    cr_assert_eq(ipcc_ledger_publish(a), 0);
    ipcc_ledger_unpublish(a);
    cr_assert_eq(ipcc_ledger_publish(b), 0);
    cr_assert_eq(ipcc_ledger_owner(b, &who), 1);
    cr_assert_eq(ipcc_ledger_owner(a, &who), IPCC_LEDGER_LET_GO, "the let-go entry was taken");
}

/* A handle b whose probe sequence starts where a's does. */
static void same_start_as(unsigned char b[IPCC_HANDLE_BYTES], const unsigned char *a, unsigned char tag)
{
    uint32_t at = ipcc_ledger_handle_hash(a) % IPCC_LEDGER_EXPORTS, n = 0;
    do {
        handle_of(b, tag);
        memcpy(b + 1, &n, sizeof(n));
        n++;
    } while (ipcc_ledger_handle_hash(b) % IPCC_LEDGER_EXPORTS != at);
}

/* Every entry but handle's own held by a live exporter's listing: the next
 * export whose probes start at handle's entry can take only that one. */
static void hold_all_entries_but(const unsigned char *handle)
{
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++) {
        struct ipcc_ledger_export *e = &f->exports[i];
        if (atomic_load(&e->pid) != 0 && memcmp(e->handle, handle, IPCC_HANDLE_BYTES) == 0)
            continue;
        atomic_store(&e->pid, getppid());
        atomic_store(&e->ready, IPCC_EXPORT_LISTED);
    }
}

/* Lists a (tag atag), ends its listing (unlisted, or its exporter dead), and
 * has a new export b (tag btag) take its entry, the only one b may take. */
static void list_then_take_over(unsigned char a[IPCC_HANDLE_BYTES], unsigned char atag,
                                unsigned char btag, int exporter_dies)
{
    unsigned char b[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    cr_assert_eq(ipcc_ledger_ready(), 1);
    handle_of(a, atag);
    same_start_as(b, a, btag);
    cr_assert_eq(ipcc_ledger_publish(a), 0);
    hold_all_entries_but(a);
    if (exporter_dies) {
        struct ipcc_ledger_file *f = ipcc_ledger_file();
        pid_t dead = reaped_child();
        for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++)
            if (memcmp(f->exports[i].handle, a, IPCC_HANDLE_BYTES) == 0)
                atomic_store(&f->exports[i].pid, dead);
        cr_assert_eq(ipcc_ledger_owner(a, &who), 1);
        cr_assert_eq(who.pid, dead);
    } else {
        ipcc_ledger_unpublish(a);
    }
    cr_assert_eq(ipcc_ledger_publish(b), 0);
    cr_assert_eq(ipcc_ledger_owner(b, &who), 1);
}

Test(ledger, let_go_handle_stays_known_after_its_entry_is_taken)
{
    /* The soak's pinned memory, at length: a full table's new exports take let-go entries, and an import of a handle whose entry went so (another importer still maps its memory) was unknown, kept as one of an exporter without the library. The listing's end is remembered past its entry. */
    unsigned char a[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    list_then_take_over(a, 9, 10, 0);
    cr_assert_eq(ipcc_ledger_owner(a, &who), IPCC_LEDGER_LET_GO, "the taken entry's handle is unknown");
}

Test(ledger, dead_exporters_handle_stays_known_after_its_entry_is_taken)
{
    /* The same for an exporter killed before it could unlist: the export that takes its entry ends the listing, and the handle is known as let go. */
    unsigned char a[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    list_then_take_over(a, 11, 12, 1);
    cr_assert_eq(ipcc_ledger_owner(a, &who), IPCC_LEDGER_LET_GO, "the taken entry's handle is unknown");
}

Test(ledger, unknown_handle_stays_unknown)
{
    /* Only a listing that ended is remembered: a handle never listed is of an exporter without the library. */
    unsigned char a[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    list_then_take_over(a, 13, 14, 0);
    handle_of(a, 15);
    cr_assert_eq(ipcc_ledger_owner(a, &who), 0);
}

Test(ledger, a_fleets_exports_are_all_listed)
{
    /* Eight trainers of 250 weights each (the soak's fleet lists about 1,000): every handle is listed, and importers need not listen to every exporter. The old table of 1,024 entries filled at 95%, and the handles it could not list were never let go at their exporter's death. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    unsigned char h[IPCC_HANDLE_BYTES];
    struct ipcc_proc who;
    for (uint32_t i = 0; i < 2000; i++) {
        memset(h, 0, sizeof(h));
        memcpy(h, &i, sizeof(i));
        h[63] = 0x5a;
        cr_assert_eq(ipcc_ledger_publish(h), 0, "export %u not listed", i);
    }
    cr_assert_eq(ipcc_ledger_unpublished(), 0);
    for (uint32_t i = 0; i < 2000; i++) {
        memset(h, 0, sizeof(h));
        memcpy(h, &i, sizeof(i));
        h[63] = 0x5a;
        cr_assert_eq(ipcc_ledger_owner(h, &who), 1);
    }
}

Test(ledger, dead_exporters_entries_are_reused)
{
    /* Once every entry a handle may use is held, only a dead holder's entry can be taken. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    pid_t dead = reaped_child();
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++)
        atomic_store(&f->exports[i].pid, getppid());
    unsigned char h[IPCC_HANDLE_BYTES];
    handle_of(h, 3);
    cr_assert_eq(ipcc_ledger_publish(h), -1, "took a live process's entry");
    cr_assert_eq(ipcc_ledger_unpublished(), 1, "importers were not told to listen to everyone");
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++)
        atomic_store(&f->exports[i].pid, dead);
    cr_assert_eq(ipcc_ledger_publish(h), 0);
}

/* What the VMM importer's match says of an entry: its owner gone (-1) when
 * it is the dead pid, else no match. */
static pid_t gone_pid;
static int scans;

static int gone_or_other(const struct ipcc_proc *owner, const void *handle, void *arg)
{
    (void)handle;
    (void)arg;
    scans++;
    return owner->pid == gone_pid ? -1 : 0;
}

Test(ledger, scan_frees_entries_of_exporters_gone)
{
    /* An exporter killed before it could unlist its exports costs one scan, not every scan after it. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    gone_pid = reaped_child();
    for (int i = 0; i < 100; i++) {
        struct ipcc_ledger_export *e = &f->exports[i];
        atomic_store(&e->pid, i % 2 ? gone_pid : getppid());
        atomic_store(&e->ready, 1);
    }
    unsigned char tag[IPCC_HANDLE_BYTES];
    struct ipcc_proc owner;
    scans = 0;
    cr_assert_eq(ipcc_ledger_find_export(gone_or_other, NULL, tag, &owner), 0);
    cr_assert_eq(scans, 100);
    scans = 0;
    cr_assert_eq(ipcc_ledger_find_export(gone_or_other, NULL, tag, &owner), 0);
    cr_assert_eq(scans, 50, "%d entries asked again", scans);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(atomic_load(&f->exports[i].ready), i % 2 ? IPCC_EXPORT_LET_GO : 1);
}

Test(ledger, scan_leaves_a_gone_exporters_handles_let_go)
{
    /* The soak's pinned memory: a killed exporter's handle, still mapped elsewhere (so an open of it works), was opened after a VMM scan had cleared its entry; unknown, the mapping was kept for an exporter without the library. Let go, it is closed as without the cache. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    unsigned char h[IPCC_HANDLE_BYTES], tag[IPCC_HANDLE_BYTES];
    struct ipcc_proc who, owner;
    handle_of(h, 5);
    cr_assert_eq(ipcc_ledger_publish(h), 0);
    gone_pid = getpid(); /* the scan's match says this exporter is gone */
    cr_assert_eq(ipcc_ledger_find_export(gone_or_other, NULL, tag, &owner), 0);
    cr_assert_eq(ipcc_ledger_owner(h, &who), IPCC_LEDGER_LET_GO);
    cr_assert_eq(who.pid, getpid());
    handle_of(h, 6); /* and its entry is free for a new export */
    gone_pid = 0;
    cr_assert_eq(ipcc_ledger_publish(h), 0);
    cr_assert_eq(ipcc_ledger_owner(h, &who), 1);
}

Test(ledger, unlisted_vmm_tag_leaves_importers_as_they_are, .timeout = 10)
{
    /* A VMM export's tag the full table cannot take is not listed, and importers of legacy handles are not told to listen to everyone. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++)
        atomic_store(&f->exports[i].pid, getppid());
    unsigned char h[IPCC_HANDLE_BYTES];
    handle_of(h, 4);
    cr_assert_eq(ipcc_ledger_publish_tag(h), -1, "took a live process's entry");
    cr_assert_eq(ipcc_ledger_unpublished(), 0);
}

/* ---- importers and requests ---------------------------------------------- */

/* In a fork child: an importer slot watching exporter, answering the first
 * request that reaches it (when answer) or holding on until killed. */
static pid_t importer(int32_t exporter, int answer)
{
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
        int slot = ipcc_ledger_register();
        if (slot < 0)
            _exit(2);
        ipcc_ledger_name_helper(slot, (int32_t)syscall(SYS_gettid)); /* this thread answers */
        ipcc_ledger_watch(slot, exporter);
        uint32_t rung = ipcc_ledger_doorbell(slot);
        if (write(ready[1], "r", 1) != 1)
            _exit(3);
        struct ipcc_ledger_ask ask;
        for (;;) {
            if (answer && ipcc_ledger_next_ask(slot, 0, &ask) >= 0) {
                ipcc_ledger_answer(slot, &ask);
                _exit(ask.handle[0]);
            }
            ipcc_ledger_sleep(slot, rung, FOREVER_NS);
            rung = ipcc_ledger_doorbell(slot);
        }
    }
    char c;
    cr_assert_eq(read(ready[0], &c, 1), 1, "the importer could not register");
    close(ready[0]);
    close(ready[1]);
    return pid;
}

/* Releases the handle tagged tag as an exporter would. */
static int release_tag(unsigned char tag, uint64_t wait_ns)
{
    unsigned char h[IPCC_HANDLE_BYTES];
    handle_of(h, tag);
    return ipcc_ledger_release(h, wait_ns);
}

static void end(pid_t child)
{
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
}

static int exit_status(pid_t pid)
{
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(ledger, no_importer_no_wait, .timeout = 10)
{
    /* With nobody registered the exporter does not post anything. */
    cr_assert_eq(release_tag(4, FOREVER_NS), 0);
    cr_assert_eq(atomic_load(&ipcc_ledger_file()->requests[0].state), IPCC_REQ_FREE);
}

Test(ledger, watching_importer_answers, .timeout = 10)
{
    /* The importer is woken, sees the handle, answers, and the exporter's wait ends. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    pid_t child = importer(getpid(), 1);
    cr_assert_eq(release_tag(5, FOREVER_NS), 0);
    cr_assert_eq(exit_status(child), 5, "the importer saw another handle");
}

Test(ledger, importer_of_any_exporter_is_asked, .timeout = 10)
{
    /* An importer holding handles of unknown exporters is asked by every exporter. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    pid_t child = importer(0, 1);
    cr_assert_eq(release_tag(6, FOREVER_NS), 0);
    cr_assert_eq(exit_status(child), 6);
}

Test(ledger, silent_importer_costs_the_bound_and_finds_the_request_later, .timeout = 10)
{
    /* An importer that does not answer makes the exporter give up at the bound; the request stays for a late answer. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    pid_t child = importer(getpid(), 0);
    cr_assert_eq(release_tag(7, 20ULL * 1000 * 1000), 1);
    int slot = -1;
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        if (atomic_load(&ipcc_ledger_file()->importers[i].pid) == child)
            slot = i;
    struct ipcc_ledger_ask ask;
    cr_assert_geq(ipcc_ledger_next_ask(slot, 0, &ask), 0);
    cr_assert_eq(ask.handle[0], 7);
    end(child);
}

Test(ledger, importer_of_other_exporters_is_not_asked, .timeout = 10)
{
    /* An importer that holds only another exporter's handles is left alone (it would never answer). */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    pid_t child = importer(getppid(), 0);
    cr_assert_eq(release_tag(8, FOREVER_NS), 0);
    end(child);
}

Test(ledger, dead_importer_is_skipped, .timeout = 10)
{
    /* An importer that exited without giving its slot back is not waited for. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    pid_t child = importer(getpid(), 0);
    end(child);
    cr_assert_eq(release_tag(9, FOREVER_NS), 0);
}

Test(ledger, recycled_pid_is_not_the_importer, .timeout = 10)
{
    /* A slot whose pid now runs another process (another start time) is not waited for. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct ipcc_ledger_importer *s = &ipcc_ledger_file()->importers[0];
    atomic_store(&s->pid, getppid());
    atomic_store(&s->start, ipcc_proc_start(getppid()) + 1);
    atomic_store(&s->any, 1);
    cr_assert_eq(release_tag(10, FOREVER_NS), 0);
    cr_assert_eq(ipcc_ledger_register(), 0, "the dead owner's slot was not taken over");
}

Test(ledger, full_ledger_asks_nobody, .timeout = 10)
{
    /* With every request slot held by a waiting exporter, a free goes ahead without asking. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    for (int r = 0; r < IPCC_LEDGER_REQUESTS; r++) {
        atomic_store(&f->requests[r].state, IPCC_REQ_POSTED);
        atomic_store(&f->requests[r].deadline_ns, UINT64_MAX);
    }
    pid_t child = importer(getpid(), 0);
    cr_assert_eq(release_tag(11, FOREVER_NS), -1);
    end(child);
}

Test(ledger, slot_given_back_is_free)
{
    /* An importer's slot given back (at exit) is the next one taken. */
    int slot = ipcc_ledger_register();
    cr_assert_geq(slot, 0);
    ipcc_ledger_unregister(slot);
    cr_assert_eq(atomic_load(&ipcc_ledger_file()->importers[slot].pid), 0);
    cr_assert_eq(ipcc_ledger_register(), slot);
}

/* Request r's state word once it holds the request for tag (a fork child's). */
static uint32_t posted_for(int r, unsigned char tag)
{
    struct ipcc_ledger_request *q = &ipcc_ledger_file()->requests[r];
    for (int i = 0; i < 5000; i++) {
        uint32_t w = atomic_load(&q->state);
        if ((w & 3) == IPCC_REQ_POSTED && q->handle[0] == tag)
            return w;
        usleep(1000);
    }
    cr_assert_fail("request %d never showed tag %d", r, tag);
    return 0;
}

static pid_t exporter_releasing(unsigned char tag, uint64_t wait_ns)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(release_tag(tag, wait_ns));
    }
    return pid;
}

static void answer_as(int slot)
{
    struct ipcc_ledger_ask ask;
    cr_assert_geq(ipcc_ledger_next_ask(slot, 0, &ask), 0);
    ipcc_ledger_answer(slot, &ask);
}

Test(ledger, stopped_exporter_leaves_a_later_request_posted, .timeout = 10)
{
    /* An exporter stopped past its deadline, whose request slot went to another exporter meanwhile, leaves that one's live request posted when it resumes. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    for (int r = 1; r < IPCC_LEDGER_REQUESTS; r++) { /* only slot 0 is left */
        atomic_store(&f->requests[r].state, IPCC_REQ_POSTED);
        atomic_store(&f->requests[r].deadline_ns, UINT64_MAX);
    }
    pid_t imp = importer(0, 0);
    int slot = -1;
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        if (atomic_load(&f->importers[i].pid) == imp)
            slot = i;
    pid_t a = exporter_releasing(30, 200ULL * 1000 * 1000);
    posted_for(0, 30);
    int status;
    kill(a, SIGSTOP);
    cr_assert_eq(waitpid(a, &status, WUNTRACED), a);
    answer_as(slot); /* a's request is answered while a sleeps past its deadline */
    usleep(300 * 1000);
    pid_t b = exporter_releasing(31, FOREVER_NS);
    posted_for(0, 31);
    kill(a, SIGCONT);
    cr_assert_eq(exit_status(a), 0);
    uint32_t w = atomic_load(&f->requests[0].state);
    cr_assert_eq(w & 3, IPCC_REQ_POSTED, "the resumed exporter freed the other's request");
    answer_as(slot);
    cr_assert_eq(exit_status(b), 0);
    end(imp);
}

/* ---- two claimers of one dead importer slot ------------------------------ */

/* Slot 0 is a dead process's, every other one a live process's (this one,
 * whose pid alone says it runs): a claimer can only take slot 0. */
static void only_slot0_is_free(void)
{
    struct ipcc_ledger_file *f = ipcc_ledger_file();
    for (int i = 1; i < IPCC_LEDGER_IMPORTERS; i++) {
        atomic_store(&f->importers[i].pid, getpid());
        atomic_store(&f->importers[i].start, 0);
        atomic_store(&f->importers[i].helper, 0);
    }
    struct ipcc_ledger_importer *s = &f->importers[0];
    pid_t dead = reaped_child();
    atomic_store(&s->pid, dead);
    atomic_store(&s->start, 1); /* no live process started at tick 1 */
    atomic_store(&s->helper, dead);
    atomic_store(&s->any, 1);
}

struct slot_words { int32_t pid, helper; uint64_t start; };

static struct slot_words slot0_words(void)
{
    struct ipcc_ledger_importer *s = &ipcc_ledger_file()->importers[0];
    return (struct slot_words){ atomic_load(&s->pid), atomic_load(&s->helper),
                                atomic_load(&s->start) };
}

Test(ledger, claim_under_way_is_not_taken_over, .timeout = 60)
{
    /* A claimer stopped at any instruction from its first store to the dead slot on: a second claimer must not take the slot (both would use it, and exporters would skip one). */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    only_slot0_is_free();
    pid_t a = fork();
    cr_assert_geq(a, 0);
    if (a == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        ipcc_proc_self(); /* its /proc read before the steps */
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0)
            _exit(100);
        raise(SIGSTOP);
        _exit(ipcc_ledger_register() == 0 ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(a, &status, 0), a);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 100)
        cr_skip_test("ptrace is not allowed here");
    struct slot_words before = slot0_words();
    long steps = 0, taken_at = -1, under_way = 0;
    struct slot_words seen = before;
    for (; steps < 1000000; steps++) {
        cr_assert_eq(ptrace(PTRACE_SINGLESTEP, a, NULL, NULL), 0);
        cr_assert_eq(waitpid(a, &status, 0), a);
        if (!WIFSTOPPED(status))
            break;
        struct slot_words now = slot0_words();
        under_way |= memcmp(&now, &before, sizeof(now)) != 0;
        if (under_way && ipcc_ledger_register() != -2) {
            taken_at = steps;
            seen = now;
            break;
        }
    }
    if (taken_at >= 0)
        end(a);
    cr_assert_eq(taken_at, -1, "taken over at step %ld of the claim: pid %d, start %llu, helper %d",
                 taken_at, seen.pid, (unsigned long long)seen.start, seen.helper);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the first claimer lost its slot");
    cr_assert_gt(under_way, 0);
}

/* Two processes released at once onto one dead slot, many times over. */
struct claim_race {
    _Atomic uint32_t round;
    _Atomic uint32_t done;
    _Atomic int32_t got[2];
};

#define CLAIM_ROUNDS 1000

static void claim_rounds(struct claim_race *r, int who)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (uint32_t round = 1;; round++) {
        while (atomic_load(&r->round) != round)
            sched_yield(); /* a spin, so that both start at once; yielding to the parent */
        if (round > CLAIM_ROUNDS) /* alive until the last round is judged: a dead winner's slot is free */
            _exit(0);
        atomic_store(&r->got[who], ipcc_ledger_register());
        atomic_fetch_add(&r->done, 1);
        ipcc_futex_wake(&r->done);
    }
}

Test(ledger, racing_claimers_take_one_slot_once, .timeout = 60)
{
    /* Of two processes claiming one dead slot at the same moment, exactly one gets it, and the slot names that one. */
    cr_assert_eq(ipcc_ledger_ready(), 1);
    struct claim_race *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(r, MAP_FAILED);
    only_slot0_is_free();
    pid_t kids[2];
    for (int who = 0; who < 2; who++) {
        kids[who] = fork();
        cr_assert_geq(kids[who], 0);
        if (kids[who] == 0)
            claim_rounds(r, who);
    }
    int both = 0;
    for (uint32_t round = 1; round <= CLAIM_ROUNDS; round++) {
        only_slot0_is_free();
        atomic_store(&r->done, 0);
        atomic_store(&r->got[0], 9);
        atomic_store(&r->got[1], 9);
        atomic_store(&r->round, round);
        uint32_t d;
        while ((d = atomic_load(&r->done)) < 2)
            ipcc_futex_wait(&r->done, d, 1000000);
        int32_t g0 = atomic_load(&r->got[0]), g1 = atomic_load(&r->got[1]);
        int32_t owner = atomic_load(&ipcc_ledger_file()->importers[0].pid);
        both += g0 == 0 && g1 == 0;
        cr_assert((g0 == 0) != (g1 == 0) || (g0 == 0 && g1 == 0), "round %u: %d %d", round, g0, g1);
        if (g0 == 0 && g1 == 0)
            continue;
        cr_assert_eq(owner, kids[g0 == 0 ? 0 : 1], "round %u: the slot names %d", round, owner);
    }
    atomic_store(&r->round, CLAIM_ROUNDS + 1);
    for (int who = 0; who < 2; who++)
        cr_assert_eq(exit_status(kids[who]), 0);
    cr_assert_eq(both, 0, "in %d of %d rounds both claimers took the slot", both, CLAIM_ROUNDS);
}
