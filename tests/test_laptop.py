"""A learner's laptop: `make demo` in a fresh clone needs Python with pip and venv, nothing else. Run as an ordinary
user (no root, no apt), with cmake and the C/C++ compilers hidden: nothing may build (Horovod is `make horovod`'s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pythons
from conftest import LEARNER, REPO

pytestmark = pytest.mark.slow
HIDDEN = ("cmake", "g++", "gcc", "cc", "c++", "clang", "clang++")


def test_make_demo_passes_in_a_fresh_clone_as_an_ordinary_user_without_cmake_or_a_compiler(learner):
    import sandbox  # tools/sandbox.py, which the fixture put on the path

    user, tmp = learner
    clone = Path(tmp) / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    stubs = Path(tmp) / "hidden"
    stubs.mkdir()
    for name in HIDDEN:
        (stubs / name).write_text(f"#!/bin/sh\necho '{name}: hidden by tests/test_laptop.py' >&2\nexit 127\n")
        (stubs / name).chmod(0o755)
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", tmp], check=True, timeout=60)
    python = os.path.realpath(sys.executable)  # the base interpreter of this venv, which the learner's user may run
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "KIT_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{stubs}:{os.path.dirname(python)}:/usr/bin:/bin", TMPDIR=tmp, KIT_VIEW="text",
               XDG_CACHE_HOME=f"{tmp}/cache", **pythons.wheels(python))  # the lock's wheels, from disk
    folders = sandbox.grant_reach(LEARNER, env["PIP_FIND_LINKS"])  # the user may reach them under /root
    try:
        done = pythons.run([sys.executable, str(REPO / "tools" / "sandbox.py"), "--user", LEARNER, "--", "make", "-C",
                            str(clone), f"PYTHON={python}", "demo"], 1200, f"make demo as {LEARNER}", cwd=tmp, env=env)
    finally:
        sandbox.revoke_reach(LEARNER, folders)
    assert "hidden by tests/test_laptop.py" not in done.stderr, "something tried to build: " + done.stderr[-3000:]
    assert not (clone / ".venv" / ".installed-horovod").exists() and list((clone / "out").glob("*.ipynb"))
    leftover = subprocess.run(["pgrep", "-u", LEARNER, "-f", "ipyparallel|kit.core"], capture_output=True, text=True)
    assert not leftover.stdout.strip(), f"processes of {LEARNER} left: {leftover.stdout}"
