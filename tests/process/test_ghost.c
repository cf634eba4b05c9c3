/*
 * test_ghost.c - an exporter's free gives its memory back although an
 * importer cached an idle mapping of it (the release ledger).
 *
 * Exporters and importers are separate processes (tests/process/ghost_peer.c) under
 * LD_PRELOAD, sharing a private per-user directory (XDG_RUNTIME_DIR) and the
 * stand-in driver's book of "physical" memory (FAKECUDA_PHYS_DIR), which this
 * program reads: an allocation's bytes stay there until its owner freed it
 * and no live process maps it, as on a GPU.
 *
 * Frees wait up to IPCCACHE_RELEASE_WAIT_MS=20000 unless a test says
 * otherwise: a free that had to wait for the bound would hit the test's own
 * timeout, so the checks never depend on timing.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_vmm.h"
#include "ledger_impl.h"

#define MIB (1ULL << 20)
#define REPLY_LIMIT_MS 25000
#define MAX_ENV 24

static char build_dir[PATH_MAX];
static char tmpdir[PATH_MAX];

/* ---- the test's private directory ----------------------------------------- */

static void remove_tree(const char *path)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    cr_expect_eq(system(cmd), 0);
}

static void setup(void)
{
    const char *b = getenv("IPCC_TEST_BUILD");
    if (!realpath(b && *b ? b : "build", build_dir))
        cr_fatal("build folder: %s", strerror(errno));
    const char *t = getenv("TMPDIR"); /* the run's own folder (tests/run.sh) */
    snprintf(tmpdir, sizeof(tmpdir), "%s/ipcc-ghost-XXXXXX", t && *t ? t : "/tmp");
    cr_assert_not_null(mkdtemp(tmpdir));
    setenv("FAKECUDA_PHYS_DIR", tmpdir, 1);
}

/* Every process a test started, killed at its end even when it failed
 * half-way (a stopped or waiting peer must not outlive it). */
static pid_t started[32];
static int nstarted;

static void track(pid_t pid)
{
    if (nstarted < (int)(sizeof(started) / sizeof(started[0])))
        started[nstarted++] = pid;
}

static void teardown(void)
{
    for (int i = 0; i < nstarted; i++) {
        kill(started[i], SIGKILL);
        waitpid(started[i], NULL, WNOHANG);
    }
    remove_tree(tmpdir);
}

TestSuite(ghost, .init = setup, .fini = teardown);

static uint64_t phys(void)
{
    return fakecuda_phys_bytes();
}

/* ---- peers ------------------------------------------------------------------ */

struct peer {
    pid_t pid;
    int in, out;
    char line[512];
};

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...)
{
    char *s;
    va_list ap;
    va_start(ap, fmt);
    cr_assert_geq(vasprintf(&s, fmt, ap), 0);
    va_end(ap);
    return s;
}

/* The peer's environment: the library preloaded, the test's directory as
 * the per-user one, then extra[] (which may override any of it). */
static void build_env(char **env, const char *const *extra)
{
    const char *prefix = getenv("IPCC_TEST_PRELOAD_PREFIX");
    static const char *const passed_on[] = { "ASAN_OPTIONS", "UBSAN_OPTIONS" };
    int n = 0;
    env[n++] = format("PATH=/usr/bin:/bin");
    env[n++] = format("LD_LIBRARY_PATH=%s/tests", build_dir);
    env[n++] = format("LD_PRELOAD=%s%s%s/libipccache.so", prefix && *prefix ? prefix : "",
                      prefix && *prefix ? ":" : "", build_dir);
    env[n++] = format("XDG_RUNTIME_DIR=%s", tmpdir);
    env[n++] = format("FAKECUDA_PHYS_DIR=%s", tmpdir);
    env[n++] = format("IPCCACHE_RELEASE_WAIT_MS=20000");
    for (size_t i = 0; i < sizeof(passed_on) / sizeof(passed_on[0]); i++)
        if (getenv(passed_on[i]))
            env[n++] = format("%s=%s", passed_on[i], getenv(passed_on[i]));
    for (; extra && *extra && n < MAX_ENV - 1; extra++) {
        size_t klen = strcspn(*extra, "=") + 1;
        int i = 0;
        while (i < n && strncmp(env[i], *extra, klen) != 0)
            i++;
        if (i < n)
            free(env[i]);
        env[i] = format("%s", *extra);
        n += i == n;
    }
    env[n] = NULL;
}

#define ENV(...) ((const char *const[]){ __VA_ARGS__, NULL })

static int enter_join_ns(void);

/* Starts a peer; its stderr goes to <tmpdir>/<name>.err. */
static void start(struct peer *p, const char *name, const char *const *extra)
{
    char *env[MAX_ENV];
    int in[2], out[2];
    build_env(env, extra);
    char *prog = format("%s/tests/ghost_peer", build_dir);
    char *err = format("%s/%s.err", tmpdir, name);
    cr_assert_eq(pipe2(in, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
    int err_fd = open(err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(err_fd, 0);
    p->pid = fork();
    cr_assert_geq(p->pid, 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err_fd, 2) < 0 ||
            enter_join_ns() != 0)
            _exit(126);
        execve(prog, (char *const[]){ prog, NULL }, env);
        _exit(127);
    }
    track(p->pid);
    close(in[0]);
    close(out[1]);
    close(err_fd);
    p->in = in[1];
    p->out = out[0];
    for (char **e = env; *e; e++)
        free(*e);
    free(prog);
    free(err);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static const char *reply_to(struct peer *p, const char *cmd, int n);

/* Sends one command and returns the one-line reply (without newline). */
static const char *ask(struct peer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *ask(struct peer *p, const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
    va_end(ap);
    cmd[n++] = '\n';
    cr_assert_eq(write(p->in, cmd, (size_t)n), n, "peer %d gone", (int)p->pid);
    return reply_to(p, cmd, n);
}

/* The reply to cmd (n bytes, sent already). */
static const char *reply_to(struct peer *p, const char *cmd, int n)
{
    size_t len = 0;
    long long deadline = now_ms() + REPLY_LIMIT_MS;
    while (len < sizeof(p->line) - 1) {
        struct pollfd pfd = { p->out, POLLIN, 0 };
        long long left = deadline - now_ms();
        cr_assert(left > 0 && poll(&pfd, 1, (int)left) == 1, "no reply to %.*s", n - 1, cmd);
        ssize_t r = read(p->out, p->line + len, 1);
        cr_assert_eq(r, 1, "peer %d ended during %.*s", (int)p->pid, n - 1, cmd);
        if (p->line[len] == '\n')
            break;
        len++;
    }
    p->line[len] = '\0';
    return p->line;
}

/* A command that must succeed; returns the number after "ok". */
static long long ok(struct peer *p, const char *reply)
{
    cr_assert(strncmp(reply, "ok ", 3) == 0, "peer %d replied \"%s\"", (int)p->pid, reply);
    return strtoll(reply + 3, NULL, 10);
}

/* The usual cast: one exporter (with exporter_env) and one importer. */
static void start_pair(struct peer *exp, struct peer *imp, const char *const *exporter_env)
{
    start(exp, "exporter", exporter_env);
    start(imp, "importer", NULL);
}

/* An exported allocation: its index in the exporter and its handle. */
struct exported {
    int idx;
    char hex[2 * CU_IPC_HANDLE_SIZE + 1];
};

static struct exported export(struct peer *p, uint64_t bytes)
{
    struct exported e;
    const char *r = ask(p, "alloc %llu", (unsigned long long)bytes);
    cr_assert_eq(sscanf(r, "ok %d %128s", &e.idx, e.hex), 2, "alloc replied \"%s\"", r);
    return e;
}

/* Opens (and with close, closes again: cached, idle); the importer's index. */
static int import(struct peer *p, const struct exported *e, int close)
{
    int idx = (int)ok(p, ask(p, "open %s", e->hex));
    if (close)
        cr_assert_eq(ok(p, ask(p, "close %d", idx)), CUDA_SUCCESS);
    return idx;
}

static void free_exported(struct peer *p, const struct exported *e)
{
    cr_assert_eq(ok(p, ask(p, "free %d", e->idx)), CUDA_SUCCESS);
}

static int finish(struct peer *p)
{
    int status;
    cr_assert_eq(write(p->in, "exit\n", 5), 5);
    close(p->in);
    close(p->out);
    waitpid(p->pid, &status, 0);
    return status;
}

static void kill_peer(struct peer *p)
{
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    close(p->in);
    close(p->out);
}

/* What a peer wrote on stderr. */
static char *stderr_of(const char *name, char *buf, size_t cap)
{
    char *path = format("%s/%s.err", tmpdir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, cap - 1) : -1;
    buf[n > 0 ? n : 0] = '\0';
    if (fd >= 0)
        close(fd);
    free(path);
    return buf;
}

/* Polls the book until it shows want bytes; for what happens on another
 * process's schedule (a resumed importer, the helper's periodic check). The
 * limit only stops a test that would otherwise hang. */
static uint64_t phys_settles_at(uint64_t want)
{
    long long deadline = now_ms() + 20000;
    while (phys() != want && now_ms() < deadline)
        usleep(10000);
    return phys();
}

/* As when some exporter found the ledger's table of handles full: importers
 * of handles it does not know then listen to every exporter. With forget,
 * the handles listed so far are dropped too. */
/* The peers' ledger, mapped shared (writable for the cases that plant state). */
static struct ipcc_ledger_file *map_ledger(int writable)
{
    char *path = format("%s/ipccache/" IPCC_LEDGER_NAME, tmpdir);
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    cr_assert_geq(fd, 0, "no ledger at %s", path);
    struct ipcc_ledger_file *f = mmap(NULL, sizeof(*f), PROT_READ | (writable ? PROT_WRITE : 0),
                                      MAP_SHARED, fd, 0);
    cr_assert_neq(f, MAP_FAILED);
    close(fd);
    free(path);
    return f;
}

static void mark_unpublished(int forget)
{
    struct ipcc_ledger_file *f = map_ledger(1);
    atomic_store(&f->unpublished, 1);
    for (int i = 0; forget && i < IPCC_LEDGER_EXPORTS; i++)
        atomic_store(&f->exports[i].pid, 0);
    munmap(f, sizeof(*f));
}

static int threads_of(pid_t pid)
{
    char *path = format("/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    free(path);
    return n;
}

/* ---- the outcomes --------------------------------------------------------- */

Test(ghost, two_importers_both_let_go, .timeout = 40)
{
    /* Every importer holding the allocation idle closes it before the free returns. */
    struct peer exp, a, b;
    start(&exp, "exporter", NULL);
    start(&a, "importer_a", NULL);
    start(&b, "importer_b", NULL);
    struct exported e = export(&exp, 32 * MIB);
    import(&a, &e, 1);
    import(&b, &e, 1);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 0));
    finish(&a);
    finish(&b);
    finish(&exp);
}

Test(ghost, exporter_exit_releases_at_the_next_miss, .timeout = 40)
{
    /* When the exporter dies without freeing, the importer's next miss closes its idle mappings of it. */
    struct peer exp, other, imp;
    start(&exp, "exporter", NULL);
    start(&other, "other", NULL);
    start(&imp, "importer", NULL);
    struct exported e = export(&exp, 64 * MIB), o = export(&other, MIB);
    import(&imp, &e, 1);
    kill_peer(&exp);
    cr_assert(eq(u64, phys(), 65 * MIB));
    import(&imp, &o, 1);
    cr_assert(eq(u64, phys(), MIB), "the dead exporter's memory is still mapped");
    finish(&imp);
    finish(&other);
}

Test(ghost, reopen_while_a_dead_exporter_is_let_go_stays_known, .timeout = 60)
{
    /* The exporter died (a zombie: its parent has not reaped it yet); while the importer's helper
     * closes its idle mapping, another thread opens the handle again. That mapping must still be
     * known as the dead exporter's, so it goes after its close like the first. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 16 * MIB);
    import(&imp, &e, 1);
    cr_assert_eq(ok(&imp, ask(&imp, "reopen_at_push %s", e.hex)), 0);
    kill(exp.pid, SIGKILL);
    long long deadline = now_ms() + 20000, idx = -1;
    while ((idx = ok(&imp, ask(&imp, "reopened"))) < 0 && now_ms() < deadline)
        usleep(10000);
    cr_assert_geq(idx, 0, "the helper never closed the dead exporter's mapping");
    waitpid(exp.pid, NULL, 0);
    close(exp.in);
    close(exp.out);
    cr_assert_eq(ok(&imp, ask(&imp, "close %lld", idx)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys_settles_at(0), 0), "the re-opened mapping of a dead exporter stays");
    finish(&imp);
}

Test(ghost, export_after_a_reset_is_let_go_when_its_exporter_dies, .timeout = 60)
{
    /* An exporter resets its primary context (as cudaDeviceReset does), then allocates and
     * exports again, and later dies without freeing: the importer's idle mapping of the new
     * export goes as one of the first would. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported first = export(&exp, 8 * MIB);
    import(&imp, &first, 1);
    cr_assert_eq(ok(&exp, ask(&exp, "primary_reset")), CUDA_SUCCESS);
    cr_assert(eq(u64, phys_settles_at(0), 0), "the reset gives the first export back");
    cr_assert_eq(ok(&exp, ask(&exp, "primary_retain")), CUDA_SUCCESS);
    struct exported e = export(&exp, 16 * MIB);
    import(&imp, &e, 1);
    kill_peer(&exp);
    cr_assert(eq(u64, phys_settles_at(0), 0), "the dead exporter's export after its reset stays mapped");
    finish(&imp);
}

Test(ghost, no_ledger_frees_as_before, .timeout = 40)
{
    /* Without a usable per-user directory the free works as without the ledger and the idle mapping stays. */
    char *blocker = format("%s/ipccache", tmpdir);
    int fd = open(blocker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    close(fd);
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 16 * MIB);
    int idx = import(&imp, &e, 1);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 16 * MIB));
    cr_assert_eq(ok(&imp, ask(&imp, "refs %d", idx)), 1);
    finish(&imp);
    cr_assert(eq(u64, phys(), 0), "the importer's exit gives it back");
    finish(&exp);
    free(blocker);
}

