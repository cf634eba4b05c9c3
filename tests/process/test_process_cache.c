/*
 * test_process_cache.c - the cache in a process: hits and real maps, caps, errors, contexts, fork,
 * exit (fresh processes under LD_PRELOAD; process_run.c runs them).
 */
#include "process_run.h"

/* ---- the cache ----------------------------------------------------------- */

TestSuite(process_cache, .init = tu_process_init, .fini = tu_process_fini);

Test(process_cache, repeated_open_maps_once_and_unmaps_at_exit, .timeout = 20)
{
    /* 100 open/close pairs of one handle cost one real map, undone by the exit handler. */
    char counters[PATH_MAX], env[PATH_MAX + 32], line[512];
    snprintf(env, sizeof(env), "FAKECUDA_COUNTERS_AT_EXIT=%s",
             tmp_path(counters, sizeof(counters), "counters"));
    struct proc p;
    probe(&p, ENV(env), "openclose", "100");
    expect_quiet_success(&p);
    expect_kv(&p, "hits_ptr_same", 1);
    expect_kv(&p, "maps", 1);
    expect_kv(&p, "open_calls", 1);
    expect_kv(&p, "refcount", 1);   /* kept, idle */
    expect_kv_str(&p, "sigusr1", "handler");

    cr_assert_geq(read_file(counters, line, sizeof(line)), 0, "no %s", counters);
    cr_assert_not_null(strstr(line, "maps=1 unmaps=1 "), "at exit: %s", line);
    cr_assert_not_null(strstr(line, " live=0"), "at exit: %s", line);
}

Test(process_cache, disabled_says_so_once_when_asked, .timeout = 20)
{
    /* IPCCACHE_DISABLE with IPCCACHE_LOG=info or debug: one line confirms it, whether the
     * program reaches the driver through the resolver (cudart) or opens by linked symbols. */
    static const char *const how[][2] = { { "cudart_sequence", NULL }, { "openclose", "5" } };
    for (size_t i = 0; i < 2; i++) {
        struct proc p;
        probe(&p, ENV("IPCCACHE_DISABLE=1", "IPCCACHE_LOG=debug"), how[i][0], how[i][1]);
        cr_expect(eq(int, exit_code(&p), 0), "%s", how[i][0]);
        cr_expect(eq(str, p.err, "ipccache: disabled by IPCCACHE_DISABLE; every call goes to the"
                                 " driver\n"), "%s", how[i][0]);
    }
}

Test(process_cache, disabled_passes_every_call_through, .timeout = 20)
{
    /* IPCCACHE_DISABLE=1: every open is a real map, and no handler is installed. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_DISABLE=1"), "openclose", "100");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 100);
    expect_kv(&p, "unmaps", 100);
    expect_kv(&p, "refcount", 0);
    expect_kv_str(&p, "sigusr1", "default");
}

Test(process_cache, idle_caps_below_one_mapping_close_at_once, .timeout = 20)
{
    /* A cap that one idle 1 MiB mapping exceeds keeps nothing idle: each close is a real unmap. */
    static const char *const caps[] = { "IPCCACHE_MAX_IDLE_ENTRIES=0", "IPCCACHE_MAX_IDLE_BYTES=1K" };
    for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
        struct proc p;
        probe(&p, ENV(caps[i]), "openclose", "10");
        expect_quiet_success(&p);
        expect_kv_with(&p, caps[i], "maps", 10);
        expect_kv_with(&p, caps[i], "unmaps", 10);
        expect_kv_with(&p, caps[i], "refcount", 0);
    }
}

Test(process_cache, threads_share_one_mapping_per_handle, .timeout = 20)
{
    /* Eight threads opening four handles 2000 times each: four real maps, one pointer each. */
    struct proc p;
    probe(&p, NO_ENV, "threads", "8");
    expect_quiet_success(&p);
    expect_kv(&p, "errors", 0);
    expect_kv(&p, "ptr_mismatches", 0);
    expect_kv(&p, "maps", 4);
    expect_kv(&p, "unmaps", 0);
}

/* Runs the errors scenario on the driver flavour `driver` (a FAKECUDA_*
 * setting), with and without the preload: each code must be the driver's. */
