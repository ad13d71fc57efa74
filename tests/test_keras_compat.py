"""The Keras compatibility table: its helpers, the committed docs file, and a re-measurement of its
MultiWorkerMirroredStrategy rows (the ones the kit's tf-keras default follows from)."""

from __future__ import annotations

import datetime
import inspect
import os
import sys
from pathlib import Path

import pytest

from kit.tools import compat
from kit.core.errors import KitError

DOCS_TABLE = Path(__file__).resolve().parents[1] / "docs" / "keras-compatibility.md"


def parse_markdown(text: str) -> dict[tuple[str, str, str], str]:
    """``(keras, strategy, mode) -> cell`` from a table written by ``compat.to_markdown``."""
    strategies = {v: k for k, v in compat.STRATEGY_LABELS.items()}
    modes = {v: k for k, v in compat.MODE_LABELS.items()}
    header: list[str] = []
    cells: dict[tuple[str, str, str], str] = {}
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if parts[:2] == ["strategy", "training"]:
            header = parts[2:]
        elif header and parts[0] in strategies and parts[1] in modes:
            for k, cell in zip(header, parts[2:]):
                cells[(k, strategies[parts[0]], modes[parts[1]])] = cell
    return cells


def matches(outcome: compat.Outcome, cell: str) -> bool:
    """Whether a table cell says what ``outcome`` measured: ok, or an error whose first five words (its type,
    no values) are the same."""
    def words(failed: str) -> str:
        return " ".join(failed[len("fails:"):].strip().strip("`").strip().strip("'").split()[:5])
    if outcome.ok or cell == "ok":
        return outcome.ok and cell == "ok"
    return cell.startswith("fails:") and words(cell) == words(outcome.cell)


def test_first_line_of_a_traced_error_is_the_real_error():
    traced = AttributeError("in user code:\n\n    File \"x.py\", line 3, in step  *\n        y = v.read_value()\n\n"
                            "    AttributeError: 'Variable' object has no attribute 'read_value'\n")
    assert compat.first_line(traced) == "AttributeError: 'Variable' object has no attribute 'read_value'"
    assert compat.first_line(ValueError("Attempt to convert a value (PerReplica:{\n  0: <tf.Tensor>})")) == \
        "ValueError: Attempt to convert a value (PerReplica:{"
    assert len(compat.first_line(RuntimeError("x" * 500), compat.ERROR_CHARS)) == 140


def test_cells_round_trip_through_markdown():
    outcomes = [compat.Outcome("tf-keras", s, m, True) for s in compat.STRATEGIES for m in compat.MODES]
    outcomes += [compat.Outcome("keras3", s, m, s != "parameter_server", "" if s != "parameter_server"
                                else "ValueError: a | b `c`") for s in compat.STRATEGIES for m in compat.MODES]
    text = compat.to_markdown(outcomes, steps=2, when=datetime.date(2025, 1, 2))
    cells = parse_markdown(text)
    assert len(cells) == 16 and "2025-01-02" in text and "--steps 2" in text
    for outcome in outcomes:
        assert matches(outcome, cells[outcome.key]), (outcome, cells[outcome.key])
    ok = compat.Outcome("keras3", "default", "fit", True)
    assert not matches(ok, "fails: `ValueError: x`")
    assert not matches(compat.Outcome("keras3", "default", "fit", False, "TypeError: y"), "ok")


def test_unknown_choices_are_refused():
    with pytest.raises(KitError, match="tf-keras, keras3"):
        list(compat.run_all(keras=["keras2"]))
    with pytest.raises(KitError, match="custom_loop"):
        list(compat.run_all(modes=["loop"]))


def test_every_combination_runs_a_lesson_function_that_takes_its_arguments():
    keras_choice, imported = os.environ.get("TF_USE_LEGACY_KERAS"), "tensorflow" in sys.modules
    for strategy in compat.STRATEGIES:
        for mode in compat.MODES:
            code, train = compat.lesson(strategy, mode)
            assert train.__module__ == "__main__", "not sent by value: the engines would not run the lesson's code"
            inspect.signature(train).bind(**compat.arguments(strategy, mode, 2, "ckpt"), mnist_path="mnist.npz")
    # the lesson's cells only define: the kernel's Keras choice and TensorFlow stay untouched
    assert os.environ.get("TF_USE_LEGACY_KERAS") == keras_choice and ("tensorflow" in sys.modules) == imported


def committed_table() -> tuple[str, dict]:
    text = DOCS_TABLE.read_text()
    return text, parse_markdown(text)


def test_committed_table_is_complete_and_for_the_installed_versions():
    text, cells = committed_table()
    assert set(cells) == {(k, s, m) for k in compat.KERAS for s in compat.STRATEGIES for m in compat.MODES}
    assert all(cells[("tf-keras", s, m)] == "ok" for s in compat.STRATEGIES for m in compat.MODES)
    versions = compat.versions()
    for name in ("tensorflow", "tf-keras", "keras"):
        assert f"{name} {versions[name]}" in text, f"regenerate the table: {name} is now {versions[name]}"


#: What the MultiWorkerMirroredStrategy rows measure (keras-team/keras#20585 for Keras 3's fit).
EXPECTED = {
    ("tf-keras", "fit"): "ok",
    ("tf-keras", "custom_loop"): "ok",
    ("keras3", "fit"): "ValueError: Attempt to convert a value (PerReplica:{",
    ("keras3", "custom_loop"): "ok",
}


@pytest.mark.slow
@pytest.mark.parametrize("keras", compat.KERAS)
def test_multi_worker_mirrored_rows_measure_what_the_table_says(keras, make_cluster):
    cluster = make_cluster(**compat.TOPOLOGIES["multi_worker_mirrored"], keras=keras)
    assert {t.keras for t in cluster.tasks} == {keras}
    _, cells = committed_table()
    for mode in compat.MODES:  # one cluster: the custom loop first, then fit, as the table was made
        outcome = compat.run_on_cluster(cluster, "multi_worker_mirrored", mode, steps=2)
        expected = EXPECTED[(keras, mode)]
        if expected == "ok":
            assert outcome.ok, outcome.error
        else:
            assert not outcome.ok and outcome.error.startswith(expected), outcome.error
        assert matches(outcome, cells[outcome.key]), (outcome, cells[outcome.key])