Test(ghost, refused_ledger_is_not_used, .timeout = 40)
{
    /* A ledger file with the wrong mode is refused with one warning, and frees work as before. */
    char *dir = format("%s/ipccache", tmpdir);
    char *file = format("%s/" IPCC_LEDGER_NAME, dir);
    cr_assert_eq(mkdir(dir, 0700), 0);
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fchmod(fd, 0644), 0);
    close(fd);
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 16 * MIB);
    import(&imp, &e, 1);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 16 * MIB));
    finish(&imp);
    finish(&exp);
    char err[2048];
    cr_assert_not_null(strstr(stderr_of("exporter", err, sizeof(err)),
                              "ipccache: warning: release ledger " IPCC_LEDGER_NAME " refused "
                              "(mode is not 0600)"), "%s", err);
    free(dir);
    free(file);
}

Test(ghost, stopped_importer_is_waited_for_only_up_to_the_bound, .timeout = 40)
{
    /* A stopped importer delays the free by the bound at most; resumed, it still lets go. */
    struct peer exp, imp;
    start_pair(&exp, &imp, ENV("IPCCACHE_RELEASE_WAIT_MS=200"));
    struct exported e = export(&exp, 64 * MIB);
    import(&imp, &e, 1);
    int status;
    kill(imp.pid, SIGSTOP);
    cr_assert_eq(waitpid(imp.pid, &status, WUNTRACED), imp.pid); /* all its threads stopped */
    int stopped = WIFSTOPPED(status);
    cr_assert(stopped);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 64 * MIB));
    kill(imp.pid, SIGCONT);
    cr_assert(eq(u64, phys_settles_at(0), 0), "the resumed importer did not let go");
    finish(&imp);
    finish(&exp);
}

Test(ghost, fork_child_of_exporter_frees_nothing_of_the_parent, .timeout = 40)
{
    /* A fork child's free of its copy does not release the importers' mappings; the parent's free does. */
    struct peer exp, bare, imp;
    start(&exp, "exporter", NULL);
    start(&bare, "bare", ENV("LD_PRELOAD="));
    start(&imp, "importer", NULL);
    struct exported e = export(&exp, 16 * MIB), u = export(&bare, MIB);
    int idx = import(&imp, &e, 1);
    mark_unpublished(0);
    import(&imp, &u, 1); /* of an exporter the ledger does not know: every free rings the importer */
    cr_assert_eq(ok(&exp, ask(&exp, "fork_free %d", e.idx)), 0);
    cr_assert_eq(ok(&imp, ask(&imp, "refs %d", idx)), 1, "the child's free emptied the cache");
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), MIB));
    finish(&imp);
    finish(&exp);
    finish(&bare);
}

Test(ghost, fork_child_of_importer_answers_for_itself, .timeout = 40)
{
    /* An importer's fork child that caches a mapping of its own registers and lets go on its own. */
    if (getenv("IPCC_TEST_PRELOAD_PREFIX"))
        cr_skip_test("GCC's ASan runtime: a fork child of a multithreaded process may inherit its "
                     "allocator's lock held, and the child's first new thread (the release helper) "
                     "then waits for it forever in AsanThread::Init (seen with gdb, 2 runs in 6)");
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported a = export(&exp, 16 * MIB), b = export(&exp, 32 * MIB);
    import(&imp, &a, 1);
    pid_t child = (pid_t)ok(&imp, ask(&imp, "fork_hold %s", b.hex));
    track(child);
    cr_assert(eq(u64, phys(), 48 * MIB));
    free_exported(&exp, &b);
    cr_assert(eq(u64, phys(), 16 * MIB), "the child's idle mapping still pins the memory");
    free_exported(&exp, &a);
    cr_assert(eq(u64, phys(), 0));
    kill(child, SIGKILL);
    finish(&imp);
    finish(&exp);
}

Test(ghost, many_exporters_one_importer, .timeout = 60)
{
    /* One importer holding idle mappings of eight exporters lets go of each one's as that one frees. */
    enum { N = 8 };
    struct peer exp[N], imp;
    struct exported e[N];
    start(&imp, "importer", NULL);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "exporter%d", i);
        start(&exp[i], name, NULL);
        e[i] = export(&exp[i], 8 * MIB);
        import(&imp, &e[i], 1);
    }
    cr_assert(eq(u64, phys(), N * 8 * MIB));
    for (int i = 0; i < N; i++) {
        free_exported(&exp[i], &e[i]);
        cr_assert(eq(u64, phys(), (uint64_t)(N - 1 - i) * 8 * MIB), "after exporter %d", i);
    }
    finish(&imp);
    for (int i = 0; i < N; i++)
        finish(&exp[i]);
}

/* Whether the importer's ledger slot asks exporter_pid's frees (or every
 * exporter's) to ring it. */
static int slot_watches(pid_t importer, pid_t exporter_pid)
{
    struct ipcc_ledger_file *f = map_ledger(0);
    int watched = 0;
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++) {
        if (atomic_load(&f->importers[i].pid) != importer)
            continue;
        watched |= atomic_load(&f->importers[i].any);
        for (int w = 0; w < IPCC_LEDGER_WATCH; w++)
            watched |= atomic_load(&f->importers[i].watch[w]) == exporter_pid;
    }
    munmap(f, sizeof(*f));
    return watched;
}

Test(ghost, importer_stops_watching_an_exporter_it_holds_nothing_of, .timeout = 60)
{
    /* Once an exporter freed the last handle an importer held of it, its frees no longer ring that importer: more live exporters than the 16 watched pids come and go without the importer listening to every exporter's frees (the old code kept each pid watched while the exporter lived). */
    enum { N = IPCC_LEDGER_WATCH + 1 };
    struct peer exp[N], imp;
    start(&imp, "importer", NULL);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "exporter%d", i);
        start(&exp[i], name, NULL);
        struct exported e = export(&exp[i], MIB);
        import(&imp, &e, 1);
        cr_assert(slot_watches(imp.pid, exp[i].pid), "exporter %d is not watched", i);
        free_exported(&exp[i], &e);
        cr_assert_not(slot_watches(imp.pid, exp[i].pid), "exporter %d still watched", i);
    }
    cr_assert(eq(u64, phys(), 0));
    finish(&imp);
    for (int i = 0; i < N; i++)
        finish(&exp[i]);
}

/* As when the exporter's ask went round before this importer watched it:
 * the slot watches nobody, so the next free asks it nothing. */
