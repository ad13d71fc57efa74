"""Training functions that run on a task (an engine) and return plain, picklable results.

Notebooks call them through ``cluster.run(train_mnist, ...)`` and show their source; the demo,
the benchmark and the tests call the same functions, so what the notebook teaches is what is tested.
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import progress
from ._tf import import_tensorflow, keras_flavour

STRATEGIES = ("multi_worker_mirrored", "default")


def make_strategy(name: str):
    """``multi_worker_mirrored`` (reads TF_CONFIG) or ``default`` (one process, no distribution).

    ``multi_worker_mirrored`` is this process's one strategy (:func:`kit.train.multiworker.strategy`): a
    second one, made for the next run on the same engines, re-configures collectives and aborts a
    worker whose first broadcast reached the chief before the chief made its own second strategy.
    """
    tf = import_tensorflow()
    if name == "multi_worker_mirrored":
        from .multiworker import strategy

        return strategy()
    if name == "default":
        return tf.distribute.get_strategy()
    raise ValueError(f"strategy={name!r} is unknown; use one of {', '.join(STRATEGIES)}")


def train_mnist(per_worker_batch: int = 64, epochs: int = 3, steps_per_epoch: int = 70,
                learning_rate: float = 0.001, strategy: str = "multi_worker_mirrored",
                seed: int = 42, verbose: int = 2, *, warmup_steps: int = 0, warmup_from: float = 0.0,
                eval_examples: int = 0, gradient_compression: str = "none",
                steps_per_execution: int = 1) -> dict[str, Any]:
    """The seeds' example on this task: build the CNN in ``strategy.scope()`` and ``fit`` MNIST.

    The global batch is ``per_worker_batch × workers``. Returns the task's view of the run: losses
    and accuracies per epoch, loss per step, steady-state examples/s (epochs after the first, which
    includes tracing) and wall time.

    Optional (kit.train.scaling, notebook 08): ``warmup_steps > 0`` ramps the learning rate linearly from
    ``warmup_from`` to ``learning_rate`` over the first steps (gradual warmup); ``eval_examples > 0``
    also evaluates on that many MNIST test examples and adds ``test_loss`` and ``test_accuracy``.

    Speed (kit.tools.bench, docs/performance.md): ``gradient_compression="fp16"`` sums gradients across
    workers in float16; ``steps_per_execution=k`` runs k steps per call into TensorFlow, and then
    ``step_loss`` has one entry per k steps.
    """
    tf = import_tensorflow()
    from . import data, models
    started = time.perf_counter()
    tf.keras.utils.set_random_seed(seed)
    dist = make_strategy(strategy)
    workers = dist.num_replicas_in_sync
    global_batch = per_worker_batch * workers
    dataset = data.mnist_dataset(global_batch, shuffle_seed=seed)
    rate = learning_rate
    if warmup_steps:
        from .scaling import warmup_schedule

        rate = warmup_schedule(learning_rate, warmup_steps, warmup_from)
    with dist.scope():
        model = models.build_and_compile_cnn_model(learning_rate=rate,
                                                   gradient_compression=gradient_compression,
                                                   steps_per_execution=steps_per_execution)
    measured = progress.callback(global_batch)  # live view, loss per step, epoch times
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose,
                        callbacks=[measured])
    evaluation = {}
    if eval_examples:
        test = data.mnist_dataset(global_batch, train=False).take(-(-eval_examples // global_batch))
        test_loss, test_accuracy = model.evaluate(test, verbose=0)
        evaluation = {"test_loss": float(test_loss), "test_accuracy": float(test_accuracy)}
    return {
        "task": os.environ.get("KIT_TASK", "local"),
        "keras": keras_flavour(),
        "strategy": strategy,
        "workers": workers,
        "global_batch": global_batch,
        "loss": [float(v) for v in history.history["loss"]],
        "accuracy": [float(v) for v in history.history["accuracy"]],
        **measured.summary(),
        "wall_seconds": time.perf_counter() - started,
        **evaluation,
    }
