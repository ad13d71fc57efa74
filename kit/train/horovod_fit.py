"""The seeds' Horovod recipe as a function that runs on each rank of a :class:`kit.HorovodCluster`.

The benchmark and the tests call it; notebook 09 writes the same recipe in its own cells, where a
learner edits it. Returns plain, picklable results, with the same keys as
:func:`kit.train.fit.train_mnist` so that the two can be compared row by row.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from . import progress
from ._tf import import_tensorflow, keras_flavour
from ..core.errors import OptionError
from ..core.tfconfig import this_task

COMPRESSIONS = ("none", "fp16")


def train_mnist(per_worker_batch: int = 64, epochs: int = 3, steps_per_epoch: int = 70,
                learning_rate: float = 0.001, compression: str = "none", scale_learning_rate: bool = True,
                seed: int = 42, verbose: int = 2, checkpoint_dir: str | None = None,
                steps_per_execution: int = 1) -> dict[str, Any]:
    """hvd.init(), the data sharded by rank, learning rate × size (``scale_learning_rate``),
    hvd.DistributedOptimizer (``compression="fp16"``: gradients all-reduced in float16), the initial
    variables broadcast from rank 0, checkpoints (``checkpoint_dir``) and progress on rank 0 only.

    Examples/s is the steady state (epochs after the first) of the whole job: per-worker batch ×
    size per second. ``weights_checksum`` (sum of every weight) lets the caller check that the ranks
    ended with identical models. ``steps_per_execution=k`` runs k steps per call into TensorFlow
    (fewer Python round trips; the all-reduces stay one per step).
    """
    if compression not in COMPRESSIONS:
        raise OptionError("compression", f"{compression!r} is unknown",
                          f"use one of {', '.join(map(repr, COMPRESSIONS))}")
    tf = import_tensorflow()
    import horovod.tensorflow.keras as hvd

    from . import data, models
    started = time.perf_counter()
    hvd.init()
    tf.keras.utils.set_random_seed(seed + hvd.rank())  # different initial weights: the broadcast fixes them
    dataset = data.mnist_dataset(per_worker_batch, shuffle_seed=seed, shard=(hvd.size(), hvd.rank()))
    rate = learning_rate * (hvd.size() if scale_learning_rate else 1)
    model = models.build_and_compile_cnn_model(learning_rate=rate)
    optimizer = hvd.DistributedOptimizer(
        model.optimizer, compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none)
    model.compile(loss=model.loss, optimizer=optimizer, metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)
    epoch_seconds: list[float] = []

    class EpochTimer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            epoch_seconds.append(time.perf_counter() - self._start)

    # (not hvd.callbacks.MetricAverageCallback: Horovod 0.28.1 gives it `keras.backend`, which is
    # Keras 3's under TensorFlow 2.21 and has no `constant`; the averages are taken after fit)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), EpochTimer(),
                 progress.callback(per_worker_batch * hvd.size())]
    if checkpoint_dir and hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(checkpoint_dir, "ckpt-{epoch}.weights.h5"),
                                                            save_weights_only=True))
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks,
                        verbose=verbose if hvd.rank() == 0 else 0)
    timed = epoch_seconds[1:] or epoch_seconds

    def averaged(values: list) -> list[float]:  # over the ranks, each of which saw its own shard
        return [float(v) for v in hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Average).numpy()]

    return {
        "task": this_task(),
        "keras": keras_flavour(),
        "strategy": "horovod",
        "rank": hvd.rank(),
        "workers": hvd.size(),
        "global_batch": per_worker_batch * hvd.size(),
        "learning_rate": rate,
        "compression": compression,
        "loss": averaged(history.history["loss"]),
        "accuracy": averaged(history.history["accuracy"]),
        "rank_loss": [float(v) for v in history.history["loss"]],
        "epoch_seconds": epoch_seconds,
        "examples_per_second": per_worker_batch * hvd.size() * steps_per_epoch * len(timed) / sum(timed),
        "weights_checksum": float(sum(float(tf.reduce_sum(w)) for w in model.weights)),
        "wall_seconds": time.perf_counter() - started,
    }


def time_all_reduce(floats: int = 2_770_000, repeats: int = 20, compression: str = "none") -> dict[str, Any]:
    """Median milliseconds of one hvd.allreduce of ``floats`` float32 values (the seeds' CNN has about
    2.77 M parameters: one step's gradients), after one warm-up; and the value it computed."""
    tf = import_tensorflow()
    import horovod.tensorflow as hvd

    hvd.init()
    chosen = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
    tensor = tf.fill([floats], float(hvd.rank() + 1))
    hvd.allreduce(tensor, op=hvd.Sum, compression=chosen)  # warm-up: negotiation, buffers
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        summed = hvd.allreduce(tensor, op=hvd.Sum, compression=chosen)
        float(summed[0])  # wait for the value
        times.append(time.perf_counter() - start)
    return {"task": this_task(), "backend": "horovod", "floats": floats,
            "median_ms": 1000 * statistics.median(times), "sum": float(summed[0])}
