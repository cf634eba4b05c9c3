// ghost_free.cu - does an exporter's cudaFree give the memory back while an
// importer keeps a (cached, idle) mapping of it? For tests/gpu/run.sh.
//
//   ghost_free [--size BYTES] [--export-device D] [--import-device D]
//
// The exporter allocates SIZE bytes and exports them; an importer (this
// program again, exec'd: a process cannot open its own export) opens the
// handle and closes it - with ipccache the mapping stays cached, idle - and
// then stays alive. The exporter frees the allocation and reads the free
// memory of its GPU before and after the free:
//
//   size=... freed=... ok=1
//
// ok=1 when the free gave back SIZE bytes within 64 MiB, as it does without
// ipccache. Run without and with the preload; both must say ok=1.

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

const long long kSlack = 64ll << 20;

struct Options {
    size_t size = 1ull << 30;
    int export_device = 0;
    int import_device = 0;
    const char *handle_hex = nullptr;  // set: this process is the importer
};

bool ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    fprintf(stderr, "ghost_free: %s: %s\n", what, cudaGetErrorString(e));
    return false;
}

void hex_encode(const cudaIpcMemHandle_t &h, char *out) {
    const unsigned char *b = (const unsigned char *)&h;
    for (size_t i = 0; i < sizeof h; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

bool hex_decode(const char *s, cudaIpcMemHandle_t *h) {
    unsigned char *b = (unsigned char *)h;
    if (strlen(s) != 2 * sizeof *h) return false;
    for (size_t i = 0; i < sizeof *h; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return false;
        b[i] = (unsigned char)v;
    }
    return true;
}

// Opens and closes the handle, says "closed" on stdout, then waits for the
// exporter to close our stdin: the cached mapping must live through its free.
int run_importer(const Options &o) {
    cudaIpcMemHandle_t h;
    void *p = nullptr;
    if (!hex_decode(o.handle_hex, &h)) return 2;
    if (!ok(cudaSetDevice(o.import_device), "cudaSetDevice") ||
        !ok(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle") ||
        !ok(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle"))
        return 3;
    printf("closed\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

// Starts the importer with pipes on its stdin and stdout.
pid_t spawn_importer(const char *self, const Options &o, const char *hex, int *to, int *from) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        char dev[16];
        snprintf(dev, sizeof dev, "%d", o.import_device);
        execl(self, self, "--import-device", dev, "--handle", hex, (char *)nullptr);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    *to = in[1];
    *from = out[0];
    return pid;
}

size_t free_bytes() {
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    return free_b;
}

int run_exporter(const char *self, const Options &o) {
    void *buf = nullptr;
    cudaIpcMemHandle_t h;
    char hex[2 * sizeof h + 1];
    if (!ok(cudaSetDevice(o.export_device), "cudaSetDevice") ||
        !ok(cudaMalloc(&buf, o.size), "cudaMalloc") ||
        !ok(cudaIpcGetMemHandle(&h, buf), "cudaIpcGetMemHandle"))
        return 3;
    hex_encode(h, hex);
    int to = -1, from = -1;
    pid_t imp = spawn_importer(self, o, hex, &to, &from);
    char line[32] = {0};
    ssize_t n = imp > 0 ? read(from, line, sizeof line - 1) : -1;
    if (n <= 0 || strncmp(line, "closed", 6) != 0) {
        fprintf(stderr, "ghost_free: the importer failed\n");
        return 3;
    }
    size_t before = free_bytes();
    if (!ok(cudaFree(buf), "cudaFree") || !ok(cudaDeviceSynchronize(), "sync")) return 3;
    size_t after = free_bytes();
    close(to);  // the importer may go now
    int status = 0;
    waitpid(imp, &status, 0);
    long long freed = (long long)after - (long long)before;
    int good = llabs(freed - (long long)o.size) <= kSlack;
    printf("size=%zu freed=%lld before=%zu after=%zu importer_pid=%d ok=%d\n", o.size, freed,
           before, after, (int)imp, good);
    return good && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size")) o.size = strtoull(argv[i + 1], nullptr, 10);
        else if (!strcmp(argv[i], "--export-device")) o.export_device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--import-device")) o.import_device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--handle")) o.handle_hex = argv[i + 1];
        else {
            fprintf(stderr, "usage: ghost_free [--size B] [--export-device D] [--import-device D]\n");
            return 2;
        }
    }
    return o.handle_hex ? run_importer(o) : run_exporter(argv[0], o);
}
