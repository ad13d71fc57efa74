"""MultiWorkerMirroredStrategy on a TFCluster: fit with the chief's callbacks, measured.

Functions here run on every worker (``cluster.run(train_with_callbacks, ...)``) and return what
that worker saw: its role, the learning rate and global batch it used, its losses and step times,
which Keras callback hooks ran on it, where its ModelCheckpoint callback saved and which files were
under ``logs/`` and ``ckpt/`` at every epoch end (:func:`kit.train.observe.fit_recorder`), and what
happened when it saved and restored a ``tf.train.Checkpoint`` outside ``fit`` (:func:`train_with_callbacks`,
tests/test_multiworker.py). It shares one strategy per process
(:func:`kit.train.strategies.build_strategy`). The all-reduce's timer is :func:`kit.train.links.time_all_reduce`
(Horovod's: :func:`kit.train.horovod_fit.time_all_reduce`).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from . import progress
from ._tf import import_tensorflow
from .strategies import build_strategy
from ..core.tfconfig import this_task


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
    from .observe import fit_recorder
    from .probes import tensorboard_installed

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
    # at every epoch end, after the callbacks before it: the files under logs/ and ckpt/; and the model's saves
    recorder = fit_recorder(base, watch=("logs", "ckpt"))
    live = progress.callback(global_batch)  # the notebook's live view
    callbacks = [cb for cb in (board, checkpoint_cb, recorder, live) if cb is not None]
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose,
                        callbacks=callbacks)
    trained = [w.copy() for w in model.get_weights()]

    saved = checkpoints.save(tf.train.Checkpoint(model=model), base / "manual", dist)
    with dist.scope():
        fresh = models.build_and_compile_cnn_model(learning_rate=rate)
    untrained_diff = _max_difference(fresh.get_weights(), trained)
    restored = checkpoints.restore_latest(tf.train.Checkpoint(model=fresh), base / "manual")
    record = recorder.record
    step_seconds = [ms / 1000 for ms in record["step_ms"]]
    return {
        "task": this_task(),
        "task_type": task_type, "task_id": task_id,
        "chief": checkpoints.is_chief(task_type, task_id, cluster_spec),
        "should_checkpoint": bool(dist.extended.should_checkpoint),
        "should_save_summary": bool(dist.extended.should_save_summary),
        "workers": workers, "global_batch": global_batch, "learning_rate": record["learning_rate"],
        "communication": communication,
        "loss": [float(v) for v in history.history["loss"]],
        "step_seconds": step_seconds[1:],  # the first step traces the function
        "median_step_seconds": statistics.median(step_seconds[1:] or [float("nan")]),
        "hooks": record["hooks"],
        "files_at_epoch_end": record["files_at_epoch_end"],
        "modelcheckpoint_wrote_to": record["saves"][-1]["path"] if record["saves"] else None,
        "saved": {**saved, "write_dir": os.path.relpath(saved["write_dir"], model_dir),
                  "files": [os.path.relpath(f, model_dir) for f in saved["files"]]},
        "restored_from": os.path.relpath(restored, model_dir) if restored else None,
        "fresh_vs_trained": untrained_diff,
        "restored_vs_trained": _max_difference(fresh.get_weights(), trained),
        "weights_checksum": float(sum(float(w.sum()) for w in trained)),
    }
