#!/usr/bin/env bash
#
# test_peer_fetch.sh - `make peer-fetch`'s two scripts (tools/sglang_peer/
# fetch.sh, tools/rl_peer/fetch.sh, with what they share in
# tools/peer_fetch.sh) without the network: their arguments, refused before
# any download, and a whole fetch each through a stand-in of pip (PYTHON:
# `-m pip download` writes small wheels of fixed bytes, the rest goes to the
# real python3) and of SGLang's test file (SGLANG_TEST_FILE).

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup peer-fetch
TAP_SHOW="$tmp/out"
PY=$(command -v "${PYTHON:-python3}") || exit 1
unset SGLANG_VERSION SGLANG_TEST_FILE VLLM_VERSION VERL_VERSION OPENRLHF_VERSION PYTHON

# ---- arguments ----------------------------------------------------------------

for kind in sglang rl; do
    script=$root/tools/${kind}_peer/fetch.sh
    bash "$script" --help >"$tmp/out" 2>&1
    rc=$?
    check "$kind: --help prints the usage" eval \
        '[[ $rc == 0 ]] && grep -qx "usage: tools/${kind}_peer/fetch.sh \[PEER_DIR\]" "$tmp/out"'
    check "$kind: the usage ends before the script's code" eval '! grep -q "set -u\|peer_fetch" "$tmp/out"'
    bash "$script" --bogus >"$tmp/out" 2>&1
    rc=$?
    check "$kind: an unknown option is a usage error" eval \
        '[[ $rc == 2 ]] && grep -qx "peer-fetch: unknown option '"'--bogus'"'" "$tmp/out"'
    bash "$script" "$tmp/a" "$tmp/b" >"$tmp/out" 2>&1
    rc=$?
    check "$kind: two folders are a usage error" eval '[[ $rc == 2 ]] && [[ ! -e $tmp/a ]]'
done
for var in SGLANG_VERSION VLLM_VERSION VERL_VERSION OPENRLHF_VERSION; do
    kind=rl
    [[ $var == SGLANG_* ]] && kind=sglang
    env "$var=1.0; rm -rf /" bash "$root/tools/${kind}_peer/fetch.sh" "$tmp/nofetch" >"$tmp/out" 2>&1
    rc=$?
    check "$kind: a $var that is not a release number is a usage error, named" eval \
        '[[ $rc == 2 ]] && grep -q "^peer-fetch: $var .* is not a release number" "$tmp/out"'
    check "$kind: a refused $var makes no folder" test ! -e "$tmp/nofetch"
done

# ---- a whole fetch on stand-ins --------------------------------------------

# The stand-in's wheels: NAME-VERSION-py3-none-any.whl, holding an __init__.py of NAME
# and the paths listed in $tmp/holds/NAME, each file its own path as text.
mkdir -p "$tmp/bin" "$tmp/holds" "$tmp/tmpdir"
cat >"$tmp/bin/python" <<EOF
#!/usr/bin/env bash
[[ \${1:-} == -m && \${2:-} == pip ]] || exec "$PY" "\$@"
echo "\$*" >>"$tmp/pip.log"
[[ -z \${STANDIN_PIP_FAILS:-} ]] || exit 1
exec "$PY" - "$tmp/holds" "\$@" <<'PYEOF'
import os, sys, zipfile
holds, args = sys.argv[1], sys.argv[5:]
dest = args[args.index("-d") + 1]
specs = [a for a in args if "==" in a]
os.makedirs(dest, exist_ok=True)
for spec in specs:
    name, version = spec.split("==")
    pkg = name.replace("-", "_")
    paths = [f"{pkg}/__init__.py"]
    if os.path.exists(f"{holds}/{name}"):
        paths += open(f"{holds}/{name}").read().split()
    with zipfile.ZipFile(f"{dest}/{pkg}-{version}-py3-none-any.whl", "w") as whl:
        for path in paths:
            whl.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), path + "\n")
PYEOF
EOF
chmod +x "$tmp/bin/python"
# fetch KIND NAME [VAR=VALUE...]: KIND's script into $tmp/NAME on the stand-ins.
fetch() {
    local kind=$1 name=$2
    shift 2
    env PYTHON="$tmp/bin/python" TMPDIR="$tmp/tmpdir" "$@" \
        bash "$root/tools/${kind}_peer/fetch.sh" "$tmp/$name" >"$tmp/out" 2>&1
}
# manifest_holds DIR: every file of DIR's MANIFEST is there as it says.
manifest_holds() { (cd "$1" && sha256sum --quiet -c MANIFEST); }
# tar_has ARCHIVE PATH...: the archive holds each PATH.
tar_has() {
    local archive=$1 path
    shift
    tar -tJf "$archive" >"$tmp/list" || return 1
    for path; do grep -qx -- "$path" "$tmp/list" || { echo "# $path not in $archive"; return 1; }; done
}

