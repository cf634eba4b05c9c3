/*
 * soak.c - the stand-in soak's supervisor (make soak; tests/soak/soak.sh).
 *
 * Starts the fleet, each process this program run again in its role
 * (soak_exporter.c, soak_importer.c), with the library preloaded into every
 * one of them when --preload names it; replaces exporters that exit and
 * kills one now and then; every second asks each importer for its stats
 * line and writes the rows of soak_record.h. At the end: the importers stop
 * and close all they hold, the exporters free everything and exit, and what
 * the stand-in's memory still holds is written down (the summary file, key=value
 * lines the verdict reads).
 *
 *     soak run OUT SECONDS SEED EXPORTERS IMPORTERS [LIBRARY]
 *
 * SOAK_STEADY=1 (the soak's own tests): exporters neither crash, end, nor
 * reset; only their fresh buffers and re-shared weights come and go.
 *     soak exporter ... | soak importer ...   (started by run)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "soak_record.h"

#define SMALL_CAP_BYTES (64ULL << 20)
#define DEFAULT_CAP_BYTES (8ULL << 30)
#define PINNED_WAIT_S 3.0

static struct {
    const char *out, *lib;
    struct soak_board *b;
    uint64_t seed, rnd;
    pid_t exp_pid[SOAK_MAX_EXPORTERS];
    unsigned exp_gen[SOAK_MAX_EXPORTERS];
    double replace_at[SOAK_MAX_EXPORTERS];
    int exp_starts, exp_kills, imp_deaths;
    pid_t imp_pid[SOAK_MAX_IMPORTERS];
    uint64_t caps_bytes;
} sv;

/* Runs this program again as ROLE with args, its output to log, the
 * library preloaded when there is one; extra: NAME=VALUE settings. */
static pid_t spawn(const char *log, char *const argv[], char *const extra[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    for (int i = 0; extra && extra[i]; i++)
        putenv(extra[i]);
    if (sv.lib)
        setenv("LD_PRELOAD", sv.lib, 1);
    execv("/proc/self/exe", argv);
    _exit(127);
}

static void start_exporter(int e)
{
    char log[4200], slot[16], gen[16], seed[32];
    unsigned g = sv.exp_gen[e]++;
    snprintf(log, sizeof(log), "%s/logs/exporter-%d.log", sv.out, e);
    snprintf(slot, sizeof(slot), "%d", e);
    snprintf(gen, sizeof(gen), "%u", g);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)sv.seed);
    char *argv[] = { "soak", "exporter", (char *)sv.out, slot, gen, seed, NULL };
    sv.exp_pid[e] = spawn(log, argv, NULL);
    sv.replace_at[e] = 0;
    sv.exp_starts++;
}

/* Importer i's part of the mix: threads, fd pressure (a quarter), eviction
 * pressure (another quarter), forks (a third), resets (a fifth). */
static void start_importer(int i)
{
    static char stats[4200], small_bytes[64], small_entries[64];
    char log[4200], slot[16], seed[32], threads[8], nofile[16];
    snprintf(stats, sizeof(stats), "IPCCACHE_STATS_FILE=%s/stats/imp-%%p", sv.out);
    snprintf(small_bytes, sizeof(small_bytes), "IPCCACHE_MAX_IDLE_BYTES=%llu",
             (unsigned long long)SMALL_CAP_BYTES);
    snprintf(small_entries, sizeof(small_entries), "IPCCACHE_MAX_IDLE_ENTRIES=32");
    snprintf(log, sizeof(log), "%s/logs/importer-%d.log", sv.out, i);
    snprintf(slot, sizeof(slot), "%d", i);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)sv.seed);
    snprintf(threads, sizeof(threads), "%u", 1 + soak_pick(&sv.rnd, SOAK_THREADS - 1));
    snprintf(nofile, sizeof(nofile), "%d", i % 4 == 3 ? 64 : 0);
    int evict = i % 4 == 2;
    char *extra[] = { stats, evict ? small_bytes : NULL, evict ? small_entries : NULL, NULL };
    char *argv[] = { "soak", "importer", (char *)sv.out, slot, seed, threads, nofile,
                     i % 3 == 1 ? "1" : "0", i % 5 == 4 ? "1" : "0", NULL };
    sv.imp_pid[i] = spawn(log, argv, extra);
    sv.caps_bytes += evict ? SMALL_CAP_BYTES : DEFAULT_CAP_BYTES;
}

