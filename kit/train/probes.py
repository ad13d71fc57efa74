"""A Keras callback that measures instead of assuming: hooks run, step times, files written.

The notebooks attach :func:`probe_callback` next to the callbacks they teach (TensorBoard,
ModelCheckpoint, ...) and read back ``probe.record``, a dict of plain lists and numbers that
``cluster.run`` can return from a worker.
"""

from __future__ import annotations

import os
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Mapping

from ._tf import import_tensorflow

#: The hooks the probe counts (Keras calls them on every task that runs ``fit``).
HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_end", "on_epoch_end", "on_train_end")


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package is importable (Keras's TensorBoard callback needs it).

    TensorFlow 2.21 no longer installs it: without it, ``fit`` with a TensorBoard callback fails
    with ``TBNotInstalledError`` at the first summary.
    """
    return find_spec("tensorboard") is not None


def files_under(root: str | os.PathLike) -> list[str]:
    """Every file below ``root``, as sorted paths relative to it ([] when ``root`` does not exist)."""
    base = Path(root)
    if not base.is_dir():
        return []

    def vanished(error: OSError) -> None:
        # Other tasks delete their temporary checkpoint folders (workertemp_N) while this one
        # lists the tree: a folder that is gone has no files to list. Anything else is an error.
        if not isinstance(error, FileNotFoundError):
            raise error

    return sorted(str((Path(folder) / name).relative_to(base))
                  for folder, _, names in os.walk(base, onerror=vanished) for name in names)


def _learning_rate(model: Any) -> float | None:
    optimizer = getattr(model, "optimizer", None)
    rate = getattr(optimizer, "learning_rate", None) if optimizer is not None else None
    if rate is None or callable(rate):
        return None
    return float(import_tensorflow().keras.backend.get_value(rate))


def probe_callback(watch: Mapping[str, str | os.PathLike] | None = None):
    """A callback whose ``record`` dict fills in as ``fit`` runs.

    ``record`` holds: ``hooks`` (hook name → times called), ``step_seconds`` (wall time of every
    training step, from ``on_train_batch_begin`` to ``on_train_batch_end``), ``steps_per_epoch``,
    ``learning_rate`` (the optimizer's rate at each epoch end) and ``files``: for each epoch, the
    files present under each directory of ``watch`` (label → directory) at that epoch's end. Put
    the probe *last* in the callback list, so it sees what the callbacks before it wrote.
    """
    tf = import_tensorflow()
    watched = {label: str(path) for label, path in (watch or {}).items()}

    class Probe(tf.keras.callbacks.Callback):
        """Records hooks, step times, steps per epoch, learning rate and files (see probe_callback)."""

        def __init__(self) -> None:
            super().__init__()
            self.record: dict[str, Any] = {"hooks": {h: 0 for h in HOOKS}, "step_seconds": [],
                                           "steps_per_epoch": [], "learning_rate": [], "files": []}
            self._step_start = 0.0
            self._steps = 0

        def _count(self, hook: str) -> None:
            self.record["hooks"][hook] += 1

        def on_train_begin(self, logs=None):
            self._count("on_train_begin")

        def on_epoch_begin(self, epoch, logs=None):
            self._count("on_epoch_begin")
            self._steps = 0

        def on_train_batch_begin(self, batch, logs=None):
            self._step_start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.record["step_seconds"].append(time.perf_counter() - self._step_start)
            self._steps += 1
            self._count("on_train_batch_end")

        def on_epoch_end(self, epoch, logs=None):
            self._count("on_epoch_end")
            self.record["steps_per_epoch"].append(self._steps)
            self.record["learning_rate"].append(_learning_rate(self.model))
            self.record["files"].append({label: files_under(path) for label, path in watched.items()})

        def on_train_end(self, logs=None):
            self._count("on_train_end")

    return Probe()


