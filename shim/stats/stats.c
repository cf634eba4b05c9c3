/*
 * stats.c - counters, and the one-line JSON report written on the stats
 * signal (and at exit when asked).
 *
 * Everything reachable from the signal handler is async-signal-safe: atomic
 * loads, our own number formatting into a stack buffer, open/write/close.
 * No stdio, no malloc, no locks (Redis's serverLogFromHandler does the same).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stats.h"
#include "stats_impl.h"

#define STATS_SCHEMA 1
#define LINE_MAX_BYTES 4096

struct ipcc_counter_stripe ipcc_stripes[IPCC_STRIPES];

__thread struct ipcc_counters *ipcc_stripe_here __attribute__((tls_model("initial-exec")));

static pthread_key_t stripe_key;
static int stripe_key_made;

static struct ipcc_counters *shared_stripe(void)
{
    return &ipcc_stripes[IPCC_SHARED_STRIPE].c;
}

static struct ipcc_counter_stripe *stripe_of(struct ipcc_counters *c)
{
    return (struct ipcc_counter_stripe *)((char *)c - offsetof(struct ipcc_counter_stripe, c));
}

/* A thread that ends gives its stripe back, counts kept: the next thread to
 * take it adds to them. Counts made later in this thread (another exit
 * handler's) go to the shared stripe. */
static void give_back_stripe(void *stripe)
{
    ipcc_stripe_here = shared_stripe();
    atomic_store_explicit(&stripe_of(stripe)->taken, 0, memory_order_release);
}

static void make_stripe_key(void)
{
    stripe_key_made = pthread_key_create(&stripe_key, give_back_stripe) == 0;
}

/* At the thread's first count: a free stripe of its own if one is left and
 * it can be given back at the thread's exit, else the shared one. */
struct ipcc_counters *ipcc_take_stripe(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_stripe_key);
    ipcc_stripe_here = shared_stripe();
    for (int i = 0; stripe_key_made && i < IPCC_SHARED_STRIPE; i++) {
        int free_stripe = 0;
        if (!atomic_compare_exchange_strong(&ipcc_stripes[i].taken, &free_stripe, 1))
            continue;
        if (pthread_setspecific(stripe_key, &ipcc_stripes[i].c) == 0)
            ipcc_stripe_here = &ipcc_stripes[i].c;
        else
            atomic_store(&ipcc_stripes[i].taken, 0);
        break;
    }
    return ipcc_stripe_here;
}

/* Sum of one counter over all stripes. Async-signal-safe. */
uint64_t ipcc_stat_sum(size_t field_offset)
{
    uint64_t total = 0;
    for (int i = 0; i < IPCC_STRIPES; i++) {
        const char *base = (const char *)&ipcc_stripes[i].c;
        total += atomic_load_explicit((const _Atomic uint64_t *)(base + field_offset),
                                      memory_order_relaxed);
    }
    return total;
}

