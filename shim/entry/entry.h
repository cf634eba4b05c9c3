/*
 * entry.h - the entry points: the exported wrappers and the one hook table
 * (hooks.c), the substitution for dlsym and cuGetProcAddress (resolve.c,
 * dlsym_<arch>.S), and the wiring of the layers at load (wiring.c).
 */
#ifndef IPCC_ENTRY_H
#define IPCC_ENTRY_H

#include "budget.h"
#include "ledger.h"
#include "legacy.h"
#include "vmm.h"

IPCC_HIDDEN extern struct ipcc_hook ipcc_hooks[IPCC_SLOT_COUNT];

IPCC_HIDDEN void *ipcc_resolve_substitute(const char *symbol, int version, void *real,
                                         const void *caller);

IPCC_HIDDEN void *ipcc_dlsym_hook(void *handle, const char *name, const void *caller);

#endif
