/*
 * test_config.c - every setting's parser accepts what the manual promises
 * and refuses the rest; a bad value keeps the default.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base.h"

/* Booleans: 1/0, true/false, yes/no, on/off in any case. */
Test(config, booleans, .timeout = 10)
{
    int v = -1;
    cr_assert_eq(ipcc_parse_bool("YES", &v), 0);
    cr_assert_eq(v, 1);
    cr_assert_eq(ipcc_parse_bool("off", &v), 0);
    cr_assert_eq(v, 0);
    cr_assert_eq(ipcc_parse_bool("maybe", &v), -1);
    cr_assert_eq(ipcc_parse_bool("2", &v), -1);
}

/* Sizes: plain bytes or K/M/G/T (1024-based), either case, alone or with
 * "i" or "iB"; "GB" (SI or binary?) refused; no junk. */
Test(config, sizes, .timeout = 10)
{
    uint64_t v = 0;
    cr_assert_eq(ipcc_parse_size("4096", &v), 0);
    cr_assert_eq(v, 4096);
    cr_assert_eq(ipcc_parse_size("8G", &v), 0);
    cr_assert_eq(v, 8ULL << 30);
    cr_assert_eq(ipcc_parse_size("512MiB", &v), 0);
    cr_assert_eq(v, 512ULL << 20);
    cr_assert_eq(ipcc_parse_size("2k", &v), 0);
    cr_assert_eq(v, 2048);
    cr_assert_eq(ipcc_parse_size("16g", &v), 0);
    cr_assert_eq(v, 16ULL << 30);
    cr_assert_eq(ipcc_parse_size("16Gi", &v), 0);
    cr_assert_eq(v, 16ULL << 30);
    cr_assert_eq(ipcc_parse_size("1tib", &v), 0);
    cr_assert_eq(v, 1ULL << 40);
    v = 7;
    cr_assert_eq(ipcc_parse_size("16GB", &v), -1, "GB: 10^9 or 2^30? refused");
    cr_assert_eq(ipcc_parse_size("16gb", &v), -1);
    cr_assert_eq(ipcc_parse_size("512MB", &v), -1);
    cr_assert_eq(ipcc_parse_size("4kB", &v), -1);
    cr_assert_eq(ipcc_parse_size("1024B", &v), -1);
    cr_assert_eq(ipcc_parse_size("1Gib ", &v), -1);
    cr_assert_eq(v, 7, "a refused size leaves the value");
    cr_assert_eq(ipcc_parse_size("12Q", &v), -1);
    cr_assert_eq(ipcc_parse_size("-1", &v), -1);
    cr_assert_eq(ipcc_parse_size("", &v), -1);
    cr_assert_eq(ipcc_parse_size("1G junk", &v), -1);
    cr_assert_eq(ipcc_parse_size("99999999999T", &v), -1, "overflow");
}

/* Counts: decimal only. */
Test(config, counts, .timeout = 10)
{
    uint64_t v = 0;
    cr_assert_eq(ipcc_parse_count("0", &v), 0);
    cr_assert_eq(v, 0);
    cr_assert_eq(ipcc_parse_count("256", &v), 0);
    cr_assert_eq(v, 256);
    cr_assert_eq(ipcc_parse_count("-1", &v), -1);
    cr_assert_eq(ipcc_parse_count("1e3", &v), -1);
    cr_assert_eq(ipcc_parse_count("99999999999999999999999", &v), -1);
}

/* Signals: names with or without SIG, numbers, 0; never KILL or STOP. */
Test(config, signals, .timeout = 10)
{
    int v = -1;
    cr_assert_eq(ipcc_parse_signal("SIGUSR2", &v), 0);
    cr_assert_eq(v, SIGUSR2);
    cr_assert_eq(ipcc_parse_signal("usr1", &v), 0);
    cr_assert_eq(v, SIGUSR1);
    cr_assert_eq(ipcc_parse_signal("0", &v), 0);
    cr_assert_eq(v, 0);
    cr_assert_eq(ipcc_parse_signal("12", &v), 0);
    cr_assert_eq(v, 12);
    cr_assert_eq(ipcc_parse_signal("RTMIN+2", &v), 0);
    cr_assert_eq(v, SIGRTMIN + 2);
    cr_assert_eq(ipcc_parse_signal("SIGFOO", &v), -1);
    cr_assert_eq(ipcc_parse_signal("9", &v), -1);
    cr_assert_eq(ipcc_parse_signal("999", &v), -1);
}

