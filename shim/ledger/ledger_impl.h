/*
 * ledger_impl.h - layout of the release ledger, the one shared-memory file per
 * user through which exporters ask importers to let go of idle mappings.
 * Private to the folder (ledger.c, ledger_request.c; ledger_helper.c uses
 * only the unwatch) and the ledger's unit test; the rest of the library
 * uses the functions declared in ledger.h.
 *
 * Every field another process may write is atomic; every slot is owned by
 * one process, named by pid and start time, and taken with a compare-and-swap
 * on its pid word, so a dead owner's slot can be taken over.
 */
#ifndef IPCC_LEDGER_H
#define IPCC_LEDGER_H

#include "ledger.h"

#define IPCC_LEDGER_MAGIC 0x35676c6363706969ULL /* "iipccgl5" */
#define IPCC_LEDGER_NAME "release-ledger-v5"
/* A fleet of trainers lists a few hundred weights each: kept under half full,
 * a handle's 32 probes never all find their entries taken. */
#define IPCC_LEDGER_EXPORTS 4096
#define IPCC_LEDGER_PROBES 32
#define IPCC_LEDGER_WATCH 16
/* Ended listings remembered (ledger_ended.c): 64 KiB. */
#define IPCC_LEDGER_ENDED 8192

/* An export entry's ready word. LET_GO: its exporter unlisted the handle
 * (its free or its context's teardown is under way), so that an importer
 * opening it now knows not to keep it; any new export may take the entry. */
enum { IPCC_EXPORT_WRITING, IPCC_EXPORT_LISTED, IPCC_EXPORT_LET_GO };

/* An exported allocation: lets an importer learn whose handle it mapped. */
struct ipcc_ledger_export {
    _Atomic int32_t pid;          /* 0: free */
    _Atomic uint32_t ready;       /* IPCC_EXPORT_*: handle and start written, or let go */
    _Atomic uint64_t start;
    unsigned char handle[IPCC_HANDLE_BYTES];
};

/* A process that holds cached mappings of other processes' memory. */
struct ipcc_ledger_importer {
    _Atomic int32_t pid;          /* 0: free; -pid: being claimed by pid */
    _Atomic uint32_t doorbell;    /* futex: bumped by exporters with news */
    _Atomic uint64_t start;       /* the owner's, once pid is positive */
    _Atomic uint32_t any;         /* holds handles of unknown exporters */
    _Atomic int32_t helper;       /* its helper thread's tid; 0 until named */
    _Atomic int32_t watch[IPCC_LEDGER_WATCH]; /* exporters whose handles it holds */
    _Atomic uint32_t acked[IPCC_LEDGER_REQUESTS]; /* generation last answered */
};

enum { IPCC_REQ_FREE, IPCC_REQ_WRITING, IPCC_REQ_POSTED };

/* A request's state word holds its generation too (gen << 2 | state), so
 * that one compare-and-swap tells "my request, still posted" from a later
 * one posted in the same slot by another exporter. */
#define IPCC_REQ_STATE(word) ((word) & 3u)
#define IPCC_REQ_GEN(word) ((word) >> 2)

/* "The allocation with this handle is being freed": posted by its exporter
 * and answered by every importer it names in expected. */
struct ipcc_ledger_request {
    _Atomic uint32_t state;       /* gen << 2 | IPCC_REQ_*; gen changes at every posting */
    uint32_t zero_pad0;
    _Atomic uint32_t answers;     /* futex: bumped by each answer */
    uint32_t zero_pad;
    _Atomic uint64_t expected;    /* importer slots asked to answer */
    _Atomic uint64_t deadline_ns; /* CLOCK_MONOTONIC: the exporter stops waiting */
    _Atomic int32_t pid;
    uint32_t zero_pad2;
    _Atomic uint64_t start;
    unsigned char handle[IPCC_HANDLE_BYTES];
};

struct ipcc_ledger_file {
    _Atomic uint64_t magic;
    _Atomic uint32_t unpublished; /* an exporter could not list a handle */
    uint32_t zero_pad;
    struct ipcc_ledger_importer importers[IPCC_LEDGER_IMPORTERS];
    struct ipcc_ledger_request requests[IPCC_LEDGER_REQUESTS];
    struct ipcc_ledger_export exports[IPCC_LEDGER_EXPORTS];
    _Atomic uint32_t ended_next;  /* where the next ended listing goes */
    uint32_t zero_pad2;
    _Atomic uint64_t ended[IPCC_LEDGER_ENDED]; /* fingerprints; 0: empty */
};

_Static_assert(IPCC_LEDGER_IMPORTERS <= 64, "expected is a 64-bit mask");

/* The mapped ledger, or NULL when there is none (ledger.c). */
IPCC_HIDDEN struct ipcc_ledger_file *ipcc_ledger_file(void);
/* Where a handle's probe sequence starts (modulo IPCC_LEDGER_EXPORTS). */
IPCC_HIDDEN uint32_t ipcc_ledger_handle_hash(const unsigned char *h);

/* ledger_ended.c: a handle's 64-bit fingerprint (never 0); the listings new
 * exports took over (their handles let go of, or of dead exporters). */
IPCC_HIDDEN uint64_t ipcc_ledger_fingerprint(const unsigned char *handle);
IPCC_HIDDEN void ipcc_ledger_listing_ends(struct ipcc_ledger_file *f,
                                          const struct ipcc_ledger_export *e);
IPCC_HIDDEN int ipcc_ledger_listing_ended(struct ipcc_ledger_file *f, const unsigned char *handle);

/* ledger_let_go_ring.c: fingerprints of the handles this importer let go
 * of (table lock held). */
IPCC_HIDDEN int ipcc_ledger_was_let_go(const unsigned char *handle);
IPCC_HIDDEN void ipcc_ledger_remember_let_go(const unsigned char *handle);

/* Whether importer slot s, owned by the live process pid, can answer: its
 * helper thread was named and still lives, run yet or not (an exec() ends
 * it and keeps the slot). */
IPCC_HIDDEN int ipcc_ledger_helper_runs(struct ipcc_ledger_importer *s, int32_t pid);

/* Undoes ipcc_ledger_watch (ledger.h) for an exporter the helper saw exit
 * (ledger_helper.c). */
IPCC_HIDDEN void ipcc_ledger_unwatch(int slot, int32_t exporter_pid);

/* Futex words live in a shared file mapping: never the private variant. */
IPCC_HIDDEN void ipcc_futex_wake(_Atomic uint32_t *word);
IPCC_HIDDEN void ipcc_futex_wait(_Atomic uint32_t *word, uint32_t seen, uint64_t ns);

#endif
