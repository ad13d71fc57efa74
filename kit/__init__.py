"""kit: start TensorFlow clusters from a notebook and run distributed training on them.

``import kit`` is cheap: the modules that need TensorFlow or ipyparallel load on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import (ClusterError, ExposedPortsWarning, FailuresExhaustedError, KitError,
                     MemoryLimitWarning, OptionError, TFConfigError, WorkerError)

__version__ = "0.1.0"
__all__ = ["TFCluster", "HorovodCluster", "ClusterOptions", "TaskInfo", "KitError", "TFConfigError",
           "ClusterError", "OptionError", "WorkerError", "FailuresExhaustedError", "ExposedPortsWarning",
           "MemoryLimitWarning", "import_tensorflow", "tfconfig", "data", "models", "training"]

_LAZY = {"TFCluster": "cluster", "HorovodCluster": "horovod", "ClusterOptions": "options", "TaskInfo": "options",
         "import_tensorflow": "_tf"}
_SUBMODULES = {"tfconfig", "data", "models", "training", "cluster", "options", "attach", "results", "plots", "experiments",
               "scaling", "mirrored", "multiworker", "sharding", "checkpoints", "probes", "resilience",
               "ps", "custom_loop", "compat", "bench", "fault_trials", "limits", "horovod", "horovod_training",
               "view", "progress"}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'kit' has no attribute {name!r}")
