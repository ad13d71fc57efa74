"""Notebook 02's guide pieces and 02b's cross-device ops (their cells tagged ``training``), kit.train.mirrored (log
reading, logical CPUs) and kit.train.probes (the files a run wrote)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from kit.tools import cells
from kit.train import mirrored, probes

LESSON_02 = REPO / "notebooks" / "02-mirrored-and-local-strategies.ipynb"
#: 02's cells tagged "training" (02b runs them too): `build_toy_model`, `mnist_datasets`, `build_model`, `decay`.
GUIDE = cells.run_tagged(LESSON_02, "training")


@pytest.mark.parametrize("replicas, rate", [(2, 0.15), (3, 0.1625), (8, 0.175)])
def test_the_guides_learning_rate_for_the_global_batch(replicas, rate):
    """02's cell tagged ``learning-rate``: the table's rate, interpolated between its entries, its last beyond."""
    namespace = {"np": np, "GUIDE_PER_REPLICA_BATCH": 5, "described": {"replicas": replicas}}
    cells.run_tagged(LESSON_02, "learning-rate", namespace)   # global batch 10, 15, 40
    assert namespace["learning_rate"] == pytest.approx(rate) and namespace["global_batch_size"] == 5 * replicas


def test_guide_decay_schedule():
    assert [GUIDE["decay"](e) for e in (0, 2, 3, 6, 7)] == [1e-3, 1e-3, 1e-4, 1e-4, 1e-5]


def test_reduction_summary_prefers_the_gradient_reduction():
    ring = "Collective all_reduce tensors: 6 all_reduces, num_devices = 2, group_size = 2, " \
           "implementation = CommunicationImplementation.RING, num_packs = 1"
    one = "Reduce to /job:localhost/replica:0/task:0/device:CPU:0 then broadcast to ('x',)."
    assert mirrored.reduction_summary([one, ring]) == "collective all-reduce, RING"
    assert mirrored.reduction_summary(["batch_all_reduce: 6 all-reduces with algorithm = hierarchical_copy, "
                                       "num_packs = 1"]) == "batch all-reduce, hierarchical_copy"
    assert mirrored.reduction_summary([one]) == "reduce to device:CPU:0, then broadcast"
    assert mirrored.reduction_summary(["nothing"]) == ""


def test_02b_cross_device_ops_names():
    cross_device_ops = cells.run_tagged(REPO / "notebooks" / "02b-cross-device-ops-and-other-strategies.ipynb",
                                        "training")["cross_device_ops"]
    assert cross_device_ops("default") is None
    assert type(cross_device_ops("ReductionToOneDevice")).__name__ == "ReductionToOneDevice"
    assert type(cross_device_ops("HierarchicalCopyAllReduce")).__name__ == "HierarchicalCopyAllReduce"
    with pytest.raises(KeyError, match="Nccl"):
        cross_device_ops("Nccl")


def test_guide_models_and_pipeline_have_the_tutorials_shapes():
    cnn = GUIDE["build_model"]()
    assert [type(layer).__name__ for layer in cnn.layers] == ["Conv2D", "MaxPooling2D", "Flatten", "Dense", "Dense"]
    train, test = GUIDE["mnist_datasets"](5, 5, 3, seed=1)
    (x_train, y_train), = train.as_numpy_iterator()
    (x_test, _), = test.as_numpy_iterator()
    assert x_train.shape == (5, 28, 28, 1) and x_train.dtype == np.float32 and x_train.max() <= 1.0
    assert cnn(x_test).shape == (3, 10) and y_train.dtype == np.int64
    assert GUIDE["build_toy_model"](0.2).optimizer.learning_rate.numpy() == pytest.approx(0.2)


@pytest.mark.slow  # TensorFlow in a new process: 2.7 s
def test_split_cpu_in_a_fresh_process():
    code = textwrap.dedent("""
        from kit.train import mirrored
        from kit.train._tf import import_tensorflow
        from kit.core.errors import KitError
        tf = import_tensorflow()
        devices = mirrored.split_cpu(3)
        assert len(devices) == 3, devices
        assert len(mirrored.split_cpu(3)) == 3          # same split again: harmless
        assert tf.distribute.MirroredStrategy().num_replicas_in_sync == 3
        try:
            mirrored.split_cpu(2)
        except KitError as error:
            assert "restart the kernel" in str(error)
        else:
            raise AssertionError("a new split after start-up was accepted")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_files_under_skips_a_folder_another_task_deletes_while_it_lists(tmp_path, monkeypatch):
    # workers delete their workertemp_N checkpoint folders while the chief's probe lists the tree
    for name in ("ckpt/checkpoint", "ckpt/workertemp_1/ckpt_2_temp/x.index", "logs/a"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    real_scandir = os.scandir

    def scandir(path):
        if Path(path).name == "ckpt_2_temp":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        if Path(path).name == "logs":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PermissionError):  # only a vanished folder is skipped
        probes.files_under(tmp_path)
    assert probes.files_under(tmp_path / "ckpt") == ["checkpoint"]
    assert isinstance(probes.tensorboard_installed(), bool)
