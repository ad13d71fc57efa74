"""kit.core.limits: CPU quota and memory limit from cgroups, the memory check before start, OOM kills named.

The parsing is tested on fake /proc and cgroup trees (v1 and v2); as root, real cgroups (v1 here, the
same code reads v2) limit a child process and an engine that the out-of-memory killer ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from conftest import REPO
from kit.core import limits
from kit.core.errors import MemoryLimitWarning

GiB = 2**30


def fake_proc(tmp_path: Path, mounts: list[str], membership: list[str]) -> Path:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text("\n".join(mounts) + "\n")
    (proc / "cgroup").write_text("\n".join(membership) + "\n")
    return tmp_path / "proc"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_and_the_tightest_memory_limit_on_the_path(tmp_path):
    root = tmp_path / "cg2"
    proc = fake_proc(tmp_path, [f"30 25 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"],
                     ["0::/user.slice/jupyter"])
    write(root / "cgroup.controllers", "cpuset cpu io memory pids")
    write(root / "user.slice" / "memory.max", str(2 * GiB))
    write(root / "user.slice" / "cpu.max", "max 100000")
    write(root / "user.slice" / "jupyter" / "memory.max", "max")
    write(root / "user.slice" / "jupyter" / "cpu.max", "50000 100000")
    write(root / "user.slice" / "jupyter" / "memory.current", str(GiB // 2))
    write(root / "user.slice" / "jupyter" / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    found = limits.read(proc, environ={})
    assert found.cpu_quota == 0.5 and found.cores == 1
    assert found.memory_limit == 2 * GiB and "user.slice" in found.memory_limit_from
    assert found.memory_used == GiB // 2
    assert limits.oom_kills(proc) == 1


def test_cgroup_v1_quota_memory_and_mem_limit(tmp_path):
    cpu, memory = tmp_path / "cpu,cpuacct", tmp_path / "memory"
    proc = fake_proc(tmp_path, [
        f"35 25 0:30 / {cpu} rw - cgroup cgroup rw,cpu,cpuacct",
        f"36 25 0:31 / {memory} rw - cgroup cgroup rw,memory",
        f"37 25 0:32 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw",  # hybrid: v2 without controllers
    ], ["4:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc", "0::/docker/abc"])
    write(tmp_path / "unified" / "cgroup.controllers", "")
    write(cpu / "docker" / "abc" / "cpu.cfs_quota_us", "150000")
    write(cpu / "docker" / "abc" / "cpu.cfs_period_us", "100000")
    write(memory / "docker" / "abc" / "memory.limit_in_bytes", str(3 * GiB))
    write(memory / "memory.limit_in_bytes", "9223372036854771712")  # v1's "no limit"
    write(memory / "docker" / "abc" / "memory.usage_in_bytes", str(GiB))
    write(memory / "docker" / "abc" / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    found = limits.read(proc, environ={})
    assert found.cpu_quota == 1.5 and found.cores == min(2, found.affinity)
    assert found.memory_limit == 3 * GiB and found.memory_used == GiB
    assert limits.oom_kills(proc) == 4
    binder = limits.read(proc, environ={"MEM_LIMIT": str(2 * GiB)})  # as JupyterHub/Binder set it
    assert binder.memory_limit == 2 * GiB and binder.memory_limit_from == "MEM_LIMIT"


def test_a_container_that_sees_its_cgroup_as_the_root(tmp_path):
    root = tmp_path / "cg2"
    proc = fake_proc(tmp_path, [f"30 25 0:26 /kubepods/pod1 {root} rw - cgroup2 cgroup2 rw"],
                     ["0::/kubepods/pod1"])
    write(root / "cgroup.controllers", "cpu memory")
    write(root / "cpu.max", "100000 100000")
    write(root / "memory.max", str(GiB))
    found = limits.read(proc, environ={})
    assert found.cores == 1 and found.memory_limit == GiB


def test_no_cgroups_means_no_limits(tmp_path):
    found = limits.read(tmp_path / "nowhere", environ={})
    assert found.cpu_quota is None and found.memory_limit is None and found.cores == found.affinity
    assert limits.oom_kills(tmp_path / "nowhere") is None


def test_the_memory_shortfall_gives_the_numbers():
    tight = limits.Limits(affinity=1, cpu_quota=1.0, memory_limit=2 * GiB, memory_used=GiB // 2,
                          memory_limit_from="MEM_LIMIT")
    assert limits.memory_shortfall(2, tight) == ""  # 1.2 GiB of 1.5 free
    message = limits.memory_shortfall(4, tight)
    assert "4 task(s) need about 2.3 GiB" in message and "2.0 GiB (MEM_LIMIT)" in message and "0.5 GiB" in message
    assert limits.memory_shortfall(8, limits.Limits(1, None, None, None)) == ""


@pytest.mark.slow  # a cluster: 4.5 s
def test_a_cluster_that_will_not_fit_is_warned_before_it_starts(monkeypatch, make_cluster):
    tight = limits.Limits(affinity=2, cpu_quota=None, memory_limit=GiB, memory_used=GiB // 2,
                          memory_limit_from="cgroup memory.max at /sys/fs/cgroup/test")
    monkeypatch.setattr(limits, "read", lambda *args, **kwargs: tight)
    with pytest.warns(MemoryLimitWarning, match=r"2 task\(s\) need about 1.2 GiB.*1.0 GiB.*Fix: fewer tasks"):
        make_cluster(workers=2)


# ----- real cgroups (root) ---------------------------------------------------------------------------
class Cgroup:
    """A child cgroup (v1 hierarchy) of this process's own, for the cpu and memory controllers."""

    def __init__(self, cpu_quota: float | None = None, memory: int | None = None):
        self.dirs = {}
        name = f"kit-test-{uuid.uuid4().hex[:6]}"
        for controller, parents in limits.cgroup_dirs(Path("/proc")).items():
            if (parents[0] / "cgroup.controllers").exists():
                pytest.skip("this test drives cgroup v1 hierarchies; this machine mounts cgroup v2")
            directory = parents[0] / name
            directory.mkdir()
            self.dirs[controller] = directory
        if cpu_quota is not None:
            (self.dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
            (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(int(cpu_quota * 100000)))
        if memory is not None:
            (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory))

    def run(self, script: str, timeout: float) -> subprocess.CompletedProcess:
        """Run ``script`` with Python inside this cgroup (it and everything it starts)."""
        enter = " && ".join(f"echo $$ > {d}/cgroup.procs" for d in self.dirs.values())
        return subprocess.run(["sh", "-c", f'{enter} && exec "$0" -c "$1"', sys.executable, script],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO)})

    def remove(self) -> None:
        for directory in self.dirs.values():
            directory.rmdir()  # empty once every process in it has exited


