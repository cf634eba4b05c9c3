/*
 * soak_record.c - the run's CSV files, a row per importer and one for the
 * machine every second (soak_record.h says what each column is).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "ledger_impl.h"
#include "soak_record.h"

#define COUNT(field) soak_importer_sum(s, offsetof(struct soak_counts, field))

static struct soak_lib_sample last[SOAK_MAX_IMPORTERS];

void soak_record_open(struct soak_record *r, const char *out)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/importers.csv", out);
    r->importers = fopen(path, "we");
    snprintf(path, sizeof(path), "%s/machine.csv", out);
    r->machine = fopen(path, "we");
    if (!r->importers || !r->machine) {
        perror("soak: the CSV files");
        exit(2);
    }
    snprintf(r->stats_dir, sizeof(r->stats_dir), "%s/stats", out);
    snprintf(r->ledger, sizeof(r->ledger), "%s/xdg/ipccache/%s", out, IPCC_LEDGER_NAME);
    fprintf(r->importers, "t_s,importer,pid,opens,imports,checks,wrong,rc_mismatch,syncs,rebuilds,"
                          "forks,resets,rss_kib,fds,fd_limit,driver_bytes,driver_allocs,ghost_bytes");
    soak_sample_lib_header(r->importers);
    fputc('\n', r->importers);
    fprintf(r->machine, "t_s,phys_bytes,ghost_bytes,ledger_importers,ledger_exports,exporters_alive,"
                        "exporter_starts,opens,imports\n");
}

/* Slots of the release ledger in use: importers' and exports' (0 without the
 * file). A let-go export entry is free to any new export: not in use. */
static void ledger_slots(const char *path, int *importers, int *exports)
{
    *importers = *exports = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(struct ipcc_ledger_file)) {
        close(fd);
        return;
    }
    const struct ipcc_ledger_file *l = mmap(NULL, sizeof(*l), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (l == MAP_FAILED)
        return;
    for (int i = 0; i < IPCC_LEDGER_IMPORTERS; i++)
        *importers += atomic_load(&l->importers[i].pid) != 0;
    /* A dead exporter's listings are free to any export that finds no free
     * or let-go entry (shim/ledger/ledger.c), and are taken last so that an
     * import of its handles still learns its exporter is gone: they are not
     * held, and grow with the kills (1,588 with no exporter alive at the
     * end of seed 3's quick run). */
    for (int i = 0; i < IPCC_LEDGER_EXPORTS; i++) {
        int32_t pid = atomic_load(&l->exports[i].pid);
        *exports += pid > 0 && atomic_load(&l->exports[i].ready) != IPCC_EXPORT_LET_GO &&
                    (kill(pid, 0) == 0 || errno == EPERM);
    }
    munmap((void *)l, sizeof(*l));
}

void soak_record_ask(struct soak_board *b, int library)
{
    for (unsigned i = 0; library && i < b->nimporters; i++) {
        pid_t pid = atomic_load(&b->imp[i].pid);
        if (pid > 0)
            soak_sample_ask(pid);
    }
}

void soak_record_row(struct soak_record *r, struct soak_board *b, double t, int alive, int starts)
{
    uint64_t opens = 0, imports = 0;
    for (unsigned i = 0; i < b->nimporters; i++) {
        const struct soak_importer_slot *s = &b->imp[i];
        pid_t pid = atomic_load(&s->pid);
        struct soak_proc_sample p;
        struct fakecuda_held held;
        char path[4200];
        soak_sample_proc(pid, &p);
        fakecuda_phys_held(pid, &held);
        snprintf(path, sizeof(path), "%s/imp-%d", r->stats_dir, (int)pid);
        soak_sample_read_stats(path, &last[i]);
        opens += COUNT(opens);
        imports += COUNT(imports);
        fprintf(r->importers, "%.1f,%u,%d,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%d,%llu,%llu,%llu",
                t, i, (int)pid, (unsigned long long)COUNT(opens), (unsigned long long)COUNT(imports),
                (unsigned long long)COUNT(checks), (unsigned long long)COUNT(wrong),
                (unsigned long long)COUNT(rc_mismatch), (unsigned long long)COUNT(syncs),
                (unsigned long long)COUNT(rebuilds), (unsigned long long)COUNT(forks),
                (unsigned long long)COUNT(resets), (unsigned long long)p.rss_kib,
                (unsigned long long)p.fds, (int)atomic_load(&s->fd_limit),
                (unsigned long long)held.bytes, (unsigned long long)held.allocs,
                (unsigned long long)held.ghost_bytes);
        soak_sample_lib_row(r->importers, &last[i]);
        fputc('\n', r->importers);
    }
    int li, le;
    ledger_slots(r->ledger, &li, &le);
    fprintf(r->machine, "%.1f,%llu,%llu,%d,%d,%d,%d,%llu,%llu\n", t,
            (unsigned long long)fakecuda_phys_bytes(), (unsigned long long)fakecuda_phys_ghost_total(),
            li, le, alive, starts,
            (unsigned long long)opens, (unsigned long long)imports);
    fflush(r->importers);
    fflush(r->machine);
}
