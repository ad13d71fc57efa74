"""kit.core.view and kit.train.progress: the live view of a run (table, states, logs, text fallback)."""

from __future__ import annotations

import json
import re
import textwrap
from types import SimpleNamespace

import nbformat
import pytest

from kit.core import view
from kit.train import progress
from kit.core.errors import OptionError
from kit.core.options import ClusterOptions


def _task(name: str, pid: int = 100) -> SimpleNamespace:
    return SimpleNamespace(name=name, address=f"127.0.0.1:{pid}", host="here", pid=pid)


class _Result:
    """What RunView.follow reads of an ipyparallel AsyncResult: its metadata, one dict per engine."""

    def __init__(self, *metadata: dict):
        self.metadata = list(metadata)


def test_row_fraction_and_summary_follow_the_published_fields():
    row = view.TaskRow("worker:0")
    assert row.fraction() is None and row.summary() == ""
    row.progress.update(epochs=3, steps=20, epoch=2, step=10, loss=0.51234, examples_per_second=1450.4)
    assert row.fraction() == pytest.approx(30 / 60)
    assert row.summary() == "epoch 2/3  step 10/20  loss 0.5123  1,450 examples/s"
    row.progress.update(epoch=3, step=20)
    assert row.fraction() == 1.0
    assert view.TaskRow("w", progress={"epochs": 4, "epochs_done": 1}).fraction() == 0.25


def test_html_has_a_row_per_task_with_its_state_and_escapes_text():
    rows = [view.TaskRow("worker:0", address="127.0.0.1:5", pid=7, state="done"),
            view.TaskRow("worker:1", state="failed", note="ValueError: <bad> & worse")]
    page = view.render_html("train <fn>", rows)
    assert re.findall(r'data-kit-task="([^"]+)" data-kit-state="([^"]+)"', page) == \
        [("worker:0", "done"), ("worker:1", "failed")]
    assert "&lt;bad&gt; &amp; worse" in page and "train &lt;fn&gt;" in page and "<bad>" not in page


def test_follow_moves_tasks_through_running_done_and_failed(capsys):
    live = view.RunView("fn", [_task("worker:0", 1), _task("worker:1", 2)], mode="text")
    assert live.states() == {"worker:0": "ready", "worker:1": "ready"}
    live.submitted(["worker:0", "worker:1"])
    live.follow(_Result({"status": None, "data": {progress.KEY: {"step": 3, "steps": 10}}},
                        {"status": None, "data": {}}), ["worker:0", "worker:1"])
    assert live.states() == {"worker:0": "running", "worker:1": "running"}
    assert live.rows["worker:0"].progress == {"step": 3, "steps": 10}
    error = SimpleNamespace(ename="ValueError", evalue="bad shape")
    live.follow(_Result({"status": "ok", "data": {}}, {"status": "error", "error": error}),
                ["worker:0", "worker:1"])
    assert live.states() == {"worker:0": "done", "worker:1": "failed"}
    assert live.rows["worker:1"].note == "ValueError: bad shape"
    live.restarting("restarting all 2 tasks")
    assert set(live.states().values()) == {"restarting"}
    live.restarted([_task("worker:0", 11), _task("worker:1", 12)], "restarted in 3.0s")
    assert live.states() == {"worker:0": "ready", "worker:1": "ready"}
    assert [(r.pid, r.restarts, r.progress) for r in live.rows.values()] == [(11, 1, {}), (12, 1, {})]
    err = capsys.readouterr().err
    assert "[kit] restarting all 2 tasks" in err and "[kit] restarted in 3.0s" in err


