/*
 * exporter_exit.c - what the driver answers to cuIpcOpenMemHandle of a handle
 * whose exporter has exited. For tests/gpu/run.sh.
 *
 *   exporter_exit [--settle-ms MS]
 *
 * The parent never touches CUDA; each role is a forked child that does, and
 * takes commands on a pipe (export, open HEX, close PTR, exit). The cases:
 *
 *   unheld_zombie   the exporter exited, not yet reaped; nobody maps its export
 *   unheld_reaped   the same, reaped
 *   held_before     an importer (H) opens while the exporter lives
 *   other_after     the exporter exited and was reaped while H maps it: a
 *                   fresh importer opens it
 *   same_held_after H opens it again while it still maps it
 *   same_reopen_after H closed every reference, then opens it again
 *
 * One line per case: case=NAME rc=N name=CUDA_ERROR_... value_ok=0|1|-
 * (value_ok: the first word reads as the exporter's pattern). MS (default
 * 1500) is waited after each exit, longer than an importer's helper takes to
 * let go of an exited exporter's idle mappings.
 */
#define _GNU_SOURCE
#include <cuda.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PATTERN 0xa5
#define BYTES (64u << 20)

struct role { pid_t pid; FILE *to, *from; };

static void to_hex(const CUipcMemHandle *h, char *out)
{
    for (size_t i = 0; i < sizeof(h->reserved); i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static int from_hex(const char *in, CUipcMemHandle *h)
{
    for (size_t i = 0; i < sizeof(h->reserved); i++)
        if (sscanf(in + 2 * i, "%2hhx", (unsigned char *)&h->reserved[i]) != 1)
            return 0;
    return 1;
}

static void do_export(void)
{
    CUdeviceptr p = 0;
    CUipcMemHandle h;
    char hex[2 * sizeof(h.reserved) + 1];
    if (cuMemAlloc(&p, BYTES) != CUDA_SUCCESS || cuMemsetD8(p, PATTERN, BYTES) != CUDA_SUCCESS ||
        cuCtxSynchronize() != CUDA_SUCCESS || cuIpcGetMemHandle(&h, p) != CUDA_SUCCESS) {
        printf("error\n");
        fflush(stdout);
        return;
    }
    to_hex(&h, hex);
    printf("%s\n", hex);
    fflush(stdout);
}

/* rc, the pointer, and whether its first word is the pattern (-1: not read). */
static void do_open(const char *hex)
{
    CUipcMemHandle h;
    CUdeviceptr p = 0;
    unsigned int word = 0;
    if (!from_hex(hex, &h)) {
        printf("rc=999 ptr=0 value_ok=-1\n");
        fflush(stdout);
        return;
    }
    CUresult rc = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    int ok = -1;
    if (rc == CUDA_SUCCESS)
        ok = cuMemcpyDtoH(&word, p, sizeof(word)) == CUDA_SUCCESS && word == 0xa5a5a5a5u;
    printf("rc=%d ptr=%llu value_ok=%d\n", (int)rc, (unsigned long long)p, ok);
    fflush(stdout);
}

/* A role's loop: one command a line on stdin, one answer a line on stdout. */
static void serve(void)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        exit(3);
    char line[256];
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = '\0';
        if (!strcmp(line, "export")) {
            do_export();
        } else if (!strncmp(line, "open ", 5)) {
            do_open(line + 5);
        } else if (!strncmp(line, "close ", 6)) {
            CUresult rc = cuIpcCloseMemHandle((CUdeviceptr)strtoull(line + 6, NULL, 10));
            printf("rc=%d\n", (int)rc);
            fflush(stdout);
        } else if (!strcmp(line, "exit")) {
            exit(0); /* the library's exit handlers run, as at a program's end */
        }
    }
    exit(0);
}

