"""Tooling around the cluster and the training code.

- :mod:`.cli`: the ``kit`` command.  :mod:`.experiments`: ``kit sweep`` (papermill), records.
- :mod:`.results`, :mod:`.plots`: tables and figures.  :mod:`.bench`: ``make bench``.
- :mod:`.link_bench`: ``kit bench --only links``.  :mod:`.slurm_bench`: ``kit bench --only slurm``.
- :mod:`.fault_trials`: ``make faults``.  :mod:`.sim_cluster`: ``kit sim-cluster`` (emulated Slurm/SSH hosts).
- :mod:`.firewall`: host firewall rules for a cluster on several hosts.
- :mod:`.compat`: the Keras compatibility check.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

_MODULES = {m.name for m in pkgutil.iter_modules(__path__)}


def __getattr__(name: str) -> Any:
    """Load a module of this layer on first use (``kit.tools.<module>``), so importing kit stays cheap."""
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
