"""kit.tools.experiments (papermill sweeps, the results table), kit.tools.plots figures, `kit sweep` and `kit plot`.

The sweeps run a tiny notebook written into tmp_path: no TensorFlow, a second or two per run.
"""

from __future__ import annotations

import json
import os
import math
import subprocess
import sys

import nbformat
import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from kit.tools import cells, experiments, plots
from kit.core.errors import GridError, KitError

TINY_PARAMETERS = 'x = 1\nmode = "ok"\nscale = 2.0\nRESULTS_PATH = None\n'
TINY_BODY = """
import kit
if mode == "fail":
    raise ValueError(f"failing on purpose at x={x}")
kit.tools.experiments.record(RESULTS_PATH, y=x * scale, curve=[x, x + 1], half=np.float32(0.5), bad=float("nan"))
"""


def write_notebook(path, parameters=TINY_PARAMETERS, body=TINY_BODY, tagged=True):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    params = nbformat.v4.new_code_cell(parameters)
    if tagged:
        params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_code_cell("import numpy as np"), params, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def tiny(tmp_path):
    return write_notebook(tmp_path / "tiny.ipynb")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep of three points, the middle one failing, shared by the tests that only read it."""
    folder = tmp_path_factory.mktemp("sweep")
    notebook = write_notebook(folder / "tiny.ipynb")
    grid = [{"x": 1, "mode": "ok"}, {"x": 2, "mode": "fail"}, {"x": 3, "mode": "ok"}]
    table = experiments.sweep(notebook, grid, folder / "out", progress=False)
    return folder, table


# ----- the grid -----------------------------------------------------------------------------------
def test_grid_points_are_the_cartesian_product_in_order():
    points = experiments.grid_points({"a": [1, 2], "b": ["u", "v"], "c": 0.5})
    assert points == [{"a": 1, "b": "u", "c": 0.5}, {"a": 1, "b": "v", "c": 0.5},
                      {"a": 2, "b": "u", "c": 0.5}, {"a": 2, "b": "v", "c": 0.5}]


def test_point_names_sort_the_parameters_like_parameterize_path():
    name = experiments.point_name("08-scaling-experiments",
                                  {"workers": 2, "per_worker_batch": 64, "lr_rule": "linear"})
    assert name == "08-scaling-experiments_lr_rule-linear_per_worker_batch-64_workers-2"
    assert experiments.point_name("nb", {"lr": 0.001, "path": "a/b c", "on": True}) == \
        "nb_lr-0.001_on-True_path-a_b_c"


@pytest.mark.parametrize("grid, parameter, words", [
    ({"X": [1]}, "X", ["not a parameter of tiny.ipynb", "x, mode, scale", "case-sensitive"]),
    ({"x": []}, "x", ["has no values"]),
    ({"x": [1, 1]}, "x", ["more than once"]),
    ({"x": ["one"]}, "x", ["is of type str", "default (1) is of type int", "give int values"]),
    ({"mode": [3]}, "mode", ["is of type int", "is of type str"]),
    ({"x": [[1, 2]]}, "x", ["is a list", "numbers, strings"]),
    ({"RESULTS_PATH": ["a.json"]}, "RESULTS_PATH", ["set by the sweep itself"]),
    ([{"x": 1}, {"mode": "ok"}], "mode", ["same parameters"]),
    ({"mode": ["a b", "a_b"]}, None, ["same file name"]),
])
def test_bad_grids_name_the_parameter_and_the_fix(tiny, grid, parameter, words):
    with pytest.raises(GridError) as info:
        experiments.validate_grid(tiny, grid)
    assert info.value.parameter == parameter
    message = str(info.value)
    assert "Fix:" in message and all(w in message for w in words), message


def test_a_float_parameter_takes_ints_and_fixed_parameters_are_checked_too(tiny):
    assert experiments.validate_grid(tiny, {"scale": [1, 2.5]}) == [{"scale": 1}, {"scale": 2.5}]
    with pytest.raises(GridError, match="'mode': is both a grid axis and a fixed parameter"):
        experiments.validate_grid(tiny, {"mode": ["ok"]}, parameters={"mode": "fail"})
    with pytest.raises(GridError, match="'nope': is not a parameter"):
        experiments.validate_grid(tiny, {"x": [1]}, parameters={"nope": 1})


def test_notebooks_without_a_parameters_cell_are_refused_and_without_results_path_accepted(tmp_path):
    no_results = write_notebook(tmp_path / "a.ipynb", parameters="x = 1\n")
    assert experiments.validate_grid(no_results, {"x": [1, 2]}) == [{"x": 1}, {"x": 2}]
    untagged = write_notebook(tmp_path / "b.ipynb", tagged=False)
    with pytest.raises(KitError, match="no cell tagged 'parameters'"):
        experiments.validate_grid(untagged, {"x": [1]})
    with pytest.raises(KitError, match="is not a notebook file"):
        experiments.validate_grid(tmp_path / "missing.ipynb", {"x": [1]})


def test_command_line_values_take_the_type_of_the_notebook_default(tiny):
    grid = experiments.parse_grid_text(tiny, [["x", "1", "2"], ["mode", "1", "None"], ["scale", "3"]])
    assert grid == {"x": [1, 2], "mode": ["1", "None"], "scale": [3]}
    assert [experiments.parse_value(t) for t in ("True", "None", "7", "0.5", "sqrt")] == \
        [True, None, 7, 0.5, "sqrt"]
    with pytest.raises(GridError, match="given twice"):
        experiments.parse_grid_text(tiny, [["x", "1"], ["x", "2"]])


# ----- record -------------------------------------------------------------------------------------
def test_record_without_a_path_only_returns_json_ready_metrics(tmp_path):
    metrics = experiments.record(None, acc=np.float32(0.25), n=np.int64(3), curve=np.array([1.0, np.inf]),
                                 loss=float("nan"), ok=np.bool_(True), name="run")
    assert metrics == {"acc": 0.25, "n": 3, "curve": [1.0, None], "loss": None, "ok": True, "name": "run"}
    assert type(metrics["n"]) is int and type(metrics["ok"]) is bool
    assert list(tmp_path.iterdir()) == []


def test_record_writes_the_metrics_file_and_refuses_bad_metrics(tmp_path):
    path = tmp_path / "deep" / "run.metrics.json"
    experiments.record(path, acc=0.5)
    assert json.loads(path.read_text()) == {"metrics": {"acc": 0.5}}
    with pytest.raises(KitError, match="reserved"):
        experiments.record(path, status="fine")
    with pytest.raises(KitError, match="'model' is a object"):
        experiments.record(path, model=object())


# ----- the sweep ----------------------------------------------------------------------------------
@pytest.mark.slow  # the shared sweep's papermill kernels (2.7 s)
def test_sweep_keeps_each_notebook_under_its_parameters_name(swept):
    folder, _ = swept
    out = folder / "out"
    names = sorted(p.name for p in out.glob("*.ipynb"))
    assert names == ["tiny_mode-fail_x-2.ipynb", "tiny_mode-ok_x-1.ipynb", "tiny_mode-ok_x-3.ipynb"]
    executed = nbformat.read(out / "tiny_mode-ok_x-3.ipynb", as_version=4)
    assert executed.metadata.papermill.parameters["x"] == 3
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)


@pytest.mark.slow  # the shared sweep's papermill kernels (2.7 s)
def test_the_table_has_one_row_per_point_in_csv_and_json(swept):
    folder, table = swept
    out = folder / "out"
    assert list(table["x"]) == [1, 2, 3]
    assert list(table["status"]) == ["ok", "failed", "ok"]
    assert table.loc[table["status"] == "ok", "y"].tolist() == [2.0, 6.0]
    assert table.loc[0, "curve"] == [1, 2] and table.loc[0, "half"] == 0.5 and math.isnan(table.loc[0, "bad"])
    csv = pd.read_csv(out / "results.csv")
    assert len(csv) == 3 and "curve" not in csv.columns  # lists live in results.json only
    assert csv["y"].tolist()[::2] == [2.0, 6.0] and csv["notebook"][1] == "tiny_mode-fail_x-2.ipynb"
    pd.testing.assert_frame_equal(experiments.load_results(out), table)


@pytest.mark.slow  # the shared sweep's papermill kernels (2.7 s)
def test_a_failed_point_is_a_row_with_its_error_and_its_partial_notebook(swept):
    folder, table = swept
    failed = table[table["status"] == "failed"].iloc[0]
    assert "ValueError: failing on purpose at x=2" in failed["error"]
    assert math.isnan(failed["y"])
    partial = nbformat.read(folder / "out" / failed["notebook"], as_version=4)
    errors = [o for c in partial.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert errors and errors[0]["evalue"] == "failing on purpose at x=2"
    assert not (folder / "out" / "tiny_mode-fail_x-2.metrics.json").exists()


@pytest.mark.slow  # papermill kernels: 4.5 s
def test_resume_skips_done_points_and_reruns_failed_and_changed_ones(tmp_path):
    notebook = write_notebook(tmp_path / "tiny.ipynb")
    out = tmp_path / "out"
    grid = {"x": [1, 2, 3]}
    first = experiments.sweep(notebook, grid, out, progress=False)
    assert first["y"].tolist() == [2.0, 4.0, 6.0] and not first["reused"].any()
    # the notebook now computes something else; done points must keep their old results
    write_notebook(notebook, body=TINY_BODY.replace("y=x * scale", "y=x * scale + 100"))
    (out / "tiny_x-2.metrics.json").unlink()  # as if the sweep had been interrupted during x=2
    second = experiments.sweep(notebook, grid, out, progress=False)
    assert second["y"].tolist() == [2.0, 104.0, 6.0]
    assert second["reused"].tolist() == [True, False, True]
    # other fixed parameters: the points are not the same runs any more
    third = experiments.sweep(notebook, {"x": [1]}, out, parameters={"scale": 3.0}, progress=False)
    assert third["y"].tolist() == [103.0] and not third["reused"].any()
    fourth = experiments.sweep(notebook, {"x": [1]}, out, resume=False, parameters={"scale": 3.0},
                               progress=False)
    assert fourth["reused"].tolist() == [False]


@pytest.mark.slow  # papermill kernels
def test_a_notebook_that_defines_results_path_but_records_nothing_fails_its_point(tmp_path):
    notebook = write_notebook(tmp_path / "silent.ipynb", body="y = x * 2\n")
    table = experiments.sweep(notebook, {"x": [1]}, tmp_path / "out", progress=False)
    assert table["status"].tolist() == ["failed"]
    assert "without recording metrics" in table["error"][0] and "kit.tools.experiments.record" in table["error"][0]
    assert "remove RESULTS_PATH" in table["error"][0]


@pytest.mark.slow  # papermill kernels
def test_a_notebook_without_results_path_is_swept_rows_keep_parameters_status_and_time(tmp_path):
    notebook = write_notebook(tmp_path / "plain.ipynb", parameters="x = 1\nmode = 'ok'\n",
                              body="if mode == 'fail':\n    raise ValueError('on purpose')\ny = x * 2\n")
    out = tmp_path / "out"
    table = experiments.sweep(notebook, [{"x": 1, "mode": "ok"}, {"x": 2, "mode": "fail"}], out, progress=False)
    assert table["x"].tolist() == [1, 2] and table["status"].tolist() == ["ok", "failed"]
    assert (table["seconds"] > 0).all() and "on purpose" in table["error"][1]
    assert {"x", "mode", "status", "seconds", "error", "notebook"} <= set(table.columns)
    assert (out / "plain_mode-fail_x-2.ipynb").is_file()           # the failed point's partial notebook
    executed = json.loads((out / "plain_mode-ok_x-1.ipynb").read_text())
    assert "RESULTS_PATH" not in executed["metadata"]["papermill"]["parameters"]   # nothing injected
    again = experiments.sweep(notebook, [{"x": 1, "mode": "ok"}, {"x": 2, "mode": "fail"}], out, progress=False)
    assert again["reused"].tolist() == [True, False]                # resume: the done point is not run again


@pytest.mark.parametrize("preset", ["small", "full"])
def test_notebook_08_sweeps_the_trial_notebook_with_parameters_it_defines(preset):
    """Notebook 08's papermill runner passes its points and constants to trials/scaling-trial.ipynb: each name
    must be a parameter of the trial notebook, of the right type (read from the notebooks, no TensorFlow)."""
    import kit

    notebook = nbformat.read(REPO / "notebooks" / "08-scaling-experiments.ipynb", as_version=4)
    parameters = next(c.source for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    presets = next(c.source for c in notebook.cells if c.source.startswith("PRESETS = {"))
    namespace = {"kit": kit}
    exec(parameters, namespace)
    namespace["PRESET"] = preset
    exec(presets, namespace)
    points = experiments.validate_grid(REPO / "notebooks" / "trials" / "scaling-trial.ipynb", namespace["points"],
                                  parameters=namespace["C"])
    assert points == namespace["points"] and len(points) >= 2
    # the trial trains with 08's own `training` cells (one copy): they plan every point, as the trial calls plan
    trial = nbformat.read(REPO / "notebooks" / "trials" / "scaling-trial.ipynb", as_version=4)
    trial_code = "\n".join(c.source for c in trial.cells if c.cell_type == "code")
    assert 'run_tagged("../08-scaling-experiments.ipynb", "training", globals())' in trial_code
    training = cells.run_tagged(REPO / "notebooks" / "08-scaling-experiments.ipynb", "training")
    shared = {"mnist_dataset", "build_and_compile_cnn_model", "warmup_schedule", "train", "train_points", "plan"}
    assert shared <= set(training) and not any(f"def {name}(" in trial_code for name in shared)
    constants = namespace["C"]
    for point in points:
        planned = training["plan"](**point, base_lr=constants["BASE_LR"], base_batch=constants["BASE_BATCH"],
                                   examples=constants["EXAMPLES"], epochs=constants["EPOCHS"],
                                   warmup_fraction=constants["WARMUP_FRACTION"],
                                   eval_examples=constants["EVAL_EXAMPLES"], seed=constants["SEED"])
        assert planned["global_batch"] == point["workers"] * point["per_worker_batch"] and planned["steps"] >= 2


def test_load_results_of_a_folder_without_a_sweep_says_the_fix(tmp_path):
    with pytest.raises(KitError, match="results.json does not exist. Fix"):
        experiments.load_results(tmp_path)


# ----- figures ------------------------------------------------------------------------------------
def scaling_table():
    """A results table shaped like notebook 08's, with made-up numbers."""
    rng = np.random.default_rng(0)
    rows = []
    for workers in (1, 2):
        for pwb in (64, 256):
            for rule in ("none", "linear", "sqrt"):
                global_batch = workers * pwb
                steps = 8192 // global_batch
                curve = list(2.3 * np.exp(-np.arange(1, steps + 1) / (steps / 3)) + rng.normal(0, 0.02, steps))
                if rule == "linear" and global_batch == 512:
                    curve[-3:] = [float("nan")] * 3  # a diverged run
                rows.append({"workers": workers, "per_worker_batch": pwb, "lr_rule": rule, "warmup": False,
                             "status": "ok", "global_batch": global_batch,
                             "test_accuracy": 0.9 - 0.0002 * global_batch, "final_loss": curve[-1],
                             "examples_per_second": 1000.0 * pwb / 64 * workers ** 0.5, "loss_curve": curve})
    rows.append({**rows[-2], "warmup": True, "lr_rule": "linear"})
    rows.append({**rows[0], "status": "failed", "test_accuracy": None, "loss_curve": None})
    return pd.DataFrame(rows)


