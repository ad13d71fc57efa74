"""What a learner reads in each numbered notebook, counted; and the checks moved out of the way.

A notebook's *checks* (the ``assert`` lines that prove what its text claims) run in cells whose input
JupyterLab shows collapsed: ``"jupyter": {"source_hidden": true}`` in the cell's metadata, and the tag
``check``. Such a cell runs like any other (nbval, papermill, "Run All"), prints one line of what it
confirmed, and defines nothing a later cell uses, so a learner who runs only the visible cells still gets
every result. Why this mechanism: docs/architecture.md, "Checks in the notebooks".

    python tools/reading.py                 # the counts of every numbered notebook, as a table
    python tools/reading.py --hide-checks   # collapse the pure check cells, split off trailing checks
    python tools/reading.py notebooks/04-dataset-sharding.ipynb   # one notebook (with or without --hide-checks)

Counted per notebook (:func:`counts`): visible code lines (every line, blank ones too, of code cells whose
input is not collapsed), TensorFlow lines among them (:data:`TENSORFLOW`), visible ``assert`` lines, checks (``assert``
lines anywhere), and the longest visible code cell.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"

#: A line that touches TensorFlow, a strategy, a model or Horovod.
TENSORFLOW = re.compile(r"\btf\.|\bstrategy\b|\bmodel\b|\bmodel\.|\bhvd\.|\bkeras\b")
#: The tag and metadata of a check cell.
CHECK_TAG = "check"
#: The targets of issue 26 for each numbered notebook at its defaults.
TARGETS = {"code_lines": 200, "longest_cell": 25, "visible_asserts": 5}


def source(cell: dict[str, Any]) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def is_hidden(cell: dict[str, Any]) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _is_assert(line: str) -> bool:
    return line.lstrip().startswith("assert ") or line.lstrip().startswith("assert(")


def counts(path: Path) -> dict[str, int]:
    """The reading counts of one notebook (see the module docstring)."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    visible = [source(c).rstrip("\n").splitlines() for c in cells if not is_hidden(c)]  # blank lines count:
    every = [source(c).splitlines() for c in cells]                      # they take room on the page too
    return {
        "code_lines": sum(len(lines) for lines in visible),
        "tensorflow_lines": sum(1 for lines in visible for line in lines if TENSORFLOW.search(line)),
        "visible_asserts": sum(1 for lines in visible for line in lines if _is_assert(line)),
        "checks": sum(1 for lines in every for line in lines if _is_assert(line)),
        "longest_cell": max((len(lines) for lines in visible), default=0),
    }


