/*
 * vmm_rebuild.c - PyTorch's expandable-segments sharing, in C on the driver
 * API, two processes on one GPU: the GPU check and benchmark of ipccache's
 * VMM path.
 *
 * The exporter (a child forked before CUDA starts) creates CHUNKS
 * allocations, maps them to write them, exports one fd each and keeps the fds
 * open. Each iteration it fills every chunk with the iteration's number; the
 * importer then rebuilds the segment exactly as c10's
 * ExpandableSegment::fromShared does (pidfd_getfd + import + close per chunk,
 * one reserve, a map per chunk, one set-access), reads every chunk's first
 * word (it must be the latest number: a cached mapping must show the
 * exporter's current data), and releases it as unmapHandles does (unmap +
 * release per chunk, address free).
 *
 * Prints "check=ok" or "check=FAIL ...", the median time of a rebuild +
 * read + release, the importer's pid, and loop_later_ioctls: the ioctl(2)
 * calls made inside the VMM calls of rebuilds 2..K, as counted from outside
 * the shim by tests/gpu/ioctl_count.c when it is preloaded (0 without it), and a "per_call_us" line: the median over iterations of
 * each driver call's average time within one rebuild (each call timed on its
 * own, one clock reading included), the benchmark's figures for a hit. Build: nvcc -x cu -o vmm_rebuild vmm_rebuild.c -lcuda (or
 * any C compiler with -lcuda). Arguments: [iterations] [chunks] [chunk MiB]
 * [importer's GPU] (default 0; the exporter is always on GPU 0).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>

#include "vmm_pair.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNKS 64

static int chunks = 26;
static size_t chunk_bytes = 20u << 20;
static int importer_gpu;
static unsigned long later_ioctls; /* inside the VMM calls of rebuilds 2..K */

#define must vmm_must

/* The calls timed one by one, in the order a rebuild makes them. */
enum call { C_GETFD, C_IMPORT, C_RESERVE, C_MAP, C_ACCESS, C_UNMAP, C_RELEASE, C_FREE, C_COUNT };
static const char *const call_names[C_COUNT] = {
    "getfd", "import", "reserve", "map", "set_access", "unmap", "release", "address_free",
};
/* This iteration's total time per call kind, and how many calls. */
static double call_us[C_COUNT];
static int call_n[C_COUNT];

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Times one driver call into call_us[kind]. */
#define TIMED(kind, expr)                         \
    ({                                            \
        double t0_ = now_us();                    \
        __typeof__(expr) r_ = (expr);             \
        call_us[kind] += now_us() - t0_;          \
        call_n[kind]++;                           \
        r_;                                       \
    })

/* ---- exporter --------------------------------------------------------------- */

static int exporter(int sock)
{
    vmm_start_cuda();
    CUmemAllocationProp prop = vmm_fd_prop();
    CUdeviceptr base;
    must(cuMemAddressReserve(&base, chunks * chunk_bytes, 0, 0, 0), "exporter reserve");
    int fds[MAX_CHUNKS];
    for (int i = 0; i < chunks; i++) {
        CUmemGenericAllocationHandle h;
        must(cuMemCreate(&h, chunk_bytes, &prop, 0), "cuMemCreate");
        must(cuMemMap(base + i * chunk_bytes, chunk_bytes, 0, h, 0), "exporter map");
        must(cuMemExportToShareableHandle(&fds[i], h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             "export");
    }
    CUmemAccessDesc d = vmm_rw_on(0);
    must(cuMemSetAccess(base, chunks * chunk_bytes, &d, 1), "exporter access");
    if (write(sock, fds, sizeof(int) * chunks) != (ssize_t)(sizeof(int) * chunks))
        return 2;
    unsigned gen;
    while (read(sock, &gen, sizeof(gen)) == sizeof(gen)) {
        must(cuMemsetD32(base, gen, chunks * chunk_bytes / 4), "fill");
        must(cuCtxSynchronize(), "sync");
        if (write(sock, &gen, sizeof(gen)) != sizeof(gen))
            return 2;
    }
    return 0;
}

/* ---- importer ----------------------------------------------------------------- */

/* ioctl(2) calls so far, as tests/gpu/ioctl_count.c counts them; 0 when it
 * is not preloaded. A real import, map, set-access, unmap or release asks the
 * kernel driver; a cache hit does not. */
static unsigned long gpu_ioctls(void)
{
    static unsigned long (*count)(void);
    if (!count)
        count = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "ioctl_count_gpu");
    return count ? count() : 0;
}

/* What the consumer receives each time: a fresh fd for the exporter's one. */
static int receive(int pidfd, int remote_fd)
{
    return (int)syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0);
}