static void unwatch_all(pid_t importer)
{
    struct ipcc_ledger_file *f = map_ledger(1);
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++) {
        if (atomic_load(&f->importers[i].pid) != importer)
            continue;
        atomic_store(&f->importers[i].any, 0);
        for (int w = 0; w < IPCC_LEDGER_WATCH; w++)
            atomic_store(&f->importers[i].watch[w], 0);
    }
    munmap(f, sizeof(*f));
}

Test(ghost, mapping_opened_after_the_ask_goes_once_its_export_is_unlisted, .timeout = 40)
{
    /* An importer that opened a handle after its helper had answered the exporter's ask, before the free (the program's own race: without the cache its close would free the memory), is asked nothing more; its helper lets go of the idle mapping once the exporter no longer lists the handle (the old code kept it while the exporter lived). */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 16 * MIB);
    import(&imp, &e, 1);
    unwatch_all(imp.pid);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys_settles_at(0), 0), "the freed allocation stays mapped");
    finish(&imp);
    finish(&exp);
}

/* The bytes of a handle written in hex. */
static void handle_of_hex(const char *hex, unsigned char h[CU_IPC_HANDLE_SIZE])
{
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        cr_assert_eq(sscanf(hex + 2 * i, "%2hhx", &h[i]), 1);
}

/* Whether the ledger still lists the handle written in hex as exported. */
static int listed(const char *hex)
{
    unsigned char h[CU_IPC_HANDLE_SIZE];
    handle_of_hex(hex, h);
    struct ipcc_ledger_file *f = map_ledger(0);
    int found = 0;
    for (int i = 0; i < IPCC_LEDGER_EXPORTS && !found; i++)
        found = atomic_load(&f->exports[i].ready) == IPCC_EXPORT_LISTED &&
                memcmp(f->exports[i].handle, h, sizeof(h)) == 0;
    munmap(f, sizeof(*f));
    return found;
}

Test(ghost, mapping_opened_between_the_unlisting_and_the_free_is_not_kept, .timeout = 60)
{
    /* An importer that opens a handle after its exporter unlisted it, before the real free (a free or a context teardown under way), does not keep the mapping once closed: without the cache that close frees the memory (the old code took the handle for one of an exporter without the library and kept it while the importer lived). */
    struct peer exp, imp;
    start_pair(&exp, &imp, ENV("FAKECUDA_SLOW_FREE_MS=4000"));
    struct exported e = export(&exp, 16 * MIB);
    char cmd[64];
    int n = snprintf(cmd, sizeof(cmd), "free %d\n", e.idx);
    cr_assert_eq(write(exp.in, cmd, (size_t)n), n);
    long long deadline = now_ms() + 20000;
    while (listed(e.hex) && now_ms() < deadline)
        usleep(1000);
    import(&imp, &e, 1);
    cr_assert_eq(ok(&exp, reply_to(&exp, cmd, n)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys_settles_at(0), 0), "the closed mapping keeps the freed memory");
    finish(&imp);
    finish(&exp);
}

/* Applies change to each of the ledger's entries of the handle written in
 * hex (with listed_only, those that list it now); there must be one. */
static void change_entries(const char *hex, int listed_only,
                           void (*change)(struct ipcc_ledger_export *e))
{
    unsigned char h[CU_IPC_HANDLE_SIZE];
    handle_of_hex(hex, h);
    struct ipcc_ledger_file *f = map_ledger(1);
    int found = 0;
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++) {
        struct ipcc_ledger_export *e = &f->exports[i];
        if (memcmp(e->handle, h, sizeof(h)) != 0 ||
            (listed_only && atomic_load(&e->ready) != IPCC_EXPORT_LISTED))
            continue;
        change(e);
        found = 1;
    }
    munmap(f, sizeof(*f));
    cr_assert(found, "the ledger never listed the handle");
}

static void free_entry(struct ipcc_ledger_export *e)
{
    atomic_store(&e->pid, 0);
    atomic_store(&e->ready, IPCC_EXPORT_WRITING);
}

/* Frees the ledger's entries of the handle written in hex, as when a later
 * export took them over: the ledger no longer knows the handle. */
static void unlist_entirely(const char *hex)
{
    change_entries(hex, 0, free_entry);
}

static void start_earlier(struct ipcc_ledger_export *e)
{
    atomic_store(&e->start, atomic_load(&e->start) - 1);
}

/* Gives the ledger's listing of the handle written in hex another start
 * time: as if an earlier process with the exporter's pid (pids come round
 * again, soon in a container's small pid space) had listed it and died
 * without unlisting. */
static void list_as_an_earlier_process(const char *hex)
{
    change_entries(hex, 1, start_earlier);
}

Test(ghost, exporter_with_a_dead_ones_pid_is_heard_after_the_dead_ones_let_go, .timeout = 40)
{
    /* An importer that maps handles of a dead exporter and of a live one that got its pid lets go of the dead one's within a second; the live one's free still asks it (the old code stopped listening to that pid with the dead one's last handle, and kept the live one's freed allocation mapped). */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported earlier = export(&exp, 8 * MIB), e = export(&exp, 16 * MIB);
    list_as_an_earlier_process(earlier.hex);
    import(&imp, &earlier, 1);
    import(&imp, &e, 1);
    long long deadline = now_ms() + 20000;
    while (ok(&imp, ask(&imp, "unmaps")) < 1 && now_ms() < deadline)
        usleep(10000);
    cr_assert_eq(ok(&imp, ask(&imp, "unmaps")), 1, "the dead exporter's mapping is let go of");
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 8 * MIB), "the live exporter's freed allocation stays mapped");
    finish(&imp);
    finish(&exp);
}

Test(ghost, handle_let_go_of_and_reopened_after_its_entry_went_is_not_kept, .timeout = 60)
{
    /* An importer that let go of a handle at its free, and opens it again while another importer still maps the memory after the ledger's entry of it was taken over, does not keep its mapping once closed: it remembers what it let go of (the old code took the handle for one of an exporter without the library and kept the memory while the importer lived: the soak's pinned memory). */
    struct peer exp, a, b;
    start(&exp, "exporter", NULL);
    start(&a, "importer_a", NULL);
    start(&b, "importer_b", NULL);
    struct exported e = export(&exp, 16 * MIB);
    import(&a, &e, 1);
    int held = import(&b, &e, 0);
    free_exported(&exp, &e);
    unlist_entirely(e.hex);
    import(&a, &e, 1);
    cr_assert_eq(ok(&b, ask(&b, "close %d", held)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys_settles_at(0), 0), "the importer that let go keeps the memory");
    finish(&a);
    finish(&b);
    finish(&exp);
}

Test(ghost, unexported_free_is_untouched, .timeout = 40)
{
    /* An exporter's frees of memory it never exported go straight to the driver and give the bytes back. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 8 * MIB);
    import(&imp, &e, 1);
    int plain = (int)ok(&exp, ask(&exp, "alloc_plain %llu", 4 * MIB));
    cr_assert_eq(ok(&exp, ask(&exp, "free %d", plain)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 8 * MIB));
    cr_assert_eq(ok(&imp, ask(&imp, "refs 0")), 1, "an unrelated free closed the cached mapping");
    finish(&imp);
    finish(&exp);
}

Test(ghost, helper_closes_during_a_global_graph_capture, .timeout = 40)
{
    /* While a thread of the importer captures a CUDA graph in global mode, the helper's closes still succeed. */
    struct peer exp, imp;
    start(&exp, "exporter", NULL);
    start(&imp, "importer", ENV("FAKECUDA_GLOBAL_CAPTURE=1"));
    struct exported e = export(&exp, 16 * MIB);
    import(&imp, &e, 1);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 0), "the helper's close was refused during the capture");
    kill_peer(&imp); /* its exit-time closes would be refused too: not this test's business */
    finish(&exp);
}

Test(ghost, unlisted_handle_is_released_after_an_overflow, .timeout = 40)
{
    /* When the ledger could not list every exported handle, an importer of an unlisted one still lets go at its free. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 16 * MIB);
    mark_unpublished(1);
    import(&imp, &e, 1);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 0), "the importer of an unlisted handle was not asked");
    finish(&imp);
    finish(&exp);
}

/* ---- handles: one per allocation (the H200) or one per export ------------ */

/* The stand-in gives every export of an allocation the same bytes, as the
 * H200's driver does; FAKECUDA_HANDLE_PER_CALL=1 gives each its own, as a
 * driver may. The exporter tests run both ways. */
enum { SAME_HANDLE, HANDLE_PER_CALL };
static const char *const handle_mode[] = { "FAKECUDA_HANDLE_PER_CALL=0",
                                           "FAKECUDA_HANDLE_PER_CALL=1" };

static struct criterion_test_params both_handle_modes(void)
{
    static int modes[] = { SAME_HANDLE, HANDLE_PER_CALL };
    return cr_make_param_array(int, modes, 2);
}
#define BOTH_HANDLE_MODES(name) \
    ParameterizedTestParameters(ghost, name) { return both_handle_modes(); }

/* Allocation e exported again, of the pointer offset bytes inside it. */
static struct exported reexport(struct peer *p, const struct exported *e, uint64_t offset)
{
    struct exported again = { .idx = e->idx };
    const char *r = ask(p, "reexport %d %llu", e->idx, (unsigned long long)offset);
    cr_assert_eq(sscanf(r, "ok %128s", again.hex), 1, "reexport replied \"%s\"", r);
    return again;
}

BOTH_HANDLE_MODES(export_of_an_inner_pointer_lets_go_at_the_allocations_free)

ParameterizedTest(int *mode, ghost, export_of_an_inner_pointer_lets_go_at_the_allocations_free,
                  .timeout = 40)
{
    /* A handle exported from a pointer inside an allocation is released when the allocation (its base) is freed. */
    struct peer exp, imp;
    start_pair(&exp, &imp, ENV(handle_mode[*mode]));
    struct exported e;
    const char *r = ask(&exp, "alloc_inner %llu %llu", 16 * MIB, MIB);
    cr_assert_eq(sscanf(r, "ok %d %128s", &e.idx, e.hex), 2, "alloc_inner replied \"%s\"", r);
    import(&imp, &e, 1);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 0), "the free of the base did not reach the importer");
    finish(&imp);
    finish(&exp);
}

BOTH_HANDLE_MODES(each_handle_of_a_reexported_allocation_lets_go)

