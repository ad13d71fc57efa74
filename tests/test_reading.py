"""tools/reading.py: the checks of the notebooks sit in collapsed cells that a learner can skip."""

import ast
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_tool():
    sys.path.insert(0, str(REPO / "tools"))
    spec = importlib.util.spec_from_file_location("reading", REPO / "tools" / "reading.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reading = load_tool()


def notebook(*sources):
    return {"cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "outputs": [], "execution_count": None,
                       "source": s} for i, s in enumerate(sources)], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def hidden(cell):
    return reading.is_hidden(cell) and reading.CHECK_TAG in cell["metadata"]["tags"]


def test_a_pure_check_cell_is_collapsed_and_keeps_its_id():
    nb = notebook("x = 1\n", "assert x == 1\nprint('checked: x is 1')\n")
    assert reading.hide_checks(nb) == 1
    assert not hidden(nb["cells"][0]) and hidden(nb["cells"][1]) and nb["cells"][1]["id"] == "c1"


def test_trailing_checks_are_split_off_the_lesson_cell():
    nb = notebook("result = cluster.run(train)\ntotal = sum(result)\nassert total == 3\nprint('checked')\n")
    assert reading.hide_checks(nb) == 1
    lesson, check = nb["cells"]
    assert "".join(lesson["source"]) == "result = cluster.run(train)" and not reading.is_hidden(lesson)
    assert "".join(check["source"]).startswith("total = sum(result)\nassert total == 3") and hidden(check)


def test_what_stays_in_view():
    nb = notebook(
        "table = 3\nassert table\n",                    # binds nothing new, but...
        "limit = table * 2\nassert limit == 6\n",        # ...binds `limit`, which the next cell reads
        "print(limit)\n",
        "for r in cluster.run(f):\n    assert r\n",     # runs on the cluster: a step of the lesson
        "frame = make()\nframe\nassert frame\n",         # the lesson part would start displaying `frame`
    )
    reading.hide_checks(nb)
    shown = ["".join(c["source"]) for c in nb["cells"] if not reading.is_hidden(c)]
    assert "limit = table * 2\nassert limit == 6\n" in shown
    assert "for r in cluster.run(f):\n    assert r\n" in shown
    assert "frame = make()\nframe\nassert frame\n" in shown


def test_counts_leave_collapsed_cells_out_of_what_is_shown(tmp_path):
    nb = notebook("import tensorflow as tf\nx = tf.constant(1)\n", "assert x == 1\nassert x > 0\n")
    reading.hide_checks(nb)
    path = tmp_path / "00-x.ipynb"
    path.write_text(json.dumps(nb))
    assert reading.counts(path) == {"code_lines": 2, "tensorflow_lines": 1, "visible_asserts": 0, "checks": 2,
                                    "longest_cell": 2}


def test_every_check_of_the_notebooks_is_collapsed_prints_and_is_not_needed_later():
    for path in reading.numbered():
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        for i, cell in enumerate(code):
            if reading.CHECK_TAG not in cell["metadata"].get("tags", []):
                continue
            text = reading.source(cell)
            where = f"{path.name}, check cell {cell['id']}"
            assert reading.is_hidden(cell), f"{where}: not collapsed"
            assert "assert" in text and "print(" in text, f"{where}: no assert, or no line saying what it confirmed"
            assert not reading._runs_lesson(ast.parse(text)), f"{where}: runs a step of the lesson"  # noqa: SLF001
            bound = reading._stored(ast.parse(text).body)  # noqa: SLF001 - the tool's own rule, under test
            later = reading._loaded([reading.source(c) for c in code[i + 1:]])  # noqa: SLF001
            assert not bound & later, f"{where}: a later cell reads {bound & later}, so it cannot be skipped"


def test_no_check_is_left_in_view_that_the_tool_would_collapse():
    for path in reading.numbered():
        nb = json.loads(path.read_text())
        before = json.dumps(nb["cells"])
        reading.hide_checks(nb)
        assert json.dumps(nb["cells"]) == before, f"{path.name}: run python tools/reading.py --hide-checks"


def _marked_processes(mark: str) -> set[int]:
    """The live processes whose environment carries ``KIT_TEST_MARK=mark`` (what this test's kernel started,
    not what other runs on the machine did)."""
    import psutil

    found = set()
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KIT_TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:
            continue  # gone, or not ours to read
    return found


@pytest.mark.slow  # notebook 04 up to its first check: a cluster and one step, ~15 s
def test_a_collapsed_check_runs_and_a_broken_claim_fails_the_notebook(tmp_path, monkeypatch):
    """The checks are alive: notebook 04 with its first (collapsed) check negated fails there, under papermill
    as under nbval, and the cluster the notebook started goes with its kernel."""
    import papermill

    from kit.tools.experiments import ipc_kernels

    nb = json.loads((REPO / "notebooks" / "04-dataset-sharding.ipynb").read_text())
    first = next(c for c in nb["cells"] if reading.CHECK_TAG in c["metadata"].get("tags", []))
    assert reading.is_hidden(first)
    tree = ast.parse(reading.source(first))
    claim = next(node for node in tree.body if isinstance(node, ast.Assert))
    claim.test = ast.UnaryOp(op=ast.Not(), operand=claim.test)  # the premise, broken
    first["source"] = ast.unparse(tree)
    broken, executed = tmp_path / "04-broken.ipynb", tmp_path / "04-executed.ipynb"
    broken.write_text(json.dumps(nb))
    mark = tmp_path.name
    monkeypatch.setenv("KIT_TEST_MARK", mark)  # the kernel inherits it, and the engines it starts
    with ipc_kernels() as kernels, pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(str(broken), str(executed), parameters={"OUT_DIR": str(tmp_path / "out")},
                                   cwd=str(REPO / "notebooks"), kernel_name="python3", progress_bar=False,
                                   **kernels)
    assert info.value.ename == "AssertionError"
    failed = [c for c in json.loads(executed.read_text())["cells"]
              if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert len(failed) == 1 and reading.CHECK_TAG in failed[0]["metadata"]["tags"]
    deadline = time.monotonic() + 20
    while _marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _marked_processes(mark), "the notebook's kernel or cluster outlived the run"
