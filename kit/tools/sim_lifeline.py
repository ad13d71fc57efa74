"""An emulated cluster goes when the process that made it goes: the lifeline of notebook 11's hosts.

A notebook kernel that is killed runs no ``atexit`` handler, and one that is shut down may not get to run them
all: papermill (nbclient) and the Jupyter server wait 5 s for a kernel to exit, then kill it. Stopping a cluster
on the SSH hosts at exit took about 5 s here, so a failed run of notebook 11 left its hosts up (the daemons,
the namespaces, the bridge) until ``kit sim-cluster down``. :func:`tie` starts a small watcher process, in a
session of its own (a killed kernel's process group does not take it along): it polls the owner, and when the
owner has exited it removes the cluster, as ``kit sim-cluster down --dir ROOT`` would; once the cluster is
down by other means (``sim.down()``: its ``state.json`` gone) it exits by itself.

    sim = SimCluster(hosts=2).up()
    sim_lifeline.tie(sim.root)      # this process's end, even a SIGKILL, takes the hosts down
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ..core._lifeline import runs
from .sim_state import SimClusterError, State, teardown

#: How often the watcher looks at its owner (a process cannot wait for one that is not its child).
POLL_SECONDS = 0.5


def tie(root: str | os.PathLike, owner: int | None = None) -> subprocess.Popen:
    """Start the watcher of the emulated cluster in ``root`` (``sim.root``): it removes the cluster once
    ``owner`` (a pid; default: this process) has exited. Its messages go to this process's stderr."""
    state = Path(root) / "state.json"
    if not state.is_file():
        raise SimClusterError(f"{state} does not exist: {root} is not an emulated cluster that is up",
                              fix="pass sim.root of a SimCluster after up()")
    owner = os.getpid() if owner is None else owner
    started = psutil.Process(owner).create_time()
    return subprocess.Popen([sys.executable, "-m", "kit.tools.sim_lifeline", str(owner), repr(started), str(root)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)


def watch(owner: str, started: str, root: str | os.PathLike) -> int:
    """The watcher's loop (``python -m kit.tools.sim_lifeline PID CREATE_TIME ROOT``): 0 when the cluster is
    gone, by its owner's ``down()`` or by this watcher's teardown after the owner exited."""
    pid = int(owner)
    try:  # the owner at tie(), unless its pid was recycled since: a clock step meanwhile moves create_time by 1 s
        process = psutil.Process(pid)
        process = process if abs(process.create_time() - float(started)) <= 1 else None
    except psutil.NoSuchProcess:
        process = None
    state = Path(root) / "state.json"
    while state.is_file():
        if not runs(process):
            try:
                teardown(State.load(root))
            except SimClusterError:
                if state.is_file():  # not a down() that ran at the same moment: say what is left
                    raise
            print(f"kit sim-cluster: process {pid}, which made {root}, is gone: the emulated cluster is removed",
                  file=sys.stderr, flush=True)
            return 0
        time.sleep(POLL_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(watch(*sys.argv[1:]))
