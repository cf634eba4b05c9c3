/*
 * fuzz.h - what the differential fuzzer's two files share: tests/fuzz/fuzz.c
 * (threads, contexts, legacy IPC, fork, the run) and tests/fuzz/fuzz_vmm.c (the
 * VMM path's operations and its part of the exit listing).
 */
#ifndef IPCCACHE_TESTS_FUZZ_H
#define IPCCACHE_TESTS_FUZZ_H

#include <stdint.h>
#include <cuda.h>

struct thread;

/* Appends to the thread's log (printed after the join). */
void log_line(struct thread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* A driver function, found the way the seed chose (resolver or dlsym). */
void *lookup(const char *name, int old_version, int new_version, const char *new_symbol);
void *must(void *p, const char *what);
void *driver_symbol(const char *name); /* a stand-in test hook */
uint64_t next_random(uint64_t *s);
unsigned pick(uint64_t *s, unsigned n);
extern int nthreads;

/* ---- the release ledger across processes (fuzz_ledger.c) ---- */

void ledger_peers(uint64_t seed);

/* ---- the VMM path (fuzz_vmm.c) ---- */

#define VMM_ALLOCS 4   /* allocation slots of a thread (created, exportable) */
#define VMM_EXPORTS 5  /* its export slots: an open fd each */
#define VMM_HELD 48    /* imports it holds */
#define VMM_GONE 16    /* handles it released, for releases past zero */
#define VMM_RES 6      /* reservations it holds */
#define VMM_MAPS 32    /* mappings it holds */
#define VMM_NAMES 64   /* allocations it created, ever: their names */

struct fuzz_vmm {
    int tid, devnull;
    struct { CUmemGenericAllocationHandle h; int name, live; unsigned chunks; } alloc[VMM_ALLOCS];
    struct { int fd, name, desc; } exp[VMM_EXPORTS]; /* fd < 0: none; desc: its description */
    int ndesc;
    struct { CUmemGenericAllocationHandle h; int desc, name, uid; } held[VMM_HELD];
    int nheld, next_uid;
    struct { CUmemGenericAllocationHandle h; int desc; } gone[VMM_GONE];
    int ngone;
    struct { CUdeviceptr p; unsigned chunks; int live; } res[VMM_RES];
    struct { int res, held_uid, name; unsigned at, chunks; } map[VMM_MAPS];
    int nmap;
    CUdeviceptr last_freed; /* freed since this thread's last reserve; a hint only */
    unsigned last_freed_chunks; /* its size */
    uint64_t serials[VMM_NAMES];
    unsigned name_chunks[VMM_NAMES];
    int nnames;
};

void vmm_load(void);
void vmm_start(struct fuzz_vmm *v, int tid);
/* One VMM operation, chosen and resolved by r. */
void vmm_op(struct thread *t, struct fuzz_vmm *v, uint64_t r);
/* Fork child: forget the parent's VMM state (its fds stay, unused). */
void vmm_child(struct fuzz_vmm *v);
/* The app gives back every import, mapping and reservation it holds. */
void vmm_drain(struct thread *t, struct fuzz_vmm *v);
/* At the thread's end: the access of the mappings it holds. */
void vmm_end(struct thread *t, struct fuzz_vmm *v);
/* Lines describing the stand-in's live VMM state at exit. */
void vmm_final(struct fuzz_vmm *const *all, int n);

#endif
