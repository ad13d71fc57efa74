"""MNIST for the notebooks and the workers: the bundled copy, checked, loaded as uint8 (the lessons scale it in
their own pipelines, batch by batch).
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path

import numpy as np

from ..core.errors import KitError

#: The copy of MNIST shipped inside the package, as package data (kit/train/datasets; its README.md gives
#: provenance and license): found the same way in a checkout, an editable install and an installed wheel.
BUNDLED_MNIST = Path(str(resources.files(__package__) / "datasets" / "mnist.npz"))
#: sha256 of the bundled file.
BUNDLED_MNIST_SHA256 = "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64"
MNIST_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
def sha256_of(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def mnist_path(path: str | os.PathLike | None = None) -> Path:
    """Where MNIST is read from: ``path``, else ``$KIT_DATA_DIR/mnist.npz``, else the bundled copy."""
    if path is not None:
        candidate, source = Path(path), "the path given"
    elif os.environ.get("KIT_DATA_DIR"):
        candidate, source = Path(os.environ["KIT_DATA_DIR"]) / "mnist.npz", "$KIT_DATA_DIR"
    else:
        candidate, source = BUNDLED_MNIST, "the bundled copy"
    if not candidate.is_file():
        raise KitError(f"MNIST not found at {candidate} ({source}). Fix: pass path= to an mnist.npz "
                       "with x_train, y_train, x_test, y_test, or set KIT_DATA_DIR to its folder; for the "
                       "bundled copy, git checkout kit/train/datasets/mnist.npz in a checkout, or "
                       "reinstall the kit (pip install --force-reinstall WHEEL_OR_SOURCE_FOLDER)")
    return candidate


_CHECKED: set[Path] = set()


def load_mnist(path: str | os.PathLike | None = None):
    """``((x_train, y_train), (x_test, y_test))`` as uint8 arrays, like ``keras.datasets.mnist``.

    The bundled file's sha256 is checked (once per process); other files must hold the four arrays.
    """
    source = mnist_path(path)
    if source == BUNDLED_MNIST and source not in _CHECKED:
        actual = sha256_of(source)
        if actual != BUNDLED_MNIST_SHA256:
            raise KitError(f"{source} has sha256 {actual}, expected {BUNDLED_MNIST_SHA256}: the file "
                           "is damaged or was replaced. Fix: git checkout kit/train/datasets/mnist.npz in a "
                           "checkout, or reinstall the kit (pip install --force-reinstall "
                           "WHEEL_OR_SOURCE_FOLDER)")
        _CHECKED.add(source)
    with np.load(source) as archive:
        missing = [name for name in MNIST_ARRAYS if name not in archive]
        if missing:
            raise KitError(f"{source} lacks the arrays {', '.join(missing)}. Fix: save x_train, "
                           "y_train, x_test, y_test with numpy.savez_compressed")
        x_train, y_train, x_test, y_test = (archive[name] for name in MNIST_ARRAYS)
    return (x_train, y_train), (x_test, y_test)


