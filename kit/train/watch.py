"""Watching the lesson's training from outside its code: a journal callback, a hold at a step, a kill.

The notebooks keep their training functions as a learner writes them, with a ``callbacks`` argument
(``def train(run_dir, ..., callbacks=())``), and pass in a :func:`watcher`: it journals every step, the first
batch of each attempt, epoch ends and errors in the run directory's journal
(:class:`kit.train.resilience.Journal`), and feeds the notebook's live view (notebook 05)::

    cluster.run(train, backup_dir, ..., callbacks=[kit.OnTask(watcher, run_dir, global_batch),
                                                   kit.OnTask(error_journal, run_dir)])

:func:`error_journal` journals the error a training step raises, :func:`hold_at_step` holds a task after a step
until the notebook kills it from outside, and :func:`kill_after_step` kills a task once the chief journaled a step
(notebook 07).
"""
from __future__ import annotations

import os
import time
from typing import Any

from ..core.errors import KitError
from ..core.tfconfig import this_task
from . import progress
from ._tf import import_tensorflow
from .resilience import Journal, read_journal, wait_for_step

#: How many labels of the first batch an attempt trained on the journal keeps (to recognise the batch).
FIRST_LABELS = 16


def watcher(run_dir: str | os.PathLike, batch_size: int | None = None):
    """A Keras callback that watches training from outside the lesson's code and journals it.

    In ``run_dir``'s journal: ``start`` (the global step the attempt starts from, after any restore),
    ``step`` (global step and ``logs["loss"]`` as logged: the global mean when the model's
    ``distribute_reduction_method`` is "first", or in a custom loop that reports its reduced loss),
    ``first_batch`` (the first ``FIRST_LABELS`` labels of the first batch this task trained on in this
    attempt, under ``fit``: the callback wraps the model's ``train_step`` to see them), ``epoch_end``
    and ``end``. It also feeds the notebook's live view (``batch_size``: the global batch).
    Works in a custom loop too, through ``tf.keras.callbacks.CallbackList(callbacks, model=model)``.
    """
    tf = import_tensorflow()
    journal = Journal(run_dir)

    def record_first_batch(labels) -> None:
        if not watch.saw_batch:
            watch.saw_batch = True
            journal.write("first_batch", labels=[int(v) for v in labels.numpy()])

    class Watcher(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.journal = journal
            self.meter = progress.Meter(batch_size)
            self.saw_batch = False
            self._wrapped = False
            self._epoch: int | None = None

        def set_model(self, model) -> None:
            super().set_model(model)
            if self._wrapped:
                return
            original = model.train_step

            def train_step(data):  # fit traces this before the first step: the py_function runs per step
                tf.py_function(record_first_batch, [data[1][:FIRST_LABELS]], [])
                return original(data)

            object.__setattr__(model, "train_step", train_step)
            self._wrapped = True

        def _step(self) -> int:
            return int(self.model.optimizer.iterations.numpy())

        def on_train_begin(self, logs=None):
            journal.write("start", initial_step=self._step())
            self.meter.begin(self.params.get("epochs"), self.params.get("steps"))

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch + 1
            self.meter.epoch_begin()

        def on_train_batch_end(self, batch, logs=None):
            loss = float((logs or {})["loss"])
            journal.write("step", global_step=self._step(), loss=loss)
            steps = self.params.get("steps")
            self.meter.step(self._epoch, batch + 1, loss, force=steps is not None and batch + 1 == steps)

        def on_epoch_end(self, epoch, logs=None):
            loss = float(logs["loss"]) if logs and "loss" in logs else None
            journal.write("epoch_end", epoch=int(epoch), loss=loss, global_step=self._step())
            self.meter.epoch_end(epoch + 1, self.params.get("steps") or 0, loss)

        def on_train_end(self, logs=None):
            journal.write("end", global_step=self._step())

    watch = Watcher()
    return watch


def error_journal(run_dir: str | os.PathLike):
    """A Keras callback that journals, in ``run_dir``, the error a training step of ``fit`` raises on this task
    (an ``error`` event with its type, timed on the task), then lets it go on: what a peer sees when another
    task dies, measured from outside the lesson's code. It wraps the model's ``make_train_function`` (tf-keras
    calls it once per ``fit``, after the callbacks got the model)."""
    tf = import_tensorflow()
    journal = Journal(run_dir)

    class ErrorJournal(tf.keras.callbacks.Callback):
        wrapped = False

        def set_model(self, model) -> None:
            super().set_model(model)
            if self.wrapped:
                return
            make = model.make_train_function

            def make_train_function(force=False):
                step = make(force)

                def journaled(iterator):
                    try:
                        return step(iterator)
                    except Exception as error:
                        journal.write("error", error=type(error).__name__)
                        raise

                return journaled

            object.__setattr__(model, "make_train_function", make_train_function)
            self.wrapped = True

    return ErrorJournal()


def hold_at_step(task: str, global_step: int, seconds: float = 120.0):
    """A Keras callback with which ``task`` waits, right after ``global_step``, to be killed from outside
    (at most ``seconds``, then it goes on): a kill sent once the step is journaled lands exactly there.
    Notebook 05 passes it in as ``kit.OnTask(hold_at_step, "worker:1", step)`` and kills the task itself."""
    import threading

    tf = import_tensorflow()

    class Hold(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if this_task() == task and int(self.model.optimizer.iterations.numpy()) == global_step:
                threading.Event().wait(seconds)

    return Hold()


def first_batches(run_dir: str | os.PathLike, task: str = "worker:0") -> dict[int, list[int]]:
    """Attempt → the first labels of the first batch ``task`` trained on in it (from a :func:`watcher`)."""
    batches: dict[int, list[int]] = {}
    for record in read_journal(run_dir):
        if record["task"] == task and record["event"] == "first_batch":
            batches.setdefault(record["attempt"], record["labels"])
    return batches


class Killer:
    """A thread that kills ``task`` (SIGKILL) once the chief's journal in ``run_dir`` records ``step``.

    ``join()`` waits for it and returns the moment of the kill (``time.time()``), or raises what
    went wrong in the thread (the step never came, the kill failed).
    """

    def __init__(self, cluster: Any, task: str, run_dir: str | os.PathLike, step: int, timeout: float = 300.0):
        import threading

        self.task, self.killed_at, self._error = task, None, None

        def kill() -> None:
            try:
                wait_for_step(run_dir, "chief:0", step, timeout=timeout)
                cluster.kill(task)
                self.killed_at = time.time()
            except BaseException as error:  # handed to join()
                self._error = error

        self._thread = threading.Thread(target=kill, name=f"kill {task}", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> float:
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        if self.killed_at is None:
            raise KitError(f"{self.task} was not killed within the wait. Fix: check that the chief journals "
                           "the step (resilience.Journal(run_dir).write('step', global_step=...))")
        return self.killed_at


def kill_after_step(cluster: Any, task: str, run_dir: str | os.PathLike, step: int) -> Killer:
    """Start a :class:`Killer`: ``task`` is SIGKILLed once the chief has journalled ``step``."""
    return Killer(cluster, task, run_dir, step)
