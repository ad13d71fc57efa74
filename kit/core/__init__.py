"""The cluster layer: runs in the notebook's kernel and never imports TensorFlow there.

- :mod:`.cluster`: ``TFCluster``, roles, TF_CONFIG, readiness and runs.
- :mod:`.options`: ``ClusterOptions`` and ``TaskInfo`` (defaults, help and validation in one place).
- :mod:`.tfconfig`: build, parse and check TF_CONFIG (pure).
- :mod:`.errors`: the kit's errors, each with the field and the fix.
- :mod:`.attach`: engines from elsewhere (SSH, Slurm, MPI, a running controller).
- :mod:`.view`: the live view of a run.
- :mod:`.limits`: memory and CPU limits (cgroups), out-of-memory reports.
- :mod:`.horovod`: ``HorovodCluster``, horovodrun over the same engines.
- ``_lifeline``, ``_netns``, ``_remote``, ``_controller``: process supervision, the private network,
  and the small functions the cluster runs on its engines.
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