def test_text_view_prints_progress_at_most_every_ten_seconds(capsys, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(view.time, "monotonic", lambda: clock[0])
    live = view.RunView("fn", [_task("worker:0")], mode="text")
    live.submitted(["worker:0"])
    for second in range(60):  # a minute of progress reports, one a second
        clock[0] = 1000.0 + second
        live.follow(_Result({"status": None, "data": {progress.KEY: {"step": second + 1, "steps": 60}}}),
                    ["worker:0"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[worker:0] step")]
    assert len(lines) == 6, lines  # at 0, 10, ..., 50 s
    assert lines[0] == "[worker:0] step 1/60" and lines[1] == "[worker:0] step 11/60"


def test_quiet_text_view_prints_no_task_lines(capsys):
    live = view.RunView("fn", [_task("worker:0")], mode="text", show_lines=False)
    live.line("worker:0", "stdout", "epoch 1")
    live.follow(_Result({"status": None, "data": {progress.KEY: {"step": 5}}}), ["worker:0"])
    assert capsys.readouterr() == ("", "")


def test_view_option_is_checked_and_auto_is_text_outside_a_kernel(monkeypatch):
    monkeypatch.setenv("KIT_VIEW", "fancy")
    with pytest.raises(OptionError, match=r"option 'view': 'fancy' is not a known choice.*KIT_VIEW.*widget"):
        ClusterOptions()
    monkeypatch.delenv("KIT_VIEW")
    assert ClusterOptions().view == "auto" and view.choose("auto") == "text"
    assert view.choose("widget") == "widget"


def test_publish_and_meter_do_nothing_outside_an_engine():
    assert progress.publish(step=1) is False
    meter = progress.Meter(batch_size=8, period=0).begin(epochs=1, steps=2)
    meter.step(1, 1, loss=0.5)  # no engine, no error


@pytest.mark.slow
def test_live_view_in_a_jupyter_kernel_reaches_done_and_keeps_logs_out_of_the_cell(tmp_path, no_leaks):
    """In a real kernel the run shows a widget table; every task ends "done" with its progress,
    each task's lines go to its log panel, and the cell's own output has no task lines."""
    from nbclient import NotebookClient

    code = textwrap.dedent('''
        import kit
        def train(steps=6):
            import tensorflow as tf
            from kit.train import progress
            meter = progress.Meter(batch_size=16).begin(epochs=1, steps=steps)
            for step in range(1, steps + 1):
                print("step", step, "of", steps)
                meter.step(1, step, loss=1.0 / step, force=True)
            return tf.__version__
        cluster = kit.TFCluster(workers=2, view="widget").start()
        versions = cluster.run(train)
        states = cluster.last_view.states()
        cluster.stop()
        print(states)
        ''')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(nb, timeout=240, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "{'worker:0': 'done', 'worker:1': 'done'}" in printed
    assert "[worker:" not in printed and "step 1 of 6" not in printed  # the lines went to the logs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    tables = [w["state"]["value"] for w in state.values()
              if w["model_name"] == "HTMLModel" and "kit-view" in w["state"].get("value", "")]
    (table,) = tables
    assert re.findall(r'data-kit-task="([^"]+)" data-kit-state="([^"]+)"', table) == \
        [("worker:0", "done"), ("worker:1", "done")]
    assert table.count("step 6/6") == 2 and "loss 0.1667" in table
    logs = [w["state"]["outputs"] for w in state.values() if w["model_name"] == "OutputModel"]
    assert len(logs) == 2
    for log in logs:
        text = "".join(o.get("text", "") for o in log)
        assert "step 6 of 6" in text and "cuInit" not in text, json.dumps(log)[:500]


def test_kernels_started_for_papermill_show_text_unless_kit_view_says_otherwise(monkeypatch):
    import os

    monkeypatch.delenv("KIT_VIEW", raising=False)
    with view.text_in_kernels_started_here():
        assert os.environ["KIT_VIEW"] == "text"
    assert "KIT_VIEW" not in os.environ
    monkeypatch.setenv("KIT_VIEW", "widget")
    with view.text_in_kernels_started_here():
        assert os.environ["KIT_VIEW"] == "widget"


def test_meter_measures_speed_since_its_last_report_and_over_the_epoch(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    sent = []
    monkeypatch.setattr(progress, "publish", lambda **fields: sent.append(fields) or True)
    meter = progress.Meter(batch_size=64, period=1.0).begin(epochs=1, steps=10)
    meter.epoch_begin()
    for step in range(1, 11):  # a step every 0.25 s: 4 steps/s, 256 examples/s
        clock[0] += 0.25
        meter.step(1, step, loss=1.0 / step)
    meter.epoch_end(1, 10, loss=0.3)
    steps = [f for f in sent[1:-1]]
    assert [f["step"] for f in steps] == [1, 5, 9]  # the first step at once, then at most one a second
    assert all(f["steps_per_second"] == pytest.approx(4.0) for f in steps)
    assert sent[-1] == {"step": 10, "epoch": 1, "loss": 0.3, "steps_per_second": pytest.approx(4.0),
                        "examples_per_second": pytest.approx(256.0)}


def test_lag_is_the_time_from_a_task_s_last_report_to_its_result(monkeypatch):
    """What notebook 01 measures: how long a function ran on after its last training step."""
    clock = [1000.0]
    monkeypatch.setattr(view.time, "time", lambda: clock[0])
    live = view.RunView("fn", [_task("worker:0", 1), _task("worker:1", 2)], mode="text", show_lines=False)
    live.submitted(["worker:0", "worker:1"])
    last_step = {"status": None, "data": {progress.KEY: {"step": 70, "steps": 70, "time": 1010.0}}}
    live.follow(_Result(last_step, last_step), ["worker:0", "worker:1"])
    assert live.lags() == {"worker:0": None, "worker:1": None}  # still running
    clock[0] = 1010.5
    live.follow(_Result({"status": "ok", "data": {}}, {"status": None, "data": {}}), ["worker:0", "worker:1"])
    clock[0] = 1028.0
    live.follow(_Result({"status": "ok", "data": {}}, {"status": "ok", "data": {}}), ["worker:0", "worker:1"])
    assert live.lags() == {"worker:0": pytest.approx(0.5), "worker:1": pytest.approx(18.0)}
    assert view.TaskRow("worker:0", state="done", finished=5.0).lag() is None  # no report: unknown


@pytest.mark.slow
def test_progress_measures_the_speed_of_a_fit_that_does_not_know_its_steps():
    """A dataset of unknown size (Keras 3 on JAX distributing a tf.data.Dataset itself, notebook 12's exercise 3):
    fit's ``params["steps"]`` is None, so the speed comes from the steps each epoch ran."""
    import numpy as np

    from kit.tools.cells import lesson
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    images = np.random.default_rng(0).random((12, 28, 28), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((images, np.arange(12) % 10)).filter(lambda x, y: True).batch(4)
    assert dataset.cardinality() == tf.data.UNKNOWN_CARDINALITY
    meter = progress.callback(batch_size=4, summed_over=1)
    lesson("01-single-vs-multi-worker")["build_and_compile_cnn_model"]().fit(dataset, epochs=3, verbose=0,
                                                                            callbacks=[meter])
    summary = meter.summary()
    assert meter.epoch_steps == [3, 3, 3]
    assert summary["examples_per_second"] == pytest.approx(4 * 6 / sum(summary["epoch_seconds"][1:]))