ParameterizedTest(int *mode, ghost, each_handle_of_a_reexported_allocation_lets_go, .timeout = 40)
{
    /* An allocation exported again (its base, then a pointer inside it) has one handle on the H200, one per export on another driver: at its free, importers let go of the mappings they opened through any of them (the old code asked about the last handle only). */
    struct peer exp, a, b;
    start(&exp, "exporter", ENV(handle_mode[*mode]));
    start(&a, "importer_a", NULL);
    start(&b, "importer_b", NULL);
    struct exported first = export(&exp, 4 * MIB);
    struct exported base = reexport(&exp, &first, 0), inner = reexport(&exp, &first, MIB);
    int same = strcmp(first.hex, base.hex) == 0 && strcmp(base.hex, inner.hex) == 0;
    cr_assert_eq(same, *mode == SAME_HANDLE, "the stand-in's handles: %s, %s, %s", first.hex,
                 base.hex, inner.hex);
    import(&a, &first, 1);
    import(&b, &base, 1);
    import(&b, &inner, 1); /* the same mapping, under a second handle */
    cr_assert(eq(u64, phys(), 4 * MIB));
    free_exported(&exp, &first);
    cr_assert(eq(u64, phys(), 0), "an importer's idle mapping still pins the memory");
    finish(&a);
    finish(&b);
    finish(&exp);
}

BOTH_HANDLE_MODES(handle_past_the_remembered_ones_still_lets_go)

ParameterizedTest(int *mode, ghost, handle_past_the_remembered_ones_still_lets_go, .timeout = 40)
{
    /* Past the handles an allocation's exporter remembers (a driver with a handle per export, re-shared many times), the mapping an importer opened through an early one is still let go of, by the free at the latest. */
    struct peer exp, imp;
    start_pair(&exp, &imp, ENV(handle_mode[*mode]));
    struct exported first = export(&exp, 4 * MIB);
    struct exported early = reexport(&exp, &first, 0);
    import(&imp, &early, 1);
    for (int i = 0; i < 20; i++)
        reexport(&exp, &first, 0);
    free_exported(&exp, &first);
    cr_assert(eq(u64, phys(), 0), "the mapping of an early handle still pins the memory");
    finish(&imp);
    finish(&exp);
}

/* The free must not wait for an importer that cannot answer: with a bound
 * of a minute, a wait would outlast the test's own timeout. */
static void start_pair_unwaited(struct peer *exp, struct peer *imp)
{
    start(exp, "exporter", ENV("IPCCACHE_RELEASE_WAIT_MS=60000"));
    start(imp, "importer", ENV("IPCCACHE_LOG=info"));
}

Test(ghost, exec_importers_slot_is_taken_over, .timeout = 15)
{
    /* The slot an exec()ed importer left is free for others: with the 63 others held, a new importer still gets one and lets go. */
    struct peer exp, old, imp;
    start(&exp, "exporter", ENV("IPCCACHE_RELEASE_WAIT_MS=60000"));
    start(&old, "old", NULL);
    struct exported a = export(&exp, 16 * MIB), b = export(&exp, 8 * MIB);
    import(&old, &a, 1);
    struct ipcc_ledger_file *f = map_ledger(1);
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        if (atomic_load(&f->importers[i].pid) == 0)
            atomic_store(&f->importers[i].pid, getpid()); /* alive, watching nobody */
    cr_assert_eq(ok(&old, ask(&old, "exec")), 0);
    start(&imp, "importer", NULL);
    import(&imp, &b, 1);
    free_exported(&exp, &b);
    cr_assert(eq(u64, phys(), 16 * MIB), "the new importer found no slot");
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        if (atomic_load(&f->importers[i].pid) == getpid())
            atomic_store(&f->importers[i].pid, 0);
    munmap(f, sizeof(*f));
    finish(&imp);
    finish(&old);
    finish(&exp);
}

Test(ghost, importer_without_a_helper_thread_is_as_without_the_ledger, .timeout = 15)
{
    /* When the helper thread cannot be created (a pids limit), the importer gives its slot back (one of 64) and asks no exporter to ring it: frees do not wait, and its caps alone bound what it keeps. */
    struct peer exp, imp;
    start_pair_unwaited(&exp, &imp);
    struct exported e = export(&exp, 16 * MIB);
    cr_assert_eq(ok(&imp, ask(&imp, "deny_threads")), 0);
    int idx = import(&imp, &e, 1);
    struct ipcc_ledger_file *f = map_ledger(0);
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        cr_assert_neq(atomic_load(&f->importers[i].pid), imp.pid, "it holds slot %d in vain", i);
    munmap(f, sizeof(*f));
    free_exported(&exp, &e);
    cr_assert_eq(ok(&imp, ask(&imp, "refs %d", idx)), 1, "kept, as without the ledger");
    cr_assert_eq(finish(&imp), 0);
    cr_assert(eq(u64, phys(), 0), "the importer's exit gives it back");
    finish(&exp);
    char err[4096];
    cr_assert_not_null(strstr(stderr_of("importer", err, sizeof(err)),
                              "ipccache: cannot start the release helper thread"), "%s", err);
}

Test(ghost, importer_beyond_the_slots_is_as_without_the_ledger, .timeout = 15)
{
    /* With all 64 importer slots held by live processes, one more importer says so once and is as without the ledger: frees do not wait for it. */
    struct peer exp, imp;
    start_pair_unwaited(&exp, &imp);
    struct exported e = export(&exp, 16 * MIB);
    struct ipcc_ledger_file *f = map_ledger(1);
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        atomic_store(&f->importers[i].pid, getpid());
    int idx = import(&imp, &e, 1);
    free_exported(&exp, &e);
    cr_assert_eq(ok(&imp, ask(&imp, "refs %d", idx)), 1, "kept, as without the ledger");
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        atomic_store(&f->importers[i].pid, 0);
    munmap(f, sizeof(*f));
    finish(&imp);
    finish(&exp);
    char err[4096];
    cr_assert_not_null(strstr(stderr_of("importer", err, sizeof(err)),
                              "ipccache: release ledger: all 64 importer slots are held"),
                       "%s", err);
}

/* ---- a helper thread that has not run yet ---------------------------------- */

/* An importer whose release helper, once created, is held before it runs
 * any of the library's code until "release_helper" (helper_hold_lib.c);
 * with create_ms, creating it takes that long besides (NULL: no longer than
 * it takes). */
static void start_held_importer_slowly(struct peer *imp, const char *create_ms)
{
    const char *prefix = getenv("IPCC_TEST_PRELOAD_PREFIX");
    start(imp, "importer",
          ENV(format("LD_PRELOAD=%s%s%s/tests/libhelperhold.so:%s/libipccache.so",
                     prefix && *prefix ? prefix : "", prefix && *prefix ? ":" : "", build_dir,
                     build_dir),
              create_ms ? format("HELPER_HOLD_CREATE_MS=%s", create_ms) : NULL));
}

static void start_held_importer(struct peer *imp)
{
    start_held_importer_slowly(imp, NULL);
}

/* The ledger slot pid holds. */
static int slot_of(struct ipcc_ledger_file *f, pid_t pid)
{
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        if (atomic_load(&f->importers[i].pid) == pid)
            return i;
    cr_fatal("process %d holds no ledger slot", (int)pid);
}

/* Whether a request of exporter pid is posted that asks slot. */
static int asked(struct ipcc_ledger_file *f, pid_t pid, int slot)
{
    for (int r = 0; r < IPCC_LEDGER_REQUESTS; r++) {
        struct ipcc_ledger_request *q = &f->requests[r];
        if (IPCC_REQ_STATE(atomic_load(&q->state)) == IPCC_REQ_POSTED &&
            atomic_load(&q->pid) == pid && (atomic_load(&q->expected) >> slot & 1))
            return 1;
    }
    return 0;
}

Test(ghost, first_miss_does_not_wait_for_the_helper_to_start, .timeout = 15)
{
    /* The first cached miss starts the helper thread but returns before it ran (held here until then), without going to sleep for it: without the library a miss is one driver call. */
    struct peer exp, imp;
    start(&exp, "exporter", NULL);
    start_held_importer(&imp);
    struct exported e = export(&exp, 16 * MIB);
    cr_assert_eq(ok(&imp, ask(&imp, "held_waits")), -1, "a thread was held before the miss");
    int idx = import(&imp, &e, 0);
    long long waits = ok(&imp, ask(&imp, "held_waits"));
    cr_assert_neq(waits, -1, "the miss started no helper thread (or it was not held)");
    cr_assert_eq(waits, 0, "the miss went to sleep %lld times for its helper", waits);
    cr_assert_eq(ok(&imp, ask(&imp, "close %d", idx)), CUDA_SUCCESS);
    cr_assert_eq(ok(&imp, ask(&imp, "release_helper")), 0);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 0), "the helper, started late, did not let go");
    cr_assert_eq(finish(&imp), 0);
    cr_assert_eq(finish(&exp), 0);
}

Test(ghost, first_misses_of_two_threads_at_once_are_both_let_go_at_the_exporters_death, .timeout = 40)
{
    /* Two threads' first misses meet while the first of them registers the process in the ledger and starts its helper (made slow here): both mappings are remembered as the exporter's, and both idle ones are let go of once it dies (the old code dropped the record of every miss made while the registration was under way, and kept those mappings of a dead exporter while the importer lived: the quick soak's pinned pool). */
    struct peer exp, imp;
    start(&exp, "exporter", NULL);
    start_held_importer_slowly(&imp, "300");
    struct exported a = export(&exp, 8 * MIB), b = export(&exp, 16 * MIB);
    cr_assert_eq(ok(&imp, ask(&imp, "open_together %s %s", a.hex, b.hex)), CUDA_SUCCESS);
    cr_assert_eq(ok(&imp, ask(&imp, "release_helper")), 0);
    kill_peer(&exp);
    cr_assert(eq(u64, phys_settles_at(0), 0), "a dead exporter's idle mapping is kept");
    finish(&imp);
}

