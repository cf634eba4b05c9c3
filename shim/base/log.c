/*
 * log.c - the library's messages: one line each on stderr, starting
 * "ipccache: " and the level, written with a single write(2) so lines from
 * several threads or processes do not interleave. Capped, so a program that
 * misbehaves in a loop cannot flood its own log through us.
 *
 * Not for signal handlers (vsnprintf): stats.c has its own writer.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "log.h"
#include "base_impl.h"

#define MAX_MESSAGES 1000

static _Atomic unsigned messages_written;
/* Set by config.c as it reads IPCCACHE_LOG: the log knows no settings. */
static _Atomic int shown_level = IPCC_LOG_WARN;

void ipcc_log_set_level(enum ipcc_log_level level)
{
    atomic_store_explicit(&shown_level, (int)level, memory_order_relaxed);
}

static const char *level_prefix(enum ipcc_log_level level)
{
    switch (level) {
    case IPCC_LOG_ERROR: return "ipccache: error: ";
    case IPCC_LOG_WARN: return "ipccache: warning: ";
    case IPCC_LOG_INFO: return "ipccache: ";
    default: return "ipccache: debug: ";
    }
}

void ipcc_log(enum ipcc_log_level level, const char *fmt, ...)
{
    if ((int)level > atomic_load_explicit(&shown_level, memory_order_relaxed))
        return;
    unsigned n = atomic_fetch_add_explicit(&messages_written, 1, memory_order_relaxed);
    if (n > MAX_MESSAGES)
        return;

    char line[1024];
    int len = snprintf(line, sizeof(line), "%s", level_prefix(level));
    if (n == MAX_MESSAGES) {
        len += snprintf(line + len, sizeof(line) - (size_t)len,
                        "message limit reached; further messages suppressed");
    } else {
        va_list ap;
        va_start(ap, fmt);
        len += vsnprintf(line + len, sizeof(line) - (size_t)len, fmt, ap);
        va_end(ap);
    }
    if (len > (int)sizeof(line) - 2)
        len = (int)sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, (size_t)len);
    (void)ignored;
}
