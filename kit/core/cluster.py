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
:mod:`kit.core.runs`; a run reaches the tasks only through the :class:`kit.core.group.TaskGroup` the cluster
hands it (``task_group()``), made anew each time the engines get their roles. Every process the cluster
started is stopped when the ``with`` block ends, at interpreter exit, and (through :mod:`kit.core._lifeline`)
when the notebook kernel is killed.
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
from .backend import Backend
from .attach import ForeignEngines
from .engines import Engines, LocalEngines
from .errors import ClusterError, ExposedPortsWarning, MemoryLimitWarning
from .group import TaskGroup, TaskRecord
from .options import ClusterOptions, RunOptions, TaskInfo, check_names
from .runs import FAILED_PEERS_GRACE_SECONDS, STARTUP_NOISE, Failure, Run, notebook_sources

__all__ = ["TFCluster", "Phase", "State", "TaskRecord", "TaskGroup", "Failure", "kit_processes",
           "notebook_sources", "STARTUP_NOISE", "FAILED_PEERS_GRACE_SECONDS"]

_live_clusters: "weakref.WeakSet[TFCluster]" = weakref.WeakSet()
#: How long :meth:`TFCluster.kill` waits for a SIGKILLed local engine to end (it takes milliseconds).
KILL_SECONDS = 10.0


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


