/*
 * test_process.c - ipccache as its users meet it: LD_PRELOAD into a fresh
 * process that reaches the driver the way cudart does (tests/process/probe.c).
 *
 * Each test spawns build/tests/probe (IPCC_TEST_BUILD names the build folder)
 * in a controlled environment - none of the caller's IPCCACHE_* settings
 * leak in - captures stdout and stderr separately, and checks what the
 * probe printed (key=value lines), what ipccache said, and the files it
 * wrote. IPCC_TEST_PRELOAD_PREFIX (the sanitizer run: the ASan runtime) is
 * put ahead of the library in LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OUTPUT_CAP (64 * 1024)
#define RUN_LIMIT_S 15      /* below the tests' own 20 s timeout */
#define MAX_ENV 32
#define TIMED_OUT (-1)

/* ---- where things are ---------------------------------------------------- */

static char build_dir[PATH_MAX];
static char tmpdir[256];

static void find_build_dir(void)
{
    const char *b = getenv("IPCC_TEST_BUILD");
    if (!realpath(b && *b ? b : "build", build_dir))
        cr_fatal("build folder %s: %s", b ? b : "build", strerror(errno));
}

static void make_tmpdir(void)
{
    find_build_dir();
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/ipcc-process-XXXXXX",
             base && *base == '/' ? base : "/tmp");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

/* The files of one folder, then the folder. */
static void remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(path);
}

/* The test's files, and the per-user folder the library made there (the
 * probe's XDG_RUNTIME_DIR is tmpdir): no other subfolders are made. */
static void remove_tmpdir(void)
{
    char userdir[sizeof(tmpdir) + 16];
    snprintf(userdir, sizeof(userdir), "%s/ipccache", tmpdir);
    remove_dir(userdir);
    remove_dir(tmpdir);
}

TestSuite(process, .init = make_tmpdir, .fini = remove_tmpdir);

/* <tmpdir>/name, in a buffer of the caller's. */
static char *tmp_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

/* ---- running a process --------------------------------------------------- */

struct proc {
    pid_t pid;
    int status;                 /* from waitpid; TIMED_OUT if killed by us */
    char out[OUTPUT_CAP];
    char err[OUTPUT_CAP];
};

#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define ENV(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define NO_ENV ENV(NULL)

/* Sets "KEY=value" in env[], replacing an entry with the same key. */
static void env_put(char **env, int *n, char *entry)
{
    size_t klen = strcspn(entry, "=") + 1;
    for (int i = 0; i < *n; i++) {
        if (strncmp(env[i], entry, klen) == 0) {
            free(env[i]);
            env[i] = entry;
            return;
        }
    }
    cr_assert_lt(*n, MAX_ENV - 1, "too many environment entries");
    env[(*n)++] = entry;
    env[*n] = NULL;
}

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...)
{
    char *s;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    cr_assert_geq(n, 0, "out of memory");
    return s;
}

/* The probe's whole environment: the stand-in driver on the library path,
 * ipccache preloaded, the sanitizers' options passed on, then extra[]
 * ("LD_PRELOAD=" in extra[] runs without the preload). */
static void build_env(char **env, const char *const *extra)
{
    static const char *const passed_on[] = { "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS" };
    const char *prefix = getenv("IPCC_TEST_PRELOAD_PREFIX");
    int n = 0;
    env[0] = NULL;
    env_put(env, &n, format("PATH=/usr/bin:/bin"));
    env_put(env, &n, format("LD_LIBRARY_PATH=%s/tests", build_dir));
    env_put(env, &n, format("XDG_RUNTIME_DIR=%s", tmpdir)); /* the per-user folder: private */
    env_put(env, &n, format("LD_PRELOAD=%s%s%s/libipccache.so", prefix && *prefix ? prefix : "",
                            prefix && *prefix ? ":" : "", build_dir));
    for (size_t i = 0; i < sizeof(passed_on) / sizeof(passed_on[0]); i++)
        if (getenv(passed_on[i]))
            env_put(env, &n, format("%s=%s", passed_on[i], getenv(passed_on[i])));
    for (; *extra; extra++)
        env_put(env, &n, format("%s", *extra));
}

static void free_env(char **env)
{
    for (; *env; env++)
        free(*env);
}

/* In the child, between fork and exec: async-signal-safe calls only. */
static void exec_child(const char *const *argv, char **env, int out_fd, int err_fd)
{
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
        _exit(126);
    execve(argv[0], (char *const *)argv, env);
    _exit(127);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Reads both pipes until both close or the time limit passes; returns 0 on
 * time-out. Reading both at once keeps a chatty child from blocking. */
static int drain(int fds[2], char *bufs[2])
{
    size_t len[2] = { 0, 0 };
    long long deadline = now_ms() + RUN_LIMIT_S * 1000LL;
    while (fds[0] >= 0 || fds[1] >= 0) {
        struct pollfd pfd[2] = { { fds[0], POLLIN, 0 }, { fds[1], POLLIN, 0 } };
        long long left = deadline - now_ms();
        if (left <= 0 || poll(pfd, 2, (int)left) == 0)
            return 0;
        for (int i = 0; i < 2; i++) {
            if (fds[i] < 0 || !pfd[i].revents)
                continue;
            char scratch[4096];
            size_t room = OUTPUT_CAP - 1 - len[i];
            char *dst = room ? bufs[i] + len[i] : scratch; /* past the cap: discard */
            ssize_t r = read(fds[i], dst, room ? room : sizeof(scratch));
            if (r > 0 && room) {
                len[i] += (size_t)r;
                bufs[i][len[i]] = '\0';
            } else if (r == 0 || (r < 0 && errno != EINTR)) {
                close(fds[i]);
                fds[i] = -1;
            }
        }
    }
    return 1;
}

/* Runs argv[0] (a path) with the controlled environment plus extra[];
 * collects its output and status. Never waits past RUN_LIMIT_S. */
static void run(struct proc *p, const char *const *argv, const char *const *extra)
{
    char *env[MAX_ENV];
    int out[2], err[2];
    build_env(env, extra);
    cr_assert_eq(pipe2(out, O_CLOEXEC), 0, "pipe: %s", strerror(errno));
    cr_assert_eq(pipe2(err, O_CLOEXEC), 0, "pipe: %s", strerror(errno));
    p->out[0] = p->err[0] = '\0';
    p->pid = fork();
    cr_assert_geq(p->pid, 0, "fork: %s", strerror(errno));
    if (p->pid == 0)
        exec_child(argv, env, out[1], err[1]);
    close(out[1]);
    close(err[1]);
    free_env(env);
    int fds[2] = { out[0], err[0] };
    char *bufs[2] = { p->out, p->err };
    int finished = drain(fds, bufs);
    if (!finished) {
        kill(p->pid, SIGKILL);
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0)
                close(fds[i]);
    }
    waitpid(p->pid, &p->status, 0);
    if (!finished)
        p->status = TIMED_OUT;
}

