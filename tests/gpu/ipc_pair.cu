// ipc_pair.cu - two-process CUDA IPC check for tests/gpu/run.sh.
//
// The exporter (default mode) allocates a buffer, fills it with a pattern that
// depends on a "generation" number, and fork+execs itself twice as importer
// (a separate process is required: a process cannot open its own export):
//
//   phase=loop    K x { open(handle), read 16 bytes, check pattern, close };
//                 the exporter rewrites the buffer with a new generation
//                 between some iterations, so a cached mapping must still show
//                 the LATEST data.
//   phase=errors  error cases whose return codes run.sh compares between a run
//                 without and a run with the ipccache shim.
//
// Two phases in two processes keep the loop importer's ipccache stats exact
// (opens == K, hits == K-1, real_opens == 1) regardless of how the shim counts
// failed calls.
//
// Protocol: text lines over two pipes that the importer gets as --cmd-fd /
// --reply-fd.  Human-readable results go to the shared stdout as key=value
// lines, e.g. "case=double_close code=1".
//
// Built twice by run.sh: -cudart static and -cudart shared.

#include <cuda_runtime.h>

#include <dlfcn.h>

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct Options {
    const char *mode = "export";   // export | import
    const char *phase = "loop";    // importer: loop | errors
    size_t size = 64ull << 20;
    int iters = 50;
    int device = 0;          // importer's device
    int export_device = 0;   // exporter's device
    int cmd_fd = -1;         // importer: commands from the exporter
    int reply_fd = -1;       // importer: replies to the exporter
};

// ---------------------------------------------------------------- pattern

// A 32-bit word for (generation, word index); a cheap mixer so that neither a
// stale generation nor a wrong offset can pass by accident.
__host__ __device__ inline uint32_t pattern_word(uint32_t gen, uint64_t idx) {
    uint64_t x = (uint64_t)gen * 0x9E3779B97F4A7C15ull ^ (idx * 0xBF58476D1CE4E5B9ull);
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (uint32_t)x;
}

__global__ void fill_kernel(uint32_t *p, uint64_t nwords, uint32_t gen) {
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride)
        p[i] = pattern_word(gen, i);
}

