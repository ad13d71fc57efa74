"""Notebook 06 taken home: ``kit export`` writes its lesson (the custom loop, ``train``) as ``main.py``, which runs as
a cluster runs a job (two plain ``python main.py`` processes, each with its own TF_CONFIG, no kit) and trains what
the notebook's ``train`` trains on a ``kit.TFCluster`` from the same seed."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest

from take_home import MNIST, export, run_tasks

LESSON = "06-custom-training-loop"
#: 2 workers, 2 epochs of 5 steps at 32 per replica, 2 test batches, the bundled MNIST, seed 1.
ARGS = ["--mnist-path", MNIST, "--seed", "1", "--epochs", "2", "--steps-per-epoch", "5", "--examples", "1024",
        "--eval-steps", "2"]
KWARGS = {"per_replica_batch_size": 32, "epochs": 2, "steps_per_epoch": 5, "learning_rate": 0.05, "l2": 1e-4,
          "examples": 1024, "eval_steps": 2, "mnist_path": MNIST, "seed": 1}
#: Plain processes against the kit's engines: the same code, seed and data; only float rounding may differ.
RTOL_KIT = 1e-4


@pytest.mark.slow  # two plain workers and a 2-worker kit cluster (~30 s each on 2 cores)
def test_the_custom_loop_trains_as_two_plain_workers_as_it_trains_on_the_kit(tmp_path, make_cluster, monkeypatch):
    script = export(LESSON, tmp_path)
    plain = run_tasks(script, {"worker": 2}, ARGS, timeout=300)
    assert [len(r["loss"]) for r in plain] == [2, 2], f"expected 2 epochs of history per worker, got {plain}"
    np.testing.assert_allclose(plain[1]["loss"], plain[0]["loss"], rtol=1e-5,
                               err_msg="expected both plain workers to end with the same loss")
    assert [r["saved_to"][-1] for r in plain] == ["ckpt/ckpt-2", "workertemp_1/ckpt/ckpt-2"], \
        f"expected the tutorial's checkpoint folders, measured {[r['saved_to'] for r in plain]}"

    namespace = {"__name__": "lesson_06"}  # the lesson's code as exported, sent by value
    with mock.patch.dict(os.environ):  # main.py sets TF_USE_LEGACY_KERAS at its top: not for this process
        exec(compile(script.read_text(), str(script), "exec"), namespace)  # noqa: S102 - the test's own export
    monkeypatch.setenv("KIT_VIEW", "text")
    cluster = make_cluster(workers=2)
    on_kit = cluster.run(namespace["train"], **KWARGS, checkpoint_dir=str(tmp_path / "kit" / "ckpt"))
    print(f"final losses: plain {[r['loss'][-1] for r in plain]}, kit {[r['loss'][-1] for r in on_kit]}")
    for task, result in zip(cluster.task_names, on_kit):
        np.testing.assert_allclose(result["loss"], plain[0]["loss"], rtol=RTOL_KIT,
                                   err_msg=f"expected {task} on the kit to train as the plain workers did")
