/*
 * probe.c - a CUDA program in miniature, run by tests/process/test_process_*.c in fresh
 * processes, with and without LD_PRELOAD=libipccache.so.
 *
 * It links neither libcuda nor libipccache: it reaches the driver exactly as
 * cudart does - dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), a probe
 * lookup of "", then every entry point through the resolver (flags 0, status
 * pointer given) - so the preload is exercised on the path real programs take.
 * The stand-in driver's test hooks (fakecuda_*) are reached with dlsym.
 *
 *     probe SCENARIO [ARGS]
 *
 * Prints key=value lines on stdout. Exit status: 0 when everything went as
 * the scenario expects, 2 for bad usage or a driver that cannot be set up,
 * 3 when a call the scenario relies on failed (named on stderr).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define EXIT_SETUP 2
#define EXIT_CHECK 3
#define LAZY CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

/* ---- the driver, as cudart sees it -------------------------------------- */

typedef CUresult (*resolver_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static struct {
    void *lib;
    resolver_fn resolve;
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*ipc_close)(CUdeviceptr);
    /* the stand-in driver's test hooks */
    void (*make_foreign)(CUipcMemHandle *, uint64_t, uint64_t);
    void (*counters)(struct fakecuda_counters *);
    int (*refcount)(CUcontext, CUdeviceptr);
    void (*deinit)(void);
} drv;

static void die(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("probe: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stdout);
    _exit(status);
}

/* For calls the scenario relies on: anything but success is a probe failure. */
#define CHECK(call)                                                       \
    do {                                                                  \
        CUresult rc_ = (call);                                            \
        if (rc_ != CUDA_SUCCESS)                                          \
            die(EXIT_CHECK, "%s failed: error %d", #call, (int)rc_);      \
    } while (0)

static void *fake_hook(const char *name)
{
    void *p = dlsym(drv.lib, name);
    if (!p)
        die(EXIT_SETUP, "the driver has no %s: not the stand-in driver?", name);
    return p;
}

static void *resolve(const char *name, int version)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = drv.resolve(name, &fn, version, 0, &status);
    if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || !fn)
        die(EXIT_SETUP, "cuGetProcAddress(%s, %d): error %d, status %d", name, version,
            (int)rc, (int)status);
    return fn;
}

/* cudart's start-up: the resolver from dlsym, a probe lookup of "" to see
 * that it answers, then the resolver's own newest ABI through itself. */
static void bootstrap_resolver(void)
{
    drv.lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!drv.lib)
        die(EXIT_SETUP, "dlopen(libcuda.so.1): %s", dlerror());
    drv.resolve = (resolver_fn)dlsym(drv.lib, "cuGetProcAddress_v2");
    if (!drv.resolve)
        die(EXIT_SETUP, "dlsym(cuGetProcAddress_v2): %s", dlerror());
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult rc = drv.resolve("", &fn, 0, 0, &status);
    if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND || fn)
        die(EXIT_SETUP, "probe lookup of \"\": error %d, status %d", (int)rc, (int)status);
    drv.resolve = (resolver_fn)resolve("cuGetProcAddress", 12000);
}

/* The stand-in driver's test hooks, then cuInit. */
static void load_fake_hooks(void)
{
    drv.make_foreign = fake_hook("fakecuda_make_foreign_handle");
    drv.counters = fake_hook("fakecuda_get_counters");
    drv.refcount = fake_hook("fakecuda_refcount");
    drv.deinit = fake_hook("fakecuda_deinit");
    CHECK(drv.init(0));
}

static void load_driver(void)
{
    bootstrap_resolver();
    drv.init = resolve("cuInit", 2000);
    drv.device_get = resolve("cuDeviceGet", 2000);
    drv.primary_retain = resolve("cuDevicePrimaryCtxRetain", 7000);
    drv.ctx_set_current = resolve("cuCtxSetCurrent", 4000);
    drv.ctx_create = resolve("cuCtxCreate", 3020);
    drv.ctx_destroy = resolve("cuCtxDestroy", 4000);
    drv.mem_alloc = resolve("cuMemAlloc", 3020);
    drv.ipc_get = resolve("cuIpcGetMemHandle", 4010);
    drv.ipc_open = resolve("cuIpcOpenMemHandle", 11000);
    drv.ipc_close = resolve("cuIpcCloseMemHandle", 4010);
    load_fake_hooks();
}

/* A program linked with -lcuda instead: the driver in the global scope, and
 * each entry point bound as the dynamic linker binds it, to the first
 * definition in load order (a preloaded library's, if one defines it). */
static void *linked(const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p)
        die(EXIT_SETUP, "no %s in the global scope", name);
    return p;
}

static void load_driver_linked(void)
{
    drv.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!drv.lib)
        die(EXIT_SETUP, "dlopen(libcuda.so.1): %s", dlerror());
    drv.init = linked("cuInit");
    drv.device_get = linked("cuDeviceGet");
    drv.primary_retain = linked("cuDevicePrimaryCtxRetain");
    drv.ctx_set_current = linked("cuCtxSetCurrent");
    drv.ipc_open = linked("cuIpcOpenMemHandle_v2");
    drv.ipc_close = linked("cuIpcCloseMemHandle");
    load_fake_hooks();
}

/* Device 0's primary context, made current: what cudart's first runtime
 * call does. Other threads must make it current themselves. */
static CUcontext use_primary_context(void)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(drv.device_get(&dev, 0));
    CHECK(drv.primary_retain(&ctx, dev));
    CHECK(drv.ctx_set_current(ctx));
    return ctx;
}

static CUipcMemHandle foreign_handle(uint64_t serial)
{
    CUipcMemHandle h;
    drv.make_foreign(&h, serial, 1 << 20);
    return h;
}

/* ---- output ------------------------------------------------------------- */

static void put(const char *key, long long value)
{
    printf("%s=%lld\n", key, value);
}

static struct fakecuda_counters counters(void)
{
    struct fakecuda_counters c;
    drv.counters(&c);
    return c;
}

/* What the stand-in driver really did, with an optional key prefix. */
static void put_counters(const char *prefix)
{
    struct fakecuda_counters c = counters();
    printf("%smaps=%llu\n", prefix, (unsigned long long)c.maps);
    printf("%sunmaps=%llu\n", prefix, (unsigned long long)c.unmaps);
    printf("%steardown_unmaps=%llu\n", prefix, (unsigned long long)c.teardown_unmaps);
    printf("%sopen_calls=%llu\n", prefix, (unsigned long long)c.open_calls);
    printf("%sclose_calls=%llu\n", prefix, (unsigned long long)c.close_calls);
    printf("%slive=%lld\n", prefix, (long long)c.live_mappings);
}

static const char *disposition(int sig)
{
    struct sigaction sa;
    if (sigaction(sig, NULL, &sa) != 0)
        return "unknown";
    if (sa.sa_flags & SA_SIGINFO)
        return "handler";
    return sa.sa_handler == SIG_DFL ? "default" : sa.sa_handler == SIG_IGN ? "ignore" : "handler";
}

static void put_dispositions(void)
{
    printf("sigusr1=%s\n", disposition(SIGUSR1));
    printf("sigusr2=%s\n", disposition(SIGUSR2));
}

/* 1 if fn lives in the preloaded library, i.e. the caller was handed a hook. */
static int is_hooked(void *fn)
{
    Dl_info info;
    return dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libipccache");
}