class TFCluster:
    """A TensorFlow cluster of ipyparallel engines, one engine per TF task.

    ``TFCluster(workers=2)`` for MultiWorkerMirroredStrategy; ``TFCluster(chief=True, workers=2,
    ps=1)`` for ParameterServerStrategy. See :class:`ClusterOptions` for every option. ``backend``: what the
    ready tasks get besides TF_CONFIG (:mod:`kit.core.backend`; HorovodCluster and JaxCluster pass theirs).
    """

    def __init__(self, workers: int = 2, *, backend: Backend | None = None, **options: Any):
        check_names(ClusterOptions, options, "a TFCluster option")
        self.options = ClusterOptions(workers=workers, **options)
        self.backend = backend or Backend()
        self.log = logging.getLogger("kit.core.cluster")
        self.state = State()
        self._engines: Engines | None = None
        self._group: TaskGroup | None = None  # the tasks of the engines of the moment (None: no roles yet)
        #: Every failure a supervised run (``max_failures``) saw, across runs.
        self.failures: list[Failure] = []
        self._memory = limits.OomWatch(len(self.task_names))  # names an engine the OOM killer ended
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
    def engines(self) -> Engines | None:
        """Where the tasks' processes come from (:class:`kit.core.engines.Engines`; None while stopped),
        e.g. ``cluster.engines.profile_dir`` of local engines. For looking, not for changing."""
        return self._engines

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
        group = self.task_group(ready=False)
        return [group.info(name) for name in group.names]

    @property
    def tf_configs(self) -> dict[str, dict]:
        """The TF_CONFIG of each task, by task name."""
        if self.backend.no_tf_config is not None:
            raise ClusterError(self.backend.no_tf_config[0], fix=self.backend.no_tf_config[1])
        group = self.task_group(ready=False)
        return {name: group.records[name].tf_config for name in group.names}

    def task_group(self, ready: bool = True) -> TaskGroup:
        """The running tasks, as a run uses them (:class:`kit.core.group.TaskGroup`): the one door between
        a run and this cluster. Raises ClusterError if the cluster is not running, or is stale (lost a task,
        timed out; ``ready=False`` lets a stale cluster's tasks through, as long as it still has them)."""
        self._require_started()
        if self._group is None or (ready and self.state.phase is Phase.STALE):
            raise ClusterError(self.state.reason, list(self.state.tasks),
                               fix="call cluster.restart() for fresh engines")
        return self._group

    def describe(self):
        """The tasks as a pandas DataFrame (for a notebook)."""
        import pandas as pd

        rows = self.backend.rows(self.tasks)
        if rows is None:
            return pd.DataFrame([dataclasses.asdict(t) for t in self.tasks]).set_index("name")
        return pd.DataFrame(rows).set_index("task")

    def start(self) -> "TFCluster":
        """Start (or find) one engine per task; return when every task has its role, checked."""
        if self.started:
            raise ClusterError("this TFCluster is already started",
                               fix="stop() it first, or call restart() for fresh engines")
        _live_clusters.add(self)
        self._memory.mark()
        self.state = State(Phase.STARTING)
        try:
            if self.options.engines is None:
                shortfall = limits.memory_shortfall(len(self.task_names), limits.read())
                if shortfall:
                    warnings.warn(f"This cluster will probably not fit in memory: {shortfall}. The kernel "
                                  "will then kill a task. Fix: fewer tasks (workers=...), or a machine "
                                  "or session with more memory.", MemoryLimitWarning,
                                  stacklevel=_caller_outside_kit())
                self._engines = LocalEngines(self.options, explain_exit=self._memory.explain)
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
        self._group = None
        try:
            self._assign_roles(self._engines.replace(self.task_names, self._launch_environments()))
        except BaseException as error:
            self._mark_stale(f"a restart failed ({str(error).splitlines()[0] if str(error) else error!r})",
                             getattr(error, "tasks", []))
            raise
        if self.exposed_because:  # fresh ports: the warning names them again
            self._warn_exposed()
        return self

    def stop(self) -> None:
        """Stop every engine and the controller this cluster started, and wait until they are gone."""
        _live_clusters.discard(self)
        self.state = State(Phase.STOPPED)
        self._group = None
        self.backend.reset()
        engines, self._engines = self._engines, None
        if engines is not None:
            engines.close()

    def __enter__(self) -> "TFCluster":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {', '.join(self.task_names)} ({'running' if self.started else 'stopped'})>"

    def _repr_html_(self) -> str:
        """The tasks as a table in a notebook: address, pid, and the state of the last run."""
        if not self.started or self._group is None:
            return f"<b>{type(self).__name__}</b> {', '.join(self.task_names)}: {self.state.phase.value}"
        last = self.last_view.rows if self.last_view is not None else {}
        rows = []
        for task in self.tasks:
            row = views.TaskRow(task.name, address=task.address or task.host, pid=task.pid)
            if task.name in last and last[task.name].pid == task.pid:
                row = dataclasses.replace(last[task.name])
            rows.append(row)
        network = ("in a private network (unreachable from other hosts)" if not self.exposed_because
                   else f"reachable from the network: {self.exposed_because}")
        return views.render_html(f"{type(self).__name__}, {len(rows)} tasks, {network}", rows)

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
        group = self.task_group(ready=False)
        name = group.select([task])[0]
        info = group.info(name)
        self._engines.signal(name, info.engine_id, signal)
        # back once a local engine has ended: the next run then finds the task lost before it starts (on a loaded
        # machine a SIGKILLed engine still ran for a moment, and that run lost it midway: tests/learner)
        if signal == signals.SIGKILL and isinstance(self._engines, LocalEngines) \
                and not _lifeline.wait_ended(info.pid, KILL_SECONDS):
            raise ClusterError(f"{name}'s engine process (pid {info.pid}) still runs {KILL_SECONDS:g} s after "
                               "SIGKILL", [name], fix="look for a process stuck in the kernel (state D in ps)")

    # ----- roles: one path for every kind of engines --------------------------------------------
    def _launch_environments(self) -> dict[str, dict[str, str]]:
        """What each engine gets at launch where its kind can pass it (local engines): everything but
        TF_CONFIG, whose port is picked on the engine once it runs. ``MALLOC_ARENA_MAX`` must be there
        to count from the start (glibc reads it once); engines from elsewhere get it by ``mallopt``."""
        return {name: roles.task_environment(self.options, name) for name in self.task_names}

    def _assign_roles(self, reports: dict[str, dict]) -> None:
        """Give every task its role on the engine ``reports`` assigns it (:mod:`kit.core.roles`): check the
        engines, pick and open each task's port on its own host, check every task reaches every other,
        set each task's environment (TF_CONFIG included) before TensorFlow starts, and check it; then
        hand the tasks to runs as a new :class:`TaskGroup`."""
        engines = self._engines
        client = engines.client
        roles.check_engines(reports, self.options.keras)
        hosts = {n: engines.task_host(r) for n, r in reports.items()}
        ports = roles.open_ports(client, reports, roles.pick_ports(client, reports, engines.task_host),
                                 hosts, self.log)
        configs = roles.build_configs(list(reports), ports, hosts)
        roles.check_reachability(client, reports, configs)
        per_host = {h: list(hosts.values()).count(h) for h in hosts.values()}
        envs = {name: roles.task_environment(self.options, name, rep["cores"], per_host[hosts[name]])
                for name, rep in reports.items()}
        reports = roles.set_environments(client, reports, envs, configs)
        client[[r["engine_id"] for r in reports.values()]].use_cloudpickle()
        records = {name: TaskRecord(roles.task_info(name, reports[name], configs[name], not engines.exposed_because),
                                    configs[name], client[reports[name]["engine_id"]]) for name in self.task_names}
        self._group = TaskGroup(records, engines, self._memory, self._mark_stale)
        self.state = State(Phase.READY)
        self.backend.configure(self._group, self.options, self.log)

    # ----- state ------------------------------------------------------------------------------
    def _require_started(self) -> None:
        if not self.started:
            raise ClusterError("the cluster is not running",
                               fix="use `with TFCluster(...) as cluster:` or call cluster.start()")

    def _mark_stale(self, reason: str, tasks: list[str]) -> None:
        """The engines must be replaced before the next run, because ``reason`` (a run says so through
        its :class:`TaskGroup`)."""
        self.state = State(Phase.STALE, reason, tuple(tasks))

    def _warn_exposed(self) -> None:
        warning = ExposedPortsWarning.about(self.tasks, self.exposed_because, self._engines.exposed_fix)
        self.log.info(warning.detail)
        if str(warning) not in EXPOSED_SHOWN:
            EXPOSED_SHOWN.add(str(warning))
            warnings.warn(warning, stacklevel=_caller_outside_kit())


#: The ExposedPortsWarnings this process has shown: a kernel shows each once, not at every cluster and restart
#: (Python's "once" action cannot do it: its registry is cleared whenever any code changes the warning filters,
#: as catch_warnings does); the text names no address, the detail goes to the ``kit`` log. Clear it to see them again.
EXPOSED_SHOWN: set[str] = set()


def _caller_outside_kit() -> int:
    """The ``stacklevel`` that attributes a warning to the first caller outside the kit package."""
    frame, level = sys._getframe(1), 1  # noqa: SLF001 - the caller of this function is level 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "kit":
        frame, level = frame.f_back, level + 1
    return level
