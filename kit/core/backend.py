"""What a kind of job gives a cluster's tasks once they have their roles: a backend object.

A :class:`kit.TFCluster` starts one engine per task, picks and checks each task's port and sets its environment
(:mod:`kit.core.roles`); the backend then gives the ready tasks what its framework reads, at every start and
restart. TensorFlow's own (this base class) needs nothing more: ``TF_CONFIG`` came with the roles. Horovod's
(:class:`kit.core.horovod.Horovod`) starts the rendezvous server on rank 0 and gives each rank its ``HOROVOD_*``
variables; Keras 3 on JAX's (:class:`kit.core.keras_jax.Jax`) gives each process ``keras.distribution``'s job
variables. Another framework (PyTorch's ``torchrun`` variables) is another small subclass.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .group import TaskGroup
    from .options import ClusterOptions, TaskInfo


class Backend:
    """TensorFlow's tasks: ``TF_CONFIG`` (set with the roles), nothing more."""

    #: Why the tasks have no TF_CONFIG, and where to look instead (None: they have one).
    no_tf_config: tuple[str, str] | None = None

    def configure(self, group: TaskGroup, options: ClusterOptions, log: logging.Logger) -> None:
        """Give the ready tasks of ``group`` what the framework reads, at every start and restart; a failure stops a
        start and leaves a restart's cluster stale."""

    def rows(self, tasks: list[TaskInfo]) -> list[dict[str, Any]] | None:
        """The rows of ``cluster.describe()`` (None: the tasks as they are)."""
        return None

    def after_failed_run(self, cluster: Any) -> None:
        """After a run that raised: what the framework needs done with the tasks left (nothing here)."""

    def reset(self) -> None:
        """Forget what ``configure`` gave (the cluster stopped)."""