/* Runs the probe: probe(&p, ENV(...), "scenario", args...). */
#define probe(p, extra, ...) run_probe(p, extra, ARGS(__VA_ARGS__))

static void run_probe(struct proc *p, const char *const *extra, const char *const *args)
{
    const char *argv[8];
    int n = 0;
    argv[n++] = format("%s/tests/probe", build_dir);
    for (; *args && n < 7; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    run(p, argv, extra);
    free((char *)argv[0]);
}

/* Exit status; 128 + N for a death by signal N; TIMED_OUT. */
static int exit_code(const struct proc *p)
{
    if (p->status == TIMED_OUT)
        return TIMED_OUT;
    return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status);
}

/* ---- reading what came back ---------------------------------------------- */

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* The value in the line "key=value" of the probe's stdout, or NULL. */
static const char *find_key(const char *out, const char *key)
{
    size_t klen = strlen(key);
    const char *line = out;
    while (*line) {
        if (strncmp(line, key, klen) == 0 && line[klen] == '=')
            return line + klen + 1;
        const char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return NULL;
}

/* The value of key in the probe's stdout; the test stops, showing the
 * output, if the probe did not print it. */
static const char *value_of(const struct proc *p, const char *key)
{
    const char *v = find_key(p->out, key);
    if (!v)
        cr_fatal("probe printed no %s=\nstdout:\n%s\nstderr:\n%s", key, p->out, p->err);
    return v;
}

static long long kv(const struct proc *p, const char *key)
{
    return strtoll(value_of(p, key), NULL, 10);
}

/* A word the probe printed (up to the end of the line), in buf. */
static const char *kv_str(const struct proc *p, const char *key, char *buf, size_t cap)
{
    const char *v = value_of(p, key);
    snprintf(buf, cap, "%.*s", (int)strcspn(v, "\n"), v);
    return buf;
}

/* The value of "key": in a JSON line, as the stats line writes numbers. */
static unsigned long long json_u64(const char *line, const char *key)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), "\"%s\":", key);
    const char *at = strstr(line, pattern);
    if (!at)
        cr_fatal("no %s in the stats line: %s", pattern, line);
    return strtoull(at + strlen(pattern), NULL, 10);
}

/* The whole file into buf (NUL-terminated); -1 if it cannot be read. */
static ssize_t read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    ssize_t r;
    while (len < cap - 1 && (r = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)r;
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* ---- checks shared by several tests ------------------------------------- */

/* Criterion's str tag wants char *; it only reads the strings. */
#define STR(s) ((char *)(s))

/* Exited 0 and ipccache (and the probe) said nothing. */
static void expect_quiet_success(const struct proc *p)
{
    cr_assert(eq(int, exit_code(p), 0), "stdout:\n%s\nstderr:\n%s", p->out, p->err);
    cr_assert(eq(str, STR(p->err), ""));
}

static void expect_kv(const struct proc *p, const char *key, long long want)
{
    cr_assert(eq(llong, kv(p, key), want), "%s; stdout:\n%s\nstderr:\n%s", key, p->out, p->err);
}

/* The same, for a run made with `setting`, which the message names. */
static void expect_kv_with(const struct proc *p, const char *setting, const char *key,
                           long long want)
{
    cr_expect(eq(llong, kv(p, key), want), "%s with %s", key, setting);
}

static void expect_kv_str(const struct proc *p, const char *key, const char *want)
{
    char buf[64];
    cr_assert(eq(str, STR(kv_str(p, key, buf, sizeof(buf))), STR(want)), "%s", key);
}

/* The one stats line a file must hold, with the counters of an openclose
 * run of n: one real open, every other open a hit. */
static void expect_stats_file(const char *path, unsigned long long n)
{
    char line[8192];
    cr_assert_geq(read_file(path, line, sizeof(line)), 0, "no stats file %s", path);
    cr_assert(eq(int, count_lines(line), 1), "%s holds:\n%s", path, line);
    cr_assert(eq(int, line[0], '{'), "%s", line);
    cr_assert(eq(ullong, json_u64(line, "opens"), n));
    cr_assert(eq(ullong, json_u64(line, "hits"), n - 1));
    cr_assert(eq(ullong, json_u64(line, "misses"), 1));
    cr_assert(eq(ullong, json_u64(line, "real_opens"), 1));
}

/* ---- the preload itself -------------------------------------------------- */

Test(process, unrelated_program_is_untouched, .timeout = 20)
{
    /* A program that never touches CUDA runs exactly as without the preload. */
    struct proc p;
    run(&p, ARGS("/bin/echo", "hi"), NO_ENV);
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(str, p.out, "hi\n"));
    cr_assert(eq(str, p.err, ""));
}

Test(process, sanitizer_runtime_starts_under_the_preload, .timeout = 20)
{
    /* A ThreadSanitizer program, whose runtime calls dlsym before it can serve pthread calls, runs normally. */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/tests/hello_tsan", build_dir);
    if (getenv("IPCC_TEST_PRELOAD_PREFIX") || access(path, X_OK) != 0)
        cr_skip_test("needs the plain library and build/tests/hello_tsan");
    struct proc p;
    run(&p, ARGS(path), NO_ENV);
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(str, p.out, "hello\n"));
}

Test(process, ctypes_lookup_gets_the_hook, .timeout = 20)
{
    /* Python's ctypes (Numba's way to the driver) dlsyms the IPC open and gets ipccache's wrapper. */
    static const char script[] =
        "import ctypes\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [('fname', ctypes.c_char_p), ('fbase', ctypes.c_void_p),\n"
        "                ('sname', ctypes.c_char_p), ('saddr', ctypes.c_void_p)]\n"
        "f = ctypes.CDLL('libcuda.so.1').cuIpcOpenMemHandle_v2\n"
        "info = Info()\n"
        "ctypes.CDLL(None).dladdr(ctypes.cast(f, ctypes.c_void_p), ctypes.byref(info))\n"
        "print(info.fname.decode().rsplit('/', 1)[-1])\n";
    if (access("/usr/bin/python3", X_OK) != 0)
        cr_skip_test("needs /usr/bin/python3");
    struct proc p;
    run(&p, ARGS("/usr/bin/python3", "-c", script), NO_ENV);
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(str, p.out, "libipccache.so\n"));
}

Test(process, cuda_without_ipc_leaves_no_trace, .timeout = 20)
{
    /* A CUDA program that never opens an IPC handle gets no message and no signal handler. */
    struct proc p;
    probe(&p, NO_ENV, "noipc");
    expect_quiet_success(&p);
    expect_kv_str(&p, "sigusr1", "default");
    expect_kv_str(&p, "sigusr2", "default");
    char userdir[PATH_MAX];
    cr_assert_neq(access(tmp_path(userdir, sizeof(userdir), "ipccache"), F_OK), 0,
                  "%s was created", userdir);
}

