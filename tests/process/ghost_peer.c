/*
 * ghost_peer.c - one process of the release tests (tests/process/test_ghost.c): an
 * exporter, an importer, or both, driven line by line on stdin and answering
 * one line per command on stdout ("ok ..." or "err CODE"). Linked with the
 * stand-in driver; ipccache comes in through LD_PRELOAD.
 *
 *   alloc BYTES      allocate and export: "ok IDX HANDLE_HEX"
 *   alloc_plain B    allocate without exporting: "ok IDX"
 *   alloc_inner B O  allocate, export the pointer O bytes inside: "ok IDX HANDLE_HEX"
 *   free IDX         cuMemFree: "ok RC"
 *   open HEX         cuIpcOpenMemHandle: "ok IDX"
 *   close IDX        cuIpcCloseMemHandle: "ok RC"
 *   refs IDX         the driver's reference count of that mapping: "ok N"
 *   reexport IDX O   cuIpcGetMemHandle again, of the pointer O bytes inside
 *                    allocation IDX: "ok HANDLE_HEX"
 *   ctx_new          a context of its own on device 0, made current: "ok CTX"
 *   ctx CTX          makes context CTX current (0: the primary): "ok RC"
 *   unmaps           the mappings the stand-in really unmapped so far: "ok N"
 *   fork_free IDX    a fork child frees allocation IDX and exits: "ok STATUS"
 *   fork_hold HEX    a fork child opens and closes HEX, then sleeps: "ok PID"
 *   fork_exit        a fork child exits at once (its exit handlers run): "ok STATUS"
 *   exec             exec()s this program again (the library loads anew): "ok 0"
 *   deny_threads     from now on no thread can be created (EAGAIN, as at a
 *                    pids limit): "ok 0"
 *   exit             exit(0), running the exit handlers
 *   held_waits       under tests/process/helper_hold_lib.c: how often the thread
 *                    that created the held helper went to sleep since (-1:
 *                    none held): "ok N"
 *   release_helper   lets the held helper thread start: "ok 0"
 *   open_together HEX1 HEX2  two threads open one handle each at the same
 *                    moment and close it again (cached: idle): "ok RC" (the
 *                    first failure's, 0 when both succeeded)
 *   reopen_at_push HEX  the next cuCtxPushCurrent of any thread (the release
 *                    helper's, closing for the library) first opens HEX on
 *                    that thread, in the primary context: "ok 0"
 *   reopened         the index that open gave (-1: not yet, or it failed): "ok IDX"
 *
 * Context teardown (the exporter's allocations in that context go with it):
 *   ctx_create       cuCtxCreate on device 0, made current: "ok RC"
 *   ctx_destroy      cuCtxDestroy of the newest one ctx_create made: "ok RC"
 *   ctx_destroy_direct  the same past every interposer (the stand-in's own
 *                    call, as a library bound to the driver makes it): "ok RC"
 *   primary_retain   one more reference to device 0's primary context, made
 *                    current (setup took the first): "ok RC"
 *   primary_release  cuDevicePrimaryCtxRelease of device 0: "ok RC"
 *   primary_reset    cuDevicePrimaryCtxReset of device 0: "ok RC"
 *
 * The VMM path (PyTorch's expandable segments), in the same words:
 *   vmm_alloc BYTES  cuMemCreate and export to an fd it keeps: "ok IDX PID FD"
 *   vmm_release IDX  close the exported fd, then cuMemRelease: "ok RC"
 *   vmm_open PID FD BYTES  the consumer's rebuild: pidfd_getfd, import, close
 *                    the fd, reserve, map, set access: "ok IDX"
 *   vmm_close IDX    the consumer's release: unmap, release, address free: "ok RC"
 *   vmm_drop IDX     its first half: unmap, release: "ok RC"
 *   vmm_free_in_unmap IDX  its second half, the address free, once the
 *                    stand-in has an unmap under way (its window widened
 *                    by FAKECUDA_VMM_SLOW_UNMAP_MS; up to 10 s): "ok RC"
 *   deny_cross_kcmp  from now on kcmp between two processes fails (EPERM)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_vmm.h"

#ifndef SYS_clone3
#define SYS_clone3 435 /* the same number on every architecture */
#endif

#define MAX_PTRS 256
#define LAZY CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

