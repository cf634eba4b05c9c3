// ghost_free.cu - does an exporter's cudaFree give the memory back while
// importers keep (cached, idle) mappings of it? And what does that free cost?
// For tests/gpu/run.sh, and by hand as a benchmark.
//
//   ghost_free [--size BYTES] [--export-device D] [--import-device D]
//              [--importers N] [--iters K]
//
// Each of K rounds: the exporter allocates SIZE bytes and exports them; N
// importers (this program again, exec'd: a process cannot open its own
// export; N may be 0) each open the handle and close it - with ipccache the
// mapping stays cached, idle - and stay alive; the exporter frees the
// allocation, timing the call, and reads its GPU's free memory before and
// after. Then K allocations and frees of memory never exported, for
// comparison. One line:
//
//   size=... importers=N iters=K freed_min=... freed_max=... free_us_median=...
//   free_us_p99=... plain_free_us_median=... plain_free_us_p99=...
//   plain_malloc_us_median=... plain_malloc_us_p99=... importer_pid=... ok=1
//
// ok=1 when every free gave back SIZE bytes within 64 MiB, as it does without
// ipccache. Run without and with the preload; both must say ok=1.

#include <cuda_runtime.h>

#include <algorithm>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

namespace {

const long long kSlack = 64ll << 20;
const int kMaxImporters = 64;

struct Options {
    size_t size = 1ull << 30;
    int export_device = 0;
    int import_device = 0;
    int importers = 1;
    int iters = 1;
    bool importer = false;  // this process is an importer
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
    if (strlen(s) < 2 * sizeof *h) return false;
    for (size_t i = 0; i < sizeof *h; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return false;
        b[i] = (unsigned char)v;
    }
    return true;
}

// For each handle line on stdin: open, close, answer "closed". Until EOF:
// the cached mappings must live through the exporter's frees.
int run_importer(const Options &o) {
    if (!ok(cudaSetDevice(o.import_device), "cudaSetDevice")) return 3;
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        cudaIpcMemHandle_t h;
        void *p = nullptr;
        if (!hex_decode(line, &h) ||
            !ok(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle") ||
            !ok(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle"))
            return 3;
        printf("closed\n");
        fflush(stdout);
    }
    return 0;
}

struct Importer {
    pid_t pid = -1;
    FILE *to = nullptr;
    FILE *from = nullptr;
};

// The pipes are close-on-exec: a later importer must not hold an earlier
// one's stdin open, or that one never sees EOF and the exporter's wait for
// it at the end never returns (two or more importers).
bool spawn_importer(const char *self, const Options &o, Importer *imp) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return false;
    imp->pid = fork();
    if (imp->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        char dev[16];
        snprintf(dev, sizeof dev, "%d", o.import_device);
        execl(self, self, "--import-device", dev, "--importer", "1", (char *)nullptr);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    imp->to = fdopen(in[1], "w");
    imp->from = fdopen(out[0], "r");
    return imp->pid > 0 && imp->to && imp->from;
}

// Every importer opens and closes the handle; false if one failed.
bool share(std::vector<Importer> &imps, const char *hex) {
    for (Importer &imp : imps) fprintf(imp.to, "%s\n", hex), fflush(imp.to);
    for (Importer &imp : imps) {
        char line[32];
        if (!fgets(line, sizeof line, imp.from) || strncmp(line, "closed", 6) != 0) return false;
    }
    return true;
}

size_t free_bytes() {
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    return free_b;
}

double now_us() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

double percentile(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(q * v.size()))];
}

// One round: allocate, export, share, free; the bytes the free gave back.
bool round_trip(const Options &o, std::vector<Importer> &imps, double *us, long long *freed) {
    void *buf = nullptr;
    cudaIpcMemHandle_t h;
    char hex[2 * sizeof h + 1];
    if (!ok(cudaMalloc(&buf, o.size), "cudaMalloc") ||
        !ok(cudaIpcGetMemHandle(&h, buf), "cudaIpcGetMemHandle"))
        return false;
    hex_encode(h, hex);
    if (!share(imps, hex)) {
        fprintf(stderr, "ghost_free: an importer failed\n");
        return false;
    }
    size_t before = free_bytes();
    double t0 = now_us();
    if (!ok(cudaFree(buf), "cudaFree")) return false;
    *us = now_us() - t0;
    if (!ok(cudaDeviceSynchronize(), "sync")) return false;
    *freed = (long long)free_bytes() - (long long)before;
    return true;
}

// Allocations and frees of memory never exported: what every other
// allocation and free costs.
bool plain_frees(const Options &o, std::vector<double> *malloc_us, std::vector<double> *us) {
    for (int i = 0; i < o.iters; i++) {
        void *buf = nullptr;
        double t0 = now_us();
        if (!ok(cudaMalloc(&buf, o.size), "cudaMalloc")) return false;
        double t1 = now_us();
        if (!ok(cudaFree(buf), "cudaFree")) return false;
        us->push_back(now_us() - t1);
        malloc_us->push_back(t1 - t0);
    }
    return true;
}

int run_exporter(const char *self, const Options &o) {
    if (!ok(cudaSetDevice(o.export_device), "cudaSetDevice")) return 3;
    std::vector<Importer> imps(o.importers);
    for (Importer &imp : imps)
        if (!spawn_importer(self, o, &imp)) return 3;
    std::vector<double> us, plain_us, malloc_us;
    long long freed_min = -1, freed_max = -1;
    bool good = true;
    for (int i = 0; i < o.iters && good; i++) {
        double t;
        long long freed;
        good = round_trip(o, imps, &t, &freed);
        us.push_back(t);
        freed_min = freed_min < 0 ? freed : std::min(freed_min, freed);
        freed_max = std::max(freed_max, freed);
    }
    good = good && plain_frees(o, &malloc_us, &plain_us);
    int exits_ok = 1;
    for (Importer &imp : imps) {
        fclose(imp.to);  // the importer may go now
        int status = 0;
        waitpid(imp.pid, &status, 0);
        exits_ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    if (!good || us.empty() || plain_us.empty()) return 3;
    good = llabs(freed_min - (long long)o.size) <= kSlack &&
           llabs(freed_max - (long long)o.size) <= kSlack;
    printf("size=%zu importers=%d iters=%d freed_min=%lld freed_max=%lld free_us_median=%.1f "
           "free_us_p99=%.1f plain_free_us_median=%.1f plain_free_us_p99=%.1f "
           "plain_malloc_us_median=%.1f plain_malloc_us_p99=%.1f importer_pid=%d ok=%d\n",
           o.size, o.importers, o.iters, freed_min, freed_max, percentile(us, 0.5),
           percentile(us, 0.99), percentile(plain_us, 0.5), percentile(plain_us, 0.99),
           percentile(malloc_us, 0.5), percentile(malloc_us, 0.99),
           imps.empty() ? 0 : (int)imps[0].pid, good);
    return good && exits_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size")) o.size = strtoull(argv[i + 1], nullptr, 10);
        else if (!strcmp(argv[i], "--export-device")) o.export_device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--import-device")) o.import_device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--importers")) o.importers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) o.iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--importer")) o.importer = true;
        else {
            fprintf(stderr, "usage: ghost_free [--size B] [--export-device D] [--import-device D]"
                            " [--importers N] [--iters K]\n");
            return 2;
        }
    }
    if (o.importers < 0 || o.importers > kMaxImporters || o.iters < 1) {
        fprintf(stderr, "ghost_free: need 0..%d importers and at least one iteration\n", kMaxImporters);
        return 2;
    }
    return o.importer ? run_importer(o) : run_exporter(argv[0], o);
}