/* ---- open/close loops ---------------------------------------------------- */

struct loop_result {
    CUresult rc_open, rc_close; /* the first failure of each, else 0 */
    int ptr_same;               /* every open returned the first pointer */
    CUdeviceptr ptr;
};

static struct loop_result open_close(const CUipcMemHandle *h, long n)
{
    struct loop_result r = { CUDA_SUCCESS, CUDA_SUCCESS, 1, 0 };
    for (long i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        CUresult rc = drv.ipc_open(&p, *h, LAZY);
        if (rc != CUDA_SUCCESS) {
            r.rc_open = r.rc_open ? r.rc_open : rc;
            continue;
        }
        if (i == 0)
            r.ptr = p;
        r.ptr_same &= p == r.ptr;
        rc = drv.ipc_close(p);
        r.rc_close = r.rc_close ? r.rc_close : rc;
    }
    return r;
}

static int put_loop(const struct loop_result *r)
{
    put("rc_open", r->rc_open);
    put("rc_close", r->rc_close);
    put("hits_ptr_same", r->ptr_same);
    /* The driver's own reference count once every close is done: 1 while
     * the cache keeps the mapping idle, 0 when it was really closed. */
    put("refcount", drv.refcount(NULL, r->ptr));
    return r->rc_open || r->rc_close || !r->ptr_same;
}

static long count_arg(int argc, char **argv, int i, long dflt)
{
    if (argc <= i)
        return dflt;
    char *end;
    errno = 0;
    long v = strtol(argv[i], &end, 10);
    if (errno || *end || v < 0)
        die(EXIT_SETUP, "bad count \"%s\"", argv[i]);
    return v;
}

/* ---- scenarios ------------------------------------------------------------ */

/* A CUDA program that never touches IPC: the preload must leave no trace. */
static int scenario_noipc(int argc, char **argv)
{
    (void)argc, (void)argv;
    load_driver();
    CUdevice dev;
    CUcontext ctx;
    CHECK(drv.device_get(&dev, 0));
    CHECK(drv.ctx_create(&ctx, 0, dev));
    CHECK(drv.ctx_destroy(ctx));
    put_dispositions();
    return 0;
}

/* Which functions the resolver and dlsym hand out: ours for the hooked
 * names, the driver's own for everything else. */
static int scenario_cudart_sequence(int argc, char **argv)
{
    (void)argc, (void)argv;
    load_driver();
    put("resolver_is_hooked", is_hooked((void *)drv.resolve));
    put("open_is_hooked", is_hooked((void *)drv.ipc_open));
    put("open_v1_is_hooked", is_hooked(resolve("cuIpcOpenMemHandle", 4010)));
    put("close_is_hooked", is_hooked((void *)drv.ipc_close));
    put("ctx_destroy_is_hooked", is_hooked((void *)drv.ctx_destroy));
    put("init_is_hooked", is_hooked((void *)drv.init));
    put("dlsym_open_is_hooked", is_hooked(dlsym(drv.lib, "cuIpcOpenMemHandle_v2")));
    put("dlsym_init_is_hooked", is_hooked(dlsym(drv.lib, "cuInit")));
    use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, 2);
    return put_loop(&r);
}

/* The main job: the same handle opened and closed N times. */
static int scenario_openclose(int argc, char **argv)
{
    long n = count_arg(argc, argv, 2, 100);
    load_driver();
    use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, n);
    int bad = put_loop(&r);
    put_counters("");
    put_dispositions();
    return bad;
}

/* Opens and closes N times (0: no IPC at all), prints "ready", then waits
 * up to SECONDS for someone (ipccache-stats) to ask for its stats. */
static int scenario_hold(int argc, char **argv)
{
    long n = count_arg(argc, argv, 2, 10);
    long seconds = count_arg(argc, argv, 3, 10);
    load_driver();
    use_primary_context();
    int bad = 0;
    if (n > 0) {
        CUipcMemHandle h = foreign_handle(1);
        struct loop_result r = open_close(&h, n);
        bad = put_loop(&r);
    }
    puts("ready");
    fflush(stdout);
    for (long i = 0; i < seconds * 10; i++)
        usleep(100000); /* a signal cuts one sleep short; keep waiting */
    return bad;
}

/* Three opens and closes of one handle, so that the library has started
 * (settings read, stats handler installed); 1 if they went wrong. */
static int start_cache(void)
{
    load_driver();
    use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, 3);
    return put_loop(&r);
}

/* Opens and closes a few times, then raises the stats signal at itself. */
static int scenario_signal(int argc, char **argv)
{
    int sig = (int)count_arg(argc, argv, 2, SIGUSR1);
    int bad = start_cache();
    put_dispositions();
    fflush(stdout);
    raise(sig); /* delivered, and handled, before raise returns */
    put("raised", sig);
    return bad;
}

/* As ipccache-stats does for a process with no stats file: create
 * <IPCCACHE_STATS_DIR>/ipccache-<pid>.stats, then signal. */