Test(process, cudart_lookups_get_the_hooks, .timeout = 20)
{
    /* dlsym and cuGetProcAddress hand out ipccache's wrappers for the hooked names only. */
    struct proc p;
    probe(&p, NO_ENV, "cudart_sequence");
    expect_quiet_success(&p);
    expect_kv(&p, "resolver_is_hooked", 1);
    expect_kv(&p, "open_is_hooked", 1);
    expect_kv(&p, "open_v1_is_hooked", 1);
    expect_kv(&p, "close_is_hooked", 1);
    expect_kv(&p, "ctx_destroy_is_hooked", 1);
    expect_kv(&p, "dlsym_open_is_hooked", 1);
    expect_kv(&p, "init_is_hooked", 0);
    expect_kv(&p, "dlsym_init_is_hooked", 0);
}

Test(process, disabled_lookups_get_the_driver, .timeout = 20)
{
    /* With IPCCACHE_DISABLE=1 every lookup answers the driver's own function. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_DISABLE=1"), "cudart_sequence");
    expect_quiet_success(&p);
    expect_kv(&p, "resolver_is_hooked", 0);
    expect_kv(&p, "open_is_hooked", 0);
    expect_kv(&p, "dlsym_open_is_hooked", 0);
}

/* ---- the cache ----------------------------------------------------------- */

Test(process, repeated_open_maps_once_and_unmaps_at_exit, .timeout = 20)
{
    /* 100 open/close pairs of one handle cost one real map, undone by the exit handler. */
    char counters[PATH_MAX], env[PATH_MAX + 32], line[512];
    snprintf(env, sizeof(env), "FAKECUDA_COUNTERS_AT_EXIT=%s",
             tmp_path(counters, sizeof(counters), "counters"));
    struct proc p;
    probe(&p, ENV(env), "openclose", "100");
    expect_quiet_success(&p);
    expect_kv(&p, "hits_ptr_same", 1);
    expect_kv(&p, "maps", 1);
    expect_kv(&p, "open_calls", 1);
    expect_kv(&p, "refcount", 1);   /* kept, idle */
    expect_kv_str(&p, "sigusr1", "handler");

    cr_assert_geq(read_file(counters, line, sizeof(line)), 0, "no %s", counters);
    cr_assert_not_null(strstr(line, "maps=1 unmaps=1 "), "at exit: %s", line);
    cr_assert_not_null(strstr(line, " live=0"), "at exit: %s", line);
}

Test(process, disabled_says_so_once_when_asked, .timeout = 20)
{
    /* IPCCACHE_DISABLE with IPCCACHE_LOG=info or debug: one line confirms it, whether the
     * program reaches the driver through the resolver (cudart) or opens by linked symbols. */
    static const char *const how[][2] = { { "cudart_sequence", NULL }, { "openclose", "5" } };
    for (size_t i = 0; i < 2; i++) {
        struct proc p;
        probe(&p, ENV("IPCCACHE_DISABLE=1", "IPCCACHE_LOG=debug"), how[i][0], how[i][1]);
        cr_expect(eq(int, exit_code(&p), 0), "%s", how[i][0]);
        cr_expect(eq(str, p.err, "ipccache: disabled by IPCCACHE_DISABLE; every call goes to the"
                                 " driver\n"), "%s", how[i][0]);
    }
}

Test(process, disabled_passes_every_call_through, .timeout = 20)
{
    /* IPCCACHE_DISABLE=1: every open is a real map, and no handler is installed. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_DISABLE=1"), "openclose", "100");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 100);
    expect_kv(&p, "unmaps", 100);
    expect_kv(&p, "refcount", 0);
    expect_kv_str(&p, "sigusr1", "default");
}

Test(process, idle_caps_below_one_mapping_close_at_once, .timeout = 20)
{
    /* A cap that one idle 1 MiB mapping exceeds keeps nothing idle: each close is a real unmap. */
    static const char *const caps[] = { "IPCCACHE_MAX_IDLE_ENTRIES=0", "IPCCACHE_MAX_IDLE_BYTES=1K" };
    for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
        struct proc p;
        probe(&p, ENV(caps[i]), "openclose", "10");
        expect_quiet_success(&p);
        expect_kv_with(&p, caps[i], "maps", 10);
        expect_kv_with(&p, caps[i], "unmaps", 10);
        expect_kv_with(&p, caps[i], "refcount", 0);
    }
}

Test(process, threads_share_one_mapping_per_handle, .timeout = 20)
{
    /* Eight threads opening four handles 2000 times each: four real maps, one pointer each. */
    struct proc p;
    probe(&p, NO_ENV, "threads", "8");
    expect_quiet_success(&p);
    expect_kv(&p, "errors", 0);
    expect_kv(&p, "ptr_mismatches", 0);
    expect_kv(&p, "maps", 4);
    expect_kv(&p, "unmaps", 0);
}

/* Runs the errors scenario on the driver flavour `driver` (a FAKECUDA_*
 * setting), with and without the preload: each code must be the driver's. */
static void expect_errors_as_driver_alone(const char *driver)
{
    static const struct { const char *key; long long code; } cases[] = {
        { "double_close", 1 }, { "unknown_ptr", 1 }, { "zero_handle", 1 },
        { "flags0_cached", 1 }, { "null_pdptr", 1 }, { "no_ctx_open", 201 },
        { "no_ctx_close", 201 }, { "own_export", 201 }, { "destroyed_ctx_close", 1 },
        { "reopen_after_destroy", 0 }, { "reopen_maps_delta", 1 },
    };
    struct proc with, without;
    probe(&with, ENV(driver), "errors");
    probe(&without, ENV(driver, "LD_PRELOAD="), "errors");
    expect_quiet_success(&with);
    expect_quiet_success(&without);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *key = cases[i].key;
        cr_expect(eq(llong, kv(&with, key), kv(&without, key)),
                  "%s with %s: preloaded vs driver alone", key, driver);
        cr_expect(eq(llong, kv(&with, key), cases[i].code), "%s with %s", key, driver);
    }
}

Test(process, errors_match_the_driver_alone, .timeout = 20)
{
    /* Every error case returns the code the driver returns without the preload. */
    expect_errors_as_driver_alone("FAKECUDA_DRIVER_VERSION=13000");
}

