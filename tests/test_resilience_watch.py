"""The watcher: the lesson's training, journaled from outside (kit.train.watch.watcher / error_journal)."""

from __future__ import annotations

import pytest

from kit.train import resilience, watch


def test_first_batches_keeps_each_attempts_first_record(tmp_path):
    first = resilience.Journal(tmp_path, task="worker:0")
    first.write("start", initial_step=0)
    first.write("first_batch", labels=[3, 1, 4])
    first.write("first_batch", labels=[9, 9, 9])  # a later record of the same attempt does not count
    second = resilience.Journal(tmp_path, task="worker:0")
    second.write("start", initial_step=2)
    second.write("first_batch", labels=[3, 1, 4])
    resilience.Journal(tmp_path, task="worker:1").write("first_batch", labels=[5])
    assert watch.first_batches(tmp_path) == {1: [3, 1, 4], 2: [3, 1, 4]}
    assert watch.first_batches(tmp_path, "worker:1") == {1: [5]}


def _train(run_dir, steps, labels, callbacks=()):
    """A learner's small fit, with callbacks passed in (the shape of the notebooks' ``train``)."""
    import numpy as np
    import tensorflow as tf

    images = np.arange(len(labels) * 4, dtype=np.float32).reshape(len(labels), 4)
    dataset = tf.data.Dataset.from_tensor_slices((images, np.array(labels, np.int64))).repeat().batch(4)
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)), tf.keras.layers.Dense(10)])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="sgd")
    history = model.fit(dataset, epochs=2, steps_per_epoch=steps, callbacks=list(callbacks), verbose=0)
    return history.history["loss"]


@pytest.mark.slow
def test_watcher_journals_steps_the_first_batch_and_epoch_ends(tmp_path):
    labels = [7, 2, 1, 0, 4, 1, 4, 9]
    losses = _train(str(tmp_path), 3, labels, callbacks=[watch.watcher(str(tmp_path))])
    records = [r for r in resilience.read_journal(tmp_path) if r["task"] == "local"]
    events = [r["event"] for r in records]
    assert events[0] == "start" and events[-1] == "end" and events.count("step") == 6
    assert [r["global_step"] for r in records if r["event"] == "step"] == list(range(1, 7))
    assert watch.first_batches(tmp_path, "local") == {1: labels[:4]}  # one record, the first batch
    epoch_ends = [r for r in records if r["event"] == "epoch_end"]
    assert [r["loss"] for r in epoch_ends] == pytest.approx(losses)
    assert resilience.final_losses(tmp_path, "local")[3] == pytest.approx(losses[0])  # logs as logged



@pytest.mark.slow
def test_error_journal_journals_the_error_of_a_training_step_and_lets_it_go_on(tmp_path):
    import numpy as np
    import tensorflow as tf

    labels = np.array([0, 1, 2, 3, 12, 5, 6, 7], np.int64)  # 12: outside the 10 classes, in the second batch
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((8, 4), np.float32), labels)).batch(4)
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)), tf.keras.layers.Dense(10)])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="sgd")
    with pytest.raises(tf.errors.InvalidArgumentError):
        model.fit(dataset, epochs=1, callbacks=[watch.error_journal(str(tmp_path))], verbose=0)
    record = resilience.wait_for_event(tmp_path, "local", "error", timeout=1)
    assert record["error"] == "InvalidArgumentError", f"expected the step's error journaled, measured {record}"
