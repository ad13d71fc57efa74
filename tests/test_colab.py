"""Colab: every notebook opens there from its link and installs what it lacks in its first code cell (tools/colab.py
writes both from pyproject's [project.urls]); and Colab emulated: a Python 3.13 venv holding the versions Colab's
runtime ships, run as root with new namespaces refused (as in Colab's container), where the first cell installs
the kit from its wheel and notebooks 01, 05 and 12 then run through papermill and leave no process.

What the emulation cannot show: Colab's own front end (its rendering, its widget manager for ipywidgets 7.7) and
its kernel's own start-up imports (google.colab's); here the kernel is ipykernel 6.17.1, Colab's version."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import pythons
from kit.tools import install

sys.path.insert(0, str(pythons.REPO / "tools"))
import colab  # noqa: E402  (tools/colab.py)

#: Colab's runtime since its move to Python 3.13 (googlecolab/colabtools#6081, 2026-08-25), as its backend-info
#: repository's pip-freeze.txt lists it (commit a724079 "Upgrade to Python 3.13", 2026-08-19)
COLAB = {"python": "3.13", "tensorflow": "2.20.0", "keras": "3.13.2", "jax": "0.7.2", "jaxlib": "0.7.2",
         "tf-keras": "2.20.1", "ipywidgets": "7.7.1", "ipykernel": "6.17.1", "jupyter-client": "7.4.9",
         "tornado": "6.5.7", "pyzmq": "26.2.1", "psutil": "5.9.5", "numpy": "2.1.3", "pandas": "2.2.3",
         "ipyparallel": "8.8.0", "papermill": None, "packaging": None}
RECORD = pythons.REPO / "out" / "colab-emulation.json"


def test_every_notebook_has_its_colab_link_and_install_cell_from_pyproject():
    for path in colab.NOTEBOOKS:
        notebook = json.loads(path.read_text())
        assert colab.with_colab_cells(notebook, path.name) == notebook, \
            f"{path.name}: its Colab link or install cell differs from tools/colab.py's: run make badges"
        title = "".join(notebook["cells"][0]["source"])
        assert f"({colab.colab_url(path.name)})" in title, path.name
        assert notebook["cells"][1]["id"] == colab.INSTALL_ID, f"{path.name}: the install cell is not the first code cell"
    readme = (pythons.REPO / "README.md").read_text()
    assert colab.readme_links(readme) == readme, "README.md's Colab links are out of date: run make badges"


def test_the_wheel_carries_a_lock_for_every_supported_python():
    for minor in (11, 12, 13):
        lock = install.lock_path((3, minor))
        assert lock is not None and "tensorflow==" in lock.read_text(), f"no lock for Python 3.{minor} in kit.locks"
    assert install.lock_path((3, 9)) is None


def test_the_install_keeps_what_the_kernel_loaded_where_the_kits_range_admits_it(monkeypatch):
    from packaging.requirements import Requirement

    monkeypatch.setattr(install, "installed", {"ipywidgets": "7.7.1"}.get)
    requirements = [Requirement("psutil>=7.0"), Requirement("ipykernel>=6.17"), Requirement("ipywidgets>=7.7")]
    keep = install.kept(requirements, {"ipykernel": "6.17.1", "pyzmq": "26.2.1", "psutil": "5.9.5"})
    assert keep == {"ipykernel": "6.17.1", "pyzmq": "26.2.1", "ipywidgets": "7.7.1"}, keep  # psutil: out of range
    text = install.constraints({"ipykernel": "7.4.0", "psutil": "7.2.2", "tensorflow": "2.21.0"}, keep)
    assert install.pins(text) == {"ipykernel": "6.17.1", "ipywidgets": "7.7.1", "psutil": "7.2.2", "pyzmq": "26.2.1",
                                  "tensorflow": "2.21.0"}, text


def namespaces_refused() -> list[str]:
    """A prefix that runs a command as root with new namespaces refused (tools/sandbox.py's seccomp filter)."""
    code = ("import os, sys; sys.path.insert(0, %r); import sandbox; sandbox.refuse_namespaces(); "
            "os.execv(sys.argv[1], sys.argv[1:])" % str(pythons.REPO / "tools"))
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_colab_emulated_the_first_cell_installs_the_kit_then_01_05_and_12_pass(tmp_path, request):
    import os

    if os.geteuid() != 0:
        reason = "the emulation runs as root, as Colab's container does. Fix: run it as root (CI does)"
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)
    wheel = request.getfixturevalue("kit_wheel")  # after the check above: no build for a test that skips
    python = pythons.make_venv(pythons.interpreter(COLAB["python"]), tmp_path / "colab")
    prefill = [f"{name}=={version}" if version else name for name, version in COLAB.items() if name != "python"]
    offline = pythons.wheels(str(python), *prefill)  # Colab's set and the lock's, on disk: pip needs no network
    pythons.run([str(python), "-m", "pip", "install", "--quiet", *prefill], 900, "the emulated Colab runtime's install",
                env={**os.environ, **offline})
    site = pythons.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 60, "site")
    colab_package = Path(site.stdout.strip()) / "google" / "colab"  # what kit.tools.install.in_colab() looks for
    colab_package.mkdir(parents=True)
    (colab_package / "__init__.py").write_text('"""Stands in for Colab\'s google.colab (tests/test_colab.py)."""\n')
    record: dict = {"colab": COLAB, "notebooks": {}}

    # the first cell, as the learner's first run of notebook 01 has it, with the wheel for the repository's address
    first = json.loads(pythons.notebook("01").read_text())
    cell = first["cells"][1]
    cell["source"] = [line.replace(colab.install_source(), f"kit @ {wheel.as_uri()}") for line in cell["source"]]
    (tmp_path / "first-cell.ipynb").write_text(json.dumps({**first, "cells": [cell]}))
    started = time.monotonic()
    executed = pythons.papermill(python, tmp_path / "first-cell.ipynb", tmp_path / "first-cell-run.ipynb", 900,
                                 prefix=namespaces_refused(), env=offline)
    record["install_cell_seconds"] = round(time.monotonic() - started, 1)
    said = pythons.outputs(executed)
    record["install_cell_said"] = said[-2000:]
    assert "No restart needed" in said, f"expected no restart: the kit takes what Colab's kernel has loaded:\n{said}"
    assert "Working in" in said and (tmp_path / "kit-lessons" / "notebooks" / "figures").is_dir() and \
        (tmp_path / "kit-lessons" / "docs" / "profiles").is_dir(), f"expected the lessons' folder copied:\n{said}"
    versions = pythons.run([str(python), "-c", "import importlib.metadata as m; print(*(m.version(p) for p in "
                            "('tensorflow', 'keras', 'jax', 'ipykernel', 'ipywidgets', 'psutil')))"], 60,
                           "versions").stdout.split()
    lock = install.pins((pythons.REPO / "locks" / "py3.13.txt").read_text())
    assert versions == [lock["tensorflow"], lock["keras"], lock["jax"], "6.17.1", "7.7.1", "5.9.5"], \
        f"expected the lock's TensorFlow, Keras and JAX, and Colab's kernel, widgets and psutil kept: {versions}"
    record["versions_after"] = dict(zip(("tensorflow", "keras", "jax", "ipykernel", "ipywidgets", "psutil"), versions))
    pythons.no_process_left(python.parent.parent)

    for stem in ("01", "05", "12"):
        started = time.monotonic()
        executed = pythons.papermill(python, pythons.notebook(stem), tmp_path / f"{stem}.ipynb", 900,
                                     prefix=namespaces_refused())
        errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
        record["notebooks"][stem] = {"seconds": round(time.monotonic() - started, 1), "errors": len(errors)}
        assert not errors, f"notebook {stem} on the emulated Colab: {errors}"
        pythons.no_process_left(python.parent.parent)
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "install_cell_said"}))
