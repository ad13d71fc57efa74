"""Where a TFCluster's engines come from, behind one interface: :class:`Engines`.

A :class:`kit.core.cluster.TFCluster` holds one ``Engines`` object, chosen once in ``start`` from
``options.engines``, and asks it for engine processes; it assigns the roles (ports, TF_CONFIG) itself,
the same way for every kind. Two kinds:

- :class:`LocalEngines` (here): an ipyparallel controller on unix sockets and one engine *set* per TF
  task on this machine (so one task can be signalled, killed or restarted alone), in a private network
  namespace (:mod:`kit.core._netns`), each tied to the kernel by a lifeline (:mod:`kit.core._lifeline`).
- :class:`kit.core.attach.ForeignEngines`: engines from elsewhere (a user's ipyparallel Cluster,
  Client or url file; SSH, Slurm, MPI launchers).

Modelled on ipyparallel's launchers, dask's SpecCluster/ProcessInterface and Ray Train's WorkerGroup:
the cluster says what it needs; the engines object owns the processes, and what it started it stops.
"""

from __future__ import annotations

import abc
import logging
import os
import signal as signals
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import ipyparallel as ipp
import psutil

from . import _lifeline, _netns, _remote, _zygote, links, workdir
from .roles import on_each
from .errors import ClusterError
from .options import ClusterOptions, engine_set_id

#: The controller's heartbeat period. An engine counts as registered after its first heartbeat,
#: so ipyparallel's default (3000 ms) cost about 5 s of every start, and 1000 ms about 1 s once engines
#: forked with TensorFlow imported register after the import instead of during it (docs/performance.md,
#: change 24); the heart answers from a C thread, so a busy TensorFlow process still beats on time.
HEARTBEAT_MS = 200
#: Missed beats before the controller drops an engine: 10 s, as ipyparallel's default 10 misses of 1000 ms.
HEARTBEAT_MISSES = 10_000 // HEARTBEAT_MS

log = logging.getLogger("kit.core.engines")


