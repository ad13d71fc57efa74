"""TFCluster: one ipyparallel engine per TensorFlow task, each with its own TF_CONFIG.

    with kit.TFCluster(workers=2) as cluster:
        results = cluster.run(train_fn, epochs=3)

The cluster starts an ipyparallel controller and one engine *set* per TF task (so one task can be
signalled, killed or restarted alone), picks a free port per task, and launches each engine with
TF_CONFIG, TF_USE_LEGACY_KERAS and thread limits in its environment, before TensorFlow is
imported. The engines live in a private network namespace (:mod:`kit.core._netns`), because TensorFlow's
servers listen on every interface and run any op a stranger sends; the controller talks to them, and
the kernel to it, over unix sockets in the cluster's 0700 profile folder (docs/security.md). It stops
every process it started when the ``with`` block ends, at interpreter exit, and (through
:mod:`kit.core._lifeline`) when the notebook kernel or the controller is killed.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import re
import shutil
import signal as signals
import sys
import tempfile
import time
import uuid
import warnings
import weakref
from typing import Any, Callable

import ipyparallel as ipp
import psutil

from . import _lifeline, _netns, _remote, limits, tfconfig, view as views
from .attach import ForeignEngines, wait_for_one_more_engine
from .errors import (ClusterError, ExposedPortsWarning, FailuresExhaustedError, MemoryLimitWarning, OptionError,
                     WorkerError)
from .options import KERAS_CHOICES, ClusterOptions, TaskInfo, engine_set_id

#: The controller's heartbeat period. An engine counts as registered after its first heartbeat,
#: so ipyparallel's default (3000 ms) cost about 5 s of every start; the heart answers from a
#: C thread, so a busy TensorFlow process still beats on time.
HEARTBEAT_MS = 1000


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
            lifeline = proc.environ().get(_lifeline.ENV_VAR)
            if lifeline is None or (owner_pid is not None and not lifeline.startswith(f"{owner_pid}:")):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone meanwhile (fine), or another user's process: not ours
    return found


def notebook_sources() -> dict[str, tuple]:
    """The linecache entries of the code cells this kernel ran (IPython keeps them with no mtime).

    Sent with every run (:func:`kit.core._remote.call_with_sources`) so that a function defined in a cell
    has its source on the engines too. Empty outside IPython.
    """
    import linecache

    return {name: entry for name, entry in list(linecache.cache.items())
            if len(entry) == 4 and entry[1] is None and entry[2]}


def _usable_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a container's CPU quota (kit.core.limits)."""
    return limits.read().cores


