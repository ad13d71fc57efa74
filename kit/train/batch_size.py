"""How many steps a batch size needs: time to accuracy, the critical batch size, the gradient noise scale.

Two published results on data parallelism, measured on MNIST (notebook 10):

- Shallue et al. 2018 ("Measuring the effects of data parallelism on neural network training"): with the
  learning rate tuned for each batch size, the *steps* to reach a target accuracy fall as 1/B at small B
  (perfect scaling), then more slowly (diminishing returns), then not at all (maximal data parallelism).
- McCandlish et al. 2018 ("An empirical model of large-batch training"): the steps follow
  S = S_min (1 + B_crit / B), and the critical batch size B_crit is predicted by the gradient noise
  scale, measured during training from gradients at two batch sizes. Under MultiWorkerMirroredStrategy
  every worker has both: its own local gradient (batch b) and the all-reduced one (batch N·b).

The model is a small MLP (784-128-10, ReLU) trained with plain SGD, evaluated on the 10,000 test images at
steps spaced 4 % apart (so a step count is known to 4 %). It is small so that a whole study (9 batch
sizes, tuned learning rates, with and without warmup) runs in minutes on 2 cores; every run is
deterministic for its seed.

Large global batches on one process: a batch larger than ``micro_batch`` is computed as several
micro-batches whose gradients are averaged before the one update (gradient accumulation), which is the
update N workers make with the same examples. That step is the lesson's: notebook 10 defines it in a cell
(``accumulation_step(weights, micro_batch)`` → ``step(indices, learning_rate)``) and passes it in; the trial
notebook runs that cell. :func:`kit.train.gradient_noise.accumulation_vs_workers` checks it on a small case
against real workers.

Engine side (imports TensorFlow): the MLP (:func:`init_mlp`, :func:`loss`, :func:`accuracy`), the stream of
batches, and the measurement around the step: :func:`train_to_target`, :func:`tune` (one batch size; the trial
notebook ``notebooks/trials/critical-batch-trial.ipynb`` runs it per point of a sweep); under
MultiWorkerMirroredStrategy, :mod:`kit.train.gradient_noise`. Kernel side (numpy only): :func:`fit_critical_batch`,
:func:`scaling_slopes`, :func:`noise_scale`, :func:`best_by_batch`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from ..core.errors import KitError, OptionError
from .data import TRAIN_EXAMPLES

#: Test accuracy each run trains to.
TARGET = 0.97
HIDDEN = 128
#: Learning rates tried: factor √2 apart, 0.1 to 2.26 (plain SGD on this MLP diverges above ~2 even with warmup).
LR_GRID = tuple(round(0.1 * 2 ** (k / 2), 4) for k in range(10))
#: Steps between evaluations grow by this factor: each step count is known to 4 %.
EVAL_GROWTH = 1.04
#: Gradual warmup length (steps), for the runs with warmup: linear from 0 to the learning rate.
WARMUP_STEPS = 100
#: A run still below this test accuracy after UNSTABLE_AFTER steps and examples is stopped as unstable: a rate
#: too large for the model makes the accuracy swing around 0.3-0.6 for thousands of steps without diverging
#: (measured: batch 128 at rate 1.6 ran its whole 25,000-step budget that way); a rate that works is past 0.9 there.
UNSTABLE_BELOW = 0.8
UNSTABLE_AFTER = (200, 50_000)
#: Largest batch computed in one piece; larger ones are accumulated micro-batches of this size.
MICRO_BATCH = 1024
#: The base of the linear scaling rule (Goyal et al. 2017): batch 16, and its tuned learning rate
#: (0.14-0.28 reach the target within 20 % of each other at batch 16: notebooks/results/critical-batch-full.csv).
BASE_BATCH, BASE_LR = 16, 0.2


def max_steps_for(batch: int) -> int:
    """The step budget of one run: 4 M examples (67 epochs), at most 25,000 steps."""
    return int(min(25_000, math.ceil(4_000_000 / batch)))


# ----- engine side ------------------------------------------------------------------------------
_DATA: dict[str, Any] = {}


def _data():
    """MNIST as constants on this process (uint8 training images: 47 MB), loaded once."""
    if not _DATA:
        from ._tf import import_tensorflow
        from .data import load_mnist

        tf = import_tensorflow()
        (x, y), (xt, yt) = load_mnist()
        _DATA.update(x=tf.constant(x.reshape(-1, 784)), y=tf.constant(y.astype("int32")),
                     xt=tf.constant(xt.reshape(-1, 784).astype("float32") / 255.0), yt=yt.astype("int64"))
    return _DATA


def _tensorflow():
    """TensorFlow, the kit's way, with MNIST loaded (eagerly: tf.functions then capture the constants)."""
    from ._tf import import_tensorflow

    tf = import_tensorflow()
    _data()
    return tf


