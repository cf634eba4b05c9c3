/*
 * fake_cuda.h - test hooks of the stand-in libcuda.so.1 (tests/standin/fake_cuda.c).
 *
 * The fake mimics the CUDA driver's IPC semantics closely enough for
 * ipccache's tests to run without a GPU, and counts what a real driver would
 * really have done (maps, unmaps) so tests can tell cache hits from driver
 * work.  Includable next to <cuda.h> in C (or C++) test files.
 *
 * FAKECUDA_NO_CTXGETID=1 plays a driver before 12.0: cuCtxGetId does not
 * exist (dlsym and cuGetProcAddress find nothing). Read at each lookup, so a
 * test may set it before its first one; a program linked against the
 * stand-in must not call cuCtxGetId directly while it is set.
 *
 * FAKECUDA_HANDLE_PER_CALL=1: each cuIpcGetMemHandle gives a handle of its
 * own; by default every export of one allocation (its base or a pointer
 * inside it) gives the same bytes, as the H200's driver does.
 */
#ifndef IPCCACHE_TESTS_FAKE_CUDA_H
#define IPCCACHE_TESTS_FAKE_CUDA_H

#include <stdint.h>
#include <stdio.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* First 8 bytes of every handle the fake produces. */
#define FAKECUDA_HANDLE_MAGIC "FAKEIPC1"

struct fakecuda_counters {
    uint64_t maps;            /* opens that created a new driver mapping */
    uint64_t unmaps;          /* closes that dropped the last reference */
    uint64_t teardown_unmaps; /* mappings dropped by context destruction */
    uint64_t open_calls;      /* every cuIpcOpenMemHandle{,_v2} call */
    uint64_t close_calls;     /* every cuIpcCloseMemHandle call */
    uint64_t resolver_calls;  /* every cuGetProcAddress{,_v2} call */
    int64_t live_mappings;    /* mappings that exist right now */
};

void fakecuda_get_counters(struct fakecuda_counters *out);

/* A handle as if exported by another process (pid != getpid()), so that
 * opening it succeeds.  Same (serial, bytes) -> same handle. */
void fakecuda_make_foreign_handle(CUipcMemHandle *out, uint64_t alloc_serial,
                                  uint64_t bytes);

/* The same allocation as fakecuda_make_foreign_handle, exported again: the
 * handle differs in its nonce bytes only, and opens the same mapping. */
void fakecuda_make_foreign_export(CUipcMemHandle *out, uint64_t alloc_serial,
                                  uint64_t bytes, uint64_t nonce);

/* The same as exported by process exporter_pid (any number but this
 * process's): a test's several exporters. */
void fakecuda_make_export_by(CUipcMemHandle *out, uint64_t exporter_pid, uint64_t alloc_serial,
                             uint64_t bytes, uint64_t nonce);

/* Driver-side refcount of the mapping at base dptr in ctx (NULL: the
 * calling thread's current context); 0 if there is none. */
int fakecuda_refcount(CUcontext ctx, CUdeviceptr dptr);

/* From now on every driver call returns CUDA_ERROR_DEINITIALIZED, as after
 * cudart's exit-time teardown. */
void fakecuda_deinit(void);

/* The driver's IPC open and close under names no interposer hooks: what a
 * library bound to the driver directly (RTLD_DEEPBIND, dlvsym) reaches. */
CUresult fakecuda_ipc_open_direct(CUdeviceptr *pdptr, CUipcMemHandle h,
                                  unsigned int flags);
CUresult fakecuda_ipc_close_direct(CUdeviceptr dptr);

/* Context teardown no interposer sees: what cudaDeviceReset in a static
 * cudart bound to the driver directly, or a layer ahead of ipccache that
 * calls the driver itself, does. */
CUresult fakecuda_ctx_destroy_direct(CUcontext ctx);
CUresult fakecuda_primary_reset_direct(CUdevice dev);

/* Calls fn(arg) once, at the start of the next cuCtxPushCurrent{,_v2} (any
 * thread), with no lock held: a test's way to change the world at exactly
 * that moment, e.g. destroy a context and create one at its address. */
void fakecuda_on_next_push(void (*fn)(void *arg), void *arg);

/* "FAKEIPC1" */
const char *fakecuda_handle_magic(void);

/* Whether pid runs: not gone and not a zombie (kill(pid, 0) succeeds on one). */
int fakecuda_process_runs(int64_t pid);

/* Bytes still "physically" allocated by every process sharing the book
 * FAKECUDA_PHYS_DIR/phys: an allocation counts until its owner freed it
 * (cuMemFree, the teardown of the context it was allocated in, or exit) and
 * no live process maps it. 0 when the variable is unset. */
uint64_t fakecuda_phys_bytes(void);

/* Of those, what process pid maps or holds imported (all 0 when unset):
 * bytes and allocations (each once, in all its contexts), and the bytes that
 * outlive their owner's free (or exit) only because they are still mapped,
 * what a cache that does not honour the free pins. */
struct fakecuda_held { uint64_t bytes, allocs, ghost_bytes; };
void fakecuda_phys_held(int64_t pid, struct fakecuda_held *out);

/* Those last bytes for every live process together (each allocation once). */
uint64_t fakecuda_phys_ghost_total(void);
/* Those allocations, a line each on out: owner, serial, bytes, "freed" or
 * "died", and the processes that map them (what the soak writes after the
 * last free). */
void fakecuda_phys_ghost_list(FILE *out);

/* CUDA 13's <cuda.h> no longer declares the 3-argument context creator (its
 * cuCtxCreate macro means cuCtxCreate_v4); the fake exports it. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags,
                                CUdevice dev);

/* ---- the differential fuzzer's view (tests/fuzz/fuzz.c) ---- */

/* One live mapping: owning context's creation serial, exported allocation,
 * driver-side references. */
struct fakecuda_mapping {
    unsigned long long ctx_serial;
    uint64_t exporter_pid, alloc_serial;
    int refs;
};

/* Copies up to cap live mappings into out[]; returns how many exist. */
size_t fakecuda_list_mappings(struct fakecuda_mapping *out, size_t cap);

/* The allocation (exporter pid, serial) the legacy IPC mapping holding ptr
 * in the current context maps: what reading its bytes would tell; 0 when
 * ptr lies in no mapping. The soak's value check (tests/soak/). */
int fakecuda_ipc_allocation_at(CUdeviceptr ptr, uint64_t *pid, uint64_t *serial);

/* The serial of this process's own allocation holding dptr (its exporter's
 * side of the same fact); 0 when there is none. */
int fakecuda_allocation_serial(CUdeviceptr dptr, uint64_t *serial);

/* Creation serial of a live context (0: not a live context). */
unsigned long long fakecuda_ctx_serial(CUcontext ctx);

#ifdef __cplusplus
}
#endif

#endif /* IPCCACHE_TESTS_FAKE_CUDA_H */