Test(ghost, free_waits_for_a_helper_that_has_not_run_yet, .timeout = 40)
{
    /* An exporter frees while the importer's helper thread exists but has not run yet: the free asks that importer and waits for it (as for a slow helper), and the idle mapping is closed before the free returns. */
    struct peer exp, imp;
    start(&exp, "exporter", NULL);
    start_held_importer(&imp);
    struct exported e = export(&exp, 32 * MIB);
    import(&imp, &e, 1);
    struct ipcc_ledger_file *f = map_ledger(0);
    int slot = slot_of(f, imp.pid);
    char cmd[64];
    int n = snprintf(cmd, sizeof(cmd), "free %d\n", e.idx);
    cr_assert_eq(write(exp.in, cmd, (size_t)n), n); /* its reply comes after the helper's answer */
    struct pollfd done = { exp.out, POLLIN, 0 };
    while (!asked(f, exp.pid, slot))
        cr_assert_eq(poll(&done, 1, 1), 0, "the free returned without asking the importer");
    munmap(f, sizeof(*f));
    cr_assert_eq(ok(&imp, ask(&imp, "release_helper")), 0);
    cr_assert_eq(ok(&exp, reply_to(&exp, cmd, n - 1)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 0), "the importer's idle mapping still pins the memory");
    cr_assert_eq(finish(&imp), 0);
    cr_assert_eq(finish(&exp), 0);
}

Test(ghost, exec_before_the_helper_ran_is_not_waited_for, .timeout = 15)
{
    /* An importer exec()s while its helper thread has never run: the exec ends that thread, and frees do not wait for the importer (waiting the 60 s bound would time the test out). */
    struct peer exp, imp;
    start(&exp, "exporter", ENV("IPCCACHE_RELEASE_WAIT_MS=60000"));
    start_held_importer(&imp);
    struct exported e = export(&exp, 16 * MIB);
    import(&imp, &e, 1);
    cr_assert_eq(ok(&imp, ask(&imp, "exec")), 0);
    free_exported(&exp, &e);
    finish(&imp);
    finish(&exp);
}

/* Peers started from now on join the namespaces of this process (0: none). */
static pid_t join_ns;

/* In start()'s child, before exec: joins join_ns's user and mount
 * namespaces (a fork child is single-threaded, as setns wants). */
static int enter_join_ns(void)
{
    char user[64], mnt[64];
    if (!join_ns)
        return 0;
    snprintf(user, sizeof(user), "/proc/%d/ns/user", (int)join_ns);
    snprintf(mnt, sizeof(mnt), "/proc/%d/ns/mnt", (int)join_ns);
    int u = open(user, O_RDONLY | O_CLOEXEC), m = open(mnt, O_RDONLY | O_CLOEXEC);
    return u < 0 || m < 0 || setns(u, CLONE_NEWUSER) != 0 || setns(m, CLONE_NEWNS) != 0 ? -1 : 0;
}

static int write_text(const char *file, const char *text)
{
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    ssize_t n = (ssize_t)strlen(text);
    int ok = fd >= 0 && write(fd, text, (size_t)n) == n;
    if (fd >= 0)
        close(fd);
    return ok ? 0 : -1;
}

/* The holder: a private user and mount namespace with a full tmpfs of one
 * page at dir; stays until killed. 0 on the pipe when ready, else errno. */
static void hold_full_tmpfs(const char *dir, int ready)
{
    char uid[32], gid[32], opts[32];
    snprintf(uid, sizeof(uid), "%d %d 1", (int)getuid(), (int)getuid());
    snprintf(gid, sizeof(gid), "%d %d 1", (int)getgid(), (int)getgid());
    snprintf(opts, sizeof(opts), "size=%d,mode=0700", (int)sysconf(_SC_PAGESIZE));
    int err = 0;
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0 ||
        write_text("/proc/self/setgroups", "deny") != 0 ||
        write_text("/proc/self/uid_map", uid) != 0 || write_text("/proc/self/gid_map", gid) != 0 ||
        mount("none", dir, "tmpfs", 0, opts) != 0)
        err = errno;
    char filler[PATH_MAX];
    snprintf(filler, sizeof(filler), "%s/filler", dir);
    int fd = err ? -1 : open(filler, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    static const char block[4096];
    while (fd >= 0 && write(fd, block, sizeof(block)) > 0)
        ;
    unsigned char answer = (unsigned char)(err ? err : fd < 0 ? EIO : 0);
    if (write(ready, &answer, 1) != 1 || answer)
        _exit(1);
    for (;;)
        pause();
}

/* A full file system at dir that the next peers see; an errno when this
 * machine allows no private namespace. */
static int full_tmpfs_for_peers(const char *dir)
{
    int ready[2];
    unsigned char answer = EIO;
    cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        hold_full_tmpfs(dir, ready[1]);
    }
    track(pid);
    close(ready[1]);
    if (read(ready[0], &answer, 1) != 1)
        answer = EIO;
    close(ready[0]);
    join_ns = answer ? 0 : pid;
    return answer;
}