Test(process, no_context_ids_pass_every_call_through, .timeout = 20)
{
    /* A driver without cuCtxGetId (before 12.0): every open and close reaches it, and ipccache says so once, at info level. */
    struct proc p;
    probe(&p, ENV("FAKECUDA_NO_CTXGETID=1", "IPCCACHE_LOG=info"), "openclose", "100");
    cr_assert(eq(int, exit_code(&p), 0), "stdout:\n%s\nstderr:\n%s", p.out, p.err);
    expect_kv(&p, "open_calls", 100);
    expect_kv(&p, "close_calls", 100);
    expect_kv(&p, "maps", 100);
    expect_kv(&p, "unmaps", 100);
    expect_kv(&p, "refcount", 0);
    static const char said[] = "ipccache: the driver has no cuCtxGetId";
    const char *at = strstr(p.err, said);
    cr_assert_not_null(at, "stderr:\n%s", p.err);
    cr_assert_null(strstr(at + strlen(said), said), "said twice:\n%s", p.err);
}

Test(process, no_context_ids_without_info_say_nothing, .timeout = 20)
{
    /* The same at the default log level: quiet. */
    struct proc p;
    probe(&p, ENV("FAKECUDA_NO_CTXGETID=1"), "openclose", "10");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 10);
}

/* Runs the mixed scenario with `preload` (a LD_PRELOAD= entry, or NULL for
 * the default); the stand-in's counters at exit go to *counters. */
static void run_mixed(struct proc *p, const char *preload, const char *name, char *counters,
                      size_t cap)
{
    char env[PATH_MAX + 32];
    snprintf(env, sizeof(env), "FAKECUDA_COUNTERS_AT_EXIT=%s", tmp_path(counters, cap, name));
    if (preload)
        probe(p, ENV(env, preload), "mixed");
    else
        probe(p, ENV(env), "mixed");
    expect_quiet_success(p);
}

Test(process, mixed_paths_match_the_driver_alone, .timeout = 20)
{
    /* Opens through the cache and past it, two exports of one allocation: every code, every pointer and what is mapped at exit as without the preload. */
    static struct proc with, without;
    char cw[PATH_MAX], cwo[PATH_MAX], lw[512], lwo[512];
    run_mixed(&with, NULL, "with", cw, sizeof(cw));
    run_mixed(&without, "LD_PRELOAD=", "without", cwo, sizeof(cwo));
    int compared = 0;
    for (const char *line = without.out; *line; line = strchr(line, '\n') + 1) {
        char key[64];
        if (sscanf(line, "%63[^=]=", key) == 1 && strcmp(key, "pid") != 0) {
            cr_expect(eq(llong, kv(&with, key), kv(&without, key)), "%s", key);
            compared++;
        }
        if (!strchr(line, '\n'))
            break;
    }
    cr_assert_geq(compared, 17);
    cr_assert_geq(read_file(cw, lw, sizeof(lw)), 0, "no %s", cw);
    cr_assert_geq(read_file(cwo, lwo, sizeof(lwo)), 0, "no %s", cwo);
    cr_assert_not_null(strstr(lwo, " live=1"), "without: %s", lwo);
    cr_assert_not_null(strstr(lw, " live=1"), "with: %s (without: %s)", lw, lwo);
}

Test(process, fork_child_starts_with_an_empty_table, .timeout = 20)
{
    /* A child forked while another thread uses the cache maps for itself and exits cleanly. */
    struct proc p;
    probe(&p, NO_ENV, "fork");
    expect_quiet_success(&p);
    expect_kv(&p, "child_exit", 0);
    expect_kv(&p, "child_open_rc", 0);
    expect_kv(&p, "child_open_calls_delta", 1);   /* a real open, not a parent's entry */
    expect_kv(&p, "child_close_rc", 0);
    expect_kv(&p, "spin_errors", 0);
}

Test(process, fork_begun_before_start_gets_a_usable_lock, .timeout = 30)
{
    /* A fork begun before the first IPC call, copying the process while a later fork prepares: its child's IPC calls still work. */
    struct proc p;
    probe(&p, NO_ENV, "fork_at_start");
    expect_quiet_success(&p);
    expect_kv(&p, "early_child_exit", 0);
    expect_kv(&p, "late_child_exit", 0);
}

/* Runs "window WHAT" with tests/process/window_lib.c preloaded ahead of ipccache,
 * widening the moment WHAT names. Not under the sanitizer: its runtime
 * intercepts the same calls first and starts before the window can. */
static void run_window(struct proc *p, const char *what)
{
    if (getenv("IPCC_TEST_PRELOAD_PREFIX"))
        cr_skip_test("the sanitizer's runtime intercepts the calls the window widens");
    char *preload = format("LD_PRELOAD=%s/tests/libwindow.so:%s/libipccache.so", build_dir,
                           build_dir);
    char *mode = format("IPCC_TEST_WINDOW=%s", what);
    probe(p, ENV(preload, mode), "window", what);
    free(preload);
    free(mode);
}

Test(process, fork_while_registering_exit_handlers_gives_a_live_child, .timeout = 30)
{
    /* A fork while another thread's first IPC call registers ipccache's exit handlers (glibc's lock of them held, widened): the child opens, closes and exits. */
    struct proc p;
    run_window(&p, "atexit");
    expect_quiet_success(&p);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "child_exit", 0);
}

Test(process, fork_while_checking_the_load_order_gives_a_live_child, .timeout = 30)
{
    /* A fork while another thread's lookup of a hooked name walks the loaded objects (the loader's list lock held, widened): the child looks up, opens and exits. */
    struct proc p;
    run_window(&p, "phdr");
    expect_quiet_success(&p);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "child_exit", 0);
}

Test(process, stats_signal_while_installing_reaches_the_programs_handler, .timeout = 20)
{
    /* The stats signal arriving after ipccache's handler is live but before sigaction handed back the program's: the program's handler still runs. */
    struct proc p;
    run_window(&p, "sigaction");
    cr_assert(eq(int, exit_code(&p), 0), "stdout:\n%s\nstderr:\n%s", p.out, p.err);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "app_signals", 1);
}

Test(process, driver_gone_after_exit_handler_is_quiet, .timeout = 20)
{
    /* The driver torn down at exit after ipccache's handler: exit 0, nothing said. */
    struct proc p;
    probe(&p, ENV("FAKECUDA_DEINIT_AT_EXIT=1"), "exitdeinit");
    expect_quiet_success(&p);
}

Test(process, driver_gone_before_exit_handler_is_quiet, .timeout = 20)
{
    /* The driver already down when ipccache's exit handler closes: exit 0, nothing said. */
    struct proc p;
    probe(&p, NO_ENV, "exitdeinit", "now");
    expect_quiet_success(&p);
}

Test(process, exit_from_a_signal_handler_ends_the_process, .timeout = 60)
{
    /* exit() from a handler that interrupted an open or close, often inside the table lock, ends the process every time. */
    for (int i = 0; i < 20; i++) {
        struct proc p;
        probe(&p, NO_ENV, "exitsignal");
        cr_assert(eq(int, exit_code(&p), 0), "run %d %s; stdout:\n%s\nstderr:\n%s", i + 1,
                  exit_code(&p) == TIMED_OUT ? "hung at exit" : "failed", p.out, p.err);
        cr_assert(eq(str, p.out, "looping\n"));
        cr_assert(eq(str, p.err, ""));
    }
}

