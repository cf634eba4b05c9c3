/*
 * test_process_stats.c - the statistics: the line at exit and on the signal, the handler keeping
 * the program's settings, fork and the marker (fresh processes under LD_PRELOAD; process_run.c
 * runs them).
 */
#include "process_run.h"

/* ---- statistics ---------------------------------------------------------- */

TestSuite(process_stats, .init = tu_process_init, .fini = tu_process_fini);

Test(process_stats, stats_at_exit_go_to_the_pid_file, .timeout = 20)
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

Test(process_stats, stats_signal_writes_the_stats_file, .timeout = 20)
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

Test(process_stats, stats_signal_can_be_usr2, .timeout = 20)
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

Test(process_stats, stats_signal_zero_installs_no_handler, .timeout = 20)
{
    /* IPCCACHE_STATS_SIGNAL=0: the cache works, and no signal disposition changes. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_SIGNAL=0"), "openclose", "5");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 1);
    expect_kv_str(&p, "sigusr1", "default");
    expect_kv_str(&p, "sigusr2", "default");
}

Test(process_stats, stats_go_to_an_existing_request_file, .timeout = 20)
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

Test(process_stats, stats_go_to_stderr_without_a_file, .timeout = 20)
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


Test(process_stats, stats_handler_keeps_the_programs_flags_and_mask, .timeout = 20)
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

Test(process_stats, stats_handler_keeps_sa_restart_when_the_program_chose_it, .timeout = 20)
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

Test(process_stats, stats_signal_still_interrupts_a_read, .timeout = 20)
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

Test(process_stats, ignored_stats_signal_stays_ignored, .timeout = 20)
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

Test(process_stats, explicit_stats_signal_takes_an_ignored_one, .timeout = 20)
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

Test(process_stats, fork_child_stats_go_to_its_own_file, .timeout = 20)
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

Test(process_stats, marker_says_pid_start_signal_and_destination, .timeout = 20)
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
