/*
 * config.c - the IPCCACHE_* settings, read once at the first IPC call.
 *
 * One table lists every variable with its parser and default. A bad value
 * gives one warning naming the variable and keeps the default, unless
 * IPCCACHE_STRICT is on, in which case it is an error and the process stops
 * (an operator asked to be told, not to run with a setting they did not mean).
 */
#include <ctype.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config.h"
#include "fmt.h"
#include "base_impl.h"

#define DEFAULT_MAX_IDLE_BYTES (8ULL << 30)
#define DEFAULT_MAX_IDLE_ENTRIES 4096

struct ipcc_config ipcc_config = {
    .vmm = 1,
    .max_idle_bytes = DEFAULT_MAX_IDLE_BYTES,
    .max_idle_entries = DEFAULT_MAX_IDLE_ENTRIES,
    .log_level = IPCC_LOG_WARN,
    .stats_signal = SIGUSR1,
    .release_wait_ms = 100,
};

/* ---- value parsers: return 0 on success, -1 on a bad value ------------- */

int ipcc_parse_bool(const char *s, int *out)
{
    static const char *const yes[] = { "1", "true", "yes", "on" };
    static const char *const no[] = { "0", "false", "no", "off", "" };
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (strcasecmp(s, yes[i]) == 0)
            return *out = 1, 0;
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        if (strcasecmp(s, no[i]) == 0)
            return *out = 0, 0;
    return -1;
}

/* Plain decimal, no sign, no trailing junk. */
static int parse_u64(const char *s, const char **end, uint64_t *out)
{
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    if (errno == ERANGE)
        return -1;
    *out = v;
    *end = e;
    return 0;
}

int ipcc_parse_count(const char *s, uint64_t *out)
{
    const char *end;
    if (parse_u64(s, &end, out) < 0 || *end != '\0')
        return -1;
    return 0;
}

/* Bytes with an optional K/M/G/T suffix (powers of 1024), either case, alone
 * or with "i"/"iB". "GB" is refused: 10^9 to some, 2^30 to others. */