Test(process, driver_dlclosed_before_exit_stays_callable, .timeout = 20)
{
    /* A program that dlcloses the driver it loaded privately exits cleanly, and the idle mapping is still closed at exit. */
    char counters[PATH_MAX], env[PATH_MAX + 32], line[512];
    snprintf(env, sizeof(env), "FAKECUDA_COUNTERS_AT_EXIT=%s",
             tmp_path(counters, sizeof(counters), "counters"));
    struct proc p;
    probe(&p, ENV(env), "dlclose");
    expect_quiet_success(&p);
    expect_kv(&p, "refcount", 1);   /* idle in the cache when the driver was closed */
    expect_kv(&p, "dlclose_rc", 0);
    cr_assert_geq(read_file(counters, line, sizeof(line)), 0, "no %s", counters);
    cr_assert(eq(int, count_lines(line), 1), "the driver's destructor ran early:\n%s", line);
    cr_assert_not_null(strstr(line, "maps=1 unmaps=1 "), "at exit: %s", line);
    cr_assert_not_null(strstr(line, " live=0"), "at exit: %s", line);
}

/* ---- another interposer of the same calls --------------------------------- */

/* Runs "interposed 10" with ipccache and tests/<other> preloaded, ipccache
 * first or second (after the sanitizer runtime, if any); the program looks
 * the IPC calls up through the resolver when the interposer hooks that. */
static void run_interposed(struct proc *p, const char *other, int ipccache_first)
{
    const char *path = strstr(other, "resolver") ? "resolver" : "linked";
    const char *prefix = getenv("IPCC_TEST_PRELOAD_PREFIX");
    char self[PATH_MAX + 32], them[PATH_MAX + 64];
    snprintf(self, sizeof(self), "%s/libipccache.so", build_dir);
    snprintf(them, sizeof(them), "%s/tests/%s", build_dir, other);
    char *preload = format("LD_PRELOAD=%s%s%s:%s", prefix && *prefix ? prefix : "",
                           prefix && *prefix ? ":" : "", ipccache_first ? self : them,
                           ipccache_first ? them : self);
    probe(p, ENV(preload), "interposed", "10", path);
    free(preload);
}

/* The interposers that find their next function by RTLD_NEXT, through the
 * driver's handle and through the linked resolver, and the one that hooks
 * the resolver. */
static const char *const interposers[] = {
    "libinterposer_next.so", "libinterposer_handle.so", "libinterposer_getproc.so",
    "libinterposer_resolver.so",
};

/* Runs every interposer in the given order; the program's open is ours or
 * the interposer's, which sees `calls` opens and as many closes of the
 * program's ten (the driver: one open, one mapping, kept idle). */
static void expect_interposed(int ipccache_first, long long calls)
{
    for (size_t i = 0; i < sizeof(interposers) / sizeof(interposers[0]); i++) {
        const char *name = interposers[i];
        struct proc p;
        run_interposed(&p, name, ipccache_first);
        cr_assert(eq(int, exit_code(&p), 0), "%s; stdout:\n%s\nstderr:\n%s", name, p.out, p.err);
        cr_assert(eq(str, p.err, ""), "%s", name);
        expect_kv_with(&p, name, "interposer_reentries", 0);
        expect_kv_with(&p, name, "open_is_hooked", ipccache_first);
        expect_kv_with(&p, name, "interposer_opens", calls);
        expect_kv_with(&p, name, "interposer_closes", ipccache_first ? 0 : calls);
        expect_kv_with(&p, name, "open_calls", 1);
        expect_kv_with(&p, name, "maps", 1);
        expect_kv_with(&p, name, "refcount", 1);
    }
}

Test(process, interposer_after_ipccache_gets_the_driver, .timeout = 20)
{
    /* Preloaded after ipccache, another interposer's lookups of its next function find the driver: no loop, and it sees only the cache's one miss. */
    expect_interposed(1, 1);
}

Test(process, interposer_before_ipccache_gets_the_cache, .timeout = 20)
{
    /* Preloaded before ipccache, another interposer sees every call and its next function is ipccache's: ten opens, one real map. */
    expect_interposed(0, 10);
}

/* ---- settings ------------------------------------------------------------ */

static const char *const bad_settings[] = {
    "IPCCACHE_DISABLE=maybe",       "IPCCACHE_MAX_IDLE_BYTES=12Q",
    "IPCCACHE_MAX_IDLE_ENTRIES=-1", "IPCCACHE_LOG=loud",
    "IPCCACHE_STATS_SIGNAL=SIGFOO", "IPCCACHE_STATS_AT_EXIT=2",
    "IPCCACHE_STATS_FILE=/tmp/x%q", "IPCCACHE_STATS_DIR=relative",
};
#define N_BAD_SETTINGS (sizeof(bad_settings) / sizeof(bad_settings[0]))
/* What each warning must say it uses instead, in bad_settings' order. */
static const char *const bad_setting_defaults[N_BAD_SETTINGS] = {
    "(0)", "(8G)", "(256)", "(warn)", "(SIGUSR1)", "(0)", "(unset)", "(unset)",
};

/* "IPCCACHE_X=v" -> "prefix IPCCACHE_X=\"v\"", what the message must start with. */
static void expected_message(char *buf, size_t cap, const char *prefix, const char *setting)
{
    int klen = (int)strcspn(setting, "=");
    snprintf(buf, cap, "%s%.*s=\"%s\"", prefix, klen, setting, setting + klen + 1);
}

Test(process, bad_value_warns_once_and_keeps_the_default, .timeout = 20)
{
    /* Each setting with a bad value: one warning naming it, then the default behaviour. */
    for (size_t i = 0; i < N_BAD_SETTINGS; i++) {
        char want[256];
        struct proc p;
        probe(&p, ENV(bad_settings[i]), "openclose", "5");
        expected_message(want, sizeof(want), "ipccache: warning: ", bad_settings[i]);
        cr_expect(eq(int, exit_code(&p), 0), "%s", bad_settings[i]);
        cr_expect(eq(int, count_lines(p.err), 1), "%s; stderr:\n%s", bad_settings[i], p.err);
        cr_expect(eq(int, strncmp(p.err, want, strlen(want)), 0), "want \"%s...\", got: %s",
                  want, p.err);
        char says[64];
        snprintf(says, sizeof(says), "using the default %s\n", bad_setting_defaults[i]);
        cr_expect_not_null(strstr(p.err, says), "want \"%s\" in: %s", says, p.err);
        char word[16];
        expect_kv_with(&p, bad_settings[i], "maps", 1);
        expect_kv_with(&p, bad_settings[i], "refcount", 1);
        cr_expect(eq(str, STR(kv_str(&p, "sigusr1", word, sizeof(word))), "handler"),
                  "sigusr1 with %s", bad_settings[i]);
    }
}

