"""kit.train.mirrored_probes: the engine's kept objects, and the one-row report on a fit."""

import math

import numpy as np

from kit.train import mirrored_probes
from kit.train._tf import import_tensorflow


def test_kept_makes_once_and_keeps():
    made = []
    first = mirrored_probes.kept("test_object", lambda: made.append(1) or object())
    assert mirrored_probes.kept("test_object", lambda: made.append(1) or object()) is first
    assert made == [1]


def test_fit_report_measures_a_fit_and_reads_the_log():
    tf = import_tensorflow()

    def train(callbacks):
        model = tf.keras.Sequential([tf.keras.Input(shape=(1,)), tf.keras.layers.Dense(1)])
        model.compile(loss="mse", optimizer="sgd")
        tf.get_logger().info("Reduce to /job:localhost/replica:0/task:0/device:CPU:0 then broadcast to ('x',).")
        return model.fit(np.ones((8, 1)), np.ones((8, 1)), batch_size=2, epochs=1, verbose=0, callbacks=callbacks)

    row = mirrored_probes.fit_report(train)
    assert row["error"] == "" and row["loss"] >= 0 and row["median_step_ms"] > 0
    assert row["reduced with (from the log)"] == "reduce to device:CPU:0, then broadcast"


def test_fit_report_keeps_tensorflows_error():
    tf = import_tensorflow()

    def train(callbacks):
        raise tf.errors.InvalidArgumentError(None, None, "No OpKernel was registered")

    row = mirrored_probes.fit_report(train)
    assert row["error"] == "No OpKernel was registered" and math.isnan(row["loss"])