static int scenario_signal_request(int argc, char **argv)
{
    const char *dir = getenv("IPCCACHE_STATS_DIR");
    char path[1024];
    snprintf(path, sizeof(path), "%s/ipccache-%ld.stats", dir ? dir : "/tmp", (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        die(EXIT_SETUP, "cannot create %s: %s", path, strerror(errno));
    close(fd);
    printf("request_file=%s\n", path);
    return scenario_signal(argc, argv);
}

/* ---- the stats signal's manners ----------------------------------------- */

static volatile sig_atomic_t app_handler_calls;

static void app_handler(int sig)
{
    (void)sig;
    app_handler_calls++;
}

static struct {
    pthread_t reader;
    atomic_int done;
    int pipe[2];
} interrupt;

/* Signals the reading thread until its read() returns; if it never does
 * (the call is restarted every time), ends it with a byte after 200
 * signals, a millisecond or more apart. */
static void *interrupter(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200 && !atomic_load(&interrupt.done); i++) {
        pthread_kill(interrupt.reader, SIGUSR1);
        usleep(1000);
    }
    if (!atomic_load(&interrupt.done) && write(interrupt.pipe[1], "x", 1) != 1)
        die(EXIT_SETUP, "write to pipe: %s", strerror(errno));
    return NULL;
}

/* 1 if a read() with nothing to read was cut short by SIGUSR1 (EINTR). */
static int read_interrupted(void)
{
    char c;
    pthread_t t;
    if (pipe(interrupt.pipe) != 0)
        die(EXIT_SETUP, "pipe: %s", strerror(errno));
    interrupt.reader = pthread_self();
    if (pthread_create(&t, NULL, interrupter, NULL) != 0)
        die(EXIT_SETUP, "pthread_create failed");
    ssize_t r = read(interrupt.pipe[0], &c, 1);
    int eintr = r < 0 && errno == EINTR;
    atomic_store(&interrupt.done, 1);
    pthread_join(t, NULL);
    return eintr;
}

/* The program's own SIGUSR1 handler, set up before any IPC: on an
 * alternate stack, SIGUSR2 blocked while it runs, SA_RESTART as asked. */
static void install_app_handler(int restart)
{
    static char altstack[64 * 1024];
    stack_t ss = { .ss_sp = altstack, .ss_size = sizeof(altstack) };
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = app_handler;
    sa.sa_flags = SA_ONSTACK | (restart ? SA_RESTART : 0);
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    if (sigaltstack(&ss, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0)
        die(EXIT_SETUP, "cannot install the program's handler: %s", strerror(errno));
}

/* "app": the program has a SIGUSR1 handler of its own (without
 * SA_RESTART); "app_restart": the same with SA_RESTART; "default": it has
 * none. After the first IPC call, prints how SIGUSR1 is set up now and
 * whether it still interrupts a read(). */
static int scenario_signal_manners(int argc, char **argv)
{
    const char *kind = argc > 2 ? argv[2] : "app";
    if (strcmp(kind, "default") != 0)
        install_app_handler(strcmp(kind, "app_restart") == 0);
    int bad = start_cache();
    struct sigaction now;
    sigaction(SIGUSR1, NULL, &now);
    put("hooked", is_hooked((now.sa_flags & SA_SIGINFO) ? (void *)now.sa_sigaction
                                                        : (void *)now.sa_handler));
    put("restart", !!(now.sa_flags & SA_RESTART));
    put("onstack", !!(now.sa_flags & SA_ONSTACK));
    put("mask_usr2", sigismember(&now.sa_mask, SIGUSR2));
    put("read_eintr", read_interrupted());
    put("app_handler_called", app_handler_calls > 0);
    return bad;
}

/* The program ignores SIGUSR1 (as under nohup-style launchers); after the
 * first IPC call it raises it and lives on to say so. */
static int scenario_signal_ignored(int argc, char **argv)
{
    (void)argc, (void)argv;
    signal(SIGUSR1, SIG_IGN);
    int bad = start_cache();
    put_dispositions();
    fflush(stdout);
    raise(SIGUSR1);
    put("survived", 1);
    return bad;
}

/* 1 if <XDG_RUNTIME_DIR>/ipccache/ipccache-<pid>.marker exists. */
static int marker_exists(pid_t pid)
{
    char path[1024];
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    snprintf(path, sizeof(path), "%s/ipccache/ipccache-%ld.marker", xdg ? xdg : "", (long)pid);
    return access(path, F_OK) == 0;
}

static int wait_child(pid_t pid);

/* After IPC, forks; the child raises the stats signal (its line must go to
 * its own %p file) and reports whether it has its own marker. */
static int scenario_fork_stats(int argc, char **argv)
{
    (void)argc, (void)argv;
    int bad = start_cache();
    put("parent_marker", marker_exists(getpid()));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die(EXIT_SETUP, "fork: %s", strerror(errno));
    if (pid == 0) {
        raise(SIGUSR1);
        put("child_marker", marker_exists(getpid()));
        fflush(stdout);
        exit(0); /* exit handlers run: the child's marker goes */
    }
    put("child_pid", pid);
    bad |= wait_child(pid);
    put("child_marker_after_exit", marker_exists(pid));
    return bad;
}

/* Field 22 of /proc/self/stat, the start time, as a string in buf. */
static const char *self_start(char *buf, size_t cap)
{
    char stat[1024] = "";
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f || !fgets(stat, sizeof(stat), f))
        die(EXIT_SETUP, "cannot read /proc/self/stat");
    fclose(f);
    char *p = strrchr(stat, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    snprintf(buf, cap, "%.*s", p ? (int)strcspn(p + 1, " ") : 0, p ? p + 1 : "");
    return buf;
}

/* After IPC, prints this process's marker, each line prefixed "marker_"
 * (the first, "ipccache-marker 1", as marker_header=), and its start time. */
static int scenario_marker(int argc, char **argv)
{
    (void)argc, (void)argv;
    int bad = start_cache();
    char path[1024], line[1200], start[32];
    snprintf(path, sizeof(path), "%s/ipccache/ipccache-%ld.marker", getenv("XDG_RUNTIME_DIR"),
             (long)getpid());
    FILE *f = fopen(path, "r");
    if (!f)
        die(EXIT_CHECK, "no marker %s: %s", path, strerror(errno));
    for (int i = 0; fgets(line, sizeof(line), f); i++)
        printf(i ? "marker_%s" : "marker_header=%s", line);
    fclose(f);
    printf("start=%s\n", self_start(start, sizeof(start)));
    Dl_info lib; /* drv.ipc_open is the library's wrapper */
    put("library_base",
        dladdr((void *)drv.ipc_open, &lib) ? (long long)(uintptr_t)lib.dli_fbase : 0);
    return bad;
}

/* Another user's trap where the request file goes (IPCCACHE_STATS_DIR):
 * "fifo" (with a reader, so that opening it would not block), "symlink" (to
 * a file of ours) or "other" (a file of uid 65534 anyone may write). Then
 * the stats signal; prints how many bytes reached the trap. */
static int scenario_signal_planted(int argc, char **argv)
{
    const char *kind = argc > 2 ? argv[2] : "fifo";
    const char *dir = getenv("IPCCACHE_STATS_DIR");
    char path[1024], victim[1100];
    snprintf(path, sizeof(path), "%s/ipccache-%ld.stats", dir ? dir : "/nonexistent",
             (long)getpid());
    snprintf(victim, sizeof(victim), "%s.victim", path);
    int fd = -1;
    if (strcmp(kind, "fifo") == 0) {
        if (mkfifo(path, 0666) != 0 || (fd = open(path, O_RDONLY | O_NONBLOCK)) < 0)
            die(EXIT_SETUP, "fifo %s: %s", path, strerror(errno));
    } else if (strcmp(kind, "symlink") == 0) {
        fd = open(victim, O_RDONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0 || symlink(victim, path) != 0)
            die(EXIT_SETUP, "symlink %s: %s", path, strerror(errno));
    } else if (strcmp(kind, "other") == 0) {
        if ((fd = open(path, O_RDONLY | O_CREAT | O_EXCL, 0666)) < 0 || fchmod(fd, 0666) != 0 ||
            fchown(fd, 65534, 65534) != 0)
            die(EXIT_SETUP, "file of uid 65534 %s: %s", path, strerror(errno));
    } else {
        die(EXIT_SETUP, "unknown trap \"%s\"", kind);
    }
    int bad = scenario_signal(2, argv); /* SIGUSR1 */
    char buf[8192];
    ssize_t n = strcmp(kind, "fifo") == 0 ? read(fd, buf, sizeof(buf)) : lseek(fd, 0, SEEK_END);
    put("planted_bytes", n > 0 ? n : 0);
    close(fd);
    return bad;
}

/* Open+close, then a normal exit: with FAKECUDA_DEINIT_AT_EXIT=1 the driver
 * goes down after ipccache's exit handler; with "now" it is already down
 * when that handler runs (as if torn down by an earlier destructor). */
static int scenario_exitdeinit(int argc, char **argv)
{
    load_driver();
    use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, 2);
    int bad = put_loop(&r);
    if (argc > 2 && strcmp(argv[2], "now") == 0)
        drv.deinit();
    return bad;
}

/* exit() from a signal handler, as programs do on a timer or SIGTERM (not
 * async-signal-safe, and done anyway). */
static void exit_from_handler(int sig)
{
    (void)sig;
    exit(0);
}

/* Opens and closes one handle until a timer's handler calls exit(), wherever
 * the loop is at that moment: often inside ipccache's table lock. */
static int scenario_exitsignal(int argc, char **argv)
{
    (void)argc, (void)argv;
    load_driver();
    use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = exit_from_handler;
    struct itimerval timer = { .it_value = { 0, 2000 } };
    if (sigaction(SIGALRM, &sa, NULL) != 0)
        die(EXIT_SETUP, "sigaction: %s", strerror(errno));
    puts("looping");
    fflush(stdout);
    if (setitimer(ITIMER_REAL, &timer, NULL) != 0)
        die(EXIT_SETUP, "setitimer: %s", strerror(errno));
    for (long i = 0; i < 100000000; i++)
        open_close(&h, 1);
    put("timer_fired", 0);
    return 1;
}

/* cudart's way in and an idle cached mapping; then the program unloads the
 * driver it loaded privately, and exits. */
static int scenario_dlclose(int argc, char **argv)
{
    (void)argc, (void)argv;
    load_driver();
    use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, 2);
    int bad = put_loop(&r);
    put("dlclose_rc", dlclose(drv.lib));
    return bad;
}

