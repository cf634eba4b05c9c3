/*
 * stats_impl.h - the stats folder's private part: the marker (marker.c) that
 * tells ipccache-stats this process answers the stats signal; stats.c writes
 * it when the handler is installed.
 */
#ifndef IPCC_STATS_IMPL_H
#define IPCC_STATS_IMPL_H

#include "base.h"

IPCC_HIDDEN int ipcc_marker_write(int sig, const char *request_dir);

#endif
