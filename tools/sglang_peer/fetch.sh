#!/usr/bin/env bash
# tools/sglang_peer/fetch.sh - `make peer-fetch`: the files `PEER_SUITES=sglang
# make peer` needs, fetched once on a machine with the network, into
# PEER_DIR/sglang/ (default .peer/sglang/, git-ignored: other people's code).
# The GPU machine that runs the suite needs no network and no package index.
#
#   sglang-py.tar.xz   the .py files of SGLang's released wheel (never
#                      installed: its tag is cp311 and it pins another torch),
#                      less multimodal_gen/ and jit_kernel/ (diffusion models,
#                      kernel sources) and every compiled or data file (their
#                      folders stay): 7 of its 39 MiB
#   deps.tar.xz        the packages its transport and its unit test import,
#                      for CPython 3.12 on x86_64 Linux (pinned below): the
#                      wheels' contents in one archive (xz packs them into 2/3
#                      of the wheels' size); the run puts them after the
#                      machine's own packages
#   WHEELS             which wheels those are, with their sha256
#   test_cuda_ipc_transport.py   SGLang's unit test of the transport, from
#                      its repository at the release's tag (or SGLANG_TEST_FILE)
#   MANIFEST           sha256 of each of those; the run checks it and stops
#                      on a missing or changed file
#
# usage: tools/sglang_peer/fetch.sh [PEER_DIR]
# Environment:
#   SGLANG_VERSION    the release (default 0.5.23)
#   SGLANG_TEST_FILE  a copy of test/registered/unit/multimodal/test_cuda_ipc_transport.py
#                     taken from SGLang's repository (default: downloaded at tag v$SGLANG_VERSION)
#   PYTHON            the pip that downloads (default python3)
# Exit status: 0 fetched, 1 a download failed, 2 a usage error.
set -u -o pipefail
# shellcheck source=tools/peer_fetch.sh
. "$(dirname "${BASH_SOURCE[0]}")/../peer_fetch.sh"

fetch_args "$@"
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
fetch_release SGLANG_VERSION
VERSION=$SGLANG_VERSION
TEST_PATH=test/registered/unit/multimodal/test_cuda_ipc_transport.py
TEST_URL=https://raw.githubusercontent.com/sgl-project/sglang/v$VERSION/$TEST_PATH
# What the transport's import closure and the unit test's reach, beyond what a
# machine with PyTorch 2.11, cuda-python and numpy has. The unit test imports
# SGLang's schedule_batch, which pulls in its model configs, quantization
# methods and kernels: transformers, torchvision, compressed-tensors, openai's
# protocol types, tvm-ffi and more.
WHEELS=(msgspec==0.23.0 orjson==3.13.0 pybase64==1.5.1 pyzmq==27.3.0 psutil==7.2.2
        pydantic==2.11.7 pydantic-core==2.33.2 typing-inspection==0.4.5 annotated-types==0.8.0
        typing-extensions==4.16.0 starlette==1.10.0 anyio==4.16.0 sniffio==1.3.1 idna==3.20
        requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3
        packaging==26.4 pillow==13.0.0 tqdm==4.70.1
        aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 attrs==26.1.0
        aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
        transformers==5.19.0 tokenizers==0.23.2 huggingface-hub==2.4.0 safetensors==0.8.0
        regex==2026.11.19 pyyaml==6.0.4 filelock==4.3.1 fsspec==2026.9.0
        httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0
        dill==0.4.1 torchvision==0.26.0 compressed-tensors==0.18.0 loguru==0.7.3 gguf==0.19.0
        sentencepiece==0.2.1 partial-json-parser==0.2.1.1.post7
        openai==2.8.0 httpx==0.28.1 httpcore==1.0.9 distro==1.9.0 jiter==0.19.0
        apache-tvm-ffi==0.1.11)

fetch_begin sglang "${1:-}"
rm -rf "$DEST/wheels" # an older fetch's
note "sglang $VERSION's wheel"
fetch_pip 3.11 "$tmp/wheel" --platform manylinux_2_34_x86_64 "sglang==$VERSION" ||
    die "pip could not download sglang==$VERSION"
wheel=$(find "$tmp/wheel" -name "sglang-*.whl" | head -n 1)
[ -n "$wheel" ] || die "no sglang wheel in what pip downloaded"
"$PYTHON" - "$wheel" "$DEST/sglang-py.tar.xz" <<'EOF' || die "the wheel's files could not be packed"
import io, sys, tarfile, zipfile
SKIP = ("sglang/multimodal_gen/", "sglang/jit_kernel/")
with zipfile.ZipFile(sys.argv[1]) as whl, tarfile.open(sys.argv[2], "w:xz") as out:
    names = [n for n in whl.namelist()
             if n.startswith("sglang/") and n.endswith(".py") and not n.startswith(SKIP)]
    # Every folder of the wheel, even one left empty: SGLang checks at import
    # that its kernel source folders exist (it compiles from them only on use).
    folders = {n.rsplit("/", 1)[0] for n in whl.namelist() if n.startswith("sglang/")}
    for name in sorted(folders):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
        out.addfile(info)
    for name in sorted(names):
        info = tarfile.TarInfo(name)
        data = whl.read(name)
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        out.addfile(info, io.BytesIO(data))
    print(f"peer-fetch: {len(names)} files of {sys.argv[1].rsplit('/', 1)[-1]}", file=sys.stderr)
EOF

fetch_deps wheels -- "${WHEELS[@]}"

if [ -n "${SGLANG_TEST_FILE:-}" ]; then
    cp "$SGLANG_TEST_FILE" "$tmp/test.py" || die "cannot read SGLANG_TEST_FILE $SGLANG_TEST_FILE"
else
    curl -fsSL --max-time 60 -o "$tmp/test.py" "$TEST_URL" ||
        die "cannot download $TEST_URL (set SGLANG_TEST_FILE to a copy of $TEST_PATH)"
fi
grep -q "class TestCudaIpcTransport" "$tmp/test.py" || die "the test file has no TestCudaIpcTransport"
cp "$tmp/test.py" "$DEST/test_cuda_ipc_transport.py"

echo "$VERSION" >"$DEST/VERSION"
fetch_manifest VERSION WHEELS sglang-py.tar.xz deps.tar.xz test_cuda_ipc_transport.py
