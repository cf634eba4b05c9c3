/*
 * test_vmm_fds.c - the fds the VMM path keeps (a dup per cached import, its
 * identity) never make the program's own calls fail.
 *
 * PyTorch's consumer closes each received fd right after its import, so
 * without the cache a share held live costs it no fd per chunk; a program
 * at a low soft limit of open files (RLIMIT_NOFILE) holding more chunks than
 * that must still get its own open()s, with every import right.
 *
 * Each case runs in a child forked before any CUDA call that keeps only
 * stdin, stdout and the report pipe (as stderr and fd 3): a program's fds at
 * its start, not the test runner's. Its checks write to the pipe and exit.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "testutil.h"
#include "fake_vmm.h"
#include "gpu/vmm_pair.h"

#define G FAKEVMM_GRANULARITY
#define HELD 100   /* chunks held live: more than the limit */
#define OPENS 50   /* the program's own opens */
#define SHARE 8    /* the library keeps at most 1/8 of the soft limit (vmm_fds.c) */
#define REPORT 3   /* the child's report pipe */
#define MARKS 1    /* the library's epoll instance marking its dups (base/fdmark.c) */

/* ---- the child's checks ------------------------------------------------------ */

static void failed(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failed(int line, const char *fmt, ...)
{
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    if (write(REPORT, buf, (size_t)n) < 0)
        _exit(3);
    _exit(1);
}
#define CHECK(cond, ...) \
    do { \
        if (!(cond)) \
            failed(__LINE__, __VA_ARGS__); \
    } while (0)
#define CU(call) \
    do { \
        CUresult rc_ = (call); \
        CHECK(rc_ == CUDA_SUCCESS, "%s: %d", #call, (int)rc_); \
    } while (0)

static void set_soft_limit(rlim_t soft)
{
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_NOFILE, &r) == 0, "getrlimit");
    CHECK(r.rlim_max >= soft, "the hard limit is below %lu", (unsigned long)soft);
    r.rlim_cur = soft;
    CHECK(setrlimit(RLIMIT_NOFILE, &r) == 0, "setrlimit: %s", strerror(errno));
}

/* Open fds of this process now; -1 when none is left to count them with. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own */
}

static uint64_t real_imports(void)
{
    struct fakevmm_counters c;
    fakevmm_get_counters(&c);
    return c.imports;
}

static uint64_t real_releases(void)
{
    struct fakevmm_counters c;
    fakevmm_get_counters(&c);
    return c.releases;
}

/* The exporter's side, in process (the stand-in imports its own exports,
 * each a new open file description): one chunk, one fd. */