static CUdeviceptr ptrs[MAX_PTRS];
static int nptrs;
static CUcontext ctxs[8];
static int nctxs;

static void reply(const char *fmt, long long a)
{
    printf(fmt, a);
    putchar('\n');
    fflush(stdout);
}

static int keep(CUdeviceptr p)
{
    if (nptrs == MAX_PTRS)
        return -1;
    ptrs[nptrs] = p;
    return nptrs++;
}

static CUdeviceptr ptr_at(const char *arg)
{
    int i = atoi(arg);
    return i >= 0 && i < nptrs ? ptrs[i] : 0;
}

static void put_hex(const CUipcMemHandle *h)
{
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        printf("%02x", (unsigned char)h->reserved[i]);
}

static int parse_hex(const char *s, CUipcMemHandle *h)
{
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        h->reserved[i] = (char)v;
    }
    return 0;
}

static void cmd_alloc(const char *arg, int export)
{
    CUdeviceptr p;
    CUipcMemHandle h;
    char *inner = NULL;
    CUresult rc = cuMemAlloc(&p, strtoull(arg, &inner, 10));
    if (rc == CUDA_SUCCESS && export)
        rc = cuIpcGetMemHandle(&h, p + strtoull(inner, NULL, 10));
    if (rc != CUDA_SUCCESS)
        return reply("err %lld", rc);
    printf("ok %d", keep(p));
    if (export) {
        putchar(' ');
        put_hex(&h);
    }
    reply("", 0);
}

static void cmd_reexport(const char *arg)
{
    CUipcMemHandle h;
    const char *offset = strchr(arg, ' ');
    CUresult rc = cuIpcGetMemHandle(&h, ptr_at(arg) + (offset ? strtoull(offset, NULL, 10) : 0));
    if (rc != CUDA_SUCCESS)
        return reply("err %lld", rc);
    printf("ok ");
    put_hex(&h);
    reply("", 0);
}

static void cmd_ctx_new(void)
{
    CUcontext c;
    if (nctxs == (int)(sizeof(ctxs) / sizeof(ctxs[0])))
        return reply("err %lld", -1);
    CUresult rc = cuCtxCreate_v2(&c, 0, 0);
    if (rc != CUDA_SUCCESS)
        return reply("err %lld", rc);
    ctxs[nctxs] = c;
    reply("ok %lld", nctxs++);
}

static void cmd_ctx(const char *arg)
{
    int i = atoi(arg);
    reply("ok %lld", i >= 0 && i < nctxs ? cuCtxSetCurrent(ctxs[i]) : CUDA_ERROR_INVALID_VALUE);
}

static void cmd_unmaps(void)
{
    struct fakecuda_counters c;
    fakecuda_get_counters(&c);
    reply("ok %lld", (long long)c.unmaps);
}

static void cmd_open(const char *arg)
{
    CUipcMemHandle h;
    CUdeviceptr p = 0;
    if (parse_hex(arg, &h) < 0)
        return reply("err %lld", CUDA_ERROR_INVALID_VALUE);
    CUresult rc = cuIpcOpenMemHandle(&p, h, LAZY);
    if (rc != CUDA_SUCCESS)
        return reply("err %lld", rc);
    reply("ok %lld", keep(p));
}

/* Two threads whose opens meet (a program's first misses often do). */
struct together {
    CUipcMemHandle handle;
    CUresult rc;
    pthread_barrier_t *go;
};

static void *open_and_close(void *arg)
{
    struct together *t = arg;
    CUdeviceptr p = 0;
    cuCtxSetCurrent(ctxs[0]);
    pthread_barrier_wait(t->go);
    t->rc = cuIpcOpenMemHandle(&p, t->handle, LAZY);
    if (t->rc == CUDA_SUCCESS)
        t->rc = cuIpcCloseMemHandle(p);
    return NULL;
}

static void cmd_open_together(const char *arg)
{
    char hex[2][2 * CU_IPC_HANDLE_SIZE + 1];
    struct together t[2];
    pthread_t threads[2];
    pthread_barrier_t go;
    if (sscanf(arg, "%128s %128s", hex[0], hex[1]) != 2 || parse_hex(hex[0], &t[0].handle) < 0 ||
        parse_hex(hex[1], &t[1].handle) < 0)
        return reply("err %lld", CUDA_ERROR_INVALID_VALUE);
    pthread_barrier_init(&go, NULL, 2);
    for (int i = 0; i < 2; i++) {
        t[i].go = &go;
        if (pthread_create(&threads[i], NULL, open_and_close, &t[i]) != 0)
            exit(3);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&go);
    reply("ok %lld", (long long)(t[0].rc != CUDA_SUCCESS ? t[0].rc : t[1].rc));
}

