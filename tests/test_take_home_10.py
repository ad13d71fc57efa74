"""Notebook 10's lesson as the learner's ``main.py`` (``kit export``), run as a learner runs it: one plain process,
no kit, one thread. It trains batch 256's tuned point to the target in the steps of the study's stored table."""

import json

import pytest

from take_home import MNIST, NOTEBOOKS, export, run_tasks


@pytest.mark.slow
def test_the_exported_script_reaches_the_target_in_the_tables_steps(tmp_path):
    script = export("10-critical-batch-size", tmp_path / "take-home")
    source = script.read_text()
    assert "import kit" not in source and "KIT_" not in source
    (result,) = run_tasks(script, {"worker": 1}, [f"--mnist-path={MNIST}"], timeout=600)

    table = json.loads((NOTEBOOKS / "results" / "critical-batch-full.json").read_text())
    (steps,) = [row["steps"] for row in table if (row["BATCH"], row["WARMUP"], row["best_lr"]) == (256, True, 1.6)]
    assert result["status"] == "reached" and result["curve"][-1][1] >= 0.97, result["curve"][-3:]
    # the notebook's own check: within 10 % of the table (another CPU may round differently)
    assert abs(result["steps"] / steps - 1) <= 0.1, f"{result['steps']} steps, the table says {steps}"