static int count_of(const char *haystack, const char *needle)
{
    int n = 0;
    for (const char *p = haystack; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

Test(ghost, full_file_system_is_as_without_the_ledger, .timeout = 40)
{
    /* On a full per-user file system the ledger cannot get its blocks: one info line, no SIGBUS, and frees and caches work as without the ledger. */
    char *full = format("%s/full", tmpdir);
    cr_assert_eq(mkdir(full, 0700), 0);
    int refused = full_tmpfs_for_peers(full);
    if (refused)
        cr_skip_test("cannot mount a small tmpfs in a private namespace here: %s",
                     strerror(refused));
    struct peer exp, imp;
    const char *const env[] = { format("XDG_RUNTIME_DIR=%s", full), "IPCCACHE_LOG=info", NULL };
    start(&exp, "exporter", env);
    start(&imp, "importer", env);
    struct exported e = export(&exp, 16 * MIB);
    int idx = import(&imp, &e, 1);
    free_exported(&exp, &e);
    cr_assert_eq(ok(&imp, ask(&imp, "refs %d", idx)), 1, "kept, as without the ledger");
    cr_assert_eq(finish(&imp), 0);
    cr_assert_eq(finish(&exp), 0);
    char err[4096];
    const char *said = "ipccache: release ledger " IPCC_LEDGER_NAME " not used (No space";
    cr_assert_eq(count_of(stderr_of("exporter", err, sizeof(err)), said), 1, "%s", err);
    cr_assert_eq(count_of(stderr_of("importer", err, sizeof(err)), said), 1, "%s", err);
    join_ns = 0;
    free((char *)env[0]);
    free(full);
}

/* ---- the VMM path (PyTorch's expandable segments) -------------------------- */

/* An allocation exported to an fd: its index in the exporter, where to take the fd from. */
struct vmm_exported {
    int idx, pid, fd;
    uint64_t bytes;
};

static struct vmm_exported vmm_export(struct peer *p, uint64_t bytes)
{
    struct vmm_exported e = { .bytes = bytes };
    const char *r = ask(p, "vmm_alloc %llu", (unsigned long long)bytes);
    cr_assert_eq(sscanf(r, "ok %d %d %d", &e.idx, &e.pid, &e.fd), 3, "vmm_alloc replied \"%s\"", r);
    return e;
}

/* The consumer's rebuild (and with close, its release: cached, idle); its index. */
static int vmm_import(struct peer *p, const struct vmm_exported *e, int close)
{
    int idx = (int)ok(p, ask(p, "vmm_open %d %d %llu", e->pid, e->fd,
                             (unsigned long long)e->bytes));
    if (close)
        cr_assert_eq(ok(p, ask(p, "vmm_close %d", idx)), CUDA_SUCCESS);
    return idx;
}

static void vmm_release(struct peer *p, const struct vmm_exported *e)
{
    cr_assert_eq(ok(p, ask(p, "vmm_release %d", e->idx)), CUDA_SUCCESS);
}

/* The stats line a peer wrote at exit to <tmpdir>/<name>.stats. */
static char *stats_of(const char *name, char *buf, size_t cap)
{
    char *path = format("%s/%s.stats", tmpdir, name);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no stats at %s", path);
    cr_assert_not_null(fgets(buf, (int)cap, f));
    fclose(f);
    free(path);
    return buf;
}

/* An exporter, and an importer that writes its stats line at exit to
 * <tmpdir>/importer.stats (stats_of reads it). */
static void start_counted_pair(struct peer *exp, struct peer *imp)
{
    start(exp, "exporter", NULL);
    start(imp, "importer", ENV("IPCCACHE_STATS_AT_EXIT=1",
                               format("IPCCACHE_STATS_FILE=%s/importer.stats", tmpdir)));
}

/* ---- both kinds: the same outcome for a legacy handle and a VMM export ---- */

/* A kind by index: Criterion copies a parameter into the test's own process,
 * where an index means the same and a pointer, under ASLR, would not. */
enum { LEGACY, VMM };

static struct criterion_test_params both_kinds(void)
{
    static int kinds[] = { LEGACY, VMM };
    return cr_make_param_array(int, kinds, 2);
}
/* The test "name" runs once for each kind. */
#define BOTH_KINDS(name) \
    ParameterizedTestParameters(ghost, name) { return both_kinds(); }

/* An allocation of either kind, exported: alloc/open/close/free for legacy,
 * vmm_alloc/vmm_open/vmm_close/vmm_release for VMM. */
struct either {
    int kind;
    struct exported legacy;
    struct vmm_exported vmm;
};

static struct either export_by(int kind, struct peer *p, uint64_t bytes)
{
    struct either e = { .kind = kind };
    if (kind == VMM)
        e.vmm = vmm_export(p, bytes);
    else
        e.legacy = export(p, bytes);
    return e;
}

static int import_by(struct peer *p, const struct either *e, int close)
{
    return e->kind == VMM ? vmm_import(p, &e->vmm, close) : import(p, &e->legacy, close);
}

static void close_by(struct peer *p, const struct either *e, int idx)
{
    cr_assert_eq(ok(p, ask(p, e->kind == VMM ? "vmm_close %d" : "close %d", idx)), CUDA_SUCCESS);
}

static void free_by(struct peer *p, const struct either *e)
{
    if (e->kind == VMM)
        vmm_release(p, &e->vmm);
    else
        free_exported(p, &e->legacy);
}

BOTH_KINDS(idle_import_lets_go_before_the_free_returns)

ParameterizedTest(int *kind, ghost, idle_import_lets_go_before_the_free_returns, .timeout = 40)
{
    /* An importer's idle cached mapping (VMM: import, reservation and mapping) is closed before the exporter's free (cuMemRelease) returns, so the bytes come back. */
    struct peer exp, imp;
    start_counted_pair(&exp, &imp);
    struct either e = export_by(*kind, &exp, 64 * MIB);
    import_by(&imp, &e, 1);
    cr_assert(eq(u64, phys(), 64 * MIB));
    if (*kind == VMM)
        cr_assert_eq(threads_of(imp.pid), 2, "no helper thread answers for the importer");
    free_by(&exp, &e);
    cr_assert(eq(u64, phys(), 0), "the importer's idle mapping still pins the memory");
    cr_assert_eq(finish(&imp), 0);
    cr_assert_eq(finish(&exp), 0);
    char stats[4096];
    stats_of("importer", stats, sizeof(stats));
    cr_assert_not_null(strstr(stats, "\"releases_on_request\":1,"), "%s", stats);
    cr_assert_not_null(strstr(stats, "\"ghost_bytes\":0,"), "%s", stats);
}

BOTH_KINDS(live_import_keeps_the_memory_until_its_close)

ParameterizedTest(int *kind, ghost, live_import_keeps_the_memory_until_its_close, .timeout = 40)
{
    /* A mapping still in use keeps the memory, as without the cache, and its own close (VMM: release) really gives it back. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct either e = export_by(*kind, &exp, 64 * MIB);
    int idx = import_by(&imp, &e, 0);
    free_by(&exp, &e);
    cr_assert(eq(u64, phys(), 64 * MIB));
    close_by(&imp, &e, idx);
    cr_assert(eq(u64, phys(), 0), "the close after the free left the mapping cached");
    finish(&imp);
    finish(&exp);
}

BOTH_KINDS(dead_importer_is_not_waited_for)

ParameterizedTest(int *kind, ghost, dead_importer_is_not_waited_for, .timeout = 15)
{
    /* A killed importer is skipped: the free returns at once (waiting the 60 s bound would time the test out). */
    struct peer exp, imp;
    start_pair(&exp, &imp, ENV("IPCCACHE_RELEASE_WAIT_MS=60000"));
    struct either e = export_by(*kind, &exp, 16 * MIB);
    import_by(&imp, &e, 1);
    kill_peer(&imp);
    free_by(&exp, &e);
    cr_assert(eq(u64, phys(), 0));
    finish(&exp);
}

BOTH_KINDS(exec_importer_is_not_waited_for)

ParameterizedTest(int *kind, ghost, exec_importer_is_not_waited_for, .timeout = 15)
{
    /* An importer that exec()s keeps its pid and start time but loses its helper thread (its slot kept): the exporter's frees do not wait for it, one after another. */
    struct peer exp, imp;
    start_pair_unwaited(&exp, &imp);
    struct either a = export_by(*kind, &exp, 16 * MIB), b = export_by(*kind, &exp, 16 * MIB);
    import_by(&imp, &a, 1);
    import_by(&imp, &b, 1);
    cr_assert_eq(ok(&imp, ask(&imp, "exec")), 0);
    free_by(&exp, &a);
    free_by(&exp, &b);
    finish(&imp);
    finish(&exp);
}

BOTH_KINDS(exporter_exit_releases_from_the_helper)

ParameterizedTest(int *kind, ghost, exporter_exit_releases_from_the_helper, .timeout = 40)
{
    /* Without any further miss, the importer's helper thread notices the dead exporter on its own and lets go of its idle mappings of it. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct either e = export_by(*kind, &exp, 64 * MIB);
    import_by(&imp, &e, 1);
    kill_peer(&exp);
    cr_assert(eq(u64, phys_settles_at(0), 0));
    finish(&imp);
}

/* Polls until the stand-in says pid maps nothing (an importer's helper lets
 * go of an exited exporter's idle mappings on its own schedule). */
static uint64_t held_by_settles_at_zero(pid_t pid)
{
    struct fakecuda_held h;
    long long deadline = now_ms() + 20000;
    for (fakecuda_phys_held(pid, &h); h.allocs && now_ms() < deadline; fakecuda_phys_held(pid, &h))
        usleep(10000);
    return h.allocs;
}

/* The driver maps an exited exporter's handle only in a process that maps it
 * already (H200, driver 580: tests/gpu/exporter_exit.c): one that holds it
 * opens it again; a fresh importer, and one that closed its last reference,
 * are refused (CUDA_ERROR_INVALID_HANDLE) while another importer keeps the
 * memory. The stand-in does so with its book; the library answers the same
 * once it let go of its idle mapping. env: the peers' extra environment. */
static void exited_exporters_handle_opens_only_where_mapped(const char *const *env)
{
    struct peer exp, holder, closer, fresh;
    start(&exp, "exporter", env);
    start(&holder, "holder", env);
    start(&closer, "closer", env);
    struct exported e = export(&exp, 16 * MIB);
    int held = import(&holder, &e, 0);
    import(&closer, &e, 1);
    kill_peer(&exp);
    cr_assert_eq(held_by_settles_at_zero(closer.pid), 0, "the closer still maps the handle");
    start(&fresh, "fresh", env);
    char want[32];
    snprintf(want, sizeof(want), "err %d", (int)CUDA_ERROR_INVALID_HANDLE);
    cr_assert_str_eq(ask(&fresh, "open %s", e.hex), want, "a fresh importer");
    cr_assert_str_eq(ask(&closer, "open %s", e.hex), want, "the importer that closed it");
    int again = import(&holder, &e, 0);
    cr_assert_eq(ok(&holder, ask(&holder, "close %d", again)), CUDA_SUCCESS);
    cr_assert_eq(ok(&holder, ask(&holder, "close %d", held)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys_settles_at(0), 0));
    finish(&fresh);
    finish(&closer);
    finish(&holder);
}

Test(ghost, exited_exporters_handle_opens_only_where_mapped_without_the_library, .timeout = 40)
{
    static const char *const without[] = { "LD_PRELOAD=", NULL };
    exited_exporters_handle_opens_only_where_mapped(without);
}

Test(ghost, exited_exporters_handle_opens_only_where_mapped, .timeout = 40)
{
    exited_exporters_handle_opens_only_where_mapped(NULL);
}

/* The importer's stats line (written at its exit) shows value for key. */
static void importer_stat_is(const char *key, uint64_t value)
{
    char stats[4096], *want = format("\"%s\":%llu,", key, (unsigned long long)value);
    stats_of("importer", stats, sizeof(stats));
    cr_assert_not_null(strstr(stats, want), "%s", stats);
    free(want);
}

/* The stats key that counts a kind's import hits. */
static const char *const hits_key[] = { [LEGACY] = "hits", [VMM] = "vmm_import_hits" };

#define MANY_LIVE 100

Test(ghost, many_live_imports_go_at_their_close_after_the_free, .timeout = 60)
{
    /* A weight sync holds a few hundred handles when the trainer frees them all (a re-share, a reset, its end): each import still in use keeps its memory until its own close, which really gives it back, however many there are (the old code remembered 64 and kept the rest mapped while the importer lived). */
    struct peer exp, imp;
    start_counted_pair(&exp, &imp);
    struct exported e[MANY_LIVE];
    int idx[MANY_LIVE];
    for (int i = 0; i < MANY_LIVE; i++) {
        e[i] = export(&exp, MIB);
        idx[i] = import(&imp, &e[i], 0);
    }
    for (int i = 0; i < MANY_LIVE; i++)
        free_exported(&exp, &e[i]);
    cr_assert(eq(u64, phys(), MANY_LIVE * MIB));
    for (int i = 0; i < MANY_LIVE; i++)
        cr_assert_eq(ok(&imp, ask(&imp, "close %d", idx[i])), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 0), "closes after the free left mappings cached");
    cr_assert_eq(finish(&imp), 0);
    finish(&exp);
    importer_stat_is("ghost_bytes", 0);
}

Test(ghost, doomed_mapping_is_not_lent, .timeout = 40)
{
    /* A thread that opens and closes one handle again and again is lent its entry (its hits take no lock); once the exporter freed the allocation while that thread still used it, a hit of it is not lent again, so the thread's last close really closes it. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 8 * MIB);
    for (int i = 0; i < 16; i++)
        import(&imp, &e, 1);
    int held = import(&imp, &e, 0);
    free_exported(&exp, &e);
    cr_assert(eq(u64, phys(), 8 * MIB));
    for (int i = 0; i < 16; i++)
        import(&imp, &e, 1);
    cr_assert_eq(ok(&imp, ask(&imp, "close %d", held)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 0), "the last close after the free left the mapping cached");
    finish(&imp);
    finish(&exp);
}

Test(ghost, standin_book_survives_a_signal_during_its_lock, .timeout = 40)
{
    /* The stand-in's book of physical memory is the soak's measure: an update that waits for the book's lock while the library's stats signal arrives (a handler without SA_RESTART: the wait fails with EINTR) still happens. The old stand-in dropped it, and the soak saw importers map 256 MiB pools the library had closed. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported e = export(&exp, 8 * MIB);
    int idx = import(&imp, &e, 0);
    free_exported(&exp, &e);
    char *path = format("%s/phys", getenv("FAKECUDA_PHYS_DIR"));
    int book = open(path, O_RDWR | O_CLOEXEC);
    free(path);
    cr_assert_geq(book, 0);
    cr_assert_eq(flock(book, LOCK_EX), 0);
    cr_assert_gt(dprintf(imp.in, "close %d\n", idx), 0);
    usleep(200000); /* the close waits for the book now */
    cr_assert_eq(kill(imp.pid, SIGUSR1), 0);
    usleep(200000);
    cr_assert_eq(flock(book, LOCK_UN), 0);
    close(book);
    cr_assert_eq(ok(&imp, reply_to(&imp, "close", 1)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 0), "the stand-in's book lost the unmap");
    finish(&imp);
    finish(&exp);
}

/* The next test's second thread: opens handle in ctx and holds it until told. */
struct holding_open { CUcontext ctx; CUipcMemHandle handle; CUresult rc; CUdeviceptr p; };

static void *open_and_hold(void *arg)
{
    struct holding_open *o = arg;
    cuCtxSetCurrent(o->ctx);
    o->rc = cuIpcOpenMemHandle(&o->p, o->handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    return NULL;
}

Test(ghost, standin_book_keeps_updates_of_two_threads, .timeout = 60)
{
    /* The book's lock is a flock, which the threads of one process share (one open file
     * description): a legacy map (under the stand-in's lock) and a VMM import (under its VMM lock)
     * in two threads updated the book at once, and both took the same free row: one update was
     * lost. The soak measures what each process maps by this book. */
    struct peer exp;
    start(&exp, "exporter", NULL);
    struct exported e = export(&exp, MIB);
    struct holding_open legacy;
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        cr_assert_eq(sscanf(e.hex + 2 * i, "%2hhx", (unsigned char *)&legacy.handle.reserved[i]), 1);
    CUdevice dev;
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    cr_assert_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    cr_assert_eq(cuDevicePrimaryCtxRetain(&legacy.ctx, dev), CUDA_SUCCESS);
    cr_assert_eq(cuCtxSetCurrent(legacy.ctx), CUDA_SUCCESS);
    CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
                                 .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
    CUmemGenericAllocationHandle made, imported;
    int fd = -1;
    cr_assert_eq(cuMemCreate(&made, FAKEVMM_GRANULARITY, &prop, 0), CUDA_SUCCESS);
    cr_assert_eq(cuMemExportToShareableHandle(&fd, made, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_SUCCESS);
    setenv("FAKECUDA_PHYS_NOTE_DELAY_US", "300000", 1); /* each update long: they would overlap */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, open_and_hold, &legacy), 0);
    usleep(100000);
    cr_assert_eq(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CUDA_SUCCESS);
    pthread_join(t, NULL);
    unsetenv("FAKECUDA_PHYS_NOTE_DELAY_US");
    cr_assert_eq(legacy.rc, CUDA_SUCCESS);
    struct fakecuda_held held;
    fakecuda_phys_held(getpid(), &held);
    cr_assert_eq(held.allocs, 2, "the book counts %llu of the 2 allocations mapped here",
                 (unsigned long long)held.allocs);
    cr_assert_eq(cuIpcCloseMemHandle(legacy.p), CUDA_SUCCESS);
    cr_assert_eq(cuMemRelease(imported), CUDA_SUCCESS);
    cr_assert_eq(cuMemRelease(made), CUDA_SUCCESS);
    close(fd);
    fakecuda_phys_held(getpid(), &held);
    cr_assert_eq(held.allocs, 0);
    finish(&exp);
}

BOTH_KINDS(idle_import_is_still_a_hit_before_the_free)

ParameterizedTest(int *kind, ghost, idle_import_is_still_a_hit_before_the_free, .timeout = 40)
{
    /* Until the exporter frees (VMM: releases), the importer's second open (VMM: rebuild) of it is served from the cache. */
    struct peer exp, imp;
    start_counted_pair(&exp, &imp);
    struct either e = export_by(*kind, &exp, 8 * MIB);
    import_by(&imp, &e, 1);
    import_by(&imp, &e, 1);
    free_by(&exp, &e);
    cr_assert(eq(u64, phys(), 0));
    cr_assert_eq(finish(&imp), 0);
    finish(&exp);
    importer_stat_is(hits_key[*kind], 1);
}

/* A counted pair (start_counted_pair) where the importer still maps 64 MiB
 * of an allocation the exporter freed (VMM: released): a ghost. */
static void start_with_a_ghost(int kind, struct peer *exp, struct peer *imp)
{
    start_counted_pair(exp, imp);
    struct either e = export_by(kind, exp, 64 * MIB);
    import_by(imp, &e, 0);
    free_by(exp, &e);
    cr_assert(eq(u64, phys(), 64 * MIB));
}

BOTH_KINDS(live_import_is_counted_in_ghost_bytes)

ParameterizedTest(int *kind, ghost, live_import_is_counted_in_ghost_bytes, .timeout = 40)
{
    /* An import still mapped when its exporter frees (VMM: releases) is in the stats line's ghost_bytes. */
    struct peer exp, imp;
    start_with_a_ghost(*kind, &exp, &imp);
    cr_assert_eq(finish(&imp), 0);
    finish(&exp);
    importer_stat_is("ghost_bytes", 64 * MIB);
}

BOTH_KINDS(fork_child_of_importer_counts_no_ghost_bytes)

ParameterizedTest(int *kind, ghost, fork_child_of_importer_counts_no_ghost_bytes, .timeout = 40)
{
    /* The parent's import still mapped after its exporter freed (VMM: released) is the parent's ghost: a fork child's stats line counts none. */
    struct peer exp, imp;
    start_with_a_ghost(*kind, &exp, &imp);
    cr_assert_eq(ok(&imp, ask(&imp, "fork_exit")), 0);
    char stats[4096];
    stats_of("importer", stats, sizeof(stats));
    char *parent = format("\"pid\":%d,", (int)imp.pid);
    cr_assert_null(strstr(stats, parent), "not the child's line: %s", stats);
    free(parent);
    importer_stat_is("ghost_bytes", 0); /* the child's line */
    cr_assert_eq(finish(&imp), 0);
    finish(&exp);
}

BOTH_KINDS(helper_and_release_only_for_exporters_with_the_library)

ParameterizedTest(int *kind, ghost, helper_and_release_only_for_exporters_with_the_library,
                  .timeout = 40)
{
    /* An exporter without the library lists nothing: its importer starts no thread, and the idle import stays until the importer exits, as before; an import from an exporter with the library gets the importer its helper. */
    struct peer bare, exp, imp;
    start(&bare, "bare", ENV("LD_PRELOAD="));
    start_pair(&exp, &imp, NULL);
    struct either u = export_by(*kind, &bare, 16 * MIB), e = export_by(*kind, &exp, 2 * MIB);
    import_by(&imp, &u, 1);
    cr_assert_eq(threads_of(imp.pid), 1);
    free_by(&bare, &u);
    cr_assert(eq(u64, phys(), 18 * MIB));
    import_by(&imp, &e, 1);
    cr_assert_eq(threads_of(imp.pid), 2);
    free_by(&exp, &e);
    cr_assert(eq(u64, phys(), 16 * MIB),
              "the other exporter's free closed the bare one's idle import");
    finish(&imp);
    cr_assert(eq(u64, phys(), 0), "the importer's exit gives it back");
    finish(&exp);
    finish(&bare);
}

/* ---- the exporter's context teardown ---------------------------------------- */

/* The three ways an exporter's context dies with its allocations, by index
 * (as the kinds above). */
enum { PRIMARY_RESET, PRIMARY_RELEASE, CTX_DESTROY };
static const char *const teardown_cmd[] = {
    [PRIMARY_RESET] = "primary_reset",
    [PRIMARY_RELEASE] = "primary_release",
    [CTX_DESTROY] = "ctx_destroy",
};

static struct criterion_test_params each_teardown(void)
{
    static int ways[] = { PRIMARY_RESET, PRIMARY_RELEASE, CTX_DESTROY };
    return cr_make_param_array(int, ways, 3);
}
#define EACH_TEARDOWN(name) \
    ParameterizedTestParameters(ghost, name) { return each_teardown(); }

/* Makes current the context that way tears down: ghost_peer's setup made
 * the primary one current; cuCtxDestroy needs one of the exporter's own. */
static void enter_dying_context(struct peer *p, int way)
{
    if (way == CTX_DESTROY)
        cr_assert_eq(ok(p, ask(p, "ctx_create")), CUDA_SUCCESS);
}

static void tear_down(struct peer *p, int way)
{
    cr_assert_eq(ok(p, ask(p, "%s", teardown_cmd[way])), CUDA_SUCCESS);
}

EACH_TEARDOWN(teardown_without_the_library_frees_the_contexts_memory)

ParameterizedTest(int *way, ghost, teardown_without_the_library_frees_the_contexts_memory,
                  .timeout = 40)
{
    /* The stand-in, as the driver: a context's teardown frees what was allocated in it, and an importer's mapping keeps those bytes until it closes. */
    struct peer exp, imp;
    start(&exp, "exporter", ENV("LD_PRELOAD="));
    start(&imp, "importer", ENV("LD_PRELOAD="));
    enter_dying_context(&exp, *way);
    struct exported kept = export(&exp, 8 * MIB), e = export(&exp, 64 * MIB);
    int idx = import(&imp, &kept, 0);
    import(&imp, &e, 1);
    tear_down(&exp, *way);
    cr_assert(eq(u64, phys(), 8 * MIB), "the teardown did not free the context's allocations");
    cr_assert_eq(ok(&imp, ask(&imp, "close %d", idx)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 0));
    finish(&imp);
    finish(&exp);
}

EACH_TEARDOWN(teardown_lets_go_as_a_free_does)

ParameterizedTest(int *way, ghost, teardown_lets_go_as_a_free_does, .timeout = 40)
{
    /* The exporter's context teardown frees its exported allocations as a free of each would: the importer's idle cached mappings are closed before the call returns, so the bytes come back. */
    struct peer exp, imp;
    start_counted_pair(&exp, &imp);
    enter_dying_context(&exp, *way);
    struct exported a = export(&exp, 64 * MIB), b = export(&exp, 16 * MIB);
    import(&imp, &a, 1);
    import(&imp, &b, 1);
    cr_assert(eq(u64, phys(), 80 * MIB));
    tear_down(&exp, *way);
    cr_assert(eq(u64, phys(), 0), "the importer's idle mappings still pin the torn-down memory");
    cr_assert_eq(finish(&imp), 0);
    finish(&exp);
    importer_stat_is("releases_on_request", 2);
}

EACH_TEARDOWN(teardown_leaves_other_contexts_exports)

ParameterizedTest(int *way, ghost, teardown_leaves_other_contexts_exports, .timeout = 40)
{
    /* Exports made in another of the exporter's contexts stay cached in the importer through the teardown; their own free lets go of them later. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct exported first = export(&exp, 16 * MIB);
    cr_assert_eq(ok(&exp, ask(&exp, "ctx_create")), CUDA_SUCCESS);
    struct exported second = export(&exp, 32 * MIB);
    /* cuCtxDestroy ends the new context; a primary teardown, the first. */
    const struct exported *kept = *way == CTX_DESTROY ? &first : &second;
    const struct exported *dies = *way == CTX_DESTROY ? &second : &first;
    int kept_idx = import(&imp, kept, 1);
    import(&imp, dies, 1);
    tear_down(&exp, *way);
    cr_assert(eq(u64, phys(), kept == &first ? 16 * MIB : 32 * MIB));
    cr_assert_eq(ok(&imp, ask(&imp, "refs %d", kept_idx)), 1, "a live context's export was let go");
    free_exported(&exp, kept);
    cr_assert(eq(u64, phys(), 0));
    finish(&imp);
    finish(&exp);
}

Test(ghost, teardown_lets_go_of_more_exports_than_one_look_takes, .timeout = 60)
{
    /* A reset lets go of every export of its context, past the 64 the library takes off its table at a time. */
    enum { N = 70 };
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    for (int i = 0; i < N; i++) {
        struct exported e = export(&exp, MIB);
        import(&imp, &e, 1);
    }
    cr_assert(eq(u64, phys(), N * MIB));
    tear_down(&exp, PRIMARY_RESET);
    cr_assert(eq(u64, phys(), 0), "some idle mappings still pin the torn-down memory");
    finish(&imp);
    finish(&exp);
}

Test(ghost, teardown_past_the_library_is_caught_up_by_the_next_primary_one, .timeout = 40)
{
    /* A context destroyed past the library, its address taken by a new one: the next primary reset through the library finds its id gone and lets go of its exports. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    cr_assert_eq(ok(&exp, ask(&exp, "ctx_create")), CUDA_SUCCESS);
    struct exported e = export(&exp, 16 * MIB);
    import(&imp, &e, 1);
    cr_assert_eq(ok(&exp, ask(&exp, "ctx_destroy_direct")), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 16 * MIB), "unseen, the teardown cannot have let go");
    cr_assert_eq(ok(&exp, ask(&exp, "ctx_create")), CUDA_SUCCESS); /* at the dead one's address */
    tear_down(&exp, PRIMARY_RESET);
    cr_assert(eq(u64, phys(), 0), "the dead context's export was taken for the new one's");
    finish(&imp);
    finish(&exp);
}

Test(ghost, primary_release_that_is_not_the_last_lets_nothing_go, .timeout = 40)
{
    /* A release of the primary context that leaves it alive frees nothing: the importer keeps its idle mapping until the last release. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    cr_assert_eq(ok(&exp, ask(&exp, "primary_retain")), CUDA_SUCCESS);
    struct exported e = export(&exp, 16 * MIB);
    int idx = import(&imp, &e, 1);
    tear_down(&exp, PRIMARY_RELEASE);
    cr_assert(eq(u64, phys(), 16 * MIB));
    cr_assert_eq(ok(&imp, ask(&imp, "refs %d", idx)), 1, "a release that was not the last let go");
    tear_down(&exp, PRIMARY_RELEASE);
    cr_assert(eq(u64, phys(), 0));
    finish(&imp);
    finish(&exp);
}

Test(ghost, vmm_export_outlives_the_exporters_reset, .timeout = 40)
{
    /* A cuMemCreate allocation belongs to no context (the driver's documentation of cuCtxDestroy): the exporter's reset leaves it and the importer's idle import; the exporter's cuMemRelease lets go as before. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct vmm_exported e = vmm_export(&exp, 32 * MIB);
    vmm_import(&imp, &e, 1);
    tear_down(&exp, PRIMARY_RESET);
    cr_assert(eq(u64, phys(), 32 * MIB));
    vmm_release(&exp, &e);
    cr_assert(eq(u64, phys(), 0));
    finish(&imp);
    finish(&exp);
}

/* ---- the VMM path alone ---------------------------------------------------- */

Test(ghost, vmm_release_during_the_importers_teardown_leaves_its_free_working, .timeout = 40)
{
    /* The exporter releases while the importer tears its segment down (unmap, release, then address free: PyTorch's order) and the helper's unmap of the kept chunk is slow: the importer's address free in that unmap still succeeds, as without the library. */
    struct peer exp, imp;
    start(&exp, "exporter", NULL);
    start(&imp, "importer", ENV("FAKECUDA_VMM_SLOW_UNMAP_MS=300"));
    struct vmm_exported e = vmm_export(&exp, 8 * MIB);
    int idx = vmm_import(&imp, &e, 0);
    cr_assert_eq(ok(&imp, ask(&imp, "vmm_drop %d", idx)), CUDA_SUCCESS);
    char cmd[64];
    int n = snprintf(cmd, sizeof(cmd), "vmm_release %d\n", e.idx);
    cr_assert_eq(write(exp.in, cmd, (size_t)n), n); /* its reply comes after the helper's */
    cr_assert(eq(llong, ok(&imp, ask(&imp, "vmm_free_in_unmap %d", idx)), CUDA_SUCCESS),
              "the importer's cuMemAddressFree during the helper's unmap");
    cr_assert_eq(ok(&exp, reply_to(&exp, cmd, n - 1)), CUDA_SUCCESS);
    cr_assert(eq(u64, phys(), 0));
    cr_assert_eq(finish(&imp), 0);
    cr_assert_eq(finish(&exp), 0);
}

Test(ghost, vmm_refused_kcmp_across_processes_keeps_as_before, .timeout = 40)
{
    /* Where the importer may not compare the exporter's files, its idle import stays cached, as before. */
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    cr_assert_eq(ok(&imp, ask(&imp, "deny_cross_kcmp")), 0);
    struct vmm_exported e = vmm_export(&exp, 16 * MIB);
    vmm_import(&imp, &e, 1);
    vmm_import(&imp, &e, 1); /* kcmp on its own files works: still cached */
    vmm_release(&exp, &e);
    cr_assert(eq(u64, phys(), 16 * MIB));
    finish(&imp);
    cr_assert(eq(u64, phys(), 0));
    finish(&exp);
}

Test(ghost, vmm_each_export_is_told_apart, .timeout = 60)
{
    /* Imports of several exports, in and against export order, each go exactly when their own export is released. */
    enum { N = 4 };
    struct peer exp, imp;
    start_pair(&exp, &imp, NULL);
    struct vmm_exported e[N];
    for (int i = 0; i < N; i++)
        e[i] = vmm_export(&exp, (uint64_t)(i + 1) * 2 * MIB);
    static const int imported[N] = { 3, 2, 0, 1 }; /* the next export's fd is tried first */
    for (int k = 0; k < N; k++)
        vmm_import(&imp, &e[imported[k]], 1);
    uint64_t left = 20 * MIB;
    cr_assert(eq(u64, phys(), left));
    static const int order[N] = { 2, 0, 3, 1 };
    for (int k = 0; k < N; k++) {
        vmm_release(&exp, &e[order[k]]);
        left -= e[order[k]].bytes;
        cr_assert(eq(u64, phys(), left), "after releasing export %d", order[k]);
    }
    finish(&imp);
    finish(&exp);
}

/* How many of the ledger's export entries name pid and hold a listing (a
 * let-go entry is free to any new export). */
static int ledger_entries_of(pid_t pid)
{
    struct ipcc_ledger_file *f = map_ledger(0);
    int n = 0;
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++)
        n += atomic_load(&f->exports[i].pid) == pid &&
             atomic_load(&f->exports[i].ready) != IPCC_EXPORT_LET_GO;
    munmap(f, sizeof(*f));
    return n;
}

Test(ghost, vmm_import_miss_frees_a_killed_exporters_entries, .timeout = 40)
{
    /* An exporter killed with its exports listed: the next import miss that scans the ledger frees their entries, so later scans skip them. */
    struct peer killed, exp, imp;
    start(&killed, "killed", NULL);
    for (int i = 0; i < 3; i++)
        vmm_export(&killed, 2 * MIB);
    pid_t gone = killed.pid;
    cr_assert_eq(ledger_entries_of(gone), 3);
    kill_peer(&killed);
    start(&exp, "exporter", ENV("IPCCACHE_DISABLE=1")); /* lists nothing: the scan covers every entry */
    start(&imp, "importer", NULL);
    struct vmm_exported e = vmm_export(&exp, 2 * MIB);
    vmm_import(&imp, &e, 1);
    cr_assert_eq(ledger_entries_of(gone), 0, "the killed exporter's entries are still listed");
    finish(&imp);
    finish(&exp);
}

/* ---- an open refused in a second context ---------------------------------- */

Test(ghost, refused_open_closes_only_what_may_be_in_its_way, .timeout = 60)
{
    /* The driver lets one exporter's handles be open in one context per device: an open in a second context refused because the first still uses that handle closes the idle mappings that may be in its way (the same exporter's) and none of another exporter's, which cannot be (the old code closed every idle mapping of every other context). */
    enum { N = 8 };
    struct peer p, q, imp;
    start(&p, "exporter_p", NULL);
    start(&q, "exporter_q", NULL);
    start(&imp, "importer", NULL);
    for (int i = 0; i < N; i++) {
        struct exported e = export(&q, MIB);
        import(&imp, &e, 1);
    }
    struct exported used = export(&p, MIB), idle = export(&p, MIB);
    import(&imp, &used, 0);
    import(&imp, &idle, 1);
    cr_assert_eq(ok(&imp, ask(&imp, "unmaps")), 0);
    ok(&imp, ask(&imp, "ctx_new"));
    cr_assert_str_eq(ask(&imp, "open %s", used.hex), "err 400",
                     "the driver's refusal, as without the cache");
    long long closed = ok(&imp, ask(&imp, "unmaps"));
    cr_assert(eq(llong, closed, 1), "%lld idle mappings of the first context closed: only the "
                                    "same exporter's one may be in the way", closed);
    finish(&imp);
    finish(&q);
    finish(&p);
}

/* ---- re-exports and the ledger ------------------------------------------- */

BOTH_HANDLE_MODES(reexports_list_a_bounded_number_of_handles)

ParameterizedTest(int *mode, ghost, reexports_list_a_bounded_number_of_handles, .timeout = 60)
{
    /* An allocation exported 1,100 times lists at most the handles its exporter remembers (one on the H200, at most 8 with a handle per export), not one per export: the per-user ledger keeps room for every other process's exports, and the free unlists them all (the old code filled the ledger). */
    enum { REEXPORTS = 1100, REMEMBERED = 8 };
    struct peer exp, other;
    start(&exp, "exporter", ENV(handle_mode[*mode]));
    struct exported e = export(&exp, MIB);
    for (int i = 0; i < REEXPORTS; i++)
        reexport(&exp, &e, (uint64_t)(i % 4) * 4096);
    int listed = ledger_entries_of(exp.pid);
    cr_assert(le(int, listed, *mode == SAME_HANDLE ? 1 : REMEMBERED), "%d handles listed", listed);
    start(&other, "other", NULL);
    vmm_export(&other, 2 * MIB);
    cr_assert_eq(ledger_entries_of(other.pid), 1, "another process's export is not listed");
    free_exported(&exp, &e);
    cr_assert_eq(ledger_entries_of(exp.pid), 0);
    finish(&other);
    finish(&exp);
}
