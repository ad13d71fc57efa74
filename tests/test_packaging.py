"""The project's files agree with each other: pins, Binder copy, notebooks without outputs."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def pyproject_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    return dict(spec.split("==") for spec in specs)


def environment_pins(path):
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"\s+- ([A-Za-z0-9_.-]+)==([^\s#]+)", line)
        if match:
            pins[match[1]] = match[2]
    return pins


def test_every_dependency_is_pinned_exactly():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        assert "==" in spec, f"{spec} is not pinned"


def test_environment_yml_lists_the_same_pins_as_pyproject():
    assert environment_pins(REPO / "environment.yml") == pyproject_pins()


def test_binder_environment_is_the_root_one():
    assert (REPO / "binder" / "environment.yml").read_text() == (REPO / "environment.yml").read_text()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean_with_a_parameters_cell(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert not [c for c in code if c.get("outputs") or c.get("execution_count")], "outputs committed"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith(f"# {path.name[:2]}"), "the title carries the notebook's number"
    assert "What you will learn" in first
    assert "## What you saw" in "".join(nb["cells"][-1]["source"])


def test_a_hung_test_fails_within_its_time_bound(tmp_path):
    """pytest-timeout bounds every test (pyproject: timeout); a hang is a failure that names the test."""
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"] > 0
    (tmp_path / "test_hang.py").write_text("import threading\n\ndef test_hangs():\n    threading.Event().wait()\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                             str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=2",
                             str(tmp_path / "test_hang.py")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Timeout" in result.stdout and "test_hangs" in result.stdout, result.stdout
