// ipcbench.cu - what does a CUDA IPC open+close pair cost, and what does
// ipccache save?  (`make bench` runs it through tools/bench/bench.sh.)
//
// Two processes.  The exporter (this binary, run WITHOUT the shim) allocates
// one buffer per size, exports the handles, and fork+execs itself as the
// importer three times, A/B/A:
//   A1  no shim:   real_pair, held_pair, held_pair_Nthreads
//   B   the shim (LD_PRELOAD set for that importer only): shim_hit_pair,
//                  shim_hit_pair_Nthreads
//   A2  no shim again, to show drift between A1 and A2.
//
// Modes (each sample is one open+close pair timed with CLOCK_MONOTONIC):
//   real_pair        nothing else holds the mapping: the driver maps and
//                    unmaps every time.
//   held_pair        one reference is held open, so the driver only bumps its
//                    reference count (its own refcount path).
//   shim_hit_pair    under ipccache, after one excluded miss: cache hits.
//   *_Nthreads       N threads hammer the same handle; per-pair latency over
//                    all threads, plus aggregate pairs per second.
//   *_distinct_Nthreads  with --distinct K: each of N <= K threads hammers a
//                    handle of its own (K more allocations of --distinct-size).
//   context_pair(_Nthreads)  --api driver, B: the driver's two cuCtxGetId(NULL)
//                    of a hit pair alone, the floor (with N threads: does it scale?).
//   current_pair     --api driver, B: two cuCtxGetCurrent instead (what the
//                    library called before it asked the id each time).
//   *_solo_cpuK      with --pin, shim_hit_pair and context_pair: one thread alone
//                    on the K-th allowed CPU, the CPUs that N pinned threads use
//                    (thread t on the t-th).
//   *_entry          --api runtime only: the same pair through the driver's
//                    cuIpcOpenMemHandle/cuIpcCloseMemHandle, found with
//                    cudaGetDriverEntryPointByVersion; beside the cudart pair it
//                    shows what cudart itself adds to a call.
//
// --api runtime uses cudaIpcOpenMemHandle/cudaIpcCloseMemHandle (build with
// -cudart static and -cudart shared); --api driver uses cuIpcOpenMemHandle /
// cuIpcCloseMemHandle on the primary context (link -lcuda).
//
// Output: CSV on stdout (header once) and, with --out DIR, DIR/ipcbench.json.

#include <cuda.h>
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

extern char **environ;

namespace {

enum class Api { Runtime, Driver };

struct Options {
    Api api = Api::Runtime;
    std::vector<size_t> sizes = {2ull << 20, 64ull << 20, 512ull << 20, 4ull << 30};
    std::vector<int> threads = {1, 2, 4, 8, 16};
    int distinct = 0;                 // extra allocations, one handle per thread
    size_t distinct_size = 2ull << 20;
    int device = 0;          // importer's device
    int export_device = 0;
    const char *shim = nullptr;
    const char *out_dir = nullptr;
    int real_iters = 200;
    int held_iters = 2000;
    int hit_iters = 20000;
    int hit_batch = 64;  // cache hits are timed in batches; see time_pairs
    double max_mode_s = 3.0;  // cap per mode so that slow 4 GiB maps stay in budget
    bool header = true;
    bool pin = false;         // thread t of a run on the t-th allowed CPU; solo rows per CPU
    // importer-only
    bool importer = false;
    const char *pass = "A1";
    int cmd_fd = -1;
    int reply_fd = -1;
};

const char *api_name(Api a) { return a == Api::Runtime ? "runtime" : "driver"; }

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// Whether this binary reaches cudart through libcudart.so or has it linked in.
const char *cudart_linkage() {
    Dl_info info;
    if (dladdr((void *)&cudaRuntimeGetVersion, &info) && info.dli_fname &&
        strstr(info.dli_fname, "libcudart"))
        return "shared";
    return "static";
}

// ---------------------------------------------------------------- IPC ops

// A 64-byte IPC handle; cudaIpcMemHandle_t and CUipcMemHandle share the layout.
struct Handle {
    unsigned char bytes[64];
};
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(Handle), "handle size");
static_assert(sizeof(CUipcMemHandle) == sizeof(Handle), "handle size");

// The importer's view of one API: bind a thread, open, close.
typedef CUresult (*drv_open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*drv_close_fn)(CUdeviceptr);

struct IpcOps {
    Api api;
    int device;
    CUcontext ctx = nullptr;
    // Set by use_driver_entry: the runtime's own driver entry points.
    drv_open_fn entry_open = nullptr;
    drv_close_fn entry_close = nullptr;

