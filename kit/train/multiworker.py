"""MultiWorkerMirroredStrategy on a TFCluster: fit with the chief's callbacks, measured.

Functions here run on every worker (``cluster.run(train_with_callbacks, ...)``) and return what
that worker saw: its role, the learning rate and global batch it used, its losses and step times,
which Keras callback hooks ran on it, where its TensorBoard and ModelCheckpoint callbacks wrote,
and what happened when it saved and restored a ``tf.train.Checkpoint`` outside ``fit``
(:func:`train_with_callbacks`); how many steps ``fit`` runs with and without ``.repeat()``
(:func:`count_fit_steps`); and how long an all-reduce takes per collective implementation
(:func:`time_all_reduce`). They share one strategy per process
(:func:`kit.train.strategies.build_strategy`).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import progress
from ._tf import import_tensorflow
from .strategies import COMMUNICATIONS, build_strategy
from ..core.errors import first_line
from ..core.tfconfig import this_task


def call_with_deadline(fn: Callable[..., Any], seconds: float, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call ``fn`` in a daemon thread and wait at most ``seconds`` for it.

    Returns ``finished``, ``value`` (its result), ``error`` ("Type: message" if it raised) and
    ``seconds`` waited. A call still blocked (say, in a collective whose peers never come) is left
    behind in its thread: the process needs replacing afterwards (``cluster.restart()``).
    """
    outcome: dict[str, Any] = {"finished": False, "value": None, "error": None}

    def target() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except Exception as error:  # reported to the caller, not swallowed
            outcome["error"] = first_line(error)
        outcome["finished"] = True

    started = time.perf_counter()
    thread = threading.Thread(target=target, daemon=True, name=f"deadline-{getattr(fn, '__name__', 'call')}")
    thread.start()
    thread.join(seconds)
    return {**outcome, "seconds": time.perf_counter() - started}


def _max_difference(a: list, b: list) -> float:
    """Largest absolute difference between two lists of weight arrays."""
    return max(float(abs(x - y).max()) for x, y in zip(a, b))


def train_with_callbacks(model_dir: str, per_worker_batch: int = 64, epochs: int = 2,
                         steps_per_epoch: int = 10, learning_rate: float = 0.001,
                         scale_learning_rate: bool = False, communication: str = "AUTO",
                         tensorboard: bool | None = None, seed: int = 42,
                         verbose: int = 2) -> dict[str, Any]:
    """The multi-worker tutorial's training on this worker, with TensorBoard and ModelCheckpoint.

    The model is built and compiled in ``strategy.scope()``; the dataset is
    ``shuffle().repeat().batch(per_worker_batch × workers)`` with ``steps_per_epoch``.
    ``scale_learning_rate`` multiplies ``learning_rate`` by the number of workers (the rule of
    thumb for a global batch that grew by that factor). After ``fit``, every worker saves a
    ``tf.train.Checkpoint`` with :func:`kit.train.checkpoints.save` into ``model_dir/manual`` and
    restores it into a freshly built model with :func:`kit.train.checkpoints.restore_latest`.
    ``tensorboard=None`` adds the TensorBoard callback when the tensorboard package is installed.
    """
    tf = import_tensorflow()
    from . import checkpoints, data, models
    from .probes import probe_callback, tensorboard_installed

    tf.keras.utils.set_random_seed(seed)
    dist = build_strategy("multi_worker_mirrored", communication=communication)
    task_type, task_id, cluster_spec = checkpoints.task_of(dist)
    workers = dist.num_replicas_in_sync
    global_batch = per_worker_batch * workers
    rate = learning_rate * workers if scale_learning_rate else learning_rate
    dataset = data.mnist_dataset(global_batch, shuffle_seed=seed)  # shuffle, repeat, batch
    with dist.scope():
        model = models.build_and_compile_cnn_model(learning_rate=rate)
    base = Path(model_dir)
    use_tensorboard = tensorboard_installed() if tensorboard is None else tensorboard
    board = tf.keras.callbacks.TensorBoard(log_dir=str(base / "logs")) if use_tensorboard else None
    checkpoint_cb = tf.keras.callbacks.ModelCheckpoint(filepath=str(base / "ckpt" / "ckpt_{epoch}"),
                                                       save_weights_only=True)
    # at every epoch end, after the callbacks before it: the files under logs/ and ckpt/
    probe = probe_callback(watch={"logs": base / "logs", "ckpt": base / "ckpt"})
    live = progress.callback(global_batch)  # the notebook's live view
    callbacks = [cb for cb in (board, checkpoint_cb, probe, live) if cb is not None]
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose,
                        callbacks=callbacks)
    trained = [w.copy() for w in model.get_weights()]

    saved = checkpoints.save(tf.train.Checkpoint(model=model), base / "manual", dist)
    with dist.scope():
        fresh = models.build_and_compile_cnn_model(learning_rate=rate)
    untrained_diff = _max_difference(fresh.get_weights(), trained)
    restored = checkpoints.restore_latest(tf.train.Checkpoint(model=fresh), base / "manual")
    return {
        "task": this_task(),
        "task_type": task_type, "task_id": task_id,
        "chief": checkpoints.is_chief(task_type, task_id, cluster_spec),
        "should_checkpoint": bool(dist.extended.should_checkpoint),
        "should_save_summary": bool(dist.extended.should_save_summary),
        "workers": workers, "global_batch": global_batch, "learning_rate": probe.record["learning_rate"][-1],
        "communication": communication,
        "loss": [float(v) for v in history.history["loss"]],
        "step_seconds": probe.record["step_seconds"][1:],  # the first step traces the function
        "median_step_seconds": statistics.median(probe.record["step_seconds"][1:] or [float("nan")]),
        "hooks": probe.record["hooks"],
        "files_at_epoch_end": probe.record["files"],
        "tensorboard_wrote_to": os.path.relpath(board._log_write_dir, model_dir) if board else None,  # noqa: SLF001
        "modelcheckpoint_wrote_to": os.path.relpath(checkpoint_cb._write_filepath, model_dir),  # noqa: SLF001
        "saved": {**saved, "write_dir": os.path.relpath(saved["write_dir"], model_dir),
                  "files": [os.path.relpath(f, model_dir) for f in saved["files"]]},
        "restored_from": os.path.relpath(restored, model_dir) if restored else None,
        "fresh_vs_trained": untrained_diff,
        "restored_vs_trained": _max_difference(fresh.get_weights(), trained),
        "weights_checksum": float(sum(float(w.sum()) for w in trained)),
    }


