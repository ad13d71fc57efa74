"""The benchmark's Keras 3 + JAX rows: the tutorial's CNN trained with ``keras.distribution.DataParallel`` on the
processes of a :class:`kit.JaxCluster` (notebook 12 teaches the same code; this is the measured recipe).

Runs on the engines; imports Keras and JAX there, never TensorFlow (a JaxCluster's engines see none).
"""

from __future__ import annotations

import time
from typing import Any

from . import data, progress


def train_mnist(per_worker_batch: int = 64, epochs: int = 2, steps_per_epoch: int = 30, learning_rate: float = 0.001,
                seed: int = 42, verbose: int = 0) -> dict[str, Any]:
    """``epochs`` of ``steps_per_epoch`` steps of the tutorial's CNN (Reshape, Conv2D(32, 3), Dense(128),
    Dense(10), SGD), each process feeding ``per_worker_batch`` examples of every global batch (numpy arrays,
    ``auto_shard_dataset=False``). Returns the losses and the steady-state examples/s, as
    :func:`kit.train.fit.train_mnist` does for TensorFlow."""
    import jax
    import keras
    import numpy as np

    started = time.perf_counter()
    if not jax.distributed.is_initialized():
        keras.distribution.initialize()
    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    processes, index = jax.process_count(), jax.process_index()
    (images, labels), _ = data.load_mnist()
    # process p feeds the p-th slice of every global batch (as notebook 12's my_share), so that any number of
    # processes trains on the batches of one process; every epoch the same steps_per_epoch batches
    starts = np.arange(steps_per_epoch) * per_worker_batch * processes + index * per_worker_batch
    rows = (starts[:, None] + np.arange(per_worker_batch)).ravel()
    images, labels = images[rows] / 255.0, labels[rows]
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input(shape=(28, 28)),
        keras.layers.Reshape((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu", kernel_initializer=init(seed)),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu", kernel_initializer=init(seed + 1)),
        keras.layers.Dense(10, kernel_initializer=init(seed + 2)),
    ])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    measured = progress.callback(per_worker_batch * processes)
    history = model.fit(images, labels, batch_size=per_worker_batch, epochs=epochs, shuffle=False, verbose=verbose,
                        callbacks=[measured])
    return {"keras": "keras3 (jax)", "processes": processes, "global_batch": per_worker_batch * processes,
            "loss": [float(v) for v in history.history["loss"]], **measured.summary(),
            "wall_seconds": time.perf_counter() - started}
