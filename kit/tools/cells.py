"""Run the code cells of another notebook that carry a tag: one copy of a lesson's functions.

A trial notebook (one point of a sweep) trains with the functions its lesson defines in cells, instead of
a copy of them:

    kit.tools.cells.run_tagged("../08-scaling-experiments.ipynb", "training", globals())

runs, in order, every code cell of notebook 08 tagged ``training`` in the caller's namespace, so an edit
saved in the lesson is what the next sweep runs. Each cell is compiled under a name of its own whose
source goes into :mod:`linecache` as IPython keeps a cell's, so ``inspect.getsource`` works for the
functions it defines, here and on the engines a run sends them to (AutoGraph needs it for a
``tf.function``). The cells must only define (functions, constants): they run without the rest of the
lesson.
"""

from __future__ import annotations

import json
import linecache
import os
from pathlib import Path
from typing import Any

from ..core.errors import KitError


def tagged_cells(notebook: str | os.PathLike, tag: str) -> list[dict[str, Any]]:
    """The code cells of ``notebook`` tagged ``tag``, in order (each a dict with ``id`` and ``source``)."""
    path = Path(notebook)
    if not path.is_file():
        raise KitError(f"{path} does not exist (looked from {Path.cwd()})",
                       fix="give the lesson notebook's path relative to this notebook's folder")
    cells = []
    for n, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code" and tag in cell.get("metadata", {}).get("tags", []):
            text = cell["source"]
            cells.append({"id": cell.get("id", str(n)), "source": "".join(text) if isinstance(text, list) else text})
    if not cells:
        raise KitError(f"{path.name} has no code cell tagged {tag!r}",
                       fix=f"tag the cells to share with {tag!r} (cell metadata: \"tags\": [{tag!r}])")
    return cells


def run_tagged(notebook: str | os.PathLike, tag: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the code cells of ``notebook`` tagged ``tag`` in ``namespace`` (a new one if None); return it.

    A new namespace is a ``__main__`` one, like a notebook's, so that cloudpickle sends its functions by
    value to the engines.
    """
    namespace = {"__name__": "__main__"} if namespace is None else namespace
    for cell in tagged_cells(notebook, tag):
        name = f"<{Path(notebook).name} cell {cell['id']}>"
        lines = cell["source"].splitlines(keepends=True)
        linecache.cache[name] = (len(cell["source"]), None, lines, name)   # as IPython keeps a cell's source
        exec(compile(cell["source"], name, "exec"), namespace)
    return namespace


def lesson(name: str, tag: str = "lesson") -> dict[str, Any]:
    """The functions of the cells tagged ``tag`` (``lesson``: its ``main.py``) of the kit's notebook ``name`` (e.g.
    ``01-single-vs-multi-worker``), run as :func:`run_tagged` runs them, so that a run sends them to the engines by
    value. What the cells set in ``os.environ`` (which Keras) stays in them: a cluster's ``keras`` option decides
    on its tasks. The benchmark, ``kit compat``, the fault trials and the tests train with these."""
    from .export import notebooks_dir

    kept = dict(os.environ)
    try:
        return run_tagged(notebooks_dir() / f"{name}.ipynb", tag)
    finally:  # only what the cells changed: the environment is never empty for the kernel's other threads
        for key in set(os.environ) - set(kept):
            del os.environ[key]
        os.environ.update({key: value for key, value in kept.items() if os.environ.get(key) != value})
