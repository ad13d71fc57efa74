"""Code that runs on the engines (the TF tasks): it imports TensorFlow, in the task's process.

- :mod:`.data`: the bundled MNIST.  :mod:`.models`: the tutorial's models.
- :mod:`.strategies`: ``build_strategy(name)``, the one builder of every ``tf.distribute`` strategy the kit
  trains under (one per process).
- :mod:`.progress`: progress reports for the live view (``callback``, ``Meter``).
- :mod:`.probes`: what a task can observe (TensorFlow's log, devices, files, TensorBoard).
- Recipes the benchmark, the Keras check, the fault trials and the tests call: :mod:`.fit`, :mod:`.mirrored`,
  :mod:`.multiworker`, :mod:`.custom_loop`, :mod:`.ps`, :mod:`.resilience`,
  :mod:`.checkpoints`, :mod:`.scaling`, :mod:`.horovod_fit`,
  :mod:`.jax_fit` (Keras 3 on JAX: no TensorFlow), :mod:`.links`; :mod:`.batch_size` is the kernel's side of
  notebooks 10 and 10b (numpy only). Notebooks hold the lesson's code in cells and call pieces of some of these
  (``mirrored``, ``resilience``, ``scaling``, ``batch_size``), and :mod:`.sharding` (notebook 04's files and
  tables): docs/architecture.md lists which notebook calls which.
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