/* A signal's name for messages (the start-up line) is one IPCCACHE_STATS_SIGNAL takes back. */
Test(config, signal_names_parse_back, .timeout = 10)
{
    char name[32];
    ipcc_signal_name(SIGUSR1, name, sizeof(name));
    cr_assert_str_eq(name, "SIGUSR1");
    ipcc_signal_name(SIGRTMIN + 2, name, sizeof(name));
    cr_assert_str_eq(name, "SIGRTMIN+2");
    ipcc_signal_name(0, name, sizeof(name));
    cr_assert_str_eq(name, "none");
    for (int sig = 1; sig < NSIG; sig++) {
        int v = -1;
        char number[16];
        snprintf(number, sizeof(number), "%d", sig);
        if (ipcc_parse_signal(number, &v) != 0)
            continue; /* refused: never the setting's value */
        ipcc_signal_name(sig, name, sizeof(name));
        cr_assert_eq(ipcc_parse_signal(name, &v), 0, "%s", name);
        cr_assert_eq(v, sig, "%s", name);
    }
}

/* Real-time signals by name: RTMIN, RTMIN+n, RTMAX, RTMAX-n, inside the range only. */
Test(config, realtime_signal_names, .timeout = 10)
{
    int v = -1;
    cr_assert_eq(ipcc_parse_signal("SIGRTMIN", &v), 0);
    cr_assert_eq(v, SIGRTMIN);
    cr_assert_eq(ipcc_parse_signal("rtmax", &v), 0);
    cr_assert_eq(v, SIGRTMAX);
    cr_assert_eq(ipcc_parse_signal("RTMAX-3", &v), 0);
    cr_assert_eq(v, SIGRTMAX - 3);
    char last[32];
    snprintf(last, sizeof(last), "RTMIN+%d", SIGRTMAX - SIGRTMIN);
    cr_assert_eq(ipcc_parse_signal(last, &v), 0);
    cr_assert_eq(v, SIGRTMAX);
    snprintf(last, sizeof(last), "RTMIN+%d", SIGRTMAX - SIGRTMIN + 1);
    cr_assert_eq(ipcc_parse_signal(last, &v), -1, "past RTMAX");
    snprintf(last, sizeof(last), "RTMAX-%d", SIGRTMAX - SIGRTMIN + 1);
    cr_assert_eq(ipcc_parse_signal(last, &v), -1, "below RTMIN");
    cr_assert_eq(ipcc_parse_signal("RTMIN-1", &v), -1);
    cr_assert_eq(ipcc_parse_signal("RTMAX+1", &v), -1);
    cr_assert_eq(ipcc_parse_signal("RTMIN+", &v), -1);
}

/* RTMIN+<huge> must not wrap around onto a low signal such as SIGSEGV. */
Test(config, realtime_offset_overflow_is_refused, .timeout = 10)
{
    int v = -1;
    char huge[64];
    /* SIGRTMIN + this wraps to SIGSEGV in 32-bit int arithmetic. */
    snprintf(huge, sizeof(huge), "RTMIN+%llu", (1ULL << 32) - (unsigned long long)SIGRTMIN + SIGSEGV);
    cr_assert_eq(ipcc_parse_signal(huge, &v), -1, "%s gave %d", huge, v);
    cr_assert_eq(ipcc_parse_signal("RTMIN+18446744073709551615", &v), -1);
    cr_assert_eq(ipcc_parse_signal("RTMIN+99999999999999999999999", &v), -1);
    cr_assert_eq(v, -1, "nothing written on refusal");
}

