"""TFCluster on engines that ipyparallel started elsewhere: here, Linux network namespaces.

Each namespace is a "host" with its own network stack, joined to the controller by a veth pair on
a bridge; an engine is started inside it with `ip netns exec`, as a launcher would on a real host.
The test makes its namespaces itself, talks only to the addresses it made, and removes them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from unittest import mock

import pytest

import ipyparallel as ipp

from conftest import can_make_namespaces, sh
from kit.core.cluster import TFCluster
from kit.core.errors import ClusterError, OptionError

SUBNET = f"10.{77 + os.getpid() % 20}.{os.getpid() % 200}"  # a private /24 of this test run only
# TFCluster warns that engines from elsewhere expose their servers; test_security.py checks the warning
pytestmark = pytest.mark.filterwarnings("ignore::kit.core.errors.ExposedPortsWarning")


class Hosts:
    """A bridge with the controller's address and namespaces ("hosts") attached to it."""

    def __init__(self):
        tag = uuid.uuid4().hex[:5]
        self.bridge = f"kbr{tag}"
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.tag = tag
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        self.controller_ip = f"{SUBNET}.1"

    def add(self, number: int, routed: bool = True) -> str:
        """A namespace with address SUBNET.<number+1>; ``routed=False``: it reaches the controller only."""
        ns, outside, inside = f"kit{self.tag}h{number}", f"kv{self.tag}{number}", f"kp{self.tag}{number}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        self.links.append(outside)
        sh("ip", "link", "set", outside, "master", self.bridge)
        sh("ip", "link", "set", outside, "up")
        sh("ip", "link", "set", inside, "netns", ns)
        address = f"{SUBNET}.{number + 1}"
        run = ["ip", "netns", "exec", ns]
        sh(*run, "ip", "link", "set", "lo", "up")
        sh(*run, "ip", "addr", "add", f"{address}/{24 if routed else 32}", "dev", inside)
        sh(*run, "ip", "link", "set", inside, "up")
        if not routed:
            sh(*run, "ip", "route", "add", f"{self.controller_ip}/32", "dev", inside)
        return ns

    def remove(self) -> None:
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture(scope="module")
def hosts():
    reason = can_make_namespaces()
    if reason:
        pytest.skip(reason)  # on CI (root, Debian) can_make_namespaces fails the run instead
    made = Hosts()
    try:
        yield made
    finally:
        made.remove()


def engines_in(hosts: Hosts, namespaces: list[str], tmp_path) -> ipp.Cluster:
    """An ipyparallel controller on the bridge address and one engine in each namespace."""
    cluster = ipp.Cluster(n=0, profile_dir=str(tmp_path / "profile"), controller_ip=hosts.controller_ip,
                          controller_args=["--IPController.use_threads=True"], log_level=40)
    cluster.start_controller_sync()
    tmpdir = tmp_path / "tmp"  # the engines' AutoGraph modules, which a killed engine leaves: in pytest's folder
    tmpdir.mkdir(parents=True, exist_ok=True)
    for ns in namespaces:
        cluster.start_engines_sync(n=1, engine_set_id=ns, environment={"TMPDIR": str(tmpdir)},
                                   engine_cmd=["ip", "netns", "exec", ns, sys.executable, "-m", "ipyparallel.engine"])
    return cluster


@pytest.fixture
def ipp_cluster(hosts, tmp_path):
    made = []

    def factory(namespaces):
        cluster = engines_in(hosts, namespaces, tmp_path / f"c{len(made)}")
        made.append(cluster)
        return cluster

    yield factory
    for cluster in made:
        cluster.stop_cluster_sync()


@pytest.mark.slow
def test_a_namespace_without_a_route_to_the_others_is_named(hosts, ipp_cluster):
    h4, h5 = hosts.add(4), hosts.add(5, routed=False)  # h5 reaches the controller, not h4
    engines = ipp_cluster([h4, h5])
    with pytest.raises(ClusterError) as info:
        TFCluster(workers=2, engines=engines, start_timeout=60).start()
    message = str(info.value)
    print(message)
    assert "cannot reach" in message and f"{SUBNET}.6" in message
    assert set(info.value.tasks) <= {"worker:0", "worker:1"} and info.value.tasks