# SGLang: its wheel's .py files but those of multimodal_gen/, its test file.
printf '%s\n' sglang/srt/transport.py sglang/srt/kernel.so sglang/multimodal_gen/gen.py >"$tmp/holds/sglang"
printf 'class TestCudaIpcTransport:\n    pass\n' >"$tmp/test.py"
fetch sglang sg SGLANG_TEST_FILE="$tmp/test.py"
check "sglang: a whole fetch succeeds" test $? = 0
dest=$tmp/sg/sglang
check "sglang: MANIFEST names its five files, as they are" eval \
    '[[ $(wc -l <"$dest/MANIFEST") == 5 ]] && manifest_holds "$dest"'
check "sglang: the wheel's .py files are packed, not the others" eval \
    'tar_has "$dest/sglang-py.tar.xz" sglang/srt/transport.py sglang/srt/ &&
     ! grep -q "kernel.so\|gen.py" "$tmp/list"'
wheels=$(sed -n '/^WHEELS=(/,/)$/p' "$root/tools/sglang_peer/fetch.sh" | grep -o '[^ (]*==' | wc -l)
check "sglang: WHEELS lists each dependency's wheel (not SGLang's) with its sha256" eval \
    '[[ $(wc -l <"$dest/WHEELS") == "$wheels" ]] && ! grep -q " sglang-" "$dest/WHEELS" &&
     grep -Eq "^[0-9a-f]{64}  pyzmq-27.3.0-py3-none-any.whl$" "$dest/WHEELS"'
check "sglang: the dependencies are unpacked into deps.tar.xz" tar_has "$dest/deps.tar.xz" ./pyzmq/__init__.py
check "sglang: the test file and the version are kept" eval \
    'cmp -s "$tmp/test.py" "$dest/test_cuda_ipc_transport.py" && [[ $(cat "$dest/VERSION") == 0.5.23 ]]'
check "sglang: its wheel is asked for CPython 3.11, manylinux_2_34 preferred" \
    grep -q -- '--python-version 3.11 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 .* sglang==0.5.23$' "$tmp/pip.log"
check "sglang: the temporary folder is removed" eval '[[ -z $(ls -A "$tmp/tmpdir") ]]'
fetch sglang sg SGLANG_TEST_FILE="$tmp/test.py" STANDIN_PIP_FAILS=1
rc=$?
check "sglang: a failed download fails the fetch, said" eval \
    '[[ $rc == 1 ]] && grep -q "^peer-fetch: pip could not download sglang==0.5.23" "$tmp/out"'
check "sglang: ... and leaves no MANIFEST" test ! -e "$dest/MANIFEST"

# The RL projects: the files the weight sync reaches, OpenRLHF's under its
# wheel's .data/purelib/.
eval "$(sed -n '/^FILES=(/,/)$/p' "$root/tools/rl_peer/fetch.sh")"
for name in vllm verl; do
    printf '%s\n' "${FILES[@]}" | grep "^$name/" >"$tmp/holds/$name"
done
printf '%s\n' "${FILES[@]}" | sed -n 's#^openrlhf/#openrlhf-0.11.2.data/purelib/openrlhf/#p' >"$tmp/holds/openrlhf"
echo vllm/unrelated.py >>"$tmp/holds/vllm"
: >"$tmp/pip.log"
fetch rl rl
check "rl: a whole fetch succeeds" test $? = 0
dest=$tmp/rl/rl
check "rl: MANIFEST names its four files, as they are" eval \
    '[[ $(wc -l <"$dest/MANIFEST") == 4 ]] && manifest_holds "$dest"'
check "rl: exactly the weight sync's files are packed, by their installed names" eval \
    'tar_has "$dest/rl-py.tar.xz" "${FILES[@]}" && [[ $(wc -l <"$tmp/list") == "${#FILES[@]}" ]]'
wheels=$(sed -n '/^WHEELS=(/,/)$/p' "$root/tools/rl_peer/fetch.sh" | grep -o '[^ (]*==' | wc -l)
check "rl: WHEELS lists the three releases' wheels and the dependencies'" eval \
    '[[ $(wc -l <"$dest/WHEELS") == $((wheels + 3)) ]] &&
     grep -Eq "^[0-9a-f]{64}  vllm-0.33.0-py3-none-any.whl$" "$dest/WHEELS"'
check "rl: the dependencies are unpacked into deps.tar.xz" tar_has "$dest/deps.tar.xz" ./transformers/__init__.py
printf 'vllm 0.33.0\nverl 0.9.1\nopenrlhf 0.11.2\n' >"$tmp/versions"
check "rl: VERSIONS names the three releases" cmp -s "$tmp/versions" "$dest/VERSIONS"
check "rl: every download is for CPython 3.12 on x86_64 Linux" eval \
    '[[ $(grep -c -- "--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 " "$tmp/pip.log") == 2 ]]'
check "rl: the temporary folder is removed" eval '[[ -z $(ls -A "$tmp/tmpdir") ]]'
: >"$tmp/holds/verl"
fetch rl rl
rc=$?
check "rl: a file the wheels lack fails the fetch, named" eval \
    '[[ $rc == 1 ]] && grep -q "not in the wheels: verl/utils/device.py" "$tmp/out"'
check "rl: ... and leaves no MANIFEST" test ! -e "$dest/MANIFEST"

tap_summary peer-fetch