static void expect_errors_as_driver_alone(const char *driver)
{
    static const struct { const char *key; long long code; } cases[] = {
        { "double_close", 1 }, { "unknown_ptr", 1 }, { "zero_handle", 1 },
        { "flags0_cached", 1 }, { "null_pdptr", 1 }, { "no_ctx_open", 201 },
        { "no_ctx_close", 201 }, { "own_export", 201 }, { "destroyed_ctx_close", 1 },
        { "reopen_after_destroy", 0 }, { "reopen_maps_delta", 1 },
    };
    struct proc with, without;
    probe(&with, ENV(driver), "errors");
    probe(&without, ENV(driver, "LD_PRELOAD="), "errors");
    expect_quiet_success(&with);
    expect_quiet_success(&without);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *key = cases[i].key;
        cr_expect(eq(llong, kv(&with, key), kv(&without, key)),
                  "%s with %s: preloaded vs driver alone", key, driver);
        cr_expect(eq(llong, kv(&with, key), cases[i].code), "%s with %s", key, driver);
    }
}

Test(process_cache, errors_match_the_driver_alone, .timeout = 20)
{
    /* Every error case returns the code the driver returns without the preload. */
    expect_errors_as_driver_alone("FAKECUDA_DRIVER_VERSION=13000");
}

Test(process_cache, no_context_ids_pass_every_call_through, .timeout = 20)
{
    /* A driver without cuCtxGetId (before 12.0): every open and close reaches it, and ipccache says so once, at info level. */
    struct proc p;
    probe(&p, ENV("FAKECUDA_NO_CTXGETID=1", "IPCCACHE_LOG=info"), "openclose", "100");
    cr_assert(eq(int, exit_code(&p), 0), "stdout:\n%s\nstderr:\n%s", p.out, p.err);
    expect_kv(&p, "open_calls", 100);
    expect_kv(&p, "close_calls", 100);
    expect_kv(&p, "maps", 100);
    expect_kv(&p, "unmaps", 100);
    expect_kv(&p, "refcount", 0);
    static const char said[] = "ipccache: the driver has no cuCtxGetId";
    const char *at = strstr(p.err, said);
    cr_assert_not_null(at, "stderr:\n%s", p.err);
    cr_assert_null(strstr(at + strlen(said), said), "said twice:\n%s", p.err);
}

Test(process_cache, no_context_ids_without_info_say_nothing, .timeout = 20)
{
    /* The same at the default log level: quiet. */
    struct proc p;
    probe(&p, ENV("FAKECUDA_NO_CTXGETID=1"), "openclose", "10");
    expect_quiet_success(&p);
    expect_kv(&p, "maps", 10);
}

/* Runs the mixed scenario with `preload` (a LD_PRELOAD= entry, or NULL for
 * the default); the stand-in's counters at exit go to *counters. */
static void run_mixed(struct proc *p, const char *preload, const char *name, char *counters,
                      size_t cap)
{
    char env[PATH_MAX + 32];
    snprintf(env, sizeof(env), "FAKECUDA_COUNTERS_AT_EXIT=%s", tmp_path(counters, cap, name));
    if (preload)
        probe(p, ENV(env, preload), "mixed");
    else
        probe(p, ENV(env), "mixed");
    expect_quiet_success(p);
}

/* Every key=value line (but the pid) the same with the preload as without;
 * returns how many were compared. */
static int expect_same_lines(const struct proc *with, const struct proc *without)
{
    int compared = 0;
    for (const char *line = without->out; *line; line = strchr(line, '\n') + 1) {
        char key[64];
        if (sscanf(line, "%63[^=]=", key) == 1 && strcmp(key, "pid") != 0) {
            cr_expect(eq(llong, kv(with, key), kv(without, key)), "%s", key);
            compared++;
        }
        if (!strchr(line, '\n'))
            break;
    }
    return compared;
}