@pytest.mark.slow  # a user's ipyparallel cluster: 11.4 s
def test_too_few_engines_is_a_clear_error(tmp_path):
    engines = ipp.Cluster(n=0, profile_dir=str(tmp_path / "profile"), log_level=40)
    engines.start_controller_sync()
    try:
        engines.start_engines_sync(n=1, engine_set_id="only")
        with pytest.raises(ClusterError, match="too few engines: 1 registered") as info:
            TFCluster(workers=2, engines=engines, start_timeout=10).start()
        assert info.value.tasks == ["worker:1"]
    finally:
        engines.stop_cluster_sync()


@pytest.mark.slow  # a user's ipyparallel cluster: 7.0 s
def test_engines_with_different_tensorflow_versions_are_refused(tmp_path):
    fake = tmp_path / "other-site"
    (fake / "tensorflow-9.9.0.dist-info").mkdir(parents=True)
    (fake / "tensorflow-9.9.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 9.9.0\n")
    engines = ipp.Cluster(n=0, profile_dir=str(tmp_path / "profile"), log_level=40)
    engines.start_controller_sync()
    try:
        engines.start_engines_sync(n=1, engine_set_id="ordinary")
        engines.start_engines_sync(n=1, engine_set_id="odd", environment={"PYTHONPATH": str(fake)})
        with pytest.raises(ClusterError, match="different TensorFlow versions") as info:
            TFCluster(workers=2, engines=engines, start_timeout=60).start()
        assert "9.9.0" in str(info.value) and "2.21.0" in str(info.value)
    finally:
        engines.stop_cluster_sync()


def test_engines_option_rejects_other_things():
    with pytest.raises(OptionError, match="engines"):
        TFCluster(workers=2, engines=42)


