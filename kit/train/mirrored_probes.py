"""What notebooks 02 and 02b run on their engine besides the lesson's code.

- :func:`kept`: an object the engine's process keeps across ``cluster.run`` calls (each shipped
  function starts with fresh globals, but the process, its modules and TensorFlow's state live on). The
  notebooks keep the process's one ``MirroredStrategy`` there.
- :func:`fit_report`: runs a lesson function that calls ``fit`` with a measuring callback passed in, and
  returns one row: the last loss, the median step time, TensorFlow's error if ``fit`` failed, and how the
  gradients were reduced, read from TensorFlow's log (:func:`kit.train.mirrored.reduction_summary`).
"""

from __future__ import annotations

import math
import os
import sys
import types
from statistics import median
from typing import Any, Callable

MODULE = "kit_engine_state"  #: the name of the namespace :func:`kept` keeps objects in


def kept(name: str, make: Callable[[], Any]) -> Any:
    """The object this process keeps under ``name``: ``make()`` at the first call, the same object after."""
    state = sys.modules.setdefault(MODULE, types.ModuleType(MODULE))
    if not hasattr(state, name):
        setattr(state, name, make())
    return getattr(state, name)


def fit_report(train: Callable[..., Any]) -> dict[str, Any]:
    """Run ``train(callbacks=[probe])`` (it must return ``fit``'s History) and report on it.

    Returns ``loss`` (the last epoch's), ``median_step_ms`` (the first step, which traces the function,
    left out), ``error`` ("" or the message of the ``InvalidArgumentError`` ``fit`` raised; loss and step
    time are then NaN) and ``reduced with (from the log)``.
    """
    from ._tf import import_tensorflow
    from .mirrored import reduction_summary
    from .probes import captured_tf_log, probe_callback

    tf = import_tensorflow()
    probe = probe_callback()
    row: dict[str, Any] = {"loss": math.nan, "median_step_ms": math.nan, "error": ""}
    # On an engine, every import_tensorflow() (the kit's models call it) sets the logger back to
    # KIT_TF_LOG_LEVEL: keep it at INFO while the log is read.
    saved = os.environ.get("KIT_TF_LOG_LEVEL")
    os.environ["KIT_TF_LOG_LEVEL"] = "INFO"
    try:
        with captured_tf_log() as log:
            try:
                history = train(callbacks=[probe])
            except tf.errors.InvalidArgumentError as error:
                row["error"] = error.message
            else:
                steps = probe.record["step_seconds"][1:] or probe.record["step_seconds"]
                row.update(loss=float(history.history["loss"][-1]), median_step_ms=1000 * median(steps))
    finally:
        if saved is None:
            os.environ.pop("KIT_TF_LOG_LEVEL", None)
        else:
            os.environ["KIT_TF_LOG_LEVEL"] = saved
    row["reduced with (from the log)"] = reduction_summary(log)
    return row