Test(process_cache, mixed_paths_match_the_driver_alone, .timeout = 20)
{
    /* Opens through the cache and past it, two exports of one allocation: every code, every pointer and what is mapped at exit as without the preload. */
    static struct proc with, without;
    char cw[PATH_MAX], cwo[PATH_MAX], lw[512], lwo[512];
    run_mixed(&with, NULL, "with", cw, sizeof(cw));
    run_mixed(&without, "LD_PRELOAD=", "without", cwo, sizeof(cwo));
    cr_assert_geq(expect_same_lines(&with, &without), 17);
    cr_assert_geq(read_file(cw, lw, sizeof(lw)), 0, "no %s", cw);
    cr_assert_geq(read_file(cwo, lwo, sizeof(lwo)), 0, "no %s", cwo);
    cr_assert_not_null(strstr(lwo, " live=1"), "without: %s", lwo);
    cr_assert_not_null(strstr(lw, " live=1"), "with: %s (without: %s)", lw, lwo);
}

Test(process_cache, unseen_teardown_maps_in_the_new_context, .timeout = 20)
{
    /* A context torn down past the library (destroyed, a primary reset, or destroyed by another
     * thread), a new one at its address: the next open of a handle it had cached is a real map
     * valid in the new context, and every code is the driver's, as without the preload. */
    static const char *const how[] = { "destroy", "reset", "elsewhere" };
    for (size_t i = 0; i < sizeof(how) / sizeof(how[0]); i++) {
        static struct proc with, without;
        probe(&with, NO_ENV, "unseen_teardown", how[i]);
        probe(&without, ENV("LD_PRELOAD="), "unseen_teardown", how[i]);
        expect_quiet_success(&with);
        expect_quiet_success(&without);
        cr_expect(eq(int, expect_same_lines(&with, &without), 11), "%s", how[i]);
        expect_kv(&with, "same_address", 1);
        if (strcmp(how[i], "elsewhere") != 0) {
            expect_kv(&with, "open_a_mapped", 1);
            expect_kv(&with, "a_valid_here", 1);
        }
    }
}

Test(process_cache, eviction_after_an_unseen_teardown_pushes_no_dead_context, .timeout = 20)
{
    /* An idle mapping whose context was destroyed past the library is evicted from another
     * context: the driver answers a push of the dead pointer with success, then aborts the
     * process, so the eviction must tell the context is gone first; codes as without. */
    static struct proc with, without;
    probe(&with, ENV("IPCCACHE_MAX_IDLE_ENTRIES=1"), "unseen_teardown_evict");
    probe(&without, ENV("LD_PRELOAD="), "unseen_teardown_evict");
    expect_quiet_success(&without);
    expect_quiet_success(&with);
    cr_expect(eq(int, expect_same_lines(&with, &without), 5));
    expect_kv(&with, "other_address", 1);
}

Test(process_cache, fork_child_starts_with_an_empty_table, .timeout = 20)
{
    /* A child forked while another thread uses the cache maps for itself and exits cleanly. */
    struct proc p;
    probe(&p, NO_ENV, "fork");
    expect_quiet_success(&p);
    expect_kv(&p, "child_exit", 0);
    expect_kv(&p, "child_open_rc", 0);
    expect_kv(&p, "child_open_calls_delta", 1);   /* a real open, not a parent's entry */
    expect_kv(&p, "child_close_rc", 0);
    expect_kv(&p, "spin_errors", 0);
}

Test(process_cache, fork_while_threads_hit_their_loans_gives_live_children, .timeout = 60)
{
    /* 20 forks while 4 threads hit their loans, unparked, some copied mid-call: every child opens, closes and exits (none waits for a thread it does not have). */
    struct proc p;
    probe(&p, NO_ENV, "fork_hitting");
    expect_quiet_success(&p);
    expect_kv(&p, "children_failed", 0);
    expect_kv(&p, "hit_errors", 0);
}

Test(process_cache, fork_begun_before_start_gets_a_usable_lock, .timeout = 30)
{
    /* A fork begun before the first IPC call, copying the process while a later fork prepares: its child's IPC calls still work. */
    struct proc p;
    probe(&p, NO_ENV, "fork_at_start");
    expect_quiet_success(&p);
    expect_kv(&p, "early_child_exit", 0);
    expect_kv(&p, "late_child_exit", 0);
}

/* Runs "window WHAT" with tests/process/window_lib.c preloaded ahead of ipccache,
 * widening the moment WHAT names. Not under the sanitizer: its runtime
 * intercepts the same calls first and starts before the window can. */
