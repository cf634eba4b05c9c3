/*
 * test_stats.c - the stats line: its keys and numbers, its signal, and its
 * handler's manners (installed late, chains to the previous one, safe while
 * the cache is busy).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "testutil.h"

static int handler_installed(int sig)
{
    struct sigaction sa;
    sigaction(sig, NULL, &sa);
    return (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != NULL
                                      : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
}

/* Every documented key is present with the numbers the calls imply. */
Test(stats, line_has_every_key, .timeout = 10)
{
    const char *path = tu_stats_file();
    tu_context();
    CUipcMemHandle h = tu_handle(50, 1 << 20);
    for (int i = 0; i < 5; i++)
        tu_close(tu_open(h));
    raise(SIGUSR1);
    static const char *const keys[] = { "pid", "schema", "opens", "hits", "misses", "closes",
        "real_opens", "real_closes", "live", "idle", "idle_bytes", "evictions",
        "invalidations", "passthrough", "errors", "open_ns_mean", "close_ns_mean" };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        cr_assert_geq(tu_stat(path, keys[i]), 0, "key %s missing", keys[i]);
    cr_assert_eq(tu_stat(path, "pid"), getpid());
    cr_assert_eq(tu_stat(path, "opens"), 5);
    cr_assert_eq(tu_stat(path, "hits"), 4);
    cr_assert_eq(tu_stat(path, "misses"), 1);
    cr_assert_eq(tu_stat(path, "closes"), 5);
    cr_assert_eq(tu_stat(path, "real_opens"), 1);
    cr_assert_eq(tu_stat(path, "real_closes"), 0);
    cr_assert_eq(tu_stat(path, "live"), 0);
    cr_assert_eq(tu_stat(path, "idle"), 1);
    cr_assert_eq(tu_stat(path, "idle_bytes"), 1 << 20);
}

/* Errors, evictions and invalidations are counted where they happen. */
Test(stats, counts_errors_evictions_invalidations, .timeout = 10)
{
    const char *path = tu_stats_file();
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "1", 1);
    CUcontext c = tu_context();
    tu_close(tu_open(tu_handle(51, 4096)));
    tu_close(tu_open(tu_handle(52, 4096)));
    cr_assert_eq(cuIpcCloseMemHandle(0x42), CUDA_ERROR_INVALID_VALUE);
    cuCtxDestroy(c);
    raise(SIGUSR1);
    cr_assert_eq(tu_stat(path, "evictions"), 1);
    cr_assert_eq(tu_stat(path, "real_closes"), 1);
    cr_assert_eq(tu_stat(path, "errors"), 1);
    cr_assert_eq(tu_stat(path, "passthrough"), 1);
    cr_assert_eq(tu_stat(path, "invalidations"), 1);
    cr_assert_eq(tu_stat(path, "idle"), 0);
}

/* No handler until the first IPC call; then one. */
Test(stats, handler_installed_at_first_ipc_call, .timeout = 10)
{
    tu_context();
    cr_assert_not(handler_installed(SIGUSR1));
    tu_close(tu_open(tu_handle(53, 4096)));
    cr_assert(handler_installed(SIGUSR1));
}

/* IPCCACHE_STATS_SIGNAL=0 installs nothing. */
Test(stats, signal_zero_installs_nothing, .timeout = 10)
{
    setenv("IPCCACHE_STATS_SIGNAL", "0", 1);
    tu_context();
    tu_close(tu_open(tu_handle(54, 4096)));
    cr_assert_not(handler_installed(SIGUSR1));
}

static atomic_int previous_calls;

static void previous_handler(int sig)
{
    (void)sig;
    atomic_fetch_add(&previous_calls, 1);
}

/* An application's handler installed earlier still runs, after ours. */
Test(stats, chains_to_previous_handler, .timeout = 10)
{
    const char *path = tu_stats_file();
    signal(SIGUSR2, previous_handler);
    setenv("IPCCACHE_STATS_SIGNAL", "SIGUSR2", 1);
    tu_context();
    tu_close(tu_open(tu_handle(55, 4096)));
    raise(SIGUSR2);
    cr_assert_eq(atomic_load(&previous_calls), 1);
    cr_assert_eq(tu_stat(path, "opens"), 1);
}

/* The interrupted code's errno survives the handler even when the handler's
 * own calls fail: the stats file's folder does not exist, so its open fails
 * and the line goes to stderr (captured here, with the load's one warning
 * that says so). */
