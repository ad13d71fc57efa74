#!/usr/bin/env bash
# Apply patches/tensorflow-2.21.0-jax-on-use.patch (its header says why) to the TensorFlow installed in a Python
# environment; a no-op where it is applied already.
#
#   bash tools/tensorflow_patch.sh .venv/bin/python      # what the install stamp and binder/postBuild run
set -euo pipefail

PYTHON=${1:?usage: tools/tensorflow_patch.sh PATH/TO/python}
VERSION=2.21.0
PATCH=$(cd "$(dirname "$0")/.." && pwd)/patches/tensorflow-$VERSION-jax-on-use.patch

say() { echo "[tensorflow patch] $*" >&2; }

# find_spec does not import TensorFlow (8 s here): it only locates it
read -r found site < <("$PYTHON" -c "import importlib.metadata as m, importlib.util as u, os
spec = u.find_spec('tensorflow')
print(m.version('tensorflow'), os.path.dirname(list(spec.submodule_search_locations)[0]))")
if [ "$found" != "$VERSION" ]; then
    say "$PATCH is for TensorFlow $VERSION, $PYTHON has $found: install tensorflow==$VERSION, or drop the patch as its header says"
    exit 1
fi
command -v patch >/dev/null || { say "needs GNU patch: apt-get install patch"; exit 1; }
if patch -p1 -d "$site" --dry-run --reverse --force --silent <"$PATCH" >/dev/null 2>&1; then
    exit 0  # applied already
fi
patch -p1 -d "$site" --forward --batch --silent <"$PATCH" || {
    say "the patch does not apply to $site/tensorflow: reinstall tensorflow==$VERSION (pip install --force-reinstall)"
    exit 1
}
say "applied to $site/tensorflow ($(basename "$PATCH"))"