static uint64_t load(const _Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* Fork child: counts start again; the other threads are gone, and so are
 * their stripes' owners. */
void ipcc_stats_reset(void)
{
    for (int s = 0; s < IPCC_STRIPES; s++) {
        _Atomic uint64_t *f = (_Atomic uint64_t *)&ipcc_stripes[s].c;
        for (size_t i = 0; i < sizeof(struct ipcc_counters) / sizeof(*f); i++)
            atomic_store_explicit(&f[i], 0, memory_order_relaxed);
        if (&ipcc_stripes[s].c != ipcc_stripe_here)
            atomic_store_explicit(&ipcc_stripes[s].taken, 0, memory_order_relaxed);
    }
}

/* ---- the JSON line, written with fmt.c's signal-safe writer ------------ */

#define put_str ipcc_out_str
#define put_u64 ipcc_out_u64

static void put_field(struct ipcc_out *o, const char *key, uint64_t v)
{
    put_str(o, ",\"");
    put_str(o, key);
    put_str(o, "\":");
    put_u64(o, v);
}

/* A millisecond count with three decimals, from microseconds. */
static void put_ms(struct ipcc_out *o, const char *key, uint64_t us)
{
    put_field(o, key, us / 1000);
    put_str(o, ".");
    uint64_t frac = us % 1000;
    put_str(o, frac < 100 ? (frac < 10 ? "00" : "0") : "");
    put_u64(o, frac);
}

static uint64_t mean(uint64_t total, uint64_t samples)
{
    return samples ? total / samples : 0;
}

/* The figures the layers above keep, registered at load (entry/wiring.c):
 * set before any signal handler exists, so the handler may read them. */
static const struct ipcc_stats_sources *sources;

void ipcc_stats_register(const struct ipcc_stats_sources *s)
{
    sources = s;
}

static void put_counters(struct ipcc_out *o, uint64_t hits, const struct ipcc_budget_gauges *g)
{
    uint64_t misses = IPCC_TOTAL(misses);
    put_field(o, "opens", hits + misses + IPCC_TOTAL(open_passthrough));
    put_field(o, "hits", hits);
    put_field(o, "misses", misses);
    put_field(o, "hits_locked", IPCC_TOTAL(hits_locked));
    put_field(o, "closes", IPCC_TOTAL(close_cached) + IPCC_TOTAL(close_passthrough) +
                               IPCC_TOTAL(close_past_zero));
    put_field(o, "real_opens", IPCC_TOTAL(real_opens));
    put_field(o, "real_closes", IPCC_TOTAL(real_closes));
    put_field(o, "vmm_imports", IPCC_TOTAL(vmm_imports));
    put_field(o, "vmm_import_hits", IPCC_TOTAL(vmm_import_hits));
    put_field(o, "vmm_maps", IPCC_TOTAL(vmm_maps));
    put_field(o, "vmm_map_hits", IPCC_TOTAL(vmm_map_hits));
    put_field(o, "vmm_access_skips", IPCC_TOTAL(vmm_access_skips));
    put_field(o, "vmm_idle_bytes", g->vmm_idle_bytes);
    put_field(o, "vmm_fds", g->vmm_fds);
}

/* idle and idle_bytes count both kinds: the one budget's totals. */
static void put_gauges(struct ipcc_out *o, const struct ipcc_budget_gauges *g)
{
    put_field(o, "live", g->live);
    put_field(o, "idle", g->idle);
    put_field(o, "idle_bytes", g->idle_bytes);
    put_field(o, "evictions", IPCC_TOTAL(evictions));
    put_field(o, "invalidations", IPCC_TOTAL(invalidations));
    put_field(o, "releases_on_request", IPCC_TOTAL(releases_on_request));
    put_field(o, "ghost_bytes", sources ? sources->ghost_bytes() : 0);
    put_field(o, "passthrough", IPCC_TOTAL(open_passthrough) + IPCC_TOTAL(close_passthrough));
    put_field(o, "errors", IPCC_TOTAL(errors));
    put_field(o, "mem_bytes", ipcc_mem_mapped());
}

/* Mean real costs, and what the hits saved at those costs. */
static void put_costs(struct ipcc_out *o, uint64_t hits)
{
    uint64_t open_ns = mean(IPCC_TOTAL(real_open_ns), IPCC_TOTAL(real_open_samples));
    uint64_t close_ns = mean(IPCC_TOTAL(real_close_ns), IPCC_TOTAL(real_close_samples));
    put_field(o, "open_ns_mean", open_ns);
    put_field(o, "close_ns_mean", close_ns);
    put_ms(o, "saved_ms", hits * (open_ns + close_ns) / 1000);
    put_field(o, "max_idle_bytes", ipcc_config.max_idle_bytes);
    put_field(o, "max_idle_entries", ipcc_config.max_idle_entries);
}

static void put_top(struct ipcc_out *o, uint64_t now_ns)
{
    struct ipcc_top_slot slots[IPCC_TOP_SLOTS];
    put_str(o, ",\"top\":[");
    if (sources) {
        sources->top(slots);
        int first = 1;
        for (int i = 0; i < IPCC_TOP_SLOTS; i++) {
            const struct ipcc_top_slot *s = &slots[i];
            if (!atomic_load_explicit(&s->used, memory_order_acquire))
                continue;
            put_str(o, first ? "{" : ",{");
            first = 0;
            put_str(o, "\"ctx\":");
            put_u64(o, load(&s->ctx_id));
            put_field(o, "hits", load(&s->hits));
            put_field(o, "refs", load(&s->refs));
            put_field(o, "bytes", load(&s->bytes));
            uint64_t born = load(&s->created_ns);
            put_field(o, "age_ms", now_ns > born ? (now_ns - born) / 1000000 : 0);
            put_str(o, "}");
        }
    }
    put_str(o, "]");
}

/* Formats the whole line, newline included; returns its length. */
static size_t format_stats(char *buf, size_t cap)
{
    struct ipcc_out o = { buf, cap - 2, 0 };
    put_str(&o, "{\"schema\":");
    put_u64(&o, STATS_SCHEMA);
    put_field(&o, "pid", (uint64_t)getpid());
    put_str(&o, ",\"version\":\"" IPCC_VERSION "\"");
    uint64_t hits = IPCC_TOTAL(hits); /* one reading for the count and the saving */
    struct ipcc_budget_gauges g = { 0 };
    if (sources)
        sources->gauges(&g);
    put_counters(&o, hits, &g);
    put_gauges(&o, &g);
    put_costs(&o, hits);
    put_top(&o, ipcc_clock_ns());
    put_str(&o, "}\n");
    return (size_t)(o.p - buf);
}

/* ---- where the line goes ------------------------------------------------ */

/* The directory of the request file: IPCCACHE_STATS_DIR, else the per-user
 * directory. Found at start; empty if it failed its checks. */
static char request_dir[sizeof(ipcc_config.stats_dir)];

/* IPCCACHE_STATS_FILE for this pid (a fork child has its own), opened or
 * created, never through a link, and used only if it is a regular file of
 * ours. */
static int open_stats_file(void)
{
    char path[sizeof(ipcc_config.stats_file) + 64];
    if (ipcc_config_stats_path(ipcc_config.stats_file, (long)getpid(), path, sizeof(path)) < 0)
        return -1;
    return ipcc_file_open_checked(AT_FDCWD, path, O_WRONLY | O_APPEND | O_CREAT);
}

/* The per-process request file that ipccache-stats creates when the process
 * has no stats file: used only if it already exists and is a regular file
 * of ours (a FIFO, a link or another user's file is refused, unopened or
 * unwritten). */
static int open_request_file(void)
{
    char name[48];
    struct ipcc_out o = IPCC_OUT(name);
    put_str(&o, "ipccache-");
    put_u64(&o, (uint64_t)getpid());
    put_str(&o, ".stats");
    if (!request_dir[0] || ipcc_out_end(&o) < 0)
        return -1;
    int dirfd = ipcc_dir_open_checked(request_dir);
    if (dirfd < 0)
        return -1;
    int fd = ipcc_file_open_checked(dirfd, name, O_WRONLY | O_APPEND);
    close(dirfd);
    return fd;
}

static int open_destination(void)
{
    return ipcc_config.stats_file[0] ? open_stats_file() : open_request_file();
}

/* Writes one stats line with a single write(2), to stderr when no file
 * qualifies. Async-signal-safe. */
void ipcc_stats_write_line(void)
{
    char line[LINE_MAX_BYTES];
    size_t len = format_stats(line, sizeof(line));
    int fd = open_destination();
    ssize_t ignored = write(fd >= 0 ? fd : STDERR_FILENO, line, len);
    (void)ignored;
    if (fd >= 0)
        close(fd);
}

/* Called at start, outside any handler: settles the request directory (one
 * warning if IPCCACHE_STATS_DIR fails its checks; userdir.c warns for its
 * own). */
static void find_request_dir(void)
{
    if (!ipcc_config.stats_dir[0]) {
        if (ipcc_userdir_path(request_dir, sizeof(request_dir)) < 0)
            request_dir[0] = '\0';
        return;
    }
    int fd = ipcc_dir_open_checked(ipcc_config.stats_dir);
    if (fd < 0) {
        ipcc_log(IPCC_LOG_WARN,
                 "IPCCACHE_STATS_DIR=%s is not a directory of this user that only it can "
                 "write to; no request file is used", ipcc_config.stats_dir);
        return;
    }
    close(fd);
    strcpy(request_dir, ipcc_config.stats_dir);
}

/* ---- the handler -------------------------------------------------------- */

/* What the program chose for the signal before us. Our handler is live
 * before sigaction hands back the old action, so the action read just
 * before is published first; should the program have changed it in
 * between, what sigaction handed back replaces it, whole (one pointer). */
static struct sigaction previous_read, previous_replaced;
static const struct sigaction *_Atomic previous_action;

/* Calls the program's handler exactly as the kernel would have. */
static void chain_previous(int sig, siginfo_t *info, void *uctx)
{
    const struct sigaction *p = atomic_load(&previous_action);
    if (!p)
        return;
    if (p->sa_flags & SA_SIGINFO) {
        if (p->sa_sigaction)
            p->sa_sigaction(sig, info, uctx);
    } else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
        p->sa_handler(sig);
    }
}