@pytest.mark.slow  # a user's ipyparallel cluster: 12.9 s
def test_a_users_cluster_without_engines_gets_one_engine_set_per_task(tmp_path, no_leaks):
    """Given an ipyparallel.Cluster (any launcher; here the local one), the kit starts its controller
    and one engine set per TF task through it, can restart them, and stops what it started."""
    engines = ipp.Cluster(n=0, profile_dir=str(tmp_path / "profile"), log_level=40)
    cluster = TFCluster(workers=2, engines=engines, start_timeout=60).start()
    try:
        assert sorted(engines.engines) == ["worker-0", "worker-1"]
        first = cluster.run(os.getpid)
        cluster.restart()
        second = cluster.run(os.getpid)
        assert not set(first) & set(second)
        assert [t.pid for t in cluster.tasks] == second
        started = [*second, engines.controller.process.pid]
    finally:
        cluster.stop()
    assert engines.controller is None and not engines.engines
    import psutil
    assert not [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_a_task_whose_set_is_a_slurm_job_gets_the_engine_in_that_job():
    """The engines of one-job-per-task sets register in any order: each task must get the engine in its own job,
    whose state then says whether the task lives (a scancel of worker:0's job was once taken for worker:1's loss)."""
    from kit.core.attach import assign_tasks

    reports = {0: {"hostname": "h2", "address": "10.0.0.3", "slurm_job_id": "8"},   # worker:1's job came up first
               1: {"hostname": "h1", "address": "10.0.0.2", "slurm_job_id": "7"}}
    assert assign_tasks(["worker:0", "worker:1"], reports, {"worker:0": "7", "worker:1": "8"}) == \
        {"worker:0": 1, "worker:1": 0}
    # not Slurm jobs (SSH, a user's engines), or a job that no engine reports: spread over the hosts
    assert assign_tasks(["worker:0", "worker:1"], reports, {"worker:0": None, "worker:1": None}) == \
        {"worker:0": 0, "worker:1": 1}
    assert assign_tasks(["worker:0", "worker:1"], reports, {"worker:0": "7", "worker:1": "9"}) == \
        {"worker:0": 0, "worker:1": 1}


def test_an_engine_that_leaves_during_the_folder_round_is_skipped_and_the_others_are_asked(caplog):
    """A killed engine can still be registered when the stop's folder round checks its engines and gone when the
    round sends: its folder goes with its job's step or its host's round; the stop goes on (a fresh-clone CI run
    failed with ipyparallel's "IndexError: No such engine: 1" from the round, and left the Slurm job behind)."""
    from kit.core.attach import ForeignEngines
    from kit.core.options import ClusterOptions

    class Done:
        def wait(self, timeout):
            return True

    class Client:  # engine 1 unregisters while the round asks the controller for the queues
        def __init__(self):
            self.ids, self.asked = [0, 1], []

        def queue_status(self, targets="all"):
            answer = {i: {"queue": 0, "tasks": 0} for i in (self.ids if targets == "all" else targets)}
            self.ids = [0]
            return answer

        def __getitem__(self, i):
            if i not in self.ids:
                raise IndexError(f"No such engine: {i}")
            self.asked.append(i)
            return mock.Mock(apply_async=lambda f: Done())

    engines = ForeignEngines(ClusterOptions(workers=2, engines="ipcontroller-client.json"))
    engines.client, engines.engine_ids = Client(), {"worker:0": 0, "worker:1": 1}
    with mock.patch.object(engines, "alive", return_value=True), caplog.at_level("INFO", "kit.core.attach"):
        engines._remove_tmpdirs()
    assert engines.client.asked == [0], engines.client.asked
    assert "engine 1 left before the removal of its temporary folder" in caplog.text, caplog.text


def test_the_ssh_folder_round_reports_a_removal_that_failed_even_when_a_later_one_succeeds(tmp_path, caplog):
    """After the SIGKILLs, one command per host removes each ended SSH engine's folder: a failed removal must reach
    the warning also when it is not the last (the removals were joined with ';', whose exit is the last one's)."""
    import types

    from kit.core.attach import _remove_ended_engines_tmpdirs

    ended = subprocess.Popen(["true"])
    ended.wait()  # a pid whose process is gone
    local = {"ssh_cmd": ["sh"], "ssh_args": [], "location": "-c", "pid": ended.pid}  # `sh -c CMD` for `ssh HOST CMD`
    unremovable, removable = "/proc/1/status", tmp_path / "kit-engine-gone"
    (removable / "autograph").mkdir(parents=True)
    with caplog.at_level("WARNING", logger="kit.core.attach"):
        _remove_ended_engines_tmpdirs([(types.SimpleNamespace(**local), unremovable),
                                       (types.SimpleNamespace(**local), str(removable))])
    assert not removable.exists()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "could not remove the engines' temporary folders (exit 1)" in warning and unremovable in warning


# An engine from elsewhere in its own TMPDIR (kit.core._remote.own_tmpdir), signalled as scancel signals it: SIGTERM,
# then SIGKILL after KillWait. The previous handler ends the process without exit handlers (os._exit), as that
# SIGKILL does, so only the kit's SIGTERM handler can have removed the folder.
SIGNALLED_ENGINE = """
import os, signal, sys
from kit.core import _remote
os.environ[_remote.HOST_TMP_VAR] = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: os._exit(7))      # ipyparallel's handler, cut short by SIGKILL
mine = _remote.own_tmpdir()
open(os.path.join(mine, "__autograph_generated_file1.py"), "w").close()
def busy():                      # a function of the lesson, running when the signal comes
    os.kill(os.getpid(), signal.SIGTERM)
    while True:
        pass
if sys.argv[2] == "busy":
    _remote.call_with_sources({}, busy)
else:
    print("idle", flush=True)
    signal.pause()               # idle, as an engine in its event loop
"""


@pytest.mark.parametrize("state", ["idle", "busy"])
def test_sigterm_removes_an_idle_engines_own_tmpdir_and_keeps_a_busy_ones(tmp_path, state):
    from kit.core import _remote

    engine = subprocess.Popen([sys.executable, "-c", SIGNALLED_ENGINE, str(tmp_path), state],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if state == "idle":
            assert engine.stdout.readline() == "idle\n", engine.stderr.read()
            engine.terminate()
        _, stderr = engine.communicate(timeout=60)
    finally:
        engine.kill()
    assert engine.returncode == 7, stderr  # the previous handler still ended it
    left = [p.name for p in tmp_path.iterdir()]
    if state == "idle":
        assert left == [], f"an idle engine's folder outlived SIGTERM: {left}"
    else:  # still in use by the running function: the next engine on the host removes it (its process is gone)
        assert len(left) == 1 and left[0].startswith(_remote.OWN_TMP_PREFIX), left
        _remote.remove_dead_engines_tmpdirs(str(tmp_path))
        assert not list(tmp_path.iterdir())