Test(process, misspelled_setting_warns_once_naming_the_setting, .timeout = 20)
{
    /* An IPCCACHE_* name the library does not know is one warning that names the closest
     * setting; the tools' own variable (IPCCACHE_LIB) is not one. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_MAX_IDLE_BYTE=1G", "IPCCACHE_LIB=/nowhere"), "openclose", "5");
    cr_expect(eq(int, exit_code(&p), 0));
    cr_expect(eq(int, count_lines(p.err), 1), "stderr:\n%s", p.err);
    cr_expect(eq(str, p.err, "ipccache: warning: IPCCACHE_MAX_IDLE_BYTE is not a setting"
                             " (did you mean IPCCACHE_MAX_IDLE_BYTES?); ignored\n"));
    expect_kv(&p, "maps", 1);
}

Test(process, misspelled_setting_under_strict_stops, .timeout = 20)
{
    /* IPCCACHE_STRICT: a setting the operator did not mean stops the process, as a bad value does. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_STRICT=1", "IPCCACHE_DISABEL=1"), "openclose", "5");
    cr_expect(eq(int, exit_code(&p), 78));
    cr_expect_not_null(strstr(p.err, "ipccache: error: IPCCACHE_DISABEL is not a setting"
                                     " (did you mean IPCCACHE_DISABLE?)"), "%s", p.err);
}

Test(process, log_error_silences_the_warnings, .timeout = 20)
{
    /* IPCCACHE_LOG=error is read first, so a bad value in another setting is not reported. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_LOG=error", "IPCCACHE_MAX_IDLE_BYTES=12Q"), "openclose", "5");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 1);
}

Test(process, strict_with_good_values_runs_normally, .timeout = 20)
{
    /* IPCCACHE_STRICT=1 with only valid settings changes nothing. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_STRICT=1", "IPCCACHE_MAX_IDLE_BYTES=512M", "IPCCACHE_LOG=warn",
                  "IPCCACHE_STATS_SIGNAL=SIGUSR2"), "openclose", "5");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 1);
    expect_kv_str(&p, "sigusr2", "handler");
}

Test(process, strict_turns_a_bad_value_into_exit_78, .timeout = 20)
{
    /* IPCCACHE_STRICT=1: a bad value is an error line and exit status 78 (EX_CONFIG). */
    for (size_t i = 0; i < N_BAD_SETTINGS; i++) {
        char want[256];
        struct proc p;
        probe(&p, ENV("IPCCACHE_STRICT=1", bad_settings[i]), "openclose", "5");
        expected_message(want, sizeof(want), "ipccache: error: ", bad_settings[i]);
        cr_expect(eq(int, exit_code(&p), 78), "%s; stderr:\n%s", bad_settings[i], p.err);
        cr_expect(eq(int, count_lines(p.err), 1), "%s; stderr:\n%s", bad_settings[i], p.err);
        cr_expect(eq(int, strncmp(p.err, want, strlen(want)), 0), "want \"%s...\", got: %s",
                  want, p.err);
    }
}

Test(process, log_info_prints_one_startup_line, .timeout = 20)
{
    /* IPCCACHE_LOG=info: exactly one line, the start-up banner. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_LOG=info"), "openclose", "5");
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(int, count_lines(p.err), 1), "stderr:\n%s", p.err);
    cr_assert(eq(int, strncmp(p.err, "ipccache: version ", 18), 0), "%s", p.err);
    cr_assert_not_null(strstr(p.err, " active: "), "%s", p.err);
}

/* ---- statistics ---------------------------------------------------------- */

Test(process, stats_at_exit_go_to_the_pid_file, .timeout = 20)
{
    /* IPCCACHE_STATS_AT_EXIT=1 with a %p file: one JSON line in this process's file. */
    char pattern[PATH_MAX], env[PATH_MAX + 32], path[PATH_MAX + 32];
    snprintf(env, sizeof(env), "IPCCACHE_STATS_FILE=%s", tmp_path(pattern, sizeof(pattern), "s.%p"));
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_AT_EXIT=1", env), "openclose", "10");
    expect_quiet_success(&p);
    snprintf(path, sizeof(path), "%s/s.%lld", tmpdir, kv(&p, "pid"));
    expect_stats_file(path, 10);
}

Test(process, stats_signal_writes_the_stats_file, .timeout = 20)
{
    /* SIGUSR1 makes the process append its stats line to IPCCACHE_STATS_FILE. */
    char pattern[PATH_MAX], env[PATH_MAX + 32], path[PATH_MAX + 32];
    snprintf(env, sizeof(env), "IPCCACHE_STATS_FILE=%s", tmp_path(pattern, sizeof(pattern), "sig.%p"));
    struct proc p;
    probe(&p, ENV(env), "signal");
    expect_quiet_success(&p);
    expect_kv(&p, "raised", SIGUSR1);
    snprintf(path, sizeof(path), "%s/sig.%lld", tmpdir, kv(&p, "pid"));
    expect_stats_file(path, 3);
}

Test(process, stats_signal_can_be_usr2, .timeout = 20)
{
    /* IPCCACHE_STATS_SIGNAL=USR2 handles SIGUSR2 and leaves SIGUSR1 alone. */
    char env[PATH_MAX + 32], path[PATH_MAX], signo[16];
    snprintf(env, sizeof(env), "IPCCACHE_STATS_FILE=%s", tmp_path(path, sizeof(path), "usr2"));
    snprintf(signo, sizeof(signo), "%d", SIGUSR2);
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_SIGNAL=USR2", env), "signal", signo);
    expect_quiet_success(&p);
    expect_kv_str(&p, "sigusr2", "handler");
    expect_kv_str(&p, "sigusr1", "default");
    expect_stats_file(path, 3);
}

Test(process, stats_signal_zero_installs_no_handler, .timeout = 20)
{
    /* IPCCACHE_STATS_SIGNAL=0: the cache works, and no signal disposition changes. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_SIGNAL=0"), "openclose", "5");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 1);
    expect_kv_str(&p, "sigusr1", "default");
    expect_kv_str(&p, "sigusr2", "default");
}

Test(process, stats_go_to_an_existing_request_file, .timeout = 20)
{
    /* Without a stats file, <IPCCACHE_STATS_DIR>/ipccache-<pid>.stats receives the line if it exists. */
    char env[PATH_MAX + 32], path[PATH_MAX + 64];
    snprintf(env, sizeof(env), "IPCCACHE_STATS_DIR=%s", tmpdir);
    struct proc p;
    probe(&p, ENV(env), "signal_request");
    expect_quiet_success(&p);
    snprintf(path, sizeof(path), "%s/ipccache-%lld.stats", tmpdir, kv(&p, "pid"));
    expect_stats_file(path, 3);
}

Test(process, stats_go_to_stderr_without_a_file, .timeout = 20)
{
    /* No stats file and no request file: the line goes to stderr, and no file appears. */
    char env[PATH_MAX + 32], path[PATH_MAX + 64];
    snprintf(env, sizeof(env), "IPCCACHE_STATS_DIR=%s", tmpdir);
    struct proc p;
    probe(&p, ENV(env), "signal");
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(int, count_lines(p.err), 1), "stderr:\n%s", p.err);
    cr_assert(eq(int, strncmp(p.err, "{\"schema\":", 10), 0), "%s", p.err);
    cr_assert(eq(ullong, json_u64(p.err, "opens"), 3));
    snprintf(path, sizeof(path), "%s/ipccache-%lld.stats", tmpdir, kv(&p, "pid"));
    cr_assert_neq(access(path, F_OK), 0, "%s was created", path);
}

