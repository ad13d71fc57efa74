"""ParameterServerStrategy on a kit cluster: servers on the workers and ps, the coordinator on the chief.

    with kit.TFCluster(chief=True, workers=2, ps=1) as cluster:
        cluster.with_options(tasks=["worker:0", "worker:1", "ps:0"]).run(kit.train.ps.start_server)
        loop, = cluster.with_options(tasks=["chief:0"]).run(kit.train.ps.train_custom_loop, steps=40)

Workers and parameter servers only serve: ``tf.distribute.Server`` starts serving when it is
constructed, and :func:`start_server` keeps it in a module global, so the ``cluster.run`` call
returns while the server goes on serving in the engine's process. The chief is the
*coordinator*: it creates the strategy and a ``ClusterCoordinator``, and schedules functions on
the workers, which read and update the variables held by the parameter servers, each at its own
pace (asynchronous training).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from ._tf import import_tensorflow, keras_flavour
from .strategies import build_strategy
from ..core.files import save_figure
from ..core.errors import KitError
from ..core.tfconfig import this_task

#: This process's ``tf.distribute.Server`` (workers and ps): a reference keeps it serving.
_SERVER = None


def start_server(min_inter_op_threads: int = 2) -> dict[str, Any]:
    """Start serving this task (a worker or a ps) and return at once; the server keeps running.

    Reads the cluster and this task's role from TF_CONFIG. The server gets at least
    ``min_inter_op_threads`` inter-op threads: a worker running a scheduled step holds one while
    it waits for the variables from the parameter servers, so with a single thread (what the kit
    gives each of 4 tasks on 2 cores) the step never finishes. Calling it again returns the
    running server's details.
    """
    global _SERVER
    tf = import_tensorflow()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type not in ("worker", "ps"):
        raise KitError(f"start_server runs on worker and ps tasks, not on {resolver.task_type}. "
                       "Fix: cluster.with_options(tasks=[the worker and ps tasks]).run(start_server)")
    if _SERVER is None:
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # as TF's guide sets it on every task
        inter_op = max(min_inter_op_threads, int(os.environ.get("TF_NUM_INTEROP_THREADS") or 0))
        _SERVER = tf.distribute.Server(
            resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc", start=True,
            config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op))
    return {"task": f"{resolver.task_type}:{resolver.task_id}", "target": _SERVER.target,
            "inter_op_threads": _SERVER.server_def.default_session_config.inter_op_parallelism_threads,
            "pid": os.getpid()}


def mnist_dataset_fn(global_batch_size: int, examples: int = 8192, seed: int = 42) -> Callable:
    """A ``dataset_fn(input_context)`` over the first ``examples`` MNIST training images.

    TensorFlow traces it on the coordinator and runs it on every worker, so the images travel
    inside the function's graph: keep ``examples`` small. Each worker shuffles with its own seed
    (``seed + worker index``), so the workers see the data in different orders.
    """
    tf = import_tensorflow()
    from .data import load_mnist, scale_batch

    (x_train, y_train), _ = load_mnist()
    # copies, not views: a view would keep all 60,000 images (47 MB) alive on the chief with the function
    images, labels = x_train[:examples].copy(), y_train[:examples].copy()

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch_size)
        try:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        except RuntimeError:  # not traced for a worker (a dataset made on the coordinator)
            worker = 0
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        dataset = dataset.shuffle(len(images), seed=seed + worker).repeat()
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return dataset.batch(batch).map(scale_batch).prefetch(2)

    return dataset_fn


def describe_variables(model: "tf.keras.Model") -> list[dict[str, Any]]:
    """Each layer's kernel and bias: shape, and the shape and device of each of its shards.

    A variable the partitioner split is a ``ShardedVariable`` (``.variables`` are its shards);
    ``model.variables`` would list the shards one by one.
    """
    rows = []
    for layer in model.layers:
        for attribute in ("kernel", "bias"):
            variable = getattr(layer, attribute, None)
            if variable is None:
                continue
            shards = getattr(variable, "variables", [variable])
            rows.append({"variable": f"{layer.name}.{attribute}", "shape": list(variable.shape),
                         "sharded": type(variable).__name__ == "ShardedVariable",
                         "shards": [list(s.shape) for s in shards],
                         "devices": [_device(s) for s in shards]})
    return rows


def _device(variable: Any) -> str:
    """A variable's device; Keras 3 variables keep theirs on the TensorFlow variable inside."""
    device = getattr(variable, "device", None)
    return device if device is not None else getattr(getattr(variable, "value", None), "device", "")