int ipcc_parse_size(const char *s, uint64_t *out)
{
    static const char units[] = "KMGT";
    const char *end;
    uint64_t v;
    if (parse_u64(s, &end, &v) < 0)
        return -1;
    unsigned shift = 0;
    if (*end) {
        const char *u = strchr(units, toupper((unsigned char)*end));
        if (!u)
            return -1;
        shift = 10 * (unsigned)(u - units + 1);
        end++;
        if (*end == 'i' || *end == 'I') {
            end++;
            if (*end == 'b' || *end == 'B')
                end++;
        }
    }
    if (*end != '\0' || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = v << shift;
    return 0;
}

/* Signals the stats handler must never take: the synchronous ones report a
 * fault in the program (catching them hides a crash), KILL and STOP cannot
 * be caught at all. */
static int signal_refused(int sig)
{
    static const int refused[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS,
                                   SIGKILL, SIGSTOP };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        if (sig == refused[i])
            return 1;
    return sig < 1 || sig >= NSIG;
}

/* RTMIN, RTMIN+n, RTMAX, RTMAX-n; the offset may not leave the range. */
static int parse_realtime(const char *s, int *out)
{
    int base, dir;
    if (strncasecmp(s, "RTMIN", 5) == 0)
        base = SIGRTMIN, dir = 1;
    else if (strncasecmp(s, "RTMAX", 5) == 0)
        base = SIGRTMAX, dir = -1;
    else
        return -1;
    s += 5;
    uint64_t n = 0;
    if (*s && (*s != (dir > 0 ? '+' : '-') || ipcc_parse_count(s + 1, &n) < 0))
        return -1;
    if (n > (uint64_t)(SIGRTMAX - SIGRTMIN))
        return -1;
    return *out = base + dir * (int)n, 0;
}

static const struct {
    const char *name;
    int sig;
} signal_names[] = {
    { "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { "HUP", SIGHUP },
    { "WINCH", SIGWINCH }, { "URG", SIGURG },
};

/* A signal number, or a name with or without "SIG"; 0 means none. */
int ipcc_parse_signal(const char *s, int *out)
{
    uint64_t n;
    int sig = -1;
    if (ipcc_parse_count(s, &n) == 0) {
        if (n == 0)
            return *out = 0, 0;
        sig = n < (uint64_t)NSIG ? (int)n : -1;
    } else {
        if (strncasecmp(s, "SIG", 3) == 0)
            s += 3;
        for (size_t i = 0; i < sizeof(signal_names) / sizeof(signal_names[0]); i++)
            if (strcasecmp(s, signal_names[i].name) == 0)
                sig = signal_names[i].sig;
        if (sig < 0 && parse_realtime(s, &sig) < 0)
            return -1;
    }
    if (signal_refused(sig))
        return -1;
    return *out = sig, 0;
}

/* The name ipcc_parse_signal takes back: SIGUSR1, SIGRTMIN+2, a number for
 * the others, "none" for 0 (messages say what users write). */
void ipcc_signal_name(int sig, char *out, size_t cap)
{
    for (size_t i = 0; i < sizeof(signal_names) / sizeof(signal_names[0]); i++)
        if (sig == signal_names[i].sig) {
            snprintf(out, cap, "SIG%s", signal_names[i].name);
            return;
        }
    if (sig == 0)
        snprintf(out, cap, "none");
    else if (sig > SIGRTMIN && sig <= SIGRTMAX)
        snprintf(out, cap, "SIGRTMIN+%d", sig - SIGRTMIN);
    else if (sig == SIGRTMIN)
        snprintf(out, cap, "SIGRTMIN");
    else
        snprintf(out, cap, "%d", sig);
}

int ipcc_parse_log_level(const char *s, enum ipcc_log_level *out)
{
    static const char *const names[] = { "error", "warn", "info", "debug" };
    for (int i = 0; i < 4; i++)
        if (strcasecmp(s, names[i]) == 0)
            return *out = (enum ipcc_log_level)i, 0;
    if (strcasecmp(s, "warning") == 0)
        return *out = IPCC_LOG_WARN, 0;
    return -1;
}

/* ---- the table ---------------------------------------------------------- */

static int set_disable(const char *s) { return ipcc_parse_bool(s, &ipcc_config.disabled); }
static int set_vmm(const char *s) { return ipcc_parse_bool(s, &ipcc_config.vmm); }
static int set_idle_bytes(const char *s) { return ipcc_parse_size(s, &ipcc_config.max_idle_bytes); }
static int set_idle_entries(const char *s) { return ipcc_parse_count(s, &ipcc_config.max_idle_entries); }
static int set_log(const char *s) { return ipcc_parse_log_level(s, &ipcc_config.log_level); }
/* An explicit setting may take back a signal the program ignores. */
static int set_signal(const char *s)
{
    if (ipcc_parse_signal(s, &ipcc_config.stats_signal) < 0)
        return -1;
    ipcc_config.stats_signal_explicit = 1;
    return 0;
}
static int set_at_exit(const char *s) { return ipcc_parse_bool(s, &ipcc_config.stats_at_exit); }

/* A minute at most: a free is not meant to hang on a stuck importer. */
static int set_release_wait(const char *s)
{
    uint64_t ms;
    if (ipcc_parse_count(s, &ms) < 0 || ms > 60000)
        return -1;
    ipcc_config.release_wait_ms = ms;
    return 0;
}

/* The stats file for process `pid`: %p becomes the pid, %% a percent sign.
 * Expanded at each write, not once: a fork child writes to its own file.
 * Returns 0, or -1 for an unknown escape or a path longer than cap - 1.
 * Async-signal-safe. */
int ipcc_config_stats_path(const char *pattern, long pid, char *out, size_t cap)
{
    struct ipcc_out o = { out, cap - 1, 0 };
    for (const char *s = pattern; *s; s++) {
        char one[2] = { *s, '\0' };
        if (*s == '%' && s[1] == 'p')
            ipcc_out_u64(&o, (uint64_t)pid);
        else if (*s == '%' && s[1] != '%')
            return -1;
        else
            ipcc_out_str(&o, one);
        s += *s == '%';
    }
    return ipcc_out_end(&o);
}

/* Kept as written; checked by expanding it once for this process. A newline
 * is refused: the path is written into the marker file one per line. */
static int set_stats_file(const char *s)
{
    char probe[sizeof(ipcc_config.stats_file)];
    if (strlen(s) >= sizeof(ipcc_config.stats_file) || strchr(s, '\n') ||
        ipcc_config_stats_path(s, (long)getpid(), probe, sizeof(probe)) < 0)
        return -1;
    strcpy(ipcc_config.stats_file, s);
    return 0;
}

static int set_stats_dir(const char *s)
{
    if (s[0] != '/' || strchr(s, '\n') || strlen(s) >= sizeof(ipcc_config.stats_dir) - 40)
        return -1;
    strcpy(ipcc_config.stats_dir, s);
    return 0;
}

static int set_strict(const char *s) { return ipcc_parse_bool(s, &ipcc_config.strict); }

/* The one list of settings: the library loads it; ipccache-config checks
 * values against it and prints it (the README's table is generated from it). */
static const struct ipcc_setting settings[] = {
    { "IPCCACHE_DISABLE", set_disable,
      "1, true, yes or on to turn the cache off (0, false, no or off leave it on)", "0",
      "1/true/yes/on: pure pass-through, nothing cached, no handler." },
    { "IPCCACHE_VMM", set_vmm, "a boolean (1/0, true/false, yes/no, on/off)", "1",
      "0/false/no/off: pass the VMM path (PyTorch's expandable segments) through untouched and cache"
      " legacy IPC only." },
    { "IPCCACHE_MAX_IDLE_BYTES", set_idle_bytes, "a size such as 8G, 512M or 1048576", "8G",
      "Most bytes kept mapped with no reference, legacy IPC mappings and VMM imports together;"
      " past it the least recently used idle ones, of either kind, are really closed."
      " Suffixes K, M, G, T, either case, alone or with i or iB: powers of 1024 (16G = 16g ="
      " 16GiB). KB, MB, GB, TB are refused (SI or binary?). 0 keeps nothing idle." },
    { "IPCCACHE_MAX_IDLE_ENTRIES", set_idle_entries, "a non-negative integer", "4096",
      "Most idle mappings and VMM imports kept, together; same eviction." },
    { "IPCCACHE_LOG", set_log, "one of error, warn, info, debug", "warn",
      "error, warn, info (adds one start-up line per process that uses IPC), debug." },
    { "IPCCACHE_STATS_FILE", set_stats_file,
      "a path without newlines (%p expands to the pid, %% is a percent sign)", "",
      "File the stats lines are appended to; %p becomes the pid of the writing process (a fork"
      " child writes its own file), %% a percent sign. Created 0600; used only if it is a regular"
      " file of the process's user, never through a symlink (one that cannot be written: one"
      " warning at the first IPC call, and the lines go to stderr). Unset: the request file of"
      " ipccache-stats if it exists, else stderr." },
    { "IPCCACHE_STATS_DIR", set_stats_dir, "an absolute directory path", "",
      "Unset: the per-user folder. Where ipccache-stats leaves ipccache-<pid>.stats to ask a process without a stats file"
      " for its line. Must be a folder of the process's user that nobody else can write to (else"
      " one warning, and no request file is used)." },
    { "IPCCACHE_STATS_SIGNAL", set_signal,
      "a signal name (USR1, SIGUSR2, RTMIN+n, RTMAX-n) or number, 0 for none; "
      "not SEGV, BUS, FPE, ILL, TRAP, SYS, KILL or STOP", "SIGUSR1",
      "Signal that makes the process write its stats line: a name (USR1, SIGUSR2, HUP, WINCH, URG,"
      " RTMIN, RTMIN+3, RTMAX-2) or number; 0 installs no handler. Refused: synchronous and"
      " uncatchable signals (SEGV, BUS, FPE, ILL, TRAP, SYS, KILL, STOP), numbers outside 1 to"
      " NSIG-1, offsets past RTMAX. Set explicitly, it also takes a signal the program ignores." },
    { "IPCCACHE_STATS_AT_EXIT", set_at_exit, "a boolean", "0",
      "Also write a stats line at normal exit." },
    { "IPCCACHE_RELEASE_WAIT_MS", set_release_wait, "milliseconds from 0 to 60000", "100",
      "How long an exporter's free of memory it exported waits for importers to close their idle"
      " mappings of it. A stopped or stuck importer costs this much once per free." },
    { "IPCCACHE_STRICT", set_strict, "a boolean", "0",
      "A bad value in any setting stops the process (exit status 78) instead of warning." },
};

const struct ipcc_setting *ipcc_config_table(size_t *count)
{
    *count = sizeof(settings) / sizeof(settings[0]);
    return settings;
}

static const char *default_or_unset(const struct ipcc_setting *st)
{
    return st->default_text[0] ? st->default_text : "unset";
}

/* Whether a size is written with an SI-looking unit (16GB, 512mb), and
 * how many digits come before it. */
static int si_unit(const char *v, size_t *digits)
{
    size_t n = strspn(v, "0123456789");
    if (n == 0 || !v[n] || !strchr("KMGTkmgt", v[n]) || !v[n + 1] || !strchr("bB", v[n + 1]) ||
        v[n + 2])
        return 0;
    *digits = n;
    return 1;
}

/* What a bad value was expected to be. "16GB" is refused on purpose (10^9
 * or 2^30?): it says so, and what was likely meant. */
void ipcc_config_expected(const struct ipcc_setting *st, const char *v, char *out, size_t cap)
{
    static const char *const decimal[] = { "10^3", "10^6", "10^9", "10^12" };
    static const char *const binary[] = { "2^10", "2^20", "2^30", "2^40" };
    size_t digits;
    if (st->set != set_idle_bytes || !si_unit(v, &digits)) {
        snprintf(out, cap, "expected %s", st->expect);
        return;
    }
    int u = (int)(strchr("KMGT", toupper((unsigned char)v[digits])) - "KMGT");
    snprintf(out, cap,
             "%.2s is refused on purpose, %s bytes to some and %s to others (did you mean "
             "%.*s, %.*s %ciB?)",
             v + digits, decimal[u], binary[u], (int)digits + 1, v, (int)digits, v, "KMGT"[u]);
}

/* ipccache-config --check: each problem is an error that says what the
 * library would do instead (the library warns, and does it). */
static int checking;

static void say_problem(const char *what, const char *doing, const char *would)
{
    if (checking)
        ipcc_log(IPCC_LOG_ERROR, "%s; the library would %s", what, would);
    else
        ipcc_log(IPCC_LOG_WARN, "%s; %s", what, doing);
}

/* Keeps a copy of the default so a failed parse cannot leave half a value. */
static void load_one(const struct ipcc_setting *st)
{
    const char *v = getenv(st->name);
    if (!v)
        return;
    struct ipcc_config saved = ipcc_config;
    if (st->set(v) == 0)
        return;
    ipcc_config = saved;
    char expected[256], what[512], doing[64], would[64];
    ipcc_config_expected(st, v, expected, sizeof(expected));
    if (ipcc_config.strict) {
        ipcc_log(IPCC_LOG_ERROR, "%s=\"%s\" is invalid: %s (IPCCACHE_STRICT is on)", st->name, v,
                 expected);
        _exit(78); /* EX_CONFIG */
    }
    snprintf(what, sizeof(what), "%s=\"%s\" is invalid: %s", st->name, v, expected);
    snprintf(doing, sizeof(doing), "using the default (%s)", default_or_unset(st));
    snprintf(would, sizeof(would), "use the default (%s)", default_or_unset(st));
    say_problem(what, doing, would);
}

/* lstat, as a system call: glibc's own symbol is 2.33's (the floor is 2.17). */
static int lstat_call(const char *path, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}

/* Why the stats file cannot be written, or NULL: checked once at the load,
 * without creating it. It must be (stats.c) a regular file of this user,
 * never a symlink, open for appending; a new one needs its folder. */
static const char *stats_file_unwritable(const char *path, char *why, size_t cap)
{
    struct stat st;
    if (lstat_call(path, &st) == 0) {
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid())
            return "not a regular file of this user";
        return faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) == 0 ? NULL : strerror(errno);
    }
    if (errno != ENOENT)
        return strerror(errno);
    const char *slash = strrchr(path, '/');
    char dir[sizeof(ipcc_config.stats_file) + 64] = ".";
    if (slash)
        snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) == 0)
        return NULL;
    snprintf(why, cap, "%s: %s", dir, strerror(errno));
    return why;
}

