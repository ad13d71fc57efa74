"""Every exercise a notebook lists in its metadata runs as its text says, as a learner doing it in a fresh notebook would.

Not part of ``make test`` (about an hour on 2 cores): ``make exercises`` runs it (not CI: .ci/run says why).
Each notebook lists the exercises that need no shell in its metadata (tests/exercise_list.py: parameters, edits of
cells, and the error the text announces, if any); tests/test_exercises_listed.py checks that the list and the text
agree. The executed notebooks stay in out/exercises/<notebook>/exercise-<n>/, the failed ones with their error:
the numbers of the notebooks' collapsed answers come from them.
"""

import json
from pathlib import Path

import pytest

import exercise_list
from kit.tools.experiments import sweep

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = [p for p in sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb")) if exercise_list.listed(p)]
CELL_TIMEOUT = 600  # seconds for one cell, as papermill counts (the notebooks' longest cell takes ~2 minutes)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem.split("-")[0])
def test_every_listed_exercise_runs_as_its_text_says(notebook, monkeypatch):
    monkeypatch.setenv("KIT_VIEW", "text")
    out = REPO / "out" / "exercises" / notebook.stem
    wrong = []
    for entry in exercise_list.listed(notebook):
        folder = out / f"exercise-{entry['exercise']}"
        source = notebook
        if entry.get("edits"):  # the edited copy runs where the notebook would, for its relative paths
            source = folder / "edited" / notebook.name
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text(json.dumps(exercise_list.edited(notebook, entry), indent=1, ensure_ascii=False))
        table = sweep(source, [entry.get("parameters", {})], folder, resume=False, timeout=CELL_TIMEOUT,
                      progress=False, cwd=notebook.parent)
        [row] = [row for _, row in table.iterrows()]
        ran = folder / row["notebook"]
        expected = entry.get("fails")
        if expected is None and row["status"] != "ok":
            wrong.append(f"exercise {entry['exercise']} ({ran}): {row['error']}")
        elif expected is not None and (row["status"] == "ok" or f": {expected}:" not in f": {row['error']}"):
            wrong.append(f"exercise {entry['exercise']} ({ran}): its text announces {expected}, "
                         f"the run gave {row['error'] or 'no error'}")
    assert not wrong, "\n".join(wrong)
