"""A notebook's list of parameter-only exercises (its metadata, run by ``make exercises``) agrees with its text."""

import json
import re
from pathlib import Path

import papermill
import pytest

from kit.core.errors import GridError
from kit.tools.cells import parameter_exercises

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb"))


def exercise_texts(path: Path) -> dict[int, str]:
    """Exercise number → its text, from the markdown after "## Exercises"."""
    cells = json.loads(path.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    _, _, tail = text.partition("## Exercises")
    tail = tail.split("\n## ")[0]
    items = re.split(r"(?m)^(\d+)\. ", tail)[1:]
    return {int(n): " ".join(body.split()) for n, body in zip(items[::2], items[1::2])}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem.split("-")[0])
def test_listed_exercises_name_parameters_the_text_sets(notebook):
    listed = parameter_exercises(notebook)
    texts = exercise_texts(notebook)
    parameters = papermill.inspect_notebook(str(notebook))
    for entry in listed:
        number = entry["exercise"]
        assert number in texts, f"{notebook.name}: exercise {number} is listed but not under '## Exercises'"
        for name, value in entry["parameters"].items():
            assert name in parameters, f"{notebook.name}: exercise {number} sets {name}, not a parameter"
            written = f"{name} = {value!r}" if isinstance(value, str) else f"{name} = {value}"
            assert written in texts[number], f"{notebook.name}: exercise {number}'s text does not say `{written}`"


def test_a_malformed_entry_names_the_field_and_the_fix(tmp_path):
    notebook = tmp_path / "x.ipynb"
    notebook.write_text(json.dumps({"cells": [], "metadata": {"kit": {"exercises": [{"exercise": 1}]}}}))
    with pytest.raises(GridError, match=r'metadata\.kit\.exercises entry .* "parameters"'):
        parameter_exercises(notebook)
