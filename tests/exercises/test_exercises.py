"""Every exercise that changes only parameters runs to the end, as a learner doing it in a fresh notebook would.

Not part of ``make test`` (about half an hour on 2 cores): ``make exercises`` runs it (not CI: .ci/run says why).
Each notebook lists those exercises in its metadata (:func:`kit.tools.cells.parameter_exercises`); tests/test_exercises_listed.py checks that the list and
the text agree. The executed notebooks stay in out/exercises/, the failed ones with their error.
"""

from pathlib import Path

import pytest

from kit.tools.cells import parameter_exercises
from kit.tools.experiments import sweep

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = [p for p in sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb")) if parameter_exercises(p)]
CELL_TIMEOUT = 600  # seconds for one cell, as papermill counts (the notebooks' longest cell takes ~2 minutes)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem.split("-")[0])
def test_every_parameter_exercise_runs_to_the_end(notebook, monkeypatch):
    monkeypatch.setenv("KIT_VIEW", "text")
    out = REPO / "out" / "exercises" / notebook.stem
    failed = []
    for entry in parameter_exercises(notebook):  # one sweep each: a sweep's points set the same parameters
        folder = out / f"exercise-{entry['exercise']}"
        table = sweep(notebook, [entry["parameters"]], folder, resume=False, timeout=CELL_TIMEOUT, progress=False)
        failed += [f"exercise {entry['exercise']} ({folder / row['notebook']}): {row['error']}"
                   for _, row in table.iterrows() if row["status"] != "ok"]
    assert not failed, "\n".join(failed)