static int same_action(const struct sigaction *a, const struct sigaction *b)
{
    return a->sa_sigaction == b->sa_sigaction && a->sa_flags == b->sa_flags;
}

static void on_stats_signal(int sig, siginfo_t *info, void *uctx)
{
    int saved_errno = errno;
    ipcc_stats_write_line();
    errno = saved_errno;
    chain_previous(sig, info, uctx);
}

/* The flags of the program's handler that change how the signal behaves
 * (restarted calls, alternate stack, blocking, one-shot) carry over to ours,
 * with its mask: the program sees the signal as it set it up. Over SIG_DFL,
 * nothing is restarted. */
#define KEPT_FLAGS (SA_RESTART | SA_ONSTACK | SA_NODEFER | SA_RESETHAND)

static int has_handler(const struct sigaction *sa)
{
    return (sa->sa_flags & SA_SIGINFO) ||
           (sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN);
}

static int is_ignored(const struct sigaction *sa)
{
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_IGN;
}

/* 0 once our handler is in place; -1 if the signal is left as it was. */
static int install(int sig)
{
    struct sigaction now, sa;
    if (sigaction(sig, NULL, &now) != 0)
        return -1;
    /* Already ours: a fork child running start() again (lifecycle.c). Taking
     * our own handler as the program's would make it call itself forever. */
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_stats_signal)
        return 0;
    if (is_ignored(&now) && !ipcc_config.stats_signal_explicit) {
        ipcc_log(IPCC_LOG_INFO, "signal %d is ignored by this program; leaving it so "
                 "(no stats handler; set IPCCACHE_STATS_SIGNAL to take it anyway)", sig);
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_stats_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (has_handler(&now)) {
        sa.sa_flags |= now.sa_flags & KEPT_FLAGS;
        sa.sa_mask = now.sa_mask;
    }
    previous_read = now;
    atomic_store(&previous_action, &previous_read);
    if (sigaction(sig, &sa, &previous_replaced) != 0) {
        ipcc_log(IPCC_LOG_WARN, "cannot install the stats handler for signal %d", sig);
        return -1;
    }
    if (!same_action(&previous_replaced, &now))
        atomic_store(&previous_action, &previous_replaced);
    return 0;
}

static _Atomic int handler_installed;

/* Fork child (entry/wiring.c's list, last): its counts start at zero, and
 * since it inherits the handler, it announces itself with its own marker.
 * Async-signal-safe. */
void ipcc_stats_fork_child(void)
{
    ipcc_stats_reset();
    if (atomic_load(&handler_installed))
        ipcc_marker_write(ipcc_config.stats_signal, request_dir);
}

/* Installed at the first intercepted IPC call, never earlier: a process that
 * does not use IPC keeps its signal dispositions. A handler that was already
 * there is called after ours. The marker tells ipccache-stats that this
 * process answers the signal. */
void ipcc_stats_install_handler(void)
{
    int sig = ipcc_config.stats_signal;
    if (sig == 0 && !ipcc_config.stats_at_exit)
        return;
    find_request_dir();
    if (sig == 0 || install(sig) != 0)
        return;
    ipcc_marker_write(sig, request_dir);
    atomic_store(&handler_installed, 1);
}