def make_step_fn(strategy: "tf.distribute.Strategy", model: "tf.keras.Model",
                 optimizer: Any) -> Callable:
    """The function the coordinator schedules: one step on one worker, with what it saw.

    It records the model version (``optimizer.iterations``) read before computing the gradients
    and the version read right after applying them, so ``after - before - 1`` is the number of
    updates other workers made in between (the gradient's staleness), plus wall-clock start and
    end. The increment and the read after it are two operations: when two workers' updates land
    at the same moment, both may read the later version.
    """
    tf = import_tensorflow()
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_fn(images, labels):
        before = tf.identity(optimizer.iterations)
        start = tf.timestamp()
        with tf.control_dependencies([before, start]):
            with tf.GradientTape() as tape:
                per_example_loss = loss_object(labels, model(images, training=True))
                loss = tf.nn.compute_average_loss(per_example_loss)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        after = tf.identity(optimizer.iterations)
        with tf.control_dependencies([after]):
            end = tf.timestamp()
        return loss, before, after, start, end

    @tf.function
    def step_fn(iterator):
        images, labels = next(iterator)
        loss, before, after, start, end = strategy.run(replica_fn, args=(images, labels))
        return {"loss": strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
                "worker": tf.distribute.coordinator.experimental_get_current_worker_index(),
                "before": before, "after": after, "start": start, "end": end}

    return step_fn


def train_custom_loop(steps: int = 40, per_worker_batch: int = 32, learning_rate: float = 0.05,
                      l2: float = 1e-4, examples: int = 8192, seed: int = 42, max_shards: int = 2,
                      min_shard_bytes: int = 256 << 10) -> dict[str, Any]:
    """On the chief: schedule ``steps`` steps on the workers, ``join``, and return every step's
    record (worker, loss, model version before/after, times), plus the model's variables.
    """
    tf = import_tensorflow()
    from .custom_loop import build_model

    strategy = build_strategy("parameter_server", max_shards=max_shards, min_shard_bytes=min_shard_bytes)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    tf.keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = build_model(learning_rate=learning_rate, l2=l2)
        optimizer = tf.keras.optimizers.SGD(learning_rate=learning_rate)
    dataset_fn = mnist_dataset_fn(per_worker_batch, examples, seed)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
    step_fn = make_step_fn(strategy, model, optimizer)
    started = time.perf_counter()
    scheduled = [coordinator.schedule(step_fn, args=(per_worker_iterator,)) for _ in range(steps)]
    schedule_seconds = time.perf_counter() - started
    scheduled_at, done_when_scheduled = time.time(), coordinator.done()
    coordinator.join()
    train_seconds = time.perf_counter() - started
    records = []
    for remote in scheduled:
        values = remote.fetch()
        records.append({k: float(v) if k in ("loss", "start", "end") else int(v)
                        for k, v in values.items()})
    return {"task": this_task(), "keras": keras_flavour(),
            "workers": strategy.extended._num_workers, "ps": strategy.extended._num_ps,
            "steps": records, "final_version": int(optimizer.iterations.numpy()),
            "variables": describe_variables(model), "schedule_seconds": schedule_seconds,
            "scheduled_at": scheduled_at, "done_when_scheduled": done_when_scheduled,
            "done_after_join": coordinator.done(), "train_seconds": train_seconds}