int fill_generation(void *buf, size_t size, uint32_t gen) {
    fill_kernel<<<1024, 256>>>((uint32_t *)buf, size / 4, gen);
    cudaError_t e = cudaDeviceSynchronize();  // the importer reads right after our message
    if (e != cudaSuccess) {
        fprintf(stderr, "fill_generation: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

// Offsets cycle over the start, the middle, the end and pseudo-random spots,
// so the whole mapping is exercised, not just its first page.
size_t check_offset(size_t size, int i) {
    size_t slots = size / 16;
    switch (i % 4) {
    case 0: return 0;
    case 1: return (slots / 2) * 16;
    case 2: return (slots - 1) * 16;
    default: return ((uint64_t)i * 2654435761ull % slots) * 16;
    }
}

// Copies 16 bytes at `off` back to the host and compares them with `gen`.
bool check_pattern(const void *mapped, size_t off, uint32_t gen) {
    uint32_t got[4];
    cudaError_t e = cudaMemcpy(got, (const char *)mapped + off, sizeof got, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "check_pattern: cudaMemcpy: %s\n", cudaGetErrorString(e));
        return false;
    }
    for (int j = 0; j < 4; j++) {
        uint32_t want = pattern_word(gen, off / 4 + j);
        if (got[j] != want) {
            fprintf(stderr, "check_pattern: gen=%u off=%zu word=%d got=%08x want=%08x\n",
                    gen, off, j, got[j], want);
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------- pipes

void hex_encode(const cudaIpcMemHandle_t &h, char out[2 * sizeof h + 1]) {
    const unsigned char *b = (const unsigned char *)&h;
    for (size_t i = 0; i < sizeof h; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

bool hex_decode(const char *s, cudaIpcMemHandle_t *h) {
    unsigned char *b = (unsigned char *)h;
    for (size_t i = 0; i < sizeof *h; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return false;
        b[i] = (unsigned char)v;
    }
    return true;
}

struct Channel {
    FILE *in = nullptr;
    FILE *out = nullptr;

    bool send(const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
        va_list ap;
        va_start(ap, fmt);
        int n = vfprintf(out, fmt, ap);
        va_end(ap);
        return n >= 0 && fflush(out) == 0;
    }
    // Reads one line without its newline; false on EOF (the peer died).
    bool recv(char *buf, size_t cap) {
        if (!fgets(buf, (int)cap, in)) return false;
        buf[strcspn(buf, "\n")] = 0;
        return true;
    }
};

// Moves `fd` to `target` in a child about to exec, dropping close-on-exec.
void place_fd(int fd, int target) {
    if (fd == target) {
        fcntl(fd, F_SETFD, 0);
    } else {
        dup2(fd, target);
    }
}

struct Child {
    pid_t pid = -1;
    Channel ch;
};

// fork+exec of this same binary as an importer; the environment (and so any
// LD_PRELOAD) is inherited unchanged.
bool spawn_importer(const Options &o, const char *phase, Child *c) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) || pipe2(from_child, O_CLOEXEC)) {
        perror("pipe2");
        return false;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        return false;
    }
    exe[n] = 0;
    char size_s[32], iters_s[32], dev_s[32];
    snprintf(size_s, sizeof size_s, "%zu", o.size);
    snprintf(iters_s, sizeof iters_s, "%d", o.iters);
    snprintf(dev_s, sizeof dev_s, "%d", o.device);

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return false;
    }
    if (pid == 0) {
        // Fixed fd numbers above stdio; move the write end first in case the
        // read end already sits on 11.
        int r = to_child[0], w = from_child[1];
        if (r == 11) { r = dup(r); }
        place_fd(w, 11);
        place_fd(r, 10);
        execl(exe, exe, "import", "--phase", phase, "--size", size_s, "--iters", iters_s,
              "--device", dev_s, "--cmd-fd", "10", "--reply-fd", "11", (char *)nullptr);
        perror("execl");
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    c->pid = pid;
    c->ch.out = fdopen(to_child[1], "w");
    c->ch.in = fdopen(from_child[0], "r");
    return c->ch.out && c->ch.in;
}

// Waits for the importer; true when it exited with status 0.
bool reap(Child *c) {
    if (c->ch.out) fclose(c->ch.out);
    if (c->ch.in) fclose(c->ch.in);
    int status = 0;
    if (waitpid(c->pid, &status, 0) < 0) return false;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "importer pid %d ended with status 0x%x\n", (int)c->pid, status);
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- importer

void report_case(const char *name, cudaError_t e) {
    printf("case=%s code=%d\n", name, (int)e);
    cudaGetLastError();  // these errors are not sticky; clear them anyway
}

cudaError_t ipc_open(void **p, const cudaIpcMemHandle_t &h, unsigned flags = cudaIpcMemLazyEnablePeerAccess) {
    *p = nullptr;
    return cudaIpcOpenMemHandle(p, h, flags);
}

bool read_handle(Channel &ch, cudaIpcMemHandle_t *h) {
    char line[512];
    if (!ch.recv(line, sizeof line) || strncmp(line, "HANDLE ", 7) != 0 || !hex_decode(line + 7, h)) {
        fprintf(stderr, "importer: expected HANDLE line\n");
        return false;
    }
    return true;
}

// K iterations of open / read / close, each for the generation that the
// exporter names in its ITER line.
// ioctl(2) calls so far, as counted by tests/gpu/ioctl_count.c when it is
// preloaded; 0 without it. Seen from outside the shim: a real map or unmap
// asks the kernel driver, a cache hit does not.
unsigned long gpu_ioctls() {
    static unsigned long (*count)(void) =
        (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "ioctl_count_gpu");
    return count ? count() : 0;
}

int import_loop(const Options &o, Channel &ch, const cudaIpcMemHandle_t &h) {
    bool pattern_ok = true, same_ptr = true;
    void *first = nullptr;
    int done = 0;
    char line[128];
    unsigned long later_ioctls = 0;   // inside open/close, iterations 2..K
    for (int i = 0; i < o.iters; i++) {
        unsigned gen;
        if (!ch.recv(line, sizeof line) || sscanf(line, "ITER %u", &gen) != 1) {
            fprintf(stderr, "importer: expected ITER line at %d\n", i);
            return 1;
        }
        void *p;
        unsigned long before = gpu_ioctls();
        cudaError_t e = ipc_open(&p, h);
        unsigned long in_calls = gpu_ioctls() - before;
        if (e != cudaSuccess) {
            printf("loop_open_failed iter=%d code=%d\n", i, (int)e);
            return 1;
        }
        if (!first) first = p;
        same_ptr = same_ptr && p == first;
        bool ok = check_pattern(p, check_offset(o.size, i), gen);
        pattern_ok = pattern_ok && ok;
        before = gpu_ioctls();
        e = cudaIpcCloseMemHandle(p);
        in_calls += gpu_ioctls() - before;
        if (e != cudaSuccess) {
            printf("loop_close_failed iter=%d code=%d\n", i, (int)e);
            return 1;
        }
        if (i > 0) later_ioctls += in_calls;
        done++;
        ch.send("%s %d\n", ok ? "OK" : "BAD", i);
    }
    printf("loop_iters=%d\nloop_pattern_ok=%d\nloop_same_ptr=%d\n", done, pattern_ok, same_ptr);
    printf("loop_later_ioctls=%lu\n", later_ioctls);
    ch.send("DONE pattern_ok=%d\n", pattern_ok);
    return pattern_ok ? 0 : 1;
}

// Error cases.  Each prints its return code; run.sh demands identical codes
// with and without the shim.  Order matters: the shim's cache state is set up
// by the earlier cases (e.g. open_flags0 runs while the handle is cached idle).
int import_errors(const Options &o, Channel &ch, const cudaIpcMemHandle_t &h) {
    char line[128];
    unsigned gen;
    if (!ch.recv(line, sizeof line) || sscanf(line, "GEN %u", &gen) != 1) {
        fprintf(stderr, "importer: expected GEN line\n");
        return 1;
    }
    bool pattern_ok = true;
    void *p = nullptr, *q = nullptr;

    // A plain open+close that succeeds; with the shim it leaves the mapping idle.
    cudaError_t e = ipc_open(&p, h);
    report_case("first_open", e);
    if (e != cudaSuccess) return 1;
    pattern_ok &= check_pattern(p, check_offset(o.size, 1), gen);
    report_case("first_close", cudaIpcCloseMemHandle(p));

    // Closing it again: the driver says CUDA_ERROR_INVALID_VALUE; the shim
    // must not accept a close of a mapping whose reference is gone.
    report_case("double_close", cudaIpcCloseMemHandle(p));

    // Reopen (a hit with the shim) and close again.
    e = ipc_open(&q, h);
    report_case("reopen", e);
    if (e == cudaSuccess) {
        printf("reopen_same_ptr=%d\n", q == p);
        report_case("reopen_close", cudaIpcCloseMemHandle(q));
    }

    // Flags 0 is invalid for the driver even though the handle is now cached
    // by the shim: the shim must not turn it into a hit.
    e = ipc_open(&q, h, 0);
    report_case("open_flags0", e);
    if (e == cudaSuccess) cudaIpcCloseMemHandle(q);

    // Pointers that are no IPC mapping at all.
    report_case("close_unknown", cudaIpcCloseMemHandle((void *)(uintptr_t)0x1000));
    void *local = nullptr;
    if (cudaMalloc(&local, 1 << 20) == cudaSuccess) {
        report_case("close_local_alloc", cudaIpcCloseMemHandle(local));
        cudaFree(local);
    }

    // An interior pointer of a live mapping is not a mapping base.
    e = ipc_open(&q, h);
    report_case("open_for_interior", e);
    if (e == cudaSuccess) {
        report_case("close_interior", cudaIpcCloseMemHandle((char *)q + 4096));
        report_case("close_after_interior", cudaIpcCloseMemHandle(q));
    }

    // The driver refcounts repeated opens in one context: two opens give the
    // same pointer and need two closes; a third close fails.
    void *a = nullptr, *b = nullptr;
    report_case("nested_open_a", ipc_open(&a, h));
    report_case("nested_open_b", ipc_open(&b, h));
    printf("nested_same_ptr=%d\n", a != nullptr && a == b);
    report_case("nested_close_a", cudaIpcCloseMemHandle(a));
    // The mapping must still be readable while one reference remains.
    if (b) pattern_ok &= check_pattern(b, check_offset(o.size, 2), gen);
    report_case("nested_close_b", cudaIpcCloseMemHandle(b));
    report_case("nested_close_extra", cudaIpcCloseMemHandle(b));

    // An all-zero handle names no allocation.
    cudaIpcMemHandle_t zero;
    memset(&zero, 0, sizeof zero);
    e = ipc_open(&q, zero);
    report_case("open_zero_handle", e);
    if (e == cudaSuccess) cudaIpcCloseMemHandle(q);

    // "Open with no current context" cannot be reached through cudart (it
    // always makes the primary context current), so it is not tested here.

    // After all that, the handle must still open and show the latest data.
    e = ipc_open(&q, h);
    report_case("final_open", e);
    if (e == cudaSuccess) {
        pattern_ok &= check_pattern(q, check_offset(o.size, 3), gen);
        report_case("final_close", cudaIpcCloseMemHandle(q));
    } else {
        pattern_ok = false;
    }
    printf("errors_pattern_ok=%d\n", pattern_ok);
    ch.send("DONE pattern_ok=%d\n", pattern_ok);
    return pattern_ok ? 0 : 1;
}

int run_importer(const Options &o) {
    Channel ch;
    ch.in = fdopen(o.cmd_fd, "r");
    ch.out = fdopen(o.reply_fd, "w");
    if (!ch.in || !ch.out) {
        fprintf(stderr, "importer: bad --cmd-fd/--reply-fd\n");
        return 2;
    }
    printf("role=importer phase=%s pid=%d device=%d\n", o.phase, (int)getpid(), o.device);
    cudaError_t e = cudaSetDevice(o.device);
    if (e == cudaSuccess) e = cudaFree(nullptr);  // create the context up front
    if (e != cudaSuccess) {
        fprintf(stderr, "importer: device %d: %s\n", o.device, cudaGetErrorString(e));
        return 2;
    }
    cudaIpcMemHandle_t h;
    if (!read_handle(ch, &h)) return 2;
    if (strcmp(o.phase, "loop") == 0) return import_loop(o, ch, h);
    if (strcmp(o.phase, "errors") == 0) return import_errors(o, ch, h);
    fprintf(stderr, "importer: unknown phase %s\n", o.phase);
    return 2;
}

// ---------------------------------------------------------------- exporter

// Whether the generation changes before iteration i: right after the first
// (missing) open, so the first hit must see new data, then every 4th.
bool bump_before(int i) { return i == 1 || i % 4 == 0; }

bool drive_loop(const Options &o, void *buf, const char *hex, uint32_t *gen) {
    Child c;
    if (!spawn_importer(o, "loop", &c)) return false;
    bool ok = c.ch.send("HANDLE %s\n", hex);
    char line[128];
    for (int i = 0; ok && i < o.iters; i++) {
        if (bump_before(i)) ok = fill_generation(buf, o.size, ++*gen) == 0;
        ok = ok && c.ch.send("ITER %u\n", *gen) && c.ch.recv(line, sizeof line);
        // A "BAD" reply is recorded by the importer; keep going so that the
        // whole loop (and its stats) completes.
    }
    bool reported_ok = false;
    if (ok && c.ch.recv(line, sizeof line)) reported_ok = strcmp(line, "DONE pattern_ok=1") == 0;
    bool exited_ok = reap(&c);
    return ok && reported_ok && exited_ok;
}

bool drive_errors(const Options &o, void *buf, const char *hex, uint32_t *gen) {
    if (fill_generation(buf, o.size, ++*gen) != 0) return false;
    Child c;
    if (!spawn_importer(o, "errors", &c)) return false;
    char line[128];
    bool ok = c.ch.send("HANDLE %s\n", hex) && c.ch.send("GEN %u\n", *gen) && c.ch.recv(line, sizeof line);
    bool reported_ok = ok && strcmp(line, "DONE pattern_ok=1") == 0;
    bool exited_ok = reap(&c);
    return reported_ok && exited_ok;
}

int run_exporter(const Options &o) {
    printf("role=exporter pid=%d device=%d size=%zu iters=%d\n", (int)getpid(), o.export_device, o.size, o.iters);
    void *buf = nullptr;
    cudaError_t e = cudaSetDevice(o.export_device);
    if (e == cudaSuccess) e = cudaMalloc(&buf, o.size);
    if (e != cudaSuccess) {
        fprintf(stderr, "exporter: %s\n", cudaGetErrorString(e));
        return 2;
    }
    uint32_t gen = 1;
    if (fill_generation(buf, o.size, gen) != 0) return 2;
    cudaIpcMemHandle_t h;
    if ((e = cudaIpcGetMemHandle(&h, buf)) != cudaSuccess) {
        fprintf(stderr, "exporter: cudaIpcGetMemHandle: %s\n", cudaGetErrorString(e));
        return 2;
    }
    char hex[2 * sizeof h + 1];
    hex_encode(h, hex);

    // Opening one's own export is refused by the driver (measured: 201).
    void *self = nullptr;
    e = cudaIpcOpenMemHandle(&self, h, cudaIpcMemLazyEnablePeerAccess);
    report_case("export_self_open", e);
    if (e == cudaSuccess) cudaIpcCloseMemHandle(self);

    bool loop_ok = drive_loop(o, buf, hex, &gen);
    bool errors_ok = drive_errors(o, buf, hex, &gen);
    printf("pattern_ok=%d\n", loop_ok && errors_ok);
    cudaFree(buf);
    return loop_ok && errors_ok ? 0 : 1;
}

// ---------------------------------------------------------------- main

size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [export] [--size N[K|M|G]] [--iters K] [--device D] [--export-device E]\n"
            "  export: allocate, then run importer processes on device D (default 0)\n"
            "  (import --phase loop|errors --cmd-fd F --reply-fd F is internal)\n",
            argv0);
}

bool parse_args(int argc, char **argv, Options *o) {
    int i = 1;
    if (i < argc && argv[i][0] != '-') o->mode = argv[i++];
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (!v) return false;
        if (!strcmp(a, "--size")) o->size = parse_size(v);
        else if (!strcmp(a, "--iters")) o->iters = atoi(v);
        else if (!strcmp(a, "--device")) o->device = atoi(v);
        else if (!strcmp(a, "--export-device")) o->export_device = atoi(v);
        else if (!strcmp(a, "--phase")) o->phase = v;
        else if (!strcmp(a, "--cmd-fd")) o->cmd_fd = atoi(v);
        else if (!strcmp(a, "--reply-fd")) o->reply_fd = atoi(v);
        else return false;
        i++;
    }
    // 16-byte reads at 16-byte slots; at least 4 slots for the offset cycle.
    return o->size >= 64 && o->size % 16 == 0 && o->iters >= 2;
}

}  // namespace

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // lines from both processes stay whole and ordered
    Options o;
    if (!parse_args(argc, argv, &o)) {
        usage(argv[0]);
        return 2;
    }
    if (!strcmp(o.mode, "export")) return run_exporter(o);
    if (!strcmp(o.mode, "import")) return run_importer(o);
    usage(argv[0]);
    return 2;
}
