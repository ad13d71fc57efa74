"""TFCluster: one ipyparallel engine per TensorFlow task, each with its own TF_CONFIG.

    with kit.TFCluster(workers=2) as cluster:
        results = cluster.run(train_fn, epochs=3)

The cluster keeps the options, the roles (TF_CONFIG), readiness and runs; it holds an
:class:`kit.core.engines.Engines` object, chosen once in :meth:`TFCluster.start`, for the processes:
local ones (a controller on unix sockets and one engine set per task, in a private network namespace,
:mod:`kit.core.engines`) or engines from elsewhere (:mod:`kit.core.attach`). Roles are assigned one way
for both: each task's port is picked on its engine's own host (or network namespace), opened there and
reached from every other task, then the task's environment (TF_CONFIG, thread limits, Keras choice) is
set before TensorFlow is imported, and checked. Runs, their live view and their supervision are in
:mod:`kit.core.runs`. Every process the cluster started is stopped when the ``with`` block ends, at
interpreter exit, and (through :mod:`kit.core._lifeline`) when the notebook kernel is killed.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import logging
import signal as signals
import sys
import warnings
import weakref
from typing import Any, Callable

import psutil

from . import _lifeline, limits, roles, tfconfig, view as views
from .attach import ForeignEngines
from .engines import Engines, LocalEngines
from .errors import ClusterError, ExposedPortsWarning, MemoryLimitWarning, OptionError
from .options import KERAS_CHOICES, ClusterOptions, RunOptions, TaskInfo, check_names
from .runs import FAILED_PEERS_GRACE_SECONDS, STARTUP_NOISE, Failure, Run, notebook_sources

__all__ = ["TFCluster", "Phase", "State", "TaskRecord", "Failure", "kit_processes", "notebook_sources",
           "STARTUP_NOISE", "FAILED_PEERS_GRACE_SECONDS"]

_live_clusters: "weakref.WeakSet[TFCluster]" = weakref.WeakSet()


@atexit.register
def _stop_live_clusters() -> None:
    for cluster in list(_live_clusters):
        cluster.stop()


def kit_processes(owner_pid: int | None = None) -> list[psutil.Process]:
    """Live processes a TFCluster started for the process ``owner_pid`` (default: for any process).

    Found by the ``KIT_LIFELINE`` variable the kit gives its controller and engines, which their
    own children (heart monitor, engine nanny) inherit. For checking that nothing was left behind.
    """
    found = []
    for proc in psutil.process_iter():
        try:
            lifeline = proc.environ().get(_lifeline.LIFELINE_VAR)
            if lifeline is None or (owner_pid is not None and not lifeline.startswith(f"{owner_pid}:")):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone meanwhile (fine), or another user's process: not ours
    return found


def _usable_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a container's CPU quota (kit.core.limits)."""
    return limits.read().cores


class Phase(enum.Enum):
    """Where a TFCluster is in its life."""

    STOPPED = "stopped"    #: no engines (before start, after stop)
    STARTING = "starting"  #: engines being started or replaced
    READY = "ready"        #: every task up with its role; runs allowed
    STALE = "stale"        #: engines up but unusable (a task lost, stuck or timed out): restart() first


@dataclasses.dataclass(frozen=True)
class State:
    """The one state value of a TFCluster: its phase, and why and which tasks when it is stale."""

    phase: Phase = Phase.STOPPED
    reason: str = ""      #: why the engines must be replaced before the next run ("" unless STALE)
    tasks: tuple = ()     #: the tasks concerned (lost, stuck)


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """One task of a running cluster: what its engine reported, its TF_CONFIG and its engine handle."""

    info: TaskInfo
    tf_config: dict
    engine: Any  #: the ipyparallel DirectView of its engine


