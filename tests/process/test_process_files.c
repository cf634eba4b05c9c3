/*
 * test_process_files.c - nothing another user plants where stats go is written to or blocks (fresh
 * processes under LD_PRELOAD; process_run.c runs them).
 */
#include "process_run.h"

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

TestSuite(process_files, .init = tu_process_init, .fini = tu_process_fini);

Test(process_files, request_file_traps_are_refused, .timeout = 60)
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

Test(process_files, stats_file_traps_are_refused, .timeout = 60)
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

Test(process_files, fifo_without_reader_does_not_block, .timeout = 20)
{
    /* IPCCACHE_STATS_FILE a FIFO nobody reads: the signal and exit do not block. */
    char env[PATH_MAX + 32], fifo[PATH_MAX];
    cr_assert_eq(mkfifo(tmp_path(fifo, sizeof(fifo), "fifo"), 0600), 0);
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_AT_EXIT=1", stats_file_env(env, sizeof(env), "fifo")), "signal");
    expect_line_on_stderr(&p);
}

Test(process_files, stats_dir_writable_by_others_is_refused, .timeout = 20)
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

Test(process_files, userdir_of_another_owner_or_open_to_all_is_refused, .timeout = 20)
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