static int new_export(CUmemGenericAllocationHandle *made)
{
    CUmemAllocationProp prop = vmm_fd_prop();
    int fd = -1;
    CU(cuMemCreate(made, G, &prop, 0));
    CU(cuMemExportToShareableHandle(&fd, *made, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    return fd;
}

static CUmemGenericAllocationHandle import_fd(int fd)
{
    CUmemGenericAllocationHandle h = 0;
    CU(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    return h;
}

/* One chunk as the consumer gets it: the exporter's fd arrives (a dup, as
 * pidfd_getfd gives), is imported and closed at once. */
static CUmemGenericAllocationHandle import_received(int fd)
{
    int got = dup(fd);
    CHECK(got >= 0, "the program's dup failed: %s", strerror(errno));
    CUmemGenericAllocationHandle h = import_fd(got);
    close(got);
    return h;
}

/* A share of n chunks, each exported once, rebuilt by the consumer in one
 * reservation: made[] the exporter's handles, got[] the consumer's; fd[]
 * the exporter's fds, -1 once closed. */
struct share {
    int n;
    CUmemGenericAllocationHandle made[HELD], got[HELD];
    int fd[HELD];
    CUdeviceptr p;
};
static struct share share;

/* Which of its fds the exporter keeps open; the others it closes after
 * their import. */
enum keep { KEEP_NONE, KEEP_ALL, KEEP_ENDS };

/* The consumer rebuilds the share and holds it live. */
static void hold_live(struct share *s, int n, enum keep keep)
{
    s->n = n;
    CU(cuMemAddressReserve(&s->p, (size_t)n * G, 0, 0, 0));
    for (int i = 0; i < n; i++) {
        s->fd[i] = new_export(&s->made[i]);
        s->got[i] = import_received(s->fd[i]);
        if (keep == KEEP_NONE || (keep == KEEP_ENDS && i > 0 && i < n - 1)) {
            close(s->fd[i]);
            s->fd[i] = -1;
        }
        CU(cuMemMap(s->p + (CUdeviceptr)i * G, G, 0, s->got[i], 0));
    }
    CUmemAccessDesc d = vmm_rw_on(0);
    CU(cuMemSetAccess(s->p, (size_t)n * G, &d, 1));
}

/* Every import names its chunk's allocation, mapped where the program
 * mapped it. */
static void expect_values(const struct share *s)
{
    for (int i = 0; i < s->n; i++) {
        uint64_t pid, want, got, at;
        CHECK(fakevmm_handle_allocation(s->made[i], &pid, &want), "chunk %d: no allocation", i);
        CHECK(fakevmm_handle_allocation(s->got[i], &pid, &got), "chunk %d: no handle", i);
        CHECK(got == want, "chunk %d names another allocation", i);
        CHECK(fakevmm_allocation_at(s->p + (CUdeviceptr)i * G, &pid, &at), "chunk %d unmapped", i);
        CHECK(at == want, "chunk %d maps another allocation", i);
    }
}

/* The program's own opens, all successful; then closed. */
static void expect_own_opens(void)
{
    int own[OPENS];
    for (int k = 0; k < OPENS; k++) {
        own[k] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        CHECK(own[k] >= 0, "the program's open %d of %d failed: %s", k + 1, OPENS,
              strerror(errno));
    }
    for (int k = 0; k < OPENS; k++)
        close(own[k]);
}

/* The consumer's teardown and the exporter's: the driver's answers. */
static void drop_share(struct share *s)
{
    for (int i = 0; i < s->n; i++) {
        CU(cuMemUnmap(s->p + (CUdeviceptr)i * G, G));
        CU(cuMemRelease(s->got[i]));
        CU(cuMemRelease(s->made[i]));
        if (s->fd[i] >= 0)
            close(s->fd[i]);
    }
    CU(cuMemAddressFree(s->p, (size_t)s->n * G));
    struct fakevmm_counters c;
    fakevmm_get_counters(&c);
    CHECK(c.stale_handle_uses == 0, "a handle the driver no longer knows was passed");
}

/* n chunks imported and released at once, their fds closed: idle. */
static void import_idle(int n)
{
    for (int i = 0; i < n; i++) {
        CUmemGenericAllocationHandle made;
        int fd = new_export(&made);
        CU(cuMemRelease(import_fd(fd)));
        close(fd);
    }
}

/* ---- the parent's side ------------------------------------------------------ */

/* Runs fn in a fresh child as the file's comment says; returns what it
 * wrote to stderr and the report pipe; fails the test if it failed. */
static const char *in_child(void (*fn)(void))
{
    static char said[8192];
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (dup2(p[1], REPORT) < 0 || dup2(p[1], 2) < 0)
            _exit(3);
        for (int fd = REPORT + 1; fd < 4096; fd++)
            close(fd);
        fn();
        _exit(0);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(said) - 1 && (r = read(p[0], said + n, sizeof(said) - 1 - n)) > 0)
        n += (size_t)r;
    said[n] = 0;
    close(p[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the program failed (%#x): %s",
              status, said);
    return said;
}

/* ---- cases -------------------------------------------------------------------- */

/* At a soft limit of 64, 100 chunks held live: each a real import (as
 * without the cache), every value right, the program's 50 opens succeed. */
static void held_live_at_a_low_limit(void)
{
    CU(cuInit(0));
    set_soft_limit(64);
    uint64_t before = real_imports();
    hold_live(&share, HELD, KEEP_NONE);
    CHECK(real_imports() - before == HELD, "real imports %llu: each chunk is a new export",
          (unsigned long long)(real_imports() - before));
    expect_own_opens();
    expect_values(&share);
    drop_share(&share);
}

Test(vmm_fds, held_live_at_a_low_limit_without_the_cache, .timeout = 10)
{
    setenv("IPCCACHE_DISABLE", "1", 1);
    cr_assert_str_empty(in_child(held_live_at_a_low_limit));
}

Test(vmm_fds, held_live_at_a_low_limit, .timeout = 10)
{
    cr_assert_str_empty(in_child(held_live_at_a_low_limit));
}

/* Past the bound, the library says so once (at info). */
Test(vmm_fds, past_the_bound_said_once, .timeout = 10)
{
    setenv("IPCCACHE_LOG", "info", 1);
    const char *said = in_child(held_live_at_a_low_limit);
    const char *first = strstr(said, "ipccache: ");
    cr_assert_not_null(first, "nothing said");
    first = strstr(said, "VMM imports cached at once");
    cr_assert_not_null(first, "%s", said);
    cr_assert_null(strstr(first + 1, "VMM imports cached at once"), "said twice: %s", said);
}

/* The imports within the bound are cached: the first chunk's fd imported
 * again is a hit; the last one's, past the bound, a real import again. */
static void within_the_bound_hits(void)
{
    CU(cuInit(0));
    set_soft_limit(64);
    hold_live(&share, HELD, KEEP_ENDS);
    uint64_t before = real_imports();
    CUmemGenericAllocationHandle first = import_received(share.fd[0]);
    CHECK(first == share.got[0] && real_imports() == before, "the first chunk was not cached");
    CUmemGenericAllocationHandle last = import_received(share.fd[HELD - 1]);
    CHECK(last != share.got[HELD - 1] && real_imports() == before + 1,
          "the last chunk was cached past the bound");
    CU(cuMemRelease(first));
    CU(cuMemRelease(last));
    expect_values(&share);
    drop_share(&share);
}

Test(vmm_fds, imports_within_the_bound_hit, .timeout = 10)
{
    cr_assert_str_empty(in_child(within_the_bound_hits));
}

/* At the bound, idle imports give their fds up first: 8 idle (the bound
 * at 64), then 8 held live, each of which evicts one idle import and is
 * cached itself. */
static void idle_give_way(void)
{
    CU(cuInit(0));
    set_soft_limit(64);
    import_idle(64 / SHARE);
    uint64_t released = real_releases();
    hold_live(&share, 64 / SHARE, KEEP_ALL);
    CHECK(real_releases() - released == 64 / SHARE, "%llu idle imports released, not %d",
          (unsigned long long)(real_releases() - released), 64 / SHARE);
    uint64_t before = real_imports();
    for (int i = 0; i < share.n; i++) {
        CUmemGenericAllocationHandle h = import_received(share.fd[i]);
        CHECK(h == share.got[i], "live chunk %d is not cached", i);
        CU(cuMemRelease(h));
    }
    CHECK(real_imports() == before, "live imports missed");
    drop_share(&share);
}

Test(vmm_fds, idle_imports_give_their_fds_up_first, .timeout = 10)
{
    cr_assert_str_empty(in_child(idle_give_way));
}

/* A program that lowers its limit: the next import that misses sheds the
 * idle imports kept over the new bound (16 at 128, then 8 at 64), and the
 * program's opens succeed. */
static void lowered_limit(void)
{
    CU(cuInit(0));
    set_soft_limit(128);
    int at_start = open_fds();
    import_idle(128 / SHARE);
    CHECK(open_fds() - at_start - MARKS == 128 / SHARE, "%d fds kept, not %d",
          open_fds() - at_start - MARKS, 128 / SHARE);
    set_soft_limit(64);
    uint64_t released = real_releases();
    hold_live(&share, 1, KEEP_NONE);
    CHECK(real_releases() - released == 128 / SHARE - 64 / SHARE + 1,
          "%llu idle imports released", (unsigned long long)(real_releases() - released));
    CHECK(open_fds() - at_start - MARKS == 64 / SHARE, "%d fds kept, not %d",
          open_fds() - at_start - MARKS, 64 / SHARE);
    expect_own_opens();
    expect_values(&share);
    drop_share(&share);
}

Test(vmm_fds, a_lowered_limit_sheds_idle_fds, .timeout = 10)
{
    cr_assert_str_empty(in_child(lowered_limit));
}

/* The bound is exact: at a soft limit of 64, 12 imports held live keep 8
 * dups, not one more. */
static void bound_is_exact(void)
{
    CU(cuInit(0));
    set_soft_limit(64);
    int at_start = open_fds();
    hold_live(&share, 64 / SHARE + 4, KEEP_NONE);
    CHECK(open_fds() - at_start - MARKS == 64 / SHARE, "%d fds kept, not %d",
          open_fds() - at_start - MARKS, 64 / SHARE);
    drop_share(&share);
}

Test(vmm_fds, kept_no_more_than_the_bound, .timeout = 10)
{
    cr_assert_str_empty(in_child(bound_is_exact));
}

/* The kept dups are close-on-exec: a program's exec'd child inherits none
 * (it would keep the exporter's allocations referenced). Every fd past the
 * report pipe is the library's or the stand-in's. */
static void kept_close_on_exec(void)
{
    CU(cuInit(0));
    import_idle(4);
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL, "opendir: %s", strerror(errno));
    int kept = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd <= REPORT || fd == dirfd(d))
            continue;
        kept++;
        CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC, "fd %d is inherited across exec", fd);
    }
    closedir(d);
    CHECK(kept >= 4, "%d fds kept for 4 idle imports", kept);
}

