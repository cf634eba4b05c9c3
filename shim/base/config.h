/* config.h - config.c's interface: the IPCCACHE_* settings, their parsers and table. */
#ifndef IPCC_CONFIG_H
#define IPCC_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "log.h"

struct ipcc_config {
    int disabled;
    int vmm;                 /* cache the VMM path too (IPCCACHE_VMM) */
    uint64_t max_idle_bytes;
    uint64_t max_idle_entries;
    enum ipcc_log_level log_level;
    int stats_signal;        /* 0: no handler */
    int stats_signal_explicit; /* set in the environment: may replace SIG_IGN */
    int stats_at_exit;
    int strict;
    char stats_file[512];    /* as written, %p not expanded; empty: none */
    char stats_dir[256];     /* empty: the per-user directory (userdir.c) */
    uint64_t release_wait_ms; /* an exporter's free waits this long for importers */
};

IPCC_HIDDEN extern struct ipcc_config ipcc_config;
IPCC_HIDDEN void ipcc_config_load(void);
IPCC_HIDDEN int ipcc_config_disabled_early(void);
IPCC_HIDDEN void ipcc_config_say_disabled(void);
IPCC_HIDDEN int ipcc_parse_bool(const char *s, int *out);
IPCC_HIDDEN int ipcc_parse_size(const char *s, uint64_t *out);
IPCC_HIDDEN int ipcc_parse_count(const char *s, uint64_t *out);
IPCC_HIDDEN int ipcc_parse_signal(const char *s, int *out);
IPCC_HIDDEN void ipcc_signal_name(int sig, char *out, size_t cap);
IPCC_HIDDEN int ipcc_parse_log_level(const char *s, enum ipcc_log_level *out);
IPCC_HIDDEN int ipcc_config_stats_path(const char *pattern, long pid, char *out, size_t cap);

/* One IPCCACHE_* variable: its parser (0 or -1) and its documentation. */
struct ipcc_setting {
    const char *name;
    int (*set)(const char *value);
    const char *expect;        /* completes "expected ..." */
    const char *default_text;  /* as the variable would spell it; "" means unset */
    const char *meaning;
};
IPCC_HIDDEN const struct ipcc_setting *ipcc_config_table(size_t *count);

#endif
