"""kit.train.batch_size: the time-to-accuracy study's pieces, the fit, and the noise-scale estimator."""

import math

import numpy as np
import pytest

from conftest import REPO
from kit.core.errors import KitError, OptionError
from kit.tools import cells
from kit.train import batch_size as bs
from kit.train import gradient_noise as gn

#: Notebook 10's steps (its cells tagged "training"): `accumulation_step` and `worker_step`.
LESSON = cells.run_tagged(REPO / "notebooks" / "10-critical-batch-size.ipynb", "training")


def test_batch_stream_is_a_new_permutation_each_epoch_and_the_same_in_every_process():
    stream = bs.BatchStream(1000, seed=7, examples=3000)
    rows = stream.rows(0, 6)
    assert rows.shape == (6, 1000)
    for epoch in range(2):
        assert sorted(rows[3 * epoch:3 * epoch + 3].ravel()) == list(range(3000))   # each epoch: every example once
    assert not np.array_equal(rows[:3], rows[3:])                                    # a new order each epoch
    again = bs.BatchStream(1000, seed=7, examples=3000)
    assert np.array_equal(again.rows(4, 2), rows[4:6])                               # from any step, same rows
    with pytest.raises(OptionError, match="batch"):
        bs.BatchStream(0, seed=1)


def test_the_fit_recovers_a_known_critical_batch():
    batches = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    steps = [500 * (1 + 150 / b) for b in batches]
    fit = bs.fit_critical_batch(batches, steps)
    assert math.isclose(fit["s_min"], 500, rel_tol=1e-6) and math.isclose(fit["b_crit"], 150, rel_tol=1e-6)
    assert math.isclose(fit["e_min"], 75_000, rel_tol=1e-6)
    noisy = [s * (1 + 0.04 * (-1) ** i) for i, s in enumerate(steps)]   # the evaluation's 4 % resolution
    assert 0.8 < bs.fit_critical_batch(batches, noisy)["b_crit"] / 150 < 1.25
    with pytest.raises(KitError, match="3 or more"):
        bs.fit_critical_batch([16, 32], [100, 50])
    with pytest.raises(KitError, match="do not follow"):
        bs.fit_critical_batch([16, 32, 64], [100, 200, 400])   # steps growing with the batch


def test_slopes_say_the_regime():
    assert bs.scaling_slopes([16, 32, 64], [800, 400, 400]) == pytest.approx([-1.0, 0.0])


def test_the_noise_scale_estimator_is_unbiased_on_simulated_gradients():
    rng = np.random.default_rng(0)
    dim, true_g, sigma = 50, np.full(50, 0.1), 1.0          # |G|^2 = 0.5, tr(Sigma) = 50: B_simple = 100
    small, big = [], []
    for _ in range(4000):
        per_example = true_g + sigma * rng.standard_normal((64, dim))
        halves = per_example[:32].mean(0), per_example[32:].mean(0)
        small.append(np.mean([h @ h for h in halves]))
        big.append(per_example.mean(0) @ per_example.mean(0))
    est = bs.noise_scale(small, big, 32, 64)
    assert 0.85 < est["scale"] / 100 < 1.15, est
    assert 0.8 < est["signal"] / 0.5 < 1.2 and 0.95 < est["noise"] / 50 < 1.05
    with pytest.raises(OptionError, match="b_big"):
        bs.noise_scale(small, big, 64, 32)


def test_best_by_batch_takes_the_fastest_grid_run_that_reached():
    rows = [{"batch": 16, "steps": 900, "reached": True, "on_grid": True, "warmup": False, "learning_rate": 0.1},
            {"batch": 16, "steps": 800, "reached": True, "on_grid": False, "warmup": False, "learning_rate": 0.3},
            {"batch": 16, "steps": 850, "reached": True, "on_grid": True, "warmup": False, "learning_rate": 0.2},
            {"batch": 16, "steps": None, "reached": False, "on_grid": True, "warmup": False, "learning_rate": 2.0},
            {"batch": 64, "steps": 300, "reached": True, "on_grid": True, "warmup": True, "learning_rate": 0.8}]
    assert {b: r["learning_rate"] for b, r in bs.best_by_batch(rows).items()} == {16: 0.2, 64: 0.8}
    assert list(bs.best_by_batch(rows, warmup=False)) == [16]


def test_the_grid_and_budget():
    assert bs.LR_GRID[0] == 0.1 and bs.LR_GRID[-1] == pytest.approx(0.1 * 2 ** 4.5, rel=1e-3)
    assert all(b / a == pytest.approx(2 ** 0.5, rel=1e-3) for a, b in zip(bs.LR_GRID, bs.LR_GRID[1:]))
    assert bs.max_steps_for(16) == 25_000 and bs.max_steps_for(4096) == math.ceil(4e6 / 4096)


@pytest.mark.slow
def test_accumulated_micro_batches_update_as_real_workers_and_as_one_batch(make_cluster):
    cluster = make_cluster(workers=2)
    same = cluster.with_options(stream=False).run(gn.accumulation_vs_workers, LESSON["worker_step"],
                                                  LESSON["accumulation_step"], per_worker_batch=64, steps=4)
    for task in same:
        assert task["max_abs_update"] > 1e-3
        assert task["max_abs_difference"] <= 1e-6 * max(1.0, task["max_abs_update"]), task
    # one process: batch 2048 as 2 micro-batches of 1024 or in one piece, same run to the step
    def two_ways(step):   # defined here: cloudpickle sends it by value (a test module is not importable on engines)
        from kit.train import batch_size as bs
        kwargs = dict(max_steps=40, target=1.01)   # a fixed number of steps: the target is never reached
        return (bs.train_to_target(2048, 0.8, step, micro_batch=2048, **kwargs),
                bs.train_to_target(2048, 0.8, step, micro_batch=1024, **kwargs))

    whole, pieces = cluster.with_options(stream=False, tasks=["worker:0"]).run(two_ways, LESSON["accumulation_step"])[0]
    assert np.allclose(pieces["curve"], whole["curve"], atol=1e-3) and pieces["ran_steps"] == whole["ran_steps"] == 40


def test_train_to_target_names_bad_options():
    with pytest.raises(OptionError, match="learning_rate"):
        bs.train_to_target(64, -1.0, LESSON["accumulation_step"])
    with pytest.raises(OptionError, match="micro_batch"):
        bs.train_to_target(3000, 0.1, LESSON["accumulation_step"], micro_batch=1024)
