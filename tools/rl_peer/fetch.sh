#!/usr/bin/env bash
# tools/rl_peer/fetch.sh - `make peer-fetch`, second half: the weight-sync code of
# vLLM, verl and OpenRLHF as released, for `BENCH_PARTS=rl make bench` and
# `PEER_SUITES=rl make peer`, fetched once on a machine with the network into
# PEER_DIR/rl/ (default .peer/rl/, git-ignored: other people's code). Nothing
# is installed: the wheels pin other torch versions; only the files the weight
# sync reaches are taken (FILES below), their folders becoming namespace
# packages so that no package __init__ (which imports the whole project) runs.
#
#   rl-py.tar.xz   those files, as the wheels hold them
#   deps.tar.xz    the packages they and the bench's model import beyond what a
#                  machine with PyTorch has (pyzmq, pybase64, transformers and
#                  its own), for CPython 3.12 on x86_64 Linux, pinned below
#   WHEELS         every wheel used, with its sha256
#   VERSIONS       the three releases
#   MANIFEST       sha256 of each of those; the run checks it and stops on a
#                  missing or changed file, naming `make peer-fetch`
# None of the three wheels ships a test of this code (verl's and OpenRLHF's
# ship tests/ folders, of other things): there is no test file to fetch.
#
# usage: tools/rl_peer/fetch.sh [PEER_DIR]
# Environment:
#   VLLM_VERSION, VERL_VERSION, OPENRLHF_VERSION   the releases (0.33.0, 0.9.1, 0.11.2)
#   PYTHON   the pip that downloads (default python3)
# Exit status: 0 fetched, 1 a download failed, 2 a usage error.
set -u -o pipefail
# shellcheck source=tools/peer_fetch.sh
. "$(dirname "${BASH_SOURCE[0]}")/../peer_fetch.sh"

fetch_args "$@"
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
VERL_VERSION=${VERL_VERSION:-0.9.1}
OPENRLHF_VERSION=${OPENRLHF_VERSION:-0.11.2}
for v in VLLM_VERSION VERL_VERSION OPENRLHF_VERSION; do
    fetch_release "$v"
done
# The files each weight sync reaches, as the wheels name them (OpenRLHF's
# wheel keeps its package under openrlhf-<version>.data/purelib/).
FILES=(vllm/envs.py vllm/config/weight_transfer.py
       vllm/distributed/weight_transfer/base.py vllm/distributed/weight_transfer/clients.py
       vllm/distributed/weight_transfer/ipc_engine.py vllm/distributed/weight_transfer/packed_tensor.py
       vllm/v1/engine/tensor_ipc.py
       verl/utils/device.py verl/plugin/__init__.py verl/plugin/platform/__init__.py
       verl/plugin/platform/platform_base.py verl/plugin/platform/platform_cuda.py
       verl/plugin/platform/platform_manager.py verl/plugin/platform/platform_npu.py
       verl/plugin/platform/platform_rocm.py
       verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py
       openrlhf/trainer/ray/ppo_actor.py openrlhf/trainer/ray/vllm_worker_wrap.py
       openrlhf/trainer/ray/utils.py openrlhf/utils/distributed_util.py)
WHEELS=(pyzmq==27.3.0 pybase64==1.5.1 packaging==26.4 tqdm==4.70.1
        transformers==5.19.0 tokenizers==0.23.2 huggingface-hub==2.4.0 safetensors==0.8.0
        regex==2026.11.19 pyyaml==6.0.4 filelock==4.3.1 fsspec==2026.9.0)

fetch_begin rl "${1:-}"
note "vllm $VLLM_VERSION, verl $VERL_VERSION, openrlhf $OPENRLHF_VERSION: their wheels (vllm's is ~330 MiB)"
fetch_pip 3.12 "$tmp/wheel" "vllm==$VLLM_VERSION" "verl==$VERL_VERSION" "openrlhf==$OPENRLHF_VERSION" ||
    die "pip could not download the three releases"
"$PYTHON" - "$DEST/rl-py.tar.xz" "$tmp"/wheel/*.whl "${FILES[@]}" <<'PYEOF' || die "the wheels' files could not be packed"
import io, re, sys, tarfile, zipfile
out_path, rest = sys.argv[1], sys.argv[2:]
wheels = [a for a in rest if a.endswith(".whl")]
wanted = [a for a in rest if not a.endswith(".whl")]
found = {}
for w in wheels:
    with zipfile.ZipFile(w) as whl:
        for name in whl.namelist():
            # purelib/ of a .data folder is the package's place once installed
            short = re.sub(r"^[^/]+\.data/purelib/", "", name)
            if short in wanted:
                found[short] = whl.read(name)
missing = [n for n in wanted if n not in found]
if missing:
    sys.exit(f"peer-fetch: not in the wheels: {', '.join(missing)}")
with tarfile.open(out_path, "w:xz") as out:
    for name in sorted(found):
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(found[name]), 0o644, 0
        out.addfile(info, io.BytesIO(found[name]))
print(f"peer-fetch: {len(found)} files of {len(wheels)} wheels", file=sys.stderr)
PYEOF

fetch_deps wheel wheels -- "${WHEELS[@]}"
printf 'vllm %s\nverl %s\nopenrlhf %s\n' "$VLLM_VERSION" "$VERL_VERSION" "$OPENRLHF_VERSION" >"$DEST/VERSIONS"
fetch_manifest VERSIONS WHEELS rl-py.tar.xz deps.tar.xz
