"""The ``tf.distribute`` strategies the kit's own code on a task trains under, by name: :func:`build_strategy`,
one per process.

The kit's own code that runs on a task asks here for its strategy (the benchmarks, ``kit compat``, notebook 04's
watched strategy, the tests), so one name means one thing everywhere; the lessons build theirs in their cells,
one per process as well.

A MultiWorkerMirroredStrategy is built once per process and handed out again afterwards, because a second one
breaks the first run's peers: making it re-enables collectives, which drops the process's collective state.
When the other worker already waits for the chief's first broadcast of the new run (it made its strategy
sooner), that wait fails with "Collective ops is aborted by: Delete called on non-empty BufRendezvous".
Reproduced on the kit's engines by delaying the chief 2 s before its second strategy
(tests/test_multiworker.py), and seen once in CI as notebook 08's trials on one cluster, under load.
"""

from __future__ import annotations

from typing import Any

from ._tf import import_tensorflow
from ..core.errors import OptionError

#: The strategies of the Keras compatibility table (``kit compat``), by the name the kit's functions take.
STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "parameter_server")
#: The ones :func:`build_strategy` builds (the lessons build the others in their cells).
BUILT_HERE = ("default", "multi_worker_mirrored")

#: This process's strategies, by name.
_BUILT: dict[str, Any] = {}


def build_strategy(name: str) -> "tf.distribute.Strategy":
    """This process's strategy called ``name``, built on the first call, the same object afterwards:
    ``default`` (no distribution: one process, one replica) or ``multi_worker_mirrored`` (one replica per
    worker, from TF_CONFIG; TensorFlow chooses the collective implementation: RING on CPUs)."""
    if name not in BUILT_HERE:
        raise OptionError("strategy", f"{name!r} is not one the kit builds",
                          f"use one of {', '.join(BUILT_HERE)}, or build it in the lesson's code")
    if name not in _BUILT:
        distribute = import_tensorflow().distribute
        _BUILT[name] = distribute.get_strategy() if name == "default" else distribute.MultiWorkerMirroredStrategy()
    return _BUILT[name]
