"""Under MultiWorkerMirroredStrategy: the gradient noise scale during training, and gradient accumulation
checked against real workers (notebook 10, sections 3 and 4).

Every worker has two gradients each step: its own, of its b examples, and the all-reduced mean, of the N·b
examples of the global batch. The step that returns both is the lesson's (notebook 10's ``worker_step(strategy,
weights)`` → ``step(indices, learning_rate)`` → ``(own, mean)``), passed in; here is what measures around it:
their squared norms, which :func:`kit.train.batch_size.noise_scale` needs (McCandlish et al. 2018, appendix
A.1). The model and data are :mod:`kit.train.batch_size`'s.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .batch_size import EVAL_GROWTH, TARGET, BatchStream, _tensorflow, accuracy, init_mlp, loss


def _squared_norms(strategy, weights):
    """A tf.function (own, mean, other) → |own|², |mean|², ownᵀH own and meanᵀH mean, each averaged over the
    workers, with H the Hessian of the loss on the local batch ``other`` (Hessian-vector products): what the
    noise scales B_simple and B_noise are estimated from."""
    import tensorflow as tf

    def dot(a, b):
        return tf.add_n([tf.reduce_sum(x * y) for x, y in zip(a, b)])

    def hessian_form(indices, vector):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                value = loss(weights, indices)
            along = dot(inner.gradient(value, weights), [tf.stop_gradient(v) for v in vector])
        return dot(vector, outer.gradient(along, weights))

    def replica(own, mean, other):
        norms = tf.stack([dot(own, own), dot(mean, mean), hessian_form(other, own), hessian_form(other, mean)])
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, norms)

    @tf.function
    def measure(own, mean, other):
        return strategy.experimental_local_results(strategy.run(replica, args=(own, mean, other)))[0]

    return measure


def _local(strategy, value):
    """This worker's value of what ``strategy.run`` returned (one replica per worker)."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], value)


def noise_scale_run(worker_step, per_worker_batch: int = 32, learning_rate: float = 0.8, *,
                    target: float = TARGET, max_steps: int = 6000, seed: int = 0) -> dict[str, Any]:
    """Train the MLP with ``worker_step`` under MultiWorkerMirroredStrategy (call on every worker) until
    ``target``, recording each step's squared gradient norms for the noise scale
    (:func:`kit.train.batch_size.noise_scale`).

    Worker i takes rows i·b … (i+1)·b − 1 of each global batch of N·b (the same global stream on every
    worker: :class:`BatchStream`), and an independent local batch for the Hessian. Returns per-step lists
    ``small_sq`` (mean over workers of |g_i|², batch b), ``big_sq`` (|mean g|², batch N·b), ``small_h`` and
    ``big_h`` (the Hessian-weighted forms, after the step's update), the accuracy ``curve``, ``steps`` to the
    target, and a checksum of the weights (equal on every worker)."""
    from .strategies import build_strategy

    strategy = build_strategy("multi_worker_mirrored")  # first: collectives are set up before TF's runtime starts
    tf = _tensorflow()
    workers = strategy.num_replicas_in_sync
    me = strategy.cluster_resolver.task_id
    stream = BatchStream(per_worker_batch * workers, seed)
    hessian_stream = BatchStream(per_worker_batch * workers, seed + 1)
    weights = init_mlp(seed)
    step_fn, measure = worker_step(strategy, weights), _squared_norms(strategy, weights)
    lo, hi = me * per_worker_batch, (me + 1) * per_worker_batch
    records, curve, step, next_eval, reached = [], [], 0, 1, False
    started = time.perf_counter()
    while step < max_steps:
        local = tf.constant(stream.rows(step, 1)[0, lo:hi])
        other = tf.constant(hessian_stream.rows(step, 1)[0, lo:hi])
        own, mean = _local(strategy, step_fn(local, tf.constant(float(learning_rate))))
        records.append(measure(own, mean, other).numpy())
        step += 1
        if step >= next_eval:
            next_eval = max(step + 1, math.ceil(step * EVAL_GROWTH))
            curve.append([step, accuracy(weights)])
            if curve[-1][1] >= target:
                reached = True
                break
    values = np.array(records, dtype=float)
    return {"task": me, "workers": workers, "per_worker_batch": per_worker_batch,
            "learning_rate": float(learning_rate), "steps": step if reached else None, "ran_steps": step,
            "small_sq": values[:, 0].tolist(), "big_sq": values[:, 1].tolist(),
            "small_h": values[:, 2].tolist(), "big_h": values[:, 3].tolist(), "curve": curve,
            "checksum": float(sum(float(tf.reduce_sum(tf.abs(w))) for w in weights)),
            "seconds": round(time.perf_counter() - started, 2)}


def accumulation_vs_workers(worker_step, accumulation_step, per_worker_batch: int = 64, steps: int = 5,
                            learning_rate: float = 0.5, seed: int = 3) -> dict[str, Any]:
    """Call on every worker of a MultiWorkerMirroredStrategy cluster: ``steps`` steps of ``worker_step`` on real
    workers (each its own ``per_worker_batch`` of the global batch, all-reduced), then the same steps in this
    process alone with ``accumulation_step`` (the global batch as N micro-batches of ``per_worker_batch``).
    Returns both sets of weights' largest absolute difference, and the weights' size for scale."""
    from .strategies import build_strategy

    strategy = build_strategy("multi_worker_mirrored")  # first: collectives are set up before TF's runtime starts
    tf = _tensorflow()
    workers = strategy.num_replicas_in_sync
    me = strategy.cluster_resolver.task_id
    global_batch = per_worker_batch * workers
    rows = BatchStream(global_batch, seed).rows(0, steps)
    rate = tf.constant(float(learning_rate))
    real = init_mlp(seed)
    together = worker_step(strategy, real)
    alone = init_mlp(seed)
    accumulated = accumulation_step(alone, per_worker_batch)
    for n in range(steps):
        together(tf.constant(rows[n, me * per_worker_batch:(me + 1) * per_worker_batch]), rate)
        accumulated(tf.constant(rows[n]), rate)
    difference = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(real, alone))
    moved = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(real, init_mlp(seed)))
    return {"task": me, "workers": workers, "global_batch": global_batch, "micro_batches": workers,
            "max_abs_difference": difference, "max_abs_update": moved}
