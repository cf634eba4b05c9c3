/*
 * soak_sample.h - what a soak samples of a process, every second: the
 * kernel's view (RSS, open fds) and the library's own (its stats line, asked
 * with the stats signal and read from IPCCACHE_STATS_FILE). Nothing here
 * knows the stand-in: the GPU soak can sample the same way and add the
 * device's view beside it.
 */
#ifndef IPCCACHE_TESTS_SOAK_SAMPLE_H
#define IPCCACHE_TESTS_SOAK_SAMPLE_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* The stats line's keys a sample keeps, in CSV order ("lib_" before each). */
#define SOAK_LIB_KEYS(X) X(opens) X(hits) X(misses) X(live) X(idle) X(idle_bytes) \
    X(vmm_imports) X(vmm_import_hits) X(vmm_maps) X(vmm_map_hits) X(evictions) \
    X(invalidations) X(releases_on_request) X(ghost_bytes) X(errors) X(mem_bytes) X(vmm_fds)
#define SOAK_COUNT_KEY(k) +1
enum { SOAK_NLIB = 0 SOAK_LIB_KEYS(SOAK_COUNT_KEY) };

struct soak_proc_sample {
    int alive;
    uint64_t rss_kib, fds;
};

struct soak_lib_sample {
    int have;                 /* a stats line was read */
    uint64_t v[SOAK_NLIB];
};

/* RSS and open fds of pid (alive 0 when it is gone). */
void soak_sample_proc(pid_t pid, struct soak_proc_sample *out);

/* Asks pid for its stats line (the library's default stats signal). */
void soak_sample_ask(pid_t pid);
/* The last line of the stats file at path, which is then emptied (a run of
 * hours would otherwise fill it); *out keeps its old values when there is none. */
void soak_sample_read_stats(const char *path, struct soak_lib_sample *out);

/* CSV: the header's library columns, and a sample's. */
void soak_sample_lib_header(FILE *f);
void soak_sample_lib_row(FILE *f, const struct soak_lib_sample *s);

#endif
