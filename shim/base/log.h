/* log.h - log.c's interface: the library's messages and their levels. */
#ifndef IPCC_LOG_H
#define IPCC_LOG_H

#include "common.h"

enum ipcc_log_level { IPCC_LOG_ERROR, IPCC_LOG_WARN, IPCC_LOG_INFO, IPCC_LOG_DEBUG };

IPCC_HIDDEN void ipcc_log(enum ipcc_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
