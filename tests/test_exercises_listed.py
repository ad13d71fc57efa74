"""A notebook's exercises: each asks for a prediction, then gives its worked answer collapsed; the exercises its
metadata lists for ``make exercises`` (tests/exercise_list.py) agree with the text."""

import json
import re
from pathlib import Path

import papermill
import pytest

import exercise_list

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem.split("-")[0])
def test_every_exercise_asks_for_a_prediction_and_has_a_collapsed_answer(notebook):
    exercises = exercise_list.written(notebook)
    assert exercises, f"{notebook.name}: no numbered exercises under '## Exercises'"
    assert sorted(exercises) == list(range(1, len(exercises) + 1)), f"{notebook.name}: exercises {sorted(exercises)}"
    for number, exercise in exercises.items():
        where = f"{notebook.name} exercise {number}"
        assert re.search(r"\bPredict\b", exercise["question"]), \
            f"{where} does not ask for a prediction before its answer: {exercise['question'][:120]!r}"
        assert len(exercise["answers"]) == 1, (f"{where} has {len(exercise['answers'])} answers: give it one "
                                               "'<details><summary>Answer</summary> ... </details>' after its text")
        assert not exercise["open"], f"{where}'s answer is written open: remove 'open' from its <details>"
        assert re.search(r"\d", exercise["answers"][0]), f"{where}'s answer has no number of the run"
        assert not re.search(r"\bExpect\b", exercise["question"]), f"{where} gives its answer away: {exercise['question']!r}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem.split("-")[0])
def test_listed_exercises_apply_and_name_what_the_text_sets(notebook):
    texts = {n: e["question"] for n, e in exercise_list.written(notebook).items()}
    parameters = papermill.inspect_notebook(str(notebook))
    for entry in exercise_list.listed(notebook):
        number = entry["exercise"]
        assert number in texts, f"{notebook.name}: exercise {number} is listed but not under '## Exercises'"
        exercise_list.edited(notebook, entry)  # raises on an edit that does not apply
        for name, value in entry.get("parameters", {}).items():
            assert name in parameters, f"{notebook.name}: exercise {number} sets {name}, not a parameter"
            said = [f"{name} = {v}" for v in ([repr(value), f'"{value}"'] if isinstance(value, str) else [value])]
            assert any(s in texts[number] for s in said), f"{notebook.name}: exercise {number}'s text does not say `{said[0]}`"


def test_a_malformed_entry_names_the_field_and_the_fix(tmp_path):
    notebook = tmp_path / "x.ipynb"
    for entry, message in [({"parameters": {"A": 1}}, "no exercise number"), ({"exercise": 1}, "changes nothing"),
                           ({"exercise": 1, "edits": [{"cell": "c"}]}, "is not"),
                           ({"exercise": 1, "parameters": {"A": 1}, "expect": "x"}, "unknown field")]:
        notebook.write_text(json.dumps({"cells": [], "metadata": {"kit": {"exercises": [entry]}}}))
        with pytest.raises(exercise_list.ExerciseError, match=message):
            exercise_list.listed(notebook)


def test_an_edit_must_quote_its_cell_once(tmp_path):
    notebook = tmp_path / "x.ipynb"
    notebook.write_text(json.dumps({"cells": [{"id": "a", "cell_type": "code", "source": "x = 1\nx = 1\n"}]}))
    with pytest.raises(exercise_list.ExerciseError, match="occurs 2 times in cell a"):
        exercise_list.edited(notebook, {"exercise": 1, "edits": [{"cell": "a", "replace": "x = 1", "with": "x = 2"}]})
    with pytest.raises(exercise_list.ExerciseError, match="no cell with id 'b'"):
        exercise_list.edited(notebook, {"exercise": 1, "edits": [{"cell": "b", "replace": "x", "with": "y"}]})
    changed = exercise_list.edited(notebook, {"exercise": 1, "edits": [{"cell": "a", "replace": "x = 1\nx", "with": "y"}]})
    assert changed["cells"][0]["source"] == "y = 1\n"