def init_mlp(seed: int, hidden: int = HIDDEN) -> list:
    """The MLP's variables [W1, b1, W2, b2], He-initialised from ``seed`` (numpy, so every process agrees)."""
    from ._tf import import_tensorflow

    tf = import_tensorflow()
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.normal(0, math.sqrt(2 / 784), (784, hidden)).astype("float32")),
            tf.Variable(np.zeros(hidden, "float32")),
            tf.Variable(rng.normal(0, math.sqrt(1 / hidden), (hidden, 10)).astype("float32")),
            tf.Variable(np.zeros(10, "float32"))]


def _logits(weights, images):
    import tensorflow as tf

    return tf.nn.relu(images @ weights[0] + weights[1]) @ weights[2] + weights[3]


def loss(weights, indices):
    """The mean cross-entropy of the MLP on the training examples ``indices`` (a batch of row numbers)."""
    import tensorflow as tf

    data = _data()
    images = tf.cast(tf.gather(data["x"], indices), tf.float32) / 255.0
    labels = tf.gather(data["y"], indices)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, _logits(weights, images)))


def accuracy(weights) -> float:
    """Test accuracy (all 10,000 test images)."""
    data = _data()
    predicted = np.argmax(_logits(weights, data["xt"]).numpy(), axis=1)
    return float((predicted == data["yt"]).mean())


class BatchStream:
    """The training examples' indices, batch after batch: a new permutation of the 60,000 every epoch
    (``drop_remainder``), from ``seed`` and the epoch number, so every process builds the same stream."""

    def __init__(self, batch: int, seed: int, examples: int = TRAIN_EXAMPLES):
        if not (isinstance(batch, int) and 0 < batch <= examples):
            raise OptionError("batch", f"{batch!r} is not a whole number in 1..{examples}", "e.g. batch=256")
        self.batch, self.seed, self.examples = batch, seed, examples
        self.per_epoch = examples // batch
        self._epoch, self._order = -1, None

    def rows(self, first: int, count: int) -> np.ndarray:
        """Steps ``first`` … ``first + count - 1`` as an int32 array [count, batch]."""
        out = np.empty((count, self.batch), np.int32)
        for n, step in enumerate(range(first, first + count)):
            epoch, k = divmod(step, self.per_epoch)
            if epoch != self._epoch:
                self._epoch = epoch
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.examples)
            out[n] = self._order[k * self.batch:(k + 1) * self.batch]
        return out


def _chunks(step):
    """A tf.function running one chunk of ``step``s: (indices [steps, B], lr, warmup, first step) → last loss.

    ``step(indices, learning_rate)`` is the lesson's SGD step on one batch (notebook 10's ``accumulation_step``);
    this adds the gradual warmup (linear from 0 over ``warmup`` steps) and runs many steps per call.
    """
    import tensorflow as tf

    spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.float32),
            tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)]

    @tf.function(input_signature=spec)
    def steps(indices, learning_rate, warmup_steps, first):
        last = tf.constant(0.0)
        for i in tf.range(tf.shape(indices)[0]):
            number = tf.cast(first + i, tf.float32)
            ramp = tf.minimum(1.0, (number + 1.0) / tf.maximum(warmup_steps, 1.0))
            last = step(indices[i], tf.where(warmup_steps > 0, learning_rate * ramp, learning_rate))
        return last

    return steps


