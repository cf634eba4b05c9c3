/*
 * process_run.c - the process tests' shared part (process_run.h): where the
 * build and the test's folder are, running the probe, reading its output.
 *
 * Each test spawns build/tests/probe (IPCC_TEST_BUILD names the build folder)
 * in a controlled environment - none of the caller's IPCCACHE_* settings
 * leak in - captures stdout and stderr separately, and checks what the
 * probe printed (key=value lines), what ipccache said, and the files it
 * wrote. IPCC_TEST_PRELOAD_PREFIX (the sanitizer run: the ASan runtime) is
 * put ahead of the library in LD_PRELOAD.
 */
#include "process_run.h"

/* ---- where things are ---------------------------------------------------- */

char build_dir[PATH_MAX];
char tmpdir[256];

static void find_build_dir(void)
{
    const char *b = getenv("IPCC_TEST_BUILD");
    if (!realpath(b && *b ? b : "build", build_dir))
        cr_fatal("build folder %s: %s", b ? b : "build", strerror(errno));
}

/* A suite's .init: the build found, a fresh folder for the test. */
void tu_process_init(void)
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

/* A suite's .fini: the test's files, and the per-user folder the library made there (the
 * probe's XDG_RUNTIME_DIR is tmpdir): no other subfolders are made. */
void tu_process_fini(void)
{
    char userdir[sizeof(tmpdir) + 16];
    snprintf(userdir, sizeof(userdir), "%s/ipccache", tmpdir);
    remove_dir(userdir);
    remove_dir(tmpdir);
}

/* <tmpdir>/name, in a buffer of the caller's. */
char *tmp_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

/* ---- running a process --------------------------------------------------- */



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

char *format(const char *fmt, ...)
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
void run(struct proc *p, const char *const *argv, const char *const *extra)
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


void run_probe(struct proc *p, const char *const *extra, const char *const *args)
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
int exit_code(const struct proc *p)
{
    if (p->status == TIMED_OUT)
        return TIMED_OUT;
    return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status);
}

/* ---- reading what came back ---------------------------------------------- */

int count_lines(const char *s)
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

long long kv(const struct proc *p, const char *key)
{
    return strtoll(value_of(p, key), NULL, 10);
}

/* A word the probe printed (up to the end of the line), in buf. */
const char *kv_str(const struct proc *p, const char *key, char *buf, size_t cap)
{
    const char *v = value_of(p, key);
    snprintf(buf, cap, "%.*s", (int)strcspn(v, "\n"), v);
    return buf;
}

/* The value of "key": in a JSON line, as the stats line writes numbers. */
unsigned long long json_u64(const char *line, const char *key)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), "\"%s\":", key);
    const char *at = strstr(line, pattern);
    if (!at)
        cr_fatal("no %s in the stats line: %s", pattern, line);
    return strtoull(at + strlen(pattern), NULL, 10);
}

/* The whole file into buf (NUL-terminated); -1 if it cannot be read. */
ssize_t read_file(const char *path, char *buf, size_t cap)
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


/* Exited 0 and ipccache (and the probe) said nothing. */
void expect_quiet_success(const struct proc *p)
{
    cr_assert(eq(int, exit_code(p), 0), "stdout:\n%s\nstderr:\n%s", p->out, p->err);
    cr_assert(eq(str, STR(p->err), ""));
}

void expect_kv(const struct proc *p, const char *key, long long want)
{
    cr_assert(eq(llong, kv(p, key), want), "%s; stdout:\n%s\nstderr:\n%s", key, p->out, p->err);
}

/* The same, for a run made with `setting`, which the message names. */
void expect_kv_with(const struct proc *p, const char *setting, const char *key,
                           long long want)
{
    cr_expect(eq(llong, kv(p, key), want), "%s with %s", key, setting);
}

void expect_kv_str(const struct proc *p, const char *key, const char *want)
{
    char buf[64];
    cr_assert(eq(str, STR(kv_str(p, key, buf, sizeof(buf))), STR(want)), "%s", key);
}

/* The one stats line a file must hold, with the counters of an openclose
 * run of n: one real open, every other open a hit. */
void expect_stats_file(const char *path, unsigned long long n)
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


/* IPCCACHE_STATS_FILE=<tmpdir>/name, in a buffer of the caller's. */
const char *stats_file_env(char *buf, size_t cap, const char *name)
{
    char path[PATH_MAX];
    snprintf(buf, cap, "IPCCACHE_STATS_FILE=%s", tmp_path(path, sizeof(path), name));
    return buf;
}