/* Reaps what exited: an exporter is replaced a moment later; an importer
 * must not die before the end. */
static void reap(double now)
{
    int status;
    for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
        for (unsigned e = 0; e < sv.b->nexporters; e++)
            if (sv.exp_pid[e] == pid) {
                sv.exp_pid[e] = 0;
                sv.replace_at[e] = now + 0.5 + soak_pick(&sv.rnd, 1500) / 1000.0;
            }
        for (unsigned i = 0; i < sv.b->nimporters; i++)
            if (sv.imp_pid[i] == pid) {
                sv.imp_pid[i] = 0;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
                    atomic_load(&sv.b->phase) != SOAK_STOP_ALL) {
                    fprintf(stderr, "soak: importer %u (pid %d) ended early (status 0x%x)\n", i,
                            (int)pid, status);
                    sv.imp_deaths++;
                }
            }
    }
}

static void churn(double now)
{
    int alive[SOAK_MAX_EXPORTERS], n = 0;
    for (unsigned e = 0; e < sv.b->nexporters; e++) {
        if (!sv.exp_pid[e] && sv.replace_at[e] && now >= sv.replace_at[e])
            start_exporter((int)e);
        if (sv.exp_pid[e])
            alive[n++] = (int)e;
    }
    if (n && !getenv("SOAK_STEADY") && soak_pick(&sv.rnd, 7) == 0) { /* a crash: no free, no exit handler */
        kill(sv.exp_pid[alive[soak_pick(&sv.rnd, (unsigned)n)]], SIGKILL);
        sv.exp_kills++;
    }
}

static int exporters_alive(void)
{
    int n = 0;
    for (unsigned e = 0; e < sv.b->nexporters; e++)
        n += sv.exp_pid[e] != 0;
    return n;
}

/* Waits until every process of pids[] is reaped or done() says so, at most s seconds. */
static void wait_for(int (*done)(void), double s)
{
    for (double end = soak_now() + s; !done() && soak_now() < end;) {
        reap(soak_now());
        soak_sleep_ms(20);
    }
}

static int importers_done(void)
{
    for (unsigned i = 0; i < sv.b->nimporters; i++)
        if (sv.imp_pid[i] && !atomic_load(&sv.b->imp[i].done))
            return 0;
    return 1;
}

static int exporters_gone(void) { return exporters_alive() == 0; }

static int importers_gone(void)
{
    for (unsigned i = 0; i < sv.b->nimporters; i++)
        if (sv.imp_pid[i])
            return 0;
    return 1;
}

/* What is still pinned after the last exporter's free, and by whom (the
 * importers' pids are importers.csv's): where to look when it is not 0. */
static void write_ghosts(void)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/ghosts.txt", sv.out);
    FILE *f = fopen(path, "we");
    if (!f)
        return;
    fakecuda_phys_ghost_list(f);
    fclose(f);
}

static void summary(double seconds, uint64_t pinned_after_free, double pinned_wait, uint64_t pinned_end)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/summary.txt", sv.out);
    FILE *f = fopen(path, "we");
    if (!f)
        exit(2);
    uint64_t sum[5] = { 0 };
    const size_t fields[5] = { offsetof(struct soak_counts, opens), offsetof(struct soak_counts, imports),
                               offsetof(struct soak_counts, checks), offsetof(struct soak_counts, wrong),
                               offsetof(struct soak_counts, rc_mismatch) };
    for (unsigned i = 0; i < sv.b->nimporters; i++)
        for (int k = 0; k < 5; k++)
            sum[k] += soak_importer_sum(&sv.b->imp[i], fields[k]);
    fprintf(f, "library=%s\nseconds=%.1f\nseed=%llu\nexporters=%u\nimporters=%u\n", sv.lib ? "1" : "0",
            seconds, (unsigned long long)sv.seed, sv.b->nexporters, sv.b->nimporters);
    fprintf(f, "opens=%llu\nimports=%llu\nchecks=%llu\nwrong=%llu\nrc_mismatch=%llu\n",
            (unsigned long long)sum[0], (unsigned long long)sum[1], (unsigned long long)sum[2],
            (unsigned long long)sum[3], (unsigned long long)sum[4]);
    fprintf(f, "exporter_starts=%d\nexporter_kills=%d\nimporter_deaths=%d\n", sv.exp_starts,
            sv.exp_kills, sv.imp_deaths);
    fprintf(f, "pinned_after_last_free=%llu\npinned_wait_s=%.1f\npinned_at_end=%llu\ncaps_bytes=%llu\n",
            (unsigned long long)pinned_after_free, pinned_wait, (unsigned long long)pinned_end,
            (unsigned long long)(sv.lib ? sv.caps_bytes : 0));
    fclose(f);
}

