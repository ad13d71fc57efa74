"""Notebook 06's custom loop (its cells tagged ``training``) matches model.fit, measured on a fresh engine."""

from __future__ import annotations

import numpy as np
import pytest

import kit
from conftest import REPO
from kit.core.errors import OptionError
from kit.tools import cells
from kit.train.scaling import per_step_losses
from kit.train.strategies import build_strategy

LESSON_06 = REPO / "notebooks" / "06-custom-training-loop.ipynb"
#: 06's parameters, made small: six epochs of one step each, so that each epoch's loss is one step's loss.
SMALL = dict(LOGICAL_CPUS=2, PER_REPLICA_BATCH=16, EXAMPLES=512, EPOCHS=6, STEPS_PER_EPOCH=1, EVAL_STEPS=2)


def lesson_06() -> dict:
    """06's `parameters` cell with :data:`SMALL` over it, then its cells tagged ``training`` (``train`` takes
    ``EPOCHS`` as its default when the cell runs)."""
    namespace = cells.run_tagged(LESSON_06, "parameters", {"__name__": "__main__", "kit": kit})
    namespace.update(SMALL)
    return cells.run_tagged(LESSON_06, "training", namespace)


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
    result = one_task.with_options(stream=False).run(code["train"], "mirrored", str(tmp_path / "checkpoints"))[0]
    loop, fit = result["loop"], result["fit"]
    assert result["replicas"] == 2 and len(result["devices"]) == 2 and result["global_batch"] == 32
    assert result["regularization_losses"] == 3                    # L2 on every kernel: model.losses not empty
    assert len(loop["step_loss"]) == len(loop["epoch_loss"]) == len(fit["epoch_loss"]) == 6
    assert loop["epoch_loss"] == loop["step_loss"]                 # one step per epoch: each epoch's loss is a step's
    assert np.allclose(loop["epoch_loss"], fit["epoch_loss"], rtol=1e-4, atol=1e-5)   # every step's loss
    assert np.allclose(loop["accuracy"], fit["accuracy"], atol=1e-6)
    assert result["max_weight_difference"] < 1e-4 < result["max_weight_change"]
    local = loop["local_losses"]
    assert len(local) == 2 and np.isclose(sum(local), loop["step_loss"][0], rtol=1e-5)
    assert loop["test_examples"] == 2 * 32 and loop["test_accuracy"] == pytest.approx(fit["test_accuracy"])
    assert [p.rsplit("/", 1)[-1] for p in loop["saved_to"]] == [f"ckpt-{e}" for e in range(1, 7)]


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
