/*
 * vmm_ghost.c - does an exporter's cuMemRelease of chunks it exported give
 * the GPU memory back while an importer keeps (cached, idle) imports of
 * them? The VMM path's twin of ghost_free.cu, for tests/gpu/run.sh.
 *
 *   vmm_ghost [importer's GPU] [chunks] [chunk MiB]     (default 0 8 256)
 *
 * The exporter (GPU 0) starts the importer first (this program again,
 * exec'd before CUDA starts, so it inherits nothing but the environment and
 * its two pipes), then creates the chunks, maps them, writes each one's
 * number, exports each to a POSIX fd and sends the fd numbers. The importer
 * does PyTorch's expandable-segments rebuild and drop (pidfd_getfd + import
 * + close per chunk, one reserve, a map per chunk, one set-access; reads;
 * unmap + release per chunk, address free) on its GPU, prints its line and
 * stays alive, idle, until the exporter closes its pipe. Meanwhile the
 * exporter releases as PyTorch does (per chunk: close the fd, unmap its
 * mapping, cuMemRelease) and reads GPU 0's free memory before creating,
 * after creating, before releasing and after (polled up to 200 ms). Lines:
 *
 *   role=importer importer_pid=P device=D chunks=N read_ok=1 bad_reads=0
 *   role=exporter chunks=N chunk_bytes=B total=T importer_dev=D importer_pid=P
 *     free_before=... free_alloc=... free_shared=... free_after=...
 *     given_back=... release_us=... settle_polls=K importer_exit=0 released_ok=1
 *
 * (the exporter's is one line). given_back = free_after - free_alloc;
 * released_ok=1 when it is T within 64 MiB, as without ipccache. Exit 0 when
 * all went well; 1 on a CUDA error (the call and its code on stderr), 2 on a
 * usage or system error, 3 when the importer failed, 4 when the memory did
 * not come back. Build: nvcc -o vmm_ghost vmm_ghost.c -lcuda (or cc).
 */
#define _GNU_SOURCE
#include <cuda.h>

#include "vmm_pair.h"

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

#define MAX_CHUNKS 64
#define SLACK (64ll << 20)

static int chunks = 8;
static size_t chunk_bytes = (size_t)256 << 20;
static int importer_gpu;

/* A CUDA call that must succeed: otherwise its name and code, exit 1. */
static void must(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        const char *name = "?";
        cuGetErrorName(rc, &name);
        fprintf(stderr, "vmm_ghost[%d]: %s failed: %s (%d)\n", (int)getpid(), what, name, (int)rc);
        exit(1);
    }
}

static void die(const char *what)
{
    fprintf(stderr, "vmm_ghost[%d]: ", (int)getpid());
    perror(what);
    exit(2);
}

/* The word every chunk holds: its number, recognisably. */
static unsigned value_of(int chunk)
{
    return 0x5eed0000u + (unsigned)chunk;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ---- importer ------------------------------------------------------------------ */

/* Reads "fds A B C ..." from stdin into remote; 0 on EOF or a bad line. */
static int read_fds(int *remote)
{
    char line[1024], *p = line;
    if (!fgets(line, sizeof(line), stdin) || strncmp(line, "fds", 3) != 0)
        return 0;
    p += 3;
    for (int i = 0; i < chunks; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0)
            return 0;
        remote[i] = (int)v;
        p = end;
    }
    return 1;
}

/* PyTorch's rebuild of the exporter's segment, a read of every chunk, and
 * its drop; the number of words that were not what the exporter wrote. */
