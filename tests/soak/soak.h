/*
 * soak.h - what the stand-in soak's processes share (tests/soak/, make soak).
 *
 * One program, three roles: the supervisor (soak.c) starts a fleet of
 * exporters (soak_exporter.c) and importers (soak_importer.c), each the same
 * program run again with its role, and samples them (soak_sample.c). They
 * meet in the board, a file every process of the run maps: the exporters
 * publish the handles they export and what each names, the importers count
 * their opens and every check of the shadow model (soak_model.c).
 */
#ifndef IPCCACHE_TESTS_SOAK_H
#define IPCCACHE_TESTS_SOAK_H

#include <stdatomic.h>
#include <stdint.h>
#include <cuda.h>

#define SOAK_MAX_EXPORTERS 16
#define SOAK_MAX_IMPORTERS 48   /* the release ledger has 64 importer slots: room for fork children */
#define SOAK_MAX_WEIGHTS 256
#define SOAK_FRESH 32           /* an exporter's ring of fresh buffers */
#define SOAK_MAX_CHUNKS 16      /* VMM chunks of an exporter's segment */
#define SOAK_THREADS 4          /* most threads of an importer */
#define SOAK_MAGIC 0x6b616f73636370ULL

/* A published handle and the allocation it names: what its bytes hold. */
struct soak_handle {
    unsigned char bytes[CU_IPC_HANDLE_SIZE];
    uint64_t pid, serial, size; /* pid 0: withdrawn (its allocation is being freed) */
};

/* One exporter's place; replaced exporters take it over (generation). The
 * seqlock (seq odd while written) lets importers copy a handle safely. */
struct soak_exporter_slot {
    _Atomic uint32_t seq;
    _Atomic int32_t pid;        /* 0 until the first exporter published */
    _Atomic uint32_t generation, vmm_epoch;
    uint32_t nweights, nchunks;
    struct soak_handle pool;
    struct soak_handle weights[SOAK_MAX_WEIGHTS];
    struct soak_handle fresh[SOAK_FRESH];
    _Atomic uint64_t fresh_next; /* fresh[(fresh_next - 1) % SOAK_FRESH] is the newest */
    uint64_t chunk_serial[SOAK_MAX_CHUNKS];
    _Atomic uint64_t allocs, frees, resets;
};

/* An importer thread's counts, on a cache line of its own. */
struct soak_counts {
    _Atomic uint64_t opens;        /* legacy opens */
    _Atomic uint64_t imports;      /* VMM imports */
    _Atomic uint64_t checks;       /* values and return codes checked */
    _Atomic uint64_t wrong;        /* values that differ from the model's */
    _Atomic uint64_t rc_mismatch;  /* return codes that differ from the model's */
    _Atomic uint64_t syncs, rebuilds, forks, resets;
} __attribute__((aligned(64)));

struct soak_importer_slot {
    _Atomic int32_t pid;
    _Atomic int32_t done;      /* its threads stopped and closed all they held */
    _Atomic int32_t fd_limit;  /* its soft limit of open files */
    struct soak_counts t[SOAK_THREADS + 1]; /* the last: its fork children */
};

enum { SOAK_RUN, SOAK_STOP_OPS, SOAK_STOP_ALL };

struct soak_board {
    uint64_t magic;
    _Atomic int32_t phase;             /* SOAK_RUN, SOAK_STOP_OPS, SOAK_STOP_ALL */
    _Atomic int32_t exporters_stop;    /* free everything and exit */
    uint32_t nexporters, nimporters;
    struct soak_exporter_slot exp[SOAK_MAX_EXPORTERS];
    struct soak_importer_slot imp[SOAK_MAX_IMPORTERS];
};

/* Maps the run's board (create: made and sized here). */
struct soak_board *soak_board_map(const char *path, int create);

/* Copies what read() copies out of slot e under its seqlock; 0 if the slot
 * is empty or kept changing. */
int soak_read_slot(struct soak_exporter_slot *e, void (*read)(struct soak_exporter_slot *, void *),
                   void *out);
void soak_write_begin(struct soak_exporter_slot *e);
void soak_write_end(struct soak_exporter_slot *e);

/* The sum of counter `field` (offsetof in struct soak_counts) over an importer's threads. */
uint64_t soak_importer_sum(const struct soak_importer_slot *s, unsigned long field);

/* splitmix64: reproducible from the seed. */
uint64_t soak_random(uint64_t *s);
unsigned soak_pick(uint64_t *s, unsigned n);
double soak_now(void);
void soak_sleep_ms(double ms);

/* The roles: argv after the role's name. */
int soak_exporter_main(int argc, char **argv);
int soak_importer_main(int argc, char **argv);

/* An importer's VMM side (soak_rebuild.c): one rebuild of a range of exporter
 * slot e's chunks as PyTorch's expandable segments do it (reserve; per chunk
 * a copy of its fd imported, then closed; map; set access), every value
 * checked, then dropped (unmap, release, address free). The fds received
 * from the last two exporters are kept; forget closes them. */
void soak_rebuild(struct soak_board *b, const char *run, int e, uint64_t *rnd, struct soak_counts *c);
void soak_rebuild_forget(void);

/* The socket path where exporter slot e (of its generation) hands out its VMM fds. */
void soak_socket_path(char *out, unsigned long cap, const char *run, int e, unsigned generation);
/* Sends n fds and the bytes of msg over sock; receives them (returns the fd count, -1 on error). */
int soak_send_fds(int sock, const void *msg, unsigned long len, const int *fds, int n);
int soak_recv_fds(int sock, void *msg, unsigned long len, int *fds, int cap);

#endif
