"""The all-reduce on its own, timed on every worker: what one step's gradient costs on the link between hosts.

Run on every task of a MultiWorkerMirroredStrategy cluster (``cluster.run(time_all_reduce, floats)``), with
or without emulated links (``kit.TFCluster(link=...)``, :mod:`kit.core.links`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ._tf import import_tensorflow
from ..core.errors import OptionError
from ..core.tfconfig import this_task

DTYPES = ("float32", "float16")


def time_all_reduce(floats: int = 2_770_634, dtype: str = "float32", repeats: int = 10) -> dict[str, Any]:
    """Seconds of one MultiWorkerMirroredStrategy all-reduce (sum) of ``floats`` values of ``dtype``, after
    two warm-up calls (the first builds the collective's group and gRPC channels), ``repeats`` times; and the
    sum it computed (checked by the caller). 2,770,634 is the seeds' CNN's parameter count."""
    if dtype not in DTYPES:
        raise OptionError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}",
                          "float16 halves the bytes, as gradient_compression='fp16' does")
    if not (isinstance(floats, int) and floats > 0 and isinstance(repeats, int) and repeats > 0):
        raise OptionError("floats", f"floats={floats!r}, repeats={repeats!r} are not whole numbers > 0",
                          "e.g. time_all_reduce(2_770_634, repeats=10)")
    from .strategies import build_strategy

    import_tensorflow()
    strategy = build_strategy("multi_worker_mirrored")  # first: collectives are set up before TF's runtime starts
    import tensorflow as tf

    tensor = tf.fill([floats], tf.constant(strategy.cluster_resolver.task_id + 1, getattr(tf, dtype)))

    @tf.function
    def all_reduce():
        def replica():
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tensor)
        return strategy.experimental_local_results(strategy.run(replica))[0]

    for _ in range(2):
        all_reduce().numpy()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        summed = all_reduce()
        first = float(summed[0])  # wait for the value
        seconds.append(time.perf_counter() - started)
    return {"task": this_task(), "backend": "multi_worker_mirrored", "floats": floats, "dtype": dtype,
            "bytes": floats * tf.as_dtype(dtype).size, "workers": strategy.num_replicas_in_sync,
            "seconds": seconds, "seconds_median": statistics.median(seconds), "sum": first}