/* ---- the stats signal keeps the program's settings ----------------------- */

/* IPCCACHE_STATS_FILE=<tmpdir>/name, in a buffer of the caller's. */
static const char *stats_file_env(char *buf, size_t cap, const char *name)
{
    char path[PATH_MAX];
    snprintf(buf, cap, "IPCCACHE_STATS_FILE=%s", tmp_path(path, sizeof(path), name));
    return buf;
}

Test(process, stats_handler_keeps_the_programs_flags_and_mask, .timeout = 20)
{
    /* Over the program's own handler (no SA_RESTART, SA_ONSTACK, SIGUSR2 masked), ours keeps all three and chains. */
    char env[PATH_MAX + 32];
    struct proc p;
    probe(&p, ENV(stats_file_env(env, sizeof(env), "s.%p")), "signal_manners", "app");
    expect_quiet_success(&p);
    expect_kv(&p, "hooked", 1);
    expect_kv(&p, "restart", 0);
    expect_kv(&p, "onstack", 1);
    expect_kv(&p, "mask_usr2", 1);
    expect_kv(&p, "app_handler_called", 1);
}

Test(process, stats_handler_keeps_sa_restart_when_the_program_chose_it, .timeout = 20)
{
    /* Over the program's handler with SA_RESTART, ours restarts calls too: a read() is not cut short. */
    char env[PATH_MAX + 32];
    struct proc p;
    probe(&p, ENV(stats_file_env(env, sizeof(env), "s.%p")), "signal_manners", "app_restart");
    expect_quiet_success(&p);
    expect_kv(&p, "restart", 1);
    expect_kv(&p, "read_eintr", 0);
    expect_kv(&p, "app_handler_called", 1);
}

Test(process, stats_signal_still_interrupts_a_read, .timeout = 20)
{
    /* A read() the program expects SIGUSR1 to interrupt still returns EINTR, with or without a handler of its own. */
    char env[PATH_MAX + 32];
    const char *const kinds[] = { "app", "default" };
    for (int i = 0; i < 2; i++) {
        struct proc p;
        probe(&p, ENV(stats_file_env(env, sizeof(env), "s.%p")), "signal_manners", kinds[i]);
        cr_assert(eq(int, exit_code(&p), 0), "%s: stderr:\n%s", kinds[i], p.err);
        expect_kv_with(&p, kinds[i], "restart", 0);
        expect_kv_with(&p, kinds[i], "read_eintr", 1);
    }
}

Test(process, ignored_stats_signal_stays_ignored, .timeout = 20)
{
    /* A signal the program ignores stays ignored, and raising it does not kill the process. */
    struct proc p;
    probe(&p, NO_ENV, "signal_ignored");
    expect_quiet_success(&p);
    expect_kv_str(&p, "sigusr1", "ignore");
    expect_kv(&p, "survived", 1);
    char userdir[PATH_MAX], marker[PATH_MAX + 64];
    snprintf(marker, sizeof(marker), "%s/ipccache-%lld.marker",
             tmp_path(userdir, sizeof(userdir), "ipccache"), kv(&p, "pid"));
    cr_assert_neq(access(marker, F_OK), 0, "a marker without a handler: %s", marker);
}

Test(process, explicit_stats_signal_takes_an_ignored_one, .timeout = 20)
{
    /* IPCCACHE_STATS_SIGNAL set explicitly installs the handler even over SIG_IGN. */
    char env[PATH_MAX + 32], path[PATH_MAX + 32];
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_SIGNAL=USR1", stats_file_env(env, sizeof(env), "s.%p")),
          "signal_ignored");
    expect_quiet_success(&p);
    expect_kv_str(&p, "sigusr1", "handler");
    snprintf(path, sizeof(path), "%s/s.%lld", tmpdir, kv(&p, "pid"));
    expect_stats_file(path, 3);
}

/* ---- fork, the marker ---------------------------------------------------- */

Test(process, fork_child_stats_go_to_its_own_file, .timeout = 20)
{
    /* A fork child's stats line goes to the %p file of the child, not the parent's, and counts only its own calls; it has its own marker. */
    char env[PATH_MAX + 32], path[PATH_MAX + 32], line[8192];
    struct proc p;
    probe(&p, ENV(stats_file_env(env, sizeof(env), "s.%p")), "fork_stats");
    expect_quiet_success(&p);
    snprintf(path, sizeof(path), "%s/s.%lld", tmpdir, kv(&p, "child_pid"));
    cr_assert_geq(read_file(path, line, sizeof(line)), 0, "no stats file %s", path);
    cr_assert(eq(int, count_lines(line), 1), "%s holds:\n%s", path, line);
    cr_assert(eq(ullong, json_u64(line, "pid"), (unsigned long long)kv(&p, "child_pid")));
    cr_assert(eq(ullong, json_u64(line, "opens"), 0), "the child counts the parent's opens: %s", line);
    cr_assert(eq(ullong, json_u64(line, "misses"), 0), "%s", line);
    snprintf(path, sizeof(path), "%s/s.%lld", tmpdir, kv(&p, "pid"));
    cr_assert_neq(access(path, F_OK), 0, "the parent's file %s was written", path);
    expect_kv(&p, "parent_marker", 1);
    expect_kv(&p, "child_marker", 1);
    expect_kv(&p, "child_marker_after_exit", 0);
}