@pytest.fixture
def cgroup():
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root, where real cgroups must be tested")
        pytest.skip("needs root to make cgroups")
    made = []

    def factory(**kwargs):
        made.append(Cgroup(**kwargs))
        return made[-1]

    yield factory
    for group in made:
        group.remove()


def test_a_cpu_quota_and_memory_limit_are_seen_by_a_process_inside(cgroup):
    group = cgroup(cpu_quota=1.0, memory=2 * GiB)
    done = group.run("from kit.core import limits; l = limits.read(); print(l.cores, l.cpu_quota, l.memory_limit)", 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1.0", str(2 * GiB)]


@pytest.mark.slow
def test_an_engine_killed_for_memory_is_reported_as_that(cgroup, no_leaks):
    group = cgroup(memory=1 * GiB)
    script = textwrap.dedent('''
        import warnings
        from kit.core.cluster import TFCluster
        from kit.core.errors import WorkerError

        def hog():
            blocks = []
            while True:
                blocks.append(bytearray(64 * 2**20))  # zero-filled: every page is touched

        warnings.simplefilter("ignore")  # the memory check warns about 2 tasks in 1 GiB: we know
        with TFCluster(workers=2) as cluster:
            try:
                cluster.with_options(tasks=["worker:1"], timeout=120).run(hog)
            except WorkerError as error:
                print("TASK", error.task)
                print(str(error).splitlines()[0])
    ''')
    done = group.run(script, 240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TASK worker:1" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "killed by the out-of-memory killer" in done.stdout and "1.0 GiB" in done.stdout, done.stdout
    assert "Fix: fewer tasks" in done.stdout
    print(done.stdout)
