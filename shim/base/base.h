/*
 * base.h - the basics every layer uses, the folder's interface: settings,
 * messages, the table lock, text without stdio, the per-user folder, a small
 * key set, processes, the marks on the library's own fds, and the real driver, each module's header below; and
 * the few basics they all share. Nothing here calls up: the hook table's rows
 * are the entry layer's, registered with driver.c at load (entry/wiring.c).
 * No CUDA header: the pure tables include this.
 */
#ifndef IPCC_BASE_H
#define IPCC_BASE_H

#include <stdint.h>
#include <time.h>

#include "common.h"
#include "config.h"
#include "driver.h"
#include "fdmark.h"
#include "fmt.h"
#include "keyset.h"
#include "lock.h"
#include "log.h"
#include "mem.h"
#include "proc.h"
#include "userdir.h"

#define IPCC_VERSION "0.1.0"

/* The driver's status code we produce ourselves when there is no driver:
 * CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, nothing to forward to (hooks.c
 * checks it against cuda.h). */
#define IPCC_CUDA_NO_DRIVER 302

/* The one clock: CLOCK_MONOTONIC is the same in every process, so the
 * ledger's deadlines and the table's ages compare across them. */
static inline uint64_t ipcc_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The same clock to a tick's resolution, at a fraction of the cost: only a
 * lent close (no lock) is ordered by it; the order it gives is the loans'
 * protocol comment's (tables/legacy_loans.c). */
static inline uint64_t ipcc_clock_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* What a table's release found (both kinds' tables). */
enum ipcc_release_result {
    IPCC_RELEASE_NOT_FOUND,  /* not ours: the driver must answer */
    IPCC_RELEASE_OK,         /* one reference dropped */
    IPCC_RELEASE_PAST_ZERO,  /* was idle: removed; the cache's reference must be
                              * closed and the close passed to the driver */
    IPCC_RELEASE_LAST,       /* the last reference of a mapping its exporter freed:
                              * removed; the cache's reference must be closed */
};

#endif
