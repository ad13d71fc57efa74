"""The cluster layer: runs in the notebook's kernel and never imports TensorFlow there.

- :mod:`.cluster`: ``TFCluster``: options, one state value, roles, start/restart/stop.
- :mod:`.group`: ``TaskGroup``, the running tasks as a run sees them (engines, liveness, marking stale):
  the one door between a run and its cluster.
- :mod:`.engines`: the ``Engines`` interface (start, signal, alive, replace, log tail, close) and
  ``LocalEngines`` (controller, lifeline, private network, one engine set per task).
- :mod:`.attach`: ``ForeignEngines``, engines from elsewhere (SSH, Slurm, MPI, a running controller).
- :mod:`.roles`: each task's port picked on its own engine, reachability, its environment, TF_CONFIG
  and its check.
- :mod:`.runs`: ``cluster.run`` and ``cluster.with_options(...).run``: the run loop, output, supervision;
  ``Cluster``, what a run uses of its cluster.
- :mod:`.options`: ``ClusterOptions``, ``RunOptions`` and ``TaskInfo`` (defaults, help and validation).
- :mod:`.tfconfig`: build, parse and check TF_CONFIG (pure).
- :mod:`.errors`: the kit's errors, each with the field and the fix (``.fix``); ``first_line`` of any error.
- :mod:`.files`: ``write_atomic`` (results, tables) and ``save_figure``, for every layer.
- :mod:`.workdir`: a local cluster's own folder (each task's TMPDIR in it), removed at stop, or by the next
  cluster once its kernel is gone.
- :mod:`.view`: the live view of a run.
- :mod:`.limits`: memory and CPU limits (cgroups), out-of-memory reports.
- :mod:`.horovod`: ``HorovodCluster``, horovodrun over the same engines.
- :mod:`.keras_jax`: ``JaxCluster``, Keras 3 on JAX processes over the same engines (their job variables, checked).
- :mod:`.links`: emulated links between hosts (``Link``; a namespace per task, veth, tc) and the ring model.
- ``_boot``, ``_lifeline``, ``_netns``, ``_remote``, ``_controller``: how the controller and engines start,
  how they end with the kernel, the private network, and the small functions the cluster runs on its engines.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

_MODULES = {m.name for m in pkgutil.iter_modules(__path__)}


def __getattr__(name: str) -> Any:
    """Load a module of this layer on first use (``kit.core.<module>``), so importing kit stays cheap."""
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
