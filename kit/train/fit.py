"""The links benchmark's training (``kit bench --only links``, :mod:`kit.tools.link_bench`): the tutorial's CNN or its
pooled variant with few parameters (:data:`kit.train.models.ARCHITECTURES`), its gradients summed in float32 or
float16, timed over emulated links. No lesson trains the pooled model; the lessons' own training is in their
cells, and the benchmark's other rows run those (:mod:`kit.tools.bench`).
"""

from __future__ import annotations

import time
from typing import Any

from . import progress
from ._tf import import_tensorflow
from .strategies import build_strategy


def train_mnist(per_worker_batch: int = 64, epochs: int = 2, steps_per_epoch: int = 20,
                strategy: str = "multi_worker_mirrored", seed: int = 42, *, gradient_compression: str = "none",
                architecture: str = "dense") -> dict[str, Any]:
    """``fit`` MNIST on this task (global batch ``per_worker_batch × workers``); the parameters of the model and
    the steady-state examples/s (epochs after the first, which includes tracing)."""
    tf = import_tensorflow()
    from . import data, models
    started = time.perf_counter()
    tf.keras.utils.set_random_seed(seed)
    dist = build_strategy(strategy)  # one per process (kit.train.strategies says why)
    global_batch = per_worker_batch * dist.num_replicas_in_sync
    with dist.scope():
        model = models.build_and_compile_cnn_model(gradient_compression=gradient_compression,
                                                   architecture=architecture)
    measured = progress.callback(global_batch)
    model.fit(data.mnist_dataset(global_batch, shuffle_seed=seed), epochs=epochs, steps_per_epoch=steps_per_epoch,
              verbose=0, callbacks=[measured])
    return {"parameters": int(model.count_params()), **measured.summary(),
            "wall_seconds": time.perf_counter() - started}
