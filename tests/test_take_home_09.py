"""Notebook 09's lesson taken home: the exported main.py run by horovodrun, as a learner runs it, no kit.

- on this machine: ``horovodrun --gloo -np 2 -H localhost:2 python main.py``; both ranks end with the same
  (averaged) loss, which is the loss of the same lesson function run on a ``kit.HorovodCluster`` from the same
  seed;
- on two emulated hosts over SSH (kit.tools.sim_cluster, root only): ``horovodrun --gloo -np 2 -H h1:1,h2:1``
  typed on h1, which starts rank 1 on h2 with ssh.

The multi-host test brings up an emulated cluster, so it belongs with the other emulated-cluster modules (one
at a time under pytest-xdist): it is marked with their group, "sim".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from take_home import MNIST, PLAIN_ENV, export

pytestmark = pytest.mark.slow

HOROVOD_MISSING = subprocess.run([sys.executable, "-c", "import horovod.tensorflow"], capture_output=True,
                                 env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).returncode != 0
#: A few steps: each rank runs STEPS // 2 of them.
ARGS = ["--mnist-path", MNIST, "--seed", "1", "--epochs", "1", "--steps-per-epoch", "6", "--per-worker-batch", "32"]
BIN = str(Path(sys.executable).parent)  # horovodrun and python of this environment


@pytest.fixture(autouse=True)
def horovod_installed():
    if HOROVOD_MISSING:
        pytest.fail("Horovod is not installed in this environment: run `make horovod`")


def horovodrun(argv: list[str], cwd: Path, timeout: float = 300, env: dict | None = None,
               prefix: list[str] = ()) -> dict[int, dict]:
    """Run ``horovodrun *argv`` in ``cwd`` (its whole process group killed if it outlives ``timeout``); return
    each rank's result, the JSON line main.py printed, which horovodrun prefixes with ``[rank]<stdout>:``."""
    environment = {**os.environ, **PLAIN_ENV, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    environment.pop("KIT_TASK", None)
    environment.pop("TF_CONFIG", None)
    proc = subprocess.Popen([*prefix, os.path.join(BIN, "horovodrun"), *argv], cwd=cwd, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"horovodrun still running after {timeout}s; its output:\n{output[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"horovodrun exited with {proc.returncode}:\n{output[-4000:]}"
    results = {int(line[1:line.index("]")]): json.loads(line.partition(":")[2])
               for line in output.splitlines() if "]<stdout>:{" in line}
    assert sorted(results) == [0, 1], f"expected results from ranks 0 and 1, found {sorted(results)}:\n{output[-4000:]}"
    return results


def final_losses(results: dict[int, dict]) -> list[float]:
    return [results[rank]["loss"][-1] for rank in sorted(results)]


def test_horovodrun_runs_main_py_on_this_machine_as_the_notebook_does(tmp_path, monkeypatch):
    script = export("09-horovod", tmp_path / "take-home")
    results = horovodrun(["--gloo", "-np", "2", "-H", "localhost:2", "python", "main.py", *ARGS], script.parent)
    losses = final_losses(results)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6, err_msg="the ranks' averaged losses differ")
    saved = sorted(p.name for p in (script.parent / "ckpt").iterdir())
    assert saved == ["ckpt-1.weights.h5"], f"expected rank 0's one checkpoint in --checkpoint-dir (ckpt), found {saved}"

    # the same lesson function on the kit's ranks, from the same seed
    from kit.core.horovod import HorovodCluster

    monkeypatch.setenv("KIT_VIEW", "text")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # what main.py sets when executed: undone after the test
    namespace: dict = {"__name__": "lesson"}
    exec(compile(script.read_text(), str(script), "exec"), namespace)  # noqa: S102 - the exported lesson itself
    with HorovodCluster(workers=2, env={"TF_CPP_MIN_LOG_LEVEL": "2"}) as cluster:
        histories = cluster.with_options(stream=False).run(
            namespace["train"], per_worker_batch=32, epochs=1, steps_per_epoch=6, learning_rate=0.001,
            train_examples=4096, mnist_path=MNIST, seed=1)
    np.testing.assert_allclose([h["loss"][-1] for h in histories], losses, rtol=1e-4,
                               err_msg="the kit's ranks and horovodrun's ended with different losses")


# ----- two emulated hosts over SSH ---------------------------------------------------------------
#: What every emulated host's network interface is called, as on a real cluster's nodes: horovodrun gives all
#: ranks one HOROVOD_GLOO_IFACE (and looks for interfaces of the same name on every host).
NIC = "eth0"


def same_nic_name(sim) -> None:
    """Rename each host's link to the bridge to :data:`NIC` (the emulated cluster names them per host)."""
    for host in sim.hosts:
        inns = ["ip", "netns", "exec", host.namespace, "ip"]
        links = subprocess.run([*inns, "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
        (link,) = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()
                   if line.split(":")[1].strip() != "lo"]
        for step in (["link", "set", "dev", link, "down"], ["link", "set", "dev", link, "name", NIC],
                     ["link", "set", "dev", NIC, "up"]):
            subprocess.run([*inns, *step], capture_output=True, text=True, check=True)


@pytest.mark.xdist_group("sim")  # with the other emulated-cluster modules (tests/conftest.py SIM_MODULES)
def test_horovodrun_runs_main_py_on_two_hosts_over_ssh(tmp_path):
    from kit.tools import sim_cluster
    from kit.tools.sim_cluster import SimCluster

    problems = sim_cluster.missing()
    if problems:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("an emulated cluster needs " + "; ".join(problems))
    script = export("09-horovod", tmp_path / "take-home")
    with SimCluster(hosts=2, root=tmp_path / "sim", slurm=False) as sim:
        same_nic_name(sim)
        # the learner's ~/.ssh/config, here a wrapper: ssh reads the emulated cluster's config (key, names)
        wrappers = tmp_path / "bin"
        wrappers.mkdir()
        (wrappers / "ssh").write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {sim.ssh_config} "$@"\n')
        (wrappers / "ssh").chmod(0o755)
        h1 = sim.hosts[0]
        try:
            results = horovodrun(["--gloo", "-np", "2", "-H", "h1:1,h2:1", "python", "main.py", *ARGS],
                                 script.parent, env={"PATH": f"{wrappers}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}"},
                                 prefix=["ip", "netns", "exec", h1.namespace])  # typed on h1
        finally:
            deadline = time.monotonic() + 15  # the ranks' ssh sessions end just after horovodrun
            while sim.leftovers() and time.monotonic() < deadline:
                time.sleep(0.2)
            left = sim.leftovers()
        assert not left, f"processes left on the hosts after horovodrun: {left}"
        sessions = (sim.root / "ssh" / "sshd_h2.log").read_text(errors="replace")
        assert "Accepted publickey" in sessions, f"expected horovodrun to reach h2 over ssh; h2's sshd log:\n{sessions[-2000:]}"
    losses = final_losses(results)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6, err_msg="the two hosts' averaged losses differ")
