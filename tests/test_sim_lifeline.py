"""kit.tools.sim_lifeline: an emulated cluster is removed when the process that made it exits, even killed.

On a cluster record with no hosts, links or daemons (what teardown removes is then its folder alone), so that
the watcher's own behaviour is tested without root; notebook 11's live test (tests/test_notebook_cluster.py)
ties a real emulated cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kit.tools import sim_lifeline
from kit.tools.sim_state import SimClusterError, State


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)  # polling a process and a folder


def empty_cluster(tmp_path):
    state = State(root=str(tmp_path / "sim"), bridge="none", controller_ip="10.0.0.1")
    (tmp_path / "sim").mkdir()
    state.save()
    return tmp_path / "sim"


def test_a_killed_owner_takes_the_cluster_down(tmp_path):
    root = empty_cluster(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watcher = sim_lifeline.tie(root, owner=owner.pid)
        time.sleep(3 * sim_lifeline.POLL_SECONDS)  # the watcher sees a live owner and leaves the cluster alone
        assert root.exists() and watcher.poll() is None
    finally:
        owner.kill()
        owner.wait(timeout=10)
    wait_until(lambda: not root.exists(), 10, "the watcher to remove the cluster of a killed owner")
    assert watcher.wait(timeout=10) == 0


def test_the_watcher_leaves_by_itself_once_the_cluster_is_down(tmp_path):
    root = empty_cluster(tmp_path)
    watcher = sim_lifeline.tie(root)  # this process: alive throughout
    (root / "state.json").unlink()    # what sim.down() does last (with the rest of the folder)
    assert watcher.wait(timeout=10) == 0
    assert root.exists()               # it removed nothing: the cluster was the owner's to remove


def test_tying_a_folder_that_is_no_cluster_names_the_fix(tmp_path):
    with pytest.raises(SimClusterError, match="is not an emulated cluster that is up") as info:
        sim_lifeline.tie(tmp_path)
    assert "sim.root" in str(info.value)
