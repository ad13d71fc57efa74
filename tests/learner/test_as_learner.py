"""What a learner on Binder does, run as one: an ordinary user whose namespaces are refused (tools/sandbox.py).

tests/test_unprivileged.py runs this folder inside that sandbox; a plain ``pytest tests`` does not collect it
(tests/conftest.py). Each test says what it checks; the module's last test takes the census: no process of the
kit left, nothing of the kit left in this user's temporary folder.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
import psutil
import pytest

import kit
from kit.core.errors import ExposedPortsWarning

pytestmark = pytest.mark.filterwarnings("ignore::kit.core.errors.ExposedPortsWarning")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the engines cannot import this module


def _own_processes() -> list[psutil.Process]:
    me = os.getpid()
    return [p for p in psutil.process_iter(["uids", "cmdline"]) if p.info["uids"] and p.info["uids"].real == os.getuid()
            and p.pid != me and any("ipyparallel" in a or "kit.core" in a for a in p.info["cmdline"] or [])]


def test_this_is_an_ordinary_user_whose_namespaces_are_refused():
    assert os.getuid() != 0 and os.geteuid() != 0
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.unshare(0x10000000 | 0x40000000) == -1 and ctypes.get_errno() == 1  # EPERM, as in Docker


def _steps(callbacks=()):
    import numpy as np
    import tensorflow as tf

    tf.keras.utils.set_random_seed(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).random((256, 4), dtype=np.float32)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, x.sum(1))).repeat().batch(32), epochs=2,
                        steps_per_epoch=4, verbose=0, callbacks=list(callbacks))
    return history.history["loss"]


def test_a_cluster_starts_exposed_trains_survives_a_kill_and_stops():
    with pytest.warns(ExposedPortsWarning, match="Operation not permitted") as warned:
        cluster = kit.TFCluster(workers=2).start()
    try:
        assert len([w for w in warned if w.category is ExposedPortsWarning]) == 1
        assert all(os.readlink(f"/proc/{t.pid}/ns/net") == os.readlink("/proc/self/ns/net") for t in cluster.tasks)
        first = cluster.run(_steps, callbacks=[kit.Progress(64)])
        assert first[0] == first[1] and first[0][-1] < first[0][0], first
        assert cluster.last_view.measurements()["worker:1"]["examples_per_second"] > 0
        cluster.kill("worker:1")
        with pytest.raises(kit.ClusterError, match="worker:1"):
            cluster.run(_steps)
        cluster.restart()
        assert cluster.run(_steps) == first  # fresh engines, same seed: the same training
        pids = [t.pid for t in cluster.tasks]
    finally:
        cluster.stop()
    assert not [p for p in pids if psutil.pid_exists(p)]


def test_a_killed_kernel_leaves_no_process_and_the_next_cluster_sweeps_its_folder():
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        outputs = []
        client.execute_interactive("import json, psutil, kit\ncluster = kit.TFCluster(workers=2).start()\n"
                                   "print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]))",
                                   timeout=180, output_hook=outputs.append)
        pids = json.loads([m["content"]["text"] for m in outputs if m["msg_type"] == "stream"
                           and m["content"]["name"] == "stdout"][-1])
        os.kill(manager.provisioner.process.pid, signal.SIGKILL)  # no atexit: the lifelines must do it
    finally:
        manager.shutdown_kernel(now=True)
        client.stop_channels()
    deadline = time.monotonic() + 30
    while [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, f"still running 30 s after the kernel was killed: {pids}"
        time.sleep(0.2)
    with kit.TFCluster(workers=1):  # the next cluster removes the folders of owners that are gone
        pass
    left = [p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("kit-cluster-")]
    assert not left, f"kit-cluster folders of a killed kernel: {left}"


def test_nothing_of_the_kit_is_left():
    """The census, last: no process of this user's kit, nothing of the kit in its temporary folder."""
    assert not _own_processes(), [p.info["cmdline"][:4] for p in _own_processes()]
    left = [p.name for p in Path(tempfile.gettempdir()).iterdir()
            if p.name.startswith(("kit-", "__autograph_generated_file", "tmp")) and p.owner() == os.environ["USER"]]
    assert not left, f"left in {tempfile.gettempdir()}: {left}"