class TFCluster:
    """A TensorFlow cluster of ipyparallel engines, one engine per TF task.

    ``TFCluster(workers=2)`` for MultiWorkerMirroredStrategy; ``TFCluster(chief=True, workers=2,
    ps=1)`` for ParameterServerStrategy. See :class:`ClusterOptions` for every option.
    """

    def __init__(self, workers: int = 2, **options: Any):
        check_names(ClusterOptions, options, "a TFCluster option")
        self.options = ClusterOptions(workers=workers, **options)
        self.log = logging.getLogger("kit.core.cluster")
        self.state = State()
        self._engines: Engines | None = None
        self._records: dict[str, TaskRecord] = {}
        #: Every failure a supervised run (``max_failures``) saw, across runs.
        self.failures: list[Failure] = []
        self._oom_kills: int | None = None  # the memory cgroup's OOM-kill count when the run began
        #: Each task's whole output (stdout and stderr lines, nothing hidden) of the last run, by task name.
        self.output: dict[str, str] = {}
        #: The live view of the last :meth:`run` (its ``states()``: each task's last state).
        self.last_view: views.RunView | None = None

    # ----- public API -------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether the cluster has engines (ready, or stale until :meth:`restart`)."""
        return self.state.phase in (Phase.READY, Phase.STALE)

    @property
    def exposed_because(self) -> str:
        """Why the tasks' servers are reachable from the network ("" while they are not)."""
        return self._engines.exposed_because if self._engines is not None else ""

    @property
    def task_names(self) -> list[str]:
        """Names of the cluster's tasks in order: chief, workers, ps, evaluator."""
        layout = self.options.cluster_layout()
        return [tfconfig.task_name(t, i) for t in tfconfig.TASK_TYPES for i in range(layout.get(t, 0))]

    @property
    def tasks(self) -> list[TaskInfo]:
        """Each running task: type, index, address, engine id, pid, host, Keras choice."""
        self._require_started()
        return [self._records[name].info for name in self.task_names]

    @property
    def tf_configs(self) -> dict[str, dict]:
        """The TF_CONFIG of each task, by task name."""
        self._require_started()
        return {name: self._records[name].tf_config for name in self.task_names}

    def describe(self):
        """The tasks as a pandas DataFrame (for a notebook)."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(t) for t in self.tasks]).set_index("name")

    def start(self) -> "TFCluster":
        """Start (or find) one engine per task; return when every task has its role, checked."""
        if self.started:
            raise ClusterError("this TFCluster is already started",
                               fix="stop() it first, or call restart() for fresh engines")
        _live_clusters.add(self)
        self._oom_kills = limits.oom_kills()
        self.state = State(Phase.STARTING)
        try:
            if self.options.engines is None:
                shortfall = limits.memory_shortfall(len(self.task_names), limits.read())
                if shortfall:
                    warnings.warn(f"This cluster will probably not fit in memory: {shortfall}. The kernel "
                                  "will then kill a task. Fix: fewer tasks (workers=...), or a machine "
                                  "or session with more memory.", MemoryLimitWarning,
                                  stacklevel=_caller_outside_kit())
                self._engines = LocalEngines(self.options, explain_exit=self._out_of_memory)
            else:
                self._engines = ForeignEngines(self.options)
            self._assign_roles(self._engines.start(self.task_names, self._launch_environments()))
        except BaseException:
            self.stop()
            raise
        if self.exposed_because:
            self._warn_exposed()
        return self

    def restart(self) -> "TFCluster":
        """Replace every engine with a fresh process, same topology, new ports where needed.

        TensorFlow cannot reconfigure collectives inside a live process, so a cluster that lost a
        task (or must forget its TensorFlow state) gets all-new engines.
        """
        self._require_started()
        self.state = State(Phase.STARTING)
        self._records.clear()
        try:
            self._assign_roles(self._engines.replace(self.task_names, self._launch_environments()))
        except BaseException as error:
            self._mark_stale(f"a restart failed ({str(error).splitlines()[0] if str(error) else error!r})",
                             getattr(error, "tasks", []))
            raise
        return self

    def stop(self) -> None:
        """Stop every engine and the controller this cluster started, and wait until they are gone."""
        _live_clusters.discard(self)
        self.state = State(Phase.STOPPED)
        self._records.clear()
        engines, self._engines = self._engines, None
        if engines is not None:
            engines.close()

    def __enter__(self) -> "TFCluster":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<TFCluster {', '.join(self.task_names)} ({'running' if self.started else 'stopped'})>"

    def _repr_html_(self) -> str:
        """The tasks as a table in a notebook: address, pid, and the state of the last run."""
        if not self.started or not self._records:
            return f"<b>TFCluster</b> {', '.join(self.task_names)}: {self.state.phase.value}"
        last = self.last_view.rows if self.last_view is not None else {}
        rows = []
        for task in self.tasks:
            row = views.TaskRow(task.name, address=task.address or task.host, pid=task.pid)
            if task.name in last and last[task.name].pid == task.pid:
                row = dataclasses.replace(last[task.name])
            rows.append(row)
        network = ("in a private network (unreachable from other hosts)" if not self.exposed_because
                   else f"reachable from the network: {self.exposed_because}")
        return views.render_html(f"TFCluster, {len(rows)} tasks, {network}", rows)

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every task at once; return the results in task order.

        Every argument goes to ``fn``. How it runs (some tasks only, a timeout, quiet, supervised with
        restarts) is set with :meth:`with_options`. Each task's output is shown as it comes (the live
        view). A failure on any task raises :class:`WorkerError` naming the task that failed first,
        with its remote traceback.
        """
        return Run(self).run(fn, *args, **kwargs)

    def with_options(self, **options: Any) -> Run:
        """This cluster with run options (:class:`kit.RunOptions`): ``tasks``, ``timeout``, ``stream``,
        ``max_failures``, ``on_restart``; e.g. ``cluster.with_options(max_failures=2).run(train, epochs=3)``.
        An unknown name raises OptionError listing the valid ones."""
        return Run(self, RunOptions().updated(**options))

    def kill(self, task: str, signal: int = signals.SIGKILL) -> None:
        """Send ``signal`` (default SIGKILL) to one task's engine process, e.g. ``kill("worker:1")``.

        Safe to call from another thread while :meth:`run` is waiting (a fault-injection timer).
        """
        self._require_started()
        name = self._select([task])[0]
        self._engines.signal(name, self._records[name].info.engine_id, signal)

    # ----- roles: one path for every kind of engines --------------------------------------------
    def _launch_environments(self) -> dict[str, dict[str, str]]:
        """What each engine gets at launch where its kind can pass it (local engines): everything but
        TF_CONFIG, whose port is picked on the engine once it runs. ``MALLOC_ARENA_MAX`` must be there
        to count from the start (glibc reads it once); engines from elsewhere get it by ``mallopt``."""
        return {name: self._task_environment(name) for name in self.task_names}

    def _assign_roles(self, reports: dict[str, dict]) -> None:
        """Give every task its role on the engine ``reports`` assigns it (:mod:`kit.core.roles`): check the
        engines, pick and open each task's port on its own host, check every task reaches every other,
        set each task's environment (TF_CONFIG included) before TensorFlow starts, and check it."""
        client = self._engines.client
        roles.check_engines(reports, self.options.keras)
        hosts = {n: self._engines.task_host(r) for n, r in reports.items()}
        ports = roles.open_ports(client, reports, self._pick_ports(reports), hosts, self.log)
        configs = self._build_configs(list(reports), ports, hosts)
        roles.check_reachability(client, reports, configs)
        per_host = {h: list(hosts.values()).count(h) for h in hosts.values()}
        for name, rep in reports.items():
            env = self._task_environment(name, rep["cores"], per_host[hosts[name]])
            reports[name] = roles.set_environment(client, name, rep, env, configs[name])
        client[[r["engine_id"] for r in reports.values()]].use_cloudpickle()
        for name, rep in reports.items():
            info = roles.task_info(name, rep, configs[name], self._engines.isolated)
            self._records[name] = TaskRecord(info, configs[name], client[rep["engine_id"]])
        self.state = State(Phase.READY)

    def _pick_ports(self, reports: dict[str, dict]) -> dict[str, int]:
        """A free port for each training task, picked on its own engine (its host or network namespace)."""
        return roles.pick_ports(self._engines.client, reports, self._engines.task_host)

    def _build_configs(self, names: list[str], ports: dict[str, int],
                       hosts: dict[str, str] | None = None) -> dict[str, dict]:
        return roles.build_configs(names, ports, {n: (hosts or {}).get(n, self.options.host) for n in names})

    def _task_environment(self, name: str, cores: int | None = None, tasks_here: int | None = None) -> dict[str, str]:
        """Task ``name``'s environment, less TF_CONFIG (set with its port, :meth:`_assign_roles`)."""
        threads = self.options.threads or max(1, (cores or _usable_cores()) // (tasks_here or len(self.task_names)))
        env = {
            "TF_NUM_INTRAOP_THREADS": str(threads),
            # at least 2: with one inter-op thread, ParameterServerStrategy steps hang forever
            "TF_NUM_INTEROP_THREADS": str(max(2, threads)),
            "OMP_NUM_THREADS": str(threads),
            # C++ log lines after TensorFlow's start-up: warnings and errors only, unless tf_logs="all"
            **({"TF_CPP_MIN_LOG_LEVEL": "2"} if self.options.tf_logs == "quiet" else {}),
            # glibc gives each busy thread its own malloc arena; TensorFlow's many threads then hold
            # on to ~100 MB per worker that two arenas do not (docs/performance.md, change 9)
            "MALLOC_ARENA_MAX": "2",
            **self.options.env,  # the user's word wins, except for what makes the task a task
            tfconfig.TASK_VARIABLE: name,
            "TF_USE_LEGACY_KERAS": KERAS_CHOICES[self.options.keras],
        }
        env.pop("TF_CONFIG", None)  # the kit's, with the port picked on the engine, comes after
        return env

    # ----- state ------------------------------------------------------------------------------
    def _require_started(self) -> None:
        if not self.started:
            raise ClusterError("the cluster is not running",
                               fix="use `with TFCluster(...) as cluster:` or call cluster.start()")

    def _require_ready(self) -> None:
        self._require_started()
        if self.state.phase is Phase.STALE:
            raise ClusterError(self.state.reason, list(self.state.tasks),
                               fix="call cluster.restart() for fresh engines")

    def _mark_stale(self, reason: str, tasks: list[str]) -> None:
        """The engines must be replaced before the next run, because ``reason``."""
        self.state = State(Phase.STALE, reason, tuple(tasks))

    def _select(self, tasks: list[str] | tuple | None) -> list[str]:
        if tasks is None:
            return self.task_names
        names = []
        for task in tasks:
            name = tfconfig.task_name(*tfconfig.parse_task(task))
            if name not in self.task_names:
                raise OptionError("tasks", f"{task!r} is not a task of this cluster",
                                  f"use one of {', '.join(self.task_names)}")
            names.append(name)
        return names

    def _dead_tasks(self, names: list[str]) -> list[str]:
        """The tasks among ``names`` whose engine process has exited (the one liveness check)."""
        return [name for name in names if not self._engines.alive(name)]

    def _out_of_memory(self) -> str:
        """How a dead engine died, if the out-of-memory killer did it ("" otherwise): with the numbers."""
        now = limits.oom_kills()
        if now is None or self._oom_kills is None or now <= self._oom_kills:
            return ""
        here = limits.read()
        limit = (f"the memory limit here is {here.memory_limit / 2**30:.1f} GiB ({here.memory_limit_from})"
                 if here.memory_limit else "the machine ran out of memory")
        return (f"killed by the out-of-memory killer ({now - self._oom_kills} kill(s) in this memory "
                f"cgroup since the run began); {limit}, for the kernel and {len(self.task_names)} task(s) of "
                f"about {limits.TASK_MEMORY_MB} MB each while they train. Fix: fewer tasks or a smaller "
                "batch, or a machine or session with more memory")

    def _warn_exposed(self) -> None:
        servers = [f"{r.info.name} at {r.info.address}" for r in self._records.values() if r.info.address]
        warnings.warn(
            f"The TensorFlow servers of this cluster can be reached from other hosts: "
            f"{', '.join(servers)}, listening on every interface ({self.exposed_because}). They have "
            "no authentication: anyone who can connect can read and write files as this user while "
            f"the cluster runs. Fix: {self._engines.exposed_fix} (README, Security).",
            ExposedPortsWarning, stacklevel=_caller_outside_kit())


def _caller_outside_kit() -> int:
    """The ``stacklevel`` that attributes a warning to the first caller outside the kit package."""
    frame, level = sys._getframe(1), 1  # noqa: SLF001 - the caller of this function is level 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "kit":
        frame, level = frame.f_back, level + 1
    return level
