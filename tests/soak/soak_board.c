/*
 * soak_board.c - the board every process of a soak maps, its seqlocks, the
 * run's random numbers and clocks, and the socket that carries VMM fds from
 * an exporter to an importer (as pidfd_getfd would: a copy of each fd).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "soak.h"

struct soak_board *soak_board_map(const char *path, int create)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0)
        return NULL;
    if (create && ftruncate(fd, sizeof(struct soak_board)) != 0) {
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, sizeof(struct soak_board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    struct soak_board *b = m;
    if (create)
        b->magic = SOAK_MAGIC;
    return b->magic == SOAK_MAGIC ? b : NULL;
}

void soak_write_begin(struct soak_exporter_slot *e)
{
    atomic_fetch_add_explicit(&e->seq, 1, memory_order_acq_rel);
    atomic_thread_fence(memory_order_release);
}

void soak_write_end(struct soak_exporter_slot *e)
{
    atomic_thread_fence(memory_order_release);
    atomic_fetch_add_explicit(&e->seq, 1, memory_order_acq_rel);
}

int soak_read_slot(struct soak_exporter_slot *e, void (*read)(struct soak_exporter_slot *, void *),
                   void *out)
{
    for (int tries = 0; tries < 100; tries++) {
        uint32_t before = atomic_load_explicit(&e->seq, memory_order_acquire);
        if (before & 1) { /* being written */
            sched_yield();
            continue;
        }
        if (!atomic_load_explicit(&e->pid, memory_order_relaxed))
            return 0;
        read(e, out);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&e->seq, memory_order_relaxed) == before)
            return 1;
    }
    return 0;
}

uint64_t soak_importer_sum(const struct soak_importer_slot *s, unsigned long field)
{
    uint64_t n = 0;
    for (int i = 0; i <= SOAK_THREADS; i++)
        n += atomic_load_explicit((const _Atomic uint64_t *)((const char *)&s->t[i] + field),
                                  memory_order_relaxed);
    return n;
}

uint64_t soak_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

unsigned soak_pick(uint64_t *s, unsigned n)
{
    return n ? (unsigned)(soak_random(s) % n) : 0;
}

double soak_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void soak_sleep_ms(double ms)
{
    struct timespec ts = { (time_t)(ms / 1000), (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void soak_socket_path(char *out, unsigned long cap, const char *run, int e, unsigned generation)
{
    snprintf(out, cap, "%s/sock/exp-%d-%u", run, e, generation);
}

int soak_send_fds(int sock, const void *msg, unsigned long len, const int *fds, int n)
{
    char control[CMSG_SPACE(sizeof(int) * SOAK_MAX_CHUNKS)];
    struct iovec iov = { (void *)msg, len };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (n > SOAK_MAX_CHUNKS)
        return -1;
    if (n > 0) {
        memset(control, 0, sizeof(control));
        mh.msg_control = control;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
    }
    return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

int soak_recv_fds(int sock, void *msg, unsigned long len, int *fds, int cap)
{
    char control[CMSG_SPACE(sizeof(int) * SOAK_MAX_CHUNKS)];
    struct iovec iov = { msg, len };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof(control) };
    if (recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL) != (ssize_t)len)
        return -1;
    int n = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int got[SOAK_MAX_CHUNKS];
        memcpy(got, CMSG_DATA(c), sizeof(int) * (size_t)k);
        for (int i = 0; i < k; i++) {
            if (n < cap)
                fds[n++] = got[i];
            else
                close(got[i]);
        }
    }
    if (mh.msg_flags & MSG_CTRUNC)
        return -1;
    return n;
}