/* What a second interposer preloaded with ipccache (tests/process/interposer_lib.c)
 * counted; the same three fields it defines. */
struct interposer_counts {
    long opens, closes, reentries;
};

/* A program linked with -lcuda, with another interposer of the IPC calls
 * preloaded before or after ipccache: N opens and closes of one handle must
 * reach the driver through both libraries without looping between them.
 * With "resolver", the IPC functions come from the linked cuGetProcAddress. */
static int scenario_interposed(int argc, char **argv)
{
    long n = count_arg(argc, argv, 2, 10);
    load_driver_linked();
    if (argc > 3 && strcmp(argv[3], "resolver") == 0) {
        drv.resolve = (resolver_fn)linked("cuGetProcAddress_v2");
        drv.ipc_open = resolve("cuIpcOpenMemHandle", 11000);
        drv.ipc_close = resolve("cuIpcCloseMemHandle", 4010);
    }
    use_primary_context();
    void (*get_counts)(struct interposer_counts *) =
        (void (*)(struct interposer_counts *))dlsym(RTLD_DEFAULT, "interposer_counts");
    if (!get_counts)
        die(EXIT_SETUP, "no interposer library preloaded");
    put("open_is_hooked", is_hooked((void *)drv.ipc_open));
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, n);
    int bad = put_loop(&r);
    put_counters("");
    struct interposer_counts c;
    get_counts(&c);
    put("interposer_opens", c.opens);
    put("interposer_closes", c.closes);
    put("interposer_reentries", c.reentries);
    return bad || c.reentries != 0;
}

/* Each error case, by its code; run with and without the preload, the codes
 * must be the same (the cache returns the driver's errors, never its own). */
static void error_cases_ipc(CUcontext ctx)
{
    CUipcMemHandle a = foreign_handle(1), zero;
    CUdeviceptr p = 0, q = 0;
    memset(&zero, 0, sizeof(zero));

    CHECK(drv.ipc_open(&p, a, LAZY));
    CHECK(drv.ipc_close(p));
    put("double_close", drv.ipc_close(p));
    put("unknown_ptr", drv.ipc_close((CUdeviceptr)0xdead0000));
    put("zero_handle", drv.ipc_open(&q, zero, LAZY));
    CHECK(drv.ipc_open(&p, a, LAZY));
    put("flags0_cached", drv.ipc_open(&q, a, 0));
    CHECK(drv.ipc_close(p));
    put("null_pdptr", drv.ipc_open(NULL, a, LAZY));

    CHECK(drv.ctx_set_current(NULL));
    put("no_ctx_open", drv.ipc_open(&q, a, LAZY));
    put("no_ctx_close", drv.ipc_close(p));
    CHECK(drv.ctx_set_current(ctx));

    CUdeviceptr mine;
    CUipcMemHandle own;
    CHECK(drv.mem_alloc(&mine, 1 << 20));
    CHECK(drv.ipc_get(&own, mine));
    put("own_export", drv.ipc_open(&q, own, LAZY));
}

/* A mapping must not outlive its context: the stand-in reuses the dead
 * context's address, so a cache keyed on addresses would hand back a
 * pointer the driver no longer knows. */
static void error_cases_dead_context(CUdevice dev)
{
    CUipcMemHandle a = foreign_handle(1);
    CUcontext c;
    CUdeviceptr p, q;
    CHECK(drv.ctx_create(&c, 0, dev));
    CHECK(drv.ipc_open(&p, a, LAZY));
    CHECK(drv.ipc_close(p));
    CHECK(drv.ctx_destroy(c));
    put("destroyed_ctx_close", drv.ipc_close(p));

    CHECK(drv.ctx_create(&c, 0, dev));
    uint64_t maps = counters().maps;
    put("reopen_after_destroy", drv.ipc_open(&q, a, LAZY));
    put("reopen_maps_delta", (long long)(counters().maps - maps));
    CHECK(drv.ipc_close(q));
    CHECK(drv.ctx_destroy(c));
}

static int scenario_errors(int argc, char **argv)
{
    (void)argc, (void)argv;
    load_driver();
    CUcontext ctx = use_primary_context();
    CUdevice dev;
    CHECK(drv.device_get(&dev, 0));
    error_cases_ipc(ctx);
    error_cases_dead_context(dev);
    return 0;
}

/* ---- one mapping reached several ways ------------------------------------ */

typedef CUresult (*ipc_open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned);
typedef CUresult (*ipc_close_fn)(CUdeviceptr);

/* Opens and closes through the driver's entry points (the preload's when it
 * is loaded) and past them (what a library bound to the driver itself
 * reaches), with two exports of one allocation, and prints each call's code.
 * With and without the preload, every code must be the same, and so must
 * what is left mapped at exit (one open of B is never closed). */
static int scenario_mixed(int argc, char **argv)
{
    enum { A, A2, B };               /* handles: two exports of one allocation, and another */
    static const struct {
        char op;                     /* 'o' open, 'c' close */
        char via;                    /* 'e' entry point, 'd' direct */
        int handle;                  /* opened; closed: that handle's pointer */
    } steps[] = {
        { 'o', 'e', A }, { 'o', 'e', A2 }, { 'o', 'd', A }, { 'c', 'e', A },
        { 'o', 'e', B }, { 'c', 'e', A }, { 'c', 'e', A }, { 'c', 'e', A },
        { 'o', 'd', A2 }, { 'o', 'e', A }, { 'c', 'e', A }, { 'o', 'e', A2 },
        { 'c', 'e', A }, { 'c', 'd', A }, { 'c', 'e', A }, { 'c', 'e', B },
        { 'o', 'e', B },
    };
    (void)argc, (void)argv;
    load_driver();
    use_primary_context();
    void (*make_export)(CUipcMemHandle *, uint64_t, uint64_t, uint64_t) =
        fake_hook("fakecuda_make_foreign_export");
    ipc_open_fn open_direct = (ipc_open_fn)fake_hook("fakecuda_ipc_open_direct");
    ipc_close_fn close_direct = (ipc_close_fn)fake_hook("fakecuda_ipc_close_direct");
    CUipcMemHandle h[3];
    make_export(&h[A], 1, 1 << 20, 0);
    make_export(&h[A2], 1, 1 << 20, 7);
    make_export(&h[B], 2, 1 << 20, 0);
    CUdeviceptr ptr[3] = { 0, 0, 0 };  /* by handle; A2 shares A's */
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        int k = steps[i].handle, slot = k == A2 ? A : k;
        char key[32];
        CUresult rc;
        if (steps[i].op == 'o') {
            CUdeviceptr p = 0;
            rc = (steps[i].via == 'e' ? drv.ipc_open : open_direct)(&p, h[k], LAZY);
            snprintf(key, sizeof(key), "step%02zu_same", i + 1);
            put(key, ptr[slot] == 0 || p == ptr[slot]);
            if (rc == CUDA_SUCCESS)
                ptr[slot] = p;
        } else {
            rc = (steps[i].via == 'e' ? drv.ipc_close : close_direct)(ptr[slot]);
        }
        snprintf(key, sizeof(key), "step%02zu", i + 1);
        put(key, rc);
    }
    put("refcount_a", drv.refcount(NULL, ptr[A]));
    put("refcount_b", drv.refcount(NULL, ptr[B]));
    return 0;
}