    // The driver functions as cudart finds them (through the shim in pass B).
    bool use_driver_entry() {
        cudaDriverEntryPointQueryResult q1, q2;
        void *o = nullptr, *c = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuIpcOpenMemHandle", &o, 11000, cudaEnableDefault, &q1) ||
            cudaGetDriverEntryPointByVersion("cuIpcCloseMemHandle", &c, 4010, cudaEnableDefault, &q2) ||
            !o || !c)
            return false;
        entry_open = (drv_open_fn)o;
        entry_close = (drv_close_fn)c;
        return true;
    }

    int init() {
        if (api == Api::Runtime) {
            cudaError_t e = cudaSetDevice(device);
            if (e == cudaSuccess) e = cudaFree(nullptr);
            return (int)e;
        }
        CUdevice dev;
        CUresult r = cuInit(0);
        if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, device);
        if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
        if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
        return (int)r;
    }
    // Each worker thread must make the device/context current itself.
    int bind_thread() const {
        return api == Api::Runtime ? (int)cudaSetDevice(device) : (int)cuCtxSetCurrent(ctx);
    }
    int open(const Handle &h, void **p) const {
        if (entry_open) {
            CUipcMemHandle dh;
            memcpy(&dh, h.bytes, sizeof dh);
            CUdeviceptr d = 0;
            CUresult r = entry_open(&d, dh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
            *p = (void *)(uintptr_t)d;
            return (int)r;
        }
        if (api == Api::Runtime) {
            cudaIpcMemHandle_t rh;
            memcpy(&rh, h.bytes, sizeof rh);
            return (int)cudaIpcOpenMemHandle(p, rh, cudaIpcMemLazyEnablePeerAccess);
        }
        CUipcMemHandle dh;
        memcpy(&dh, h.bytes, sizeof dh);
        CUdeviceptr d = 0;
        CUresult r = cuIpcOpenMemHandle(&d, dh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        *p = (void *)(uintptr_t)d;
        return (int)r;
    }
    int close(void *p) const {
        if (entry_close) return (int)entry_close((CUdeviceptr)(uintptr_t)p);
        if (api == Api::Runtime) return (int)cudaIpcCloseMemHandle(p);
        return (int)cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)p);
    }
    // The floor of a hit pair on the driver API: the shim asks the driver for
    // the current context's id once per call, so a pair costs two of these.
    bool context_only = false, current_only = false;
    int pair(const Handle &h) const {
        if (context_only) {
            unsigned long long i1 = 0, i2 = 0;
            CUresult r = cuCtxGetId(nullptr, &i1);
            return (int)(r ? r : cuCtxGetId(nullptr, &i2));
        }
        if (current_only) {
            CUcontext c1 = nullptr, c2 = nullptr;
            CUresult r = cuCtxGetCurrent(&c1);
            return (int)(r ? r : cuCtxGetCurrent(&c2));
        }
        void *p = nullptr;
        int e = open(h, &p);
        return e ? e : close(p);
    }
};

// ---------------------------------------------------------------- timing

struct Result {
    std::vector<uint64_t> ns;  // one entry per timed pair
    uint64_t wall_ns = 0;      // first start to last end, over all threads
    int error = 0;             // first failing call's code, 0 if none
};

// Times up to `iters` pairs, `batch` pairs per clock reading (a clock read
// costs tens of ns on some hosts, as much as a cache hit; each pair of a
// batch is recorded at the batch's mean, so counts stay per pair), stopping early after `max_ns` once at least
// `min_iters` are in; stops at the first error.
void time_pairs(const IpcOps &ops, const Handle &h, int iters, int batch, uint64_t max_ns,
                std::vector<uint64_t> *out, int *error) {
    const int min_iters = std::min(iters, 20 * batch);
    uint64_t begin = now_ns();
    for (int i = 0; i < iters; i += batch) {
        uint64_t t0 = now_ns();
        for (int b = 0; b < batch; b++) {
            int e = ops.pair(h);
            if (e) {
                *error = e;
                return;
            }
        }
        uint64_t t1 = now_ns();
        for (int b = 0; b < batch; b++) out->push_back((t1 - t0) / (uint64_t)batch);
        if (i + batch >= min_iters && t1 - begin > max_ns) return;
    }
}

