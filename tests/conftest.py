"""Fixtures: clusters that always stop, and a census of the processes the kit started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def kit_processes(owner_pid: int | None = None) -> list[psutil.Process]:
    from kit.cluster import kit_processes as census

    return census(owner_pid)


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid}: {' '.join(proc.cmdline()[:5])}")
        except psutil.Error:
            out.append(f"{proc.pid}: (exited)")
    return out


def broken_startup(directory: Path, monkeypatch, body: str, task: str = "worker:1") -> None:
    """Make ``task``'s engine run ``body`` at Python start-up (a sitecustomize on its PYTHONPATH).

    A real way to make one engine crash, hang or refuse to start, for the failure tests.
    """
    from kit.cluster import TFCluster

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(body)
    original = TFCluster._task_environment

    def environment(self, name, *args):
        env = original(self, name, *args)
        if name == task:
            env["PYTHONPATH"] = str(directory)
        return env

    monkeypatch.setattr(TFCluster, "_task_environment", environment)


@pytest.fixture
def no_leaks():
    """Fails the test if a kit process it started (directly or not) is still alive afterwards."""
    before = {p.pid for p in kit_processes(os.getpid())}  # e.g. a module-scoped cluster's
    yield
    left = [p for p in kit_processes(os.getpid()) if p.pid not in before]
    message = describe(left)
    for proc in left:
        proc.kill()
    assert not left, f"processes outlived their cluster: {message}"


@pytest.fixture
def make_cluster(no_leaks):
    """``make_cluster(**options)`` starts a TFCluster that is stopped at the end of the test."""
    from kit.cluster import TFCluster

    clusters = []

    def factory(**options):
        cluster = TFCluster(**options)
        clusters.append(cluster)
        return cluster.start()

    yield factory
    for cluster in clusters:
        cluster.stop()


@pytest.fixture(scope="module")
def two_workers():
    """One 2-worker cluster shared by the read-only tests of a module."""
    from kit.cluster import TFCluster

    with TFCluster(workers=2) as cluster:
        yield cluster
    left = kit_processes(os.getpid())
    assert not left, f"processes outlived their cluster: {describe(left)}"