/* ---- a context torn down where no interposer sees it --------------------- */

static struct {
    CUresult (*destroy_direct)(CUcontext);
    CUresult (*reset_direct)(CUdevice);
    CUcontext doomed;
    CUdevice dev;
} unseen;

/* The teardown a static cudart bound to the driver itself makes
 * (cudaDeviceReset), or a layer ahead of the preload calling the driver. */
static void tear_down_unseen(int primary)
{
    CHECK(primary ? unseen.reset_direct(unseen.dev) : unseen.destroy_direct(unseen.doomed));
}

/* Another thread tears this thread's context down and creates one at its
 * address (current there, not here). */
static void *tear_down_elsewhere(void *arg)
{
    CUcontext *born = arg;
    tear_down_unseen(0);
    CHECK(drv.ctx_create(born, 0, unseen.dev));
    return NULL;
}

/* A context of the kind asked for, current: a created one, or device 0's
 * primary (as cudart's first call and its first call after a reset). */
static CUcontext current_context_of(int primary)
{
    CUcontext c;
    if (primary)
        return use_primary_context();
    CHECK(drv.ctx_create(&c, 0, unseen.dev));
    return c;
}

/* Opens A (then closes it: idle) and B (held) in a context, tears it down
 * past the preload, then, in a context at the same address, opens A and B
 * again and closes the held pointer of B: every code, whether each open
 * mapped for real and whether the pointer is mapped in the new context must
 * be as without the preload. "elsewhere": another thread does it while
 * this thread keeps the dead context current. */
static int scenario_unseen_teardown(int argc, char **argv)
{
    const char *how = argc > 2 ? argv[2] : "destroy";
    int primary = strcmp(how, "reset") == 0, elsewhere = strcmp(how, "elsewhere") == 0;
    load_driver();
    CHECK(drv.device_get(&unseen.dev, 0));
    unseen.destroy_direct = fake_hook("fakecuda_ctx_destroy_direct");
    unseen.reset_direct = fake_hook("fakecuda_primary_reset_direct");
    CUipcMemHandle a = foreign_handle(1), b = foreign_handle(2);
    unseen.doomed = current_context_of(primary);
    CUdeviceptr pa = 0, pb = 0, qa = 0, qb = 0;
    CHECK(drv.ipc_open(&pa, a, LAZY));
    CHECK(drv.ipc_close(pa));
    CHECK(drv.ipc_open(&pa, a, LAZY)); /* a hit with the preload: the thread's loan */
    CHECK(drv.ipc_close(pa));
    CHECK(drv.ipc_open(&pb, b, LAZY));

    CUcontext born = NULL;
    if (elsewhere) {
        pthread_t t;
        if (pthread_create(&t, NULL, tear_down_elsewhere, &born) != 0)
            die(EXIT_SETUP, "pthread_create failed");
        pthread_join(t, NULL);
    } else {
        tear_down_unseen(primary);
        born = current_context_of(primary);
    }
    put("same_address", born == unseen.doomed);
    uint64_t maps = counters().maps;
    put("open_a", drv.ipc_open(&qa, a, LAZY));
    put("open_a_mapped", (long long)(counters().maps - maps));
    put("a_valid_here", drv.refcount(NULL, qa));
    put("close_old_b", drv.ipc_close(pb));
    maps = counters().maps;
    put("open_b", drv.ipc_open(&qb, b, LAZY));
    put("open_b_mapped", (long long)(counters().maps - maps));
    put("b_valid_here", drv.refcount(NULL, qb));
    put("close_a", drv.ipc_close(qa));
    put("close_b", drv.ipc_close(qb));
    put("close_a_again", drv.ipc_close(qa));
    return 0;
}

/* A mapping left idle in a context that is then destroyed past the preload,
 * while another context (at another address) is current; an open and close
 * there push the cache past IPCCACHE_MAX_IDLE_ENTRIES=1, so the old mapping
 * is evicted. Its context's pointer is dead: the driver answers a push of it
 * with success and aborts the process at the next call, so the eviction must
 * not push it. Every code must be as without the preload. */
static int scenario_unseen_teardown_evict(int argc, char **argv)
{
    (void)argc, (void)argv;
    load_driver();
    CHECK(drv.device_get(&unseen.dev, 0));
    unseen.destroy_direct = fake_hook("fakecuda_ctx_destroy_direct");
    CUipcMemHandle a = foreign_handle(1), b = foreign_handle(2);
    CUcontext other;
    CUdeviceptr pa = 0, pb = 0;
    CHECK(drv.ctx_create(&unseen.doomed, 0, unseen.dev));
    CHECK(drv.ipc_open(&pa, a, LAZY));
    CHECK(drv.ipc_close(pa));
    CHECK(drv.ctx_create(&other, 0, unseen.dev)); /* current now, at another address */
    tear_down_unseen(0);
    put("other_address", other != unseen.doomed);
    put("open_b", drv.ipc_open(&pb, b, LAZY));
    put("close_b", drv.ipc_close(pb));
    put("open_a", drv.ipc_open(&pa, a, LAZY));
    put("close_a", drv.ipc_close(pa));
    return 0;
}

/* ---- threads ------------------------------------------------------------- */

#define THREAD_HANDLES 4
#define THREAD_ITERATIONS 2000

struct hammer_shared {
    CUcontext ctx;
    _Atomic CUdeviceptr first_ptr[THREAD_HANDLES]; /* per handle, set once */
    atomic_long errors, mismatches;
};

/* Opens and closes the handles in turn; every thread must see the same
 * pointer for the same handle, as with the driver alone. */
static void *hammer_thread(void *arg)
{
    struct hammer_shared *s = arg;
    CUipcMemHandle h[THREAD_HANDLES];
    for (int k = 0; k < THREAD_HANDLES; k++)
        h[k] = foreign_handle((uint64_t)k + 1);
    if (drv.ctx_set_current(s->ctx) != CUDA_SUCCESS) {
        atomic_fetch_add(&s->errors, 1);
        return NULL;
    }
    for (int i = 0; i < THREAD_ITERATIONS; i++) {
        int k = i % THREAD_HANDLES;
        CUdeviceptr p = 0, expected = 0;
        if (drv.ipc_open(&p, h[k], LAZY) != CUDA_SUCCESS) {
            atomic_fetch_add(&s->errors, 1);
            continue;
        }
        if (!atomic_compare_exchange_strong(&s->first_ptr[k], &expected, p) && expected != p)
            atomic_fetch_add(&s->mismatches, 1);
        if (drv.ipc_close(p) != CUDA_SUCCESS)
            atomic_fetch_add(&s->errors, 1);
    }
    return NULL;
}

