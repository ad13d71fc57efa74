"""kit.train.observe: the recording callback (on one process, and on two workers)."""

import os

import numpy as np
import pytest

from kit.train import observe


@pytest.mark.slow
def test_the_recorder_counts_hooks_and_lists_saves_after_fit_too(tmp_path):
    from kit.train import models
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    images = np.random.default_rng(0).random((4, 28, 28), dtype=np.float32)
    labels = np.arange(4, dtype=np.int64)
    model = models.build_and_compile_cnn_model()
    recorder = observe.fit_recorder(tmp_path, images, watch=("ckpt",))
    checkpoint = tf.keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt" / "ckpt_{epoch}"), save_weights_only=True)
    model.fit(tf.data.Dataset.from_tensor_slices((images, labels)).batch(2).repeat(), epochs=2, steps_per_epoch=3,
              verbose=0, callbacks=[checkpoint, recorder])
    model.save(str(tmp_path / "model.keras"))
    record = recorder.record

    assert record["hooks"] == {"on_train_begin": 1, "on_epoch_begin": 2, "on_train_batch_end": 6,
                               "on_epoch_end": 2, "on_train_end": 1}
    assert record["steps_per_epoch"] == [3, 3] and len(record["batch_loss"]) == 6
    assert [e["loss"] for e in record["epoch_logs"]] == pytest.approx(record["batch_loss"][2::3])
    assert record["should_checkpoint"] and record["task_id"] is None  # no cluster: this process is the chief
    assert record["learning_rate"] == pytest.approx(0.001)
    assert record["saves"] == [{"call": "save_weights", "path": os.path.join("ckpt", "ckpt_1"), "exists after": True},
                               {"call": "save_weights", "path": os.path.join("ckpt", "ckpt_2"), "exists after": True},
                               {"call": "save", "path": "model.keras", "exists after": True}]
    assert "ckpt_1.index" in record["files_at_epoch_end"][0]["ckpt"]  # the recorder ran after ModelCheckpoint
    assert np.allclose(record["predictions"], model(images, training=False).numpy())
