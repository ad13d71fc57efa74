"""Progress from the tasks to the notebook's live view, for any training function.

On an engine, :func:`publish` sends a small dict to the kernel over ipyparallel's data channel
(``publish_data``, on the engine's IOPub stream: no socket or file of the kit's own); the kernel's
:class:`kit.core.view.RunView` shows the newest one per task. Outside an engine (a plain Python process,
a test) it does nothing, so training code can call it anywhere.

    model.fit(dataset, callbacks=[kit.train.progress.callback(batch_size=64)])   # Keras
    kit.train.progress.publish(step=step, steps=total, loss=loss)                  # a custom loop

A lesson's function stays plain TensorFlow: it takes ``callbacks=()`` as any script could, and the notebook
passes :class:`OnTask` objects (``kit.Progress(batch_size)``), which become Keras callbacks on the task::

    cluster.run(train, 64, callbacks=[kit.Progress(128)])   # made in the kernel, built on each task
    cluster.last_view.measurements()                        # what each task's callback measured
"""

from __future__ import annotations

import os
import time
from typing import Any

from ._tf import import_tensorflow
from ..core.tfconfig import PROGRESS_KEY

#: The key of the kit's progress in ipyparallel's data messages (defined in the core, which reads it).
KEY = PROGRESS_KEY
#: At most this many publications per second from the callback (each is a message to the kernel;
#: a step takes ~10-50 ms here, and the view redraws at most 4 times a second anyway).
CALLBACK_PERIOD_SECONDS = 0.5


def _in_engine() -> bool:
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
    except ImportError:
        return False
    if not ZMQInteractiveShell.initialized():
        return False
    # an ipyparallel engine sets the shell's data publisher; reading ``data_pub`` in a plain
    # Jupyter kernel would make one (with a DeprecationWarning), so look at what was set
    return getattr(ZMQInteractiveShell.instance(), "_data_pub", None) is not None


#: This task's progress so far: ipyparallel's client keeps only the newest value of each key
#: (``metadata.data.update``), so every publication carries all fields.
_current: dict[str, Any] = {}


def publish(*, reset: bool = False, **fields: Any) -> bool:
    """Send progress fields to the live view (``step``, ``steps``, ``epoch``, ``epochs``, ``loss``,
    ``examples_per_second``, or any other short value); False when not on an engine.

    Fields accumulate: a publication only needs the fields that changed; ``reset`` starts over
    (a new training run on the same engine).
    """
    if not _in_engine():
        return False
    from ipyparallel.datapub import publish_data

    if reset:
        _current.clear()
    _current.update(fields, time=time.time())
    publish_data({KEY: dict(_current)})
    return True


class OnTask:
    """``factory(*args, **kwargs)``, made where this object is unpickled: on the task that receives it as an
    argument of ``cluster.run``. The notebook's kernel has no TensorFlow, so a Keras callback cannot be made
    there; this stands for one until it reaches the task (``pickle`` calls ``factory`` there, by name)."""

    def __init__(self, factory: Any, *args: Any, **kwargs: Any):
        self.factory, self.args, self.kwargs = factory, args, kwargs

    def __reduce__(self) -> tuple:
        return (_build, (self.factory, self.args, self.kwargs))

    def __repr__(self) -> str:
        return f"OnTask({getattr(self.factory, '__qualname__', self.factory)}, {self.args}, {self.kwargs})"


def _build(factory: Any, args: tuple, kwargs: dict) -> Any:
    return factory(*args, **kwargs)


def Progress(batch_size: int | None = None, summed_over: int | None = None) -> OnTask:  # noqa: N802 (a class to its user)
    """The kit's Keras callback (:func:`callback`) for a lesson's ``callbacks=`` argument, built on each task:
    it feeds the live view, and at the end of training reports what it measured (``examples_per_second``,
    ``epoch_seconds``, ``step_loss``, ``logged_loss``) to ``cluster.last_view.measurements()``.
    ``batch_size``: the examples one step trains (the global batch under a synchronous strategy)."""
    return OnTask(callback, batch_size, summed_over)


class Meter:
    """Publishes a training loop's progress: epoch, step, loss and examples/s (given this task's
    ``batch_size``), at most every ``period`` seconds, and always when ``force`` is given.

        meter = Meter(batch_size=64).begin(epochs=3, steps=100)
        for epoch in range(1, 4):
            for step in range(1, 101):
                ...
                meter.step(epoch, step, loss=loss, force=step == 100)
    """

    def __init__(self, batch_size: int | None = None, period: float = CALLBACK_PERIOD_SECONDS):
        self.batch_size = batch_size
        self.period = period
        self._last = 0.0
        self._mark = (time.monotonic(), 0)
        self._done = 0

    def begin(self, epochs: int | None = None, steps: int | None = None) -> "Meter":
        self._mark = (time.monotonic(), self._done)
        publish(reset=True, epochs=epochs, steps=steps, step=0, epoch=1 if epochs else None)
        return self

    def epoch_begin(self) -> None:
        self._epoch_mark = (time.monotonic(), self._done)

    def epoch_end(self, epoch: int, steps: int, loss: float | None = None) -> None:
        """At an epoch's end: its mean speed (the same measure as the kit's result tables)."""
        publish(**self._fields(getattr(self, "_epoch_mark", self._mark), time.monotonic(), epoch, steps, loss))

    def _fields(self, mark: tuple[float, int], now: float, epoch: int | None, step: int,
                loss: float | None) -> dict[str, Any]:
        """Epoch, step, loss, and the speed since ``mark`` (a time and a step count)."""
        since, done = mark
        fields: dict[str, Any] = {"step": step}
        if epoch is not None:
            fields["epoch"] = epoch
        if loss is not None:
            fields["loss"] = float(loss)
        if now > since and self._done > done:
            rate = (self._done - done) / (now - since)
            fields["steps_per_second"] = rate
            if self.batch_size:
                fields["examples_per_second"] = rate * self.batch_size
        return fields

    def step(self, epoch: int | None, step: int, loss: float | None = None, force: bool = False) -> None:
        """After each step: ``epoch`` (1-based, None without epochs), ``step`` within the epoch."""
        self._done += 1
        now = time.monotonic()
        if not force and now - self._last < self.period:
            return
        fields = self._fields(self._mark, now, epoch, step, loss)
        self._mark = (now, self._done)
        self._last = now
        publish(**fields)


