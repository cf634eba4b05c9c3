/*
 * fuzz_ledger.c - the differential fuzzer's cross-process part: the release
 * ledger's exporter side with real processes (tests/fuzz/fuzz.c runs it after the
 * threads, in some seeds).
 *
 * The fuzz process forks one exporter and one to three importers, each
 * serving commands on a pipe, and plays a random sequence: allocate and
 * export, open in an importer, close there, free in the exporter, the
 * exporter's primary context reset (which frees all its allocations), an
 * importer's exit or kill. After each step it prints the return code and the
 * bytes the stand-in's book says are still physically allocated
 * (FAKECUDA_PHYS_DIR, a folder of its own). Without the library an idle
 * mapping does not exist; with it the exporter's free must make its importers
 * let go before it returns, so the two runs print the same bytes.
 * fuzz.sh sets IPCCACHE_RELEASE_WAIT_MS high enough that a slow importer
 * is always waited for. An open after the exporter's free is left out: the
 * stand-in lets it succeed (it cannot see another process's free), which a
 * GPU would not, and nothing would then tell the cache the memory is gone.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuzz.h"

#define PEERS 4          /* the exporter and up to three importers */
#define ALLOCS 4
#define STEPS 24
#define HANDLE_BYTES CU_IPC_HANDLE_SIZE

enum { CMD_ALLOC, CMD_FREE, CMD_OPEN, CMD_CLOSE, CMD_RESET, CMD_EXIT };

struct cmd { int op, arg; unsigned char handle[HANDLE_BYTES]; };
struct answer { int rc, idx; unsigned char handle[HANDLE_BYTES]; };

static struct {
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*get_handle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*open)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*close)(CUdeviceptr);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*reset)(CUdevice);
    uint64_t (*phys)(void);
} d;

struct peer { pid_t pid; int to, from; int gone; };

/* ---- a peer: one process, its commands on a pipe ---------------------- */

static void serve(int in, int out)
{
    CUdeviceptr ptrs[STEPS];
    int n = 0;
    CUcontext ctx;
    if (d.retain(&ctx, 0) != CUDA_SUCCESS || d.set_current(ctx) != CUDA_SUCCESS)
        _exit(3);
    for (struct cmd c; read(in, &c, sizeof(c)) == (ssize_t)sizeof(c);) {
        struct answer a = { 0, -1, { 0 } };
        CUipcMemHandle h;
        CUdeviceptr p = 0;
        switch (c.op) {
        case CMD_ALLOC:
            a.rc = d.alloc(&p, (size_t)(c.arg + 1) << 20);
            if (a.rc == CUDA_SUCCESS)
                a.rc = d.get_handle(&h, p);
            if (a.rc == CUDA_SUCCESS)
                memcpy(a.handle, h.reserved, HANDLE_BYTES);
            break;
        case CMD_OPEN:
            memcpy(h.reserved, c.handle, HANDLE_BYTES);
            a.rc = d.open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
            break;
        case CMD_FREE:
            a.rc = d.free(ptrs[c.arg]);
            break;
        case CMD_CLOSE:
            a.rc = d.close(ptrs[c.arg]);
            break;
        case CMD_RESET: /* and a new primary context, for the allocations to come */
            a.rc = d.reset(0);
            if (a.rc == CUDA_SUCCESS)
                a.rc = d.retain(&ctx, 0);
            if (a.rc == CUDA_SUCCESS)
                a.rc = d.set_current(ctx);
            break;
        default:
            exit(0); /* exit handlers run, as at a program's end */
        }
        if (p && a.rc == CUDA_SUCCESS && n < STEPS) {
            a.idx = n;
            ptrs[n++] = p;
        }
        if (write(out, &a, sizeof(a)) != (ssize_t)sizeof(a))
            _exit(4);
    }
    _exit(0);
}

static void start_peer(struct peer *p)
{
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0)
        die("pipe failed");
    fflush(stdout);
    p->pid = fork();
    if (p->pid < 0)
        die("fork failed");
    if (p->pid == 0) {
        close(to[1]);
        close(from[0]);
        serve(to[0], from[1]);
    }
    close(to[0]);
    close(from[1]);
    p->to = to[1];
    p->from = from[0];
    p->gone = 0;
}

static struct answer ask(struct peer *p, struct cmd c)
{
    struct answer a = { -1, -1, { 0 } };
    if (write(p->to, &c, sizeof(c)) != (ssize_t)sizeof(c) ||
        read(p->from, &a, sizeof(a)) != (ssize_t)sizeof(a))
        die("a ledger peer stopped answering");
    return a;
}

static void end_peer(struct peer *p, int kill_it)
{
    if (p->gone)
        return;
    if (kill_it)
        kill(p->pid, SIGKILL);
    else if (write(p->to, &(struct cmd){ .op = CMD_EXIT }, sizeof(struct cmd)) < 0)
        die("a ledger peer is gone");
    waitpid(p->pid, NULL, 0);
    close(p->to);
    close(p->from);
    p->gone = 1;
}