def train_fit(epochs: int = 2, steps_per_epoch: int | None = 20, per_worker_batch: int = 32,
              learning_rate: float = 0.05, l2: float = 1e-4, examples: int = 8192, seed: int = 42,
              max_shards: int = 2, min_shard_bytes: int = 256 << 10,
              verbose: int = 0) -> dict[str, Any]:
    """On the chief: ``model.fit`` with a ``DatasetCreator``, which makes the dataset on each worker.

    Keras 3 has no ``DatasetCreator``; there ``fit`` gets the dataset itself (and, measured by
    :mod:`kit.tools.compat`, fails).
    """
    tf = import_tensorflow()
    from .custom_loop import build_model

    strategy = build_strategy("parameter_server", max_shards=max_shards, min_shard_bytes=min_shard_bytes)
    tf.keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = build_model(learning_rate=learning_rate, l2=l2)
    dataset_fn = mnist_dataset_fn(per_worker_batch, examples, seed)
    creator = getattr(getattr(tf.keras.utils, "experimental", None), "DatasetCreator", None)
    if creator is not None:
        data = creator(dataset_fn)
    else:  # Keras 3 has no DatasetCreator: hand fit the dataset itself
        data = dataset_fn(tf.distribute.InputContext())
    started = time.perf_counter()
    history = model.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose)
    return {"task": this_task(), "keras": keras_flavour(),
            "epoch_loss": [float(v) for v in history.history["loss"]],
            "final_version": int(model.optimizer.iterations.numpy()),
            "variables": describe_variables(model),
            "train_seconds": time.perf_counter() - started}


def expected_shards(shape: list[int], min_shard_bytes: int = 256 << 10, max_shards: int = 2,
                    bytes_per_element: int = 4) -> int:
    """How many shards ``MinSizePartitioner`` makes of a variable (split along its first axis):
    enough for ``min_shard_bytes`` each, at most ``max_shards`` and at most ``shape[0]``."""
    import math

    size = math.prod(shape) * bytes_per_element
    return max(1, min(shape[0], max_shards, math.ceil(size / min_shard_bytes)))