def test_each_figure_function_writes_a_png(tmp_path):
    table = scaling_table()
    for name, function in (("a", plots.accuracy_vs_batch), ("b", plots.loss_vs_examples),
                           ("c", plots.throughput)):
        function(table, path=tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_results_draws_what_the_table_allows(tmp_path):
    table = scaling_table()
    written = plots.plot_results(table, tmp_path)
    assert sorted(written) == ["accuracy_vs_batch", "loss_vs_examples", "throughput"]
    assert all(p.stat().st_size > 10_000 for p in written.values())
    only_speed = table[["workers", "per_worker_batch", "examples_per_second", "status"]]
    assert sorted(plots.plot_results(only_speed, tmp_path / "speed")) == ["throughput"]
    with pytest.raises(KitError, match="no figure fits"):
        plots.plot_results(table[["workers", "status"]], tmp_path / "none")


def test_loss_curves_still_works(tmp_path):
    plots.loss_curves({"a": [2.0, 1.0]}, path=tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 0


# ----- command line -------------------------------------------------------------------------------
def run_kit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kit.tools.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd or REPO)


@pytest.mark.slow  # `kit sweep` and its kernels: 9.1 s
def test_kit_sweep_exit_codes_and_table(tmp_path):
    notebook = write_notebook(tmp_path / "tiny.ipynb")
    out = tmp_path / "out"
    ok = run_kit("sweep", str(notebook), "-p", "x", "1", "2", "--set", "scale", "0.5", "--out", str(out))
    assert ok.returncode == 0, ok.stderr
    assert pd.read_csv(out / "results.csv")["y"].tolist() == [0.5, 1.0]
    assert "2 ok (0 from an earlier run), 0 failed" in ok.stdout
    failing = run_kit("sweep", str(notebook), "-p", "x", "1", "2", "-p", "mode", "ok", "fail",
                      "--set", "scale", "0.5", "--out", str(out))
    assert failing.returncode == 1
    assert "tiny_mode-fail_x-1.ipynb" in failing.stderr and "failing on purpose" in failing.stderr
    bad = run_kit("sweep", str(notebook), "-p", "workers", "1", "--out", str(out))
    assert bad.returncode == 2 and "'workers': is not a parameter" in bad.stderr and "Fix:" in bad.stderr


@pytest.mark.slow  # two `kit plot` processes: 2.0 s
def test_kit_plot_exit_codes(tmp_path):
    experiments.write_table(scaling_table().to_dict("records"), tmp_path)
    result = run_kit("plot", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("*.png")) == \
        ["accuracy-vs-batch.png", "loss-vs-examples.png", "throughput.png"]
    missing = run_kit("plot", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.slow  # one papermill kernel (~2 s)
def test_sweep_kernels_talk_over_unix_sockets_and_leave_no_folder(tiny, tmp_path, capfd):
    import tempfile

    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("kit-kernel-")}
    table = experiments.sweep(tiny, [{"x": 1, "mode": "ok"}], tmp_path / "out", progress=False)
    assert list(table["status"]) == ["ok"]
    assert "running over TCP" not in capfd.readouterr().err  # ipykernel's warning for every TCP kernel
    assert {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("kit-kernel-")} == before
