/*
 * test_vmm_fds.c - the fds the VMM path keeps (a dup per cached import, its
 * identity) never make the program's own calls fail.
 *
 * PyTorch's consumer closes each received fd right after its import, so
 * without the cache a share held live costs it no fd per chunk; a program
 * at a low soft limit of open files (RLIMIT_NOFILE) holding more chunks than
 * that must still get its own open()s, with every import right.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>

#include "vmm_testutil.h"
#include <criterion/redirect.h>

#define LOW_LIMIT 64
#define HELD 100   /* chunks held live: more than the limit */
#define OPENS 50   /* the program's own opens */

static void set_soft_limit(rlim_t soft)
{
    struct rlimit r;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &r), 0);
    cr_assert_geq(r.rlim_max, soft, "the hard limit is below %lu", (unsigned long)soft);
    r.rlim_cur = soft;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &r), 0);
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

/* One chunk as the consumer gets it: the exporter's fd arrives (a dup, as
 * pidfd_getfd gives), is imported and closed at once. */
static CUmemGenericAllocationHandle import_received(int fd)
{
    int got = dup(fd);
    cr_assert_geq(got, 0, "the program's dup failed: %s", strerror(errno));
    CUmemGenericAllocationHandle h = import(got);
    close(got);
    return h;
}

/* A share of n chunks, each exported once: made[] the exporter's handles;
 * keep_fds: the exporter's fds stay open (else closed after the import). */
struct share {
    int n;
    CUmemGenericAllocationHandle made[HELD], got[HELD];
    int fd[HELD];
    CUdeviceptr p;
};

/* The consumer rebuilds the share in one reservation and holds it live. */
static void hold_live(struct share *s, int n, int keep_fds)
{
    s->n = n;
    cr_assert_eq(cuMemAddressReserve(&s->p, (size_t)n * G, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < n; i++) {
        s->fd[i] = export_fd(s->made[i] = create());
        s->got[i] = import_received(s->fd[i]);
        if (!keep_fds) {
            close(s->fd[i]);
            s->fd[i] = -1;
        }
        cr_assert_eq(cuMemMap(s->p + (CUdeviceptr)i * G, G, 0, s->got[i], 0), CUDA_SUCCESS);
    }
    CUmemAccessDesc d = access_on(0);
    cr_assert_eq(cuMemSetAccess(s->p, (size_t)n * G, &d, 1), CUDA_SUCCESS);
}

/* Every import names its chunk's allocation, and is mapped where the
 * program mapped it. */
static void expect_values(const struct share *s)
{
    for (int i = 0; i < s->n; i++) {
        uint64_t pid, want, got, at;
        cr_assert(fakevmm_handle_allocation(s->made[i], &pid, &want));
        cr_assert(fakevmm_handle_allocation(s->got[i], &pid, &got), "chunk %d: no handle", i);
        cr_assert_eq(got, want, "chunk %d names another allocation", i);
        cr_assert(fakevmm_allocation_at(s->p + (CUdeviceptr)i * G, &pid, &at));
        cr_assert_eq(at, want, "chunk %d maps another allocation", i);
    }
}

/* The program's own opens, all successful; then closed. */
static void expect_own_opens(void)
{
    int own[OPENS];
    for (int k = 0; k < OPENS; k++) {
        own[k] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        cr_assert_geq(own[k], 0, "the program's open %d of %d failed: %s (%d fds open)", k + 1,
                      OPENS, strerror(errno), open_fds());
    }
    for (int k = 0; k < OPENS; k++)
        close(own[k]);
}

/* The consumer's teardown: unmap, release, free; the driver's answers. */
static void drop_share(struct share *s)
{
    for (int i = 0; i < s->n; i++) {
        cr_assert_eq(cuMemUnmap(s->p + (CUdeviceptr)i * G, G), CUDA_SUCCESS);
        cr_assert_eq(cuMemRelease(s->got[i]), CUDA_SUCCESS);
    }
    cr_assert_eq(cuMemAddressFree(s->p, (size_t)s->n * G), CUDA_SUCCESS);
}

static struct share share;

/* At a soft limit of 64, 100 chunks held live: each a real import (as
 * without the cache), every value right, the program's 50 opens succeed. */
static void held_live_at_a_low_limit(void)
{
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    set_soft_limit(LOW_LIMIT);
    uint64_t before = vmm().imports;
    hold_live(&share, HELD, 0);
    cr_assert_eq(vmm().imports - before, HELD, "every chunk is a new export: a real import");
    expect_own_opens();
    expect_values(&share);
    drop_share(&share);
    expect_no_stale_handles();
}

Test(vmm_fds, held_live_at_a_low_limit_without_the_cache, .timeout = 10)
{
    setenv("IPCCACHE_DISABLE", "1", 1);
    held_live_at_a_low_limit();
}

Test(vmm_fds, held_live_at_a_low_limit, .timeout = 10)
{
    held_live_at_a_low_limit();
}
