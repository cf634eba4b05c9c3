#!/usr/bin/env bash
#
# need_gpu.sh NAME - exits 0 when nvidia-smi lists a GPU; else says
# "NAME: no NVIDIA GPU found; skipped (exit status 77)" and exits 77, the
# automake convention for a skipped check, so that a job meant to run on a
# GPU does not pass without one (make test-gpu, make bench, make peer).

if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    exit 0
fi
echo "$1: no NVIDIA GPU found; skipped (exit status 77)"
exit 77
