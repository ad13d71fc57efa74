"""ParameterServerStrategy on a kit cluster: what serves notebook 07's lesson and measures it from outside its code.

    code = kit.tools.cells.run_tagged("notebooks/07-parameter-server.ipynb", "lesson")  # 07's lesson
    with kit.TFCluster(chief=True, workers=2, ps=1) as cluster:
        cluster.with_options(tasks=["worker:0", "worker:1", "ps:0"]).run(kit.train.ps.serve, code["start_server"])
        cluster.with_options(tasks=["chief:0"]).run(code["train"], epochs=1, steps_per_epoch=5, ...)

The training is the lesson's (``train``, ``train_fit``; :mod:`kit.tools.compat` and :mod:`.resilience` run
it too). Workers and parameter servers only serve: :func:`serve` keeps the lesson's ``tf.distribute.Server``
in the engine's process, so the ``cluster.run`` call returns while the server goes on serving. The chief is
the *coordinator*: it schedules functions on the workers, which read and update the variables held by the
parameter servers, each at its own pace (asynchronous training). :func:`observer`, :func:`placement` and
:func:`sidecar_evaluations` watch it; :func:`expected_shards` says how the partitioner splits a variable.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ._tf import import_tensorflow
from ..core.tfconfig import this_task


def describe_variables(model: Any) -> list[dict[str, Any]]:
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


def expected_shards(shape: list[int], min_shard_bytes: int = 256 << 10, max_shards: int = 2,
                    bytes_per_element: int = 4) -> int:
    """How many shards ``MinSizePartitioner`` makes of a variable (split along its first axis):
    enough for ``min_shard_bytes`` each, at most ``max_shards`` and at most ``shape[0]``."""
    import math

    size = math.prod(shape) * bytes_per_element
    return max(1, min(shape[0], max_shards, math.ceil(size / min_shard_bytes)))


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