/* A re-open from inside the library's close: the program's other thread
 * opening the handle again while the helper lets go of it. */
static CUipcMemHandle reopen_handle;
static _Atomic int reopened_at = -1;

static void reopen_now(void *unused)
{
    (void)unused;
    CUcontext previous = NULL;
    CUdeviceptr p = 0;
    cuCtxGetCurrent(&previous);
    cuCtxSetCurrent(ctxs[0]);
    if (cuIpcOpenMemHandle(&p, reopen_handle, LAZY) == CUDA_SUCCESS)
        atomic_store(&reopened_at, keep(p));
    cuCtxSetCurrent(previous);
}

static void cmd_reopen_at_push(const char *arg)
{
    if (parse_hex(arg, &reopen_handle) < 0)
        return reply("err %lld", CUDA_ERROR_INVALID_VALUE);
    fakecuda_on_next_push(reopen_now, NULL);
    reply("ok %lld", 0);
}

static void cmd_fork_free(const char *arg)
{
    CUdeviceptr p = ptr_at(arg);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        exit(cuMemFree(p) == CUDA_SUCCESS ? 0 : 1);
    int status = -1;
    waitpid(pid, &status, 0);
    reply("ok %lld", status);
}

static void cmd_fork_exit(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        exit(0);
    int status = -1;
    waitpid(pid, &status, 0);
    reply("ok %lld", status);
}

/* The child is another importer: it must register and answer on its own. */
static void cmd_fork_hold(const char *arg)
{
    CUipcMemHandle h;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* ends with the importer */
        CUdeviceptr p = 0;
        if (parse_hex(arg, &h) < 0 || cuIpcOpenMemHandle(&p, h, LAZY) != CUDA_SUCCESS ||
            cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
            reply("err %lld", 1);
        else
            reply("ok %lld", getpid());
        for (int i = 0; i < 600; i++)
            usleep(100000);
        exit(0);
    }
}

/* The same program again: what a launcher that re-execs does. */
static char **saved_argv;
static void cmd_exec(void)
{
    fflush(stdout);
    execv("/proc/self/exe", (char *[]){ saved_argv[0], (char *)"execed", NULL });
    reply("err %lld", errno);
}

/* clone3 answers ENOSYS (glibc then uses clone), clone of a thread EAGAIN:
 * pthread_create fails as in a container at its pids limit; fork works. */
static void cmd_deny_threads(void)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAGAIN),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { sizeof(code) / sizeof(code[0]), code };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return reply("err %lld", errno);
    reply("ok %lld", 0);
}

/* ---- the VMM path ---------------------------------------------------------- */

struct vmm_slot {
    CUmemGenericAllocationHandle h;
    int fd;                   /* exporter: the exported fd */
    CUdeviceptr ptr;          /* importer: the rebuilt range */
    size_t size;
};
static struct vmm_slot vmm[MAX_PTRS];
static int nvmm;

static int vmm_keep(struct vmm_slot s)
{
    if (nvmm == MAX_PTRS)
        return -1;
    vmm[nvmm] = s;
    return nvmm++;
}

static struct vmm_slot *vmm_at(const char *arg)
{
    int i = atoi(arg);
    return i >= 0 && i < nvmm ? &vmm[i] : &vmm[MAX_PTRS - 1];
}

static void cmd_vmm_alloc(const char *arg)
{
    CUmemAllocationProp prop = { 0 };
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    struct vmm_slot s = { .size = strtoull(arg, NULL, 10) };
    CUresult rc = cuMemCreate(&s.h, s.size, &prop, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuMemExportToShareableHandle(&s.fd, s.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc != CUDA_SUCCESS)
        return reply("err %lld", rc);
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY); /* importers may take our fds (Yama) */
    printf("ok %d %d", vmm_keep(s), (int)getpid());
    reply(" %lld", s.fd);
}

