"""kit.train.batch_size (the tuning search, the fit, the noise-scale estimator) and notebook 10's training code."""

import math

import numpy as np
import pytest

from conftest import REPO
from kit.core.errors import KitError, OptionError
from kit.tools import cells
from kit.train import batch_size as bs

#: Notebook 10's training code (its cells tagged "training"): `train_to_target` and what it calls.
LESSON = cells.run_tagged(REPO / "notebooks" / "10-critical-batch-size.ipynb", "training")
MNIST = str(REPO / "kit" / "train" / "datasets" / "mnist.npz")


def test_the_batches_are_a_new_permutation_each_epoch_and_the_same_in_every_process():
    stream = LESSON["batches"](1000, seed=7, examples=3000)
    rows = [next(stream) for _ in range(6)]
    for epoch in range(2):
        assert sorted(np.concatenate(rows[3 * epoch:3 * epoch + 3])) == list(range(3000))   # each epoch: all once
    assert not np.array_equal(rows[:3], rows[3:])                                          # a new order each epoch
    again = LESSON["batches"](1000, seed=7, examples=3000)
    assert all(np.array_equal(next(again), row) for row in rows)                           # the same in any process


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


def test_tune_brackets_the_best_rate_and_gives_later_runs_twice_the_best_steps():
    """A made-up run whose steps are least at rate 0.4 (and that diverges above 1.6): the search tries outward from
    its start until the best is inside the tried range, and bounds every later run by twice the best so far."""
    calls = []

    def run(lr, max_steps):
        calls.append((lr, max_steps))
        steps = round(1000 * (1 + abs(math.log2(lr / 0.4))))
        if lr > 1.6 or steps > max_steps:
            return {"steps": None, "status": "diverged" if lr > 1.6 else "not reached", "ran_steps": max_steps}
        return {"steps": steps, "status": "reached", "ran_steps": steps}

    rows = bs.tune(run, 25_000, start=1.6, also=(3.2,))
    grid = sorted(r["learning_rate"] for r in rows if r["on_grid"])
    best = min((r for r in rows if r["steps"]), key=lambda r: r["steps"])
    assert best["learning_rate"] == 0.4 and grid[0] < 0.4 < grid[-1], rows
    assert calls[:2] == [(1.6, 25_000), (2.2627, 6000)], calls      # then twice the 3,000 steps of rate 1.6
    assert [r for r in rows if not r["on_grid"]] == [{"steps": None, "status": "diverged", "ran_steps": 2000,
                                                       "learning_rate": 3.2, "on_grid": False}]
    with pytest.raises(OptionError, match="lrs"):
        bs.tune(run, 100, lrs=())


def test_the_grid_and_budget():
    assert bs.LR_GRID[0] == 0.1 and bs.LR_GRID[-1] == pytest.approx(0.1 * 2 ** 4.5, rel=1e-3)
    assert all(b / a == pytest.approx(2 ** 0.5, rel=1e-3) for a, b in zip(bs.LR_GRID, bs.LR_GRID[1:]))
    assert bs.max_steps_for(16) == 25_000 and bs.max_steps_for(4096) == math.ceil(4e6 / 4096)


@pytest.mark.slow
def test_accumulated_micro_batches_train_as_one_batch(make_cluster):
    """Notebook 10's train_to_target at batch 2048: in one piece or as 2 micro-batches of 1024, the same run."""
    cluster = make_cluster(workers=1)
    run = cluster.with_options(stream=False).run
    kwargs = dict(max_steps=40, target=1.01, mnist_path=MNIST)   # a fixed number of steps: the target is never reached
    (whole,), (pieces,) = (run(LESSON["train_to_target"], 2048, 0.8, micro_batch=m, **kwargs) for m in (2048, 1024))
    assert pieces["ran_steps"] == whole["ran_steps"] == 40 and pieces["status"] == "not reached", pieces
    assert np.allclose(pieces["curve"], whole["curve"], atol=1e-3), (pieces["curve"], whole["curve"])
