"""kit.train.custom_loop: the guide's distributed loop matches model.fit, measured on a fresh engine."""

from __future__ import annotations

import numpy as np
import pytest

from kit.train import custom_loop
from kit.core.errors import OptionError
from kit.train.scaling import per_step_losses
from kit.train.strategies import build_strategy


def test_step_losses_come_back_from_running_means():
    # an epoch with losses 2, 1, 0 logs the running means 2, 1.5, 1; the next epoch starts afresh
    assert per_step_losses([2.0, 1.5, 1.0, 4.0, 3.0, 2.0], 3) == [2.0, 1.0, 0.0, 4.0, 2.0, 0.0]


def test_unknown_strategy_names_the_choices():
    with pytest.raises(OptionError, match="multi_worker_mirrored") as refused:
        build_strategy("mirored")
    assert refused.value.field == "strategy" and "mirrored" in refused.value.fix


def test_loop_vs_fit_figure_draws_both_runs(tmp_path):
    result = {"loop": {"step_loss": [2.0, 1.5, 1.0]}, "fit": {"step_loss": [2.0, 1.5, 1.0]}}
    fig = custom_loop.loop_vs_fit_figure({"a": result, "b": result}, path=tmp_path / "f.png")
    assert len(fig.axes[0].lines) == 4 and (tmp_path / "f.png").is_file()


@pytest.fixture(scope="module")
def one_task():
    """A one-task cluster: a fresh process whose CPU can still be split."""
    from kit.core.cluster import TFCluster

    with TFCluster(workers=1) as cluster:
        yield cluster


@pytest.mark.slow
def test_loop_and_fit_agree_on_mirrored_strategy(one_task):
    result = one_task.with_options(stream=False).run(custom_loop.loop_and_fit, strategy="mirrored",
        per_replica_batch=16, epochs=2, steps_per_epoch=3, eval_steps=2, logical_cpus=2)[0]
    loop, fit = result["loop"], result["fit"]
    assert loop["replicas"] == 2 and len(loop["devices"]) == 2 and loop["global_batch"] == 32
    assert len(loop["step_loss"]) == len(fit["step_loss"]) == 6
    assert np.allclose(loop["step_loss"], fit["step_loss"], rtol=1e-4, atol=1e-5)
    assert np.allclose(loop["epoch_loss"], fit["epoch_loss"], rtol=1e-4)
    assert result["max_weight_difference"] < 1e-4 < result["max_weight_change"]
    local = loop["first_step_local_losses"]
    assert len(local) == 2 and np.isclose(sum(local), loop["first_step_loss"], rtol=1e-5)
    assert loop["eval_examples"] == 2 * 32 and loop["eval_accuracy"] == pytest.approx(fit["eval_accuracy"])


@pytest.mark.slow
def test_the_split_cannot_change_once_the_runtime_started(one_task):
    def split_again():
        from kit.core.errors import KitError
        from kit.train.mirrored import split_cpu

        try:
            split_cpu(3)
        except KitError as e:
            return str(e)
        return ""

    message = one_task.with_options(stream=False).run(split_again)[0]
    assert "cannot split the CPU into 3" in message and "Fix:" in message
