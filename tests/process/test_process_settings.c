/*
 * test_process_settings.c - the IPCCACHE_* settings: bad values, misspelled names, strict, the log
 * level (fresh processes under LD_PRELOAD; process_run.c runs them).
 */
#include "process_run.h"

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
    "(0)", "(8G)", "(4096)", "(warn)", "(SIGUSR1)", "(0)", "(unset)", "(unset)",
};

/* "IPCCACHE_X=v" -> "prefix IPCCACHE_X=\"v\"", what the message must start with. */
static void expected_message(char *buf, size_t cap, const char *prefix, const char *setting)
{
    int klen = (int)strcspn(setting, "=");
    snprintf(buf, cap, "%s%.*s=\"%s\"", prefix, klen, setting, setting + klen + 1);
}

TestSuite(process_settings, .init = tu_process_init, .fini = tu_process_fini);

Test(process_settings, bad_value_warns_once_and_keeps_the_default, .timeout = 20)
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

Test(process_settings, misspelled_setting_warns_once_naming_the_setting, .timeout = 20)
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

Test(process_settings, misspelled_setting_under_strict_stops, .timeout = 20)
{
    /* IPCCACHE_STRICT: a setting the operator did not mean stops the process, as a bad value does. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_STRICT=1", "IPCCACHE_DISABEL=1"), "openclose", "5");
    cr_expect(eq(int, exit_code(&p), 78));
    cr_expect_not_null(strstr(p.err, "ipccache: error: IPCCACHE_DISABEL is not a setting"
                                     " (did you mean IPCCACHE_DISABLE?)"), "%s", p.err);
}

Test(process_settings, name_extending_a_setting_is_not_one, .timeout = 20)
{
    /* A name that merely starts with a setting's is a misspelling like any other: reported, and
     * under IPCCACHE_STRICT a stop. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_DISABLED=1", "IPCCACHE_LOGLEVEL=debug", "IPCCACHE_STATS_FILES=/x"),
          "openclose", "5");
    cr_expect(eq(int, exit_code(&p), 0));
    cr_expect(eq(int, count_lines(p.err), 3), "stderr:\n%s", p.err);
    cr_expect_not_null(strstr(p.err, "warning: IPCCACHE_DISABLED is not a setting"
                                     " (did you mean IPCCACHE_DISABLE?); ignored\n"), "%s", p.err);
    cr_expect_not_null(strstr(p.err, "warning: IPCCACHE_LOGLEVEL is not a setting; ignored\n"),
                       "%s", p.err);
    cr_expect_not_null(strstr(p.err, "warning: IPCCACHE_STATS_FILES is not a setting"
                                     " (did you mean IPCCACHE_STATS_FILE?); ignored\n"), "%s", p.err);
    expect_kv(&p, "maps", 1); /* IPCCACHE_DISABLED=1 disables nothing */
    probe(&p, ENV("IPCCACHE_STRICT=1", "IPCCACHE_DISABLED=1"), "openclose", "5");
    cr_expect(eq(int, exit_code(&p), 78), "stderr:\n%s", p.err);
}

/* The warning for NAME=1 alone, after "ipccache: warning: ". */
static void expect_unknown_name_warning(const char *name, const char *says)
{
    struct proc p;
    char *setting = format("%s=1", name);
    probe(&p, ENV(setting), "openclose", "5");
    char *want = format("ipccache: warning: %s is not a setting%s; ignored\n", name, says);
    cr_expect(eq(str, p.err, want), "%s", name);
    free(setting);
    free(want);
}

Test(process_settings, misspelling_hint_only_for_a_close_setting, .timeout = 20)
{
    /* A hint names a setting only when the name keeps most of it (fewer than four edits, and
     * fewer than half its letters after IPCCACHE_): no hint that rewrites a whole word; of two
     * equally close settings, the first of the table. */
    expect_unknown_name_warning("IPCCACHE_STATS", "");
    expect_unknown_name_warning("IPCCACHE_OFF", "");
    expect_unknown_name_warning("IPCCACHE_ON", "");
    expect_unknown_name_warning("IPCCACHE_VM", " (did you mean IPCCACHE_VMM?)");
    expect_unknown_name_warning("IPCCACHE_STATS_FI", " (did you mean IPCCACHE_STATS_FILE?)");
    /* Three edits of STRICT's six letters: half, not most. */
    expect_unknown_name_warning("IPCCACHE_STRXYZ", "");
}

