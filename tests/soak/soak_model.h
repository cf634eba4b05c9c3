/*
 * soak_model.h - the soak's shadow model: what the driver answers for each
 * call an importer makes (soak_importer.c), and the checks of every answer
 * and every value against it. The stand-in driver is the driver here: a
 * value is the allocation (exporter pid, serial) that the bytes at an address
 * belong to, as the stand-in tells it (fakecuda_ipc_allocation_at,
 * fakevmm_allocation_at).
 */
#ifndef IPCCACHE_TESTS_SOAK_MODEL_H
#define IPCCACHE_TESTS_SOAK_MODEL_H

#include "soak.h"

/* What the driver answers (the stand-in; tests/standin/fake_cuda.c):
 *   an open of a published handle, whether its exporter still runs or has
 *   freed it (the stand-in cannot see another process's free), with the lazy
 *   peer-access flag, in a live current context: success, the allocation the
 *   handle names mapped; once its exporter has exited, success only in a
 *   process that still maps it, else CUDA_ERROR_INVALID_HANDLE (as the H200's
 *   driver answers): the importer cannot see every mapping of its process
 *   (the library's idle ones), so either is right then (soak_check_open);
 *   an open with other flags, or of a handle whose check words are wrong:
 *   CUDA_ERROR_INVALID_VALUE;
 *   a close of a pointer the process holds: success; of one it no longer
 *   holds (its last reference closed) or never had: CUDA_ERROR_INVALID_VALUE;
 *   the VMM calls of a rebuild (reserve, import of a received fd, map,
 *   set-access, unmap, release, address free), in PyTorch's order: success,
 *   each imported handle naming the chunk the exporter published. */
enum soak_call {
    SOAK_OPEN, SOAK_OPEN_BAD_FLAGS, SOAK_OPEN_CORRUPT, SOAK_CLOSE, SOAK_CLOSE_AGAIN,
    SOAK_CLOSE_BOGUS, SOAK_VMM_CALL,
};
CUresult soak_model_rc(enum soak_call call);

/* Checks: each counts in c (checks, and wrong or rc_mismatch), and the first
 * few differences are described on stderr. Return whether it matched. */
int soak_check_rc(struct soak_counts *c, enum soak_call call, CUresult got, const char *what);
/* An open (SOAK_OPEN) of a handle exporter_pid published; returns whether it
 * mapped. */
int soak_check_open(struct soak_counts *c, CUresult got, uint64_t exporter_pid, const char *what);
/* The bytes at ptr (a legacy IPC mapping, vmm: a VMM mapping or, with
 * handle set, an imported allocation handle) belong to (pid, serial). */
int soak_check_value(struct soak_counts *c, CUdeviceptr ptr, uint64_t pid, uint64_t serial,
                     const char *what);
int soak_check_vmm_value(struct soak_counts *c, CUdeviceptr ptr, uint64_t pid, uint64_t serial);
int soak_check_vmm_handle(struct soak_counts *c, CUmemGenericAllocationHandle h, uint64_t pid,
                          uint64_t serial);

#endif
