/*
 * test_config.c - every setting's parser accepts what the manual promises
 * and refuses the rest; a bad value keeps the default.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"

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

/* Sizes: plain bytes or K/M/G/T (1024-based), optional "iB"/"B"; no junk. */
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

/* %p in the stats file becomes the pid; %% a percent sign; others are bad. */
Test(config, stats_file_expansion, .timeout = 10)
{
    char want[64];
    setenv("IPCCACHE_STATS_FILE", "/tmp/s.%p.%%", 1);
    ipcc_config_load();
    snprintf(want, sizeof(want), "/tmp/s.%ld.%%", (long)getpid());
    cr_assert_str_eq(ipcc_config.stats_file, want);
}

/* A stats file with an unknown % escape is refused. */
Test(config, stats_file_bad_escape, .timeout = 10)
{
    setenv("IPCCACHE_STATS_FILE", "/tmp/x%q", 1);
    setenv("IPCCACHE_LOG", "error", 1);
    ipcc_config_load();
    cr_assert_str_eq(ipcc_config.stats_file, "");
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
    cr_assert_str_eq(err, "ipccache: error: IPCCACHE_DISABLE=\"perhaps\" is invalid: expected a "
                          "boolean (1/0, true/false, yes/no, on/off) (IPCCACHE_STRICT is on)\n");
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
    setenv("IPCCACHE_RELEASE_WAIT_MS", "60001", 1);
    ipcc_config_load();
    cr_assert_eq(ipcc_config.release_wait_ms, 100);
    setenv("IPCCACHE_RELEASE_WAIT_MS", "1s", 1);
    ipcc_config_load();
    cr_assert_eq(ipcc_config.release_wait_ms, 100);
}
