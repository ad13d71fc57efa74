"""Notebook 06's custom loop (its cells tagged ``lesson``) matches model.fit, measured on fresh engines."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from kit.core.errors import OptionError
from kit.tools import cells
from kit.train.scaling import per_step_losses
from kit.train.strategies import build_strategy

LESSON_06 = REPO / "notebooks" / "06-custom-training-loop.ipynb"
#: 06's lesson, made small: six epochs of one step each, so that each epoch's loss is one step's loss.
SMALL = dict(per_replica_batch_size=16, epochs=6, steps_per_epoch=1, learning_rate=0.05, l2=1e-4, examples=512,
             eval_steps=2, logical_cpus=2, mnist_path=str(REPO / "kit" / "train" / "datasets" / "mnist.npz"), seed=42,
             strategy_name="mirrored")


def lesson_06() -> dict:
    """06's cells tagged ``lesson`` (its main.py): the custom loop ``train`` and ``train_with_fit``."""
    return cells.run_tagged(LESSON_06, "lesson", {"__name__": "__main__"})


def test_step_losses_come_back_from_running_means():
    # an epoch with losses 2, 1, 0 logs the running means 2, 1.5, 1; the next epoch starts afresh
    assert per_step_losses([2.0, 1.5, 1.0, 4.0, 3.0, 2.0], 3) == [2.0, 1.0, 0.0, 4.0, 2.0, 0.0]


def test_unknown_strategy_names_the_choices():
    with pytest.raises(OptionError, match="multi_worker_mirrored") as refused:
        build_strategy("mirored")
    assert refused.value.field == "strategy" and "mirrored" in refused.value.fix


@pytest.fixture(scope="module")
def one_task():
    """A one-task cluster: a fresh process whose CPU can still be split."""
    from kit.core.cluster import TFCluster

    with TFCluster(workers=1) as cluster:
        yield cluster


@pytest.mark.slow
def test_loop_and_fit_agree_on_mirrored_strategy(one_task, tmp_path):
    code = lesson_06()
    run = one_task.with_options(stream=False).run
    loop = run(code["train"], **SMALL, checkpoint_dir=str(tmp_path / "checkpoints" / "ckpt"))[0]
    one_task.restart()  # a fresh process: its CPU can be split again
    fit = run(code["train_with_fit"], **SMALL)[0]
    assert len(loop["loss"]) == len(fit["loss"]) == 6, f"expected 6 epochs, measured {loop['loss']}, {fit['loss']}"
    assert np.allclose(loop["loss"], fit["loss"], rtol=1e-4, atol=1e-5), (loop["loss"], fit["loss"])  # every step's
    assert np.allclose(loop["accuracy"], fit["accuracy"], atol=1e-6), (loop["accuracy"], fit["accuracy"])
    local = loop["local_losses"]
    assert len(local) == 2 and np.isclose(sum(local), loop["loss"][0], rtol=1e-5), (local, loop["loss"][0])
    assert loop["test_examples"] == 2 * 32 and loop["test_accuracy"] == pytest.approx(fit["test_accuracy"])
    assert [p.rsplit("/", 1)[-1] for p in loop["saved_to"]] == [f"ckpt-{e}" for e in range(1, 7)], loop["saved_to"]
    assert loop["restored_from"] is None, loop["restored_from"]


@pytest.mark.slow
def test_the_split_cannot_change_once_the_runtime_started(one_task):
    def split_again():
        from kit.core.errors import KitError
        from kit.train.mirrored import split_cpu

        split_cpu(2)  # harmless again if the test before split this engine's CPU the same way
        import tensorflow as tf
        tf.constant(1.0) + 1.0  # an op: the runtime is initialized now, whatever ran here before
        try:
            split_cpu(3)
        except KitError as e:
            return str(e)
        return f"no error; logical CPUs now: {len(tf.config.list_logical_devices('CPU'))}"

    message = one_task.with_options(stream=False).run(split_again)[0]
    assert "cannot split the CPU into 3 devices" in message and "initialized with 2" in message, message
    assert "Fix:" in message
