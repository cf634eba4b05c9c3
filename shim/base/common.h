/* common.h - what base's module headers share: the names' visibility and a handle's bytes. */
#ifndef IPCC_COMMON_H
#define IPCC_COMMON_H

#define IPCC_HIDDEN __attribute__((visibility("hidden")))
#define IPCC_EXPORT __attribute__((visibility("default")))

/* The bytes of a legacy IPC handle; a VMM export tag and every key of the
 * ledger and the key sets have as many. */
#define IPCC_HANDLE_BYTES 64

#endif
