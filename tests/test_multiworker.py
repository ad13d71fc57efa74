"""Error first lines, the communication option, and (slow) notebook 03b's lesson on two workers: who writes where."""

import os
from pathlib import Path

import pytest

from kit.core.errors import first_line


def test_first_line_drops_tensorflows_function_prefix():
    class FakeOpError(Exception):
        message = "{{function_node __wrapped__X_device_/job:worker}} Could not apply FILE based sharding\nmore"

    assert first_line(FakeOpError()) == "FakeOpError: Could not apply FILE based sharding"


@pytest.mark.slow
def test_chief_writes_for_real_and_the_other_worker_in_a_temporary_directory(make_cluster, tmp_path):
    """03b's ``train``: ModelCheckpoint and its tf.train.CheckpointManager save on both workers, the chief into the
    run's folder, worker 1 into a ``workertemp_1`` copy that it deletes; both trained the same model."""
    from kit.tools.cells import lesson

    mnist = str(Path(__file__).resolve().parents[1] / "kit" / "train" / "datasets" / "mnist.npz")
    cluster = make_cluster(workers=2)
    chief, other = cluster.with_options(stream=False).run(lesson("03b-checkpoints-and-tensorboard")["train"],
        str(tmp_path), 32, epochs=1, steps_per_epoch=2, validation_steps=1, seed=1, mnist_path=mnist)
    assert chief["checkpoint"] == str(tmp_path / "tf-ckpt" / "ckpt-1"), chief["checkpoint"]
    assert other["checkpoint"] == str(tmp_path / "tf-ckpt" / "workertemp_1" / "ckpt-1"), other["checkpoint"]
    assert chief["history"]["loss"] == pytest.approx(other["history"]["loss"], rel=1e-6)
    assert (tmp_path / "ckpt" / "ckpt_1.index").is_file() and (tmp_path / "tf-ckpt" / "ckpt-1.index").is_file()
    assert not [d for _, dirs, _ in os.walk(tmp_path) for d in dirs if d.startswith("workertemp")]

    # kit.train.strategies.build_strategy: the next run on the same engines gets the process's one strategy, also
    # when the chief comes to it last: a second MultiWorkerMirroredStrategy made by the chief after the other
    # worker's first broadcast reached it aborts that broadcast ("Delete called on non-empty BufRendezvous").
    # Fresh processes first: 03b's train made a strategy of its own, not through build_strategy.
    cluster.restart()

    def late_chief_builds_a_variable(delay):
        import json
        import os
        import time

        from kit.train._tf import import_tensorflow
        from kit.train.strategies import build_strategy

        tf = import_tensorflow()
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
            time.sleep(delay)
        strategy = build_strategy("multi_worker_mirrored")
        with strategy.scope():
            variable = tf.Variable(tf.ones([1000]))
        return {"same": strategy is build_strategy("multi_worker_mirrored"), "sum": float(tf.reduce_sum(variable))}

    run = cluster.with_options(stream=False).run
    assert run(late_chief_builds_a_variable, 0.0) == [{"same": True, "sum": 1000.0}] * 2  # the process's strategy
    assert run(late_chief_builds_a_variable, 2.0) == [{"same": True, "sum": 1000.0}] * 2  # the next run: the same


def test_a_keras_file_save_needs_its_folder_and_a_savedmodel_save_makes_it(tmp_path):
    """Notebook 03's note in step 4, for the kit's Keras (tf-keras): a `.keras` save does not create its folder (the
    chief's save failed when worker 1's `makedirs` of workertemp_1 came after it); a SavedModel save does."""
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    assert type(model).__module__.startswith("tf_keras"), type(model).__module__
    with pytest.raises(FileNotFoundError):
        model.save(str(tmp_path / "missing" / "model.keras"))
    model.save(str(tmp_path / "new" / "model"))
    assert (tmp_path / "new" / "model" / "saved_model.pb").is_file()
