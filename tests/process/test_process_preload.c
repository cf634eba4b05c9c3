/*
 * test_process_preload.c - the preload itself: a program that never uses IPC, the lookups, another
 * interposer of the same calls (fresh processes under LD_PRELOAD; process_run.c runs them).
 */
#include "process_run.h"

/* ---- the preload itself -------------------------------------------------- */

TestSuite(process_preload, .init = tu_process_init, .fini = tu_process_fini);

Test(process_preload, unrelated_program_is_untouched, .timeout = 20)
{
    /* A program that never touches CUDA runs exactly as without the preload. */
    struct proc p;
    run(&p, ARGS("/bin/echo", "hi"), NO_ENV);
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(str, p.out, "hi\n"));
    cr_assert(eq(str, p.err, ""));
}

Test(process_preload, sanitizer_runtime_starts_under_the_preload, .timeout = 20)
{
    /* A ThreadSanitizer program, whose runtime calls dlsym before it can serve pthread calls, runs normally. */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/tests/hello_tsan", build_dir);
    if (getenv("IPCC_TEST_PRELOAD_PREFIX") || access(path, X_OK) != 0)
        cr_skip_test("needs the plain library and build/tests/hello_tsan");
    struct proc p;
    run(&p, ARGS(path), NO_ENV);
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(str, p.out, "hello\n"));
}

Test(process_preload, ctypes_lookup_gets_the_hook, .timeout = 20)
{
    /* Python's ctypes (Numba's way to the driver) dlsyms the IPC open and gets ipccache's wrapper. */
    static const char script[] =
        "import ctypes\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [('fname', ctypes.c_char_p), ('fbase', ctypes.c_void_p),\n"
        "                ('sname', ctypes.c_char_p), ('saddr', ctypes.c_void_p)]\n"
        "f = ctypes.CDLL('libcuda.so.1').cuIpcOpenMemHandle_v2\n"
        "info = Info()\n"
        "ctypes.CDLL(None).dladdr(ctypes.cast(f, ctypes.c_void_p), ctypes.byref(info))\n"
        "print(info.fname.decode().rsplit('/', 1)[-1])\n";
    if (access("/usr/bin/python3", X_OK) != 0)
        cr_skip_test("needs /usr/bin/python3");
    struct proc p;
    run(&p, ARGS("/usr/bin/python3", "-c", script), NO_ENV);
    cr_assert(eq(int, exit_code(&p), 0), "stderr:\n%s", p.err);
    cr_assert(eq(str, p.out, "libipccache.so\n"));
}

Test(process_preload, cuda_without_ipc_leaves_no_trace, .timeout = 20)
{
    /* A CUDA program that never opens an IPC handle gets no message and no signal handler. */
    struct proc p;
    probe(&p, NO_ENV, "noipc");
    expect_quiet_success(&p);
    expect_kv_str(&p, "sigusr1", "default");
    expect_kv_str(&p, "sigusr2", "default");
    char userdir[PATH_MAX];
    cr_assert_neq(access(tmp_path(userdir, sizeof(userdir), "ipccache"), F_OK), 0,
                  "%s was created", userdir);
}

Test(process_preload, cudart_lookups_get_the_hooks, .timeout = 20)
{
    /* dlsym and cuGetProcAddress hand out ipccache's wrappers for the hooked names only. */
    struct proc p;
    probe(&p, NO_ENV, "cudart_sequence");
    expect_quiet_success(&p);
    expect_kv(&p, "resolver_is_hooked", 1);
    expect_kv(&p, "open_is_hooked", 1);
    expect_kv(&p, "open_v1_is_hooked", 1);
    expect_kv(&p, "close_is_hooked", 1);
    expect_kv(&p, "ctx_destroy_is_hooked", 1);
    expect_kv(&p, "dlsym_open_is_hooked", 1);
    expect_kv(&p, "init_is_hooked", 0);
    expect_kv(&p, "dlsym_init_is_hooked", 0);
}

Test(process_preload, disabled_lookups_get_the_driver, .timeout = 20)
{
    /* With IPCCACHE_DISABLE=1 every lookup answers the driver's own function. */
    struct proc p;
    probe(&p, ENV("IPCCACHE_DISABLE=1"), "cudart_sequence");
    expect_quiet_success(&p);
    expect_kv(&p, "resolver_is_hooked", 0);
    expect_kv(&p, "open_is_hooked", 0);
    expect_kv(&p, "dlsym_open_is_hooked", 0);
}

/* ---- another interposer of the same calls --------------------------------- */

/* Runs "interposed 10" with ipccache and tests/<other> preloaded, ipccache
 * first or second (after the sanitizer runtime, if any); the program looks
 * the IPC calls up through the resolver when the interposer hooks that. */
static void run_interposed(struct proc *p, const char *other, int ipccache_first)
{
    const char *path = strstr(other, "resolver") ? "resolver" : "linked";
    const char *prefix = getenv("IPCC_TEST_PRELOAD_PREFIX");
    char self[PATH_MAX + 32], them[PATH_MAX + 64];
    snprintf(self, sizeof(self), "%s/libipccache.so", build_dir);
    snprintf(them, sizeof(them), "%s/tests/%s", build_dir, other);
    char *preload = format("LD_PRELOAD=%s%s%s:%s", prefix && *prefix ? prefix : "",
                           prefix && *prefix ? ":" : "", ipccache_first ? self : them,
                           ipccache_first ? them : self);
    probe(p, ENV(preload), "interposed", "10", path);
    free(preload);
}

/* The interposers that find their next function by RTLD_NEXT, through the
 * driver's handle and through the linked resolver, and the one that hooks
 * the resolver. */
static const char *const interposers[] = {
    "libinterposer_next.so", "libinterposer_handle.so", "libinterposer_getproc.so",
    "libinterposer_resolver.so",
};

/* Runs every interposer in the given order; the program's open is ours or
 * the interposer's, which sees `calls` opens and as many closes of the
 * program's ten (the driver: one open, one mapping, kept idle). */
static void expect_interposed(int ipccache_first, long long calls)
{
    for (size_t i = 0; i < sizeof(interposers) / sizeof(interposers[0]); i++) {
        const char *name = interposers[i];
        struct proc p;
        run_interposed(&p, name, ipccache_first);
        cr_assert(eq(int, exit_code(&p), 0), "%s; stdout:\n%s\nstderr:\n%s", name, p.out, p.err);
        cr_assert(eq(str, p.err, ""), "%s", name);
        expect_kv_with(&p, name, "interposer_reentries", 0);
        expect_kv_with(&p, name, "open_is_hooked", ipccache_first);
        expect_kv_with(&p, name, "interposer_opens", calls);
        expect_kv_with(&p, name, "interposer_closes", ipccache_first ? 0 : calls);
        expect_kv_with(&p, name, "open_calls", 1);
        expect_kv_with(&p, name, "maps", 1);
        expect_kv_with(&p, name, "refcount", 1);
    }
}

Test(process_preload, interposer_after_ipccache_gets_the_driver, .timeout = 20)
{
    /* Preloaded after ipccache, another interposer's lookups of its next function find the driver: no loop, and it sees only the cache's one miss. */
    expect_interposed(1, 1);
}

Test(process_preload, interposer_before_ipccache_gets_the_cache, .timeout = 20)
{
    /* Preloaded before ipccache, another interposer sees every call and its next function is ipccache's: ten opens, one real map. */
    expect_interposed(0, 10);
}
