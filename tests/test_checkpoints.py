"""kit.train.checkpoints: who saves for real, where the others write, and save/restore on one process."""

import os

import numpy as np
import pytest

from kit.train import checkpoints


@pytest.mark.parametrize("task_type, task_id, spec, chief", [
    (None, None, None, True),                                  # no cluster at all
    ("chief", 0, {"chief": ["a:1"], "worker": ["b:1"]}, True),
    ("worker", 0, {"worker": ["a:1", "b:1"]}, True),           # worker 0 is the chief when there is none
    ("worker", 0, {"chief": ["a:1"], "worker": ["b:1"]}, False),
    ("worker", 1, {"worker": ["a:1", "b:1"]}, False),
    ("evaluator", 0, {"worker": ["a:1"]}, False),
])
def test_is_chief_follows_the_tutorials_rule(task_type, task_id, spec, chief):
    assert checkpoints.is_chief(task_type, task_id, spec) is chief


def test_only_the_chief_writes_to_the_real_directory():
    spec = {"worker": ["a:1", "b:1", "c:1"]}
    assert checkpoints.write_dirpath("/ckpt", "worker", 0, spec) == "/ckpt"
    assert checkpoints.write_dirpath("/ckpt", "worker", 2, spec) == os.path.join("/ckpt", "workertemp_2")


def test_strategies_without_a_cluster_have_no_task():
    class NoResolver:
        cluster_resolver = None

    assert checkpoints.task_of(NoResolver()) == (None, None, {})
    assert checkpoints.task_of(object()) == (None, None, {})


def test_chief_keeps_its_checkpoint_and_restores_it(tmp_path):
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    value = tf.Variable([1.0, 2.0])
    saved = checkpoints.save(tf.train.Checkpoint(value=value), tmp_path)
    assert saved["chief"] and saved["kept"] and saved["write_dir"] == str(tmp_path)
    assert saved["wrote"] == str(tmp_path / "ckpt-1")
    assert {os.path.basename(f) for f in saved["files"]} >= {"checkpoint", "ckpt-1.index"}

    other = tf.Variable([0.0, 0.0])
    assert checkpoints.restore_latest(tf.train.Checkpoint(value=other), tmp_path) == str(tmp_path / "ckpt-1")
    assert np.array_equal(other.numpy(), [1.0, 2.0])


def test_another_worker_writes_to_a_temporary_directory_and_deletes_it(tmp_path):
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    saved = checkpoints.save(tf.train.Checkpoint(value=tf.Variable(3.0)), tmp_path, task_type="worker",
                             task_id=1, cluster_spec={"worker": ["a:1", "b:1"]})
    assert not saved["chief"] and not saved["kept"]
    assert saved["write_dir"] == str(tmp_path / "workertemp_1") and saved["files"]
    assert not os.listdir(tmp_path), "the temporary copy must be gone"


def test_restore_from_an_empty_directory_restores_nothing(tmp_path):
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    assert checkpoints.restore_latest(tf.train.Checkpoint(value=tf.Variable(1.0)), tmp_path) is None


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