Result run_single(const IpcOps &ops, const Handle &h, int iters, uint64_t max_ns, int batch = 1) {
    Result r;
    r.ns.reserve(iters);
    uint64_t t0 = now_ns();
    time_pairs(ops, h, iters, batch, max_ns, &r.ns, &r.error);
    r.wall_ns = now_ns() - t0;
    return r;
}

// With --pin: the CPUs this process may use, in order; thread t of a run
// (counted from first_cpu) is pinned to pin_cpus[t % size]. Empty: no pinning.
std::vector<int> pin_cpus;

void load_pin_cpus() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) pin_cpus.push_back(c);
}

void pin_thread(int t) {
    if (pin_cpus.empty()) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(pin_cpus[(size_t)t % pin_cpus.size()], &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// N threads, released together by a barrier, share `iters` pairs; thread t
// uses handle hs[t % hs.size()] (and, pinned, CPU first_cpu + t).
Result run_threads(const IpcOps &ops, const std::vector<Handle> &hs, int iters, int nthreads,
                   uint64_t max_ns, int batch = 1, int first_cpu = 0) {
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, nullptr, (unsigned)nthreads);
    std::vector<std::vector<uint64_t>> samples(nthreads);
    std::vector<uint64_t> start(nthreads), end(nthreads);
    std::vector<int> errors(nthreads, 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < nthreads; t++) {
        pool.emplace_back([&, t] {
            // Samples and errors kept in the thread's own vector until the end:
            // the vectors' headers lie side by side, and writing them while
            // timing would add the bench's own false sharing to every pair.
            pin_thread(first_cpu + t);
            int error = ops.bind_thread();
            int share = iters / nthreads + (t < iters % nthreads ? 1 : 0);
            std::vector<uint64_t> mine;
            mine.reserve(share);
            pthread_barrier_wait(&barrier);
            uint64_t t0 = now_ns();
            if (!error) time_pairs(ops, hs[t % hs.size()], share, batch, max_ns, &mine, &error);
            end[t] = now_ns();
            start[t] = t0;
            errors[t] = error;
            samples[t] = std::move(mine);
        });
    }
    for (auto &th : pool) th.join();
    pthread_barrier_destroy(&barrier);

    Result r;
    for (int t = 0; t < nthreads; t++) {
        r.ns.insert(r.ns.end(), samples[t].begin(), samples[t].end());
        if (!r.error) r.error = errors[t];
    }
    r.wall_ns = *std::max_element(end.begin(), end.end()) - *std::min_element(start.begin(), start.end());
    return r;
}

Result run_threads(const IpcOps &ops, const Handle &h, int iters, int nthreads, uint64_t max_ns,
                   int batch = 1, int first_cpu = 0) {
    return run_threads(ops, std::vector<Handle>{h}, iters, nthreads, max_ns, batch, first_cpu);
}

uint64_t percentile(std::vector<uint64_t> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t idx = (size_t)(q * (double)(v.size() - 1) + 0.5);
    return v[std::min(idx, v.size() - 1)];
}

// ---------------------------------------------------------------- rows

struct Row {
    std::string api, cudart, mode, pass;
    size_t size = 0;
    int threads = 1;
    size_t iters = 0;
    uint64_t median_ns = 0, p99_ns = 0;
    double pairs_per_s = 0;
    int importer_device = 0, exporter_device = 0;
};

const char *kCsvHeader =
    "api,cudart,size_bytes,mode,threads,iters,median_ns,p99_ns,pass,pairs_per_s,importer_device,exporter_device";

std::string row_csv(const Row &r) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s,%s,%zu,%s,%d,%zu,%llu,%llu,%s,%.0f,%d,%d", r.api.c_str(), r.cudart.c_str(), r.size,
             r.mode.c_str(), r.threads, r.iters, (unsigned long long)r.median_ns, (unsigned long long)r.p99_ns,
             r.pass.c_str(), r.pairs_per_s, r.importer_device, r.exporter_device);
    return buf;
}

bool row_parse(const char *s, Row *r) {
    char api[32], cudart[32], mode[64], pass[8];
    unsigned long long size, iters, med, p99;
    double pps;
    int n = sscanf(s, "%31[^,],%31[^,],%llu,%63[^,],%d,%llu,%llu,%llu,%7[^,],%lf,%d,%d", api, cudart, &size, mode,
                   &r->threads, &iters, &med, &p99, pass, &pps, &r->importer_device, &r->exporter_device);
    if (n != 12) return false;
    r->api = api, r->cudart = cudart, r->mode = mode, r->pass = pass;
    r->size = size, r->iters = iters, r->median_ns = med, r->p99_ns = p99, r->pairs_per_s = pps;
    return true;
}

