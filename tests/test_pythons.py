"""The smoke tier on the supported Pythons the full suite does not run on (it runs on 3.11, make's default here):
the built wheel into a fresh venv with that Python's lock, `kit demo --epochs 1` (notebook 01 through papermill),
notebook 12 through papermill, notebook 01's exported main.py as two plain processes, and tests/test_keras_jax.py on that Python's JAX
(0.12 and later). Strict in CI (a missing Python fails)."""

from __future__ import annotations

import os

import pytest

import pythons
import take_home

pytestmark = pytest.mark.slow
OTHERS = ["3.12", "3.13"]


@pytest.fixture(scope="module", params=OTHERS)
def venv(request, kit_wheel, tmp_path_factory):
    """A fresh venv of that Python with the kit from the wheel and the lock of that Python."""
    version = request.param
    python = pythons.make_venv(pythons.interpreter(version), tmp_path_factory.mktemp(f"py{version}") / "venv")
    pythons.run([str(python), "-m", "pip", "install", "--quiet", "-c", str(pythons.REPO / "locks" / f"py{version}.txt"),
                 str(kit_wheel)], 900, f"pip install of the kit's wheel on Python {version}",
                env={**os.environ, **pythons.wheels(str(python))})
    yield python
    pythons.no_process_left(python.parent.parent)


def test_the_venv_has_the_locked_versions(venv):
    """What the venv has is what its Python's lock says (the venvs here are Pythons 3.12 and 3.13: JAX 0.12 or later)."""
    done = pythons.run([str(venv), "-c", "import sys, importlib.metadata as m; print(*sys.version_info[:2], "
                        "m.version('jax'), m.version('tensorflow'))"], 60, "version check")
    major, minor, jax, tensorflow = done.stdout.split()
    locked = (pythons.REPO / "locks" / f"py{major}.{minor}.txt").read_text()
    assert f"\njax=={jax}\n" in locked and f"\ntensorflow=={tensorflow}\n" in locked, \
        f"expected the lock's JAX and TensorFlow in the venv of Python {major}.{minor}, got {jax} and {tensorflow}"
    assert tuple(map(int, jax.split(".")[:2])) >= (0, 12), f"expected JAX >= 0.12 on Python {major}.{minor}, got {jax}"


def test_kit_demo_passes(venv, tmp_path):
    pythons.run([str(venv.parent / "kit"), "demo", "--epochs", "1", "--out", str(tmp_path / "demo")], 600,
                f"kit demo on {venv}", cwd=tmp_path)
    assert list((tmp_path / "demo").glob("*.ipynb")), f"kit demo wrote no executed notebook in {tmp_path / 'demo'}"
    pythons.no_process_left(venv.parent.parent)


def test_notebook_12_runs_through_papermill(venv, tmp_path):
    """Keras 3 on JAX with this Python's JAX (01 ran in kit demo)."""
    executed = pythons.papermill(venv, pythons.notebook("12"), tmp_path / "12.ipynb", 900)
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    pythons.no_process_left(venv.parent.parent)


def test_the_exported_lesson_01_trains_as_two_plain_processes(venv, tmp_path):
    script = take_home.export("01-single-vs-multi-worker", tmp_path)
    results = take_home.run_tasks(script, {"worker": 2}, ["--epochs", "1", "--steps-per-epoch", "5", "--mnist-path",
                                                          take_home.MNIST], python=str(venv))
    assert [len(r["loss"]) for r in results] == [1, 1], f"expected 1 epoch of history per worker, got {results}"
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], rel=1e-5), f"expected equal losses: {results}"


def test_the_keras_on_jax_tests_pass_on_this_pythons_jax(venv, tmp_path):
    """tests/test_keras_jax.py (kit.JaxCluster, notebook 12's exported lesson) with this venv's JAX (0.12 and later on
    Python 3.12 and 3.13), the kit imported from the wheel (the folder it runs in is not the checkout)."""
    version = pythons.run([str(venv), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], 60,
                          "version").stdout.strip()
    pythons.run([str(venv), "-m", "pip", "install", "--quiet", "-c", str(pythons.REPO / "locks" / f"py{version}.txt"),
                 "pytest", "pytest-timeout"], 600, f"pytest into the Python {version} venv",
                env={**os.environ, **pythons.wheels(str(venv))})
    done = pythons.run([str(venv), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(pythons.REPO),
                        str(pythons.REPO / "tests" / "test_keras_jax.py")], 1200, f"tests/test_keras_jax.py on {version}",
                       cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST")})
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-3000:]
