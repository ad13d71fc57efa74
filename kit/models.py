"""The seeds' model, shared by notebooks and workers (never pasted into cells)."""

from __future__ import annotations

from ._tf import import_tensorflow


def build_and_compile_cnn_model(learning_rate: float = 0.001):
    """The TF multi-worker tutorial's CNN: Reshape, Conv2D(32, 3), Dense(128), Dense(10), SGD.

    Build it inside ``strategy.scope()`` to distribute its variables.
    """
    tf = import_tensorflow()
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),  # = InputLayer(input_shape=...) in Keras 2 and 3
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=learning_rate),
        metrics=["accuracy"],
    )
    return model