static int scenario_threads(int argc, char **argv)
{
    long n = count_arg(argc, argv, 2, 8);
    load_driver();
    struct hammer_shared s = { .ctx = use_primary_context() };
    pthread_t *t = calloc((size_t)n, sizeof(*t));
    if (!t)
        die(EXIT_SETUP, "out of memory");
    for (long i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, hammer_thread, &s) != 0)
            die(EXIT_SETUP, "pthread_create failed");
    for (long i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    free(t);
    put("threads", n);
    put("errors", atomic_load(&s.errors));
    put("ptr_mismatches", atomic_load(&s.mismatches));
    put_counters("");
    return atomic_load(&s.errors) || atomic_load(&s.mismatches);
}

/* ---- fork ---------------------------------------------------------------- */

/*
 * A thread keeps opening and closing handle 2 while the main thread forks.
 *
 * The stand-in driver has no fork handlers (nor has the real one: CUDA is not
 * usable in a fork child), so a fork while that thread is inside the driver
 * leaves the driver's own lock held in the child forever. To test ipccache's
 * fork handling and not the stand-in's, an atfork handler parks the thread
 * between calls for the instant of the fork - unless "unguarded" is given.
 */
static struct {
    CUcontext ctx;
    atomic_int stop, park, parked;
    atomic_long iterations, errors;
} spin;

static void spin_park_point(void)
{
    while (atomic_load(&spin.park)) {
        atomic_store(&spin.parked, 1);
        sched_yield();
    }
    atomic_store(&spin.parked, 0);
}

static void *spin_thread(void *arg)
{
    (void)arg;
    CUipcMemHandle h = foreign_handle(2);
    if (drv.ctx_set_current(spin.ctx) != CUDA_SUCCESS)
        atomic_fetch_add(&spin.errors, 1);
    while (!atomic_load(&spin.stop)) {
        spin_park_point();
        struct loop_result r = open_close(&h, 1);
        if (r.rc_open || r.rc_close)
            atomic_fetch_add(&spin.errors, 1);
        atomic_fetch_add(&spin.iterations, 1);
    }
    return NULL;
}

static void park_spinner(void)
{
    atomic_store(&spin.park, 1);
    while (!atomic_load(&spin.parked))
        sched_yield();
}

static void unpark_spinner(void)
{
    atomic_store(&spin.park, 0);
}

/* The child's table must start empty: opening the handle the parent has
 * cached must reach the driver. Bounded by alarm() in case of a deadlock. */
static void fork_child(const CUipcMemHandle *h)
{
    alarm(5);
    uint64_t open_calls = counters().open_calls;
    CUdeviceptr p = 0;
    put("child_open_rc", drv.ipc_open(&p, *h, LAZY));
    put("child_open_calls_delta", (long long)(counters().open_calls - open_calls));
    put("child_close_rc", drv.ipc_close(p));
    fflush(stdout);
    exit(0); /* runs the exit handlers, ipccache's among them */
}

/* Waits up to 10 s; prints how the child ended; returns 1 unless it
 * exited with status 0. */
static int wait_child(pid_t pid)
{
    for (int i = 0; i < 1000; i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) != pid) {
            nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
            continue;
        }
        if (WIFSIGNALED(status)) {
            put("child_signal", WTERMSIG(status));
            return 1;
        }
        put("child_exit", WEXITSTATUS(status));
        return WEXITSTATUS(status) != 0;
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    put("child_timeout", 1);
    return 1;
}

/* Forks a child that runs fork_child(h); 1 unless it exited with status 0. */
static int fork_and_wait(const CUipcMemHandle *h)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die(EXIT_SETUP, "fork: %s", strerror(errno));
    if (pid == 0)
        fork_child(h);
    return wait_child(pid);
}

static int scenario_fork(int argc, char **argv)
{
    int guarded = !(argc > 2 && strcmp(argv[2], "unguarded") == 0);
    load_driver();
    spin.ctx = use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, 2); /* now cached in the parent */
    int bad = put_loop(&r);
    if (guarded)
        pthread_atfork(park_spinner, unpark_spinner, unpark_spinner);

    pthread_t t;
    if (pthread_create(&t, NULL, spin_thread, NULL) != 0)
        die(EXIT_SETUP, "pthread_create failed");
    while (atomic_load(&spin.iterations) < 100)
        sched_yield();
    bad |= fork_and_wait(&h);
    atomic_store(&spin.stop, 1);
    pthread_join(t, NULL);
    put("spin_errors", atomic_load(&spin.errors));
    return bad || atomic_load(&spin.errors);
}

/*
 * Forks while threads hit their loans, unparked: each of HITTERS threads
 * opens and closes handle 3 (lent to it: no lock) as fast as it can, so a
 * fork copies some of them mid-call. The child's fork handling takes back
 * loans of threads it does not have; were it to wait for any of them it
 * would hang. Each child opens, closes and exits within alarm()'s 5 s. The
 * hitting threads call only the stand-in's lock-free cuCtxGetCurrent, so no
 * lock of the stand-in's is copied held.
 */
#define HITTERS 4
#define HITTING_FORKS 20

static struct {
    CUcontext ctx;
    atomic_int stop;
    atomic_long iterations[HITTERS];
    atomic_long errors;
} hitting;

static void *hitting_thread(void *arg)
{
    long id = (long)arg;
    CUipcMemHandle h = foreign_handle(3);
    if (drv.ctx_set_current(hitting.ctx) != CUDA_SUCCESS)
        atomic_fetch_add(&hitting.errors, 1);
    while (!atomic_load_explicit(&hitting.stop, memory_order_relaxed)) {
        struct loop_result r = open_close(&h, 64);
        if (r.rc_open || r.rc_close)
            atomic_fetch_add(&hitting.errors, 1);
        atomic_fetch_add_explicit(&hitting.iterations[id], 1, memory_order_relaxed);
    }
    return NULL;
}

static int scenario_fork_hitting(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    load_driver();
    hitting.ctx = use_primary_context();
    CUipcMemHandle h = foreign_handle(1);
    struct loop_result r = open_close(&h, 2);
    int bad = put_loop(&r);
    pthread_t t[HITTERS];
    for (long i = 0; i < HITTERS; i++)
        if (pthread_create(&t[i], NULL, hitting_thread, (void *)i) != 0)
            die(EXIT_SETUP, "pthread_create failed");
    for (int i = 0; i < HITTERS; i++)
        while (atomic_load(&hitting.iterations[i]) < 100)
            sched_yield();
    /* Stops at the first failed child: wait_child kills a hung one within
     * its 10 s, well inside the test's time, so none outlives the probe. */
    int children_failed = 0;
    for (int i = 0; i < HITTING_FORKS && !children_failed; i++)
        children_failed += fork_and_wait(&h);
    atomic_store(&hitting.stop, 1);
    for (int i = 0; i < HITTERS; i++)
        pthread_join(t[i], NULL);
    put("children_failed", children_failed);
    put("hit_errors", atomic_load(&hitting.errors));
    return bad || children_failed || atomic_load(&hitting.errors);
}

