// vmm_errors.cu - what the driver answers on the VMM calls ipccache caches.
//
// Two processes, one GPU: an exporter creates allocations and exports them as
// POSIX file descriptors (one of them twice), and passes the fds over a
// socket; the importer imports, reserves, maps, sets access, unmaps, releases
// and frees, correct and wrong, and prints one line per case:
//
//   case=<name> rc=<CUDA_ERROR_NAME> [detail=...]
//
// The stand-in driver (tests/standin/fake_vmm.c) models these answers, and the table
// in docs/vmm.md comes from this program's output. Cases that pass
// garbage or stale handles come last, in case the driver does not survive
// them; every line is flushed as it is printed.
//
// Driver API only; build: nvcc -o vmm_errors vmm_errors.cu -lcuda. A plain C++
// compiler builds it against the stand-in driver with -DVMM_ERRORS_NO_COPY; the
// tests compare that build's output with the H200's (vmm_errors.h200.txt).

#include <cuda.h>

#include "vmm_pair.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static size_t G;       // allocation granularity
static CUcontext ctx;

static const char *rc_name(CUresult rc)
{
    const char *s = NULL;
    if (cuGetErrorName(rc, &s) != CUDA_SUCCESS || !s)
        return "UNKNOWN";
    return s;
}

static void report_detail(const char *name, CUresult rc, const char *detail)
{
    printf("case=%s rc=%s%s%s\n", name, rc_name(rc), *detail ? " " : "", detail);
    fflush(stdout);
}

static void report(const char *name, CUresult rc)
{
    report_detail(name, rc, "");
}

#define must vmm_must

static void setup(void)
{
    ctx = vmm_start_cuda();
    CUmemAllocationProp prop = vmm_fd_prop();
    must(cuMemGetAllocationGranularity(&G, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
         "granularity");
}

static CUmemGenericAllocationHandle create(size_t bytes)
{
    CUmemAllocationProp prop = vmm_fd_prop();
    CUmemGenericAllocationHandle h;
    must(cuMemCreate(&h, bytes, &prop, 0), "cuMemCreate");
    return h;
}

static int export_fd(CUmemGenericAllocationHandle h)
{
    int fd = -1;
    must(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
         "export");
    return fd;
}

// ---- passing fds -----------------------------------------------------------

static void send_fds(int sock, const int *fds, int n)
{
    char byte = 'f';
    struct iovec iov = { &byte, 1 };
    char ctl[CMSG_SPACE(sizeof(int) * 8)];
    memset(ctl, 0, sizeof ctl);
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    if (sendmsg(sock, &m, 0) != 1)
        exit(2);
}

static void recv_fds(int sock, int *fds, int n)
{
    char byte;
    struct iovec iov = { &byte, 1 };
    char ctl[CMSG_SPACE(sizeof(int) * 8)];
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, 0) != 1)
        exit(2);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_len != CMSG_LEN(sizeof(int) * n))
        exit(2);
    memcpy(fds, CMSG_DATA(c), sizeof(int) * n);
}

// The exporter: X (G bytes, exported twice), Y (2G bytes). Then, on 'r',
// releases X and closes its fds, and exports a new allocation Z: prints
// whether Z's fd number is X's first one (recycled).
static int exporter(int sock)
{
    setup();
    CUmemGenericAllocationHandle x = create(G), y = create(2 * G);
    int fds[3] = { export_fd(x), export_fd(x), export_fd(y) };
    send_fds(sock, fds, 3);
    char cmd;
    if (read(sock, &cmd, 1) != 1)
        return 0;
    cuMemRelease(x);
    close(fds[0]);
    close(fds[1]);
    CUmemGenericAllocationHandle z = create(G);
    int zfd = export_fd(z);
    printf("case=export_after_release rc=CUDA_SUCCESS detail=fd_reused=%d\n", zfd == fds[0]);
    fflush(stdout);
    send_fds(sock, &zfd, 1);
    if (read(sock, &cmd, 1) != 1)
        return 0;
    return 0;
}

// ---- the importer's cases ----------------------------------------------------

#define rw_desc vmm_rw_on

