/*
 * vmm_identity.c - what identifies one export on the VMM path.
 *
 * A POSIX-fd export is an open of /dev/nvidiactl: fstat cannot tell two
 * apart, every import of one gets a new handle, and a freed export's fd
 * number comes back for the next (measured). Only the open file description
 * identifies it, and kcmp(KCMP_FILE) compares descriptions - and orders them,
 * which lets the table binary-search its kept dups; fcntl(F_DUPFD_QUERY)
 * only compares, more cheaply: it checks the table's guesses. A fabric
 * handle is its 64 bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cuda.h>

#include "vmm_impl.h"

static _Atomic int kcmp_refused;

/* Our pid, asked once: an import hit is one kcmp (and the kept dup's mark,
 * base/fdmark.c), not a getpid as well.
 * A fork child asks again (lifecycle.c calls ipcc_vmm_identity_fork_child). */
static _Atomic pid_t self_pid;

void ipcc_vmm_identity_fork_child(void)
{
    atomic_store_explicit(&self_pid, 0, memory_order_relaxed);
}

int32_t ipcc_vmm_self_pid(void)
{
    pid_t pid = atomic_load_explicit(&self_pid, memory_order_relaxed);
    if (pid == 0) {
        pid = getpid();
        atomic_store_explicit(&self_pid, pid, memory_order_relaxed);
    }
    return pid;
}

/* kcmp orders open file descriptions (1: a < b, 2: a > b, 3: unordered). */
int ipcc_vmm_kcmp(int a, int b)
{
    int saved_errno = errno; /* the app's */
    pid_t pid = ipcc_vmm_self_pid();
    long r = syscall(SYS_kcmp, pid, pid, KCMP_FILE, a, b);
    int why = errno;
    errno = saved_errno;
    switch (r) {
    case 0: return 0;
    case 1: return -1;
    case 2: return 1;
    case 3: return IPCC_VMM_UNORDERED;
    default: break;
    }
    if ((why == EPERM || why == ENOSYS || why == EACCES) && !atomic_exchange(&kcmp_refused, 1))
        ipcc_log(IPCC_LOG_INFO, "kcmp is refused here (%s); VMM imports are not cached",
                 why == ENOSYS ? "ENOSYS" : "EPERM");
    return IPCC_VMM_CMP_FAILED;
}

#ifndef F_DUPFD_QUERY
#define F_DUPFD_QUERY 1027 /* Linux 6.10 */
#endif

static _Atomic int query_missing;

/* One fcntl(F_DUPFD_QUERY) says whether two of our fds name one open file
 * description: a quarter of kcmp's cost (no other process to look up or
 * check), and no ordering, which only the search needs. -1 on a bad fd, or
 * where it is unknown or refused (a kernel before 6.10, a seccomp filter:
 * not asked again): kcmp answers then. */
int ipcc_vmm_same_file(int a, int b)
{
    if (atomic_load_explicit(&query_missing, memory_order_relaxed))
        return -1;
    int saved_errno = errno; /* the app's */
    int r = fcntl(a, F_DUPFD_QUERY, b);
    int why = errno;
    errno = saved_errno;
    if (r >= 0)
        return r > 0;
    if (why != EBADF)
        atomic_store_explicit(&query_missing, 1, memory_order_relaxed);
    return -1;
}

/* The table's comparators, of an asked fd and a kept dup: "the same" only
 * while the dup's number still names what was kept (base/fdmark.c), else
 * the import is passed through, uncached: a program that closed our dup and
 * has a file of its own at that number gets the driver's answer for it. */
int ipcc_vmm_kept_order(int asked, int kept)
{
    int r = ipcc_vmm_kcmp(asked, kept);
    return r == 0 && !ipcc_fd_ours(kept) ? IPCC_VMM_CMP_FAILED : r;
}

int ipcc_vmm_kept_same(int asked, int kept)
{
    int r = ipcc_vmm_same_file(asked, kept);
    return r == 1 && !ipcc_fd_ours(kept) ? 0 : r;
}

/* Whether kcmp answers here, asked once on the app's own fd (a bad fd says
 * nothing: that import is the driver's to refuse). Fabric ids need no kcmp. */
int ipcc_vmm_identity_works(const struct ipcc_vmm_id *id)
{
    static _Atomic int checked;
    if (id->fabric || atomic_load_explicit(&checked, memory_order_acquire))
        return !atomic_load_explicit(&kcmp_refused, memory_order_relaxed) || id->fabric;
    int r = ipcc_vmm_kcmp(id->fd, id->fd);
    if (r == 0 || atomic_load(&kcmp_refused))
        atomic_store_explicit(&checked, 1, memory_order_release);
    return r == 0;
}

/* The identity of what the app passes to an import; -1: not one we key. */
int ipcc_vmm_id_of(struct ipcc_vmm_id *id, void *os, int type)
{
    memset(id, 0, sizeof(*id));
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        id->fd = (int)(intptr_t)os;
        return id->fd >= 0 ? 0 : -1;
    }
    if (type == CU_MEM_HANDLE_TYPE_FABRIC && os) {
        id->fabric = 1;
        id->fd = -1;
        memcpy(id->bytes, os, sizeof(id->bytes));
        return 0;
    }
    return -1;
}
