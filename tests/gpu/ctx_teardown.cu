// ctx_teardown.cu - on a real driver, a context that dies must never hand
// back its dead mapping: cudaDeviceReset (primary context reset) and
// cuCtxDestroy followed by a new context, each then reopening the same
// handle and reading the exporter's data through it.
//
//   ctx_teardown            exporter: allocates, fills, runs the importer
//   ctx_teardown import HEX importer (a separate process: own exports fail)
//
// Prints key=value lines; exit 0 when every read returned the right value.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const unsigned kMagic = 0x1badcafe;

static int check_rt(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        printf("error=%s code=%d\n", what, (int)e);
    return e == cudaSuccess;
}

static int check_drv(CUresult e, const char *what)
{
    if (e != CUDA_SUCCESS)
        printf("error=%s code=%d\n", what, (int)e);
    return e == CUDA_SUCCESS;
}

static void to_hex(const cudaIpcMemHandle_t &h, char *out)
{
    for (size_t i = 0; i < sizeof(h); i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)&h)[i]);
}

static void from_hex(const char *in, cudaIpcMemHandle_t *h)
{
    for (size_t i = 0; i < sizeof(*h); i++)
        sscanf(in + 2 * i, "%2hhx", &((unsigned char *)h)[i]);
}

// Opens through cudart in the current (primary) context, reads, closes.
static int read_runtime(const cudaIpcMemHandle_t &h, const char *step)
{
    void *p = NULL;
    unsigned v = 0;
    int ok = check_rt(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), step) &&
             check_rt(cudaMemcpy(&v, p, sizeof(v), cudaMemcpyDeviceToHost), step) &&
             check_rt(cudaIpcCloseMemHandle(p), step);
    printf("step=%s ok=%d value_ok=%d\n", step, ok, v == kMagic);
    return ok && v == kMagic;
}

// Same through the driver API in a context of our own.
static int read_driver(const cudaIpcMemHandle_t &h, const char *step)
{
    CUipcMemHandle dh;
    memcpy(&dh, &h, sizeof(dh));
    CUdeviceptr p = 0;
    unsigned v = 0;
    int ok = check_drv(cuIpcOpenMemHandle(&p, dh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), step) &&
             check_drv(cuMemcpyDtoH(&v, p, sizeof(v)), step) &&
             check_drv(cuIpcCloseMemHandle(p), step);
    printf("step=%s ok=%d value_ok=%d\n", step, ok, v == kMagic);
    return ok && v == kMagic;
}

static int import_main(const char *hex)
{
    cudaIpcMemHandle_t h;
    from_hex(hex, &h);
    int good = check_rt(cudaSetDevice(0), "set_device") && read_runtime(h, "primary_first");
    good &= read_runtime(h, "primary_again");
    good &= check_rt(cudaDeviceReset(), "device_reset") && check_rt(cudaSetDevice(0), "set_device");
    good &= read_runtime(h, "after_device_reset");

    CUcontext c1 = NULL, c2 = NULL;
    CUdevice dev;
    good &= check_drv(cuDeviceGet(&dev, 0), "device_get");
    good &= check_drv(cuCtxCreate(&c1, NULL, 0, dev), "ctx_create") && read_driver(h, "own_context");
    good &= check_drv(cuCtxDestroy(c1), "ctx_destroy");
    good &= check_drv(cuCtxCreate(&c2, NULL, 0, dev), "ctx_create") && read_driver(h, "new_context");
    printf("same_context_address=%d\n", c1 == c2);
    good &= check_drv(cuCtxDestroy(c2), "ctx_destroy");
    printf("import_ok=%d pid=%d\n", good, (int)getpid());
    fflush(stdout);
    return good ? 0 : 1;
}

static int export_main(const char *self)
{
    void *buf = NULL;
    cudaIpcMemHandle_t h;
    char hex[2 * sizeof(h) + 1];
    if (!check_rt(cudaSetDevice(0), "set_device") || !check_rt(cudaMalloc(&buf, 2 << 20), "malloc") ||
        !check_rt(cudaMemcpy(buf, &kMagic, sizeof(kMagic), cudaMemcpyHostToDevice), "fill") ||
        !check_rt(cudaIpcGetMemHandle(&h, buf), "get_handle"))
        return 1;
    to_hex(h, hex);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "import", hex, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cudaFree(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "import") == 0)
        return import_main(argv[2]);
    return export_main(argv[0]);
}
