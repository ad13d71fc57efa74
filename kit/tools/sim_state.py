"""What an emulated cluster (:mod:`kit.tools.sim_cluster`) made, and how it is all removed again.

:class:`State` records every namespace, link, daemon and folder as it is made (``state.json`` in the
cluster's folder), so that :func:`teardown` removes exactly that, from this process or from another one
(``kit sim-cluster down --dir DIR``): the jobs, every process left in the namespaces, the namespaces, links,
bridge, /etc/netns entries and the folder. Every wait is bounded and names what it waited for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core._lifeline import reap, runs
from ..core.errors import KitError

#: Bounds of the waits (measured here: the whole cluster up in 0.6-1.5 s, down in about 1 s).
DAEMON_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
NETNS_ETC = "/etc/netns"
#: What every name of an emulated cluster (bridge, links, host namespaces) starts with.
PREFIX = "ksim"


class SimClusterError(KitError):
    """The emulated cluster could not be made or stopped; the message names the step and the fix."""

    fix = "read the message; `kit sim-cluster down --dir DIR` removes what a failed start left"


@dataclass
class Host:
    name: str        #: its hostname, and its Slurm node name
    address: str     #: its address on the bridge
    namespace: str   #: the network namespace it lives in


@dataclass
class State:
    """What :meth:`SimCluster.up` made, so that :meth:`SimCluster.down` (or another process) removes it."""
    root: str
    bridge: str
    controller_ip: str
    hosts: list[Host] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)   #: daemon name → pid (e.g. "slurmd h1")
    slurmctld_port: int = 0

    def save(self) -> None:
        path = Path(self.root) / "state.json"
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, root: str | os.PathLike) -> "State":
        path = Path(root) / "state.json"
        if not path.is_file():
            raise SimClusterError(f"{path} does not exist: {root} is not an emulated cluster's folder",
                                  fix="give the --dir that `kit sim-cluster up` printed")
        data = json.loads(path.read_text())
        data["hosts"] = [Host(**h) for h in data["hosts"]]
        return cls(**data)


def run_command(*args: str, what: str, timeout: float = DAEMON_TIMEOUT_S, env: dict | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise SimClusterError(f"{what}: `{' '.join(args)}` did not finish within {timeout:.0f} s") from e
    if check and result.returncode != 0:
        raise SimClusterError(f"{what}: `{' '.join(args)}` exited with {result.returncode}: "
                              f"{(result.stderr or result.stdout).strip()[-500:]}")
    return result


def wait_for(condition, timeout: float, what: str, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not condition():
        if time.monotonic() > deadline:
            raise SimClusterError(f"waited {timeout:.0f} s for {what}{detail()}")
        time.sleep(delay)   # polling a daemon's state: there is nothing to block on
        delay = min(delay * 1.5, 0.5)


def emulated_namespaces() -> list[str]:
    """The network namespaces of emulated clusters on this machine (``ip netns`` keeps each as a file under
    /run/netns), not the others that come and go meanwhile (the kit's private networks, test hosts)."""
    folder = Path("/run/netns")
    return sorted(n for n in os.listdir(folder) if n.startswith(PREFIX)) if folder.is_dir() else []


def namespace_pids(namespace: str) -> list[int]:
    result = run_command("ip", "netns", "pids", namespace, what=f"list the processes of {namespace}", check=False)
    return [int(p) for p in result.stdout.split()]


def teardown(state: State) -> None:
    """Remove what ``state`` records: jobs, daemons, every process in the namespaces, links, folder."""
    errors = []
    if Path(state.root, "slurm", "slurm.conf").is_file() and "slurmctld" in state.pids \
            and runs(state.pids["slurmctld"]):
        env = {**os.environ, "SLURM_CONF": str(Path(state.root, "slurm", "slurm.conf"))}
        result = run_command("scancel", "--full", "--quiet", "--user", "root", what="cancel the jobs", env=env,
                      check=False, timeout=STOP_TIMEOUT_S)
        if result.returncode != 0 and result.stderr.strip():
            errors.append(f"scancel: {result.stderr.strip()}")
    victims = set(state.pids.values())
    for host in state.hosts:
        victims.update(namespace_pids(host.namespace))
    for pid in victims:  # a job's whole process group at once
        if _is_group_leader(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # ended meanwhile
    for host in state.hosts:   # a job's processes started after the list was taken
        victims.update(namespace_pids(host.namespace))
    _, left = reap(victims, seconds=STOP_TIMEOUT_S)
    if left:
        errors.append(f"waited {STOP_TIMEOUT_S:.0f} s for the cluster's processes to end; still there: {left}")
    for host in state.hosts:
        result = run_command("ip", "netns", "delete", host.namespace, what=f"delete {host.namespace}", check=False)
        if result.returncode != 0 and "No such file" not in result.stderr:
            errors.append(result.stderr.strip())
    for host in state.hosts:
        if Path(NETNS_ETC, host.namespace).exists():
            shutil.rmtree(Path(NETNS_ETC, host.namespace))
    for link in state.links:
        result = run_command("ip", "link", "delete", link, what=f"delete {link}", check=False)
        if result.returncode != 0 and "Cannot find device" not in result.stderr:
            errors.append(result.stderr.strip())
    if Path(state.root).exists():
        shutil.rmtree(state.root)
    if errors:
        raise SimClusterError("the emulated cluster was not removed cleanly: " + "; ".join(errors),
                              fix="run `kit sim-cluster down --dir DIR` again, or remove what is named by hand")


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False