Test(process_settings, log_error_silences_the_warnings, .timeout = 20)
{
    /* IPCCACHE_LOG=error is read first, so a bad value in another setting is not reported. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_LOG=error", "IPCCACHE_MAX_IDLE_BYTES=12Q"), "openclose", "5");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 1);
}

Test(process_settings, strict_with_good_values_runs_normally, .timeout = 20)
{
    /* IPCCACHE_STRICT=1 with only valid settings changes nothing. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_STRICT=1", "IPCCACHE_MAX_IDLE_BYTES=512M", "IPCCACHE_LOG=warn",
                  "IPCCACHE_STATS_SIGNAL=SIGUSR2"), "openclose", "5");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 1);
    expect_kv_str(&p, "sigusr2", "handler");
}

Test(process_settings, strict_turns_a_bad_value_into_exit_78, .timeout = 20)
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

Test(process_settings, log_info_prints_one_startup_line, .timeout = 20)
{
    /* IPCCACHE_LOG=info: exactly one line, the start-up banner. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_LOG=info"), "openclose", "5");
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(int, count_lines(p.err), 1), "stderr:\n%s", p.err);
    cr_assert(eq(int, strncmp(p.err, "ipccache: version ", 18), 0), "%s", p.err);
    cr_assert_not_null(strstr(p.err, " active: "), "%s", p.err);
    /* The signal by the name users know, as IPCCACHE_STATS_SIGNAL takes it. */
    cr_assert_not_null(strstr(p.err, " stats_signal=SIGUSR1 "), "%s", p.err);
    probe(&p, ENV("IPCCACHE_LOG=info", "IPCCACHE_STATS_SIGNAL=RTMIN+2"), "openclose", "5");
    cr_assert_not_null(strstr(p.err, " stats_signal=SIGRTMIN+2 "), "%s", p.err);
    probe(&p, ENV("IPCCACHE_LOG=info", "IPCCACHE_STATS_SIGNAL=0"), "openclose", "5");
    cr_assert_not_null(strstr(p.err, " stats_signal=none "), "%s", p.err);
}

Test(process_settings, si_size_is_refused_saying_what_was_meant, .timeout = 20)
{
    /* 16GB is refused on purpose (10^9 or 2^30?): the one warning says so and what was likely
     * meant, and the default is used. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_MAX_IDLE_BYTES=16GB"), "openclose", "5");
    cr_expect(eq(int, exit_code(&p), 0));
    cr_expect(eq(str, p.err, "ipccache: warning: IPCCACHE_MAX_IDLE_BYTES=\"16GB\" is invalid: GB is"
                             " refused on purpose, 10^9 bytes to some and 2^30 to others (did you"
                             " mean 16G, 16 GiB?); using the default (8G)\n"));
    expect_kv(&p, "maps", 1);
}

Test(process_settings, unwritable_stats_file_is_said_once, .timeout = 20)
{
    /* A stats file the process cannot write: one warning at the first IPC call (not one per
     * line), and the lines go to stderr; a file it can create: no word. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_STATS_FILE=/nonexistent/dir/x.json", "IPCCACHE_STATS_AT_EXIT=1"),
          "openclose", "5");
    cr_expect(eq(int, exit_code(&p), 0));
    cr_expect(eq(int, count_lines(p.err), 2), "stderr:\n%s", p.err);
    const char *want = "ipccache: warning: IPCCACHE_STATS_FILE=\"/nonexistent/dir/x.json\" cannot"
                       " be written (/nonexistent/dir: No such file or directory); the stats lines"
                       " go to stderr\n{\"schema\":1,";
    cr_expect(eq(int, strncmp(p.err, want, strlen(want)), 0), "stderr:\n%s", p.err);
    char *file = format("%s/stats.%%p.json", tmpdir);
    char *setting = format("IPCCACHE_STATS_FILE=%s", file);
    probe(&p, ENV(setting), "openclose", "5");
    expect_quiet_success(&p);
    free(setting);
    free(file);
}
