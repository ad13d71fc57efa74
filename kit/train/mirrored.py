"""One process, several devices: logical CPUs for MirroredStrategy, and the Keras guide's examples.

TensorFlow's distributed-training guide and its Keras tutorial assume GPUs. On a CPU-only machine
:func:`split_cpu` splits the one physical CPU into logical devices, so that ``MirroredStrategy``
has one replica per device (:mod:`kit.train.strategies` calls it). The rest of this module holds the
guide's small pieces (its toy model, learning-rate table, MNIST model and arrays, learning-rate decay),
checked against the guide's numbers by the tests. Notebook 02 writes them out in cells; notebook 02b, whose
lessons are elsewhere, takes :func:`split_cpu`, :func:`build_toy_model`, :func:`build_guide_cnn` and
:func:`guide_mnist_arrays` from here. :func:`reduction_summary` reads TensorFlow's log for how the gradients
were reduced (:func:`kit.train.mirrored_probes.fit_report` calls it for 02b's table).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ._tf import import_tensorflow
from ..core.errors import KitError, OptionError
from .probes import captured_tf_log  # noqa: F401  (kept here for existing callers)

#: The guide's learning rate for each *global* batch size (per-replica batch 5 × 1, 2, 4 replicas).
LEARNING_RATES_BY_BATCH_SIZE = {5: 0.1, 10: 0.15, 20: 0.175}
#: Cross-device reductions MirroredStrategy accepts; "default" lets the strategy choose.
CROSS_DEVICE_OPS = ("default", "HierarchicalCopyAllReduce", "ReductionToOneDevice", "NcclAllReduce")


def split_cpu(n: int) -> list:
    """Split the first physical CPU into ``n`` logical devices and return the logical CPUs.

    Must run before TensorFlow initializes its runtime (any op, or listing logical devices,
    initializes it). Calling it again with the same ``n`` is harmless; with another ``n`` after
    initialization it raises :class:`~kit.core.errors.KitError` saying to restart the process.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OptionError("n", f"{n!r} is not a whole number >= 1", "give the number of logical CPUs, e.g. n=2")
    tf = import_tensorflow()
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) != n:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        except RuntimeError as error:
            have = len(current) if current else 1
            raise KitError(f"cannot split the CPU into {n} devices: TensorFlow's runtime is already "
                           f"initialized with {have} ({error}). Fix: restart the kernel (or use a "
                           "fresh process, e.g. kit.TFCluster(workers=1)) and split first") from None
    return tf.config.list_logical_devices("CPU")


def learning_rate_for(global_batch: int) -> float:
    """The guide's learning rate for ``global_batch``; between its entries, linearly interpolated."""
    sizes = sorted(LEARNING_RATES_BY_BATCH_SIZE)
    if global_batch in LEARNING_RATES_BY_BATCH_SIZE:
        return LEARNING_RATES_BY_BATCH_SIZE[global_batch]
    return float(np.interp(global_batch, sizes, [LEARNING_RATES_BY_BATCH_SIZE[s] for s in sizes]))


def build_toy_model(learning_rate: float = 0.1):
    """The guide's smallest Keras model: one Dense unit with L2, SGD, mean squared error.

    Build it inside ``strategy.scope()``.
    """
    tf = import_tensorflow()
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(1,)),
        tf.keras.layers.Dense(1, kernel_regularizer=tf.keras.regularizers.L2(1e-4)),
    ])
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(learning_rate=learning_rate))
    return model


def build_guide_cnn(learning_rate: float = 0.001):
    """The Keras distributed tutorial's MNIST model: Conv2D, MaxPooling2D, Dense(64), Dense(10), Adam.

    Build it inside ``strategy.scope()``. Inputs are (28, 28, 1) floats in [0, 1].
    """
    tf = import_tensorflow()
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
                  metrics=["accuracy"])
    return model


def guide_decay(epoch: int) -> float:
    """The tutorial's learning-rate schedule: 1e-3 for epochs 0-2, 1e-4 for 3-6, 1e-5 after."""
    if epoch < 3:
        return 1e-3
    if epoch < 7:
        return 1e-4
    return 1e-5


def guide_mnist_arrays(train_examples: int = 60000, test_examples: int = 10000):
    """``((x_train, y_train), (x_test, y_test))``: the first examples, float32 (N, 28, 28, 1) in [0, 1]."""
    from .data import load_mnist

    (x_train, y_train), (x_test, y_test) = load_mnist()
    scale = (lambda x: (x.astype(np.float32) / 255.0)[..., None])
    return ((scale(x_train[:train_examples]), y_train[:train_examples].astype(np.int64)),
            (scale(x_test[:test_examples]), y_test[:test_examples].astype(np.int64)))


def make_cross_device_ops(name: str):
    """The ``cross_device_ops`` object for a name of :data:`CROSS_DEVICE_OPS` (None for "default")."""
    tf = import_tensorflow()
    factories: dict[str, Callable[[], Any]] = {
        "default": lambda: None,
        "HierarchicalCopyAllReduce": tf.distribute.HierarchicalCopyAllReduce,
        "ReductionToOneDevice": tf.distribute.ReductionToOneDevice,
        "NcclAllReduce": tf.distribute.NcclAllReduce,
    }
    if name not in factories:
        raise OptionError("cross_device_ops", f"{name!r} is unknown", f"use one of {', '.join(CROSS_DEVICE_OPS)}")
    return factories[name]()


_REDUCTION_PATTERNS = (
    (re.compile(r"Collective all_reduce tensors:.*implementation = CommunicationImplementation\.(\w+)"),
     "collective all-reduce, {}"),
    (re.compile(r"batch_all_reduce: .* algorithm = (\w+)"), "batch all-reduce, {}"),
    (re.compile(r"Reduce to (\S+) then broadcast"), "reduce to {}, then broadcast"),
)


def reduction_summary(messages: list[str]) -> str:
    """How the gradients were reduced, read from TensorFlow's log messages ("" if nothing says).

    A collective all-reduce or a batch all-reduce names the method; "reduce to one device, then
    broadcast" only counts when neither appears (the strategies also log it for small values).
    """
    for pattern, template in _REDUCTION_PATTERNS:
        for message in messages:
            match = pattern.search(message)
            if match:
                return template.format(match.group(1).rsplit("/", 1)[-1])
    return ""
