/*
 * base_impl.h - what the basics' files share among themselves, private to
 * shim/base/: the message level config.c sets in log.c, and what of
 * config.c only ipccache-config (the parser as a command) uses. The
 * folder's interface is base.h.
 */
#ifndef IPCC_BASE_IMPL_H
#define IPCC_BASE_IMPL_H

#include "config.h"
#include "log.h"

IPCC_HIDDEN void ipcc_log_set_level(enum ipcc_log_level level); /* the messages shown */

/* ipccache-config --check: the load, each problem an error. */
IPCC_HIDDEN void ipcc_config_check(void);
/* "expected ..." for a bad value, or why it is refused (16GB) and what was meant. */
IPCC_HIDDEN void ipcc_config_expected(const struct ipcc_setting *st, const char *value,
                                      char *out, size_t cap);

#endif
