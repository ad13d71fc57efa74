"""Engines from elsewhere: TFCluster(engines=...) groups a user's ipyparallel engines into TF tasks.

The engines may run on other hosts (SSH, Slurm, MPI launchers, or a running controller's engines).
:class:`ForeignEngines` finds or starts them and checks that they can run the kit (kit installed, one
TensorFlow version); the cluster then gives them their roles as it does local engines (a port picked on
each engine's own host, the task's environment set before TensorFlow starts, every task checked to
reach every other). At close it stops only what it started.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal as signals
import subprocess
import sys
import time

import ipyparallel as ipp
import psutil
from ipyparallel.cluster.launcher import (BatchSystemLauncher, LocalControllerLauncher, LocalEngineSetLauncher,
                                         SlurmLauncher, SSHEngineSetLauncher, SSHLauncher, find_launcher_class)

from . import _lifeline, _remote, slurm
from .engines import Engines, engine_reports, new_engine_ids, wait_for_one_more_engine
from .errors import ClusterError, OptionError
from .files import write_atomic
from .options import ClusterOptions, engine_set_id

log = logging.getLogger(__name__)
#: Slurm job states in which an engine's job still runs (``squeue -o %T``).
RUNNING_JOB_STATES = {"RUNNING", "CONFIGURING", "SUSPENDED"}
#: The engine set the kit starts for all tasks at once through a launcher that spreads engines over hosts (SSH).
ONE_SET = "kit-tasks"
#: How long the engines may take to remove their temporary folders before they are stopped.
TMPDIR_TIMEOUT_S = 10.0
#: How long an SSH engine may take to end after its SIGKILL, as seen over ssh (one round trip when it has).
SSH_END_TIMEOUT_S = 10.0
#: How often a run asks Slurm for its jobs' states, at most (one ``squeue`` for all of them).
JOB_STATE_PERIOD_S = 2.0
#: The controller's last commands, in the profile folder (kit.core._lifeline: a killed kernel's jobs end at once).
LAST_WORDS_FILE = "kit-last-words.json"

__all__ = ["ForeignEngines", "spread_over_hosts", "wait_for_one_more_engine"]


class ForeignEngines(Engines):
    """A user's engines (an ipyparallel.Cluster, Client or url file), grouped into one engine per task."""

    exposed_because = "engines from elsewhere reach each other over the network"
    exposed_fix = ("keep these hosts on a private network or VPN, admit only the peers' addresses to "
                   "these ports in each host's firewall (kit.tools.firewall.nft_rules(cluster.tasks) writes the "
                   "rules), or use SSH tunnels with the ports closed")

    def __init__(self, options: ClusterOptions):
        self.options = options
        self.source = options.engines
        self.ipp: ipp.Cluster | None = None
        self.owned_sets: list[str] = []  # engine sets started through the user's ipyparallel.Cluster
        self.owned_controller = False
        self.retired_ids: set[int] = set()  # ids of engines already replaced: not ours any more
        self.engine_ids: dict[str, int] = {}  # task → its engine's id, since the last start
        self._states: dict[str, str] = {}     # Slurm job id → state, as squeue last said
        self._states_at = float("-inf")
        self.last_words: str | None = None     # the controller's last commands, if it has a lifeline
        self.ssh_tmpdirs: list[tuple[SSHLauncher, str]] = []  # each SSH engine's launcher and its own TMPDIR
        self.job_engines: list[slurm.JobEngine] = []  # each Slurm engine's job, node, pid and own TMPDIR

    def start(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        """Connect, start one engine set per task through the user's launcher if it has none running,
        and group the engines into tasks, spread over their hosts. The launch environment cannot be
        passed through every launcher (SSH, Slurm...): the cluster sets it on each engine instead."""
        if self.client is None:
            self._connect()
        if self.ipp is not None and not new_engine_ids(self.client, self.retired_ids) and \
                (self.owned_sets or self.ipp.engines == {}):
            self.owned_sets = []
            if self._one_set_per_task():  # one batch job (or local set) per task: a whole node each
                for name in names:
                    self.ipp.start_engines_sync(n=1, engine_set_id=engine_set_id(name))
                    self.owned_sets.append(engine_set_id(name))
            else:  # SSH, MPI: one set of len(names) engines spreads them over the hosts the launcher lists
                self.ipp.start_engines_sync(n=len(names), engine_set_id=ONE_SET)
                self.owned_sets.append(ONE_SET)
            self._record_last_words()
        deadline = time.monotonic() + self.options.start_timeout
        while len(new_engine_ids(self.client, self.retired_ids)) < len(names) and time.monotonic() < deadline:
            wait_for_one_more_engine(self.client)
        ids = sorted(new_engine_ids(self.client, self.retired_ids))
        if len(ids) < len(names):
            queued = self._queued_jobs()
            fix = ("raise start_timeout to cover the time the jobs wait in the queue, or ask for less "
                   "(fewer workers, a shorter --time, another partition)") if queued else \
                "start more engines (e.g. ipcluster engines -n ...)"
            raise ClusterError(f"too few engines: {len(ids)} registered within "
                               f"{self.options.start_timeout:g}s, but the tasks {', '.join(names)} need "
                               f"{len(names)}{queued}. Fix: {fix}", names[len(ids):])
        reports = {}
        for engine_id in ids:
            try:
                (reports[engine_id],) = engine_reports(self.client, [engine_id])
            except ipp.error.RemoteError as error:
                raise ClusterError(f"engine {engine_id} cannot run the kit ({error.ename}: {error.evalue}). "
                                   "Fix: install the kit and its pinned packages on every engine host") from None
        versions = {r["tensorflow_version"] for r in reports.values()}
        if len(versions) > 1:
            detail = ", ".join(f"engine {i} on {r['hostname']}: {r['tensorflow_version']}" for i, r in reports.items())
            raise ClusterError(f"the engines have different TensorFlow versions ({detail}). Fix: install "
                               "the same tensorflow on every engine host (see pyproject.toml)")
        chosen = assign_tasks(names, reports, {name: self._job_ids().get(engine_set_id(name)) for name in names})
        self.engine_ids = chosen
        given = self.client[list(chosen.values())].apply_async(_remote.own_tmpdir)  # what a SIGKILL leaves goes too
        if not given.wait(TMPDIR_TIMEOUT_S):
            raise ClusterError(f"the engines {', '.join(chosen)} did not make their temporary folders within "
                               f"{TMPDIR_TIMEOUT_S:g}s", fix="check the engines' hosts (a full /tmp, a hung "
                               "file system) and start again", tasks=list(chosen))
        folders = dict(zip(chosen.values(), given.get()))
        pids = {reports[engine_id]["pid"]: folder for engine_id, folder in folders.items()}
        self.ssh_tmpdirs = [(launcher, pids[launcher.pid]) for set_id in self.owned_sets
                            for launcher in self._set_launchers(set_id)
                            if isinstance(launcher, SSHLauncher) and launcher.pid in pids]
        in_jobs = {i: r for i, r in reports.items() if i in folders and r.get("slurm_job_id")}
        self.job_engines = [slurm.JobEngine(r["slurm_job_id"], r.get("slurm_node") or r["hostname"], r["pid"],
                                            folders[i]) for i, r in in_jobs.items()]
        self._record_last_words()  # now with the SSH engines' folders
        self._states_at = float("-inf")
        return {name: reports[engine_id] for name, engine_id in chosen.items()}

    def replace(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        if not self.owned_sets:
            raise ClusterError("these engines were started outside the kit, so it cannot give you fresh ones",
                               fix="restart them with your launcher, then create a new TFCluster")
        self._stop_owned_sets()
        return self.start(names, environments)

    def signal(self, name: str, engine_id: int, sig: int) -> None:
        # an engine started elsewhere: ipyparallel's nanny on its host delivers the signal
        self.client.send_signal(int(sig), targets=[engine_id], block=True)

    def alive(self, name: str) -> bool:
        """Whether task ``name``'s engine still runs, as far as can be seen from here: it is still
        registered with the controller (its nanny reports its death at once; a lost host, after the
        heartbeats stop), and, for a Slurm job, the job still runs (``scancel`` or a node failure ends the
        nanny too, and the heartbeats take ~30 s to tell)."""
        engine_id = self.engine_ids.get(name)
        if engine_id is not None and self.client is not None and engine_id not in self.client.ids:
            return False
        job = self._job_ids().get(engine_set_id(name))
        if job is None:
            return True
        return self._slurm_states().get(job) in RUNNING_JOB_STATES

    def task_host(self, report: dict) -> str:
        return report["address"]  # the address its engine reaches the controller from

    def close(self) -> None:
        """Stop what this cluster started (engine sets, controller), leave the user's engines alone."""
        if self.ipp is not None and self.owned_sets:
            self._stop_owned_sets()
        if self.ipp is not None and self.owned_controller:
            self.ipp.stop_controller_sync()
        if self.last_words is not None and os.path.exists(self.last_words):
            os.remove(self.last_words)  # the user's profile folder keeps nothing of this cluster
        self.last_words = None
        if self.client is not None and not isinstance(self.source, ipp.Client):
            self.client.close()
        self.client = None
        self.ipp = None
        self.owned_sets = []
        self.owned_controller = False

    def _connect(self) -> None:
        """Get a client for the source; start its controller if it is an ipyparallel.Cluster without one."""
        source = self.source
        if isinstance(source, ipp.Client):
            self.client = source
            return
        if isinstance(source, ipp.Cluster):
            self.ipp = source
            if source.controller is None:
                launcher = source.controller_launcher_class
                if launcher in ("local", LocalControllerLauncher) or launcher is None:
                    # tied to this process by a lifeline (kit.core._lifeline), as a local cluster's: a killed
                    # kernel takes the controller with it, whose last words end this cluster's Slurm jobs and
                    # SSH engines at once (_record_last_words keeps them current); should they fail, the
                    # engines exit after IPEngine.max_heartbeat_misses
                    self.last_words = os.path.join(source.profile_dir, LAST_WORDS_FILE)
                    source.start_controller_sync(
                        controller_cmd=[sys.executable, "-m", "kit.core._boot", "ipyparallel.controller"],
                        environment={_lifeline.LIFELINE_VAR: _lifeline.token(os.getpid()),
                                     _lifeline.LAST_WORDS_VAR: self.last_words})
                else:  # a controller in a batch job, say: its host cannot see this process
                    source.start_controller_sync()
                self.owned_controller = True
            self.client = source.connect_client_sync()
            return
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise OptionError("engines", f"{path} is not a file",
                              "give the path of the controller's ipcontroller-client.json "
                              "(in the profile's security/ folder)")
        self.client = ipp.Client(url_file=path)

    def _one_set_per_task(self) -> bool:
        """Whether the user's engine launcher starts one engine per set where the kit asks for one: a batch
        system's (a job per set) or the local one. An SSH launcher given n=1 starts it on the first host it
        lists, every time; MPI's starts one mpiexec per set."""
        launcher = self.ipp.engine_launcher_class
        if isinstance(launcher, str):
            launcher = find_launcher_class(launcher, "engine")
        if issubclass(launcher, SSHEngineSetLauncher):   # a LocalEngineSetLauncher too
            return False
        return issubclass(launcher, (BatchSystemLauncher, LocalEngineSetLauncher))

    def _job_ids(self) -> dict[str, str]:
        """Engine set → its Slurm job id, for the sets this cluster submitted as Slurm jobs."""
        if self.ipp is None:
            return {}
        launchers = {set_id: self.ipp.engines.get(set_id) for set_id in self.owned_sets}
        return {set_id: launcher.job_id for set_id, launcher in launchers.items()
                if isinstance(launcher, SlurmLauncher) and getattr(launcher, "job_id", "")}

    def _slurm_states(self) -> dict[str, str]:
        """Job id → Slurm state (RUNNING, PENDING, COMPLETING, ...) of this cluster's jobs; asked at most every
        :data:`JOB_STATE_PERIOD_S` (a run checks its tasks every 0.2 s); a job squeue no longer shows is absent."""
        now = time.monotonic()
        if now - self._states_at >= JOB_STATE_PERIOD_S:
            shown = slurm.squeue(list(self._job_ids().values()))
            if shown is None:
                return self._states   # squeue failed: keep the last known states
            self._states = {job: state for job, (state, _) in shown.items()}
            self._states_at = now
        return self._states

    def _record_last_words(self) -> None:
        """Keep the controller's last commands (:mod:`kit.core._lifeline`) to this cluster's current engines: if
        the kernel dies, ``scancel`` of its Slurm jobs and ``ssh HOST kill -9 PID`` of its SSH engines end them
        at once, not after the engines miss their heartbeats (22.5 s measured, docs/performance.md change 20).
        An SSH engine's own TMPDIR, once known, goes in the same command after its process has ended (GNU
        ``tail --pid`` waits for it, bounded): no later engine on that host may come to sweep it."""
        if self.last_words is None:
            return
        jobs = list(self._job_ids().values())
        commands = [["scancel", *jobs]] if jobs else []
        folders = {id(launcher): folder for launcher, folder in self.ssh_tmpdirs}
        for set_id in self.owned_sets:
            for launcher in self._set_launchers(set_id):
                if isinstance(launcher, SSHLauncher) and launcher.pid:
                    pid, folder = int(launcher.pid), folders.get(id(launcher))
                    removal = (f"; timeout 5 tail --pid={pid} -f /dev/null; "  # within the lifeline's 10 s
                               f"rm -rf -- {shlex.quote(folder)}") if folder else ""
                    commands.append([*launcher.ssh_cmd, *launcher.ssh_args, launcher.location,
                                     f"kill -9 {pid}{removal}"])
        write_atomic(self.last_words, json.dumps(commands))

    def _remove_tmpdirs(self) -> None:
        """Ask the live, idle engines of this cluster to remove their own TMPDIR before they are killed (one
        bounded round). A busy SSH engine's folder goes over ssh after its SIGKILL
        (:func:`_remove_ended_engines_tmpdirs`); a Slurm engine's, busy or gone, in an ``srun`` step
        (:func:`kit.core.slurm.end_engines_and_remove_folders`)."""
        # a task known lost (its Slurm job ended) is skipped: its engine may still look registered, and the
        # round would wait out its bound for it (10 s after a plain scancel in tests/test_slurm_ssh.py)
        if self.client is None:
            return
        live = [i for name, i in self.engine_ids.items() if i in self.client.ids and self.alive(name)]
        if live:  # only idle ones: a survivor of a lost task may hang in a collective (it waited out the bound);
            # asked of all, as the controller knows them: a target gone meanwhile would raise
            status = self.client.queue_status()
            live = [i for i in live if i in status and not status[i].get("queue") and not status[i].get("tasks")]
        if not live:
            return
        started, pending = time.monotonic(), {}
        for i in live:
            try:
                pending[i] = self.client[i].apply_async(_remote.remove_own_tmpdir)
            except IndexError:  # unregistered since the check (a killed engine's missed heartbeats): its folder
                # goes with its job's step or its host's SIGKILL round, as a busy one's
                log.info("engine %s left before the removal of its temporary folder", i)
        late = [i for i, result in pending.items()
                if not result.wait(max(0.0, started + TMPDIR_TIMEOUT_S - time.monotonic()))]
        if late:
            log.warning("engines %s did not remove their temporary folders within %s s", late, TMPDIR_TIMEOUT_S)

    def _queued_jobs(self) -> str:
        """The Slurm jobs of the engine sets this cluster submitted, with each one's state and Slurm's reason
        (``squeue``), for the error of a start that timed out; "" when no set is a Slurm job."""
        jobs = self._job_ids()
        if not jobs:
            return ""
        shown = slurm.squeue(list(jobs.values())) or {}
        states = {job: f"{state}, reason: {reason}" if reason and reason != "None" else state
                  for job, (state, reason) in shown.items()}
        described = [f"{set_id} job {job} ({states.get(job, 'no longer in the queue')})" for set_id, job in jobs.items()]
        return f"; the engine jobs: {', '.join(described)}"

    def _stop_owned_sets(self) -> None:
        """SIGKILL the engines of the sets this cluster started (as local engines: their state is thrown
        away), then stop the sets through the user's launcher."""
        self.retired_ids.update(self.client.ids if self.client is not None else [])
        self._remove_tmpdirs()
        if self.job_engines:  # busy ones too: in a step of their job, the folder first, then the engine
            slurm.end_engines_and_remove_folders(
                self.job_engines, {job for job, state in self._slurm_states().items() if state in RUNNING_JOB_STATES})
            self.job_engines = []
        for set_id in self.owned_sets:
            for launcher in self._set_launchers(set_id):
                try:
                    launcher.signal(signals.SIGKILL)
                except psutil.NoSuchProcess:
                    continue  # already dead: typically the task whose failure led here
                except subprocess.CalledProcessError as error:  # the SSH launcher's remote kill found no process
                    log.info("SIGKILL to engine %s on its host failed (already gone?): %s", launcher, error)
            _until_ssh_engines_ended(self._set_launchers(set_id))
            self.ipp.stop_engines_sync(set_id)
        _remove_ended_engines_tmpdirs(self.ssh_tmpdirs)
        self.ssh_tmpdirs = []

    def _set_launchers(self, set_id: str) -> list:
        """The launchers of engine set ``set_id`` now (a copy: a set drops a launcher once told it stopped)."""
        return list(getattr(self.ipp.engines.get(set_id), "launchers", {}).values())


def _until_ssh_engines_ended(launchers) -> None:
    """Wait (bounded, one ``ssh`` each) until each SSH launcher's engine has ended, and tell the launcher, whose own
    wait thread reports it only when ipyparallel's event loop next runs: its ``stop`` then signals nothing. Signalled
    again, a process that is gone makes ipyparallel's remote helper print a ProcessLookupError traceback into the
    notebook's cell (seen in 4 of 7 runs of notebook 11)."""
    for launcher in list(launchers):  # the set drops a launcher from its dict when told it stopped
        if not isinstance(launcher, SSHLauncher) or launcher.state != "running":
            continue
        try:
            code = launcher.wait_one(timeout=SSH_END_TIMEOUT_S)
        except (TimeoutError, RuntimeError, subprocess.CalledProcessError) as error:
            log.info("SSH engine %s not seen ending after SIGKILL: %s", launcher.pid, error)
            continue
        launcher.notify_stop({"exit_code": code, "pid": launcher.pid, "identifier": launcher.identifier})


def _remove_ended_engines_tmpdirs(folders: list[tuple[SSHLauncher, str]]) -> None:
    """After the SIGKILLs: remove each SSH engine's own TMPDIR on its host if its process is gone, one bounded
    ``ssh`` per host. The round before the kill asks only idle engines, and a later engine on the host sweeps
    the folders of dead ones only if one starts there: a survivor SIGKILLed in a collective at a restart kept
    its folder in 1 of 5 runs of the slow tests beside a busy loop (tests/test_slurm_ssh.py)."""
    by_host: dict[tuple, list[str]] = {}
    for launcher, folder in folders:
        # kill -0 fails once the process is gone (a zombie still counts as there, and keeps its folder); a
        # removal that fails marks the whole command failed (rm names the folder), not only the last one
        by_host.setdefault((*launcher.ssh_cmd, *launcher.ssh_args, launcher.location), []).append(
            f"kill -0 {int(launcher.pid)} 2>/dev/null || rm -rf -- {shlex.quote(folder)} || failed=1")
    for argv, removals in by_host.items():
        try:
            done = subprocess.run([*argv, "; ".join(["failed=0", *removals, "exit $failed"])], capture_output=True,
                                  text=True, timeout=SSH_END_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("ssh to %s did not remove the engines' temporary folders within %s s",
                        argv[-1], SSH_END_TIMEOUT_S)
            continue
        if done.returncode:
            log.warning("ssh to %s could not remove the engines' temporary folders (exit %s): %s",
                        argv[-1], done.returncode, done.stderr.strip())


def assign_tasks(names: list[str], reports: dict[int, dict], jobs: dict[str, str | None]) -> dict[str, int]:
    """Task → engine id. A task whose engine set is a Slurm job (``jobs``: task → job id, None if not) gets the
    engine that runs in that job (the job id its report gives), since the job's state says whether the task
    lives (:meth:`ForeignEngines.alive`): given by registration order instead, a task's engine sat in the other
    task's job in some runs, and a ``scancel`` of one task's job was taken for the loss of the other. Otherwise the
    engines are spread over the hosts (:func:`spread_over_hosts`)."""
    in_job = {report.get("slurm_job_id"): engine_id for engine_id, report in reports.items()
              if report.get("slurm_job_id")}
    if names and all(jobs.get(name) in in_job for name in names):
        return {name: in_job[jobs[name]] for name in names}
    return dict(zip(names, spread_over_hosts(reports)))


def spread_over_hosts(reports: dict[int, dict]) -> list[int]:
    """Engine ids ordered to spread tasks over hosts: first engine of each host, then second, ...

    A host is known by the address its engines use to reach the controller (containers and
    network namespaces may share a hostname).
    """
    by_host: dict[tuple[str, str], list[int]] = {}
    for engine_id in sorted(reports):
        key = (reports[engine_id]["hostname"], reports[engine_id]["address"])
        by_host.setdefault(key, []).append(engine_id)
    order = []
    while any(by_host.values()):
        for ids in by_host.values():
            if ids:
                order.append(ids.pop(0))
    return order