// ---------------------------------------------------------------- importer

struct Importer {
    const Options &o;
    IpcOps ops;
    FILE *reply;
    std::string cudart;
    IpcOps *entry_ops = nullptr;  // --api runtime: the driver's entry points as cudart finds them

    void send(const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
        va_list ap;
        va_start(ap, fmt);
        vfprintf(reply, fmt, ap);
        va_end(ap);
        fflush(reply);
    }

    void emit(size_t size, const char *mode, int threads, const Result &r) {
        if (r.error) {
            send("ERR size=%zu mode=%s threads=%d code=%d\n", size, mode, threads, r.error);
            return;
        }
        Row row;
        row.api = api_name(o.api);
        row.cudart = cudart;
        row.size = size;
        row.mode = mode;
        row.threads = threads;
        row.iters = r.ns.size();  // one sample per pair (batch means repeated)
        row.median_ns = percentile(r.ns, 0.5);
        row.p99_ns = percentile(r.ns, 0.99);
        row.pass = o.pass;
        row.pairs_per_s = r.wall_ns ? (double)r.ns.size() * 1e9 / (double)r.wall_ns : 0;
        row.importer_device = o.device;
        row.exporter_device = o.export_device;
        send("ROW %s\n", row_csv(row).c_str());
    }

    // Without the shim: the driver's real map/unmap, then its refcount path.
    void measure_plain(size_t size, const Handle &h) {
        uint64_t cap = (uint64_t)(o.max_mode_s * 1e9);
        int e = ops.pair(h);  // warm-up: first-touch costs (peer access, etc.)
        if (e) {
            send("ERR size=%zu mode=warmup threads=1 code=%d\n", size, e);
            return;
        }
        emit(size, "real_pair", 1, run_single(ops, h, o.real_iters, cap));

        void *held = nullptr;
        e = ops.open(h, &held);
        if (e) {
            send("ERR size=%zu mode=hold threads=1 code=%d\n", size, e);
            return;
        }
        emit(size, "held_pair", 1, run_single(ops, h, o.held_iters, cap));
        if (entry_ops) emit(size, "held_pair_entry", 1, run_single(*entry_ops, h, o.held_iters, cap));
        for (int n : o.threads) {
            std::string mode = "held_pair_" + std::to_string(n) + "threads";
            emit(size, mode.c_str(), n, run_threads(ops, h, o.held_iters, n, cap));
        }
        ops.close(held);
    }

    // With the shim: one miss (excluded), then hits.
    void measure_shim(size_t size, const Handle &h) {
        uint64_t cap = (uint64_t)(o.max_mode_s * 1e9);
        int e = ops.pair(h);
        if (e) {
            send("ERR size=%zu mode=miss threads=1 code=%d\n", size, e);
            return;
        }
        emit(size, "shim_hit_pair", 1, run_single(ops, h, o.hit_iters, cap, o.hit_batch));
        if (ops.api == Api::Driver) {
            IpcOps context_ops = ops;
            context_ops.context_only = true;
            emit(size, "context_pair", 1, run_single(context_ops, h, o.hit_iters, cap, o.hit_batch));
            IpcOps current_ops = ops;
            current_ops.current_only = true;
            emit(size, "current_pair", 1, run_single(current_ops, h, o.hit_iters, cap, o.hit_batch));
            // The floor with threads: does the driver's own call scale?
            for (int n : o.threads) {
                std::string mode = "context_pair_" + std::to_string(n) + "threads";
                emit(size, mode.c_str(), n, run_threads(context_ops, h, o.hit_iters, n, cap, o.hit_batch));
            }
            // Pinned: one thread alone on each CPU the threaded runs use, so that
            // their scaling is measured against the same cores.
            int most = *std::max_element(o.threads.begin(), o.threads.end());
            for (int k = 0; o.pin && k < most && k < (int)pin_cpus.size(); k++) {
                std::string cpu = "solo_cpu" + std::to_string(k);
                emit(size, ("shim_hit_pair_" + cpu).c_str(), 1, run_threads(ops, h, o.hit_iters, 1, cap, o.hit_batch, k));
                emit(size, ("context_pair_" + cpu).c_str(), 1,
                     run_threads(context_ops, h, o.hit_iters, 1, cap, o.hit_batch, k));
            }
        }
        if (entry_ops)
            emit(size, "shim_hit_pair_entry", 1, run_single(*entry_ops, h, o.hit_iters, cap, o.hit_batch));
        for (int n : o.threads) {
            std::string mode = "shim_hit_pair_" + std::to_string(n) + "threads";
            emit(size, mode.c_str(), n, run_threads(ops, h, o.hit_iters, n, cap, o.hit_batch));
        }
    }

