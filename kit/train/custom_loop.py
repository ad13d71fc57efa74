"""The custom training loop and ``model.fit`` under any strategy, as the Keras compatibility check runs them.

Notebook 06 teaches the TF guide's loop in its own cells (tagged ``lesson``: the model, the step with
``compute_average_loss`` and ``scale_regularization_loss``, evaluation, checkpoints, the loop, and ``model.fit``
as a second function); tests/test_custom_loop.py runs those cells (``kit.tools.cells.run_tagged``) to check that
loop and ``fit`` agree. What the benchmark tools need is not that lesson, so it is kept here:

- :mod:`kit.tools.compat` trains each mode on its own (:func:`train_loop`, then :func:`train_fit`) under
  every strategy name of :func:`kit.train.strategies.build_strategy`, the default strategy included (06 builds
  only MirroredStrategy and MultiWorkerMirroredStrategy, and runs loop and fit as two runs, with checkpoints);
- :func:`build_model` is the kit's CNN (:func:`kit.train.models.build_and_compile_cnn_model`) with an L2
  penalty, the model of :mod:`kit.train.ps` (compat, tests/test_ps.py) and of :mod:`kit.train.resilience`
  (the fault trials);
- :func:`make_train_step` is the guide's step as 06 writes it, without 06's accuracy metric;
  :func:`make_eval_step` counts correct predictions, summed over replicas.

Everything here runs on a kit engine and returns plain, picklable results.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ._tf import import_tensorflow, keras_flavour
from . import progress
from .scaling import per_step_losses
from .strategies import build_strategy
from ..core.tfconfig import this_task


def build_model(learning_rate: float = 0.05, l2: float = 1e-4) -> "tf.keras.Model":
    """The kit's CNN (:func:`kit.train.models.build_and_compile_cnn_model`) with an L2 penalty.

    The penalty is ``l2 × sum(kernel²)`` on every Dense and Conv2D kernel (``l2=0`` for none);
    it shows up in ``model.losses``. Call inside ``strategy.scope()``; the model is compiled
    for ``model.fit`` (SGD, sparse categorical cross-entropy from logits, accuracy).
    """
    tf = import_tensorflow()
    from .models import build_and_compile_cnn_model

    model = build_and_compile_cnn_model(learning_rate=learning_rate)
    if l2:
        def with_penalty(layer):
            config = layer.get_config()
            if "kernel_regularizer" in config:
                config["kernel_regularizer"] = tf.keras.regularizers.L2(l2)
            return layer.__class__.from_config(config)

        compiled = model
        model = tf.keras.models.clone_model(compiled, clone_function=with_penalty)
        model.compile(loss=compiled.loss, optimizer=tf.keras.optimizers.SGD(learning_rate),
                      metrics=["accuracy"])
    return model


def make_train_step(strategy: "tf.distribute.Strategy", model: "tf.keras.Model",
                    optimizer: Any, global_batch_size: int) -> Callable:
    """The guide's distributed train step: returns ``step(batch) -> (loss, per_replica_loss)``.

    Each replica computes its loss over its part of the batch, divided by the **global** batch
    (``compute_average_loss``), plus its share of the regularization
    (``scale_regularization_loss`` divides by the number of replicas). Gradients are summed across
    replicas by ``apply_gradients``, so the update is the one a single process would make on the
    whole global batch. ``strategy.reduce(SUM)`` adds the replicas' losses into the step's loss.
    """
    tf = import_tensorflow()
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example_loss = loss_object(labels, logits)
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(batch):
        per_replica_loss = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None), per_replica_loss

    return distributed_train_step


def make_eval_step(strategy: "tf.distribute.Strategy", model: "tf.keras.Model") -> Callable:
    """``step(batch) -> (correct, examples)``, each summed over the replicas."""
    tf = import_tensorflow()

    def replica_eval(images, labels):
        predicted = tf.argmax(model(images, training=False), axis=1)
        correct = tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.int64))
        return correct, tf.shape(labels, out_type=tf.int64)[0]

    @tf.function
    def distributed_eval_step(batch):
        correct, examples = strategy.run(replica_eval, args=batch)
        return (strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None),
                strategy.reduce(tf.distribute.ReduceOp.SUM, examples, axis=None))

    return distributed_eval_step


def _setup(strategy_name: str, per_replica_batch: int, learning_rate: float, l2: float, seed: int,
           logical_cpus: int) -> tuple:
    """TensorFlow, the strategy, the global batch and a model built in the strategy's scope."""
    tf = import_tensorflow()
    strategy = build_strategy(strategy_name, logical_cpus=logical_cpus)
    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    tf.keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = build_model(learning_rate=learning_rate, l2=l2)
    return tf, strategy, global_batch, model


