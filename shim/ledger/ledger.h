/*
 * ledger.h - the release ledger: exporters' frees reach importers'
 * idle mappings (ledger.c: the file, exports and importer slots;
 * ledger_request.c: requests and answers; ledger_helper.c: the importer's
 * helper thread, which hands each let-go to the kinds that registered).
 * ledger_impl.h is the file's layout, private to the folder.
 */
#ifndef IPCC_RELEASE_LEDGER_H
#define IPCC_RELEASE_LEDGER_H

#include "base.h"

#define IPCC_LEDGER_IMPORTERS 64
#define IPCC_LEDGER_REQUESTS 64

/* ledger.c: the file, process identity, exports and importer slots. */
IPCC_HIDDEN int ipcc_ledger_ready(void);
IPCC_HIDDEN int ipcc_ledger_publish(const void *handle);
IPCC_HIDDEN void ipcc_ledger_unpublish(const void *handle);
/* ipcc_ledger_owner: 1 listed by *owner; IPCC_LEDGER_LET_GO once *owner
 * unlisted it (its free is under way), or once a new export took over its
 * entry after its let-go or its exporter's death (*owner zeros then; for the
 * last 8,192 such); 0 unknown (no exporter with the library, or a listing
 * ended longer ago). */
#define IPCC_LEDGER_LET_GO (-1)
IPCC_HIDDEN int ipcc_ledger_owner(const void *handle, struct ipcc_proc *owner);
IPCC_HIDDEN int ipcc_ledger_unpublished(void);
IPCC_HIDDEN int ipcc_ledger_register(void);
IPCC_HIDDEN void ipcc_ledger_unregister(int slot);
IPCC_HIDDEN void ipcc_ledger_name_helper(int slot, int32_t tid);
IPCC_HIDDEN void ipcc_ledger_watch(int slot, int32_t exporter_pid);
IPCC_HIDDEN uint32_t ipcc_ledger_doorbell(int slot);
IPCC_HIDDEN void ipcc_ledger_sleep(int slot, uint32_t seen, uint64_t ns);

/* ledger.c: the first listed export match() accepts (returns 1); 1 with it
 * copied. match returns -1 when the owner no longer exists: the entry is
 * freed, so that later scans skip it. */
IPCC_HIDDEN int ipcc_ledger_publish_tag(const void *tag);
IPCC_HIDDEN int ipcc_ledger_find_export(int (*match)(const struct ipcc_proc *owner,
                                                     const void *handle, void *arg),
                                        void *arg, void *handle, struct ipcc_proc *owner);

/* ledger_request.c: one exporter's "let go of this handle", and answers. */
struct ipcc_ledger_ask {
    int index;
    uint32_t gen;
    unsigned char handle[IPCC_HANDLE_BYTES];
};
IPCC_HIDDEN int ipcc_ledger_release(const void *handle, uint64_t wait_ns);
IPCC_HIDDEN int ipcc_ledger_next_ask(int slot, int from, struct ipcc_ledger_ask *ask);
IPCC_HIDDEN void ipcc_ledger_answer(int slot, const struct ipcc_ledger_ask *ask);

/* ledger_helper.c: the importer's side, both kinds; each kind registers
 * what it closes when an exporter lets go of a handle (or a VMM tag). */
IPCC_HIDDEN void ipcc_ledger_note_import(const void *handle);
IPCC_HIDDEN int ipcc_ledger_import_exporter(const void *handle, struct ipcc_proc *who);
IPCC_HIDDEN void ipcc_ledger_helper_register(void (*let_go)(const void *handle));
IPCC_HIDDEN void ipcc_ledger_helper_fork_child(void); /* no helper, no slot, nothing seen */
IPCC_HIDDEN int ipcc_ledger_helper_exiting(void);

#endif
