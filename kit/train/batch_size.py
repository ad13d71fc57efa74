"""How many steps a batch size needs: time to accuracy, the critical batch size, the gradient noise scale.

Two published results on data parallelism, measured on MNIST (notebooks 10 and 10b):

- Shallue et al. 2018 ("Measuring the effects of data parallelism on neural network training"): with the
  learning rate tuned for each batch size, the *steps* to reach a target accuracy fall as 1/B at small B
  (perfect scaling), then more slowly (diminishing returns), then not at all (maximal data parallelism).
- McCandlish et al. 2018 ("An empirical model of large-batch training"): the steps follow
  S = S_min (1 + B_crit / B), and the critical batch size B_crit is predicted by the gradient noise
  scale, measured during training from gradients at two batch sizes. Under MultiWorkerMirroredStrategy
  every worker has both: its own local gradient (batch b) and the all-reduced one (batch N·b).

The training is the notebooks' own plain TensorFlow (notebook 10's ``train_to_target``, 10b's
``noise_scale_run``), run on a cluster's tasks. This module is the kernel's side, numpy only: the search
for a tuned learning rate around a run (:func:`tune`, which the trial notebook
``notebooks/trials/critical-batch-trial.ipynb`` calls per point of a sweep), :func:`fit_critical_batch`,
:func:`scaling_slopes` and :func:`noise_scale`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..core.errors import KitError, OptionError

#: Test accuracy each run trains to.
TARGET = 0.97
#: Learning rates tried: factor √2 apart, 0.1 to 2.26 (plain SGD on this MLP diverges above ~2 even with warmup).
LR_GRID = tuple(round(0.1 * 2 ** (k / 2), 4) for k in range(10))
#: Gradual warmup length (steps), for the runs with warmup: linear from 0 to the learning rate.
WARMUP_STEPS = 100
#: The base of the linear scaling rule (Goyal et al. 2017): batch 16, and its tuned learning rate
#: (0.14-0.28 reach the target within 20 % of each other at batch 16: notebooks/results/critical-batch-full.csv).
BASE_BATCH, BASE_LR = 16, 0.2


def max_steps_for(batch: int) -> int:
    """The step budget of one run at ``batch``: 4 M examples (67 epochs), at most 25,000 steps."""
    return int(min(25_000, math.ceil(4_000_000 / batch)))


def tune(run: Callable[[float, int], dict[str, Any]], budget: int, *, lrs: Sequence[float] = LR_GRID,
         start: float | None = None, also: Sequence[float] = ()) -> list[dict[str, Any]]:
    """The runs of one batch size over the grid ``lrs``, searched outward from ``start``.

    ``run(learning_rate, max_steps)`` trains one run of at most ``budget`` steps (notebook 10's
    ``train_to_target`` on a task) and returns its row: ``steps`` (None unless reached), ``status`` and
    ``ran_steps``. From the grid value nearest ``start`` (default: the middle), the search goes up, then down,
    until two rates in a row are no better than the best (or fail): the best rate is then inside the tried
    range, as Shallue et al. require of a tuned point. Once a run is known, later ones get ``max_steps`` of twice
    its steps: past that they are slower than the best, and their exact count does not matter. ``also``: rates
    run in any case (e.g. the linear scaling rule's), reported with ``on_grid=False``. Each row gets its
    ``learning_rate`` and ``on_grid``.
    """
    grid = sorted(float(lr) for lr in lrs)
    if not grid:
        raise OptionError("lrs", "is empty", "give at least one learning rate, e.g. lrs=(0.1, 0.2)")
    centre = len(grid) // 2 if start is None else int(np.argmin([abs(math.log(lr / start)) for lr in grid]))
    runs: dict[float, dict[str, Any]] = {}

    def best() -> int | None:
        reached = [r["steps"] for r in runs.values() if r["steps"] is not None]
        return min(reached) if reached else None

    def tried(lr: float) -> dict[str, Any]:
        if lr not in runs:
            known = best()
            runs[lr] = run(lr, budget if known is None else min(budget, 2 * known))
        return runs[lr]

    for direction in (+1, -1):
        worse = 0
        index = centre if direction > 0 else centre - 1
        while 0 <= index < len(grid) and worse < 2:
            before = best()
            row = tried(grid[index])
            better = row["steps"] is not None and (before is None or row["steps"] < before)
            worse = 0 if better else worse + 1
            index += direction
    for lr in also:
        tried(float(lr))
    return [{**row, "learning_rate": lr, "on_grid": lr in grid} for lr, row in sorted(runs.items())]


# ----- kernel side: numpy only --------------------------------------------------------------------
def fit_critical_batch(batches: Sequence[float], steps: Sequence[float]) -> dict[str, float]:
    """Fit S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018, eq. 2.11) by least squares on log S.

    S is linear in 1/B (S = S_min + S_min·B_crit / B); the fit weighs each point by its relative error, so
    that the many steps of small batches do not outvote the large ones. Returns S_min, B_crit and
    E_min = S_min · B_crit (the fewest examples, reached at small batches).
    """
    b = np.asarray(batches, float)
    s = np.asarray(steps, float)
    if len(b) < 3 or len(b) != len(s) or (b <= 0).any() or (s <= 0).any():
        raise KitError(f"fit_critical_batch needs 3 or more positive (batch, steps) pairs, got {len(b)} "
                       f"batches and {len(s)} step counts", fix="pass the tuned steps of at least three batch sizes")
    design = np.stack([np.ones_like(b), 1 / b], axis=1) / s[:, None]
    (s_min, c), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    if s_min <= 0 or c <= 0:
        raise KitError(f"the steps do not follow S_min(1 + B_crit/B) (fit gave S_min={s_min:.3g}, "
                       f"S_min·B_crit={c:.3g})", fix="use batch sizes on both sides of the knee, and tuned steps")
    return {"s_min": float(s_min), "b_crit": float(c / s_min), "e_min": float(c)}


def scaling_slopes(batches: Sequence[float], steps: Sequence[float]) -> list[float]:
    """d log S / d log B between neighbouring batch sizes: −1 is perfect scaling, 0 no gain at all."""
    b, s = np.log(np.asarray(batches, float)), np.log(np.asarray(steps, float))
    return [float((s[i + 1] - s[i]) / (b[i + 1] - b[i])) for i in range(len(b) - 1)]


def noise_scale(small: Sequence[float], big: Sequence[float], b_small: float, b_big: float) -> dict[str, float]:
    """The noise scale from mean squared norms at two batch sizes (McCandlish et al. 2018, appendix A.1).

    With E|G_B|² = |G|² + tr(Σ)/B, two batch sizes give unbiased estimates of both terms:
    |G|² = (B_big·|G_big|² − B_small·|G_small|²)/(B_big − B_small) and
    tr(Σ) = (|G_small|² − |G_big|²)/(1/B_small − 1/B_big); their ratio is B_simple. Fed the
    Hessian-weighted forms (gᵀHg) instead, the same formulas give tr(HΣ) and GᵀHG, and their ratio is
    B_noise. Averages are taken before the ratio (each norm is noisy, the ratio of averages is not).
    """
    if not b_big > b_small > 0:
        raise OptionError("b_big", f"{b_big} is not larger than b_small={b_small} > 0",
                          "b_small is a worker's batch, b_big the global batch (workers × b_small)")
    s_small, s_big = float(np.mean(small)), float(np.mean(big))
    signal = (b_big * s_big - b_small * s_small) / (b_big - b_small)
    noise = (s_small - s_big) / (1 / b_small - 1 / b_big)
    return {"signal": signal, "noise": noise, "scale": noise / signal if signal > 0 else float("inf")}
