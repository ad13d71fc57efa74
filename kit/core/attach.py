"""Engines from elsewhere: TFCluster(engines=...) groups a user's ipyparallel engines into TF tasks.

The engines may run on other hosts (SSH, Slurm, MPI launchers, or a running controller's engines).
:class:`ForeignEngines` finds or starts them and checks that they can run the kit (kit installed, one
TensorFlow version); the cluster then gives them their roles as it does local engines (a port picked on
each engine's own host, the task's environment set before TensorFlow starts, every task checked to
reach every other). At close it stops only what it started.
"""

from __future__ import annotations

import os
import signal as signals
import time

import ipyparallel as ipp
import psutil

from .engines import Engines, engine_report, new_engine_ids, wait_for_one_more_engine
from .errors import ClusterError, OptionError
from .options import ClusterOptions, engine_set_id

__all__ = ["ForeignEngines", "spread_over_hosts", "wait_for_one_more_engine"]


class ForeignEngines(Engines):
    """A user's engines (an ipyparallel.Cluster, Client or url file), grouped into one engine per task."""

    exposed_because = "engines from elsewhere reach each other over the network"
    exposed_fix = ("keep these hosts on a private network or VPN, admit only the peers' addresses to "
                   "these ports in each host's firewall, or use SSH tunnels with the ports closed")

    def __init__(self, options: ClusterOptions):
        self.options = options
        self.source = options.engines
        self.ipp: ipp.Cluster | None = None
        self.owned_sets: list[str] = []  # engine sets started through the user's ipyparallel.Cluster
        self.owned_controller = False
        self.retired_ids: set[int] = set()  # ids of engines already replaced: not ours any more

    def start(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        """Connect, start one engine set per task through the user's launcher if it has none running,
        and group the engines into tasks, spread over their hosts. The launch environment cannot be
        passed through every launcher (SSH, Slurm...): the cluster sets it on each engine instead."""
        if self.client is None:
            self._connect()
        if self.ipp is not None and not new_engine_ids(self.client, self.retired_ids) and \
                (self.owned_sets or self.ipp.engines == {}):
            self.owned_sets = []
            for name in names:  # the user's launcher (SSH, Slurm, MPI, ...) starts one set per task
                self.ipp.start_engines_sync(n=1, engine_set_id=engine_set_id(name))
                self.owned_sets.append(engine_set_id(name))
        deadline = time.monotonic() + self.options.start_timeout
        while len(new_engine_ids(self.client, self.retired_ids)) < len(names) and time.monotonic() < deadline:
            wait_for_one_more_engine(self.client)
        ids = sorted(new_engine_ids(self.client, self.retired_ids))
        if len(ids) < len(names):
            raise ClusterError(f"too few engines: {len(ids)} registered within "
                               f"{self.options.start_timeout:g}s, but the tasks {', '.join(names)} need "
                               f"{len(names)}. Fix: start more engines (e.g. ipcluster engines -n ...)",
                               names[len(ids):])
        reports = {}
        for engine_id in ids:
            try:
                reports[engine_id] = engine_report(self.client, engine_id)
            except ipp.error.RemoteError as error:
                raise ClusterError(f"engine {engine_id} cannot run the kit ({error.ename}: {error.evalue}). "
                                   "Fix: install the kit and its pinned packages on every engine host") from None
        versions = {r["tensorflow_version"] for r in reports.values()}
        if len(versions) > 1:
            detail = ", ".join(f"engine {i} on {r['hostname']}: {r['tensorflow_version']}" for i, r in reports.items())
            raise ClusterError(f"the engines have different TensorFlow versions ({detail}). Fix: install "
                               "the same tensorflow on every engine host (see pyproject.toml)")
        return {name: reports[engine_id] for name, engine_id in zip(names, spread_over_hosts(reports))}

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
        return True  # its process is on another host: the controller's heartbeats tell

    def task_host(self, report: dict) -> str:
        return report["address"]  # the address its engine reaches the controller from

    def close(self) -> None:
        """Stop what this cluster started (engine sets, controller), leave the user's engines alone."""
        if self.ipp is not None and self.owned_sets:
            self._stop_owned_sets()
        if self.ipp is not None and self.owned_controller:
            self.ipp.stop_controller_sync()
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

    def _stop_owned_sets(self) -> None:
        """SIGKILL the engines of the sets this cluster started (as local engines: their state is thrown
        away), then stop the sets through the user's launcher."""
        self.retired_ids.update(self.client.ids if self.client is not None else [])
        for set_id in self.owned_sets:
            for launcher in getattr(self.ipp.engines.get(set_id), "launchers", {}).values():
                try:
                    launcher.signal(signals.SIGKILL)
                except psutil.NoSuchProcess:
                    continue  # already dead: typically the task whose failure led here
            self.ipp.stop_engines_sync(set_id)


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