def count_fit_steps(per_worker_batch: int = 32, examples: int = 256, epochs: int = 2,
                    steps_per_epoch: int = 6, repeat: bool = True, seed: int = 42) -> dict[str, Any]:
    """Fit the kit's CNN on ``examples`` MNIST examples with ``steps_per_epoch``; count the steps run.

    Without ``repeat`` the dataset holds ``ceil(examples / global batch)`` batches in total, so
    once they are used up ``fit`` stops early; ``warnings`` holds TensorFlow's "Your input ran out
    of data" messages.
    """
    tf = import_tensorflow()
    from . import data, models
    from .mirrored import captured_tf_log
    from .probes import probe_callback

    tf.keras.utils.set_random_seed(seed)
    dist = build_strategy("multi_worker_mirrored")
    global_batch = per_worker_batch * dist.num_replicas_in_sync
    (x_train, y_train), _ = data.load_mnist()
    dataset = tf.data.Dataset.from_tensor_slices((x_train[:examples], y_train[:examples]))
    if repeat:
        dataset = dataset.repeat()
    dataset = dataset.batch(global_batch).map(
        lambda images, labels: (tf.cast(images, tf.float32) / 255.0, tf.cast(labels, tf.int64)))
    with dist.scope():
        model = models.build_and_compile_cnn_model()
    probe = probe_callback()
    with captured_tf_log() as log:
        model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0, callbacks=[probe])
    return {"task": this_task(), "repeat": repeat, "global_batch": global_batch,
            "batches_available": None if repeat else -(-examples // global_batch),
            "steps_per_epoch": probe.record["steps_per_epoch"], "epochs_run": probe.record["hooks"]["on_epoch_end"],
            "warnings": [m.split(";")[0] for m in log if "ran out of data" in m]}


def time_all_reduce(size: int | None = None, implementations: tuple[str, ...] = COMMUNICATIONS,
                    repeats: int = 10) -> list[dict[str, Any]]:
    """Time an all-reduce of ``size`` floats across the workers, once per collective implementation.

    Uses this process's strategy (:func:`kit.train.strategies.build_strategy`) and passes the
    implementation per call (``ReplicaContext.all_reduce(..., options=CommunicationOptions(implementation=...))``), so
    no second strategy is needed. ``size`` defaults to the parameter count of the kit's CNN: one
    step's gradients. The implementations take turns, ``repeats`` rounds after one warm-up call
    each, so that a slow spell of a shared machine hits them alike. Each result holds the
    implementation, the median milliseconds, the sum of the reduced tensor (to compare the
    implementations) and the TensorFlow log lines that mention NCCL.
    """
    tf = import_tensorflow()
    from . import models
    from .mirrored import captured_tf_log

    dist = build_strategy("multi_worker_mirrored")
    if size is None:
        size = models.build_and_compile_cnn_model().count_params()

    def make_all_reduce(implementation: str):
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation))

        @tf.function
        def all_reduce():
            def replica_fn():
                context = tf.distribute.get_replica_context()
                value = tf.fill([size], tf.cast(context.replica_id_in_sync_group + 1, tf.float32))
                return context.all_reduce(tf.distribute.ReduceOp.SUM, value, options=options)
            return dist.experimental_local_results(dist.run(replica_fn))[0]
        return all_reduce

    functions = {name: make_all_reduce(name) for name in implementations}
    logs: dict[str, list[str]] = {}
    sums: dict[str, float] = {}
    for name, function in functions.items():
        with captured_tf_log() as log:
            sums[name] = float(tf.reduce_sum(function()))  # warm-up: traces the function
        logs[name] = [m for m in log if "NCCL" in m or "nccl" in m]
    timings: dict[str, list[float]] = {name: [] for name in implementations}
    for _ in range(repeats):
        for name, function in functions.items():
            started = time.perf_counter()
            function().numpy()
            timings[name].append(time.perf_counter() - started)
    return [{"task": this_task(), "communication": name, "size": size,
             "median_ms": 1000 * statistics.median(timings[name]), "sum": sums[name], "log": logs[name]}
            for name in implementations]