def summed_replicas(strategy, reduction: str = "auto") -> int:
    """How many replicas tf-keras adds up in the per-batch logs under ``strategy``.

    Under MultiWorkerMirroredStrategy, with the model's ``distribute_reduction_method`` "auto" (the
    default) or "sum", tf-keras *sums* the per-batch loss over the replicas; its per-epoch logs are
    means. With "first" (one replica's value), and under any other strategy: 1.
    """
    tf = import_tensorflow()
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and reduction in ("auto", "sum"):
        return strategy.num_replicas_in_sync
    return 1


def summed_replicas_of(model) -> int:
    """:func:`summed_replicas` for a Keras ``model``: its strategy and ``distribute_reduction_method``.

    Divide a per-batch ``logs["loss"]`` by it to get the loss the epoch logs average (the kit's one fix for
    tf-keras summing per-batch logs; every callback here that reads per-batch losses uses it).
    """
    tf = import_tensorflow()
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    return summed_replicas(strategy, getattr(model, "distribute_reduction_method", "auto"))


def callback(batch_size: int | None = None, summed_over: int | None = None,
             period: float = CALLBACK_PERIOD_SECONDS):
    """A Keras callback for ``fit`` that feeds the notebook's live view and measures the run.

    It publishes epoch, step, loss and examples/s every ``period`` seconds and at each epoch's end
    (a :class:`Meter`), and keeps ``step_loss`` (after every step, the epoch's running mean loss as Keras
    logs it; :func:`kit.train.scaling.per_step_losses` gives each step's own) and ``epoch_seconds``;
    :meth:`summary` gives them with the steady-state examples/s. ``batch_size``: the examples one
    step trains, the global batch under a synchronous strategy (every task steps together).

    ``summed_over``: the number of replicas whose per-batch losses tf-keras adds up; None reads it
    from the model's strategy (:func:`summed_replicas`), so step and epoch losses agree.
    ``logged_loss`` keeps the per-batch ``logs["loss"]`` as tf-keras logged it (not divided).
    In a process of a :class:`kit.JaxCluster` (``KERAS_BACKEND=jax``) it is a Keras 3 callback, and each
    process logs its own loss (``summed_over`` 1).
    """
    if os.environ.get("KERAS_BACKEND") == "jax":
        import keras

        base, summed_over = keras.callbacks.Callback, summed_over or 1
    else:
        base = import_tensorflow().keras.callbacks.Callback

    class Progress(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.meter = Meter(batch_size, period)
            self._epoch = 1
            self._summed = summed_over or 1
            self.step_loss: list[float] = []
            self.logged_loss: list[float] = []  # logs["loss"] as tf-keras logged it, not divided
            self.epoch_seconds: list[float] = []
            self.epoch_steps: list[int] = []  # steps run in each epoch: fit may not know them (a dataset
            self._steps = 0                   # of unknown size, e.g. one Keras 3 distributes itself)

        def on_train_begin(self, logs: dict | None = None) -> None:
            if summed_over is None:
                self._summed = summed_replicas_of(self.model)
            self.meter.begin(self.params.get("epochs"), self.params.get("steps"))

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self._epoch = epoch + 1
            self._epoch_start = time.perf_counter()
            self._steps = 0
            self.meter.epoch_begin()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            loss = (logs or {}).get("loss")
            if loss is not None:
                self.logged_loss.append(float(loss))
            loss = None if loss is None else float(loss) / self._summed
            if loss is not None:
                self.step_loss.append(loss)
            self._steps = batch + 1
            self.meter.step(self._epoch, batch + 1, loss)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self.epoch_seconds.append(time.perf_counter() - self._epoch_start)
            self.epoch_steps.append(self._steps)
            self.meter.epoch_end(epoch + 1, self._steps,
                                 float(logs["loss"]) if logs and "loss" in logs else None)

        def on_train_end(self, logs: dict | None = None) -> None:
            """What was measured, to the notebook (``RunView.measurements``): the run's record, from outside
            the training function."""
            publish(**self.summary(), logged_loss=list(self.logged_loss))

        def summary(self) -> dict[str, Any]:
            """``step_loss``, ``epoch_seconds`` and ``examples_per_second`` over the epochs after the
            first (which includes tracing; the first alone when there is one)."""
            timed = slice(1, None) if len(self.epoch_seconds) > 1 else slice(None)
            seconds, steps = sum(self.epoch_seconds[timed]), sum(self.epoch_steps[timed])
            rate = (batch_size or 0) * steps / seconds if seconds > 0 else None
            return {"step_loss": list(self.step_loss), "epoch_seconds": list(self.epoch_seconds),
                    "examples_per_second": rate}

    return Progress()