static struct role spawn(void)
{
    int down[2], up[2];
    struct role r = { -1, NULL, NULL };
    if (pipe(down) != 0 || pipe(up) != 0)
        exit(2);
    fflush(stdout);
    r.pid = fork();
    if (r.pid == 0) {
        dup2(down[0], 0);
        dup2(up[1], 1);
        close(down[0]); close(down[1]); close(up[0]); close(up[1]);
        serve();
    }
    close(down[0]);
    close(up[1]);
    r.to = fdopen(down[1], "w");
    r.from = fdopen(up[0], "r");
    return r;
}

static void ask(struct role *r, const char *cmd, char *answer, size_t cap)
{
    fprintf(r->to, "%s\n", cmd);
    fflush(r->to);
    if (!fgets(answer, (int)cap, r->from))
        snprintf(answer, cap, "rc=998 ptr=0 value_ok=-1");
    answer[strcspn(answer, "\n")] = '\0';
}

static void exit_role(struct role *r, int reap)
{
    fprintf(r->to, "exit\n");
    fflush(r->to);
    fclose(r->to);
    fclose(r->from);
    if (reap) {
        waitpid(r->pid, NULL, 0);
        return;
    }
    /* Not reaped: wait until it is a zombie. */
    for (int i = 0; i < 1000; i++) {
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)r->pid);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        char *p = strrchr(buf, ')');
        if (p && p[1] == ' ' && p[2] == 'Z')
            return;
        usleep(10000);
    }
}

/* "rc=N ptr=P value_ok=V" -> the case's line, with the error's name. */
static void report(const char *name, const char *answer, unsigned long long *ptr)
{
    int rc = 998, ok = -1;
    unsigned long long p = 0;
    sscanf(answer, "rc=%d ptr=%llu value_ok=%d", &rc, &p, &ok);
    const char *ename = NULL;
    if (cuGetErrorName((CUresult)rc, &ename) != CUDA_SUCCESS || !ename)
        ename = "?";
    printf("case=%s rc=%d name=%s value_ok=%s\n", name, rc, ename,
           ok < 0 ? "-" : ok ? "1" : "0");
    fflush(stdout);
    if (ptr)
        *ptr = p;
}

int main(int argc, char **argv)
{
    useconds_t settle = 1500 * 1000;
    if (argc == 3 && !strcmp(argv[1], "--settle-ms"))
        settle = (useconds_t)atoi(argv[2]) * 1000;
    char hex[256], cmd[300], answer[256];
    unsigned long long p1 = 0, p2 = 0, p3 = 0;

    struct role e = spawn(), i = spawn();
    ask(&e, "export", hex, sizeof(hex));
    exit_role(&e, 0);
    usleep(settle);
    snprintf(cmd, sizeof(cmd), "open %s", hex);
    ask(&i, cmd, answer, sizeof(answer));
    report("unheld_zombie", answer, &p1);
    waitpid(e.pid, NULL, 0);
    ask(&i, cmd, answer, sizeof(answer));
    report("unheld_reaped", answer, &p2);

    struct role e2 = spawn(), h = spawn(), j = spawn();
    ask(&e2, "export", hex, sizeof(hex));
    snprintf(cmd, sizeof(cmd), "open %s", hex);
    ask(&h, cmd, answer, sizeof(answer));
    report("held_before", answer, &p1);
    exit_role(&e2, 1);
    usleep(settle);
    ask(&j, cmd, answer, sizeof(answer));
    report("other_after", answer, &p3);
    ask(&h, cmd, answer, sizeof(answer));
    report("same_held_after", answer, &p2);
    char close_cmd[64];
    if (p2) {
        snprintf(close_cmd, sizeof(close_cmd), "close %llu", p2);
        ask(&h, close_cmd, answer, sizeof(answer));
    }
    snprintf(close_cmd, sizeof(close_cmd), "close %llu", p1);
    ask(&h, close_cmd, answer, sizeof(answer));
    usleep(settle);
    ask(&h, cmd, answer, sizeof(answer));
    report("same_reopen_after", answer, NULL);

    exit_role(&i, 1);
    exit_role(&h, 1);
    exit_role(&j, 1);
    return 0;
}