static int rebuild_read_release(int pidfd, const int *remote, unsigned gen)
{
    CUmemGenericAllocationHandle h[MAX_CHUNKS];
    unsigned long before = gpu_ioctls();
    for (int i = 0; i < chunks; i++) {
        int fd = TIMED(C_GETFD, receive(pidfd, remote[i]));
        if (fd < 0) {
            perror("vmm_rebuild: pidfd_getfd");
            exit(1);
        }
        must(TIMED(C_IMPORT, cuMemImportFromShareableHandle(
                                 &h[i], (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)),
             "import");
        close(fd);
    }
    CUdeviceptr p;
    must(TIMED(C_RESERVE, cuMemAddressReserve(&p, chunks * chunk_bytes, 0, 0, 0)), "reserve");
    for (int i = 0; i < chunks; i++)
        must(TIMED(C_MAP, cuMemMap(p + i * chunk_bytes, chunk_bytes, 0, h[i], 0)), "map");
    CUmemAccessDesc d = vmm_rw_on(importer_gpu);
    must(TIMED(C_ACCESS, cuMemSetAccess(p, chunks * chunk_bytes, &d, 1)), "set access");
    unsigned long in_calls = gpu_ioctls() - before; /* the reads below are not counted */
    int bad = 0;
    for (int i = 0; i < chunks; i++) {
        unsigned v = 0;
        must(cuMemcpyDtoH(&v, p + i * chunk_bytes + chunk_bytes - 4, sizeof(v)), "read");
        bad += v != gen;
    }
    must(cuCtxSynchronize(), "sync");
    before = gpu_ioctls();
    for (int i = 0; i < chunks; i++) {
        must(TIMED(C_UNMAP, cuMemUnmap(p + i * chunk_bytes, chunk_bytes)), "unmap");
        must(TIMED(C_RELEASE, cuMemRelease(h[i])), "release");
    }
    must(TIMED(C_FREE, cuMemAddressFree(p, chunks * chunk_bytes)), "address free");
    if (gen > 1)
        later_ioctls += in_calls + gpu_ioctls() - before;
    return bad;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One line: each call kind's median (over iterations) average time. */
static void print_per_call(double *per_call, int iters)
{
    printf("per_call_us");
    for (int c = 0; c < C_COUNT; c++) {
        double *v = per_call + c * iters;
        qsort(v, (size_t)iters, sizeof(double), by_value);
        printf(" %s=%.3f", call_names[c], v[iters / 2]);
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 50;
    if (argc > 2)
        chunks = atoi(argv[2]);
    if (argc > 3)
        chunk_bytes = (size_t)atoi(argv[3]) << 20;
    if (argc > 4)
        importer_gpu = atoi(argv[4]);
    if (iters < 1 || iters > 100000 || chunks < 1 || chunks > MAX_CHUNKS)
        return 2;
    int sock;
    pid_t pid = vmm_fork_exporter(exporter, &sock);
    int remote[MAX_CHUNKS];
    if (read(sock, remote, sizeof(int) * chunks) != (ssize_t)(sizeof(int) * chunks))
        return 2;
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        perror("vmm_rebuild: pidfd_open");
        return 2;
    }
    vmm_start_cuda_on(importer_gpu);
    double *t = calloc((size_t)iters, sizeof(double));
    double *per_call = calloc((size_t)iters * C_COUNT, sizeof(double));
    int bad = 0;
    for (unsigned gen = 1; gen <= (unsigned)iters; gen++) {
        unsigned ack;
        if (write(sock, &gen, sizeof(gen)) != sizeof(gen) ||
            read(sock, &ack, sizeof(ack)) != sizeof(ack))
            return 2;
        memset(call_us, 0, sizeof(call_us));
        memset(call_n, 0, sizeof(call_n));
        double t0 = now_us();
        bad += rebuild_read_release(pidfd, remote, gen);
        t[gen - 1] = now_us() - t0;
        for (int c = 0; c < C_COUNT; c++)
            per_call[c * iters + gen - 1] = call_us[c] / call_n[c];
    }
    close(sock);
    waitpid(pid, NULL, 0);
    qsort(t, (size_t)iters, sizeof(double), by_value);
    printf("iterations=%d chunks=%d chunk_mib=%zu importer_gpu=%d max_us=%.0f median_us=%.1f\n",
           iters, chunks, chunk_bytes >> 20, importer_gpu, t[iters - 1], t[iters / 2]);
    printf("importer_pid=%d loop_later_ioctls=%lu\n", (int)getpid(), later_ioctls);
    print_per_call(per_call, iters);
    if (bad)
        printf("check=FAIL stale_reads=%d\n", bad);
    else
        printf("check=ok\n");
    return bad ? 1 : 0;
}