/* Else its lines would go to stderr without a word. */
static void check_stats_file(void)
{
    char path[sizeof(ipcc_config.stats_file) + 64], why[sizeof(path) + 64];
    char what[sizeof(why) + sizeof(ipcc_config.stats_file) + 64];
    if (!ipcc_config.stats_file[0] ||
        ipcc_config_stats_path(ipcc_config.stats_file, (long)getpid(), path, sizeof(path)) < 0)
        return;
    const char *problem = stats_file_unwritable(path, why, sizeof(why));
    if (!problem)
        return;
    snprintf(what, sizeof(what), "IPCCACHE_STATS_FILE=\"%s\" cannot be written (%s)",
             ipcc_config.stats_file, problem);
    say_problem(what, "the stats lines go to stderr", "write the stats lines to stderr");
}

/* ---- names that are not settings ----------------------------------------- */

/* Read by the tools, not the library: ipccache-run's and make's library path,
 * ipccache-stats' test hook for the library's file name. */
static const char *const tool_variables[] = { "IPCCACHE_LIB", "IPCCACHE_STATS_LIBNAME" };

/* Edits (insert, delete, replace) from a to b, up to 64 characters each. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[65];
    if (la > 64 || lb > 64)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

/* Whether d edits leave most of setting's own letters (after IPCCACHE_):
 * IPCCACHE_OFF is 3 from IPCCACHE_LOG, a whole word rewritten, no hint. */
