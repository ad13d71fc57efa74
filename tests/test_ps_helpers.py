"""kit.train.ps helpers of notebook 07: kept objects, the worker's killer, the observing callbacks."""

from __future__ import annotations

import time

import pytest

from kit.train import ps, resilience, watch


def test_kept_makes_one_object_per_factory_and_arguments():
    made = []

    def factory(*args):
        made.append(args)
        return object()

    first = ps.kept(factory, 1, 2)
    assert ps.kept(factory, 1, 2) is first
    assert ps.kept(factory, 3) is not first
    assert made == [(1, 2), (3,)]


class FakeCluster:
    def __init__(self):
        self.killed = []

    def kill(self, task):
        self.killed.append(task)


def test_killer_kills_once_the_chief_journals_the_step(tmp_path):
    cluster = FakeCluster()
    killer = watch.kill_after_step(cluster, "worker:1", tmp_path, 3)
    resilience.Journal(tmp_path, task="chief:0").write("step", global_step=3)
    killed_at = killer.join(timeout=30)
    assert cluster.killed == ["worker:1"] and killed_at <= time.time()


def test_killer_hands_its_failure_to_join(tmp_path):
    killer = watch.Killer(FakeCluster(), "worker:1", tmp_path, 3, timeout=0.2)
    with pytest.raises(TimeoutError, match="did not reach step 3"):
        killer.join(timeout=30)


@pytest.mark.slow
def test_the_observer_and_the_sidecar_callback_on_a_local_model(monkeypatch):
    from kit.train import progress
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    published = {}
    monkeypatch.setattr(progress, "publish", lambda **fields: published.update(fields) or True)
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(3,)), tf.keras.layers.Dense(2, name="d")])
    model.compile(loss="mse", optimizer="sgd")
    model.fit(tf.zeros((8, 3)), tf.zeros((8, 2)), batch_size=4, epochs=2, verbose=0, callbacks=[ps.observer()])
    assert published["versions"] == [2, 4], f"expected the version after each epoch, got {published['versions']}"
    rows = {r["variable"]: r for r in published["variables"]}
    assert {"d.kernel", "d.bias", "optimizer.iterations"} <= set(rows) and rows["d.kernel"]["shape"] == [3, 2], rows
    model.evaluate(tf.zeros((8, 3)), tf.zeros((8, 2)), batch_size=4, verbose=0, callbacks=[ps.sidecar_evaluations()])
    (evaluation,) = published["evaluations"]
    assert evaluation["step"] == 4 and evaluation["loss"] == pytest.approx(0.0), evaluation
    metric = tf.keras.metrics.SparseCategoricalAccuracy()
    rows = {r["variable"]: r for r in ps.placement(model, model.optimizer, metric)}
    assert {"sparse_categorical_accuracy.total", "sparse_categorical_accuracy.count"} <= set(rows), rows