# ----- moving checks out of the way -------------------------------------------------------------
def _stored(nodes: list[ast.stmt]) -> set[str]:
    """Names these statements bind at the notebook's top level (not inside functions or classes)."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return names


def _loaded(texts: list[str]) -> set[str]:
    """Names these cells read from earlier cells: read, and not bound in the same cell first (loop and
    comprehension variables, function arguments, a cell's own assignments)."""
    used: set[str] = set()
    for text in texts:
        try:
            tree = ast.parse(text)
        except SyntaxError:  # IPython magics: count every word as used
            used |= set(re.findall(r"[A-Za-z_]\w*", text))
            continue
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        bound |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
        used |= read - bound
    return used


def _is_print(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "print")


#: Calls that make a step of the lesson (run on the cluster, train, start or stop something), never a check.
LESSON_CALLS = {"run", "fit", "start", "stop", "restart", "kill", "evaluate", "predict"}


def _runs_lesson(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in LESSON_CALLS
               for n in ast.walk(node))


def _computes_only(node: ast.stmt) -> bool:
    """An assignment that computes from results, without running anything on the cluster."""
    return isinstance(node, (ast.Assign, ast.AugAssign)) and not _runs_lesson(node)


def _checks_only(node: ast.stmt) -> bool:
    """An assert, a print, or a loop/branch/assignment in service of asserts, none running a lesson step."""
    if _runs_lesson(node):
        return False
    if isinstance(node, (ast.Assert, ast.Pass)) or _is_print(node):
        return True
    if isinstance(node, (ast.For, ast.If)):
        body = node.body + node.orelse
        return any(isinstance(n, ast.Assert) or _contains_assert(n) for n in body) and all(
            _checks_only(n) or _computes_only(n) for n in body)
    return _computes_only(node)


def _contains_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def check_tail(text: str) -> int | None:
    """The line (0-based) where a cell's trailing checks begin, or None: the statements from there on are
    asserts, prints and what serves them, with at least one assert; 0 means the whole cell is checks."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    body = tree.body
    start = len(body)
    while start > 0 and _checks_only(body[start - 1]):
        start -= 1
    tail = body[start:]
    if not tail or not any(_contains_assert(n) for n in tail):
        return None
    if start > 0:
        before = body[start - 1]
        # the lesson part would end with a bare expression and start displaying it: keep the cell whole
        if isinstance(before, ast.Expr) and not _is_print(before):
            return None
    return 0 if start == 0 else tail[0].lineno - 1


def _as_source(lines: list[str]) -> list[str]:
    return "".join(lines).rstrip("\n").splitlines(keepends=True)


def _check_cell(lines: list[str], metadata: dict[str, Any], cell_id: str | None = None) -> dict[str, Any]:
    tags = [t for t in metadata.get("tags", []) if t != "parameters"]
    meta = {**{k: v for k, v in metadata.items() if k not in ("tags", "jupyter")},
            "jupyter": {"source_hidden": True}, "tags": sorted(set(tags) | {CHECK_TAG})}
    return {"cell_type": "code", "execution_count": None, "id": cell_id or uuid.uuid4().hex[:8], "metadata": meta,
            "outputs": [], "source": _as_source(lines)}


def hide_checks(notebook: dict[str, Any]) -> int:
    """Collapse every check cell of ``notebook`` (in place) and split trailing checks off lesson cells,
    where nothing they bind is used by a later cell; return how many check cells it now has."""
    cells = notebook["cells"]
    out: list[dict[str, Any]] = []
    for index, cell in enumerate(cells):
        text = source(cell)
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "parameters" in tags or is_hidden(cell):
            out.append(cell)
            continue
        at = check_tail(text)
        if at is None:
            out.append(cell)
            continue
        lines = text.splitlines(keepends=True)
        check_lines = lines[at:]
        later = [source(c) for c in cells[index + 1:] if c["cell_type"] == "code"]
        if _stored(ast.parse("".join(check_lines)).body) & _loaded(later):
            out.append(cell)  # a later cell uses what the checks bind: they stay where they are
            continue
        if at > 0:
            lesson = {**cell, "source": _as_source(lines[:at])}
            out.append(lesson)
            out.append(_check_cell(check_lines, {}))
        else:
            out.append(_check_cell(check_lines, cell.get("metadata", {}), cell.get("id")))
    notebook["cells"] = out
    return sum(1 for c in out if CHECK_TAG in c.get("metadata", {}).get("tags", []))


def numbered(notebooks_dir: Path = NOTEBOOKS) -> list[Path]:
    return sorted(notebooks_dir.glob("[0-9][0-9]*-*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hide-checks", action="store_true",
                        help="collapse the check cells of the notebooks (rewrites them)")
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="the notebooks to count or rewrite (default: every numbered notebook)")
    args = parser.parse_args(argv)
    chosen = [path.resolve() for path in args.notebooks] or numbered()
    for path in chosen:
        if args.hide_checks:
            notebook = json.loads(path.read_text())
            hidden = hide_checks(notebook)
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
            print(f"{path.name}: {hidden} check cells")
    print("| notebook | code lines | TensorFlow lines | visible asserts | checks | longest cell |")
    for path in chosen:
        c = counts(path)
        print(f"| {path.stem.split('-')[0]} | {c['code_lines']} | {c['tensorflow_lines']} | {c['visible_asserts']} | "
              f"{c['checks']} | {c['longest_cell']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
