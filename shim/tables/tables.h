/*
 * tables.h - the pure tables of both kinds, the folder's interface: C only,
 * no CUDA, no I/O, no lock (the build proves the first: they are compiled
 * with CUDA's headers shadowed). The idle budget above owns both.
 */
#ifndef IPCC_TABLES_H
#define IPCC_TABLES_H

#include "legacy_table.h"
#include "vmm_table.h"

#endif
