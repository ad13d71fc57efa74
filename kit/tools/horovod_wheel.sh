#!/usr/bin/env bash
# Install Horovod (TensorFlow + Gloo, CPU) into a Python environment, from PyPI's sdist plus the
# patch kept in patches/, building the wheel once and reusing it from a cache outside the repository.
#
#   bash kit/tools/horovod_wheel.sh .venv/bin/python   # what `make horovod` runs
#   kit horovod                                         # the same, from an installed kit (Colab: !kit horovod)
#
# The cache key is Horovod's version + the installed TensorFlow's version + the Python tag + the patch's
# hash, so a fresh clone on the same machine (CI) reuses the wheel, and a new TensorFlow or patch
# builds a new one. Cache: $KIT_CACHE_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/kit.
# Needs cmake and g++ for the build (about 5 minutes on 2 cores); as root on Debian/Ubuntu they are
# installed with apt-get when missing, otherwise the script stops and names the fix.
set -euo pipefail

PYTHON=${1:?usage: kit/tools/horovod_wheel.sh PATH/TO/python}
HOROVOD_VERSION=0.28.1
# the patch: patches/ in a checkout (two folders up), kit/patches in an installed wheel (one up)
HERE=$(cd "$(dirname "$0")" && pwd)
PATCH_NAME=horovod-$HOROVOD_VERSION-tf2.21.patch
for PATCHES in "$HERE/../../patches" "$HERE/../patches"; do [ -f "$PATCHES/$PATCH_NAME" ] && break; done
HOROVOD_PATCH=${HOROVOD_PATCH-$PATCHES/$PATCH_NAME}
CACHE=${KIT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kit}/wheels

say() { echo "[horovod] $*" >&2; }

installed=$("$PYTHON" -c "from importlib.metadata import version as v; print(v('horovod'))" 2>/dev/null || true)
tf_version=$("$PYTHON" -c "from importlib.metadata import version as v; print(v('tensorflow'))") || {
    say "tensorflow is not installed in $PYTHON's environment: install the kit first (make .venv/.installed)"
    exit 1
}
py_tag=$("$PYTHON" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
patch_hash=none
if [ -n "$HOROVOD_PATCH" ]; then
    patch_hash=$(sha256sum "$HOROVOD_PATCH" | cut -c1-12)
fi
key="horovod-$HOROVOD_VERSION-tf$tf_version-$py_tag-patch-$patch_hash"
wheel_dir="$CACHE/$key"

marker="$("$PYTHON" -c "import sys; print(sys.prefix)")/.horovod-wheel"
if [ "$installed" = "$HOROVOD_VERSION" ] && [ "$(cat "$marker" 2>/dev/null)" = "$wheel_dir" ]; then
    exit 0  # this environment has the wheel of this very cache entry
fi

wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v "${CXX:-g++}" >/dev/null || missing+=(g++)
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            say "installing ${missing[*]} with apt-get (needed once, to build Horovod)"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            say "building Horovod needs ${missing[*]}, which this machine lacks."
            say "Fix: install them (Debian/Ubuntu: sudo apt-get install cmake g++; conda: conda install -c conda-forge cmake cxx-compiler), then run make again."
            exit 1
        fi
    fi
    "$PYTHON" -c "import setuptools, wheel" 2>/dev/null || {
        say "building Horovod without build isolation needs setuptools and wheel in $PYTHON's environment."
        say "Fix: $PYTHON -m pip install setuptools wheel, then run make again."
        exit 1
    }
    work=$(mktemp -d "${TMPDIR:-/tmp}/kit-horovod-build.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    say "no cached wheel $key: building it (about 5 minutes on 2 cores)"
    started=$(date +%s)
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "horovod==$HOROVOD_VERSION" -d "$work"
    tar xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    if [ -n "$HOROVOD_PATCH" ]; then
        (cd "$src" && git apply -p1 "$HOROVOD_PATCH")
        say "applied $(basename "$HOROVOD_PATCH")"
    fi
    # CPU only: the TensorFlow extension with Gloo; no MPI, PyTorch, MXNet, GPU
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
        "$PYTHON" -m pip wheel --quiet --no-build-isolation --no-deps -w "$work/dist" "$src" >"$work/build.log" 2>&1 || {
        tail -n 40 "$work/build.log" >&2
        say "the Horovod build failed (last lines above; whole log: $work/build.log, kept)."
        trap - EXIT
        exit 1
    }
    mkdir -p "$wheel_dir"
    built=$(ls "$work"/dist/horovod-*.whl)
    cp "$built" "$wheel_dir/.partial" && mv "$wheel_dir/.partial" "$wheel_dir/$(basename "$built")"
    wheel="$wheel_dir/$(basename "$built")"
    say "built in $(( $(date +%s) - started )) s; cached as $wheel"
else
    say "reusing the cached wheel $wheel"
fi
# Horovod's own requirements (cloudpickle, psutil, pyyaml, packaging) come with the kit's pins already
"$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$PYTHON" -m pip check >/dev/null || { "$PYTHON" -m pip check >&2; say "Horovod's requirements are not met (above)"; exit 1; }
echo "$wheel_dir" >"$marker"
