"""Under MultiWorkerMirroredStrategy: the gradient noise scale during training, and gradient accumulation
checked against real workers (notebook 10, sections 3 and 4).

Every worker has two gradients each step: its own, of its b examples, and the all-reduced mean, of the N·b
examples of the global batch. Their squared norms are what :func:`kit.train.batch_size.noise_scale` needs
(McCandlish et al. 2018, appendix A.1). The model, data and SGD are :mod:`kit.train.batch_size`'s.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .batch_size import EVAL_GROWTH, TARGET, BatchStream, _loss, _sgd_steps, _tensorflow, accuracy, init_mlp


def _mwms_step(strategy, weights, measure: bool):
    """One MultiWorkerMirroredStrategy SGD step on local variables, as the strategy does it: each worker's
    gradient of its own examples, all-reduced (mean), applied by every worker alike. With ``measure`` it also
    returns, averaged over the workers: |g_local|², |g_mean|², and the same two norms weighted by the Hessian
    of an independent local batch (gᵀHg, by Hessian-vector products) for the noise scale B_noise."""
    import tensorflow as tf

    def dot(a, b):
        return tf.add_n([tf.reduce_sum(x * y) for x, y in zip(a, b)])

    def hessian_form(indices, vector):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = _loss(weights, indices)
            along = dot(inner.gradient(loss, weights), [tf.stop_gradient(v) for v in vector])
        return dot(vector, outer.gradient(along, weights))

    def replica_step(local, other, learning_rate):
        context = tf.distribute.get_replica_context()
        with tf.GradientTape() as tape:
            loss = _loss(weights, local)
        mine = tape.gradient(loss, weights)
        mean = context.all_reduce(tf.distribute.ReduceOp.MEAN, mine)
        for w, g in zip(weights, mean):
            w.assign_sub(learning_rate * g)
        if not measure:
            return tf.zeros([4])
        norms = tf.stack([dot(mine, mine), dot(mean, mean), hessian_form(other, mine), hessian_form(other, mean)])
        return context.all_reduce(tf.distribute.ReduceOp.MEAN, norms)

    @tf.function
    def step(local, other, learning_rate):
        return strategy.experimental_local_results(strategy.run(replica_step, args=(local, other, learning_rate)))[0]

    return step


def noise_scale_run(per_worker_batch: int = 32, learning_rate: float = 0.8, *, target: float = TARGET,
                    max_steps: int = 6000, seed: int = 0) -> dict[str, Any]:
    """Train the MLP under MultiWorkerMirroredStrategy (call on every worker) until ``target``, recording
    each step's squared gradient norms for the noise scale (:func:`kit.train.batch_size.noise_scale`).

    Worker i takes rows i·b … (i+1)·b − 1 of each global batch of N·b (the same global stream on every
    worker: :class:`BatchStream`), and an independent local batch for the Hessian. Returns per-step lists
    ``small_sq`` (mean over workers of |g_i|², batch b), ``big_sq`` (|mean g|², batch N·b), ``small_h`` and
    ``big_h`` (the Hessian-weighted forms), the accuracy ``curve``, ``steps`` to the target, and a
    checksum of the weights (equal on every worker)."""
    from .strategies import build_strategy

    strategy = build_strategy("multi_worker_mirrored")  # first: collectives are set up before TF's runtime starts
    tf = _tensorflow()
    workers = strategy.num_replicas_in_sync
    me = strategy.cluster_resolver.task_id
    stream = BatchStream(per_worker_batch * workers, seed)
    hessian_stream = BatchStream(per_worker_batch * workers, seed + 1)
    weights = init_mlp(seed)
    step_fn = _mwms_step(strategy, weights, measure=True)
    lo, hi = me * per_worker_batch, (me + 1) * per_worker_batch
    records, curve, step, next_eval, reached = [], [], 0, 1, False
    started = time.perf_counter()
    while step < max_steps:
        local = tf.constant(stream.rows(step, 1)[0, lo:hi])
        other = tf.constant(hessian_stream.rows(step, 1)[0, lo:hi])
        records.append(step_fn(local, other, tf.constant(float(learning_rate))).numpy())
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


def accumulation_vs_workers(per_worker_batch: int = 64, steps: int = 5, learning_rate: float = 0.5,
                            seed: int = 3) -> dict[str, Any]:
    """Call on every worker of a MultiWorkerMirroredStrategy cluster: ``steps`` steps on real workers
    (each its own ``per_worker_batch`` of the global batch, all-reduced), then the same steps in this
    process alone with gradient accumulation (the global batch as N micro-batches of ``per_worker_batch``).
    Returns both sets of weights' largest absolute difference, and the weights' size for scale."""
    from .strategies import build_strategy

    strategy = build_strategy("multi_worker_mirrored")  # first: collectives are set up before TF's runtime starts
    tf = _tensorflow()
    workers = strategy.num_replicas_in_sync
    me = strategy.cluster_resolver.task_id
    global_batch = per_worker_batch * workers
    stream = BatchStream(global_batch, seed)
    rows = stream.rows(0, steps)
    real = init_mlp(seed)
    step_fn = _mwms_step(strategy, real, measure=False)
    for n in range(steps):
        step_fn(tf.constant(rows[n, me * per_worker_batch:(me + 1) * per_worker_batch]),
                tf.constant(rows[n]), tf.constant(float(learning_rate)))
    alone = init_mlp(seed)
    accumulators = [tf.Variable(tf.zeros_like(w)) for w in alone]
    _sgd_steps(alone, per_worker_batch, accumulators)(tf.constant(rows), tf.constant(float(learning_rate)),
                                                      tf.constant(0.0), tf.constant(0))
    difference = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(real, alone))
    moved = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(real, init_mlp(seed)))
    return {"task": me, "workers": workers, "global_batch": global_batch, "micro_batches": workers,
            "max_abs_difference": difference, "max_abs_update": moved}