def summarize_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each update in the order it was applied: its worker, the version its gradient was computed
    on, the version it made, and its *staleness*: updates by other workers in between."""
    rows = []
    for step in sorted(steps, key=lambda r: (r["after"], r["end"])):
        rows.append({"version": step["after"], "worker": step["worker"],
                     "computed_on": step["before"], "staleness": step["after"] - step["before"] - 1,
                     "loss": step["loss"], "start": step["start"], "end": step["end"]})
    return rows


def timeline(ps_steps: list[dict[str, Any]], mwms_runs: list[dict[str, Any]],
             path: str | os.PathLike | None = None) -> "matplotlib.figure.Figure":
    """Two panels on one time axis each: every training step as a bar on its worker's row.

    Top: ParameterServerStrategy (``ps_steps``, from :func:`train_custom_loop`); a stale update's
    bar is red. Bottom: MultiWorkerMirroredStrategy (``mwms_runs``, one
    :func:`kit.train.custom_loop.train_loop` result per worker).
    """
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.5))
    t0 = min(r["start"] for r in ps_steps)
    for r in summarize_steps(ps_steps):
        top.barh(r["worker"], r["end"] - r["start"], left=r["start"] - t0, height=0.6,
                 color="tab:red" if r["staleness"] else "tab:blue", edgecolor="white")
    top.set_title("ParameterServerStrategy: each worker updates on its own (red: stale gradient)")
    workers = sorted({r["worker"] for r in ps_steps})
    top.set_yticks(workers, [f"worker:{w}" for w in workers])
    t0 = min(min(run["step_start_times"]) for run in mwms_runs)
    for index, run in enumerate(mwms_runs):
        for start, end in zip(run["step_start_times"], run["step_end_times"]):
            bottom.barh(index, end - start, left=start - t0, height=0.6, color="tab:green",
                        edgecolor="white")
    bottom.set_title("MultiWorkerMirroredStrategy: every step on every worker, together")
    bottom.set_yticks(range(len(mwms_runs)), [run["task"] for run in mwms_runs])
    bottom.set_xlabel("seconds since the first step started")
    for ax in (top, bottom):
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


# ----- helpers for notebook 07: keeping servers, measuring from outside the lesson's code ---
#: What :func:`kept` made in this process: {(factory's name, arguments): object}.
_KEPT: dict[tuple, Any] = {}


def kept(factory: Callable, *args: Any) -> Any:
    """``factory(*args)``, made once per process and arguments; later calls return the same object.

    For what must outlive one ``cluster.run`` call in an engine, e.g. a ``tf.distribute.Server`` (a second
    one on the task's port fails; :func:`serve`). The key is the factory's name: after editing the factory,
    restart the cluster. Each call first collects garbage.
    """
    import gc

    gc.collect()
    key = (getattr(factory, "__qualname__", repr(factory)), args)
    if key not in _KEPT:
        _KEPT[key] = factory(*args)
    return _KEPT[key]


def serve(start_server: Callable[[], Any]) -> dict[str, Any]:
    """On a worker or ps: ``start_server()`` once (:func:`kept`), and the server's task, target, pid
    and inter-op threads. The server goes on serving after this returns, in place of ``server.join()``
    in a script, so that the engine stays free for the kit."""
    server = kept(start_server)
    return {"task": this_task(), "target": server.target, "pid": os.getpid(),
            "inter_op_threads": server.server_def.default_session_config.inter_op_parallelism_threads}


def placement(model: Any, optimizer: Any = None, metric: Any = None) -> list[dict[str, Any]]:
    """Where a model's variables live (:func:`describe_variables`), plus the optimizer's step counter
    (``optimizer.iterations``) and a metric's variables, each as one row."""
    rows = describe_variables(model)
    extra = ([("optimizer.iterations", optimizer.iterations)] if optimizer is not None else [])
    extra += [(f"{metric.name}.{v.name.split('/')[-1].split(':')[0]}", v) for v in (metric.variables if metric else [])]
    for name, variable in extra:
        rows.append({"variable": name, "shape": list(variable.shape), "sharded": False,
                     "shards": [list(variable.shape)], "devices": [_device(variable)]})
    return rows


def observer():
    """A Keras callback for a lesson's ``callbacks=``, epoch-level only (``fit`` under ParameterServerStrategy
    refuses callbacks with batch-level hooks, as TensorFlow's tutorial "Parameter server training with
    ParameterServerStrategy" says): the model's version (``optimizer.iterations``, read from the parameter
    servers) at each epoch's end, and at the end of training where each variable lives (:func:`placement`),
    to ``cluster.last_view.measurements()`` as ``versions`` and ``variables``."""
    tf = import_tensorflow()
    from . import progress

    class Observer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.versions: list[int] = []

        def on_epoch_end(self, epoch, logs=None):
            self.versions.append(int(self.model.optimizer.iterations.numpy()))

        def on_train_end(self, logs=None):
            progress.publish(versions=list(self.versions), variables=placement(self.model, self.model.optimizer))

    return Observer()


def sidecar_evaluations():
    """A Keras callback for ``tf.keras.utils.SidecarEvaluator(..., callbacks=[...])``: after each evaluation,
    the training step of the checkpoint it evaluated (``optimizer.iterations``, restored from the checkpoint)
    and the evaluation's metrics, as ``evaluations`` in ``cluster.last_view.measurements()``."""
    tf = import_tensorflow()
    from . import progress

    class Evaluations(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.evaluations: list[dict[str, float]] = []

        def on_test_end(self, logs=None):
            metrics = {name: float(value) for name, value in (logs or {}).items()}
            self.evaluations.append({"step": int(self.model.optimizer.iterations.numpy()), **metrics})
            progress.publish(evaluations=list(self.evaluations))

    return Evaluations()
