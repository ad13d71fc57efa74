"""kit.train.scaling: warmup, loss curves, the recorder and notebook 08's tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kit.train import scaling
from kit.core.errors import KitError, OptionError


def test_warmup_ramps_linearly_then_holds():
    rates = [scaling.warmup_learning_rate(s, 0.8, 4, 0.1) for s in range(7)]
    assert rates == pytest.approx([0.1, 0.275, 0.45, 0.625, 0.8, 0.8, 0.8])
    assert scaling.warmup_learning_rate(0, 0.8, 0) == 0.8  # no warmup


def test_per_step_losses_undo_the_running_mean_per_epoch():
    own = [2.0, 1.0, 3.0, 0.5, 0.25, 0.75]  # two epochs of three steps
    running = []
    for start in (0, 3):
        running += [float(np.mean(own[start:start + i + 1])) for i in range(3)]
    assert scaling.per_step_losses(running, 3) == pytest.approx(own)


def test_smooth_is_a_trailing_mean_that_keeps_nan():
    assert scaling.smooth([1, 3, 5, 7], 2) == [1.0, 2.0, 4.0, 6.0]
    out = scaling.smooth([1, float("nan"), 3, 5], 2)
    assert out[0] == 1.0 and math.isnan(out[1]) and math.isnan(out[2]) and out[3] == 4.0


def test_scaling_efficiency_from_a_table():
    table = pd.DataFrame([
        {"workers": 1, "per_worker_batch": 64, "examples_per_second": 1000.0, "status": "ok"},
        {"workers": 1, "per_worker_batch": 64, "examples_per_second": 1200.0, "status": "ok"},
        {"workers": 1, "per_worker_batch": 64, "examples_per_second": 1100.0, "status": "ok"},
        {"workers": 2, "per_worker_batch": 64, "examples_per_second": 1100.0, "status": "ok"},
        {"workers": 2, "per_worker_batch": 64, "examples_per_second": 99999.0, "status": "failed"},
        {"workers": 2, "per_worker_batch": 256, "examples_per_second": 3000.0, "status": "ok"},
    ])
    speed = scaling.scaling_efficiency(table)
    assert speed[["per_worker_batch", "workers"]].values.tolist() == [[64, 1], [64, 2], [256, 2]]
    assert speed["examples_per_second"].tolist() == [1100.0, 1100.0, 3000.0]  # median; failed run ignored
    assert speed["efficiency"].tolist()[:2] == [1.0, 0.5]
    assert math.isnan(speed["efficiency"].tolist()[2])  # no one-worker run at 256
    with pytest.raises(OptionError, match="examples_per_second"):
        scaling.scaling_efficiency(table.drop(columns="examples_per_second"))


# ----- notebook 08's table: records of a run become rows ----------------------------------------------
def planned(workers=2, per_worker_batch=64, lr_rule="linear", learning_rate=0.1, warmup_steps=0):
    return {"workers": workers, "per_worker_batch": per_worker_batch, "lr_rule": lr_rule, "warmup": bool(warmup_steps),
            "global_batch": workers * per_worker_batch, "k": workers * per_worker_batch / 64,
            "learning_rate": learning_rate, "warmup_from": 0.05, "warmup_steps": warmup_steps, "epochs": 2,
            "steps_per_epoch": 3, "steps": 6, "examples": 6 * workers * per_worker_batch}


def record(pid, losses=(1.0, 0.5)):
    running = [2.0, 1.5, 1.0, 1.0, 0.75, 0.5]                    # running means: own losses 2 1 0, 1 0.5 0
    return {"task": f"worker:{pid}", "pid": pid, "running_loss": running, "learning_rate": [0.1] * 6,
            "loss": list(losses), "steps_done": [3, 6], "epoch_seconds": [5.0, 1.0, 1.0][:2], "parameters": 10,
            "wall_seconds": 3.0 + pid, "test_loss": 0.4, "test_accuracy": 0.9}


def test_distinct_keeps_one_of_the_trials_that_train_alike():
    at_base = [planned(1, 64, rule, 0.05) for rule in ("none", "linear", "sqrt")]   # k = 1: the same rate
    warm_but_flat = planned(1, 64, "linear", 0.05, warmup_steps=4)                   # a ramp from 0.05 to 0.05
    other = planned(1, 128, "linear", 0.1)
    assert scaling.distinct(at_base + [warm_but_flat, other]) == [warm_but_flat, other]


def test_rows_of_gives_every_trial_a_row_from_the_run_that_trained_alike():
    trials = [planned(1, 64, rule, 0.05) for rule in ("none", "linear")]
    trained = scaling.distinct(trials)
    results = [[record(7)], [record(8)]]                           # two tasks, one trained trial each
    rows = scaling.rows_of(trials, trained, results)
    assert [r["lr_rule"] for r in rows] == ["none", "linear"] and all(r["status"] == "ok" for r in rows)
    row = rows[0]
    assert row["loss_curve"] == pytest.approx([2.0, 1.0, 0.0, 1.0, 0.5, 0.0])
    assert row["final_loss"] == pytest.approx(0.0) and row["workers_agree"] and row["pids"] == [7, 8]
    assert row["examples_per_second"] == pytest.approx(64 * 3 / 1.0) and row["wall_seconds"] == 11.0
    disagree = scaling.as_row(trials[0], [record(7), record(8, losses=(1.0, 0.6))])
    assert not disagree["workers_agree"]


def test_with_records_pairs_each_trials_record_with_what_the_task_returned():
    measured = {"worker:0": {"records": [{"loss": [1.0]}, {"loss": [2.0]}]}, "worker:1": {"records": [{"loss": [1.0]}]}}
    paired = scaling.with_records([[(0.5, 0.9), (0.4, 0.8)]], measured, ["worker:0"])
    assert paired == [[{"loss": [1.0], "test_loss": 0.5, "test_accuracy": 0.9},
                       {"loss": [2.0], "test_loss": 0.4, "test_accuracy": 0.8}]]
    with pytest.raises(KitError, match=r"worker:1: 2 trials returned but 1 recorded.*Fix: pass kit.OnTask"):
        scaling.with_records([[(0.5, 0.9), (0.4, 0.8)]], measured, ["worker:1"])


def test_step_times_and_speed_table():
    speed = pd.DataFrame({"workers": [1, 2], "per_worker_batch": [64, 64], "examples_per_second": [1000.0, 1280.0],
                          "efficiency": [1.0, 0.64]})
    times = scaling.step_times(speed)
    assert times.loc[0, "ms per step, 1 worker"] == 64.0 and times.loc[0, "ms per step"] == 100.0
    assert times.loc[0, "added ms"] == 36.0
    trial = {**planned(), "allreduce": "float16", "steps_per_execution": 3}
    table = scaling.speed_table([trial], [record(1)])
    assert table.loc[0, "batch-end calls"] == 6 and table.loc[0, "examples/s"] == pytest.approx(128 * 3 / 1.0)


@pytest.mark.slow  # imports TensorFlow in the test process (about 10 s)
def test_the_recorder_on_one_process():
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.01))
    recorder = scaling.recorder()
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 2), "float32"), np.zeros((8, 1), "float32"))).batch(2)
    history = model.fit(data, epochs=2, verbose=0, callbacks=[recorder])
    record = recorder.record
    assert record["steps_done"] == [4, 8] and len(record["running_loss"]) == 8 and record["parameters"] == 3
    assert record["loss"] == pytest.approx(history.history["loss"]) and record["learning_rate"] == pytest.approx([0.01] * 8)
    assert len(record["epoch_seconds"]) == 2 and record["wall_seconds"] > 0 and record["task"] == "local"
    model.fit(data, epochs=1, verbose=0, callbacks=[recorder])            # a second fit: a record of its own
    assert [r["steps_done"] for r in recorder.records] == [[4, 8], [12]] and recorder.record is recorder.records[-1]
