# shellcheck shell=bash
# tools/peer_fetch.sh - what the two halves of `make peer-fetch`
# (tools/sglang_peer/fetch.sh, tools/rl_peer/fetch.sh) share; sourced by
# each, never run. The calling script's header, from its second line to its
# `set -u` line, is its usage text.

# Each download is of wheels built for x86_64 Linux, whatever this machine is.
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64
           --platform any)

note() { echo "peer-fetch: $*" >&2; }
die() { note "$*"; exit 1; }
usage() { sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# fetch_args "$@": -h prints the usage; an option or a second argument is a
# usage error (exit 2): nothing is fetched.
fetch_args() {
    case ${1:-} in
        -h|--help) usage; exit 0 ;;
        -*) echo "peer-fetch: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
    [ $# -le 1 ] || { echo "peer-fetch: one PEER_DIR at most" >&2; exit 2; }
}

# fetch_release NAME: the variable NAME holds a release number (it goes into
# a pip requirement and a URL), else a usage error.
fetch_release() {
    [[ ${!1} =~ ^[0-9]+(\.[0-9]+)+(\.post[0-9]+)?$ ]] ||
        { echo "peer-fetch: $1 '${!1}' is not a release number" >&2; exit 2; }
}

# fetch_begin NAME [PEER_DIR]: DEST (PEER_DIR/NAME, made, its old MANIFEST
# gone so that a half-done fetch is never taken for a whole one), PYTHON and
# tmp, a folder removed at exit.
fetch_begin() {
    PYTHON=${PYTHON:-python3}
    DEST=${2:-.peer}/$1
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/$1-fetch.XXXXXX") || exit 1
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$DEST" || exit 1
    rm -f "$DEST/MANIFEST"
}

# fetch_pip PYVER DIR [--platform TAG]... SPEC...: pip downloads the wheels
# SPEC names, without their dependencies, for CPython PYVER into DIR; the
# platforms given come before PLATFORMS (pip prefers them).
fetch_pip() {
    local pyver=$1 dir=$2 first=()
    shift 2
    while [[ ${1:-} == --platform ]]; do
        first+=("$1" "$2")
        shift 2
    done
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp "${first[@]}" "${PLATFORMS[@]}" -d "$dir" "$@"
}

# fetch_deps SUBDIR... -- SPEC...: the packages SPEC names for CPython 3.12,
# unpacked together into DEST/deps.tar.xz; DEST/WHEELS lists with its sha256
# every wheel in tmp/SUBDIR (those just downloaded are in tmp/wheels).
fetch_deps() {
    local listed=()
    while [[ $1 != -- ]]; do
        listed+=("$1")
        shift
    done
    shift
    note "$# wheels for CPython 3.12"
    fetch_pip 3.12 "$tmp/wheels" "$@" || die "pip could not download the wheels"
    (cd "$tmp" && for d in "${listed[@]}"; do sha256sum -- "$d"/*.whl || exit 1; done |
        sed 's#  wheels\{0,1\}/#  #') >"$DEST/WHEELS" || die "WHEELS not written"
    mkdir -p "$tmp/deps"
    local whl
    for whl in "$tmp"/wheels/*.whl; do
        "$PYTHON" -m zipfile -e "$whl" "$tmp/deps" || die "cannot unpack $whl"
    done
    note "packing them (a few minutes)"
    tar -C "$tmp/deps" --sort=name --mtime=@0 --owner=0 --group=0 -cf - . | xz -T0 -4 >"$DEST/deps.tar.xz" ||
        die "deps.tar.xz not written"
}

# fetch_manifest FILE...: DEST/MANIFEST, the sha256 of each FILE of DEST,
# written last: the run checks it and stops on a missing or changed file.
fetch_manifest() {
    (cd "$DEST" && sha256sum "$@" >MANIFEST) || die "MANIFEST not written"
    note "$(du -sh "$DEST" | cut -f1) in $DEST ($(wc -l <"$DEST/MANIFEST") files)"
}