def train_to_target(batch: int, learning_rate: float, accumulation_step, *, warmup_steps: int = 0,
                    target: float = TARGET,
                    max_steps: int | None = None, seed: int = 0, micro_batch: int = MICRO_BATCH,
                    give_up_after: int | None = None) -> dict[str, Any]:
    """Train the MLP with SGD at ``batch`` until the test accuracy reaches ``target``; the steps it took.

    ``accumulation_step(weights, micro_batch)`` makes the SGD step (notebook 10's cell), called here with
    ``min(batch, micro_batch)``.

    Stops early when the loss diverges (NaN, or above 100), when the run is unstable (test accuracy still
    below :data:`UNSTABLE_BELOW` after :data:`UNSTABLE_AFTER` steps and examples), after ``max_steps`` (default
    :func:`max_steps_for`), or after ``give_up_after`` steps (a run already slower than the best known:
    its exact count does not matter). Returns the run's row: ``steps`` (None if not reached),
    ``examples``, ``reached``, ``diverged``, ``unstable``, ``ran_steps``, ``seconds``, and ``curve`` [[step, accuracy], ...].
    """
    if not (isinstance(learning_rate, (int, float)) and learning_rate > 0):
        raise OptionError("learning_rate", f"{learning_rate!r} is not a number > 0", "e.g. learning_rate=0.2")
    if batch > micro_batch and batch % micro_batch:
        raise OptionError("micro_batch", f"{micro_batch} does not divide the batch {batch}",
                          "use a power of two for both (e.g. batch=4096, micro_batch=1024)")
    tf = _tensorflow()
    limit = max_steps or max_steps_for(batch)
    if give_up_after is not None:
        limit = min(limit, int(give_up_after))
    stream = BatchStream(batch, seed)
    weights = init_mlp(seed)
    steps = _chunks(accumulation_step(weights, min(batch, micro_batch)))
    step, curve, diverged, reached, unstable = 0, [], False, False, False
    started = time.perf_counter()
    while step < limit:
        chunk = min(limit, max(step + 1, math.ceil(step * EVAL_GROWTH))) - step
        loss = float(steps(tf.constant(stream.rows(step, chunk)), tf.constant(float(learning_rate)),
                           tf.constant(float(warmup_steps)), tf.constant(step)))
        step += chunk
        if not math.isfinite(loss) or loss > 100:
            diverged = True
            break
        curve.append([step, accuracy(weights)])
        if curve[-1][1] >= target:
            reached = True
            break
        if step >= UNSTABLE_AFTER[0] and step * batch >= UNSTABLE_AFTER[1] and curve[-1][1] < UNSTABLE_BELOW:
            unstable = True
            break
    return {"batch": batch, "learning_rate": float(learning_rate), "warmup_steps": int(warmup_steps),
            "target": target, "steps": step if reached else None, "examples": step * batch if reached else None,
            "reached": reached, "diverged": diverged, "unstable": unstable, "ran_steps": step,
            "seconds": round(time.perf_counter() - started, 2), "curve": curve, "seed": seed}


def tune(batch: int, accumulation_step, *, warmup_steps: int = 0, lrs: Sequence[float] = LR_GRID,
         start: float | None = None, also: Sequence[float] = (), target: float = TARGET, seed: int = 0,
         micro_batch: int = MICRO_BATCH) -> list[dict[str, Any]]:
    """Runs of :func:`train_to_target` at ``batch`` over the grid ``lrs``, searched outward from ``start``.

    From the grid value nearest ``start`` (default: the middle), it goes up, then down, until two rates
    in a row are no better than the best (or fail): the best rate is then inside the tried range, as
    Shallue et al. require of a tuned point. A run is stopped once it takes 2× the best steps so far.
    ``also``: rates run in any case (e.g. the linear scaling rule's), reported with ``on_grid=False``.
    """
    grid = sorted(float(lr) for lr in lrs)
    if not grid:
        raise OptionError("lrs", "is empty", "give at least one learning rate, e.g. lrs=(0.1, 0.2)")
    centre = len(grid) // 2 if start is None else int(np.argmin([abs(math.log(lr / start)) for lr in grid]))
    runs: dict[float, dict[str, Any]] = {}

    def best() -> int | None:
        reached = [r["steps"] for r in runs.values() if r["reached"]]
        return min(reached) if reached else None

    def run(lr: float) -> dict[str, Any]:
        if lr not in runs:
            known = best()
            runs[lr] = train_to_target(batch, lr, accumulation_step, warmup_steps=warmup_steps, target=target, seed=seed,
                                       micro_batch=micro_batch,
                                       give_up_after=None if known is None else 2 * known)
        return runs[lr]

    for direction in (+1, -1):
        worse = 0
        index = centre if direction > 0 else centre - 1
        while 0 <= index < len(grid) and worse < 2:
            before = best()
            row = run(grid[index])
            better = row["reached"] and (before is None or row["steps"] < before)
            worse = 0 if better else worse + 1
            index += direction
    for lr in also:
        run(float(lr))
    rows = []
    for lr, row in sorted(runs.items()):
        rows.append({**{k: v for k, v in row.items() if k != "curve"}, "on_grid": lr in grid})
    return rows


# ----- kernel side: numpy only --------------------------------------------------------------------
def best_by_batch(rows: Sequence[dict[str, Any]], warmup: bool | None = None) -> dict[int, dict[str, Any]]:
    """The tuned point of each batch size: the grid run that reached the target in the fewest steps."""
    best: dict[int, dict[str, Any]] = {}
    for row in rows:
        if not row.get("reached") or not row.get("on_grid", True):
            continue
        if warmup is not None and bool(row.get("warmup")) != warmup:
            continue
        batch = int(row["batch"])
        if batch not in best or row["steps"] < best[batch]["steps"]:
            best[batch] = row
    return dict(sorted(best.items()))


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