/* As PyTorch's ExpandableSegment drops a chunk: its fd, then its handle. */
static void cmd_vmm_release(const char *arg)
{
    struct vmm_slot *s = vmm_at(arg);
    close(s->fd);
    reply("ok %lld", cuMemRelease(s->h));
}

/* As PyTorch's rebuild of one chunk's segment. */
static CUresult vmm_rebuild(int pid, int theirs, struct vmm_slot *s)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int fd = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, theirs, 0);
    if (pidfd >= 0)
        close(pidfd);
    if (fd < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = cuMemImportFromShareableHandle(&s->h, (void *)(intptr_t)fd,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    CUmemAccessDesc acc = { { CU_MEM_LOCATION_TYPE_DEVICE, 0 }, CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    if (rc == CUDA_SUCCESS)
        rc = cuMemAddressReserve(&s->ptr, s->size, 0, 0, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuMemMap(s->ptr, s->size, 0, s->h, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuMemSetAccess(s->ptr, s->size, &acc, 1);
    return rc;
}

static void cmd_vmm_open(const char *arg)
{
    int pid = 0, fd = -1;
    unsigned long long bytes = 0;
    struct vmm_slot s = { .fd = -1 };
    if (sscanf(arg, "%d %d %llu", &pid, &fd, &bytes) != 3)
        return reply("err %lld", CUDA_ERROR_INVALID_VALUE);
    s.size = bytes;
    CUresult rc = vmm_rebuild(pid, fd, &s);
    if (rc != CUDA_SUCCESS)
        return reply("err %lld", rc);
    reply("ok %lld", vmm_keep(s));
}

static CUresult vmm_drop(const struct vmm_slot *s)
{
    CUresult rc = cuMemUnmap(s->ptr, s->size);
    return rc == CUDA_SUCCESS ? cuMemRelease(s->h) : rc;
}

static void cmd_vmm_close(const char *arg)
{
    struct vmm_slot *s = vmm_at(arg);
    CUresult rc = vmm_drop(s);
    if (rc == CUDA_SUCCESS)
        rc = cuMemAddressFree(s->ptr, s->size);
    reply("ok %lld", rc);
}

static void cmd_vmm_free_in_unmap(const char *arg)
{
    struct vmm_slot *s = vmm_at(arg);
    for (int i = 0; i < 10000 && !fakevmm_unmaps_under_way(); i++)
        usleep(1000);
    if (!fakevmm_unmaps_under_way())
        return reply("err %lld", -2);
    reply("ok %lld", cuMemAddressFree(s->ptr, s->size));
}

/* kcmp(pid1, pid2, ...) with pid1 != pid2 fails, as where another process's
 * files may not be compared; kcmp on our own files still works. */
static void cmd_deny_cross_kcmp(void)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_kcmp, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_X, 0, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog = { sizeof(code) / sizeof(code[0]), code };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return reply("err %lld", errno);
    reply("ok %lld", 0);
}

/* ---- context teardown -------------------------------------------------------- */

static CUcontext made[16];
static int nmade;

static void cmd_ctx_create(void)
{
    CUdevice dev;
    CUresult rc = nmade < 16 ? cuDeviceGet(&dev, 0) : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS)
        rc = cuCtxCreate_v2(&made[nmade], 0, dev);
    nmade += rc == CUDA_SUCCESS;
    reply("ok %lld", rc);
}

static void cmd_ctx_destroy(CUresult (*destroy)(CUcontext))
{
    reply("ok %lld", nmade ? destroy(made[--nmade]) : CUDA_ERROR_INVALID_CONTEXT);
}

static void cmd_primary_retain(void)
{
    CUcontext ctx;
    CUresult rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    reply("ok %lld", rc == CUDA_SUCCESS ? cuCtxSetCurrent(ctx) : rc);
}

/* helper_hold_lib.c's functions, when it is preloaded. */
static void cmd_hold(const char *name)
{
    void *fn = dlsym(RTLD_DEFAULT, name);
    if (!fn)
        return reply("err %lld", -1);
    if (strcmp(name, "helper_hold_waits") == 0)
        return reply("ok %lld", ((int (*)(void))fn)());
    ((void (*)(void))fn)();
    reply("ok %lld", 0);
}

static void setup(void)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "ghost_peer: cannot set up the driver\n");
        exit(2);
    }
    ctxs[nctxs++] = ctx;
}

