"""MNIST for the notebooks and the workers: the bundled copy, checked, kept as uint8.

Images stay uint8 (47 MB for the training set) until a ``map`` casts each batch to float32, so a
worker does not hold several float copies of the data (one worker peaked at 1.4 GB that way).
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
TRAIN_EXAMPLES = 60000


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


def scale_batch(images, labels):
    """A batch of MNIST as the models take it: images float32 in [0, 1], labels int64."""
    tf = _tf()
    return tf.cast(images, tf.float32) / 255.0, tf.cast(labels, tf.int64)


def _tf():
    from ._tf import import_tensorflow

    return import_tensorflow()


def mnist_dataset(global_batch_size: int, *, path: str | os.PathLike | None = None,
                  shuffle_seed: int | None = None, train: bool = True, repeat: bool = True,
                  shard: tuple[int, int] | None = None):
    """The seeds' training pipeline: ``shuffle(60000).repeat().batch(global_batch_size)``.

    Images are cast to float32 in [0, 1] per batch, so only the uint8 copy lives in memory. What is
    shuffled is the example *indices* (the same permutation, so the same batches, as shuffling the
    examples), and each batch is gathered from the uint8 arrays held once per process (see
    :func:`resident_arrays`). ``train=False`` gives the test set (not shuffled, not repeated).
    ``shard=(count, index)`` keeps every count-th example from the index-th (Horovod's sharding by rank:
    with one ``shuffle_seed`` on every rank, the ranks read disjoint examples).
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise KitError(f"global_batch_size={global_batch_size!r}: it must be a whole number >= 1. "
                       "Fix: pass per-worker batch × number of workers, e.g. 64 * 2")
    if shard is not None and not (isinstance(shard, tuple) and len(shard) == 2 and 0 <= shard[1] < shard[0]):
        raise KitError(f"shard={shard!r}: it must be (count, index) with 0 <= index < count. "
                       "Fix: e.g. shard=(hvd.size(), hvd.rank())")
    tf = _tf()
    images, labels = resident_arrays(mnist_path(path), train)

    def gather(indices):
        return scale_batch(tf.gather(images, indices), tf.gather(labels, indices))

    dataset = tf.data.Dataset.range(int(images.shape[0]))
    if not train:
        return dataset.batch(global_batch_size).map(gather)
    dataset = dataset.shuffle(int(images.shape[0]), seed=shuffle_seed)
    if repeat:
        dataset = dataset.repeat()
    if shard is not None:
        dataset = dataset.shard(*shard)
    return dataset.batch(global_batch_size).map(gather, num_parallel_calls=tf.data.AUTOTUNE)


_RESIDENT: dict[tuple[Path, bool], tuple] = {}


def resident_arrays(source: Path, train: bool) -> tuple:
    """MNIST's images and labels (uint8) as TensorFlow values, made once per process.

    Where it is safe they are local ``tf.Variable`` s: a dataset that captures a variable keeps a
    handle to it, whereas a captured constant is copied whenever the dataset's graph is serialized —
    and ``experimental_distribute_dataset`` and ``model.fit`` do that to shard it, which cost a worker
    47 MB per copy. Inside a strategy's scope a variable would be distributed, and inside a function
    being traced (e.g. ParameterServerStrategy's per-worker dataset function, which is sent to other
    processes) it would belong to this process only: there the arrays are constants, as before.
    """
    tf = _tf()
    as_variables = tf.executing_eagerly() and not tf.distribute.has_strategy()
    key = (source, train)
    if as_variables and key in _RESIDENT:
        return _RESIDENT[key]
    (x_train, y_train), (x_test, y_test) = load_mnist(source)
    images, labels = (x_train, y_train) if train else (x_test, y_test)
    if not as_variables:
        return tf.constant(images), tf.constant(labels)
    resident = (tf.Variable(images, trainable=False, name="mnist_images"),
                tf.Variable(labels, trainable=False, name="mnist_labels"))
    _RESIDENT[key] = resident
    return resident