Test(vmm_fds, kept_dups_are_close_on_exec, .timeout = 10)
{
    cr_assert_str_empty(in_child(kept_close_on_exec));
}

/* The number of the one kept dup (a socket, the stand-in's export): -1 if
 * there is none. */
static int kept_dup_number(void)
{
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL, "opendir: %s", strerror(errno));
    int found = -1;
    for (struct dirent *e; (e = readdir(d));) {
        char path[64], link[64];
        int fd = atoi(e->d_name);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        if (e->d_name[0] != '.' && fd > REPORT && n > 0 && (link[n] = 0, !strncmp(link, "socket:", 7)))
            found = fd;
    }
    closedir(d);
    return found;
}

/* A program that closes the library's fds (as a daemon closing every fd
 * does) and puts a file of its own at a kept dup's number keeps it: an
 * import of that file is the driver's, not a hit on what the number named
 * before, and the eviction of the import that kept the number (over a cap
 * of one idle import) leaves the program's file open. */
static void closed_by_the_program(void)
{
    CU(cuInit(0));
    CUmemGenericAllocationHandle first_made, later_made;
    int fd = new_export(&first_made);
    CU(cuMemRelease(import_fd(fd))); /* idle, its dup kept */
    close(fd);
    int number = kept_dup_number();
    CHECK(number > REPORT, "no kept dup");
    for (int other = REPORT + 1; other < 4096; other++)
        close(other);
    int theirs = new_export(&later_made); /* the program's own, at the kept number */
    CHECK(dup2(theirs, number) == number, "dup2: %s", strerror(errno));
    close(theirs);
    uint64_t before = real_imports();
    CUmemGenericAllocationHandle got = import_received(number);
    uint64_t pid, want, named;
    CHECK(fakevmm_handle_allocation(later_made, &pid, &want), "no allocation");
    CHECK(fakevmm_handle_allocation(got, &pid, &named), "no handle");
    CHECK(named == want && real_imports() == before + 1,
          "the import of the program's file was a hit on the number's old file");
    CU(cuMemRelease(got));
    import_idle(1); /* over the cap: the first import goes */
    struct stat st;
    CHECK(fstat(number, &st) == 0, "the program's fd %d was closed by an eviction", number);
    CU(cuMemRelease(later_made));
    close(number);
}

Test(vmm_fds, a_number_the_program_took_over_stays_its_own, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "1", 1);
    cr_assert_str_empty(in_child(closed_by_the_program));
}
