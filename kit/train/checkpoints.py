"""Checkpoints under MultiWorkerMirroredStrategy: every worker saves, only the chief keeps its copy.

Saving may run collectives, so *every* worker must call save. The TF multi-worker tutorial's rule,
implemented here: the chief writes to the real directory; every other worker writes to its own
temporary directory (``<dir>/workertemp_<task id>``) and deletes it right after. Restoring reads
the chief's directory on every worker.

``is_chief`` and ``write_dirpath`` are pure functions (no TensorFlow import).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping


def is_chief(task_type: str | None, task_id: int | None,
             cluster_spec: Mapping[str, Any] | None = None) -> bool:
    """Whether this task saves for real: no cluster, the chief, or worker 0 when there is no chief."""
    if task_type is None or task_type == "chief":
        return True
    has_chief = bool(cluster_spec) and "chief" in cluster_spec
    return task_type == "worker" and task_id == 0 and not has_chief


def write_dirpath(dirpath: str | os.PathLike, task_type: str | None, task_id: int | None,
                  cluster_spec: Mapping[str, Any] | None = None) -> str:
    """Where this task writes: ``dirpath`` for the chief, ``dirpath/workertemp_<id>`` otherwise."""
    if is_chief(task_type, task_id, cluster_spec):
        return str(dirpath)
    return os.path.join(str(dirpath), f"workertemp_{task_id}")


def task_of(strategy) -> tuple[str | None, int | None, dict]:
    """``(task_type, task_id, cluster_spec)`` of this process under ``strategy``.

    Strategies without a cluster (default, OneDevice, Mirrored) give ``(None, None, {})``; so does
    MultiWorkerMirroredStrategy created without a TF_CONFIG.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return None, None, {}
    return resolver.task_type, resolver.task_id, resolver.cluster_spec().as_dict()


def _files(directory: str) -> list[str]:
    base = Path(directory)
    return sorted(str(p) for p in base.iterdir() if p.is_file()) if base.is_dir() else []


def save(checkpoint, directory: str | os.PathLike, strategy=None, *, task_type: str | None = None,
         task_id: int | None = None, cluster_spec: Mapping[str, Any] | None = None,
         max_to_keep: int = 1) -> dict[str, Any]:
    """Save ``checkpoint`` (a ``tf.train.Checkpoint``) on this task; call it on every worker.

    The task comes from ``strategy`` when given, else from ``task_type``/``task_id``/``cluster_spec``.
    The chief saves into ``directory`` through a ``tf.train.CheckpointManager`` (``ckpt-1``,
    ``ckpt-2``, ...); other tasks save into their temporary directory, deleted right afterwards.
    Returns what happened on this task: ``chief``; ``write_dir``; ``files`` (full paths of the
    files in ``write_dir`` just after saving); ``wrote`` (the checkpoint prefix written); ``kept``
    (whether that checkpoint still exists now).
    """
    from ._tf import import_tensorflow

    tf = import_tensorflow()
    if strategy is not None:
        task_type, task_id, cluster_spec = task_of(strategy)
    chief = is_chief(task_type, task_id, cluster_spec)
    target = write_dirpath(directory, task_type, task_id, cluster_spec)
    manager = tf.train.CheckpointManager(checkpoint, directory=target, max_to_keep=max_to_keep)
    wrote = manager.save()
    files = _files(target)
    if not chief:
        shutil.rmtree(target, ignore_errors=True)
    return {"chief": chief, "write_dir": target, "files": files, "wrote": wrote,
            "kept": Path(wrote + ".index").exists()}


def restore_latest(checkpoint, directory: str | os.PathLike) -> str | None:
    """Restore ``checkpoint`` from the newest checkpoint in ``directory`` (the chief's); return its path.

    Returns None, restoring nothing, when ``directory`` holds no checkpoint. Every object that
    exists now must match the checkpoint; values for objects not created yet (e.g. the optimizer
    slots of a freshly built model) are restored when those are created, or never, silently.
    """
    from ._tf import import_tensorflow

    tf = import_tensorflow()
    latest = tf.train.latest_checkpoint(str(directory))
    if latest is not None:
        status = checkpoint.restore(latest)
        status.assert_existing_objects_matched()
        status.expect_partial()
    return latest
