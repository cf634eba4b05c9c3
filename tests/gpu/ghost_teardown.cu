// ghost_teardown.cu - does an exporter's context teardown give back the memory
// it exported while an importer keeps a (cached, idle) mapping of it?
// For tests/gpu/run.sh.
//
//   ghost_teardown [--way reset|release|destroy] [--size BYTES]
//
// The exporter makes the context that way tears down current (the primary
// context for reset, cuDevicePrimaryCtxReset, and release, its one and last
// cuDevicePrimaryCtxRelease; a context of its own for destroy, cuCtxDestroy),
// allocates SIZE bytes (default 1 GiB) there with cuMemAlloc and exports them.
// The importer (this program again, exec'd: a process cannot open its own
// export) opens the handle and closes it - with ipccache the mapping stays
// cached, idle - and stays alive; it reads GPU 0's free memory before and
// after the exporter's teardown. One line:
//
//   way=... size=... free_before=... free_after=... given_back=... importer_pid=... ok=1
//
// given_back is free_after - free_before: the allocation and the exporter's
// context. ok=1 when it is at least SIZE - 64 MiB, as without ipccache. Run
// without and with the preload: both must say ok=1, with given_back alike.
#include <cuda.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const long long kSlack = 64ll << 20;

static int check(CUresult e, const char *what)
{
    if (e != CUDA_SUCCESS)
        fprintf(stderr, "ghost_teardown: %s: error %d\n", what, (int)e);
    return e == CUDA_SUCCESS;
}

static void to_hex(const CUipcMemHandle &h, char *out)
{
    for (size_t i = 0; i < sizeof(h); i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)h.reserved[i]);
}

static int from_hex(const char *in, CUipcMemHandle *h)
{
    if (strlen(in) < 2 * sizeof(*h))
        return 0;
    for (size_t i = 0; i < sizeof(*h); i++)
        if (sscanf(in + 2 * i, "%2hhx", (unsigned char *)&h->reserved[i]) != 1)
            return 0;
    return 1;
}

static int primary_current(CUdevice dev)
{
    CUcontext ctx;
    return check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") &&
           check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

// Per line on stdin: "open HEX" opens and closes the handle ("closed");
// "free" answers GPU 0's free bytes. Until EOF: the cached mapping must live
// through the exporter's teardown.
static int importer_main(void)
{
    CUdevice dev;
    if (!check(cuInit(0), "cuInit") || !check(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
        !primary_current(dev))
        return 3;
    char line[256];
    while (fgets(line, sizeof(line), stdin)) {
        if (strncmp(line, "open ", 5) == 0) {
            CUipcMemHandle h;
            CUdeviceptr p = 0;
            if (!from_hex(line + 5, &h) ||
                !check(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "open") ||
                !check(cuIpcCloseMemHandle(p), "close"))
                return 3;
            printf("closed\n");
        } else {
            size_t free_b = 0, total = 0;
            if (!check(cuMemGetInfo(&free_b, &total), "cuMemGetInfo"))
                return 3;
            printf("free %zu\n", free_b);
        }
        fflush(stdout);
    }
    return 0;
}

struct importer {
    pid_t pid;
    FILE *to, *from;
};

static int spawn(const char *self, struct importer *imp)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        return 0;
    imp->pid = fork();
    if (imp->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(self, self, "--importer", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    imp->to = fdopen(in[1], "w");
    imp->from = fdopen(out[0], "r");
    return imp->pid > 0 && imp->to && imp->from;
}

// Sends one line; the reply's number after word ("closed": 0), -1 on failure.
static long long ask(struct importer *imp, const char *line, const char *word)
{
    char reply[128];
    fprintf(imp->to, "%s\n", line);
    fflush(imp->to);
    if (!fgets(reply, sizeof(reply), imp->from) || strncmp(reply, word, strlen(word)) != 0)
        return -1;
    return atoll(reply + strlen(word));
}

// Makes current the context that way tears down; tears it down.
static int enter(const char *way, CUdevice dev, CUcontext *own)
{
    if (strcmp(way, "destroy") != 0)
        return primary_current(dev);
#if CUDA_VERSION >= 13000
    return check(cuCtxCreate(own, NULL, 0, dev), "cuCtxCreate");
#else
    return check(cuCtxCreate(own, 0, dev), "cuCtxCreate");
#endif
}

static int tear_down(const char *way, CUdevice dev, CUcontext own)
{
    if (strcmp(way, "destroy") == 0)
        return check(cuCtxDestroy(own), "cuCtxDestroy");
    if (strcmp(way, "release") == 0)
        return check(cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
    return check(cuDevicePrimaryCtxReset(dev), "cuDevicePrimaryCtxReset");
}

static int exporter_main(const char *self, const char *way, size_t size)
{
    CUdevice dev;
    CUcontext own = NULL;
    CUdeviceptr buf = 0;
    CUipcMemHandle h;
    char line[8 + 2 * sizeof(h)] = "open ";
    struct importer imp;
    if (!check(cuInit(0), "cuInit") || !check(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
        !enter(way, dev, &own) || !check(cuMemAlloc(&buf, size), "cuMemAlloc") ||
        !check(cuIpcGetMemHandle(&h, buf), "cuIpcGetMemHandle") || !spawn(self, &imp))
        return 3;
    to_hex(h, line + 5);
    long long before = ask(&imp, line, "closed") == 0 ? ask(&imp, "free", "free ") : -1;
    int torn = before >= 0 && tear_down(way, dev, own);
    long long after = torn ? ask(&imp, "free", "free ") : -1;
    fclose(imp.to);
    fclose(imp.from);
    int status = 0;
    waitpid(imp.pid, &status, 0);
    int good = before >= 0 && after >= 0 && after - before >= (long long)size - kSlack &&
               WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("way=%s size=%zu free_before=%lld free_after=%lld given_back=%lld importer_pid=%d ok=%d\n",
           way, size, before, after, after - before, (int)imp.pid, good);
    return good ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *way = "reset";
    size_t size = 1ull << 30;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--importer") == 0)
            return importer_main();
        if (strcmp(argv[i], "--way") == 0 && i + 1 < argc)
            way = argv[++i];
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 10);
    }
    if (strcmp(way, "reset") != 0 && strcmp(way, "release") != 0 && strcmp(way, "destroy") != 0) {
        fprintf(stderr, "ghost_teardown: --way reset|release|destroy\n");
        return 2;
    }
    return exporter_main(argv[0], way, size);
}
