#!/usr/bin/env python3
"""Unpack what tools/sglang_peer/fetch.sh fetched, for a run without the network.

usage: prepare.py FETCHED TREE
  FETCHED  the fetch step's folder (.peer/sglang)
  TREE     where to unpack: TREE/src holds SGLang's files, TREE/deps the
           packages of the wheels; unpacked again only when MANIFEST changed

Every file MANIFEST names must be there with its sha256, and MANIFEST must
name each of the fetch step's files: otherwise this says which file is wrong
and exits 2, before anything runs. Nothing is installed.
"""
import hashlib
import os
import shutil
import sys
import tarfile

REQUIRED = ("VERSION", "WHEELS", "sglang-py.tar.xz", "deps.tar.xz", "test_cuda_ipc_transport.py")


def fail(msg, what="sglang"):
    print(f"peer: {what}: {msg}", file=sys.stderr)
    sys.exit(2)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_manifest(fetched, required=REQUIRED, what="sglang"):
    """The names MANIFEST lists, each present and unchanged, and every name of
    `required` among them; otherwise exit 2 saying which (also used by
    tools/rl_peer/prepare.py, `what` naming the fetched set)."""
    manifest = os.path.join(fetched, "MANIFEST")
    if not os.path.isfile(manifest):
        fail(f"no {manifest}: run `make peer-fetch` on a machine with the network, "
             f"and carry {fetched} along", what)
    names = []
    with open(manifest, encoding="utf-8") as f:
        for line in f:
            digest, _, name = line.strip().partition("  ")
            if not name:
                fail(f"{manifest}: a line that is not 'sha256  name': {line.strip()!r}", what)
            path = os.path.join(fetched, name)
            if not os.path.isfile(path):
                fail(f"missing {path} (MANIFEST names it): run `make peer-fetch` again", what)
            if sha256(path) != digest:
                fail(f"{path} differs from what MANIFEST says was fetched: run `make peer-fetch` again", what)
            names.append(name)
    for name in required:
        if name not in names:
            fail(f"{manifest} does not name {name}: run `make peer-fetch` again", what)
    return names


def unpack(fetched, tree, archives=(("sglang-py.tar.xz", "src"), ("deps.tar.xz", "deps")),
           copies=("test_cuda_ipc_transport.py",)):
    """Each archive into TREE/folder, each copied file into TREE; once per
    MANIFEST (TREE/MANIFEST is the stamp)."""
    stamp = os.path.join(tree, "MANIFEST")
    with open(os.path.join(fetched, "MANIFEST"), "rb") as f:
        want = f.read()
    try:
        with open(stamp, "rb") as f:
            if f.read() == want:
                return
    except OSError:
        pass
    shutil.rmtree(tree, ignore_errors=True)
    for archive, folder in archives:
        with tarfile.open(os.path.join(fetched, archive)) as tar:
            tar.extractall(os.path.join(tree, folder), filter="data")
    for name in copies:
        shutil.copy(os.path.join(fetched, name), tree)
    with open(stamp, "wb") as f:  # last: a half-done unpack is redone
        f.write(want)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    fetched, tree = argv
    check_manifest(fetched)
    unpack(fetched, tree)
    if not os.path.isfile(os.path.join(tree, "src", "sglang", "srt", "multimodal", "transport",
                                       "cuda_ipc.py")):
        fail(f"{fetched}/sglang-py.tar.xz has no sglang/srt/multimodal/transport/cuda_ipc.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
