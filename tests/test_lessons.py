"""Every training notebook's workers run a plain lesson that exports as a script a learner takes home."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from kit.tools import export

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"

# ----- every training notebook: its workers run a plain lesson that exports ---------------------------------
#: The notebooks that train: every one of them teaches a script a learner can take home.
TRAINING = ["01", "03", "03b", "04", "05", "06", "07", "08", "09", "09b", "10", "10b", "11", "12"]
NOT_YET = ()
#: Callables of the kit that a notebook may run on its tasks: plumbing, not a lesson (start plain processes,
#: pick ports, list addresses), each named here with its reason.
KIT_PLUMBING = {"kit.launch", "kit.free_ports", "kit.core.horovod.listening_addresses",
                "kit.core.horovod.run_horovodrun",
                # keeps a lesson's server (07's start_server) serving beside the engine, where a script would join()
                "kit.train.ps.serve", "ps.serve"}


def _notebook(number: str) -> tuple[str, dict]:
    (path,) = [p for p in NOTEBOOKS.glob(f"{number}-*.ipynb")]
    return path.name, json.loads(path.read_text())


def _functions(nb: dict) -> dict[str, ast.FunctionDef]:
    """Every function a notebook's code cells define at their top level, by name (the last definition wins)."""
    found = {}
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and not source.startswith("%%"):
            plain = "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines())
            found.update({n.name: n for n in ast.parse(plain).body if isinstance(n, ast.FunctionDef)})
    return found


def _cluster_runs(nb: dict) -> list[ast.Call]:
    """The ``<something>.run(fn, ...)`` calls of the notebook's cells outside any function (the cluster's runs; a
    ``strategy.run`` inside the lesson's code is TensorFlow's)."""
    calls = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "run"
                    and child.args and isinstance(child.args[0], (ast.Name, ast.Attribute))
                    and ast.unparse(child.func.value) != "subprocess"):
                calls.append(child)
            visit(child)

    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and not source.startswith("%%"):
            visit(ast.parse("\n".join("" if line.lstrip().startswith(("!", "%")) else line
                                      for line in source.splitlines())))
    return calls


def _shipped_with(name: str, functions: dict[str, ast.FunctionDef]) -> set[str]:
    """``name`` and the notebook's functions it calls, and theirs: what cloudpickle sends to the tasks with it."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in functions:
            continue
        seen.add(current)
        todo += [n.id for n in ast.walk(functions[current]) if isinstance(n, ast.Name) and n.id in functions]
    return seen


@pytest.mark.parametrize("number", TRAINING)
def test_every_function_a_training_notebook_runs_on_its_tasks_is_plain(number):
    """What the workers run (and every notebook function it calls) is code a learner's script could hold: no kit, no
    KIT_ variable, no private attribute; the lesson's own cells are the script `kit export` writes."""
    name, nb = _notebook(number)
    sources = export.lesson_cells(nb)
    assert sources, f"{name}: no cell is tagged 'lesson'"
    assert export.check_lesson(name, sources) == []
    functions = _functions(nb)
    shipped = {ast.unparse(call.args[0]) for call in _cluster_runs(nb)}
    strays = sorted(s for s in shipped if s not in functions and s not in KIT_PLUMBING)
    assert not strays, (f"{name} runs {strays} on its tasks, which the notebook does not define: the workers run "
                        "the notebook's own plain code (or the kit's plumbing, listed in KIT_PLUMBING with its reason)")
    for function in sorted(s for s in shipped if s in functions):
        for part in sorted(_shipped_with(function, functions)):
            code = ast.unparse(functions[part])
            assert export.check_lesson(name, [code]) == [], f"{name}: {part} (run on the tasks through {function})"


@pytest.mark.parametrize("number", TRAINING)
def test_every_training_notebook_exports_a_script_that_parses_and_imports_no_kit(number, tmp_path):
    name, nb = _notebook(number)
    text, _ = export.script(nb, name)
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "kit" not in imported
    assert "def load_mnist(path=None):" in text or "mnist" not in text.lower(), (
        f"{name}: the lesson reads MNIST without the shared loader load_mnist(path=None)")


# ----- what a learner reads ------------------------------------------------------------------------------------
ALL = [p for p in sorted(NOTEBOOKS.glob("[0-9][0-9]*-*.ipynb")) if not p.name.startswith(NOT_YET)]
#: Words a learner never met: the kit's own history ("the seeds"), test tooling, the repository's bookkeeping,
#: and evidence a learner cannot see (the kit's performance notes). papermill stays where a lesson teaches it.
IN_HOUSE = re.compile(r"\bthe seeds\b|\bseeds'|\bnbval\b|\bcommitted\b|docs/performance\.md|performance notes", re.I)


def _visible_text(cell: dict) -> str:
    return "" if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden") else "".join(cell["source"])


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("[0-9][0-9]*-*.ipynb")), ids=lambda p: p.name[:3])
def test_what_a_learner_reads_has_no_in_house_words(path):
    nb = json.loads(path.read_text())
    hits = [(i, m.group(0)) for i, c in enumerate(nb["cells"]) for m in IN_HOUSE.finditer(_visible_text(c))]
    assert not hits, f"{path.name}: cells {hits}: name the source instead (TensorFlow's tutorial, Horovod's docs, ...)"


def test_the_notebooks_index_has_no_in_house_words():
    """notebooks/README.md is what a reader on GitHub meets first (tools/make_index.py writes its header)."""
    text = (NOTEBOOKS / "README.md").read_text()
    hits = [m.group(0) for m in IN_HOUSE.finditer(text)]
    assert not hits, f"notebooks/README.md says {hits}: name the source instead (tools/make_index.py's HEADER)"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name[:3])
def test_every_check_says_what_it_expected_and_what_it_measured(path):
    """A failed check in a learner's notebook shows a sentence, not a bare AssertionError."""
    nb = json.loads(path.read_text())
    bare = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        try:
            tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        bare += [f"cell {i} line {n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.msg is None]
    assert not bare, f"{path.name}: asserts without a message at {bare}"
