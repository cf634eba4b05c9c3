/*
 * base_impl.h - what the basics' files share among themselves, private to
 * shim/base/: the message level config.c sets in log.c. The folder's
 * interface is base.h.
 */
#ifndef IPCC_BASE_IMPL_H
#define IPCC_BASE_IMPL_H

#include "log.h"

IPCC_HIDDEN void ipcc_log_set_level(enum ipcc_log_level level); /* the messages shown */

#endif
