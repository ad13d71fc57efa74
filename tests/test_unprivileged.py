"""The kit as learners on Binder run it: an ordinary user, namespaces refused as Docker's default seccomp profile
refuses them (tools/sandbox.py), the cluster on the host's network. tests/learner/ runs inside that sandbox: start,
train, kill + restart, stop, a killed kernel, and the census (no process, nothing in the temporary folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import LEARNER as USER
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import sandbox  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_filter_refuses_exactly_what_dockers_default_profile_refuses():
    program = sandbox.no_namespaces_program("x86_64")
    assert len(program) == 13 * 8  # 13 instructions
    assert sandbox.CLONE_NEW_ANY & 0x10000000 and sandbox.CLONE_NEW_ANY & 0x40000000  # user, net


def test_as_an_ordinary_user_without_namespaces_a_cluster_trains_restarts_and_leaves_nothing(learner):
    user, tmp = learner
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "KIT_"))}
    env.update(TMPDIR=tmp, KIT_VIEW="text", KIT_LEARNER_RUN="1", PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run([sys.executable, str(REPO / "tools" / "sandbox.py"), "--user", USER, "--no-namespaces",
                          "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--rootdir", str(REPO), str(REPO / "tests" / "learner")],
                         cwd=tmp, env=env, capture_output=True, text=True, timeout=540)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and re.search(r"\b4 passed\b", summary), run.stdout[-6000:] + run.stderr[-3000:]
    leftover = subprocess.run(["pgrep", "-u", USER, "-f", "ipyparallel|kit.core"], capture_output=True, text=True)
    assert not leftover.stdout.strip(), f"processes of {USER} left: {leftover.stdout}"


def test_a_file_of_roots_is_handed_over_to_the_user_as_a_copy_in_its_place(learner, tmp_path):
    """A kernel's connection file lies in root's 0700 runtime folder: tools/binder_cgroup.py --as-user has the
    sandbox copy it into a folder of the user's and give the command the copy's path."""
    user, tmp = learner
    secret = tmp_path / "kernel-1.json"
    secret.write_text('{"key": "k"}')
    secret.chmod(0o600)
    into = os.path.join(tmp, "connections")
    os.mkdir(into, 0o700)
    os.chown(into, user.pw_uid, user.pw_gid)
    shown = subprocess.run([sys.executable, str(REPO / "tools" / "sandbox.py"), "--user", USER, "--no-namespaces",
                            "--hand-over", str(secret), "--into", into, "--", "cat", str(secret)],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout == '{"key": "k"}', f"expected the copy read as {USER}: {shown}"
    copy = os.stat(os.path.join(into, secret.name))
    assert (copy.st_uid, copy.st_mode & 0o777) == (user.pw_uid, 0o600), "expected the copy the user's own, 0600"
