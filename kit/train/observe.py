"""Watching a worker's training from outside the training function: a recording callback.

A training function that takes ``callbacks=()`` gets :func:`fit_recorder` in with its callbacks (the recipe
:func:`kit.train.multiworker.train_with_callbacks` does): it records what Keras did on this worker, and
``recorder.record`` (plain lists, numbers and arrays) goes back to the kernel through ``cluster.run``:

    recorder = kit.train.observe.fit_recorder(run_dir, images, watch=("logs", "ckpt"))
    history = train(run_dir, callbacks=[recorder])
    return {"history": history, **recorder.record}
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import Any, Callable, Iterable

from ._tf import import_tensorflow
from .probes import HOOKS, files_under
from ..core.tfconfig import this_task

#: The model's methods whose calls the recorder lists (ModelCheckpoint calls ``save_weights``).
SAVES = ("save", "save_weights")


def _relative(path: Any, base: str) -> str:
    return os.path.relpath(os.fspath(path), base)


def fit_recorder(run_dir: str | os.PathLike, images: Any = None, watch: Iterable[str] = ()):
    """A Keras callback whose ``record`` dict tells what ``fit`` (and the saves after it) did on this task.

    ``record`` holds: ``task`` (this task's name), ``task_id``, ``should_checkpoint`` and
    ``should_save_summary`` (the strategy's own answer to "am I the chief?"); ``hooks`` (hook name →
    times Keras called it on this task); ``steps_per_epoch``; ``batch_loss`` (``logs["loss"]`` after every
    step, as Keras logs it: the epoch's running mean, summed over the workers under MultiWorkerMirroredStrategy
    unless the model's ``distribute_reduction_method`` is "first"); ``epoch_logs`` (the logs of every epoch's
    end: ``loss``, ``val_loss``, ...); ``step_ms`` (every step's wall time) and ``median_step_ms`` (of
    the steps after the first, which traces); ``learning_rate`` (the optimizer's rate at the last epoch end); ``files_at_epoch_end``
    (for each epoch, the files under ``run_dir/<label>`` for each label of ``watch``, listed after the
    callbacks before this one ran: put it last); ``saves`` (every ``model.save`` / ``model.save_weights``
    call on this model, during ``fit`` or after it, with its path relative to ``run_dir`` and whether
    the path existed right after the call); ``predictions`` (the trained model on ``images`` at the
    end of ``fit``, None without ``images``).
    """
    tf = import_tensorflow()
    base = os.fspath(run_dir)
    labels = tuple(watch)

    class FitRecorder(tf.keras.callbacks.Callback):
        """Records hooks, steps, saves, files and predictions (see fit_recorder)."""

        def __init__(self) -> None:
            super().__init__()
            self.record: dict[str, Any] = {
                "task": this_task(), "task_id": None, "should_checkpoint": None, "should_save_summary": None,
                "hooks": {hook: 0 for hook in HOOKS}, "steps_per_epoch": [], "batch_loss": [], "epoch_logs": [],
                "step_ms": [], "median_step_ms": None,
                "learning_rate": None, "files_at_epoch_end": [], "saves": [], "predictions": None}
            self._step_seconds: list[float] = []
            self._steps = 0
            self._started = 0.0
            self._wrapped = False

        def set_model(self, model) -> None:
            super().set_model(model)
            if not self._wrapped:  # list the model's saves, including those after fit returns
                for name in SAVES:
                    object.__setattr__(model, name, self._listing(name, getattr(model, name)))
                self._wrapped = True

        def _listing(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
            saves = self.record["saves"]

            @functools.wraps(method)
            def call(filepath, *args, **kwargs):
                result = method(filepath, *args, **kwargs)
                path = os.fspath(filepath)
                exists = os.path.exists(path) or bool(tf.io.gfile.glob(path + "*"))  # weights: prefix.index, ...
                saves.append({"call": name, "path": _relative(path, base), "exists after": exists})
                return result

            return call

        def on_train_begin(self, logs=None):
            strategy = self.model.distribute_strategy
            resolver = getattr(strategy, "cluster_resolver", None)
            self.record.update(task_id=getattr(resolver, "task_id", None),
                               should_checkpoint=bool(strategy.extended.should_checkpoint),
                               should_save_summary=bool(strategy.extended.should_save_summary))
            self.record["hooks"]["on_train_begin"] += 1

        def on_epoch_begin(self, epoch, logs=None):
            self.record["hooks"]["on_epoch_begin"] += 1
            self._steps = 0

        def on_train_batch_begin(self, batch, logs=None):
            self._started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self._step_seconds.append(time.perf_counter() - self._started)
            self._steps += 1
            self.record["hooks"]["on_train_batch_end"] += 1
            if logs and "loss" in logs:
                self.record["batch_loss"].append(float(logs["loss"]))

        def on_epoch_end(self, epoch, logs=None):
            self.record["hooks"]["on_epoch_end"] += 1
            self.record["steps_per_epoch"].append(self._steps)
            self.record["epoch_logs"].append({key: float(value) for key, value in (logs or {}).items()})
            rate = self.model.optimizer.learning_rate
            self.record["learning_rate"] = None if callable(rate) else float(tf.keras.backend.get_value(rate))
            self.record["files_at_epoch_end"].append(
                {label: files_under(os.path.join(base, label)) for label in labels})

        def on_train_end(self, logs=None):
            self.record["hooks"]["on_train_end"] += 1
            self.record["step_ms"] = [1000 * s for s in self._step_seconds]
            timed = self._step_seconds[1:] or self._step_seconds
            self.record["median_step_ms"] = 1000 * statistics.median(timed) if timed else None
            if images is not None:
                self.record["predictions"] = self.model(images, training=False).numpy()

    return FitRecorder()