/*
 * Two forks at ipccache's start. glibc runs, for a fork, only the fork
 * handlers registered before that fork began. The "early" thread's fork
 * begins before the first IPC call; the main thread then makes that call
 * (ipccache starts) and forks too. The probe's own fork handler holds each
 * fork in its prepare step so that the early fork copies the process while
 * the late one is in its prepare step: were ipccache's handlers registered
 * at start, the late fork's would hold the table lock then, and the early
 * child, whose fork runs none of them, would wait on that lock forever
 * (alarm ends it). Every wait is bounded.
 */
static struct {
    pthread_t early;
    CUcontext ctx;
    CUipcMemHandle h;
    atomic_int early_preparing, late_preparing, early_forked;
    pid_t early_pid;
} race;

static void wait_flag(atomic_int *flag)
{
    for (int i = 0; i < 3000 && !atomic_load(flag); i++)
        nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
}

static void order_forks(void)
{
    if (pthread_equal(pthread_self(), race.early)) {
        atomic_store(&race.early_preparing, 1);
        wait_flag(&race.late_preparing);
    } else {
        atomic_store(&race.late_preparing, 1);
        wait_flag(&race.early_forked);
    }
}

/* A fork child's IPC open and close; exit status 0 when both succeed. */
static void race_child(void)
{
    alarm(5);
    CUdeviceptr p = 0;
    CUresult rc = drv.ipc_open(&p, race.h, LAZY);
    if (rc == CUDA_SUCCESS)
        rc = drv.ipc_close(p);
    exit(rc == CUDA_SUCCESS ? 0 : 3); /* ipccache's exit handler runs too */
}

static void *early_fork(void *arg)
{
    (void)arg;
    drv.ctx_set_current(race.ctx);
    pid_t pid = fork();
    if (pid == 0)
        race_child();
    race.early_pid = pid;
    atomic_store(&race.early_forked, 1);
    return NULL;
}

