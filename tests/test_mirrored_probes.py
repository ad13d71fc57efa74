"""kit.train.mirrored_probes.reduction_probe: the step times and the reduction read from TensorFlow's log, measured
by a callback passed into a plain ``fit``."""

import numpy as np
import pytest

from kit.train import mirrored_probes
from kit.train._tf import import_tensorflow


def fit(callbacks, log=None):
    tf = import_tensorflow()
    model = tf.keras.Sequential([tf.keras.Input(shape=(1,)), tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")

    class Say(tf.keras.callbacks.Callback):  # a message logged while the step runs, as a strategy logs its reduction
        def on_train_batch_begin(self, batch, logs=None):
            if log and batch == 0:
                tf.get_logger().info(log)

    return model.fit(np.ones((8, 1)), np.ones((8, 1)), batch_size=2, epochs=1, verbose=0,
                     callbacks=[*callbacks, Say()])


def test_the_probe_times_the_steps_reads_the_log_and_restores_the_logger():
    logger = import_tensorflow().get_logger()
    level, filters = logger.level, list(logger.filters)
    probe = mirrored_probes.reduction_probe()
    fit([probe], log="Reduce to /job:localhost/replica:0/task:0/device:CPU:0 then broadcast to ('x',).")
    assert probe.report[mirrored_probes.STEP_MS] > 0, probe.report
    assert probe.report[mirrored_probes.REDUCED_WITH] == "reduce to device:CPU:0, then broadcast"
    assert logger.level == level and logger.filters == filters


def test_a_probe_whose_training_failed_is_removed_by_the_next_one():
    tf = import_tensorflow()
    logger = tf.get_logger()
    level, filters = logger.level, list(logger.filters)

    class Fail(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise tf.errors.InvalidArgumentError(None, None, "No OpKernel was registered")

    with pytest.raises(tf.errors.InvalidArgumentError):
        fit([mirrored_probes.reduction_probe(), Fail()])
    assert len(logger.filters) == len(filters) + 1  # on_train_end never came
    fit([mirrored_probes.reduction_probe()])
    assert logger.filters == filters and logger.level == level