/* Synchronous and uncatchable signals are refused by number and by name; out of [1, NSIG) too. */
Test(config, synchronous_and_uncatchable_signals_are_refused, .timeout = 10)
{
    static const struct { const char *name; int sig; } refused[] = {
        { "SEGV", SIGSEGV }, { "BUS", SIGBUS }, { "FPE", SIGFPE }, { "ILL", SIGILL },
        { "TRAP", SIGTRAP }, { "SYS", SIGSYS }, { "KILL", SIGKILL }, { "STOP", SIGSTOP },
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        char text[32];
        int v = -1;
        snprintf(text, sizeof(text), "%d", refused[i].sig);
        cr_expect_eq(ipcc_parse_signal(text, &v), -1, "%s accepted", text);
        snprintf(text, sizeof(text), "SIG%s", refused[i].name);
        cr_expect_eq(ipcc_parse_signal(text, &v), -1, "%s accepted", text);
    }
    char text[32];
    int v = -1;
    snprintf(text, sizeof(text), "%d", NSIG);
    cr_assert_eq(ipcc_parse_signal(text, &v), -1, "NSIG accepted");
    snprintf(text, sizeof(text), "%d", NSIG - 1);
    cr_assert_eq(ipcc_parse_signal(text, &v), 0, "NSIG - 1 refused");
    cr_assert_eq(ipcc_parse_signal("-1", &v), -1);
}

/* An explicit IPCCACHE_STATS_SIGNAL is remembered as such (it may take an ignored signal); a bad one is not. */
Test(config, explicit_signal_is_remembered, .timeout = 10)
{
    setenv("IPCCACHE_LOG", "error", 1);
    setenv("IPCCACHE_STATS_SIGNAL", "SIGSEGV", 1);
    ipcc_config_load();
    cr_assert_eq(ipcc_config.stats_signal, SIGUSR1);
    cr_assert_eq(ipcc_config.stats_signal_explicit, 0);
    setenv("IPCCACHE_STATS_SIGNAL", "USR2", 1);
    ipcc_config_load();
    cr_assert_eq(ipcc_config.stats_signal, SIGUSR2);
    cr_assert_eq(ipcc_config.stats_signal_explicit, 1);
}

/* Log levels by name. */
Test(config, log_levels, .timeout = 10)
{
    enum ipcc_log_level v;
    cr_assert_eq(ipcc_parse_log_level("debug", &v), 0);
    cr_assert_eq(v, IPCC_LOG_DEBUG);
    cr_assert_eq(ipcc_parse_log_level("ERROR", &v), 0);
    cr_assert_eq(v, IPCC_LOG_ERROR);
    cr_assert_eq(ipcc_parse_log_level("loud", &v), -1);
}

/* A bad value keeps the default and the others still load. */
Test(config, bad_value_keeps_default, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_BYTES", "lots", 1);
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "3", 1);
    setenv("IPCCACHE_LOG", "error", 1); /* keep the warning off the test output */
    ipcc_config_load();
    cr_assert_eq(ipcc_config.max_idle_bytes, 8ULL << 30);
    cr_assert_eq(ipcc_config.max_idle_entries, 3);
}

/* The stats file is kept as written; %p becomes the pid given at each
 * expansion (a fork child's own), %% a percent sign. */
Test(config, stats_file_expansion, .timeout = 10)
{
    char got[64];
    setenv("IPCCACHE_STATS_FILE", "/tmp/s.%p.%%", 1);
    ipcc_config_load();
    cr_assert_str_eq(ipcc_config.stats_file, "/tmp/s.%p.%%");
    cr_assert_eq(ipcc_config_stats_path(ipcc_config.stats_file, 4242, got, sizeof(got)), 0);
    cr_assert_str_eq(got, "/tmp/s.4242.%");
    cr_assert_eq(ipcc_config_stats_path(ipcc_config.stats_file, 7, got, sizeof(got)), 0);
    cr_assert_str_eq(got, "/tmp/s.7.%");
}

/* An expansion that does not fit is refused, not cut. */
Test(config, stats_file_expansion_never_truncates, .timeout = 10)
{
    char got[10];
    cr_assert_eq(ipcc_config_stats_path("/t/%p", 1234567, got, sizeof(got)), -1);
    cr_assert_eq(ipcc_config_stats_path("/t/%p", 123456, got, sizeof(got)), 0);
    cr_assert_str_eq(got, "/t/123456");
    cr_assert_eq(ipcc_config_stats_path("/abcdefgh", 1, got, sizeof(got)), 0);
    cr_assert_eq(ipcc_config_stats_path("/abcdefghi", 1, got, sizeof(got)), -1);
}