static int keeps_most_of(const char *setting, size_t d)
{
    return 2 * d < strlen(setting) - strlen("IPCCACHE_");
}

/* The setting a misspelling most likely meant: fewer than four edits away
 * and most of it kept, the first of the table when several are as close;
 * else none. */
static const char *closest_setting(const char *name)
{
    const char *best = NULL;
    size_t best_d = 4;
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        size_t d = edit_distance(name, settings[i].name);
        if (d < best_d && keeps_most_of(settings[i].name, d))
            best = settings[i].name, best_d = d;
    }
    return best;
}

static int is_known_name(const char *name)
{
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
        if (strcmp(name, settings[i].name) == 0)
            return 1;
    for (size_t i = 0; i < sizeof(tool_variables) / sizeof(tool_variables[0]); i++)
        if (strcmp(name, tool_variables[i]) == 0)
            return 1;
    return 0;
}

/* A misspelled variable would otherwise be ignored without a word: one
 * message each, an error under IPCCACHE_STRICT (a setting not meant). */
static void report_unknown(const char *entry)
{
    char name[128];
    size_t len = strcspn(entry, "=");
    if (len >= sizeof(name))
        len = sizeof(name) - 1;
    memcpy(name, entry, len);
    name[len] = '\0';
    if (is_known_name(name))
        return;
    const char *meant = closest_setting(name);
    char hint[96] = "";
    if (meant)
        snprintf(hint, sizeof(hint), " (did you mean %s?)", meant);
    if (ipcc_config.strict) {
        ipcc_log(IPCC_LOG_ERROR, "%s is not a setting%s (IPCCACHE_STRICT is on)", name, hint);
        _exit(78); /* EX_CONFIG */
    }
    char what[256];
    snprintf(what, sizeof(what), "%s is not a setting%s", name, hint);
    say_problem(what, "ignored", "ignore it");
}