    // Each thread on a handle of its own: without the shim one reference of
    // each is held (the driver's refcount path), with it one miss each first.
    void measure_distinct(size_t size, const std::vector<Handle> &hs, bool shim) {
        uint64_t cap = (uint64_t)(o.max_mode_s * 1e9);
        std::vector<void *> held(hs.size(), nullptr);
        for (size_t i = 0; i < hs.size(); i++) {
            int e = shim ? ops.pair(hs[i]) : ops.open(hs[i], &held[i]);
            if (e) {
                send("ERR size=%zu mode=distinct_setup threads=1 code=%d\n", size, e);
                return;
            }
        }
        for (int n : o.threads) {
            if (n > (int)hs.size()) continue;
            std::string mode = std::string(shim ? "shim_hit_pair" : "held_pair") + "_distinct_" + std::to_string(n) +
                               "threads";
            int iters = shim ? o.hit_iters : o.held_iters;
            emit(size, mode.c_str(), n, run_threads(ops, hs, iters, n, cap, shim ? o.hit_batch : 1));
        }
        for (void *p : held)
            if (p) ops.close(p);
    }

    int run() {
        FILE *in = fdopen(o.cmd_fd, "r");
        if (!in || !reply) return 2;
        int e = ops.init();
        if (e) {
            send("ERR init code=%d\n", e);
            send("DONE\n");
            return 2;
        }
        send("PID %d\n", (int)getpid());
        char line[512];
        bool shim = strcmp(o.pass, "B") == 0;
        if (o.api == Api::Runtime) {
            IpcOps entry = ops;
            if (entry.use_driver_entry()) entry_ops = new IpcOps(entry);
            else send("ERR size=0 mode=entry threads=1 code=-1\n");
        }
        std::vector<Handle> distinct;
        while (fgets(line, sizeof line, in)) {
            size_t size;
            char hex[160];
            if (strncmp(line, "END", 3) == 0) break;
            if (sscanf(line, "DISTINCT %zu", &size) == 1) {
                measure_distinct(size, distinct, shim);
                continue;
            }
            bool one_of_many = sscanf(line, "DHANDLE %150s", hex) == 1;
            if (!one_of_many && sscanf(line, "SIZE %zu %150s", &size, hex) != 2) continue;
            if (strlen(hex) != 128) continue;
            Handle h;
            for (int i = 0; i < 64; i++) {
                unsigned v;
                sscanf(hex + 2 * i, "%2x", &v);
                h.bytes[i] = (unsigned char)v;
            }
            if (one_of_many) distinct.push_back(h);
            else if (shim) measure_shim(size, h);
            else measure_plain(size, h);
        }
        send("DONE\n");
        return 0;
    }
};

// ---------------------------------------------------------------- exporter

struct Export {
    size_t size;
    void *ptr;
    std::string hex;
};

// The environment for one importer: the parent's, with LD_PRELOAD replaced.
std::vector<std::string> importer_env(const Options &o, bool shim, const std::string &stats_file) {
    std::vector<std::string> env;
    for (char **e = environ; *e; e++) {
        std::string s = *e;
        if (s.rfind("LD_PRELOAD=", 0) == 0) continue;
        if (shim && (s.rfind("IPCCACHE_STATS_FILE=", 0) == 0 || s.rfind("IPCCACHE_STATS_AT_EXIT=", 0) == 0 ||
                     s.rfind("IPCCACHE_DISABLE=", 0) == 0))
            continue;
        env.push_back(s);
    }
    if (shim) {
        env.push_back(std::string("LD_PRELOAD=") + o.shim);
        if (!stats_file.empty()) {
            env.push_back("IPCCACHE_STATS_AT_EXIT=1");
            env.push_back("IPCCACHE_STATS_FILE=" + stats_file);
        }
    }
    return env;
}

std::string join_ints(const std::vector<int> &v) {
    std::string s;
    for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
}

struct PassOutcome {
    bool ok = false;
    pid_t pid = -1;
};

