"""Engines from elsewhere: TFCluster(engines=...) groups a user's ipyparallel engines into TF tasks.

The engines may run on other hosts (SSH, Slurm, MPI launchers, or a running controller's engines).
The cluster checks them (kit installed, one TensorFlow version, TensorFlow not yet imported), picks a
port on each engine's own host, sets each task's environment, and checks that every task can reach
every other before TensorFlow starts. At stop it stops only what it started.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ipyparallel as ipp

from . import _remote
from .errors import ClusterError, OptionError
from .options import KERAS_CHOICES, engine_set_id


class ForeignEngines:
    """The attach path of :class:`kit.core.cluster.TFCluster` (a mixin: it uses the cluster's state)."""

    def _connect(self, source: Any) -> None:
        """Get a client for ``source``; start its controller if it is an ipyparallel.Cluster without one."""
        if isinstance(source, ipp.Client):
            self._client = source
            return
        if isinstance(source, ipp.Cluster):
            self._ipp = source
            if source.controller is None:
                source.start_controller_sync()
                self._owned_controller = True
            self._client = source.connect_client_sync()
            return
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise OptionError("engines", f"{path} is not a file",
                              "give the path of the controller's ipcontroller-client.json "
                              "(in the profile's security/ folder)")
        self._client = ipp.Client(url_file=path)

    def _attach_engines(self) -> None:
        """Group the engines into TF tasks: check them, pick ports on their hosts, set TF_CONFIG."""
        self._lost = []
        self._needs_restart = ""
        self._tasks.clear()
        names = self.task_names
        if self._ipp is not None and not self._new_engine_ids() and (self._owned_sets or
                                                                      self._ipp.engines == {}):
            self._owned_sets = []
            for name in names:  # the user's launcher (SSH, Slurm, MPI, ...) starts one set per task
                self._ipp.start_engines_sync(n=1, engine_set_id=engine_set_id(name))
                self._owned_sets.append(engine_set_id(name))
        deadline = time.monotonic() + self.options.start_timeout
        while len(self._new_engine_ids()) < len(names) and time.monotonic() < deadline:
            wait_for_one_more_engine(self._client, self.log)
        ids = sorted(self._new_engine_ids())
        if len(ids) < len(names):
            raise ClusterError(f"too few engines: {len(ids)} registered within "
                               f"{self.options.start_timeout:g}s, but the tasks {', '.join(names)} need "
                               f"{len(names)}. Fix: start more engines (e.g. ipcluster engines -n ...)",
                               names[len(ids):])
        reports = {}
        for engine_id in ids:
            try:
                reports[engine_id] = {**self._client[engine_id].apply_sync(_remote.report),
                                      "engine_id": engine_id}
            except ipp.error.RemoteError as error:
                raise ClusterError(f"engine {engine_id} cannot run the kit ({error.ename}: {error.evalue}). "
                                   "Fix: install the kit and its pinned packages on every engine host") from None
        versions = {r["tensorflow_version"] for r in reports.values()}
        if len(versions) > 1:
            detail = ", ".join(f"engine {i} on {r['hostname']}: {r['tensorflow_version']}" for i, r in reports.items())
            raise ClusterError(f"the engines have different TensorFlow versions ({detail}). Fix: install "
                               "the same tensorflow on every engine host (see pyproject.toml)")
        used = [i for i, r in reports.items() if r["tensorflow_imported"]]
        if used:
            raise ClusterError(f"engines {used} have imported TensorFlow already, so a new TF_CONFIG "
                               "cannot take effect. Fix: restart those engines")
        assignment = dict(zip(names, spread_over_hosts(reports)))
        ports = {n: self._client[e].apply_sync(_remote.free_port) for n, e in assignment.items()}
        hosts = {n: reports[e]["address"] for n, e in assignment.items()}
        self._tf_configs = self._build_configs(names, ports, hosts)
        per_host = {h: list(hosts.values()).count(h) for h in hosts.values()}
        for name, engine_id in assignment.items():
            env = self._task_environment(name, reports[engine_id]["cores"], per_host[hosts[name]])
            self._client[engine_id].apply_sync(_remote.set_environment, env)
        self._check_reachability(assignment)
        self._client[list(assignment.values())].use_cloudpickle()
        for name, engine_id in assignment.items():
            self._record_task(name, {**reports[engine_id], "legacy_keras": KERAS_CHOICES[self.options.keras]})

    def _check_reachability(self, assignment: dict[str, int]) -> None:
        """Every training task opens its port; every task connects to every other's address."""
        training = {n: e for n, e in assignment.items() if not n.startswith("evaluator")}
        addresses = {}
        for name in training:
            task = self._tf_configs[name]["task"]
            addresses[name] = self._tf_configs[name]["cluster"][task["type"]][task["index"]]
        views = self._client[list(training.values())]
        for name, engine_id in training.items():
            port = int(addresses[name].rpartition(":")[2])
            self._client[engine_id].apply_sync(_remote.open_probe, port)
        try:
            problems = []
            for name, engine_id in assignment.items():
                others = {n: a for n, a in addresses.items() if n != name}
                for target, reason in self._client[engine_id].apply_sync(_remote.probe, others).items():
                    problems.append((name, target, reason))
        finally:
            views.apply_sync(_remote.close_probe)
        if problems:
            lines = "; ".join(f"{src} cannot reach {dst} at {why}" for src, dst, why in problems)
            raise ClusterError(f"{lines}. Fix: let the engines' hosts reach each other on these "
                               "addresses (routes, firewall), or start the engines on hosts that can",
                               sorted({p[0] for p in problems}))

    def _detach(self) -> None:
        """Stop what this cluster started (engine sets, controller), leave the user's engines alone."""
        if self._ipp is not None and self._owned_sets:
            self._stop_engines()
        if self._ipp is not None and self._owned_controller:
            self._ipp.stop_controller_sync()
        if self._client is not None and not isinstance(self.options.engines, ipp.Client):
            self._client.close()
        self._client = None
        self._ipp = None
        self._owned_sets = []
        self._owned_controller = False
        self._tasks.clear()


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


def wait_for_one_more_engine(client: ipp.Client, log: Any, timeout: float = 0.5) -> None:
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