class TFCluster(ForeignEngines):
    """A TensorFlow cluster of ipyparallel engines, one engine per TF task.

    ``TFCluster(workers=2)`` for MultiWorkerMirroredStrategy; ``TFCluster(chief=True, workers=2,
    ps=1)`` for ParameterServerStrategy. See :class:`ClusterOptions` for every option.
    """

    def __init__(self, workers: int = 2, **options: Any):
        unknown = set(options) - {f.name for f in dataclasses.fields(ClusterOptions)}
        if unknown:
            name = sorted(unknown)[0]
            raise OptionError(name, "is not a TFCluster option",
                              f"use one of {', '.join(ClusterOptions.help())}")
        self.options = ClusterOptions(workers=workers, **options)
        self.log = logging.getLogger("kit.core.cluster")
        self._ipp: ipp.Cluster | None = None
        self._client: ipp.Client | None = None
        self._profile_dir: str | None = None
        self._tasks: dict[str, TaskInfo] = {}
        self._tf_configs: dict[str, dict] = {}
        self._lost: list[str] = []
        self._needs_restart = ""  # why the engines must be replaced before the next run
        #: Every failure a supervised run (``max_failures``) saw, across runs.
        self.failures: list[Failure] = []
        self._retired_ids: set[int] = set()  # engine ids of engines this cluster replaced
        self._owned_sets: list[str] = []  # engine sets started through a user's ipyparallel.Cluster
        self._owned_controller = False
        self._network: _netns.PrivateNetwork | None = None
        self._oom_kills: int | None = None  # the memory cgroup's OOM-kill count when the run began
        #: Each task's whole output (stdout and stderr lines, nothing hidden) of the last run, by task name.
        self.output: dict[str, str] = {}
        #: Why the tasks' servers are reachable from the network ("" while they are not).
        self.exposed_because = ""
        #: The live view of the last :meth:`run` (its ``states()``: each task's last state).
        self.last_view: views.RunView | None = None
        self.started = False

    # ----- public API -------------------------------------------------------------------------
    @property
    def task_names(self) -> list[str]:
        """Names of the cluster's tasks in order: chief, workers, ps, evaluator."""
        layout = self.options.cluster_layout()
        return [tfconfig.task_name(t, i) for t in tfconfig.TASK_TYPES for i in range(layout.get(t, 0))]

    @property
    def tasks(self) -> list[TaskInfo]:
        """Each running task: type, index, address, engine id, pid, host, Keras choice."""
        self._require_started()
        return [self._tasks[name] for name in self.task_names]

    @property
    def tf_configs(self) -> dict[str, dict]:
        """The TF_CONFIG of each task, by task name."""
        self._require_started()
        return {name: self._tf_configs[name] for name in self.task_names}

    def describe(self):
        """The tasks as a pandas DataFrame (for a notebook)."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(t) for t in self.tasks]).set_index("name")

    def start(self) -> "TFCluster":
        """Start the controller and one engine per task; return when all report their TF_CONFIG."""
        if self.started:
            raise ClusterError("this TFCluster is already started; stop() it first, or "
                               "call restart() for fresh engines")
        _live_clusters.add(self)
        self._oom_kills = limits.oom_kills()
        try:
            if self.options.engines is None:
                shortfall = limits.memory_shortfall(len(self.task_names), limits.read())
                if shortfall:
                    warnings.warn(f"This cluster will probably not fit in memory: {shortfall}. The kernel "
                                  "will then kill a task. Fix: fewer tasks (workers=...), or a machine "
                                  "or session with more memory.", MemoryLimitWarning,
                                  stacklevel=_caller_outside_kit())
                self._start_controller()
                self._start_engines()
            else:
                self._connect(self.options.engines)
                self._attach_engines()
                self.exposed_because = "engines from elsewhere reach each other over the network"
        except BaseException:
            self.stop()
            raise
        self.started = True
        if self.exposed_because:
            self._warn_exposed()
        return self

    def restart(self) -> "TFCluster":
        """Replace every engine with a fresh process, same topology, new ports where needed.

        TensorFlow cannot reconfigure collectives inside a live process, so a cluster that lost a
        task (or must forget its TensorFlow state) gets all-new engines.
        """
        self._require_started()
        if self.options.engines is None:
            self._stop_engines()
            self._start_engines()
        elif self._owned_sets:
            self._stop_engines()
            self._attach_engines()
        else:
            raise ClusterError("these engines were started outside the kit, so it cannot give you "
                               "fresh ones: restart them with your launcher, then create a new TFCluster")
        return self

    def stop(self) -> None:
        """Stop every engine and the controller, and wait until their processes are gone."""
        _live_clusters.discard(self)
        self.started = False
        if self.options.engines is not None:
            self._detach()
        elif self._ipp is not None:
            pids = self._owned_pids()
            if self._client is not None:
                self._client.close()
                self._client = None
            try:  # engines first: an engine whose controller vanished first exits with an error
                self._stop_engines()
                self._ipp.stop_controller_sync()
            finally:
                _reap(pids, self.log)
                self._ipp = None
        if self._network is not None:
            self._network.stop()
            self._network = None
        if self._profile_dir is not None:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            self._profile_dir = None
        self._tasks.clear()

    def __enter__(self) -> "TFCluster":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.started else "stopped"
        return f"<TFCluster {', '.join(self.task_names)} ({state})>"

    def _repr_html_(self) -> str:
        """The tasks as a table in a notebook: address, pid, and the state of the last run."""
        if not self.started:
            return f"<b>TFCluster</b> {', '.join(self.task_names)}: stopped"
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

    def run(self, fn: Callable, *args: Any, tasks: list[str] | None = None,
            timeout: float | None = None, stream: bool = True, max_failures: int = 0,
            on_restart: Callable[["TFCluster"], Any] | None = None, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every task at once; return the results in task order.

        ``tasks`` restricts the run to some tasks (names like "worker:1"). Each task's output is
        printed as it comes, prefixed with the task's name (``stream=False`` keeps it quiet). A
        failure on any task raises :class:`WorkerError` naming the task that failed first, with
        its remote traceback. ``timeout`` (seconds) bounds the run.

        With ``max_failures=N`` the cluster supervises the run: when a task dies, raises or times
        out, every engine is replaced (:meth:`restart`) and ``fn`` is called again, up to N times;
        after that :class:`FailuresExhaustedError` lists every failure. Each failure is printed as
        it happens and kept in :attr:`failures`. ``fn`` must resume by itself (e.g. Keras's
        BackupAndRestore) for the work done before a failure to count. ``on_restart(cluster)`` runs
        after each restart, before ``fn`` again (e.g. to start ParameterServerStrategy's servers).
        """
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 0:
            raise OptionError("max_failures", f"{max_failures!r} is not a whole number >= 0",
                              "e.g. max_failures=2 restarts the cluster at most twice")
        name = getattr(fn, "__name__", str(fn))
        self._require_started()
        names = self._select(tasks)
        self.last_view = live = views.RunView(f"{name} on {', '.join(names)}", [self._tasks[n] for n in names],
                                              mode=views.choose(self.options.view), show_lines=stream)
        failures: list[Failure] = []
        while True:
            try:
                return self._run_once(fn, args, kwargs, names, timeout, live)
            except (WorkerError, ClusterError) as error:
                if max_failures == 0:
                    raise
                failure = Failure(attempt=len(failures) + 1, task=_failed_task(error),
                                  error=str(error).split("\n")[0], failed_at=time.time())
                failures.append(failure)
                self.failures.append(failure)
                if len(failures) > max_failures:
                    live.event(f"{failure.task} failed again: {failure.error}; giving up after "
                               f"{max_failures} restart(s)")
                    raise FailuresExhaustedError(name, failures) from error
                live.event(f"attempt {failure.attempt}: {failure.task} failed: {failure.error}")
                live.restarting(f"restarting all {len(self.task_names)} tasks with fresh engines "
                                f"(restart {len(failures)} of at most {max_failures})")
                self._supervised_restart(failures, max_failures, name, live)
                if on_restart is not None:
                    on_restart(self)
                failure.restarted_at = time.time()
                live.restarted(self.tasks, f"restarted in {failure.restarted_at - failure.failed_at:.1f}s; "
                                           f"running {name} again")

    def _supervised_restart(self, failures: list["Failure"], max_failures: int, name: str,
                            live: views.RunView) -> None:
        """Restart until the cluster is up; a restart that fails counts as one more failure."""
        while True:
            try:
                if self.started:
                    self.restart()
                else:  # a previous restart failed half-way: start from scratch
                    self.start()
                return
            except ClusterError as error:
                failure = Failure(attempt=len(failures) + 1, task=_failed_task(error),
                                  error=f"restart failed: {str(error).splitlines()[0]}",
                                  failed_at=time.time())
                failures.append(failure)
                self.failures.append(failure)
                live.event(failure.error)
                if len(failures) > max_failures:
                    raise FailuresExhaustedError(name, failures) from error

    def _run_once(self, fn: Callable, args: tuple, kwargs: dict, names: list[str],
                  timeout: float | None, live: views.RunView) -> list:
        self._require_started()
        if self._needs_restart:
            raise ClusterError(f"{self._needs_restart}. Call cluster.restart() for fresh engines.",
                               self._lost)
        name = getattr(fn, "__name__", str(fn))
        gone = self._dead_tasks(names)
        if gone:  # e.g. a signal ended an idle engine: say so, instead of ipyparallel's KeyError
            self._lost, self._needs_restart = gone, f"the cluster lost {', '.join(gone)}"
            raise ClusterError(f"{', '.join(gone)}: the engine process is gone (it exited or was killed "
                               f"before this run of {name}). Call cluster.restart() for fresh engines.", gone)
        self._oom_kills = limits.oom_kills()
        engines = self._client[[self._tasks[n].engine_id for n in names]]
        result = engines.apply_async(_remote.call_with_sources, notebook_sources(), fn, *args, **kwargs)
        live.submitted(names)
        follower = _OutputFollower(names, sink=live.line, quiet=self.options.tf_logs == "quiet")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not result.wait(0.2):
                follower.update(result)
                live.follow(result, names)
                dead = self._dead_tasks(names)
                if dead:
                    self._lost = dead
                    self._needs_restart = f"the cluster lost {', '.join(dead)}"
                    oom = self._out_of_memory()
                    for task in dead:
                        live.fail(task, oom or "its engine process exited")
                    # the others usually fail within a second (a collective's peer is gone): let their
                    # rows and output show it before raising
                    survivors = [msg for n, msg in zip(names, result.msg_ids) if n not in dead]
                    if survivors:
                        self._client.wait(survivors, timeout=FAILED_PEERS_GRACE_SECONDS)
                        follower.update(result)
                        live.follow(result, names)
                    raise WorkerError(dead[0], f"its engine process exited while running {name}"
                                      f"{oom and ': ' + oom}{self._log_tail(dead[0])}",
                                      failures={n: oom or "process exited" for n in dead})
                if any(meta.get("status") == "error" for meta in _as_list(result.metadata)):
                    # one task failed; the others may be blocked in a collective waiting for it
                    if not result.wait(FAILED_PEERS_GRACE_SECONDS):
                        running = [n for n, meta in zip(names, _as_list(result.metadata))
                                   if meta.get("status") is None]
                        self._needs_restart = (f"{', '.join(running)} still running {name} after "
                                               "another task failed")
                        self._collect(result, names, partial=True)
                    break
                if deadline is not None and time.monotonic() > deadline:
                    self._needs_restart = f"a run of {name} timed out"
                    running = [n for n, meta in zip(names, _as_list(result.metadata)) if meta.get("status") is None]
                    finished = [n for n in names if n not in running]
                    for task in running:
                        live.fail(task, f"still running after {timeout:g}s (timeout)")
                    why = (f"; {', '.join(finished)} finished, so {'it is' if len(running) == 1 else 'they are'} "
                           "probably waiting in a collective (an all-reduce, a save) that the others never "
                           "joined" if finished else "")
                    raise ClusterError(f"run of {name} timed out after {timeout:g}s: {', '.join(running)} "
                                       f"still running{why}. Call cluster.restart() before the next run "
                                       "(a task stuck in a collective cannot be freed)", running)
        finally:
            if result.ready():
                result.wait_for_output(timeout=5)  # iopub output may trail the reply a little
            follower.update(result, final=True)
            live.follow(result, names)
            live.draw(final=True)
            self.output = follower.output()
        return self._collect(result, names)

    def kill(self, task: str, signal: int = signals.SIGKILL) -> None:
        """Send ``signal`` (default SIGKILL) to one task's engine process, e.g. ``kill("worker:1")``.

        Safe to call from another thread while :meth:`run` is waiting (a fault-injection timer).
        """
        self._require_started()
        name = self._select([task])[0]
        launcher = self._launcher(name)
        if launcher is not None:
            launcher.signal(signal)
        else:  # an engine started elsewhere: ipyparallel's nanny on its host delivers the signal
            self._client.send_signal(int(signal), targets=[self._tasks[name].engine_id], block=True)

    # ----- start-up ---------------------------------------------------------------------------
    def _start_controller(self) -> None:
        self._profile_dir = tempfile.mkdtemp(prefix="kit-cluster-")  # 0700: only this user connects
        sockets = os.path.join(self._profile_dir, "sockets")
        os.mkdir(sockets, 0o700)
        self._ipp = ipp.Cluster(
            n=0,
            profile_dir=self._profile_dir,
            cluster_id=f"kit-{uuid.uuid4().hex[:8]}",
            # unix sockets, no TCP port: they reach engines in the private network (kit.core._controller)
            controller_args=["--IPController.use_threads=True", f"--HeartMonitor.period={HEARTBEAT_MS}",
                             "--IPController.transport=ipc", f"--IPController.ip={sockets}/c"],
            # ipyparallel warns, with the engine's whole log, about every engine that exits with a
            # signal; the kit kills engines on purpose (restart) and reports real failures itself
            log_level=logging.ERROR,
        )
        self._ipp.start_controller_sync(
            controller_cmd=[sys.executable, "-m", "kit.core._lifeline", "kit.core._controller"],
            environment={_lifeline.ENV_VAR: _lifeline.token(os.getpid())},
        )

    def _start_engines(self) -> None:
        """Launch one engine per task and wait until each reports the TF_CONFIG it was given."""
        self._lost = []
        self._needs_restart = ""
        self._tasks.clear()
        names = self.task_names
        ports = self._pick_ports(names)
        self._tf_configs = self._build_configs(names, ports)
        lifeline = ",".join([_lifeline.token(os.getpid()),
                             _lifeline.token(self._ipp.controller.process.pid)])
        network = self._private_network()
        for name in names:
            self._ipp.start_engines_sync(
                n=1,
                engine_set_id=engine_set_id(name),
                environment={**self._task_environment(name), _lifeline.ENV_VAR: lifeline, **network},
                engine_cmd=[sys.executable, "-m", "kit.core._lifeline", "ipyparallel.engine"],
            )
        if self._client is None:
            self._client = self._ipp.connect_client_sync()
        reports = self._wait_for_reports(names)
        for attempt in range(3):
            taken = [n for n in names if self._tf_configs[n]["task"]["type"] != "evaluator"
                     and not self._client[reports[n]["engine_id"]].apply_sync(
                         _remote.port_is_free, ports[n])]
            if not taken:
                break
            self.log.warning("ports taken since they were picked: %s; picking new ones", taken)
            for n in taken:
                ports[n] = self._client[reports[n]["engine_id"]].apply_sync(_remote.free_port)
            self._tf_configs = self._build_configs(names, ports)
            for n in names:
                self._client[reports[n]["engine_id"]].apply_sync(
                    _remote.set_environment, {"TF_CONFIG": tfconfig.dumps(self._tf_configs[n])})
        else:
            raise ClusterError(f"could not find free ports for {', '.join(taken)} in 3 tries", taken)
        self._client[[reports[n]["engine_id"] for n in names]].use_cloudpickle()
        for name in names:
            self._record_task(name, reports[name])

    def _record_task(self, name: str, report: dict) -> None:
        task = self._tf_configs[name]["task"]
        address = "" if task["type"] == "evaluator" else \
            self._tf_configs[name]["cluster"][task["type"]][task["index"]]
        keras = {v: k for k, v in KERAS_CHOICES.items()}.get(report["legacy_keras"], "keras3")
        port = address.rpartition(":")[2]
        if not address:
            listens_on = ""
        elif self._network is not None:
            listens_on = f"[::]:{port} in the cluster's private network (loopback only)"
        else:
            listens_on = f"[::]:{port}, every interface of {report['hostname']} (reachable from the network)"
        self._tasks[name] = TaskInfo(name=name, type=task["type"], index=task["index"], address=address,
                                     engine_id=report["engine_id"], pid=report["pid"],
                                     host=report["hostname"], keras=keras, listens_on=listens_on)

    def _private_network(self) -> dict[str, str]:
        """The engines' environment entry that puts them in the cluster's private network; {} where
        there is none (then :attr:`exposed_because` says why, and :meth:`start` warns)."""
        if self.options.isolation == "none":
            self.exposed_because = "isolation='none' was asked for"
            return {}
        if self._network is None or not self._network.alive():
            try:
                self._network = _netns.PrivateNetwork.start(_lifeline.token(os.getpid()))
            except _netns.Unavailable as error:
                self._network = None
                if self.options.isolation == "required":
                    raise ClusterError(f"no private network for the tasks ({error}), and isolation="
                                       "'required' was asked for. Fix: run where network namespaces "
                                       "are allowed (Linux; root, or unprivileged user namespaces), "
                                       "or use isolation='auto' to start with a warning") from None
                self.exposed_because = f"no private network namespace could be made here ({error})"
                return {}
        self.exposed_because = ""
        return {_netns.ENV_VAR: self._network.token}

    def _warn_exposed(self) -> None:
        servers = [f"{t.name} at {t.address}" for t in self._tasks.values() if t.address]
        if self.options.engines is None:
            fix = ("allow network namespaces here (Linux: root, or unprivileged user namespaces), "
                   "train only on a network you trust, or pass isolation='required' to refuse to "
                   "start exposed")
        else:
            fix = ("keep these hosts on a private network or VPN, admit only the peers' addresses to "
                   "these ports in each host's firewall, or use SSH tunnels with the ports closed")
        warnings.warn(
            f"The TensorFlow servers of this cluster can be reached from other hosts: "
            f"{', '.join(servers)}, listening on every interface ({self.exposed_because}). They have "
            "no authentication: anyone who can connect can read and write files as this user while "
            f"the cluster runs. Fix: {fix} (README, Security).",
            ExposedPortsWarning, stacklevel=_caller_outside_kit())

    def _pick_ports(self, names: list[str]) -> dict[str, int]:
        ports: dict[str, int] = {}
        for name in names:
            port = tfconfig.free_port()
            while port in ports.values():
                port = tfconfig.free_port()
            ports[name] = port
        return ports

    def _build_configs(self, names: list[str], ports: dict[str, int],
                       hosts: dict[str, str] | None = None) -> dict[str, dict]:
        training = [n for n in names if not n.startswith("evaluator")]
        cluster: dict[str, list[str]] = {}
        for name in training:
            host = (hosts or {}).get(name, self.options.host)
            cluster.setdefault(tfconfig.parse_task(name)[0], []).append(f"{host}:{ports[name]}")
        strategy = "parameter_server" if "ps" in cluster else None
        return {n: tfconfig.build(cluster, n, strategy=strategy) for n in names}

    def _task_environment(self, name: str, cores: int | None = None, tasks_here: int | None = None) -> dict[str, str]:
        threads = self.options.threads or max(1, (cores or _usable_cores()) // (tasks_here or len(self.task_names)))
        return {
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
            "KIT_TASK": name,
            "TF_CONFIG": tfconfig.dumps(self._tf_configs[name]),
            "TF_USE_LEGACY_KERAS": KERAS_CHOICES[self.options.keras],
        }

    def _wait_for_reports(self, names: list[str]) -> dict[str, dict]:
        """Wait until every task's engine registered; return each one's report, checked."""
        deadline = time.monotonic() + self.options.start_timeout
        new_ids = self._new_engine_ids()
        while len(new_ids) < len(names):
            exited = [n for n in names if not self._engine_running(n)]
            if exited:
                oom = self._out_of_memory()
                raise ClusterError(f"the engine of {', '.join(exited)} exited during start-up"
                                   f"{oom and ': ' + oom}{self._log_tail(exited[0])}", exited)
            if time.monotonic() > deadline:
                break
            wait_for_one_more_engine(self._client, self.log)  # then check processes and deadline
            new_ids = self._new_engine_ids()
        reports: dict[str, dict] = {}
        for engine_id in new_ids:
            rep = self._client[engine_id].apply_sync(_remote.report)
            reports[rep["task"]] = {**rep, "engine_id": engine_id}
        missing = [n for n in names if n not in reports]
        if missing:
            raise ClusterError(f"{', '.join(missing)} did not come up within "
                               f"{self.options.start_timeout:g}s (start_timeout)"
                               f"{self._log_tail(missing[0])}", missing)
        for name in names:
            rep = reports[name]
            if rep["tensorflow_imported"]:
                raise ClusterError(f"{name}'s engine imported TensorFlow before its TF_CONFIG was "
                                   "set; remove TensorFlow from the engine's startup", [name])
            if rep["tf_config"] is None or tfconfig.loads(rep["tf_config"]) != self._tf_configs[name]:
                raise ClusterError(f"{name} reports TF_CONFIG {rep['tf_config']!r}, not the one it "
                                   f"was given ({tfconfig.dumps(self._tf_configs[name])})", [name])
            if self.options.keras == "tf-keras" and not rep["has_tf_keras"]:
                raise ClusterError(f"{name} has no tf_keras package, which keras='tf-keras' needs; "
                                   "pip install tf-keras (same minor version as tensorflow)", [name])
        return reports

    # ----- helpers ----------------------------------------------------------------------------
    def _new_engine_ids(self) -> list[int]:
        return [i for i in self._client.ids if i not in self._retired_ids]

    def _require_started(self) -> None:
        if not self.started:
            raise ClusterError("the cluster is not running; use `with TFCluster(...) as cluster:` "
                               "or call cluster.start()")

    def _select(self, tasks: list[str] | None) -> list[str]:
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

    def _launcher(self, name: str):
        """The local launcher of ``name``'s engine (None for engines from elsewhere)."""
        if self.options.engines is not None:
            return None
        engine_set = self._ipp.engines.get(engine_set_id(name)) if self._ipp else None
        return next(iter(engine_set.launchers.values()), None) if engine_set else None

    def _engine_running(self, name: str) -> bool:
        launcher = self._launcher(name)
        return launcher is not None and launcher.state == "running" and \
            _lifeline.is_alive(launcher.process.pid, launcher.process.create_time())

    def _dead_tasks(self, names: list[str]) -> list[str]:
        dead = []
        for name in names:
            task = self._tasks[name]
            if self._launcher(name) is not None and not self._process_alive(task.pid):
                dead.append(name)
        return dead

    @staticmethod
    def _process_alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

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

    def _log_tail(self, name: str, lines: int = 15) -> str:
        launcher = self._launcher(name)
        path = getattr(launcher, "output_file", None)
        if not path or not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
        return f"\n--- last lines of {name}'s engine log ({path}) ---\n" + "\n".join(tail)

    def _owned_pids(self) -> list[int]:
        """Every process this cluster started, with their children."""
        procs: list[psutil.Process] = []
        launchers = [self._ipp.controller] if self._ipp.controller else []
        for engine_set in self._ipp.engines.values():
            launchers.extend(getattr(engine_set, "launchers", {}).values())
        for launcher in launchers:
            proc = getattr(launcher, "process", None)
            if proc is None:
                continue
            try:
                procs.extend([proc, *proc.children(recursive=True)])
            except psutil.NoSuchProcess:
                continue  # already gone: nothing to stop
        return [p.pid for p in procs]

    def _stop_engines(self) -> None:
        """Stop the engine sets this cluster started (SIGKILL: their state is thrown away)."""
        sets = list(self._ipp.engines) if self.options.engines is None else list(self._owned_sets)
        pids = [t.pid for t in self._tasks.values()] + self._engine_pids() \
            if self.options.engines is None else []
        self._retired_ids.update(t.engine_id for t in self._tasks.values())
        self._kill_engine_sets(sets)
        for set_id in sets:
            self._ipp.stop_engines_sync(set_id)
        _reap(pids, self.log)
        self._tasks.clear()

    def _kill_engine_sets(self, sets: list) -> None:
        """SIGKILL the engines of these sets. SIGTERM is no use: a task blocked in a collective ignores
        it, and one that trained with MultiWorkerMirroredStrategy takes ipyparallel's full 5 s grace
        to exit (TensorFlow's gRPC server does not shut down); their state is thrown away anyway."""
        for set_id in sets:
            for launcher in getattr(self._ipp.engines[set_id], "launchers", {}).values():
                try:
                    launcher.signal(signals.SIGKILL)
                except psutil.NoSuchProcess:
                    continue  # already dead: typically the task whose failure led here

    def _engine_pids(self) -> list[int]:
        pids = []
        for engine_set in self._ipp.engines.values():
            for launcher in getattr(engine_set, "launchers", {}).values():
                if getattr(launcher, "process", None) is not None:
                    pids.append(launcher.process.pid)
        return pids

    def _collect(self, result: Any, names: list[str], partial: bool = False) -> list:
        """The results in task order; raise WorkerError if any task failed.

        ``partial``: some tasks are still running; look only at those that finished.
        """
        if partial:
            values = [meta.get("error") if meta.get("status") == "error" else None
                      for meta in _as_list(result.metadata)]
        else:
            values = result.get(return_exceptions=True)
        if len(names) == 1 and not isinstance(values, list):
            values = [values]
        failures = {}
        order = []
        for name, value, meta in zip(names, values, _as_list(result.metadata)):
            if isinstance(value, BaseException):
                ename = getattr(value, "ename", type(value).__name__)
                evalue = getattr(value, "evalue", str(value))
                error = f"{ename}: {evalue}"
                if ename == "EngineError":  # the controller saw the engine die before the kit did
                    error += f"; {self._out_of_memory() or 'its process exited'}"
                failures[name] = (error, _ANSI.sub("", getattr(value, "traceback", "") or ""))
                order.append((meta.get("completed") or meta.get("received") or 0, name))
        if failures:
            first = min(order, key=lambda item: (str(item[0]), names.index(item[1])))[1]
            error, traceback = failures[first]
            raise WorkerError(first, error, remote_traceback=traceback,
                              failures={n: e for n, (e, _) in failures.items()})
        return values


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: After one task fails, how long the others get to finish before the cluster is marked stale.
FAILED_PEERS_GRACE_SECONDS = 2.0


@dataclasses.dataclass
class Failure:
    """One failure seen by a supervised run."""

    attempt: int      #: 1 for the first failure of a run
    task: str         #: the task that failed first
    error: str        #: one line
    failed_at: float  #: time.time() when the kit saw it
    restarted_at: float | None = None  #: time.time() when fresh engines were ready


def _caller_outside_kit() -> int:
    """The ``stacklevel`` that attributes a warning to the first caller outside the kit package."""
    frame, level = sys._getframe(1), 1  # noqa: SLF001 - the caller of this function is level 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "kit":
        frame, level = frame.f_back, level + 1
    return level


def _failed_task(error: Exception) -> str:
    if isinstance(error, WorkerError):
        return error.task
    tasks = getattr(error, "tasks", None)
    return tasks[0] if tasks else "cluster"


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _reap(pids: list[int], log: logging.Logger, timeout: float = 10.0) -> None:
    """Wait for ``pids`` to exit; SIGKILL those still alive after ``timeout`` seconds."""
    procs = []
    for pid in set(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue  # already gone
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        log.warning("process %s did not stop in %ss; killing it", proc.pid, timeout)
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue  # exited just now
    psutil.wait_procs(alive, timeout=timeout)


#: TensorFlow's start-up lines that say nothing to a learner: written by its C++ layer before its log
#: settings are read (so TF_CPP_MIN_LOG_LEVEL cannot silence them), on every import, on every task.
STARTUP_NOISE = re.compile("|".join([
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    r"I\d{4} [\d:.]+\s+\d+ \S+:\d+\] ",  # C++ INFO lines (oneDNN, cuda drivers, cpu_feature_guard, ...)
    r"E\d{4} [\d:.]+\s+\d+ cuda_\w+\.cc:\d+\] failed call to cuInit",  # no GPU on this machine
    r"To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
]))


class _OutputFollower:
    """Hands each task's new stdout/stderr lines to ``sink(task, stream, line)`` as they arrive
    (the live view: a task's log, or printed with the task's name in front), without TensorFlow's
    start-up noise (``quiet``); keeps every line, hidden or not."""

    def __init__(self, names: list[str], sink: Callable[[str, str, str], None], quiet: bool = True):
        self.names = names
        self.sink = sink
        self.quiet = quiet
        self.offsets = {(n, s): 0 for n in names for s in ("stdout", "stderr")}
        self.partial = {key: "" for key in self.offsets}
        self.lines: dict[str, list[str]] = {n: [] for n in names}

    def output(self) -> dict[str, str]:
        return {name: "\n".join(lines) for name, lines in self.lines.items()}

    def update(self, result: Any, final: bool = False) -> None:
        for stream_name in ("stdout", "stderr"):
            texts = _as_list(getattr(result, stream_name))
            for name, text in zip(self.names, texts):
                key = (name, stream_name)
                new = text[self.offsets[key]:]
                self.offsets[key] = len(text)
                buffered = self.partial[key] + new
                *lines, rest = buffered.split("\n")
                if final and rest:
                    lines.append(rest)
                    rest = ""
                self.partial[key] = rest
                for line in lines:
                    shown = line.rsplit("\r", 1)[-1]  # progress bars redraw with \r: keep the last
                    if not shown.strip():
                        continue
                    self.lines[name].append(shown)
                    if not (self.quiet and STARTUP_NOISE.match(shown)):
                        self.sink(name, stream_name, shown)
