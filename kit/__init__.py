"""kit: start TensorFlow clusters from a notebook and run distributed training on them.

``import kit`` is cheap: nothing here imports TensorFlow or ipyparallel until it is used.

The package has three layers, one subpackage each (docs/architecture.md):

- :mod:`kit.core`, the cluster: ``TFCluster``, ``HorovodCluster`` and ``JaxCluster``, their engines (local ones, or
  engines from elsewhere), TF_CONFIG, options, errors, the live view and the run loop. Runs in the
  notebook's kernel and never imports TensorFlow there.
- :mod:`kit.train`, code that runs on the engines (the TF tasks): MNIST, models, strategies,
  recipes, progress and probes. Imports TensorFlow, in the task's process.
- :mod:`kit.tools`, tooling around both: the ``kit`` command, sweeps, results, plots, the
  benchmark, fault trials and the Keras compatibility check.

Dependencies point one way: tools → train → core's pure modules (errors, tfconfig).
"""

from __future__ import annotations

import importlib
from typing import Any

from .core.errors import (ClusterError, ExposedPortsWarning, FailuresExhaustedError, GridError, KitError,
                          MemoryLimitWarning, OptionError, TFConfigError, WorkerError)

__version__ = "0.1.0"
__all__ = ["TFCluster", "HorovodCluster", "JaxCluster", "ClusterOptions", "RunOptions", "TaskInfo", "Link", "KitError", "TFConfigError",
           "ClusterError", "OptionError", "WorkerError", "FailuresExhaustedError", "GridError",
           "ExposedPortsWarning", "MemoryLimitWarning", "launch", "free_ports", "Progress", "OnTask", "core", "train", "tools"]

_LAZY = {"TFCluster": "core.cluster", "HorovodCluster": "core.horovod", "JaxCluster": "core.keras_jax",
         "ClusterOptions": "core.options",
         "RunOptions": "core.options", "TaskInfo": "core.options", "Link": "core.links",
         "launch": "core.plain", "free_ports": "core.tfconfig", "Progress": "train.progress",
         "OnTask": "train.progress"}
_SUBPACKAGES = {"core", "train", "tools"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'kit' has no attribute {name!r}")