// Runs one importer pass; its rows are printed and appended to `rows`.
PassOutcome run_pass(const Options &o, const char *pass, const std::vector<Export> &exports,
                     const std::vector<Export> &distinct, const std::string &stats_file,
                     std::vector<Row> *rows) {
    PassOutcome out;
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) || pipe2(from_child, O_CLOEXEC)) return out;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return out;
    exe[n] = 0;

    std::vector<std::string> args = {exe,
                                     "--importer",
                                     "--pass", pass,
                                     "--api", api_name(o.api),
                                     "--device", std::to_string(o.device),
                                     "--export-device", std::to_string(o.export_device),
                                     "--real-iters", std::to_string(o.real_iters),
                                     "--held-iters", std::to_string(o.held_iters),
                                     "--hit-iters", std::to_string(o.hit_iters),
                                     "--hit-batch", std::to_string(o.hit_batch),
                                     "--threads", join_ints(o.threads),
                                     "--max-mode-seconds", std::to_string(o.max_mode_s),
                                     "--cmd-fd", "10",
                                     "--reply-fd", "11"};
    if (o.pin) args.push_back("--pin");
    std::vector<std::string> env = importer_env(o, strcmp(pass, "B") == 0, stats_file);
    std::vector<char *> argv, envp;
    for (auto &s : args) argv.push_back(&s[0]);
    argv.push_back(nullptr);
    for (auto &s : env) envp.push_back(&s[0]);
    envp.push_back(nullptr);

    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return out;
    if (pid == 0) {
        int r = to_child[0], w = from_child[1];
        if (r == 11) r = dup(r);
        if (w == 11) fcntl(w, F_SETFD, 0); else dup2(w, 11);
        if (r == 10) fcntl(r, F_SETFD, 0); else dup2(r, 10);
        execve(exe, argv.data(), envp.data());
        perror("execve");
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    out.pid = pid;
    FILE *cmd = fdopen(to_child[1], "w");
    FILE *rep = fdopen(from_child[0], "r");
    for (const Export &e : exports) fprintf(cmd, "SIZE %zu %s\n", e.size, e.hex.c_str());
    for (const Export &e : distinct) fprintf(cmd, "DHANDLE %s\n", e.hex.c_str());
    if (!distinct.empty()) fprintf(cmd, "DISTINCT %zu\n", o.distinct_size);
    fprintf(cmd, "END\n");
    fflush(cmd);

    bool done = false;
    char line[1024];
    while (fgets(line, sizeof line, rep)) {
        line[strcspn(line, "\n")] = 0;
        Row row;
        if (strncmp(line, "ROW ", 4) == 0 && row_parse(line + 4, &row)) {
            printf("%s\n", line + 4);
            rows->push_back(row);
        } else if (strcmp(line, "DONE") == 0) {
            done = true;
        } else if (strncmp(line, "ERR", 3) == 0) {
            fprintf(stderr, "ipcbench: pass %s: %s\n", pass, line);
        }
    }
    fclose(cmd);
    fclose(rep);
    int status = 0;
    waitpid(pid, &status, 0);
    out.ok = done && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!out.ok) fprintf(stderr, "ipcbench: pass %s importer ended with status 0x%x\n", pass, status);
    return out;
}

std::string json_escape(const std::string &s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += c;
        else if ((unsigned char)c < 0x20) o += ' ';
        else o += c;
    }
    return o;
}

std::string command_output(const char *cmd) {
    std::string s;
    FILE *p = popen(cmd, "r");
    if (!p) return s;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) s += buf;
    pclose(p);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

std::string read_last_line(const std::string &path) {
    std::string last;
    FILE *f = fopen(path.c_str(), "r");
    if (!f) return last;
    char buf[8192];
    while (fgets(buf, sizeof buf, f))
        if (buf[0] == '{') last = buf;
    fclose(f);
    while (!last.empty() && last.back() == '\n') last.pop_back();
    return last;
}

std::string device_name(int dev) {
    cudaDeviceProp p;
    return cudaGetDeviceProperties(&p, dev) == cudaSuccess ? p.name : "unknown";
}

