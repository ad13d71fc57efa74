"""Code that runs on the engines (the TF tasks): it imports TensorFlow, in the task's process.

- :mod:`.data`: the bundled MNIST.
- :mod:`.strategies`: ``build_strategy(name)``, the one builder of the strategies the kit's own code on a
  task trains under (one per process).
- :mod:`.progress`: progress reports for the live view (``callback``, ``Meter``).
- :mod:`.probes`: what a notebook reads back after a run (the files written, whether TensorBoard is installed).
- The lessons' training code is in their notebooks' cells tagged ``lesson`` (what ``kit export`` writes), and
  the benchmark, ``kit compat``, the fault trials and the tests run it from there (:func:`kit.tools.cells.lesson`).
  What is here is what the kit brings to a task from outside a lesson: measurement (:mod:`.progress`,
  :mod:`.probes`, :mod:`.mirrored_probes`, :mod:`.watch`, :mod:`.outcomes`), faults and their
  journal (:mod:`.resilience`), notebook 07's servers and observers (:mod:`.ps`), notebook 04's files
  (:mod:`.sharding`), the kernel's side of notebooks 08, 10 and 10b (:mod:`.scaling`, :mod:`.batch_size`, plain
  Python).
  docs/architecture.md lists which notebook calls which.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

_MODULES = {m.name for m in pkgutil.iter_modules(__path__)}


def __getattr__(name: str) -> Any:
    """Load a module of this layer on first use (``kit.train.<module>``), so importing kit stays cheap."""
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
