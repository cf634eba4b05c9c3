/*
 * soak_rebuild.c - an importer's VMM rebuilds (soak.h says what one is).
 * Only the importer's first thread rebuilds, so the kept fds need no lock.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_vmm.h"
#include "gpu/vmm_pair.h"
#include "soak_model.h"

#define G FAKEVMM_GRANULARITY
#define KEPT 2
#define RESERVE (SOAK_MAX_CHUNKS * G) /* the same size for every segment, as PyTorch reserves */

/* What one exporter handed out: its chunks' fds and what each names. */
struct received {
    int slot, n;
    uint64_t pid, epoch, serial[SOAK_MAX_CHUNKS];
    int fd[SOAK_MAX_CHUNKS];
};

static struct received kept[KEPT];
static int next_victim;

static void forget(struct received *r)
{
    for (int i = 0; i < r->n; i++)
        close(r->fd[i]);
    r->n = 0;
    r->pid = 0;
}

void soak_rebuild_forget(void)
{
    for (int i = 0; i < KEPT; i++)
        forget(&kept[i]);
}

/* The fds of slot e's current segment, fetched from its exporter when
 * they are not kept; NULL when the exporter does not answer (it died).
 * Kept fds stand for the pidfd_getfd copies PyTorch takes from the live
 * exporter at each rebuild: none is taken from one that exited, a zombie
 * included (the library cannot tell whose export such an fd is:
 * docs/limits.md). */
static struct received *fds_of(struct soak_board *b, const char *run, int e)
{
    struct soak_exporter_slot *x = &b->exp[e];
    uint64_t pid = (uint64_t)atomic_load(&x->pid), epoch = atomic_load(&x->vmm_epoch);
    for (int i = 0; i < KEPT; i++)
        if (kept[i].n && kept[i].slot == e && kept[i].pid == pid && kept[i].epoch == epoch)
            return fakecuda_process_runs((int64_t)pid) ? &kept[i] : NULL;
    struct received *r = &kept[next_victim];
    next_victim = (next_victim + 1) % KEPT;
    forget(r);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    soak_socket_path(a.sun_path, sizeof(a.sun_path), run, e, atomic_load(&x->generation));
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    uint64_t msg[2 + SOAK_MAX_CHUNKS];
    int n = -1;
    /* An exporter busy freeing (each free waits for importers) does not
     * answer for a while: rebuild another time rather than stall here. */
    struct timeval wait = { 0, 200 * 1000 };
    if (s >= 0)
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof(a)) == 0)
        n = soak_recv_fds(s, msg, sizeof(msg), r->fd, SOAK_MAX_CHUNKS);
    if (s >= 0)
        close(s);
    if (n <= 0)
        return NULL;
    r->slot = e;
    r->n = n;
    r->pid = msg[0];
    r->epoch = msg[1];
    memcpy(r->serial, &msg[2], sizeof(r->serial));
    return r;
}

void soak_rebuild(struct soak_board *b, const char *run, int e, uint64_t *rnd, struct soak_counts *c)
{
    struct received *r = fds_of(b, run, e);
    if (!r)
        return;
    int first = (int)soak_pick(rnd, (unsigned)r->n), n = 1 + (int)soak_pick(rnd, (unsigned)(r->n - first));
    CUmemGenericAllocationHandle h[SOAK_MAX_CHUNKS];
    CUmemAccessDesc access = vmm_rw_on(0);
    CUdeviceptr base = 0;
    if (!soak_check_rc(c, SOAK_VMM_CALL, cuMemAddressReserve(&base, RESERVE, 0, 0, 0), "cuMemAddressReserve"))
        return;
    for (int k = 0; k < n; k++) {
        int fd = dup(r->fd[first + k]); /* pidfd_getfd's copy */
        h[k] = 0;
        soak_check_rc(c, SOAK_VMM_CALL,
                      cuMemImportFromShareableHandle(&h[k], (void *)(intptr_t)fd,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                      "cuMemImportFromShareableHandle");
        close(fd);
        soak_check_vmm_handle(c, h[k], r->pid, r->serial[first + k]);
        atomic_fetch_add_explicit(&c->imports, 1, memory_order_relaxed);
    }
    for (int k = 0; k < n; k++)
        soak_check_rc(c, SOAK_VMM_CALL, cuMemMap(base + (uint64_t)k * G, G, 0, h[k], 0), "cuMemMap");
    soak_check_rc(c, SOAK_VMM_CALL, cuMemSetAccess(base, (uint64_t)n * G, &access, 1), "cuMemSetAccess");
    for (int k = 0; k < n; k++)
        soak_check_vmm_value(c, base + (uint64_t)k * G + soak_pick(rnd, G), r->pid, r->serial[first + k]);
    for (int k = 0; k < n; k++) {
        soak_check_rc(c, SOAK_VMM_CALL, cuMemUnmap(base + (uint64_t)k * G, G), "cuMemUnmap");
        soak_check_rc(c, SOAK_VMM_CALL, cuMemRelease(h[k]), "cuMemRelease");
    }
    soak_check_rc(c, SOAK_VMM_CALL, cuMemAddressFree(base, RESERVE), "cuMemAddressFree");
    atomic_fetch_add_explicit(&c->rebuilds, 1, memory_order_relaxed);
}