Test(process, marker_says_pid_start_signal_and_destination, .timeout = 20)
{
    /* The marker holds the pid, its start time, the signal, the library's base, the expanded stats file and the request folder; it goes at exit. */
    char env[PATH_MAX + 32], want[PATH_MAX + 32], buf[PATH_MAX + 32];
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_SIGNAL=USR2", stats_file_env(env, sizeof(env), "s.%p")),
          "marker");
    expect_quiet_success(&p);
    expect_kv_str(&p, "marker_header", "ipccache-marker 1");
    expect_kv(&p, "marker_pid", kv(&p, "pid"));
    expect_kv(&p, "marker_start", kv(&p, "start"));
    cr_assert_gt(kv(&p, "start"), 0);
    expect_kv(&p, "marker_signal", SIGUSR2);
    cr_assert_neq(kv(&p, "library_base"), 0);
    expect_kv(&p, "marker_base", kv(&p, "library_base"));
    snprintf(want, sizeof(want), "%s/s.%lld", tmpdir, kv(&p, "pid"));
    cr_assert(eq(str, STR(kv_str(&p, "marker_stats_file", buf, sizeof(buf))), want));
    snprintf(want, sizeof(want), "%s/ipccache", tmpdir);
    cr_assert(eq(str, STR(kv_str(&p, "marker_request_dir", buf, sizeof(buf))), want));
    snprintf(want, sizeof(want), "%s/ipccache/ipccache-%lld.marker", tmpdir, kv(&p, "pid"));
    cr_assert_neq(access(want, F_OK), 0, "%s left after exit", want);
}

/* ---- nothing another user plants is written to or blocks ----------------- */

/* The probe ran "signal" (3 opens) with its line refused by every file:
 * it finished, and the line went to stderr. */
static void expect_line_on_stderr(const struct proc *p)
{
    cr_assert(eq(int, exit_code(p), 0), "stdout:\n%s\nstderr:\n%s", p->out, p->err);
    const char *line = strstr(p->err, "{\"schema\":");
    cr_assert_not_null(line, "no stats line on stderr:\n%s", p->err);
    cr_assert(eq(ullong, json_u64(line, "opens"), 3));
}

Test(process, request_file_traps_are_refused, .timeout = 60)
{
    /* A FIFO, a symlink or another user's file in place of the request file: nothing blocks, nothing is written. */
    char env[PATH_MAX + 32];
    const char *const kinds[] = { "fifo", "symlink", "other" };
    snprintf(env, sizeof(env), "IPCCACHE_STATS_DIR=%s", tmpdir);
    for (int i = 0; i < 3; i++) {
        struct proc p;
        probe(&p, ENV(env), "signal_planted", kinds[i]);
        expect_line_on_stderr(&p);
        expect_kv_with(&p, kinds[i], "planted_bytes", 0);
    }
}

/* Size of a file; -1 if absent. */
static long long file_size(const char *path)
{
    char buf[8192];
    return read_file(path, buf, sizeof(buf));
}

Test(process, stats_file_traps_are_refused, .timeout = 60)
{
    /* IPCCACHE_STATS_FILE as a symlink, another user's file or a FIFO with a reader: nothing is written. */
    char env[PATH_MAX + 32], trap[PATH_MAX], victim[PATH_MAX];
    tmp_path(victim, sizeof(victim), "victim");
    close(open(victim, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    cr_assert_eq(symlink(victim, tmp_path(trap, sizeof(trap), "link")), 0);
    struct proc p;
    probe(&p, ENV(stats_file_env(env, sizeof(env), "link")), "signal");
    expect_line_on_stderr(&p);
    cr_assert(eq(llong, file_size(victim), 0), "written through the symlink");

    int fd = open(tmp_path(trap, sizeof(trap), "other"), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    cr_assert(fd >= 0 && fchmod(fd, 0666) == 0 && fchown(fd, 65534, 65534) == 0);
    close(fd);
    probe(&p, ENV(stats_file_env(env, sizeof(env), "other")), "signal");
    expect_line_on_stderr(&p);
    cr_assert(eq(llong, file_size(trap), 0), "written to another user's file");

    cr_assert_eq(mkfifo(tmp_path(trap, sizeof(trap), "fifo"), 0666), 0);
    fd = open(trap, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    probe(&p, ENV(stats_file_env(env, sizeof(env), "fifo")), "signal");
    expect_line_on_stderr(&p);
    char buf[64];
    cr_assert(eq(int, (int)read(fd, buf, sizeof(buf)), 0), "written to the FIFO");
    close(fd);
}

Test(process, fifo_without_reader_does_not_block, .timeout = 20)
{
    /* IPCCACHE_STATS_FILE a FIFO nobody reads: the signal and exit do not block. */
    char env[PATH_MAX + 32], fifo[PATH_MAX];
    cr_assert_eq(mkfifo(tmp_path(fifo, sizeof(fifo), "fifo"), 0600), 0);
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_AT_EXIT=1", stats_file_env(env, sizeof(env), "fifo")), "signal");
    expect_line_on_stderr(&p);
}

Test(process, stats_dir_writable_by_others_is_refused, .timeout = 20)
{
    /* IPCCACHE_STATS_DIR mode 0777: one warning, and the request file in it gets nothing. */
    char dir[PATH_MAX], env[PATH_MAX + 32], path[PATH_MAX + 64];
    cr_assert_eq(mkdir(tmp_path(dir, sizeof(dir), "open"), 0700), 0);
    cr_assert_eq(chmod(dir, 0777), 0);
    snprintf(env, sizeof(env), "IPCCACHE_STATS_DIR=%s", dir);
    struct proc p;
    probe(&p, ENV(env), "signal_request");
    expect_line_on_stderr(&p);
    cr_assert_not_null(strstr(p.err, "ipccache: warning: IPCCACHE_STATS_DIR="), "%s", p.err);
    snprintf(path, sizeof(path), "%s/ipccache-%lld.stats", dir, kv(&p, "pid"));
    cr_assert(eq(llong, file_size(path), 0), "written in a folder others can write to");
    unlink(path);
    rmdir(dir);
}

Test(process, userdir_of_another_owner_or_open_to_all_is_refused, .timeout = 20)
{
    /* A per-user folder planted by another user, or open to all (0777): one warning, no marker, line on stderr. */
    char dir[PATH_MAX], marker[PATH_MAX + 64];
    tmp_path(dir, sizeof(dir), "ipccache");
    for (int open_to_all = 0; open_to_all < 2; open_to_all++) {
        cr_assert_eq(mkdir(dir, 0700), 0);
        cr_assert_eq(open_to_all ? chmod(dir, 0777) : chown(dir, 65534, 65534), 0);
        struct proc p;
        probe(&p, NO_ENV, "signal");
        expect_line_on_stderr(&p);
        cr_assert_not_null(strstr(p.err, "ipccache: warning: "), "%s", p.err);
        snprintf(marker, sizeof(marker), "%s/ipccache-%lld.marker", dir, kv(&p, "pid"));
        cr_assert_neq(access(marker, F_OK), 0, "marker written in %s",
                      open_to_all ? "an open folder" : "another user's folder");
        cr_assert_eq(rmdir(dir), 0, "%s: %s", dir, strerror(errno));
    }
}
