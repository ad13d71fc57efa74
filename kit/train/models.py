"""The seeds' model, shared by notebooks and workers (never pasted into cells)."""

from __future__ import annotations

from ._tf import import_tensorflow, keras_flavour
from ..core.errors import OptionError

GRADIENT_COMPRESSION = ("none", "fp16")
#: "dense": the seeds' CNN, 2,770,634 parameters, 99.9 % of them in Dense(128) on the flattened 26x26x32
#: convolution output; "pooled": the same convolution, max-pooled 4x4 before a Dense(10): 11,850 parameters,
#: about the same computation per example, 234x fewer bytes to all-reduce (notebook 10, kit bench --only links).
ARCHITECTURES = ("dense", "pooled")


def build_and_compile_cnn_model(learning_rate=0.001, gradient_compression: str = "none", architecture: str = "dense"):
    """The TF multi-worker tutorial's CNN: Reshape, Conv2D(32, 3), Dense(128), Dense(10), SGD.

    Build it inside ``strategy.scope()`` to distribute its variables. ``gradient_compression="fp16"``
    sums the gradients across workers in float16 (half the bytes through gRPC; see
    :func:`half_precision_allreduce`). ``architecture``: see :data:`ARCHITECTURES`.
    """
    if architecture not in ARCHITECTURES:
        raise OptionError("architecture", f"{architecture!r} is unknown", f"use one of {', '.join(ARCHITECTURES)}")
    if gradient_compression not in GRADIENT_COMPRESSION:
        raise OptionError("gradient_compression", f"{gradient_compression!r} is unknown",
                          f"use one of {', '.join(map(repr, GRADIENT_COMPRESSION))}")
    tf = import_tensorflow()
    optimizer_class = tf.keras.optimizers.SGD
    if gradient_compression == "fp16":
        optimizer_class = half_precision_allreduce(optimizer_class)
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),  # = InputLayer(input_shape=...) in Keras 2 and 3
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        *([tf.keras.layers.Flatten(), tf.keras.layers.Dense(128, activation="relu")] if architecture == "dense" else
          [tf.keras.layers.MaxPooling2D(4), tf.keras.layers.Flatten()]),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=optimizer_class(learning_rate=learning_rate),
        metrics=["accuracy"],
    )
    return model


def half_precision_allreduce(optimizer_class):
    """A subclass of a tf-keras optimizer that sums gradients across replicas in float16.

    The all-reduce of the seeds' 2.77 M float32 gradients (11 MB, mostly the Dense kernel) is most of a
    two-worker step on one machine; float16 halves the bytes, as Horovod's ``Compression.fp16`` does:
    cast, sum, cast back, no scaling. The price is float16's precision (about 3 decimal digits) in the
    summed gradient; every worker still applies the same update. tf-keras only: Keras 3 optimizers
    have no ``aggregate_gradients`` hook.
    """
    tf = import_tensorflow()
    if keras_flavour() != "tf-keras":
        raise OptionError("gradient_compression", "'fp16' needs tf-keras: Keras 3 optimizers have no "
                          "aggregate_gradients hook", "start the cluster with TFCluster(keras='tf-keras') (the "
                          "default), or use gradient_compression='none'")

    class HalfPrecisionAllReduce(optimizer_class):
        def aggregate_gradients(self, grads_and_vars):
            pairs = [(g, v) for g, v in grads_and_vars if g is not None]
            context = tf.distribute.get_replica_context()
            if not pairs or context is None or context.num_replicas_in_sync == 1:
                return super().aggregate_gradients(grads_and_vars)
            half = [tf.cast(tf.convert_to_tensor(g), tf.float16) for g, _ in pairs]
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, half)
            return [(tf.cast(s, v.dtype), v) for s, (_, v) in zip(summed, pairs)]

    HalfPrecisionAllReduce.__name__ = f"HalfPrecisionAllReduce{optimizer_class.__name__}"
    return HalfPrecisionAllReduce