static void make_dirs(void)
{
    const char *sub[] = { "", "/sock", "/stats", "/logs", "/xdg", "/phys" };
    char path[4200];
    for (size_t i = 0; i < sizeof(sub) / sizeof(*sub); i++) {
        snprintf(path, sizeof(path), "%s%s", sv.out, sub[i]);
        if ((mkdir(path, 0700) != 0 && errno != EEXIST) || chmod(path, 0700) != 0) {
            perror(path);
            exit(2);
        }
    }
    snprintf(path, sizeof(path), "%s/phys", sv.out);
    setenv("FAKECUDA_PHYS_DIR", path, 1);
    snprintf(path, sizeof(path), "%s/xdg", sv.out);
    setenv("XDG_RUNTIME_DIR", path, 1);
}

static int run(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    sv.out = argv[0];
    double seconds = atof(argv[1]);
    sv.rnd = sv.seed = strtoull(argv[2], NULL, 0);
    unsigned nexp = (unsigned)atoi(argv[3]), nimp = (unsigned)atoi(argv[4]);
    sv.lib = argc > 5 && *argv[5] ? argv[5] : NULL;
    if (nexp < 1 || nexp > SOAK_MAX_EXPORTERS || nimp < 1 || nimp > SOAK_MAX_IMPORTERS)
        return 2;
    make_dirs();
    char board[4200];
    snprintf(board, sizeof(board), "%s/board", sv.out);
    if (!(sv.b = soak_board_map(board, 1))) {
        perror(board);
        return 2;
    }
    sv.b->nexporters = nexp;
    sv.b->nimporters = nimp;
    for (unsigned e = 0; e < nexp; e++)
        start_exporter((int)e);
    for (double end = soak_now() + 30; soak_now() < end && exporters_alive() == (int)nexp;) {
        unsigned up = 0;
        for (unsigned e = 0; e < nexp; e++)
            up += atomic_load(&sv.b->exp[e].pid) != 0;
        if (up == nexp)
            break;
        soak_sleep_ms(10);
    }
    for (unsigned i = 0; i < nimp; i++)
        start_importer((int)i);
    struct soak_record rec;
    soak_record_open(&rec, sv.out);
    double start = soak_now(), now = start;
    for (double next = start + 1; now - start < seconds; next += 1) {
        soak_sleep_ms((next - 0.05 - soak_now()) * 1000 > 0 ? (next - 0.05 - soak_now()) * 1000 : 0);
        soak_record_ask(sv.b, sv.lib != NULL);
        soak_sleep_ms(50);
        now = soak_now();
        reap(now);
        churn(now);
        soak_record_row(&rec, sv.b, now - start, exporters_alive(), sv.exp_starts);
    }
    atomic_store(&sv.b->phase, SOAK_STOP_OPS);
    wait_for(importers_done, 60);
    atomic_store(&sv.b->exporters_stop, 1);
    for (unsigned e = 0; e < nexp; e++)
        sv.replace_at[e] = 0;
    wait_for(exporters_gone, 60);
    /* Idle mappings of an exporter that exited go within about a second
     * (the importers' helper threads); of one that freed, before its free
     * returned. */
    double freed = soak_now(), pinned_wait = 0;
    uint64_t pinned_after_free = fakecuda_phys_bytes();
    while (pinned_after_free && (pinned_wait = soak_now() - freed) < PINNED_WAIT_S) {
        soak_sleep_ms(100);
        pinned_after_free = fakecuda_phys_bytes();
    }
    write_ghosts();
    soak_record_ask(sv.b, sv.lib != NULL);
    soak_sleep_ms(50);
    soak_record_row(&rec, sv.b, soak_now() - start, exporters_alive(), sv.exp_starts);
    atomic_store(&sv.b->phase, SOAK_STOP_ALL);
    wait_for(importers_gone, 60);
    summary(now - start, pinned_after_free, pinned_wait, fakecuda_phys_bytes());
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "run"))
        return run(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "exporter"))
        return soak_exporter_main(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "importer"))
        return soak_importer_main(argc - 2, argv + 2);
    fprintf(stderr, "usage: soak run OUT SECONDS SEED EXPORTERS IMPORTERS [LIBRARY]\n");
    return 2;
}
