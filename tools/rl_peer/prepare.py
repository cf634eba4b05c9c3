#!/usr/bin/env python3
"""Unpack what tools/rl_peer/fetch.sh fetched, for a run without the network.

usage: prepare.py FETCHED TREE
  FETCHED  the fetch step's folder (.peer/rl)
  TREE     where to unpack: TREE/src holds the three projects' files, TREE/deps
           the packages of the wheels; unpacked again only when MANIFEST changed

Every file MANIFEST names must be there with its sha256, and MANIFEST must
name each of the fetch step's files: otherwise this says which file is wrong,
names `make peer-fetch` and exits 2, before anything runs (the check is
tools/sglang_peer/prepare.py's). Nothing is installed.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sglang_peer"))
from prepare import check_manifest, fail, unpack  # noqa: E402

REQUIRED = ("VERSIONS", "WHEELS", "rl-py.tar.xz", "deps.tar.xz")
# One file of each project's weight sync: the archive holds what it should.
ENTRY_FILES = ("vllm/distributed/weight_transfer/ipc_engine.py",
               "verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py",
               "openrlhf/trainer/ray/vllm_worker_wrap.py")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    fetched, tree = argv
    check_manifest(fetched, REQUIRED, "rl")
    unpack(fetched, tree, (("rl-py.tar.xz", "src"), ("deps.tar.xz", "deps")), ())
    for name in ENTRY_FILES:
        if not os.path.isfile(os.path.join(tree, "src", name)):
            fail(f"{fetched}/rl-py.tar.xz has no {name}: run `make peer-fetch` again", "rl")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
