/*
 * ghost_peer.c - one process of the release tests (tests/test_ghost.c): an
 * exporter, an importer, or both, driven line by line on stdin and answering
 * one line per command on stdout ("ok ..." or "err CODE"). Linked with the
 * stand-in driver; ipccache comes in through LD_PRELOAD.
 *
 *   alloc BYTES      allocate and export: "ok IDX HANDLE_HEX"
 *   alloc_plain B    allocate without exporting: "ok IDX"
 *   free IDX         cuMemFree: "ok RC"
 *   open HEX         cuIpcOpenMemHandle: "ok IDX"
 *   close IDX        cuIpcCloseMemHandle: "ok RC"
 *   refs IDX         the driver's reference count of that mapping: "ok N"
 *   fork_free IDX    a fork child frees allocation IDX and exits: "ok STATUS"
 *   fork_hold HEX    a fork child opens and closes HEX, then sleeps: "ok PID"
 *   exit             exit(0), running the exit handlers
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"

#define MAX_PTRS 256
#define LAZY CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

static CUdeviceptr ptrs[MAX_PTRS];
static int nptrs;

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
    CUresult rc = cuMemAlloc(&p, strtoull(arg, NULL, 10));
    if (rc == CUDA_SUCCESS && export)
        rc = cuIpcGetMemHandle(&h, p);
    if (rc != CUDA_SUCCESS)
        return reply("err %lld", rc);
    printf("ok %d", keep(p));
    if (export) {
        putchar(' ');
        put_hex(&h);
    }
    reply("", 0);
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
}

static void dispatch(char *cmd, char *arg)
{
    if (strcmp(cmd, "alloc") == 0)
        cmd_alloc(arg, 1);
    else if (strcmp(cmd, "alloc_plain") == 0)
        cmd_alloc(arg, 0);
    else if (strcmp(cmd, "free") == 0)
        reply("ok %lld", cuMemFree(ptr_at(arg)));
    else if (strcmp(cmd, "open") == 0)
        cmd_open(arg);
    else if (strcmp(cmd, "close") == 0)
        reply("ok %lld", cuIpcCloseMemHandle(ptr_at(arg)));
    else if (strcmp(cmd, "refs") == 0)
        reply("ok %lld", fakecuda_refcount(NULL, ptr_at(arg)));
    else if (strcmp(cmd, "fork_free") == 0)
        cmd_fork_free(arg);
    else if (strcmp(cmd, "fork_hold") == 0)
        cmd_fork_hold(arg);
    else if (strcmp(cmd, "exit") == 0)
        exit(0);
    else
        reply("err %lld", -1);
}

int main(void)
{
    char line[512];
    setup();
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *arg = strchr(line, ' ');
        if (arg)
            *arg++ = '\0';
        dispatch(line, arg ? arg : (char *)"");
    }
    return 0;
}
