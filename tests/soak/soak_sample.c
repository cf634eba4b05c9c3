/*
 * soak_sample.c - a process's sample: /proc for RSS and fds, the library's
 * stats line for its own figures (soak_sample.h).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "soak_sample.h"

#define SOAK_KEY_NAME(k) #k,
static const char *const lib_keys[SOAK_NLIB] = { SOAK_LIB_KEYS(SOAK_KEY_NAME) };

void soak_sample_proc(pid_t pid, struct soak_proc_sample *out)
{
    char path[64];
    long pages = 0, rss = 0;
    memset(out, 0, sizeof(*out));
    snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    out->alive = fscanf(f, "%ld %ld", &pages, &rss) == 2;
    fclose(f);
    out->rss_kib = (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        out->fds += e->d_name[0] != '.';
    closedir(d);
}

void soak_sample_ask(pid_t pid)
{
    kill(pid, SIGUSR1);
}

/* The value of "key": in a JSON line of numbers; 0 when absent. */
static uint64_t field(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(line, pat);
    return p ? strtoull(p + strlen(pat), NULL, 10) : 0;
}

void soak_sample_read_stats(const char *path, struct soak_lib_sample *out)
{
    static char buf[1 << 16];
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n > 0 && ftruncate(fd, 0) != 0)
        n = 0;
    close(fd);
    if (n <= 0)
        return;
    buf[n] = '\0';
    while (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    char *line = strrchr(buf, '\n');
    line = line ? line + 1 : buf;
    if (strncmp(line, "{", 1) != 0 || buf[n - 1] != '}')
        return; /* a line being written; the next second's will do */
    out->have = 1;
    for (int i = 0; i < SOAK_NLIB; i++)
        out->v[i] = field(line, lib_keys[i]);
}

void soak_sample_lib_header(FILE *f)
{
    for (int i = 0; i < SOAK_NLIB; i++)
        fprintf(f, ",lib_%s", lib_keys[i]);
}

void soak_sample_lib_row(FILE *f, const struct soak_lib_sample *s)
{
    for (int i = 0; i < SOAK_NLIB; i++) {
        if (s->have)
            fprintf(f, ",%llu", (unsigned long long)s->v[i]);
        else
            fputc(',', f);
    }
}