/* A stats file with an unknown % escape, a trailing %, or a newline is refused. */
Test(config, stats_file_bad_escape, .timeout = 10)
{
    static const char *const bad[] = { "/tmp/x%q", "/tmp/x%", "/tmp/a\nb" };
    setenv("IPCCACHE_LOG", "error", 1);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("IPCCACHE_STATS_FILE", bad[i], 1);
        ipcc_config_load();
        cr_assert_str_eq(ipcc_config.stats_file, "", "%s accepted", bad[i]);
    }
}

/* IPCCACHE_STRICT turns a bad value into one error line and exit status 78. */
Test(config, strict_exits, .timeout = 10)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* the message is captured, not shown */
        dup2(fds[1], STDERR_FILENO);
        setenv("IPCCACHE_STRICT", "1", 1);
        setenv("IPCCACHE_LOG", "error", 1);
        setenv("IPCCACHE_DISABLE", "perhaps", 1);
        ipcc_config_load();
        _exit(0);
    }
    close(fds[1]);
    char err[1024] = { 0 };
    size_t len = 0;
    ssize_t n;
    while ((n = read(fds[0], err + len, sizeof(err) - 1 - len)) > 0)
        len += (size_t)n;
    close(fds[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 78, "status %#x", status);
    cr_assert_str_eq(err, "ipccache: error: IPCCACHE_DISABLE=\"perhaps\" is invalid: expected 1, "
                          "true, yes or on to turn the cache off (0, false, no or off leave it on) "
                          "(IPCCACHE_STRICT is on)\n");
}

/* Each setting's documented default, given as its value, is the built-in default. */
Test(config, documented_defaults_are_the_defaults, .timeout = 10)
{
    struct ipcc_config built_in = ipcc_config;
    size_t n;
    const struct ipcc_setting *table = ipcc_config_table(&n);
    cr_assert_geq(n, 9);
    for (size_t i = 0; i < n; i++) {
        cr_assert_neq(table[i].meaning[0], '\0', "%s has no meaning", table[i].name);
        if (table[i].default_text[0])
            cr_assert_eq(table[i].set(table[i].default_text), 0, "%s", table[i].name);
    }
    cr_assert_eq(ipcc_config.disabled, built_in.disabled);
    cr_assert_eq(ipcc_config.max_idle_bytes, built_in.max_idle_bytes);
    cr_assert_eq(ipcc_config.max_idle_entries, built_in.max_idle_entries);
    cr_assert_eq(ipcc_config.log_level, built_in.log_level);
    cr_assert_eq(ipcc_config.stats_signal, built_in.stats_signal);
    cr_assert_eq(ipcc_config.stats_at_exit, built_in.stats_at_exit);
    cr_assert_eq(ipcc_config.strict, built_in.strict);
    cr_assert_str_eq(ipcc_config.stats_file, built_in.stats_file);
    cr_assert_str_eq(ipcc_config.stats_dir, built_in.stats_dir);
}

/* The release wait takes milliseconds up to a minute; a bad value keeps 100. */
Test(config, release_wait, .timeout = 10)
{
    setenv("IPCCACHE_LOG", "error", 1);
    setenv("IPCCACHE_RELEASE_WAIT_MS", "250", 1);
    ipcc_config_load();
    cr_assert_eq(ipcc_config.release_wait_ms, 250);
    ipcc_config.release_wait_ms = 100;
    setenv("IPCCACHE_RELEASE_WAIT_MS", "60000", 1); /* the documented upper bound */
    ipcc_config_load();
    cr_assert_eq(ipcc_config.release_wait_ms, 60000);
    ipcc_config.release_wait_ms = 100;
    setenv("IPCCACHE_RELEASE_WAIT_MS", "60001", 1);
    ipcc_config_load();
    cr_assert_eq(ipcc_config.release_wait_ms, 100);
    setenv("IPCCACHE_RELEASE_WAIT_MS", "1s", 1);
    ipcc_config_load();
    cr_assert_eq(ipcc_config.release_wait_ms, 100);
}
