"""TaskGroup: a running cluster's tasks as a run sees them, the one door between a run and its cluster.

A run (:mod:`kit.core.runs`) needs five things of its cluster's engines: the tasks to run on, each with its
engine view; whether each engine process is alive; how a dead one died (the out-of-memory killer, its log's
last lines); and a way to say that the engines must be replaced before the next run (the cluster turns
stale). A :class:`kit.core.cluster.TFCluster` makes one TaskGroup each time its engines get their roles
(``start``, ``restart``) and hands it out through ``cluster.task_group()``; a supervised run asks for it
again after each restart, so it always runs on the engines of the moment.

Modelled on Ray Train's WorkerGroup (what its BackendExecutor runs functions on) and on the Status a
dask SpecCluster shares with its workers: the cluster owns the processes and its state, the group
carries no more than a run needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from . import limits, tfconfig
from .engines import Engines
from .errors import OptionError
from .options import TaskInfo


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """One task of a running cluster: what its engine reported, its TF_CONFIG and its engine handle."""

    info: TaskInfo
    tf_config: dict
    engine: Any  #: the ipyparallel DirectView of its engine


class TaskGroup:
    """The tasks of one set of engines, in task order (chief, workers, ps, evaluator)."""

    def __init__(self, records: dict[str, TaskRecord], engines: Engines, memory: limits.OomWatch,
                 mark_stale: Callable[[str, list[str]], None]):
        self.records = records        #: task name → its record
        self.names = list(records)    #: every task's name, in task order
        self.engines = engines
        self.memory = memory
        self._mark_stale = mark_stale

    def select(self, tasks: list[str] | tuple | None) -> list[str]:
        """The names of ``tasks`` (e.g. ``["worker:1"]``; None: every task), checked against this group."""
        if tasks is None:
            return list(self.names)
        names = []
        for task in tasks:
            name = tfconfig.task_name(*tfconfig.parse_task(task))
            if name not in self.records:
                raise OptionError("tasks", f"{task!r} is not a task of this cluster",
                                  f"use one of {', '.join(self.names)}")
            names.append(name)
        return names

    def info(self, name: str) -> TaskInfo:
        """Task ``name`` as its engine reported it (``cluster.tasks``)."""
        return self.records[name].info

    def engine(self, name: str) -> Any:
        """Task ``name``'s engine: an ipyparallel DirectView on it alone."""
        return self.records[name].engine

    def view(self, names: list[str]) -> Any:
        """One ipyparallel DirectView on the engines of ``names``, in that order (its ``apply_async`` runs
        a function on all of them at once; its ``wait`` waits for messages)."""
        return self.engines.client[[self.records[n].info.engine_id for n in names]]

    def dead(self, names: list[str]) -> list[str]:
        """The tasks among ``names`` whose engine process has exited (the one liveness check)."""
        return [name for name in names if not self.engines.alive(name)]  # True where it cannot be seen

    def watch_memory(self) -> None:
        """Count the out-of-memory killer's kills from now on (a run begins)."""
        self.memory.mark()

    def explain_exit(self) -> str:
        """How a dead engine died, if the out-of-memory killer did it since :meth:`watch_memory` ("" otherwise)."""
        return self.memory.explain()

    def log_tail(self, name: str) -> str:
        """The last lines of task ``name``'s engine log, as a paragraph for an error ("" if unknown)."""
        return self.engines.log_tail(name)

    def mark_stale(self, reason: str, tasks: list[str]) -> None:
        """The engines must be replaced (``cluster.restart()``) before the next run, because ``reason``."""
        self._mark_stale(reason, tasks)