static void report_unknown_names(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "IPCCACHE_", 9) == 0)
            report_unknown(*e);
}

/* IPCCACHE_STRICT goes first: it decides what a bad value in the others
 * means (a bad IPCCACHE_STRICT itself only warns). IPCCACHE_LOG goes next
 * so that it governs the messages about the rest. */
static int load_rank(const struct ipcc_setting *st)
{
    return st->set == set_strict ? 0 : st->set == set_log ? 1 : 2;
}

/* Called once, from the first intercepted IPC call. */
void ipcc_config_load(void)
{
    for (int rank = 0; rank < 3; rank++)
        for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
            if (load_rank(&settings[i]) == rank) {
                load_one(&settings[i]);
                ipcc_log_set_level(ipcc_config.log_level);
            }
    report_unknown_names();
    if (!ipcc_config.disabled)
        check_stats_file();
}

/* The load as ipccache-config --check runs it: the same checks, each
 * problem an error (IPCCACHE_STRICT still stops at the first, exit 78). */
void ipcc_config_check(void)
{
    checking = 1;
    ipcc_config_load();
    checking = 0;
}

/* One line, at info, the first time either path below finds the cache off. */
void ipcc_config_say_disabled(void)
{
    static _Atomic int said;
    if (!atomic_exchange(&said, 1))
        ipcc_log(IPCC_LOG_INFO, "disabled by IPCCACHE_DISABLE; every call goes to the driver");
}

/* The resolver and dlsym consult this before the full load: a quiet reading
 * of IPCCACHE_DISABLE (a bad value is reported later, by the full load).
 * When it says off, lookups answer the driver's own functions and the full
 * load may never come, so the confirmation is given here, at the level
 * IPCCACHE_LOG asks (read quietly too; the full load sets the same). */
int ipcc_config_disabled_early(void)
{
    const char *v = getenv("IPCCACHE_DISABLE");
    int on = 0;
    if (!(v && ipcc_parse_bool(v, &on) == 0 && on))
        return 0;
    const char *level = getenv("IPCCACHE_LOG");
    enum ipcc_log_level asked;
    if (level && ipcc_parse_log_level(level, &asked) == 0 && asked >= IPCC_LOG_INFO) {
        ipcc_config.log_level = asked;
        ipcc_log_set_level(asked);
        ipcc_config_say_disabled();
    }
    return 1;
}