/* ---- the sequence --------------------------------------------------------- */

static struct {
    int n;
    struct { int exp_idx, freed; unsigned char handle[HANDLE_BYTES]; } a[ALLOCS];
    /* per importer: its open of each allocation (index, or -1) */
    int opened[PEERS][ALLOCS];
} st;

/* Through dlsym, whatever path the seed chose for the threads: every name
 * here exists under this spelling in the stand-in. */
static void load(void)
{
    d.alloc = driver_symbol("cuMemAlloc_v2");
    d.free = driver_symbol("cuMemFree_v2");
    d.get_handle = driver_symbol("cuIpcGetMemHandle");
    d.open = driver_symbol("cuIpcOpenMemHandle_v2");
    d.close = driver_symbol("cuIpcCloseMemHandle");
    d.retain = driver_symbol("cuDevicePrimaryCtxRetain");
    d.set_current = driver_symbol("cuCtxSetCurrent");
    d.reset = driver_symbol("cuDevicePrimaryCtxReset_v2");
    d.phys = (uint64_t (*)(void))driver_symbol("fakecuda_phys_bytes");
}

static void step(struct peer *peers, int nimp, uint64_t *s, int k)
{
    struct peer *exp = &peers[0];
    int i = 1 + (int)pick(s, (unsigned)nimp), a = (int)pick(s, ALLOCS);
    struct peer *imp = &peers[i];
    struct answer r = { 0, -1, { 0 } };
    const char *what = "nothing";
    unsigned kind = pick(s, 10);
    if (kind < 2 && st.n < ALLOCS) {
        r = ask(exp, (struct cmd){ .op = CMD_ALLOC, .arg = st.n });
        st.a[st.n].exp_idx = r.idx;
        memcpy(st.a[st.n].handle, r.handle, HANDLE_BYTES);
        a = st.n++;
        what = "alloc";
    } else if (a >= st.n) {
    } else if (kind < 5 && !imp->gone && st.opened[i][a] < 0 && !st.a[a].freed) {
        struct cmd c = { .op = CMD_OPEN };
        memcpy(c.handle, st.a[a].handle, HANDLE_BYTES);
        r = ask(imp, c);
        st.opened[i][a] = r.idx;
        what = "open";
    } else if (kind < 8 && !imp->gone && st.opened[i][a] >= 0) {
        r = ask(imp, (struct cmd){ .op = CMD_CLOSE, .arg = st.opened[i][a] });
        st.opened[i][a] = -1;
        what = "close";
    } else if (kind < 9 && !st.a[a].freed && st.a[a].exp_idx >= 0) {
        r = ask(exp, (struct cmd){ .op = CMD_FREE, .arg = st.a[a].exp_idx });
        st.a[a].freed = 1;
        what = "free";
    } else if (kind == 9 && pick(s, 3) == 0) {
        r = ask(exp, (struct cmd){ .op = CMD_RESET });
        for (int j = 0; j < st.n; j++)
            st.a[j].freed = 1;
        what = "exporter's reset";
    } else if (kind == 9 && !imp->gone) {
        end_peer(imp, pick(s, 2) == 0);
        what = "importer ends";
    }
    printf("ledger %d: importer %d alloc %d %s rc=%d phys=%llu\n", k, i, a, what, r.rc,
           (unsigned long long)d.phys());
}

/* One exporter, nimp importers, STEPS steps; the book's folder is removed. */
void ledger_peers(uint64_t seed)
{
    uint64_t s = seed ^ 0x1ed6e5ULL;
    /* A quarter of the seeds. Not under ASan: its allocator has no fork
     * handlers, and the library's helper thread may be in malloc. */
#if defined(__SANITIZE_ADDRESS__)
    return;
#endif
    if (pick(&s, 4) != 0)
        return;
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof(path), "%s/ipccache-fuzz-ledger-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(path))
        die("mkdtemp failed");
    setenv("FAKECUDA_PHYS_DIR", path, 1);
    load();
    int nimp = 1 + (int)pick(&s, PEERS - 1);
    struct peer peers[PEERS];
    memset(&st, 0, sizeof(st));
    memset(st.opened, -1, sizeof(st.opened));
    for (int i = 0; i <= nimp; i++)
        start_peer(&peers[i]);
    printf("ledger: %d importer(s)\n", nimp);
    for (int k = 0; k < STEPS; k++)
        step(peers, nimp, &s, k);
    for (int i = nimp; i >= 0; i--)
        end_peer(&peers[i], 0);
    printf("ledger: end phys=%llu\n", (unsigned long long)d.phys());
    fflush(stdout);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    if (system(cmd) != 0)
        die("cannot remove %s", path);
    unsetenv("FAKECUDA_PHYS_DIR");
}
