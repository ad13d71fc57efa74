"""One process, several devices: the logical CPUs MirroredStrategy needs here, and how its gradients were reduced.

TensorFlow's distributed-training guide and its Keras tutorial assume GPUs. On a CPU-only machine
:func:`split_cpu` splits the one physical CPU into logical devices, so that ``MirroredStrategy`` has one replica
per device: the Keras check (:mod:`kit.tools.compat`) calls it on its engines. Unlike notebook 02's own ``split_cpu``
(step 1, run once in a fresh process), it may be called again with the same split, and a late split raises
an error that says to restart. :func:`reduction_summary` reads TensorFlow's log for how the gradients were reduced
(:func:`kit.train.mirrored_probes.reduction_probe` reads it for 02b's table).

The guide's pieces (its toy model, learning-rate table, the tutorial's CNN, MNIST pipeline and learning-rate
decay) are notebook 02's cells; 02b and the tests run them with ``kit.tools.cells.run_tagged``.
"""

from __future__ import annotations

import re

from ._tf import import_tensorflow
from ..core.errors import KitError, OptionError


def split_cpu(n: int) -> list:
    """Split the first physical CPU into ``n`` logical devices and return the logical CPUs.

    Must run before TensorFlow initializes its runtime (any op, or listing logical devices,
    initializes it). Calling it again with the same ``n`` is harmless; with another ``n`` after
    initialization it raises :class:`~kit.core.errors.KitError` saying to restart the process.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OptionError("n", f"{n!r} is not a whole number >= 1", "give the number of logical CPUs, e.g. n=2")
    tf = import_tensorflow()
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) != n:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        except RuntimeError as error:
            have = len(current) if current else 1
            raise KitError(f"cannot split the CPU into {n} devices: TensorFlow's runtime is already "
                           f"initialized with {have} ({error}). Fix: restart the kernel (or use a "
                           "fresh process, e.g. kit.TFCluster(workers=1)) and split first") from None
    return tf.config.list_logical_devices("CPU")


_REDUCTION_PATTERNS = (
    (re.compile(r"Collective all_reduce tensors:.*implementation = CommunicationImplementation\.(\w+)"),
     "collective all-reduce, {}"),
    (re.compile(r"batch_all_reduce: .* algorithm = (\w+)"), "batch all-reduce, {}"),
    (re.compile(r"Reduce to (\S+) then broadcast"), "reduce to {}, then broadcast"),
)


def reduction_summary(messages: list[str]) -> str:
    """How the gradients were reduced, read from TensorFlow's log messages ("" if nothing says).

    A collective all-reduce or a batch all-reduce names the method; "reduce to one device, then
    broadcast" only counts when neither appears (the strategies also log it for small values).
    """
    for pattern, template in _REDUCTION_PATTERNS:
        for message in messages:
            match = pattern.search(message)
            if match:
                return template.format(match.group(1).rsplit("/", 1)[-1])
    return ""