static CUresult import_fd(CUmemGenericAllocationHandle *h, int fd)
{
    return cuMemImportFromShareableHandle(h, (void *)(uintptr_t)fd,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

static CUresult set_rw(CUdeviceptr p, size_t n)
{
    CUmemAccessDesc d = rw_desc(0);
    return cuMemSetAccess(p, n, &d, 1);
}

static void get_access_case(const char *name, CUdeviceptr p)
{
    CUmemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 0;
    unsigned long long flags = 99;
    CUresult rc = cuMemGetAccess(&flags, &loc, p);
    char d[64];
    snprintf(d, sizeof d, "detail=flags=%llu", flags);
    report_detail(name, rc, d);
}

static void import_cases(const int *fds, CUmemGenericAllocationHandle *hx,
                         CUmemGenericAllocationHandle *hy)
{
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0, h4 = 0;
    CUresult rc = import_fd(&h1, fds[0]);
    report("import", rc);
    rc = import_fd(&h2, fds[0]);
    char d[96];
    snprintf(d, sizeof d, "detail=same_handle=%d", h1 == h2);
    report_detail("import_same_fd_again", rc, d);
    int dupfd = dup(fds[0]);
    rc = import_fd(&h3, dupfd);
    snprintf(d, sizeof d, "detail=same_handle=%d", h3 == h1 || h3 == h2);
    report_detail("import_dup_of_fd", rc, d);
    close(dupfd);
    rc = import_fd(&h4, fds[1]);
    snprintf(d, sizeof d, "detail=same_handle=%d", h4 == h1);
    report_detail("import_second_export", rc, d);
    report("release_second_import", cuMemRelease(h2));
    report("release_dup_import", cuMemRelease(h3));
    report("release_second_export_import", cuMemRelease(h4));

    CUmemGenericAllocationHandle g = 0;
    report("import_closed_fd", import_fd(&g, 1000));
    report("import_fd_minus_one", import_fd(&g, -1));
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    report("import_dev_null_fd", import_fd(&g, devnull));
    close(devnull);
    int p[2];
    if (pipe(p) == 0) {
        report("import_pipe_fd", import_fd(&g, p[0]));
        close(p[0]);
        close(p[1]);
    }
    report("import_null_out", cuMemImportFromShareableHandle(
                                   NULL, (void *)(uintptr_t)fds[0],
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    report("import_type_none", cuMemImportFromShareableHandle(
                                   &g, (void *)(uintptr_t)fds[0], CU_MEM_HANDLE_TYPE_NONE));
    report("import_type_win32", cuMemImportFromShareableHandle(
                                    &g, (void *)(uintptr_t)fds[0], CU_MEM_HANDLE_TYPE_WIN32));
    *hx = h1;
    must(import_fd(hy, fds[2]), "import y");
}

static void reserve_cases(void)
{
    CUdeviceptr q = 0, r = 0;
    report("reserve_size_zero", cuMemAddressReserve(&q, 0, 0, 0, 0));
    report("reserve_size_unaligned", cuMemAddressReserve(&q, G + 4096, 0, 0, 0));
    report("reserve_size_half_granule", cuMemAddressReserve(&q, G / 2, 0, 0, 0));
    report("reserve_align_3", cuMemAddressReserve(&q, G, 3, 0, 0));
    report("reserve_align_half_granule", cuMemAddressReserve(&q, G, G / 2, 0, 0));
    CUresult rc = cuMemAddressReserve(&q, G, 3 * G, 0, 0);
    report("reserve_align_3_granules", rc);
    if (rc == CUDA_SUCCESS)
        cuMemAddressFree(q, G);
    report("reserve_flags_1", cuMemAddressReserve(&q, G, 0, 0, 1));
    report("reserve_null_out", cuMemAddressReserve(NULL, G, 0, 0, 0));
    must(cuMemAddressReserve(&q, 4 * G, 0, 0, 0), "reserve q");
    rc = cuMemAddressReserve(&r, 2 * G, 0, q + G, 0);
    char d[96];
    snprintf(d, sizeof d, "detail=at_hint=%d,overlaps=%d", r == q + G,
             r + 2 * G > q && r < q + 4 * G);
    report_detail("reserve_hint_overlapping", rc, d);
    if (rc == CUDA_SUCCESS)
        cuMemAddressFree(r, 2 * G);
    rc = cuMemAddressReserve(&r, 2 * G, 0, q + 64 * G, 0);
    snprintf(d, sizeof d, "detail=at_hint=%d", r == q + 64 * G);
    report_detail("reserve_hint_free", rc, d);
    if (rc == CUDA_SUCCESS)
        cuMemAddressFree(r, 2 * G);
    rc = cuMemAddressReserve(&r, 2 * G, 0, q + G / 2, 0);
    snprintf(d, sizeof d, "detail=at_hint=%d", r == q + G / 2);
    report_detail("reserve_hint_unaligned", rc, d);
    if (rc == CUDA_SUCCESS)
        cuMemAddressFree(r, 2 * G);
    cuMemAddressFree(q, 4 * G);
    rc = cuMemAddressReserve(&r, 4 * G, 0, q, 0);
    snprintf(d, sizeof d, "detail=at_hint=%d", r == q);
    report_detail("reserve_hint_just_freed", rc, d);
    if (rc == CUDA_SUCCESS)
        cuMemAddressFree(r, 4 * G);
}

// p: 8G reserved. X (G) and Y (2G) imported as hx, hy.
static void map_cases(CUdeviceptr p, CUmemGenericAllocationHandle hx,
                      CUmemGenericAllocationHandle hy, const int *fds)
{
    CUmemGenericAllocationHandle hx2 = 0;
    must(import_fd(&hx2, fds[1]), "import x again");
    report("map", cuMemMap(p, G, 0, hx, 0));
    report("map_same_again", cuMemMap(p, G, 0, hx, 0));
    report("map_other_over_mapped", cuMemMap(p, G, 0, hx2, 0));
    report("map_overlapping_tail", cuMemMap(p, 2 * G, 0, hy, 0));
    report("map_second", cuMemMap(p + G, 2 * G, 0, hy, 0));
    report("map_size_smaller_than_alloc", cuMemMap(p + 4 * G, G, 0, hy, 0));
    report("map_size_larger_than_alloc", cuMemMap(p + 4 * G, 2 * G, 0, hx2, 0));
    report("map_offset_granule", cuMemMap(p + 4 * G, G, G, hy, 0));
    report("map_offset_nonzero_small", cuMemMap(p + 4 * G, G, 4096, hx2, 0));
    report("map_unaligned_addr", cuMemMap(p + 4 * G + G / 2, G, 0, hx2, 0));
    report("map_flags_1", cuMemMap(p + 4 * G, G, 0, hx2, 1));
    CUresult past = cuMemMap(p + 7 * G, 2 * G, 0, hy, 0);
    report("map_past_reservation_end", past);
    if (past == CUDA_SUCCESS)
        cuMemUnmap(p + 7 * G, 2 * G);
    report("map_size_zero", cuMemMap(p + 4 * G, 0, 0, hx2, 0));
    CUdeviceptr far = 0;
    must(cuMemAddressReserve(&far, G, 0, 0, 0), "reserve far");
    cuMemAddressFree(far, G);
    report("map_unreserved_addr", cuMemMap(far, G, 0, hx2, 0));
    // The same allocation mapped twice in one process, at two addresses.
    report("map_same_alloc_elsewhere", cuMemMap(p + 5 * G, G, 0, hx, 0));
    report("unmap_same_alloc_elsewhere", cuMemUnmap(p + 5 * G, G));

    // Access. [p, p+G) = X, [p+G, p+3G) = Y, rest unmapped.
    get_access_case("get_access_mapped_never_set", p);
    report("set_access", set_rw(p, G));
    get_access_case("get_access_after_set", p);
    report("set_access_two_mappings", set_rw(p, 3 * G));
    report("set_access_unmapped", set_rw(p + 4 * G, G));
    report("set_access_partly_mapped", set_rw(p + 2 * G, 2 * G));
    report("set_access_part_of_mapping", set_rw(p + 2 * G, G));
    report("set_access_unaligned_size", set_rw(p, G / 2));
    report("set_access_unaligned_addr", set_rw(p + G / 2, G));
    report("set_access_size_zero", set_rw(p, 0));
    CUmemAccessDesc d = rw_desc(0);
    report("set_access_count_zero", cuMemSetAccess(p, G, &d, 0));
    report("set_access_null_desc", cuMemSetAccess(p, G, NULL, 1));
    CUmemAccessDesc bad = rw_desc(99);
    report("set_access_bad_device", cuMemSetAccess(p, G, &bad, 1));
    CUmemAccessDesc ro = rw_desc(0);
    ro.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    report("set_access_read_only", cuMemSetAccess(p, G, &ro, 1));
    get_access_case("get_access_after_read_only", p);
    CUmemAccessDesc none = rw_desc(0);
    none.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    report("set_access_none", cuMemSetAccess(p, G, &none, 1));
    get_access_case("get_access_after_none", p);
    CUmemAccessDesc two[2] = { rw_desc(0), rw_desc(0) };
    report("set_access_same_device_twice", cuMemSetAccess(p, G, two, 2));
    report("set_access_unreserved", set_rw(far, G));
    get_access_case("get_access_unmapped", p + 4 * G);
    get_access_case("get_access_interior", p + 2 * G + 4096);
    get_access_case("get_access_unreserved", far);
    CUmemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 99;
    unsigned long long fl = 0;
    report("get_access_bad_device", cuMemGetAccess(&fl, &loc, p));

    // Unmap.
    report("unmap_unmapped", cuMemUnmap(p + 4 * G, G));
    report("unmap_part_of_mapping", cuMemUnmap(p + G, G));
    report("unmap_unaligned", cuMemUnmap(p + G / 2, G));
    report("unmap_size_zero", cuMemUnmap(p, 0));
    report("unmap_unreserved", cuMemUnmap(far, G));
    report("unmap_mapped_and_unmapped", cuMemUnmap(p + G, 3 * G));
    report("unmap_two_mappings", cuMemUnmap(p, 3 * G));
    report("unmap_twice", cuMemUnmap(p, G));
    report("remap_after_unmap", cuMemMap(p, G, 0, hx, 0));
    get_access_case("get_access_after_remap", p);
    report("set_access_again", set_rw(p, G));

    // Release while mapped: the mapping stays usable.
    report("release_never_mapped", cuMemRelease(hx2));
    CUdeviceptr tmp;
    must(cuMemAddressReserve(&tmp, G, 0, 0, 0), "reserve tmp");
    CUmemGenericAllocationHandle hx3;
    must(import_fd(&hx3, fds[0]), "import x3");
    must(cuMemMap(tmp, G, 0, hx3, 0), "map tmp");
    report("release_mapped_handle", cuMemRelease(hx3));
    report("set_access_after_handle_released", set_rw(tmp, G));
#ifndef VMM_ERRORS_NO_COPY /* the stand-in driver has no device memory */
    unsigned v = 0x5a5a5a5a;
    report("write_after_handle_released", cuMemcpyHtoD(tmp, &v, sizeof v));
#endif

    // Free.
    report("free_with_mappings", cuMemAddressFree(tmp, G));
    report("free_part_of_reservation", cuMemAddressFree(p, 4 * G));
    report("free_interior", cuMemAddressFree(p + G, 7 * G));
    report("free_unreserved", cuMemAddressFree(far, G));
    report("free_size_zero", cuMemAddressFree(tmp, 0));
    report("unmap_last_mapping", cuMemUnmap(tmp, G));
    report("free", cuMemAddressFree(tmp, G));
    report("free_twice", cuMemAddressFree(tmp, G));
    report("unmap_freed", cuMemUnmap(tmp, G));
    report("unmap_p", cuMemUnmap(p, G));
}

// Which calls need a current context (release at exit runs without one).
static void no_context_cases(CUmemGenericAllocationHandle hy)
{
    CUdeviceptr q;
    must(cuMemAddressReserve(&q, 2 * G, 0, 0, 0), "reserve q");
    must(cuMemMap(q, 2 * G, 0, hy, 0), "map q");
    CUcontext popped;
    must(cuCtxPopCurrent(&popped), "pop");
    CUcontext cur = NULL;
    cuCtxGetCurrent(&cur);
    if (cur)
        cuCtxSetCurrent(NULL);
    report("noctx_set_access", set_rw(q, 2 * G));
    CUdeviceptr r = 0;
    CUresult rc = cuMemAddressReserve(&r, G, 0, 0, 0);
    report("noctx_reserve", rc);
    if (rc == CUDA_SUCCESS)
        report("noctx_free", cuMemAddressFree(r, G));
    report("noctx_unmap", cuMemUnmap(q, 2 * G));
    report("noctx_release", cuMemRelease(hy));
    report("noctx_address_free", cuMemAddressFree(q, 2 * G));
    cuCtxSetCurrent(ctx);
}

static void stale_handle_case(const char *name, const int *fds)
{
    CUmemGenericAllocationHandle h = 0;
    must(import_fd(&h, fds[2]), "import for stale case");
    if (strcmp(name, "release_twice") == 0) {
        report("release_first", cuMemRelease(h));
        report("release_twice", cuMemRelease(h));
    } else if (strcmp(name, "release_zero") == 0) {
        report("release_zero", cuMemRelease(0));
    } else if (strcmp(name, "release_garbage") == 0) {
        report("release_garbage", cuMemRelease((CUmemGenericAllocationHandle)0x123456789abcULL));
    } else if (strcmp(name, "map_released_handle") == 0) {
        CUdeviceptr q;
        must(cuMemAddressReserve(&q, 2 * G, 0, 0, 0), "reserve");
        report("release_first", cuMemRelease(h));
        report("map_released_handle", cuMemMap(q, 2 * G, 0, h, 0));
    } else if (strcmp(name, "after_primary_reset") == 0) {
        /* Does a context teardown take the VMM state with it? */
        CUdeviceptr q;
        must(cuMemAddressReserve(&q, 2 * G, 0, 0, 0), "reserve");
        must(cuMemMap(q, 2 * G, 0, h, 0), "map");
        CUmemAccessDesc d = rw_desc(0);
        must(cuMemSetAccess(q, 2 * G, &d, 1), "access");
        CUdevice dev0;
        must(cuDeviceGet(&dev0, 0), "device");
        report("primary_reset", cuDevicePrimaryCtxReset(dev0));
        get_access_case("reset_get_access", q);
        report("reset_unmap", cuMemUnmap(q, 2 * G));
        report("reset_address_free", cuMemAddressFree(q, 2 * G));
        report("reset_release", cuMemRelease(h));
    } else if (strcmp(name, "map_zero_handle") == 0) {
        CUdeviceptr q;
        must(cuMemAddressReserve(&q, 2 * G, 0, 0, 0), "reserve");
        report("map_zero_handle", cuMemMap(q, 2 * G, 0, 0, 0));
    }
}

int main(void)
{
    int sock;
    pid_t pid = vmm_fork_exporter(exporter, &sock);
    int fds[3];
    recv_fds(sock, fds, 3);
    setup();
    printf("granularity=%zu\n", G);
    CUmemGenericAllocationHandle hx = 0, hy = 0;
    import_cases(fds, &hx, &hy);
    reserve_cases();
    CUdeviceptr p;
    must(cuMemAddressReserve(&p, 8 * G, 0, 0, 0), "reserve p");
    map_cases(p, hx, hy, fds);
    report("free_p", cuMemAddressFree(p, 8 * G));
    no_context_cases(hy);

    // A released allocation's exported fd, still open here, still imports.
    if (write(sock, "r", 1) != 1)
        return 2;
    int zfd;
    recv_fds(sock, &zfd, 1);
    CUmemGenericAllocationHandle hz = 0, hxl = 0;
    report("import_fd_of_allocation_released_by_exporter", import_fd(&hxl, fds[0]));
    report("import_new_export", import_fd(&hz, zfd));

    // Handles the driver never gave out or already took back may crash it:
    // one such case per run, chosen by VMM_CASE.
    const char *only = getenv("VMM_CASE");
    if (only)
        stale_handle_case(only, fds);
    if (write(sock, "q", 1) != 1)
        return 2;
    int st = 0;
    waitpid(pid, &st, 0);
    printf("done exporter_status=%d\n", st);
    return 0;
}
