"""A notebook's exercises that run unattended, as its metadata lists them, and each applied to a copy of it.

``metadata["kit"]["exercises"]`` is a list of entries, one per such exercise:

    {"exercise": 3,                                          # its number under "## Exercises"
     "parameters": {"N_WORKERS": 3},                         # values for the parameters cell (optional)
     "edits": [{"cell": "<cell id>", "replace": "old text", "with": "new text"}],   # changes to cells (optional)
     "fails": "AssertionError"}                              # the error the exercise announces (optional)

An entry sets parameters, edits cells, or both. ``make exercises`` (tests/exercises/) runs each one; the
notebook's collapsed answer gives that run's numbers.
"""

from __future__ import annotations

import copy
import re
import json
from pathlib import Path
from typing import Any

KEY = "exercises"
FIELDS = {"exercise", "parameters", "edits", "fails"}


class ExerciseError(ValueError):
    pass


def listed(notebook: str | Path) -> list[dict[str, Any]]:
    """The notebook's runnable exercises, each checked for shape (the field and the fix on a bad one)."""
    path = Path(notebook)
    entries = json.loads(path.read_text()).get("metadata", {}).get("kit", {}).get(KEY, [])
    for entry in entries:
        where = f"{path.name}: metadata.kit.{KEY} entry {entry!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("exercise"), int):
            raise ExerciseError(f"{where} has no exercise number. Fix: add \"exercise\": <its number under "
                                "'## Exercises'>")
        if set(entry) - FIELDS:
            raise ExerciseError(f"{where} has unknown field(s) {sorted(set(entry) - FIELDS)}. Fix: use only "
                                f"{sorted(FIELDS)}")
        if not entry.get("parameters") and not entry.get("edits"):
            raise ExerciseError(f'{where} changes nothing. Fix: give "parameters": {{"NAME": value}} or '
                                '"edits": [{"cell": <id>, "replace": <text>, "with": <text>}]')
        for edit in entry.get("edits", []):
            if not isinstance(edit, dict) or set(edit) != {"cell", "replace", "with"}:
                raise ExerciseError(f'{where}: edit {edit!r} is not {{"cell": <id>, "replace": <text>, '
                                    '"with": <text>}. Fix: write it so')
    return entries


def edited(notebook: str | Path, entry: dict[str, Any]) -> dict[str, Any]:
    """The notebook with the entry's edits made; each ``replace`` must occur exactly once in its cell."""
    path = Path(notebook)
    nb = copy.deepcopy(json.loads(path.read_text()))
    cells = {cell.get("id"): cell for cell in nb["cells"]}
    for edit in entry.get("edits", []):
        cell = cells.get(edit["cell"])
        if cell is None:
            raise ExerciseError(f"{path.name} exercise {entry['exercise']}: no cell with id {edit['cell']!r}. "
                                "Fix: give the id of the cell the exercise changes")
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        found = source.count(edit["replace"])
        if found != 1:
            raise ExerciseError(f"{path.name} exercise {entry['exercise']}: {edit['replace']!r} occurs {found} "
                                f"times in cell {edit['cell']}. Fix: quote text that occurs there once")
        cell["source"] = source.replace(edit["replace"], edit["with"])
    return nb


#: A worked answer, collapsed: closed ``<details>`` render as a line "Answer" in JupyterLab, Colab, GitHub and the site.
ANSWER = re.compile(r"<details(?P<attributes>[^>]*)>\s*<summary>Answer</summary>(?P<answer>.*?)</details>", re.S)


def written(notebook: str | Path) -> dict[int, dict[str, Any]]:
    """Exercise number → ``{"question", "answers", "open"}`` from the markdown after "## Exercises": the text
    before its answer, the answers' texts (one expected), and whether any answer is written open."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    _, _, tail = text.partition("## Exercises")
    tail = re.split(r"(?m)^Next: |^## ", tail)[0]
    items = re.split(r"(?m)^(\d+)\. ", tail)[1:]
    exercises = {}
    for number, body in zip(items[::2], items[1::2]):
        found = list(ANSWER.finditer(body))
        exercises[int(number)] = {
            "question": " ".join(body[:found[0].start()].split() if found else body.split()),
            "answers": [" ".join(m["answer"].split()) for m in found],
            "open": any("open" in m["attributes"] for m in found)}
    return exercises