Test(stats, handler_keeps_errno, .timeout = 10)
{
    const char *dir = getenv("TMPDIR");
    char missing[512], err_path[512], out[4096] = "";
    dir = dir && *dir == '/' ? dir : "/tmp";
    snprintf(missing, sizeof(missing), "%s/ipcc-no-such-folder-%ld/s.stats", dir, (long)getpid());
    snprintf(err_path, sizeof(err_path), "%s/ipcc-test-%ld.err", dir, (long)getpid());
    setenv("IPCCACHE_STATS_FILE", missing, 1);
    int err_fd = open(err_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int saved = dup(STDERR_FILENO);
    cr_assert(err_fd >= 0 && saved >= 0 && dup2(err_fd, STDERR_FILENO) == STDERR_FILENO);
    tu_context();
    tu_close(tu_open(tu_handle(56, 4096)));

    errno = EDOM;
    raise(SIGUSR1);
    int after = errno;
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(err_fd, out, sizeof(out) - 1, 0);
    close(err_fd);
    unlink(err_path);

    cr_assert_eq(after, EDOM, "errno is %d after the handler", after);
    cr_assert(n > 0 && strstr(out, "\"opens\""), "no stats line on stderr: %s", out);
    cr_assert_not_null(strstr(out, "cannot be written"), "no warning of the stats file: %s", out);
}

static CUcontext busy_ctx;
static atomic_int stop_busy;

static void *busy_worker(void *arg)
{
    cuCtxSetCurrent(busy_ctx);
    CUipcMemHandle h = tu_handle(60 + (uint64_t)(long)arg, 1 << 20);
    while (!atomic_load(&stop_busy)) {
        CUdeviceptr p = 0;
        if (cuIpcOpenMemHandle(&p, h, 1) != CUDA_SUCCESS || cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
            return (void *)1;
    }
    return NULL;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int lines = 0, ch;
    while (f && (ch = fgetc(f)) != EOF)
        lines += ch == '\n';
    if (f)
        fclose(f);
    return lines;
}

/* 200 signals while 4 threads hammer the cache: 200 whole lines, no hang. */
Test(stats, signals_while_busy, .timeout = 30)
{
    const char *path = tu_stats_file();
    busy_ctx = tu_context();
    tu_close(tu_open(tu_handle(59, 4096)));
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, busy_worker, (void *)i);
    for (int i = 0; i < 200; i++) {
        kill(getpid(), SIGUSR1);
        usleep(200);
    }
    atomic_store(&stop_busy, 1);
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_assert_null(ret);
    }
    cr_assert_eq(count_lines(path), 200);
    cr_assert_geq(tu_stat(path, "hits"), 1);
}

/* IPCCACHE_DISABLE=1: every open is a real map and no handler appears. */
Test(stats, disabled_is_pure_passthrough, .timeout = 10)
{
    setenv("IPCCACHE_DISABLE", "1", 1);
    tu_context();
    CUipcMemHandle h = tu_handle(56, 4096);
    for (int i = 0; i < 3; i++)
        tu_close(tu_open(h));
    cr_assert_eq(tu_driver().maps, 3);
    cr_assert_eq(tu_driver().unmaps, 3);
    cr_assert_not(handler_installed(SIGUSR1));
}

/* An entry lent to the thread that hits it (no lock) counts live while it
 * holds it and idle after its close, once, like any other. */
Test(stats, lent_entry_counted_once, .timeout = 10)
{
    const char *path = tu_stats_file();
    tu_context();
    CUipcMemHandle h = tu_handle(51, 1 << 20);
    for (int i = 0; i < 5; i++)
        tu_close(tu_open(h));
    CUdeviceptr p = tu_open(h);
    raise(SIGUSR1);
    cr_assert_eq(tu_stat(path, "live"), 1);
    cr_assert_eq(tu_stat(path, "idle"), 0);
    tu_close(p);
    raise(SIGUSR1);
    cr_assert_eq(tu_stat(path, "live"), 0);
    cr_assert_eq(tu_stat(path, "idle"), 1);
    cr_assert_eq(tu_stat(path, "idle_bytes"), 1 << 20);
    cr_assert_eq(tu_stat(path, "hits"), 5);
    cr_assert_eq(tu_stat(path, "closes"), 6);
}

/* Counts stay exact when threads outnumber the stripes of their own and
 * come and go: waves of threads, each wave running at once, each thread
 * counting on a stripe no other live thread writes (or the shared one). */
#define COUNT_WAVES 3
#define COUNT_THREADS 120
#define COUNT_PAIRS 20000

static CUcontext count_ctx;
static pthread_barrier_t count_start;

static void *count_pairs(void *arg)
{
    CUipcMemHandle h = tu_handle(200 + (uint64_t)(long)arg, 1 << 20); /* lent: no lock */
    cuCtxSetCurrent(count_ctx);
    for (int i = 0; i < COUNT_PAIRS; i++) {
        CUdeviceptr p = 0;
        if (cuIpcOpenMemHandle(&p, h, 1) != CUDA_SUCCESS || cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
            return (void *)1;
        if (i == 0 || i == COUNT_PAIRS - 2) /* every stripe taken, then every count at once */
            pthread_barrier_wait(&count_start);
    }
    return NULL;
}

Test(stats, counts_exact_across_threads_beyond_the_stripes, .timeout = 60)
{
    const char *path = tu_stats_file();
    count_ctx = tu_context();
    cr_assert_eq(pthread_barrier_init(&count_start, NULL, COUNT_THREADS), 0);
    for (int w = 0; w < COUNT_WAVES; w++)
        tu_run_threads(count_pairs, COUNT_THREADS);
    raise(SIGUSR1);
    long long pairs = (long long)COUNT_WAVES * COUNT_THREADS * COUNT_PAIRS;
    cr_assert_eq(tu_stat(path, "opens"), pairs);
    cr_assert_eq(tu_stat(path, "closes"), pairs);
    cr_assert_eq(tu_stat(path, "hits") + tu_stat(path, "misses"), pairs);
}