static void run_window_as(struct proc *p, const char *window, const char *what,
                          const char *raise)
{
    if (getenv("IPCC_TEST_PRELOAD_PREFIX"))
        cr_skip_test("the sanitizer's runtime intercepts the calls the window widens");
    char *preload = format("LD_PRELOAD=%s/tests/libwindow.so:%s/libipccache.so", build_dir,
                           build_dir);
    char *mode = format("IPCC_TEST_WINDOW=%s", window);
    probe(p, ENV(preload, mode, raise), "window", what);
    free(preload);
    free(mode);
}

static void run_window(struct proc *p, const char *what)
{
    run_window_as(p, what, what, NULL);
}

/* The window raises SIGUSR2 on the thread in it, where the probe's handler
 * exits or forks. */
static void run_window_raising(struct proc *p, const char *window, const char *what)
{
    char *raise = format("IPCC_TEST_WINDOW_RAISE=%d", SIGUSR2);
    run_window_as(p, window, what, raise);
    free(raise);
}

Test(process_cache, fork_while_registering_exit_handlers_gives_a_live_child, .timeout = 30)
{
    /* A fork while another thread's first IPC call registers ipccache's exit handlers (glibc's lock of them held, widened): the child opens, closes and exits. */
    struct proc p;
    run_window(&p, "atexit");
    expect_quiet_success(&p);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "child_exit", 0);
}

Test(process_cache, fork_while_checking_the_load_order_gives_a_live_child, .timeout = 30)
{
    /* A fork while another thread's lookup of a hooked name walks the loaded objects (the loader's list lock held, widened): the child looks up, opens and exits. */
    struct proc p;
    run_window(&p, "phdr");
    expect_quiet_success(&p);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "child_exit", 0);
}

Test(process_cache, exit_from_a_signal_while_registering_exit_handlers_exits, .timeout = 30)
{
    /* A signal whose handler calls exit(), arriving while ipccache registers its exit handlers (glibc's lock of them held): it waits until the lock is let go, and the process exits with the handler's status. */
    struct proc p;
    run_window_raising(&p, "atexit", "exit_in_atexit");
    cr_expect(eq(int, exit_code(&p), 42), "status %#x; stderr:\n%s", p.status, p.err);
    cr_expect(eq(str, p.err, ""));
}

Test(process_cache, fork_from_a_signal_while_checking_the_load_order_forks, .timeout = 30)
{
    /* A signal whose handler forks, arriving while a lookup walks the loaded objects (inside ipccache's fork guard): the fork waits until the walk is done, and its child exits. */
    struct proc p;
    run_window_raising(&p, "phdr", "fork_in_phdr");
    expect_quiet_success(&p);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "handler_child_exit", 0);
}

Test(process_cache, fork_from_a_signal_inside_the_table_lock_forks, .timeout = 30)
{
    /* A signal whose handler forks, arriving while its thread holds ipccache's table lock (a close): the fork does not wait for the lock (its own thread's), its child exits, and the parent's cache answers after. */
    struct proc p;
    run_window_raising(&p, "lock", "fork_in_lock");
    expect_quiet_success(&p);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "handler_child_exit", 0);
    expect_kv(&p, "same_mapping", 1);
}

/* The probe's alloc_fork scenarios, with tests/process/alloc_lock_lib.c
 * preloaded ahead; under_lock: the allocator calls made under a lock of
 * ipccache's (glibc's own in atexit() is the one that stays). */
static void run_alloc_fork(struct proc *p, const char *what, long under_lock)
{
    char *preload = format("LD_PRELOAD=%s/tests/liballoclock.so:%s/libipccache.so", build_dir,
                           build_dir);
    probe(p, ENV(preload), "window", what);
    free(preload);
    expect_quiet_success(p);
    expect_kv(p, "window_opened", 1);
    expect_kv(p, "child_exit", 0);
    expect_kv(p, "allocs_under_lock", under_lock);
}

