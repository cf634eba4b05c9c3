/*
 * soak_record.h - the run's two CSV files (soak_record.c), a row a second:
 *
 * importers.csv, one row per importer: t_s (seconds since the fleet
 * started), importer (its slot), pid; its own counts from the board (opens:
 * legacy opens; imports: VMM imports; checks, wrong, rc_mismatch: the shadow
 * model's; syncs, rebuilds, forks, resets); the kernel's rss_kib and fds;
 * driver_bytes and driver_allocs, what the stand-in keeps mapped (or
 * imported) for it, bytes and allocations; ghost_bytes, of those the ones
 * their exporter freed or left by exiting; then lib_*, its stats line's keys
 * (empty without the library).
 *
 * machine.csv: t_s; phys_bytes, what the stand-in's memory still holds
 * (allocated, or freed and still mapped); ghost_bytes, of those the ones
 * freed (or of an exporter that exited) that some process still maps;
 * ledger_importers and
 * ledger_exports, the release ledger's slots in use (exports: listed by a
 * live process); exporters_alive,
 * exporter_starts; opens and imports, the fleet's totals.
 */
#ifndef IPCCACHE_TESTS_SOAK_RECORD_H
#define IPCCACHE_TESTS_SOAK_RECORD_H

#include "soak.h"
#include "soak_sample.h"

struct soak_record {
    FILE *importers, *machine;
    char stats_dir[4096], ledger[4200];
};

void soak_record_open(struct soak_record *r, const char *out);
/* Asks every importer for its stats line (library: it is preloaded, else
 * the signal would end them); the row, a moment later, reads them. */
void soak_record_ask(struct soak_board *b, int library);
void soak_record_row(struct soak_record *r, struct soak_board *b, double t, int alive, int starts);

#endif