def _datasets(global_batch: int, seed: int, eval_steps: int) -> tuple:
    """The repeating, shuffled training set and ``eval_steps`` batches of the test set."""
    from .data import mnist_dataset

    return (mnist_dataset(global_batch, shuffle_seed=seed),
            mnist_dataset(global_batch, train=False).take(eval_steps))


def _devices(strategy: "tf.distribute.Strategy") -> list[str]:
    """The devices holding this process's replicas ([] for the default strategy, which has none)."""
    try:
        return list(strategy.extended.worker_devices)
    except RuntimeError:  # "worker_devices() method unsupported by default tf.distribute.Strategy"
        return []


def _report(strategy_name: str, strategy: "tf.distribute.Strategy", global_batch: int,
            **values: Any) -> dict[str, Any]:
    return {"task": this_task(), "keras": keras_flavour(),
            "strategy": strategy_name, "replicas": strategy.num_replicas_in_sync,
            "devices": _devices(strategy),
            "global_batch": global_batch, **values}


def train_loop(strategy: str = "mirrored", per_replica_batch: int = 32, epochs: int = 2,
               steps_per_epoch: int = 20, learning_rate: float = 0.05, l2: float = 1e-4,
               seed: int = 42, eval_steps: int = 10, logical_cpus: int = 2) -> dict[str, Any]:
    """Train with the custom loop; return losses per step and epoch, the first step's per-replica
    losses (``experimental_local_results``), test accuracy over ``eval_steps`` batches, timings.

    Training steps an iterator ``steps_per_epoch`` times per epoch (the dataset repeats forever);
    evaluation iterates a finite distributed dataset with ``for``.
    """
    tf, dist, global_batch, model = _setup(strategy, per_replica_batch, learning_rate, l2, seed, logical_cpus)
    train_data, test_data = _datasets(global_batch, seed, eval_steps)
    with dist.scope():
        optimizer = tf.keras.optimizers.SGD(learning_rate=learning_rate)
    train_step = make_train_step(dist, model, optimizer, global_batch)
    eval_step = make_eval_step(dist, model)

    iterator = iter(dist.experimental_distribute_dataset(train_data))
    step_loss, epoch_loss, step_start, step_end, local_losses = [], [], [], [], []
    started = time.perf_counter()
    meter = progress.Meter(global_batch).begin(epochs, steps_per_epoch)
    for epoch in range(1, epochs + 1):
        epoch_start = len(step_loss)
        for step in range(1, steps_per_epoch + 1):
            step_start.append(time.time())
            loss, per_replica = train_step(next(iterator))
            if not local_losses:
                local_losses = [float(v) for v in dist.experimental_local_results(per_replica)]
            step_loss.append(float(loss))
            step_end.append(time.time())
            meter.step(epoch, step, step_loss[-1], force=step == steps_per_epoch)
        epoch_loss.append(sum(step_loss[epoch_start:]) / steps_per_epoch)
    train_seconds = time.perf_counter() - started

    correct = examples = 0
    for batch in dist.experimental_distribute_dataset(test_data):
        c, n = eval_step(batch)
        correct, examples = correct + int(c), examples + int(n)
    return _report(strategy, dist, global_batch, mode="custom loop", step_loss=step_loss,
                   epoch_loss=epoch_loss, first_step_local_losses=local_losses,
                   first_step_loss=step_loss[0] if step_loss else None,
                   eval_accuracy=correct / examples if examples else None,
                   eval_examples=examples, step_start_times=step_start, step_end_times=step_end,
                   train_seconds=train_seconds)


def train_fit(strategy: str = "mirrored", per_replica_batch: int = 32, epochs: int = 2,
              steps_per_epoch: int = 20, learning_rate: float = 0.05, l2: float = 1e-4,
              seed: int = 42, eval_steps: int = 10, logical_cpus: int = 2,
              verbose: int = 0) -> dict[str, Any]:
    """Train the same model on the same data with ``model.fit``; same results as :func:`train_loop`.

    ``distribute_reduction_method = "first"``: tf-keras otherwise *sums* the per-batch logs over
    the replicas (the epoch logs are right either way).
    """
    tf, dist, global_batch, model = _setup(strategy, per_replica_batch, learning_rate, l2, seed, logical_cpus)
    train_data, test_data = _datasets(global_batch, seed, eval_steps)
    model.distribute_reduction_method = "first"
    measured = progress.callback(global_batch)  # live view; step_loss: the per-batch logs' running means
    started = time.perf_counter()
    history = model.fit(train_data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose,
                        callbacks=[measured])
    train_seconds = time.perf_counter() - started
    accuracy = None
    if eval_steps:
        accuracy = float(model.evaluate(test_data, verbose=0, return_dict=True)["accuracy"])
    return _report(strategy, dist, global_batch, mode="model.fit",
                   step_loss=per_step_losses(measured.step_loss, steps_per_epoch),
                   epoch_loss=[float(v) for v in history.history["loss"]],
                   eval_accuracy=accuracy, train_seconds=train_seconds)