Test(process_cache, fork_while_a_miss_allocates_under_the_lock_with_a_later_allocator_handler, .timeout = 30)
{
    /* A fork while another thread's miss allocates holding ipccache's table lock, the allocator's own lock taken by a fork handler registered after ipccache's (POSIX runs it first): the tables' memory is ipccache's own, so the miss needs no allocator lock, the fork completes, its child opens and exits, and no allocator call was made under a lock of ipccache's. */
    if (getenv("IPCC_TEST_PRELOAD_PREFIX"))
        cr_skip_test("the sanitizer's runtime owns the allocator");
    struct proc p;
    run_alloc_fork(&p, "alloc_fork", 0);
}

Test(process_cache, fork_while_registering_exit_handlers_allocates_with_an_earlier_allocator_handler, .timeout = 30)
{
    /* A fork while the first open registers ipccache's exit handler and glibc allocates a new block of them (inside the fork guard), with an allocator whose fork handler registered before ipccache started: the fork handler ipccache registers at start runs first and waits for the guard while the allocator's lock is still free, so the registration completes and the fork does. */
    if (getenv("IPCC_TEST_PRELOAD_PREFIX"))
        cr_skip_test("the sanitizer's runtime owns the allocator");
    struct proc p;
    run_alloc_fork(&p, "alloc_fork_atexit", 1);
}

Test(process_cache, stats_signal_while_installing_reaches_the_programs_handler, .timeout = 20)
{
    /* The stats signal arriving after ipccache's handler is live but before sigaction handed back the program's: the program's handler still runs. */
    struct proc p;
    run_window(&p, "sigaction");
    cr_assert(eq(int, exit_code(&p), 0), "stdout:\n%s\nstderr:\n%s", p.out, p.err);
    expect_kv(&p, "window_opened", 1);
    expect_kv(&p, "app_signals", 1);
}

Test(process_cache, driver_gone_after_exit_handler_is_quiet, .timeout = 20)
{
    /* The driver torn down at exit after ipccache's handler: exit 0, nothing said. */
    struct proc p;
    probe(&p, ENV("FAKECUDA_DEINIT_AT_EXIT=1"), "exitdeinit");
    expect_quiet_success(&p);
}

Test(process_cache, driver_gone_before_exit_handler_is_quiet, .timeout = 20)
{
    /* The driver already down when ipccache's exit handler closes: exit 0, nothing said. */
    struct proc p;
    probe(&p, NO_ENV, "exitdeinit", "now");
    expect_quiet_success(&p);
}

Test(process_cache, exit_from_a_signal_handler_ends_the_process, .timeout = 60)
{
    /* exit() from a handler that interrupted an open or close, often inside the table lock, ends the process every time. */
    for (int i = 0; i < 20; i++) {
        struct proc p;
        probe(&p, NO_ENV, "exitsignal");
        cr_assert(eq(int, exit_code(&p), 0), "run %d %s; stdout:\n%s\nstderr:\n%s", i + 1,
                  exit_code(&p) == TIMED_OUT ? "hung at exit" : "failed", p.out, p.err);
        cr_assert(eq(str, p.out, "looping\n"));
        cr_assert(eq(str, p.err, ""));
    }
}

Test(process_cache, driver_dlclosed_before_exit_stays_callable, .timeout = 20)
{
    /* A program that dlcloses the driver it loaded privately exits cleanly, and the idle mapping is still closed at exit. */
    char counters[PATH_MAX], env[PATH_MAX + 32], line[512];
    snprintf(env, sizeof(env), "FAKECUDA_COUNTERS_AT_EXIT=%s",
             tmp_path(counters, sizeof(counters), "counters"));
    struct proc p;
    probe(&p, ENV(env), "dlclose");
    expect_quiet_success(&p);
    expect_kv(&p, "refcount", 1);   /* idle in the cache when the driver was closed */
    expect_kv(&p, "dlclose_rc", 0);
    cr_assert_geq(read_file(counters, line, sizeof(line)), 0, "no %s", counters);
    cr_assert(eq(int, count_lines(line), 1), "the driver's destructor ran early:\n%s", line);
    cr_assert_not_null(strstr(line, "maps=1 unmaps=1 "), "at exit: %s", line);
    cr_assert_not_null(strstr(line, " live=0"), "at exit: %s", line);
}
