"""Fixtures: clusters that always stop, and a census of the processes the kit started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _own_temporary_folder() -> None:
    """Under pytest-xdist (make unit runs two workers), each worker gets a temporary folder of its own, set
    before anything here reads it: the tests that count what a run leaves in the temporary folder
    (tests/test_workdir.py, tests/test_slurm_ssh.py) then count only their own worker's. The kit's cluster
    folders, the engines' TMPDIR and TensorFlow's AutoGraph modules all go there; it is removed when the worker
    exits (after TensorFlow's own exit handlers, which delete the modules of this process)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    import atexit
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"kit-tests-{worker}-")
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None  # tempfile.gettempdir() reads TMPDIR again
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # registered first, so it runs last


_own_temporary_folder()
# The kit's Keras (tf-keras) for whichever test first imports TensorFlow in this process, as a lesson's cell or
# as kit.train._tf does: a test that imports it directly otherwise left Keras 3 to the tests after it in the
# same worker, which then failed or passed by the order pytest-xdist gave them
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

#: tests/learner/ runs inside tests/test_unprivileged.py's sandbox (an ordinary user, namespaces refused), not here.
collect_ignore = [] if os.environ.get("KIT_LEARNER_RUN") else ["learner"]


#: Fixtures that start a cluster: a test using one is ``slow`` (`pytest -m "not slow"` is the fast loop).
CLUSTER_FIXTURES = ("make_cluster", "two_workers", "make_horovod")


#: Modules that bring up an emulated cluster (kit.tools.sim_cluster): one Slurm controller and munge per machine,
#: so under pytest-xdist they run one after another, in one worker.
SIM_MODULES = ("test_slurm_ssh", "test_notebook_cluster", "test_bench", "test_sim_lifeline", "test_take_home_09")
#: Modules whose tests run as the ordinary user LEARNER: its access to this Python (an ACL on /root's folders) is
#: granted and taken back by each test, so they run one after another, in one worker.
LEARNER_MODULES = ("test_unprivileged", "test_laptop")


#: The check tier (``make check``, CI), marked ``check``: Chromium (JupyterLab, the site), other Pythons and Colab's
#: install, an ordinary user's sandbox, emulated hosts and links (root: network namespaces, Slurm, sshd, tc), the
#: take-home scripts run beside their notebooks, and the Binder record. ``make test`` runs every other test
#: (``-m "not check"``): no root, nothing installed outside .venv.
CHECK_MODULES = ("test_browser", "test_site", "test_binder_fit", "test_slurm_ssh", "test_sim_lifeline", "test_pythons",
                 "test_colab", "test_laptop", "test_unprivileged", "test_links", "test_multihost",
                 *(p.stem for p in Path(__file__).parent.glob("test_take_home_*.py")))


def pytest_itemcollected(item):
    """Mark ``slow`` every test that starts a cluster through a fixture, also one written without the mark.

    And the group of each test for pytest-xdist's ``--dist loadgroup``: its module (a module-scoped cluster is
    then started once, and a module's tests keep their order), the emulated-cluster modules all in one.
    Marked as each item is collected, before any ``pytest_collection_modifyitems`` (xdist's worker reads the groups
    in its own). xdist writes the group into the test's id, which pytest 9.2 no longer reads (pytest-dev/pytest-xdist
    #1386): pyproject keeps pytest below 9.2, and tests/test_packaging.py checks that a module stays on one worker."""
    if not item.get_closest_marker("slow") and set(CLUSTER_FIXTURES) & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.slow)
    module = item.module.__name__.rpartition(".")[2] if getattr(item, "module", None) else item.nodeid
    if module in CHECK_MODULES:
        item.add_marker(pytest.mark.check)
    item.add_marker(pytest.mark.xdist_group("sim" if module in SIM_MODULES else
                                            "learner" if module in LEARNER_MODULES else module))


