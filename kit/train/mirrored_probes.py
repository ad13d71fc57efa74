"""What notebook 02b measures around its lesson's ``fit``, from outside the lesson's function.

:func:`reduction_probe` is a Keras callback the notebook passes in (``callbacks=[kit.OnTask(reduction_probe)]``,
made on the engine): it times every training step and reads from TensorFlow's log how the gradients were
reduced (:func:`kit.train.mirrored.reduction_summary`), and at the end of training reports both to the
notebook, where ``cluster.last_view.measurements()`` returns them.
"""

from __future__ import annotations

import logging
import time
from statistics import median
from typing import Any

from .mirrored import reduction_summary
from .progress import publish

#: The fields :func:`reduction_probe` reports.
STEP_MS, REDUCED_WITH = "median_step_ms", "reduced with (from the log)"
#: The log filter and the logger's level before it, of a probe whose training ended with an error
#: (``on_train_end`` never came): the next probe restores them before it starts.
_LEFT: list[Any] = []


def reduction_probe() -> Any:
    """A Keras callback that reports ``median_step_ms`` (the median wall time of a training step, the first
    step, which traces the function, left out) and ``reduced with (from the log)`` (what TensorFlow logged
    when it built the step: "collective all-reduce, RING", "batch all-reduce, hierarchical_copy", ...).

    While training runs, TensorFlow's logger is at INFO and its INFO messages are collected instead of
    printed; warnings still print. Everything is restored at ``on_train_end``.
    """
    from ._tf import import_tensorflow

    tf = import_tensorflow()
    logger = tf.get_logger()

    class ReductionProbe(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []
            self.step_seconds: list[float] = []
            self.level = logger.level
            self.started = 0.0

        def collect(self, record: logging.LogRecord) -> bool:
            """A logging filter: keep the message, and print only what is above INFO."""
            self.messages.append(record.getMessage())
            return record.levelno > logging.INFO

        def on_train_begin(self, logs: dict | None = None) -> None:
            while _LEFT:
                left, level = _LEFT.pop()
                logger.removeFilter(left)
                logger.setLevel(level)
            self.level = logger.level
            logger.setLevel(logging.INFO)
            logger.addFilter(self.collect)
            _LEFT.append((self.collect, self.level))

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.step_seconds.append(time.perf_counter() - self.started)

        def on_train_end(self, logs: dict | None = None) -> None:
            logger.removeFilter(self.collect)
            _LEFT[:] = [entry for entry in _LEFT if entry[0] != self.collect]
            logger.setLevel(self.level)
            steps = self.step_seconds[1:] or self.step_seconds
            self.report = {STEP_MS: 1000 * median(steps) if steps else float("nan"),
                           REDUCED_WITH: reduction_summary(self.messages)}
            publish(**self.report)

    return ReductionProbe()
