"""The ``tf.distribute`` strategies the kit trains under, by name: :func:`build_strategy`, one per process.

The kit's own code that runs on a task asks here for its strategy (the benchmarks, ``kit compat``, the tests),
so one name means one thing everywhere; the lessons build theirs in their cells, one per process as well.

Each strategy is built once per process and handed out again afterwards, because a second one breaks the
first run's peers:

- ``multi_worker_mirrored``: making a second MultiWorkerMirroredStrategy re-enables collectives, which
  drops the process's collective state. When the other worker already waits for the chief's first
  broadcast of the new run (it made its strategy sooner), that wait fails with "Collective ops is aborted
  by: Delete called on non-empty BufRendezvous". Reproduced on the kit's engines by delaying the chief 2 s
  before its second strategy (tests/test_multiworker.py), and seen once in CI as notebook 08's trials on
  one cluster, under load.
- ``parameter_server``: the chief's coordinator; the servers it connects to keep their state.
- ``mirrored``: the logical CPUs it mirrors over can only be split before TensorFlow's runtime starts.
"""

from __future__ import annotations

import os
from typing import Any

from ._tf import import_tensorflow
from ..core.errors import KitError, OptionError

#: The strategies :func:`build_strategy` builds, by the name the kit's functions take.
STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "parameter_server")
#: ``CommunicationImplementation`` names MultiWorkerMirroredStrategy accepts.
COMMUNICATIONS = ("AUTO", "RING", "NCCL")

#: This process's strategies, by name; for multi_worker_mirrored also the communication it was built with.
_BUILT: dict[str, Any] = {}
_COMMUNICATION: dict[str, str] = {}


def build_strategy(name: str, *, logical_cpus: int = 2, communication: str = "AUTO", max_shards: int = 2,
                   min_shard_bytes: int = 256 << 10) -> "tf.distribute.Strategy":
    """This process's strategy called ``name``: built on the first call, the same object afterwards.

    - ``default``: no distribution (one process, one replica);
    - ``mirrored``: one replica per logical CPU, ``logical_cpus`` of them
      (:func:`kit.train.mirrored.split_cpu`; the split must come before TensorFlow's runtime starts, so
      use a fresh process), as on a machine with several GPUs;
    - ``multi_worker_mirrored``: one replica per worker, from TF_CONFIG, with the collective
      implementation ``communication`` (AUTO lets TensorFlow choose, RING on CPUs; RING is TensorFlow's
      ring all-reduce over gRPC; NCCL is NVIDIA's library for GPUs, on CPUs TensorFlow falls back to RING).
      Asking for another ``communication`` later raises :class:`~kit.core.errors.OptionError`: use fresh
      processes (``cluster.restart()``);
    - ``parameter_server``: the chief's ParameterServerStrategy with a ``MinSizePartitioner``: a variable is
      split into shards of at least ``min_shard_bytes``, at most ``max_shards`` of them, placed round-robin on
      the parameter servers. Runs on the chief only (the coordinator).

    The settings of a strategy already built (``logical_cpus``, ``max_shards``, ``min_shard_bytes``) are
    those of its first call.
    """
    if name not in STRATEGIES:
        raise OptionError("strategy", f"{name!r} is unknown", f"use one of {', '.join(STRATEGIES)}")
    if name == "multi_worker_mirrored":
        if communication not in COMMUNICATIONS:
            raise OptionError("communication", f"{communication!r} is unknown",
                              f"use one of {', '.join(COMMUNICATIONS)}")
        built = _COMMUNICATION.get(name)
        if built is not None and built != communication:
            raise OptionError("communication", f"this process already has a MultiWorkerMirroredStrategy with "
                              f"communication={built!r}, and a second one would abort its peers' collectives",
                              f"use fresh processes (cluster.restart()) for communication={communication!r}")
    if name not in _BUILT:
        if name == "default":
            _BUILT[name] = import_tensorflow().distribute.get_strategy()
        elif name == "mirrored":
            _BUILT[name] = _mirrored(logical_cpus)
        elif name == "multi_worker_mirrored":
            _BUILT[name] = _multi_worker_mirrored(communication)
            _COMMUNICATION[name] = communication
        else:
            _BUILT[name] = _parameter_server(max_shards, min_shard_bytes)
    return _BUILT[name]


def _mirrored(logical_cpus: int):
    tf = import_tensorflow()
    from .mirrored import split_cpu

    return tf.distribute.MirroredStrategy(devices=[device.name for device in split_cpu(logical_cpus)])


def _multi_worker_mirrored(communication: str):
    tf = import_tensorflow()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, communication))
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _parameter_server(max_shards: int, min_shard_bytes: int):
    tf = import_tensorflow()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type != "chief":
        raise KitError(f"the coordinator runs on the chief, not on {resolver.task_type}",
                       fix="cluster.with_options(tasks=['chief:0']).run(...)")
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # as TF's guide sets it on every task
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=max_shards)
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