def kit_processes(owner_pid: int | None = None) -> list[psutil.Process]:
    from kit.core.cluster import kit_processes as census

    return census(owner_pid)


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid}: {' '.join(proc.cmdline()[:5])}")
        except psutil.Error:
            out.append(f"{proc.pid}: (exited)")
    return out


@pytest.fixture(scope="session")
def kit_wheel(tmp_path_factory) -> Path:
    """The kit's wheel, built once per test process from a copy of the checkout (tests/pythons.py)."""
    import pythons

    return pythons.build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(autouse=True)
def _exposed_warnings_shown_afresh():
    """Each test sees the ExposedPortsWarning of its own clusters (a kernel shows it once per process)."""
    from kit.core.cluster import EXPOSED_SHOWN

    EXPOSED_SHOWN.clear()


#: Debian's Chromium, which playwright drives (its own browser download is not used): tests/test_browser.py, test_site.py.
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's) driven by playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, timeout=60_000)
        try:
            yield chromium
        finally:
            chromium.close()


def exposed(warned) -> list[str]:
    """The ExposedPortsWarnings' whole text (``detail``, with every address) among what ``pytest.warns``
    recorded: it records every warning meanwhile (a ResourceWarning of an unclosed file came first in one run),
    not only the one it waits for."""
    from kit.core.errors import ExposedPortsWarning

    return [w.message.detail for w in warned if issubclass(w.category, ExposedPortsWarning)]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def can_make_namespaces() -> str | None:
    """Why this run cannot make network namespaces ("hosts" for the tests), or None if it can.

    On CI (root on Debian) it must be able to: there a missing prerequisite fails the test run.
    """
    reason = None
    if os.geteuid() != 0:
        reason = "needs root to create network namespaces"
    elif shutil.which("ip") is None:
        reason = "needs the `ip` command (iproute2: apt-get install iproute2)"
    else:
        probe = f"kitprobe{uuid.uuid4().hex[:6]}"
        result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if result.returncode != 0:
            reason = f"cannot create network namespaces here: {result.stderr.strip()}"
        else:
            sh("ip", "netns", "del", probe)
    if reason and os.environ.get("CI"):
        import pytest

        pytest.fail(f"CI runs as root on Debian, where this must work: {reason}")
    return reason


def broken_startup(directory: Path, monkeypatch, body: str, task: str = "worker:1") -> None:
    """Make ``task``'s engine run ``body`` at Python start-up (a sitecustomize on its PYTHONPATH).

    A real way to make one engine crash, hang or refuse to start, for the failure tests.
    """
    from kit.core import roles

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(body)
    original = roles.task_environment

    def environment(options, name, *args):
        env = original(options, name, *args)
        if name == task:
            env["PYTHONPATH"] = str(directory)
        return env

    monkeypatch.setattr(roles, "task_environment", environment)


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
    from kit.core.cluster import TFCluster

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
    from kit.core.cluster import TFCluster

    with TFCluster(workers=2) as cluster:
        yield cluster
    left = kit_processes(os.getpid())
    assert not left, f"processes outlived their cluster: {describe(left)}"


#: The ordinary user of the tests that run as a learner would (tests/test_unprivileged.py, tests/test_laptop.py).
LEARNER = "kitlearner"


@pytest.fixture
def learner():
    """The user, able to run this interpreter, with a temporary folder of its own; undone afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create the unprivileged user (CI runs as root)")
    sys.path.insert(0, str(REPO / "tools"))
    import sandbox  # tools/sandbox.py

    user = sandbox.ensure_user(LEARNER)
    folders = sandbox.grant_reach(LEARNER)
    tmp = tempfile.mkdtemp(prefix="kit-learner-", dir="/tmp")  # not under a test worker's 0700 TMPDIR
    os.chown(tmp, user.pw_uid, user.pw_gid)
    try:
        yield user, tmp
    finally:
        sandbox.revoke_reach(LEARNER, folders)
        shutil.rmtree(tmp, ignore_errors=True)