static void dispatch(char *cmd, char *arg)
{
    if (strcmp(cmd, "alloc") == 0)
        cmd_alloc(arg, 1);
    else if (strcmp(cmd, "alloc_plain") == 0)
        cmd_alloc(arg, 0);
    else if (strcmp(cmd, "alloc_inner") == 0)
        cmd_alloc(arg, 1);
    else if (strcmp(cmd, "exec") == 0)
        cmd_exec();
    else if (strcmp(cmd, "deny_threads") == 0)
        cmd_deny_threads();
    else if (strcmp(cmd, "free") == 0)
        reply("ok %lld", cuMemFree(ptr_at(arg)));
    else if (strcmp(cmd, "open") == 0)
        cmd_open(arg);
    else if (strcmp(cmd, "close") == 0)
        reply("ok %lld", cuIpcCloseMemHandle(ptr_at(arg)));
    else if (strcmp(cmd, "refs") == 0)
        reply("ok %lld", fakecuda_refcount(NULL, ptr_at(arg)));
    else if (strcmp(cmd, "reexport") == 0)
        cmd_reexport(arg);
    else if (strcmp(cmd, "ctx_new") == 0)
        cmd_ctx_new();
    else if (strcmp(cmd, "ctx") == 0)
        cmd_ctx(arg);
    else if (strcmp(cmd, "unmaps") == 0)
        cmd_unmaps();
    else if (strcmp(cmd, "fork_free") == 0)
        cmd_fork_free(arg);
    else if (strcmp(cmd, "fork_exit") == 0)
        cmd_fork_exit();
    else if (strcmp(cmd, "fork_hold") == 0)
        cmd_fork_hold(arg);
    else if (strcmp(cmd, "vmm_alloc") == 0)
        cmd_vmm_alloc(arg);
    else if (strcmp(cmd, "vmm_release") == 0)
        cmd_vmm_release(arg);
    else if (strcmp(cmd, "vmm_open") == 0)
        cmd_vmm_open(arg);
    else if (strcmp(cmd, "vmm_close") == 0)
        cmd_vmm_close(arg);
    else if (strcmp(cmd, "vmm_drop") == 0)
        reply("ok %lld", vmm_drop(vmm_at(arg)));
    else if (strcmp(cmd, "vmm_free_in_unmap") == 0)
        cmd_vmm_free_in_unmap(arg);
    else if (strcmp(cmd, "deny_cross_kcmp") == 0)
        cmd_deny_cross_kcmp();
    else if (strcmp(cmd, "held_waits") == 0)
        cmd_hold("helper_hold_waits");
    else if (strcmp(cmd, "release_helper") == 0)
        cmd_hold("helper_hold_release");
    else if (strcmp(cmd, "open_together") == 0)
        cmd_open_together(arg);
    else if (strcmp(cmd, "reopen_at_push") == 0)
        cmd_reopen_at_push(arg);
    else if (strcmp(cmd, "reopened") == 0)
        reply("ok %lld", atomic_load(&reopened_at));
    else if (strcmp(cmd, "ctx_create") == 0)
        cmd_ctx_create();
    else if (strcmp(cmd, "ctx_destroy") == 0)
        cmd_ctx_destroy(cuCtxDestroy);
    else if (strcmp(cmd, "ctx_destroy_direct") == 0)
        cmd_ctx_destroy(fakecuda_ctx_destroy_direct);
    else if (strcmp(cmd, "primary_retain") == 0)
        cmd_primary_retain();
    else if (strcmp(cmd, "primary_release") == 0)
        reply("ok %lld", cuDevicePrimaryCtxRelease(0));
    else if (strcmp(cmd, "primary_reset") == 0)
        reply("ok %lld", cuDevicePrimaryCtxReset(0));
    else if (strcmp(cmd, "exit") == 0)
        exit(0);
    else
        reply("err %lld", -1);
}

int main(int argc, char **argv)
{
    char line[512];
    saved_argv = argv;
    setup();
    if (argc > 1) /* came back from exec */
        reply("ok %lld", 0);
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *arg = strchr(line, ' ');
        if (arg)
            *arg++ = '\0';
        dispatch(line, arg ? arg : (char *)"");
    }
    return 0;
}