static int rebuild_read_drop(int pidfd, const int *remote)
{
    CUmemGenericAllocationHandle h[MAX_CHUNKS];
    size_t total = (size_t)chunks * chunk_bytes;
    for (int i = 0; i < chunks; i++) {
        int fd = (int)syscall(SYS_pidfd_getfd, pidfd, remote[i], 0);
        if (fd < 0)
            die("pidfd_getfd");
        must(cuMemImportFromShareableHandle(&h[i], (void *)(intptr_t)fd,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
             "importer cuMemImportFromShareableHandle");
        close(fd);
    }
    CUdeviceptr p;
    must(cuMemAddressReserve(&p, total, 0, 0, 0), "importer cuMemAddressReserve");
    for (int i = 0; i < chunks; i++)
        must(cuMemMap(p + i * chunk_bytes, chunk_bytes, 0, h[i], 0), "importer cuMemMap");
    CUmemAccessDesc d = vmm_rw_on(importer_gpu);
    must(cuMemSetAccess(p, total, &d, 1), "importer cuMemSetAccess");
    int bad = 0;
    for (int i = 0; i < chunks; i++) {
        unsigned first = 0, last = 0;
        must(cuMemcpyDtoH(&first, p + i * chunk_bytes, sizeof(first)), "importer cuMemcpyDtoH");
        must(cuMemcpyDtoH(&last, p + (i + 1) * chunk_bytes - sizeof(last), sizeof(last)),
             "importer cuMemcpyDtoH");
        if (first != value_of(i) || last != value_of(i)) {
            fprintf(stderr, "vmm_ghost: importer: chunk %d holds 0x%x...0x%x, want 0x%x\n", i, first,
                    last, value_of(i));
            bad++;
        }
    }
    must(cuCtxSynchronize(), "importer cuCtxSynchronize");
    for (int i = 0; i < chunks; i++) {
        must(cuMemUnmap(p + i * chunk_bytes, chunk_bytes), "importer cuMemUnmap");
        must(cuMemRelease(h[i]), "importer cuMemRelease");
    }
    must(cuMemAddressFree(p, total), "importer cuMemAddressFree");
    return bad;
}

/* stdin: the exporter's commands; stdout: our answers to it. */
static int run_importer(pid_t exporter)
{
    int remote[MAX_CHUNKS];
    int pidfd = (int)syscall(SYS_pidfd_open, exporter, 0);
    if (pidfd < 0)
        die("pidfd_open");
    vmm_start_cuda_on(importer_gpu);
    printf("ready\n");
    fflush(stdout);
    if (!read_fds(remote)) {
        fprintf(stderr, "vmm_ghost: importer: no fd numbers from the exporter\n");
        return 2;
    }
    int bad = rebuild_read_drop(pidfd, remote);
    printf("role=importer importer_pid=%d device=%d chunks=%d read_ok=%d bad_reads=%d\n",
           (int)getpid(), importer_gpu, chunks, bad == 0, bad);
    fflush(stdout);
    /* Idle, holding what the cache kept, until the exporter is done. */
    char buf[256];
    while (read(0, buf, sizeof(buf)) > 0)
        ;
    return bad ? 3 : 0;
}

/* ---- exporter ------------------------------------------------------------------ */

struct importer {
    pid_t pid;
    int to;     /* its stdin */
    FILE *from; /* its stdout */
};

/* Forks and execs the importer before this process starts CUDA. The pipes
 * are close-on-exec: only the importer's own ends survive into it (as its
 * stdin and stdout), so its stdin sees EOF as soon as we close ours. */
static struct importer start_importer(void)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        die("pipe2");
    char pid[16], gpu[16], n[16], bytes[32];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    snprintf(gpu, sizeof(gpu), "%d", importer_gpu);
    snprintf(n, sizeof(n), "%d", chunks);
    snprintf(bytes, sizeof(bytes), "%zu", chunk_bytes);
    fflush(NULL);
    struct importer imp = { .pid = fork() };
    if (imp.pid < 0)
        die("fork");
    if (imp.pid == 0) {
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0)
            _exit(127);
        fcntl(0, F_SETFD, 0); /* in case a pipe end already was 0 or 1 */
        fcntl(1, F_SETFD, 0);
        execl("/proc/self/exe", "vmm_ghost", "--importer", pid, gpu, n, bytes, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    imp.to = in[1];
    imp.from = fdopen(out[0], "r");
    if (!imp.from)
        die("fdopen");
    return imp;
}

/* The importer's next line that starts with prefix, into line; 0 at EOF
 * (it ended). Other lines are passed on to stderr. */
static int expect(struct importer *imp, const char *prefix, char *line, int cap)
{
    while (fgets(line, cap, imp->from)) {
        if (strncmp(line, prefix, strlen(prefix)) == 0)
            return 1;
        fprintf(stderr, "vmm_ghost: importer said: %s", line);
    }
    return 0;
}

/* The importer's exit status as a number: its code, 128+signal, or -1. */
static int finish_importer(struct importer *imp)
{
    int status = 0;
    close(imp->to); /* it may go now */
    fclose(imp->from);
    if (waitpid(imp->pid, &status, 0) != imp->pid)
        return -1;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

static long long free_bytes(void)
{
    size_t free_b = 0, total = 0;
    must(cuMemGetInfo(&free_b, &total), "cuMemGetInfo");
    return (long long)free_b;
}

/* GPU 0's free memory once it reached want, or after 200 ms (10 polls). */
static long long settle(long long want, int *polls)
{
    long long f = free_bytes();
    for (*polls = 0; *polls < 10 && f < want; (*polls)++) {
        usleep(20000);
        f = free_bytes();
    }
    return f;
}

struct segment {
    CUdeviceptr base;
    CUmemGenericAllocationHandle h[MAX_CHUNKS];
    int fd[MAX_CHUNKS];
};

/* Creates, maps, fills and exports the chunks, as PyTorch's expandable
 * segment does before it shares itself. */
static void create_and_export(struct segment *s)
{
    CUmemAllocationProp prop = vmm_fd_prop(); /* GPU 0, exportable as an fd */
    size_t gran = 0, total = (size_t)chunks * chunk_bytes;
    must(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
         "cuMemGetAllocationGranularity");
    if (gran == 0 || chunk_bytes % gran != 0) {
        fprintf(stderr, "vmm_ghost: chunk size %zu is not a multiple of the granularity %zu\n",
                chunk_bytes, gran);
        exit(2);
    }
    must(cuMemAddressReserve(&s->base, total, 0, 0, 0), "exporter cuMemAddressReserve");
    for (int i = 0; i < chunks; i++) {
        must(cuMemCreate(&s->h[i], chunk_bytes, &prop, 0), "exporter cuMemCreate");
        must(cuMemMap(s->base + i * chunk_bytes, chunk_bytes, 0, s->h[i], 0), "exporter cuMemMap");
    }
    CUmemAccessDesc d = vmm_rw_on(0);
    must(cuMemSetAccess(s->base, total, &d, 1), "exporter cuMemSetAccess");
    for (int i = 0; i < chunks; i++)
        must(cuMemsetD32(s->base + i * chunk_bytes, value_of(i), chunk_bytes / 4),
             "exporter cuMemsetD32");
    must(cuCtxSynchronize(), "exporter cuCtxSynchronize");
    for (int i = 0; i < chunks; i++)
        must(cuMemExportToShareableHandle(&s->fd[i], s->h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                          0),
             "exporter cuMemExportToShareableHandle");
}

/* PyTorch's order for an exported chunk: close the fd, unmap, release. */
static void release_all(struct segment *s)
{
    for (int i = 0; i < chunks; i++) {
        close(s->fd[i]);
        must(cuMemUnmap(s->base + i * chunk_bytes, chunk_bytes), "exporter cuMemUnmap");
        must(cuMemRelease(s->h[i]), "exporter cuMemRelease");
    }
    must(cuMemAddressFree(s->base, (size_t)chunks * chunk_bytes), "exporter cuMemAddressFree");
}

static int run_exporter(void)
{
    /* Where Yama limits ptrace to descendants, let the importer (our child)
     * take our fds with pidfd_getfd; elsewhere this fails harmlessly. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    signal(SIGPIPE, SIG_IGN); /* a dead importer is an error we report, not a kill */
    struct importer imp = start_importer();
    vmm_start_cuda_on(0);
    char line[1024], importer_line[1024] = "";
    if (!expect(&imp, "ready", line, sizeof(line))) {
        fprintf(stderr, "vmm_ghost: the importer ended before it was ready (exit %d)\n",
                finish_importer(&imp));
        return 3;
    }
    long long total = (long long)chunks * (long long)chunk_bytes;
    long long free_before = free_bytes();
    struct segment s;
    create_and_export(&s);
    long long free_alloc = free_bytes();

    int importer_ok = dprintf(imp.to, "fds") > 0;
    for (int i = 0; i < chunks; i++)
        importer_ok = importer_ok && dprintf(imp.to, " %d", s.fd[i]) > 0;
    importer_ok = importer_ok && dprintf(imp.to, "\n") > 0;
    /* Its line says it rebuilt, read and dropped the segment: now idle. */
    importer_ok = importer_ok && expect(&imp, "role=importer", importer_line, sizeof(importer_line));
    if (importer_ok) {
        fputs(importer_line, stdout);
        fflush(stdout);
        importer_ok = strstr(importer_line, " read_ok=1") != NULL;
    } else {
        fprintf(stderr, "vmm_ghost: the importer did not report its rebuild\n");
    }
    long long free_shared = free_bytes();

    double t0 = now_us();
    release_all(&s);
    double release_us = now_us() - t0;
    int polls = 0;
    long long free_after = settle(free_alloc + total - SLACK, &polls);
    int importer_exit = finish_importer(&imp);

    long long given_back = free_after - free_alloc;
    int released_ok = llabs(given_back - total) <= SLACK;
    printf("role=exporter chunks=%d chunk_bytes=%zu total=%lld importer_dev=%d importer_pid=%d "
           "free_before=%lld free_alloc=%lld free_shared=%lld free_after=%lld given_back=%lld "
           "release_us=%.0f settle_polls=%d importer_exit=%d released_ok=%d\n",
           chunks, chunk_bytes, total, importer_gpu, (int)imp.pid, free_before, free_alloc,
           free_shared, free_after, given_back, release_us, polls, importer_exit, released_ok);
    if (!released_ok)
        fprintf(stderr, "vmm_ghost: the release gave back %lld bytes of %lld (free %lld -> %lld)\n",
                given_back, total, free_alloc, free_after);
    if (!importer_ok || importer_exit != 0)
        return 3;
    return released_ok ? 0 : 4;
}

static void usage(void)
{
    fprintf(stderr, "usage: vmm_ghost [importer's GPU] [chunks 1..%d] [chunk MiB]\n", MAX_CHUNKS);
    exit(2);
}

/* A count in [lo, hi] from s, or exit 2. */
static long long number(const char *s, long long lo, long long hi)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        usage();
    return v;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--importer") == 0) {
        pid_t exporter = (pid_t)number(argv[2], 1, 1ll << 30);
        importer_gpu = (int)number(argv[3], 0, 63);
        chunks = (int)number(argv[4], 1, MAX_CHUNKS);
        chunk_bytes = (size_t)number(argv[5], 1, 1ll << 40);
        return run_importer(exporter);
    }
    if (argc > 4)
        usage();
    if (argc > 1)
        importer_gpu = (int)number(argv[1], 0, 63);
    if (argc > 2)
        chunks = (int)number(argv[2], 1, MAX_CHUNKS);
    if (argc > 3)
        chunk_bytes = (size_t)number(argv[3], 1, 1 << 20) << 20;
    return run_exporter();
}
