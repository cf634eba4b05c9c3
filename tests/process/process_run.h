/*
 * process_run.h - what the process tests share (process_run.c): a fresh
 * process run in a controlled environment, and what it printed read back.
 * The suites test_process_*.c are one Criterion binary, build/tests/test_process;
 * test_process_X.c's suite is process_X, set up and cleaned by the two below.
 */
#ifndef IPCC_PROCESS_RUN_H
#define IPCC_PROCESS_RUN_H

#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OUTPUT_CAP (64 * 1024)
#define RUN_LIMIT_S 15      /* below the tests' own 20 s timeout */
#define MAX_ENV 32
#define TIMED_OUT (-1)

/* Each process suite's .init and .fini: the build folder found and a fresh
 * tmpdir for each test; that folder and the library's per-user folder in it
 * removed. */
void tu_process_init(void);
void tu_process_fini(void);

struct proc {
    pid_t pid;
    int status;                 /* from waitpid; TIMED_OUT if killed by us */
    char out[OUTPUT_CAP];
    char err[OUTPUT_CAP];
};

#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define ENV(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define NO_ENV ENV(NULL)

/* Runs the probe: probe(&p, ENV(...), "scenario", args...). */
#define probe(p, extra, ...) run_probe(p, extra, ARGS(__VA_ARGS__))

/* Criterion's str tag wants char *; it only reads the strings. */
#define STR(s) ((char *)(s))

extern char build_dir[PATH_MAX];
extern char tmpdir[256];

char *tmp_path(char *buf, size_t cap, const char *name);
char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void run(struct proc *p, const char *const *argv, const char *const *extra);
void run_probe(struct proc *p, const char *const *extra, const char *const *args);
int exit_code(const struct proc *p);
int count_lines(const char *s);
long long kv(const struct proc *p, const char *key);
const char *kv_str(const struct proc *p, const char *key, char *buf, size_t cap);
unsigned long long json_u64(const char *line, const char *key);
ssize_t read_file(const char *path, char *buf, size_t cap);
void expect_quiet_success(const struct proc *p);
void expect_kv(const struct proc *p, const char *key, long long want);
void expect_kv_with(const struct proc *p, const char *setting, const char *key, long long want);
void expect_kv_str(const struct proc *p, const char *key, const char *want);
void expect_stats_file(const char *path, unsigned long long n);
const char *stats_file_env(char *buf, size_t cap, const char *name);

#endif