class Engines(abc.ABC):
    """One engine process per TF task: start them, signal them, tell whether they live, replace them.

    ``start`` and ``replace`` return each task's engine report (:func:`kit.core._remote.report`, with its
    ``engine_id``) once every engine is registered; the cluster then gives each its role.
    """

    #: The ipyparallel client the cluster runs functions through (None before start and after close).
    client: ipp.Client | None = None
    #: Why the tasks' servers are reachable from the network ("" while they are not).
    exposed_because = ""
    #: What to do about an exposed cluster (the fix of the ExposedPortsWarning).
    exposed_fix = ""

    @abc.abstractmethod
    def start(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        """Start (or find) one engine per task, with ``environments[name]`` in its launch environment
        where the kind can pass one; return each task's report."""

    @abc.abstractmethod
    def replace(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        """Stop every engine handed out (their state is thrown away) and start fresh ones."""

    @abc.abstractmethod
    def signal(self, name: str, engine_id: int, sig: int) -> None:
        """Send ``sig`` to task ``name``'s engine process."""

    @abc.abstractmethod
    def alive(self, name: str) -> bool:
        """Whether task ``name``'s engine process still runs (True where it cannot be seen from here)."""

    def log_tail(self, name: str, lines: int = 15) -> str:
        """The last lines of task ``name``'s engine log, as a paragraph for an error ("" if unknown)."""
        return ""

    @abc.abstractmethod
    def task_host(self, report: dict) -> str:
        """The address the other tasks reach the task of this engine report at."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop what this object started and wait until those processes are gone."""


class LocalEngines(Engines):
    """A controller and one engine set per task on this machine; every process stopped at close."""

    exposed_fix = ("allow network namespaces here (Linux: root, or unprivileged user namespaces), train "
                   "only on a network you trust, or pass isolation='required' to refuse to start exposed")

    def __init__(self, options: ClusterOptions, explain_exit: Callable[[], str] = lambda: ""):
        self.options = options
        self.explain_exit = explain_exit  # why an engine died, e.g. the OOM killer ("" if unknown)
        self.ipp: ipp.Cluster | None = None
        self.profile_dir: str | None = None
        self.network: _netns.PrivateNetwork | None = None
        self.linked: links.LinkedNetwork | None = None  #: with options.link: one namespace per task (kit.core.links)
        self.zygote: _zygote.Zygote | None = None  #: forks the engines, with TensorFlow imported (preload)
        self.retired_ids: set[int] = set()  # ids of engines already replaced: not ours any more

    def start(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        if self.ipp is None:
            self._start_controller()
        lifeline = ",".join([_lifeline.token(os.getpid()), _lifeline.token(self.ipp.controller.process.pid)])
        if self.options.link is not None:
            networks = self._linked_network(names)
        else:
            shared = self._private_network()
            networks = {name: shared for name in names}
        # preload (not with tf_logs="all": the start-up lines would go to the engine's log): forked by one zygote that
        # imported TensorFlow (docs/performance.md, change 24), unless the tasks start differently, each has its own
        # network (link=), there is one, or this is not Linux (can_fork): then each imports it in the background
        preload: dict[str, str] = {}
        if self.options.preload and self.options.tf_logs == "quiet":
            forked = (_zygote.can_fork() and len(names) > 1 and self.options.link is None
                      and _zygote.same_start(map(environments.get, names)))
            preload = ({_zygote.ZYGOTE_VAR: self._zygote(environments[names[0]], lifeline, networks[names[0]])}
                       if forked else {_remote.PRELOAD_VAR: "tensorflow"})
        for name in names:
            # TMPDIR in the cluster's folder: what a SIGKILLed task leaves there goes with it (kit.core.workdir)
            tmpdir = workdir.task_tmpdir(Path(self.profile_dir), engine_set_id(name))
            self.ipp.start_engines_sync(
                n=1,
                engine_set_id=engine_set_id(name),
                environment={"TMPDIR": tmpdir, **environments[name], _lifeline.LIFELINE_VAR: lifeline,
                             **networks[name], **preload},
                engine_cmd=[sys.executable, "-m", "kit.core._boot", "ipyparallel.engine"],
                # no nanny: one more Python process to wait for; the kit watches its engines (docs/performance.md,
                # change 17). Registration bounded by start_timeout, not 5 s: under load engines gave up (change 28)
                engine_args=["--IPEngine.enable_nanny=False", f"--IPEngine.timeout={self.options.start_timeout:g}",
                             f"--IPEngine.wait_for_url_file={self.options.start_timeout:g}"],
            )
        if self.client is None:
            self.client = self.ipp.connect_client_sync()
        return self._wait_for_reports(names)

    def replace(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        self._stop_engines()
        return self.start(names, environments)

    def _zygote(self, environment: dict[str, str], lifeline: str, network: dict[str, str]) -> str:
        """The socket of this cluster's zygote (:mod:`kit.core._zygote`), started on first use and again if it is
        gone or the network changed; what TensorFlow reads at import comes from the tasks' launch environment."""
        if self.zygote is not None and not self.zygote.serves(network):
            self.zygote.stop()
            self.zygote = None
        if self.zygote is None:
            env = {**os.environ, **environment, _lifeline.LIFELINE_VAR: lifeline, **network}
            env.pop(_remote.PRELOAD_VAR, None)
            self.zygote = _zygote.Zygote.start_in(Path(self.profile_dir), env, self.options.start_timeout)
        return self.zygote.socket_path

    def signal(self, name: str, engine_id: int, sig: int) -> None:
        launcher = self._launcher(name)
        if launcher is None:
            raise ClusterError(f"{name} has no engine process on this machine (it was stopped)", [name],
                               fix="call cluster.restart() for fresh engines")
        launcher.signal(sig)

    def alive(self, name: str) -> bool:
        launcher = self._launcher(name)
        process = getattr(launcher, "process", None)
        return process is not None and _lifeline.runs(process)

    def log_tail(self, name: str, lines: int = 15) -> str:
        launcher = self._launcher(name)  # ipyparallel reads an ended engine's log, keeps it, removes the file
        path = getattr(launcher, "output_file", None)
        text = path and (Path(path).read_text(errors="replace") if os.path.exists(path) else launcher.get_output())
        if not text:
            return ""
        return f"\n--- last lines of {name}'s engine log ({path}) ---\n" + "\n".join(text.splitlines()[-lines:])

    def task_host(self, report: dict) -> str:
        if self.linked is not None:  # each task at its own address, behind its own shaped link
            return self.linked.addresses[report["task"]]
        return self.options.host

    def close(self) -> None:
        if self.ipp is not None:
            pids = self._launcher_pids(children=True)
            if self.client is not None:
                self.client.close()
                self.client = None
            try:  # engines first: an engine whose controller vanished first exits with an error
                self._stop_engines()
                self.ipp.stop_controller_sync()
            finally:
                reap(pids)
                self.ipp = None
        if self.zygote is not None:
            self.zygote.stop()
            self.zygote = None
        if self.network is not None:
            self.network.stop()
            self.network = None
        if self.linked is not None:
            self.linked.stop()
            self.linked = None
        if self.profile_dir is not None:
            workdir.remove(Path(self.profile_dir))
            self.profile_dir = None

    # ----- the processes ----------------------------------------------------------------------
    def _start_controller(self) -> None:
        workdir.sweep()  # the folders of clusters whose kernel was killed
        self.profile_dir = str(workdir.create(os.getpid()))
        sockets = os.path.join(self.profile_dir, "sockets")
        os.mkdir(sockets, 0o700)
        self.ipp = ipp.Cluster(
            n=0,
            profile_dir=self.profile_dir,
            cluster_id=f"kit-{uuid.uuid4().hex[:8]}",
            # unix sockets, no TCP port: they reach engines in the private network (kit.core._controller)
            controller_args=["--IPController.use_threads=True", f"--HeartMonitor.period={HEARTBEAT_MS}",
                             f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
                             "--IPController.transport=ipc", f"--IPController.ip={sockets}/c"],
            # ipyparallel warns, with the engine's whole log, about every engine that exits with a
            # signal; the kit kills engines on purpose (restart) and reports real failures itself
            log_level=logging.ERROR,
            # the engines start at once, beside the controller, and read its connection file when it is
            # there (IPEngine.wait_for_url_file) instead of being started only once it is: they import
            # TensorFlow meanwhile (docs/performance.md, change 17)
            send_engines_connection_env=False,
            # an engine whose environment names a zygote is forked by it (kit.core._zygote), others start as usual
            engine_launcher_class=_zygote.engine_set_launcher(),
        )
        self.ipp.start_controller_sync(
            controller_cmd=[sys.executable, "-m", "kit.core._boot", "kit.core._controller"],
            environment={_lifeline.LIFELINE_VAR: _lifeline.token(os.getpid())},
        )

    def _private_network(self) -> dict[str, str]:
        """The engines' environment entry that puts them in the cluster's private network; {} where
        there is none (then :attr:`exposed_because` says why, and the cluster warns)."""
        if self.options.isolation == "none":
            self.exposed_because = "isolation='none' was asked for"
            return {}
        if self.network is None or not self.network.alive():
            try:
                self.network = _netns.PrivateNetwork.start(_lifeline.token(os.getpid()))
            except _netns.Unavailable as error:
                self.network = None
                if self.options.isolation == "required":
                    raise ClusterError(f"no private network for the tasks ({error}), and isolation="
                                       "'required' was asked for. Fix: run where network namespaces "
                                       "are allowed (Linux; root, or unprivileged user namespaces), "
                                       "or use isolation='auto' to start with a warning") from None
                self.exposed_because = f"no private network namespace could be made here ({error})"
                return {}
        self.exposed_because = ""
        return {_netns.NETNS_VAR: self.network.token}

    def _linked_network(self, names: list[str]) -> dict[str, dict[str, str]]:
        """Each task's environment entry that puts it in its own namespace behind a shaped link
        (:mod:`kit.core.links`), made on the first start and kept for restarts."""
        if self.linked is None or not self.linked.alive() or not set(names) <= set(self.linked.names):
            if self.linked is not None:
                self.linked.stop()
            why = links.available(self.options.link)
            if why:
                raise ClusterError(f"link={str(self.options.link)!r} cannot be emulated here: {why}",
                                   fix="run as root on Linux (with iproute2, and netem for a delay), or leave "
                                       "link=None")
            self.linked = links.LinkedNetwork(self.options.link, names, _lifeline.token(os.getpid()))
        self.exposed_because = ""
        return {name: {_netns.NETNS_VAR: self.linked.token(name)} for name in names}

    def _wait_for_reports(self, names: list[str]) -> dict[str, dict]:
        """Wait until every task's engine registered; return each one's report, by its KIT_TASK."""
        deadline = time.monotonic() + self.options.start_timeout
        new_ids = new_engine_ids(self.client, self.retired_ids)
        while len(new_ids) < len(names):
            exited = [n for n in names if not self.alive(n)]
            if exited:
                why = self.explain_exit()
                raise ClusterError(f"the engine of {', '.join(exited)} exited during start-up"
                                   f"{why and ': ' + why}{self.log_tail(exited[0])}", exited)
            if time.monotonic() > deadline:
                break
            wait_for_one_more_engine(self.client)  # then check processes and deadline
            new_ids = new_engine_ids(self.client, self.retired_ids)
        reports = {rep["task"]: rep for rep in engine_reports(self.client, new_ids)}
        missing = [n for n in names if n not in reports]
        if missing:
            raise ClusterError(f"{', '.join(missing)} did not come up within "
                               f"{self.options.start_timeout:g}s (start_timeout)"
                               f"{self.log_tail(missing[0])}", missing)
        return {name: reports[name] for name in names}

    def _launcher(self, name: str):
        engine_set = self.ipp.engines.get(engine_set_id(name)) if self.ipp else None
        return next(iter(engine_set.launchers.values()), None) if engine_set else None

    def _launchers(self, controller: bool = True) -> list:
        """The one walk over this cluster's launchers: the controller's (if asked) and every engine's."""
        if self.ipp is None:
            return []
        found = [self.ipp.controller] if controller and self.ipp.controller else []
        for engine_set in self.ipp.engines.values():
            found.extend(getattr(engine_set, "launchers", {}).values())
        return found

    def _launcher_pids(self, controller: bool = True, children: bool = False) -> list[int]:
        """The pids of the launchers' processes, with their children if asked."""
        pids = []
        for launcher in self._launchers(controller):
            proc = getattr(launcher, "process", None)
            if proc is None:
                continue
            try:
                pids.extend([proc.pid, *(c.pid for c in proc.children(recursive=True) if children)])
            except psutil.NoSuchProcess:
                continue  # already gone: nothing to stop
        return pids

    def _stop_engines(self) -> None:
        """Stop every engine set (SIGKILL: their state is thrown away) and retire their ids.

        SIGTERM is no use: a task blocked in a collective ignores it, and one that trained with
        MultiWorkerMirroredStrategy takes ipyparallel's full 5 s grace to exit (TensorFlow's gRPC server
        does not shut down)."""
        if self.ipp is None:
            return
        pids = self._launcher_pids(controller=False)
        if self.client is not None:
            self.retired_ids.update(self.client.ids)
        for launcher in self._launchers(controller=False):
            try:
                launcher.signal(signals.SIGKILL)
            except psutil.NoSuchProcess:
                continue  # already dead: typically the task whose failure led here
        for set_id in list(self.ipp.engines):
            self.ipp.stop_engines_sync(set_id)
        reap(pids)


def new_engine_ids(client: ipp.Client, retired: set[int]) -> list[int]:
    """The client's engine ids, less those of engines already replaced."""
    return [i for i in client.ids if i not in retired]


def wait_for_one_more_engine(client: ipp.Client, timeout: float = 0.5) -> None:
    """Wait at most ``timeout`` seconds for one more engine to register; the caller checks the rest.

    An engine that *unregisters* meanwhile makes ipyparallel raise EngineError: after a restart that is
    typically a killed engine of the old set, which the controller declares dead only when its
    heartbeats stop (seen: notebook 05's restart after a preemption failed on it). The caller's loop
    checks its own engines' processes and the deadline, so here it is logged and the wait goes on.
    """
    try:
        client.wait_for_engines(len(client.ids) + 1, timeout=timeout, interactive=False)
    except TimeoutError:
        pass  # none yet
    except ipp.error.EngineError as error:
        log.info("while waiting for engines: %s (the caller checks its own engines)", error)


def reap(pids: list[int], timeout: float = 10.0) -> None:
    """Wait for ``pids`` to exit; SIGKILL those still alive after ``timeout`` seconds (:func:`_lifeline.reap`)."""
    killed, left = _lifeline.reap(pids, grace=timeout, seconds=timeout)
    for pid in killed:
        log.warning("process %s did not stop in %ss; killed it", pid, timeout)
    if left:
        log.warning("processes %s still running %ss after SIGKILL", left, timeout)


def engine_reports(client: ipp.Client, engine_ids: list[int]) -> list[dict[str, Any]]:
    """Each engine's :func:`kit.core._remote.report`, with its id, asked of all at once (one round trip)."""
    found = on_each(client, {str(i): i for i in engine_ids}, _remote.report)
    return [{**found[str(i)], "engine_id": i} for i in engine_ids]
