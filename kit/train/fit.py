"""Training functions that run on a task (an engine) and return plain, picklable results.

Notebooks call them through ``cluster.run(train_mnist, ...)`` and show their source; the demo,
the benchmark and the tests call the same functions, so what the notebook teaches is what is tested.
:func:`run_trial` (in the kernel) trains one point of a :mod:`kit.train.scaling` plan with :func:`train_mnist`.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from . import progress
from ._tf import import_tensorflow, keras_flavour
from .scaling import per_step_losses, warmup_schedule
from .strategies import build_strategy
from ..core.errors import OptionError
from ..core.tfconfig import this_task

if TYPE_CHECKING:
    from .scaling import Trial


def train_mnist(per_worker_batch: int = 64, epochs: int = 3, steps_per_epoch: int = 70,
                learning_rate: float = 0.001, strategy: str = "multi_worker_mirrored",
                seed: int = 42, verbose: int = 2, *, warmup_steps: int = 0, warmup_from: float = 0.0,
                eval_examples: int = 0, gradient_compression: str = "none",
                steps_per_execution: int = 1, architecture: str = "dense") -> dict[str, Any]:
    """The seeds' example on this task: build the CNN in ``strategy.scope()`` and ``fit`` MNIST.

    The global batch is ``per_worker_batch × workers``. Returns the task's view of the run: losses
    and accuracies per epoch, loss per step, steady-state examples/s (epochs after the first, which
    includes tracing) and wall time.

    Optional (kit.train.scaling, notebook 08): ``warmup_steps > 0`` ramps the learning rate linearly from
    ``warmup_from`` to ``learning_rate`` over the first steps (gradual warmup); ``eval_examples > 0``
    also evaluates on that many MNIST test examples and adds ``test_loss`` and ``test_accuracy``.

    Speed (kit.tools.bench, docs/performance.md): ``gradient_compression="fp16"`` sums gradients across
    workers in float16; ``steps_per_execution=k`` runs k steps per call into TensorFlow, and then
    ``step_loss`` has one entry per k steps. ``architecture="pooled"``: the CNN with few parameters
    (:data:`kit.train.models.ARCHITECTURES`).
    """
    tf = import_tensorflow()
    from . import data, models
    started = time.perf_counter()
    tf.keras.utils.set_random_seed(seed)
    dist = build_strategy(strategy)  # one per process (kit.train.strategies says why)
    workers = dist.num_replicas_in_sync
    global_batch = per_worker_batch * workers
    dataset = data.mnist_dataset(global_batch, shuffle_seed=seed)
    rate = learning_rate
    if warmup_steps:
        rate = warmup_schedule(learning_rate, warmup_steps, warmup_from)
    with dist.scope():
        model = models.build_and_compile_cnn_model(learning_rate=rate,
                                                   gradient_compression=gradient_compression,
                                                   steps_per_execution=steps_per_execution,
                                                   architecture=architecture)
    measured = progress.callback(global_batch)  # live view, loss per step, epoch times
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose,
                        callbacks=[measured])
    evaluation = {}
    if eval_examples:
        test = data.mnist_dataset(global_batch, train=False).take(-(-eval_examples // global_batch))
        test_loss, test_accuracy = model.evaluate(test, verbose=0)
        evaluation = {"test_loss": float(test_loss), "test_accuracy": float(test_accuracy)}
    return {
        "task": this_task(),
        "keras": keras_flavour(),
        "strategy": strategy,
        "workers": workers,
        "global_batch": global_batch,
        "parameters": int(model.count_params()),
        "loss": [float(v) for v in history.history["loss"]],
        "accuracy": [float(v) for v in history.history["accuracy"]],
        **measured.summary(),
        "wall_seconds": time.perf_counter() - started,
        **evaluation,
    }


def run_trial(cluster, trial: "Trial", *, eval_examples: int = 2000, seed: int = 42,
              stream: bool = False) -> dict[str, Any]:
    """Train one point planned by :func:`kit.train.scaling.plan` on a started ``cluster``; return one
    results-table row.

    The cluster must have ``trial.workers`` workers. One worker trains with the default strategy
    (no distribution), several with MultiWorkerMirroredStrategy. The row holds the plan, the test
    accuracy and loss, the final training loss (mean of the last eighth of the steps), the per-step
    losses (``loss_curve``), examples/s (epochs after the first), and whether all workers agree.
    """
    if len(cluster.task_names) != trial.workers:
        raise OptionError("workers", f"the trial wants {trial.workers} worker(s), the cluster has "
                          f"{len(cluster.task_names)} task(s)", "start a cluster with "
                          f"kit.TFCluster(workers={trial.workers})")
    strategy = "default" if trial.workers == 1 else "multi_worker_mirrored"
    results = cluster.with_options(stream=stream).run(train_mnist, **trial.train_kwargs(), strategy=strategy,
                                                      seed=seed, verbose=0, eval_examples=eval_examples)
    first = results[0]
    curve = per_step_losses(first["step_loss"], trial.steps_per_epoch)
    tail = curve[-max(1, len(curve) // 8):]
    final = sum(tail) / len(tail) if all(math.isfinite(v) for v in tail) else float("nan")
    agree = all(len(r["loss"]) == len(first["loss"]) and all(map(_close, r["loss"], first["loss"]))
                for r in results)
    return {**trial.as_row(), "test_accuracy": first["test_accuracy"], "test_loss": first["test_loss"],
            "final_loss": final, "examples_per_second": first["examples_per_second"],
            "wall_seconds": max(r["wall_seconds"] for r in results), "workers_agree": agree,
            "loss_curve": curve}


def _close(a: float, b: float, rtol: float = 1e-5) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))
