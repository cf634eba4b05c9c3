/*
 * vmm_impl.h - what the VMM kind's files share among themselves, private to
 * shim/vmm/: identities, the kept dups, waiting for releases under way, and
 * the ledger's tags. The kind's interface is vmm.h.
 */
#ifndef IPCC_VMM_IMPL_H
#define IPCC_VMM_IMPL_H

#include "vmm.h"

/* ---- vmm_identity.c: what identifies an export -------------------------- */

IPCC_HIDDEN int ipcc_vmm_kcmp(int fd_a, int fd_b);  /* an ipcc_vmm_cmp_fn */
IPCC_HIDDEN int ipcc_vmm_same_file(int fd_a, int fd_b); /* an ipcc_vmm_same_fn */
IPCC_HIDDEN int ipcc_vmm_kept_order(int asked, int kept); /* the table's: kcmp, ours checked */
IPCC_HIDDEN int ipcc_vmm_kept_same(int asked, int kept);  /* the same, F_DUPFD_QUERY */
IPCC_HIDDEN int ipcc_vmm_id_of(struct ipcc_vmm_id *id, void *os_handle, int type);
IPCC_HIDDEN int ipcc_vmm_identity_works(const struct ipcc_vmm_id *id);
IPCC_HIDDEN int32_t ipcc_vmm_self_pid(void);         /* getpid, asked once per process */

/* ---- vmm_fds.c: the dups kept as identities, bounded ------------------- */

IPCC_HIDDEN int ipcc_vmm_fd_keep(struct ipcc_vmm_table *t, int fd);
IPCC_HIDDEN void ipcc_vmm_fd_give_back(struct ipcc_vmm_table *t, int fd);

/* ---- vmm_close.c: the app's calls that wait for releases under way ------ */

/* Kept chunks taken for unmapping and kept ranges for freeing (listed by
 * ipcc_vmm_close_taken): a call on a range waits for them. */
IPCC_HIDDEN void ipcc_vmm_close_wait(uint64_t addr, uint64_t size);
IPCC_HIDDEN void ipcc_vmm_close_fork_child(void);

/* ---- the release ledger (vmm_exporter.c, vmm_importer.c; vmm.h) -------- */

IPCC_HIDDEN void ipcc_vmm_exporter_release(uint64_t handle);
IPCC_HIDDEN int ipcc_vmm_tag_fd(const void *tag);  /* -1: not a VMM tag */
IPCC_HIDDEN void ipcc_vmm_note_import(struct ipcc_vmm_table *t, uint64_t handle, int fd);
IPCC_HIDDEN void ipcc_vmm_after_release(void);

#endif