/* Waits up to 10 s for pid; prints WHO_exit or WHO_signal (or WHO_timeout). */
static int reap(pid_t pid, const char *who)
{
    char key[64];
    int status = 0;
    for (int i = 0; i < 1000 && waitpid(pid, &status, WNOHANG) != pid; i++, status = -1)
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    if (status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        snprintf(key, sizeof(key), "%s_timeout", who);
        put(key, 1);
        return 1;
    }
    snprintf(key, sizeof(key), WIFSIGNALED(status) ? "%s_signal" : "%s_exit", who);
    put(key, WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

static int scenario_fork_at_start(int argc, char **argv)
{
    (void)argc, (void)argv;
    load_driver();
    race.ctx = use_primary_context();
    race.h = foreign_handle(1);
    pthread_atfork(order_forks, NULL, NULL);
    fflush(stdout);
    if (pthread_create(&race.early, NULL, early_fork, NULL) != 0)
        die(EXIT_SETUP, "pthread_create failed");
    wait_flag(&race.early_preparing);
    struct loop_result r = open_close(&race.h, 1); /* ipccache starts here */
    int bad = put_loop(&r);
    pid_t late = fork();
    if (late < 0)
        die(EXIT_SETUP, "fork: %s", strerror(errno));
    if (late == 0)
        race_child();
    pthread_join(race.early, NULL);
    bad |= race.early_pid <= 0;
    if (race.early_pid > 0)
        bad |= reap(race.early_pid, "early_child");
    bad |= reap(late, "late_child");
    return bad;
}

/*
 * A fork, or the stats signal, inside a C library call ipccache makes,
 * widened by tests/process/window_lib.c (preloaded ahead, IPCC_TEST_WINDOW naming
 * the call). "atexit" and "phdr": a thread makes the call that lands in the
 * window (the first IPC open, which registers the exit handlers; a lookup of
 * a hooked name, which checks the load order), the main thread forks in it,
 * and the child opens, looks up and exits within 5 s. "sigaction": the
 * signal comes while ipccache installs its handler; the program's own
 * handler must see it. "exit_in_atexit" and "fork_in_phdr" (run with
 * IPCC_TEST_WINDOW_RAISE=SIGUSR2's number): the signal comes in the window,
 * on the thread in it, and the program's handler calls exit(42), or forks
 * a child that exits 0; neither may hang. "fork_in_lock" (window "lock",
 * raising SIGUSR2): the handler forks while its thread holds ipccache's
 * table lock.
 */
static struct {
    CUcontext ctx;
    CUipcMemHandle h;
    int phdr;
} window;

static void *window_hook(const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p)
        die(EXIT_SETUP, "no %s: tests/process/window_lib.c is not preloaded", name);
    return p;
}

static void window_child(void)
{
    alarm(5);
    CUdeviceptr p = 0;
    resolve("cuIpcOpenMemHandle", 11000);
    CUresult rc = drv.ipc_open(&p, window.h, LAZY);
    if (rc == CUDA_SUCCESS)
        rc = drv.ipc_close(p);
    exit(rc == CUDA_SUCCESS ? 0 : 3); /* exit handlers run too */
}

static void *window_call(void *arg)
{
    (void)arg;
    drv.ctx_set_current(window.ctx);
    if (window.phdr) {
        resolve("cuIpcOpenMemHandle", 11000);
    } else {
        CUdeviceptr p = 0;
        if (drv.ipc_open(&p, window.h, LAZY) == CUDA_SUCCESS)
            drv.ipc_close(p);
    }
    return NULL;
}

static atomic_int app_signals;

static void count_app_signal(int sig)
{
    (void)sig;
    atomic_fetch_add(&app_signals, 1);
}

static int window_signal(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = count_app_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    ((void (*)(void))window_hook("window_arm"))();
    CUdeviceptr p = 0;
    CHECK(drv.ipc_open(&p, window.h, LAZY)); /* ipccache installs its handler */
    CHECK(drv.ipc_close(p));
    int raised = ((int (*)(void))window_hook("window_raised"))();
    put("window_opened", raised);
    put("app_signals", atomic_load(&app_signals));
    return raised != 1 || atomic_load(&app_signals) != raised;
}

/* A thread runs call, which lands in the window; once wait_open says it is
 * open, the main thread forks: the child opens, looks up and exits. */
static int fork_in_window(void *(*call)(void *), int (*wait_open)(void))
{
    pthread_t t;
    if (pthread_create(&t, NULL, call, NULL) != 0)
        die(EXIT_SETUP, "pthread_create failed");
    int opened = wait_open();
    pid_t pid = fork();
    if (pid < 0)
        die(EXIT_SETUP, "fork: %s", strerror(errno));
    if (pid == 0)
        window_child();
    put("window_opened", opened);
    int bad = reap(pid, "child");
    pthread_join(t, NULL);
    return bad || !opened;
}

static void exit_42(int sig)
{
    (void)sig;
    exit(42);
}

static volatile sig_atomic_t handler_child_status = -1;

static void fork_in_handler(int sig)
{
    (void)sig;
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid)
        handler_child_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void on_sigusr2(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    alarm(10); /* a hang ends, as a failure */
}

/* The first IPC open registers the exit handlers: the signal comes while
 * glibc holds its lock of them; the handler exits, so the open never returns. */
static int window_exit_in_atexit(void)
{
    on_sigusr2(exit_42);
    if (((int (*)(void))window_hook("window_fill_exit_block"))() != 0)
        die(EXIT_SETUP, "glibc's exit handlers are not laid out in blocks of 32");
    ((void (*)(void))window_hook("window_arm"))();
    CUdeviceptr p = 0;
    drv.ipc_open(&p, window.h, LAZY);
    put("window_opened", ((int (*)(void))window_hook("window_wait_open"))());
    return 1; /* the handler did not run */
}

/* A lookup walks the loaded objects: the signal comes while the loader
 * holds its lock of them; the handler forks and waits for its child. */
static int window_fork_in_phdr(void)
{
    on_sigusr2(fork_in_handler);
    ((void (*)(void))window_hook("window_arm"))();
    resolve("cuIpcOpenMemHandle", 11000);
    put("window_opened", ((int (*)(void))window_hook("window_wait_open"))());
    put("handler_child_exit", handler_child_status);
    return handler_child_status != 0;
}

/* A close takes the table lock: the signal comes while this thread holds
 * it (the window "lock": its first precise clock reading, which is under
 * the lock); the handler forks and waits for its child. Then the parent's
 * cache still answers: the handle opened again is a hit. */
static int window_fork_in_lock(void)
{
    CUdeviceptr p = 0, other = 0, again = 0;
    CHECK(drv.ipc_open(&p, window.h, LAZY));
    CHECK(drv.ipc_open(&other, foreign_handle(2), LAZY)); /* lent instead: p's close locks */
    on_sigusr2(fork_in_handler);
    ((void (*)(void))window_hook("window_arm"))();
    CHECK(drv.ipc_close(p));
    put("window_opened", ((int (*)(void))window_hook("window_wait_open"))());
    put("handler_child_exit", handler_child_status);
    CHECK(drv.ipc_open(&again, window.h, LAZY));
    CHECK(drv.ipc_close(again));
    CHECK(drv.ipc_close(other));
    put("same_mapping", again == p);
    return handler_child_status != 0 || again != p;
}

/* "alloc_fork", with tests/process/alloc_lock_lib.c preloaded ahead: a
 * thread's miss allocates while it holds ipccache's table lock, and the main
 * thread forks then, with an allocator whose fork handler was registered
 * after ipccache's; the child opens and exits, and the miss completes.
 * "alloc_fork_atexit": the allocator's handler registered before ipccache's
 * start, the allocation is glibc's in the exit handlers' registration (the
 * first open's, inside the fork guard), and the fork comes then. */
static void open_and_close(CUipcMemHandle h)
{
    drv.ctx_set_current(window.ctx);
    CUdeviceptr p = 0;
    if (drv.ipc_open(&p, h, LAZY) == CUDA_SUCCESS)
        drv.ipc_close(p);
}

static void *alloc_fork_miss(void *arg)
{
    (void)arg;
    open_and_close(foreign_handle(2));
    return NULL;
}

static void *alloc_fork_first_open(void *arg)
{
    (void)arg;
    open_and_close(window.h);
    return NULL;
}

static int window_alloc_fork(int at_start)
{
    alarm(10); /* a hang ends, as a failure */
    if (at_start && ((int (*)(void))window_hook("alloc_lock_fill_exit_block"))() != 0)
        die(EXIT_SETUP, "glibc's exit handlers are not laid out in blocks of 32");
    if (!at_start) {
        CUdeviceptr p = 0;
        CHECK(drv.ipc_open(&p, window.h, LAZY)); /* started: its own allocations are done */
        CHECK(drv.ipc_close(p));
    }
    ((void (*)(void))window_hook(at_start ? "alloc_lock_arm_registration" : "alloc_lock_arm"))();
    fflush(stdout);
    int bad = fork_in_window(at_start ? alloc_fork_first_open : alloc_fork_miss,
                             (int (*)(void))window_hook("alloc_lock_wait_open"));
    put("allocs_under_lock", (int)((long (*)(void))window_hook("alloc_lock_under_lock"))());
    return bad;
}

static int scenario_window(int argc, char **argv)
{
    const char *what = argc > 2 ? argv[2] : "";
    load_driver();
    window.ctx = use_primary_context();
    window.h = foreign_handle(1);
    if (strcmp(what, "sigaction") == 0)
        return window_signal();
    if (strcmp(what, "exit_in_atexit") == 0)
        return window_exit_in_atexit();
    if (strcmp(what, "fork_in_phdr") == 0)
        return window_fork_in_phdr();
    if (strcmp(what, "fork_in_lock") == 0)
        return window_fork_in_lock();
    if (strcmp(what, "alloc_fork") == 0 || strcmp(what, "alloc_fork_atexit") == 0)
        return window_alloc_fork(strcmp(what, "alloc_fork_atexit") == 0);
    window.phdr = strcmp(what, "phdr") == 0;
    if (!window.phdr && ((int (*)(void))window_hook("window_fill_exit_block"))() != 0)
        die(EXIT_SETUP, "glibc's exit handlers are not laid out in blocks of 32");
    ((void (*)(void))window_hook("window_arm"))();
    fflush(stdout);
    return fork_in_window(window_call, (int (*)(void))window_hook("window_wait_open"));
}

/* ---- main ---------------------------------------------------------------- */

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} scenarios[] = {
    { "noipc", scenario_noipc, "" },
    { "cudart_sequence", scenario_cudart_sequence, "" },
    { "openclose", scenario_openclose, "[N=100]" },
    { "hold", scenario_hold, "[N=10] [SECONDS=10]" },
    { "signal", scenario_signal, "[SIGNO=SIGUSR1]" },
    { "signal_request", scenario_signal_request, "[SIGNO=SIGUSR1]" },
    { "signal_manners", scenario_signal_manners, "[app|app_restart|default]" },
    { "signal_ignored", scenario_signal_ignored, "" },
    { "signal_planted", scenario_signal_planted, "fifo|symlink|other" },
    { "fork_stats", scenario_fork_stats, "" },
    { "marker", scenario_marker, "" },
    { "exitdeinit", scenario_exitdeinit, "[now]" },
    { "exitsignal", scenario_exitsignal, "" },
    { "dlclose", scenario_dlclose, "" },
    { "interposed", scenario_interposed, "[N=10] [resolver]" },
    { "errors", scenario_errors, "" },
    { "mixed", scenario_mixed, "" },
    { "threads", scenario_threads, "[N=8]" },
    { "unseen_teardown", scenario_unseen_teardown, "[destroy|reset|elsewhere]" },
    { "unseen_teardown_evict", scenario_unseen_teardown_evict, "" },
    { "fork", scenario_fork, "[unguarded]" },
    { "fork_hitting", scenario_fork_hitting, "" },
    { "fork_at_start", scenario_fork_at_start, "" },
    { "window", scenario_window, "atexit|phdr|sigaction|exit_in_atexit|fork_in_phdr|alloc_fork|alloc_fork_atexit" },
};

int main(int argc, char **argv)
{
    size_t n = sizeof(scenarios) / sizeof(scenarios[0]);
    for (size_t i = 0; argc > 1 && i < n; i++) {
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            int bad = scenarios[i].run(argc, argv);
            put("pid", getpid());
            fflush(stdout);
            return bad ? EXIT_CHECK : 0;
        }
    }
    fprintf(stderr, "usage: probe SCENARIO [ARGS]; scenarios:\n");
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  %s %s\n", scenarios[i].name, scenarios[i].usage);
    return EXIT_SETUP;
}