void write_json(const Options &o, const std::vector<Row> &rows, const std::string &stats_line, const char *cudart) {
    std::string path = std::string(o.out_dir) + "/ipcbench.json";
    FILE *f = fopen(path.c_str(), "w");
    if (!f) {
        perror(path.c_str());
        return;
    }
    int drv = 0, rt = 0, ndev = 0, peer = -1;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    cudaGetDeviceCount(&ndev);
    if (o.device != o.export_device) cudaDeviceCanAccessPeer(&peer, o.device, o.export_device);
    std::string smi = command_output(
        "nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader 2>/dev/null");
    fprintf(f, "{\n  \"machine\": {\"exporter_gpu\": \"%s\", \"importer_gpu\": \"%s\", \"device_count\": %d,\n",
            json_escape(device_name(o.export_device)).c_str(), json_escape(device_name(o.device)).c_str(), ndev);
    fprintf(f, "    \"cuda_driver_version\": %d, \"cuda_runtime_version\": %d, \"nvidia_smi\": \"%s\",\n", drv, rt,
            json_escape(smi).c_str());
    fprintf(f, "    \"cpu_count\": %u, \"importer_can_access_peer\": %d},\n", std::thread::hardware_concurrency(), peer);
    fprintf(f, "  \"config\": {\"api\": \"%s\", \"cudart\": \"%s\", \"importer_device\": %d, \"exporter_device\": %d,",
            api_name(o.api), cudart, o.device, o.export_device);
    fprintf(f, " \"real_iters\": %d, \"held_iters\": %d, \"hit_iters\": %d, \"max_mode_seconds\": %g,", o.real_iters,
            o.held_iters, o.hit_iters, o.max_mode_s);
    fprintf(f, " \"threads\": [%s], \"shim\": \"%s\"},\n", join_ints(o.threads).c_str(),
            o.shim ? json_escape(o.shim).c_str() : "");
    fprintf(f, "  \"shim_stats_B\": %s,\n", stats_line.empty() ? "null" : stats_line.c_str());
    fprintf(f, "  \"rows\": [\n");
    for (size_t i = 0; i < rows.size(); i++) {
        const Row &r = rows[i];
        fprintf(f,
                "    {\"api\": \"%s\", \"cudart\": \"%s\", \"size_bytes\": %zu, \"mode\": \"%s\", \"threads\": %d, "
                "\"iters\": %zu, \"median_ns\": %llu, \"p99_ns\": %llu, \"pass\": \"%s\", \"pairs_per_s\": %.0f, "
                "\"importer_device\": %d, \"exporter_device\": %d}%s\n",
                r.api.c_str(), r.cudart.c_str(), r.size, r.mode.c_str(), r.threads, r.iters,
                (unsigned long long)r.median_ns, (unsigned long long)r.p99_ns, r.pass.c_str(), r.pairs_per_s,
                r.importer_device, r.exporter_device, i + 1 < rows.size() ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
}

int run_exporter(const Options &o) {
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "ipccache"))
        fprintf(stderr, "ipcbench: warning: the exporter itself runs with LD_PRELOAD=%s; pass --shim instead\n", pre);
    cudaError_t e = cudaSetDevice(o.export_device);
    std::vector<Export> exports;
    for (size_t size : o.sizes) {
        Export x{size, nullptr, ""};
        if (e == cudaSuccess) e = cudaMalloc(&x.ptr, size);
        if (e == cudaSuccess) e = cudaMemset(x.ptr, 0, size);  // back the pages now, not in the first open
        cudaIpcMemHandle_t h;
        if (e == cudaSuccess) e = cudaIpcGetMemHandle(&h, x.ptr);
        if (e != cudaSuccess) {
            fprintf(stderr, "ipcbench: exporter, size %zu: %s\n", size, cudaGetErrorString(e));
            return 2;
        }
        char hex[129];
        for (int i = 0; i < 64; i++) sprintf(hex + 2 * i, "%02x", ((unsigned char *)&h)[i]);
        x.hex = hex;
        exports.push_back(x);
    }
    std::vector<Export> distinct;
    for (int i = 0; i < o.distinct; i++) {
        Export x{o.distinct_size, nullptr, ""};
        if (e == cudaSuccess) e = cudaMalloc(&x.ptr, x.size);
        cudaIpcMemHandle_t h;
        if (e == cudaSuccess) e = cudaIpcGetMemHandle(&h, x.ptr);
        if (e != cudaSuccess) {
            fprintf(stderr, "ipcbench: exporter, distinct allocation %d: %s\n", i, cudaGetErrorString(e));
            return 2;
        }
        char hex[129];
        for (int k = 0; k < 64; k++) sprintf(hex + 2 * k, "%02x", ((unsigned char *)&h)[k]);
        x.hex = hex;
        distinct.push_back(x);
    }
    cudaDeviceSynchronize();

    const char *cudart = o.api == Api::Runtime ? cudart_linkage() : "none";
    if (o.header) printf("%s\n", kCsvHeader);
    std::vector<Row> rows;
    std::string stats_line;
    bool ok = true;
    for (const char *pass : {"A1", "B", "A2"}) {
        bool shim = strcmp(pass, "B") == 0;
        if (shim && !o.shim) {
            fprintf(stderr, "ipcbench: no --shim given; skipping pass B\n");
            continue;
        }
        std::string stats_tmpl;
        if (shim && o.out_dir) stats_tmpl = std::string(o.out_dir) + "/shim_stats_B.%p";
        PassOutcome r = run_pass(o, pass, exports, distinct, stats_tmpl, &rows);
        ok = ok && r.ok;
        if (shim && !stats_tmpl.empty()) {
            std::string path = stats_tmpl.substr(0, stats_tmpl.size() - 2) + std::to_string((int)r.pid);
            stats_line = read_last_line(path);
        }
    }
    if (o.out_dir) write_json(o, rows, stats_line, cudart);
    for (Export &x : exports) cudaFree(x.ptr);
    for (Export &x : distinct) cudaFree(x.ptr);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------- args

size_t parse_size(const std::string &s) {
    char *end;
    double v = strtod(s.c_str(), &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024.0 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

template <class T, class F>
std::vector<T> parse_list(const char *s, F conv) {
    std::vector<T> v;
    std::string cur;
    for (const char *p = s;; p++) {
        if (*p == ',' || *p == 0) {
            if (!cur.empty()) v.push_back(conv(cur));
            cur.clear();
            if (!*p) break;
        } else {
            cur += *p;
        }
    }
    return v;
}

void usage() {
    fprintf(stderr,
            "usage: ipcbench [--api runtime|driver] [--sizes 2M,64M,512M,4G] [--device D] [--export-device E]\n"
            "                [--shim LIB] [--out DIR] [--real-iters N] [--held-iters N] [--hit-iters N]\n"
            "                [--hit-batch N (pairs per clock reading for hits, default 64)]\n"
            "                [--threads 1,2,4,8,16] [--max-mode-seconds S] [--no-header]\n"
            "                [--distinct K (K more allocations, one handle per thread)] [--distinct-size 2M]\n"
            "                [--pin (thread t on the t-th allowed CPU; hits alone on each of those CPUs)]\n"
            "Run the exporter without LD_PRELOAD; --shim LIB is preloaded into the B-pass importer only.\n");
}

bool parse_args(int argc, char **argv, Options *o) {
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--importer") { o->importer = true; continue; }
        if (a == "--no-header") { o->header = false; continue; }
        if (a == "--pin") { o->pin = true; continue; }
        if (a == "-h" || a == "--help") return false;
        if (i + 1 >= argc) return false;
        const char *v = argv[++i];
        if (a == "--api") {
            if (!strcmp(v, "runtime")) o->api = Api::Runtime;
            else if (!strcmp(v, "driver")) o->api = Api::Driver;
            else return false;
        } else if (a == "--sizes") o->sizes = parse_list<size_t>(v, parse_size);
        else if (a == "--threads") o->threads = parse_list<int>(v, [](const std::string &s) { return atoi(s.c_str()); });
        else if (a == "--device") o->device = atoi(v);
        else if (a == "--distinct") o->distinct = atoi(v);
        else if (a == "--distinct-size") o->distinct_size = parse_size(v);
        else if (a == "--export-device") o->export_device = atoi(v);
        else if (a == "--shim") o->shim = v;
        else if (a == "--out") o->out_dir = v;
        else if (a == "--real-iters") o->real_iters = atoi(v);
        else if (a == "--held-iters") o->held_iters = atoi(v);
        else if (a == "--hit-iters") o->hit_iters = atoi(v);
        else if (a == "--hit-batch") o->hit_batch = std::max(1, atoi(v));
        else if (a == "--max-mode-seconds") o->max_mode_s = atof(v);
        else if (a == "--pass") o->pass = v;
        else if (a == "--cmd-fd") o->cmd_fd = atoi(v);
        else if (a == "--reply-fd") o->reply_fd = atoi(v);
        else return false;
    }
    for (int t : o->threads)
        if (t < 1) return false;
    return !o->sizes.empty() && o->real_iters > 0 && o->held_iters > 0 && o->hit_iters > 0;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    if (!parse_args(argc, argv, &o)) {
        usage();
        return 2;
    }
    if (o.pin) load_pin_cpus();
    if (o.importer) {
        Importer imp{o, IpcOps{o.api, o.device}, fdopen(o.reply_fd, "w"),
                     o.api == Api::Runtime ? cudart_linkage() : "none"};
        return imp.run();
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    return run_exporter(o);
}
