"""Import TensorFlow the kit's way: Keras 2 (tf-keras) unless the process already chose."""

from __future__ import annotations

import os
import sys
import warnings


def import_tensorflow():
    """Return the ``tensorflow`` module, setting ``TF_USE_LEGACY_KERAS=1`` first if unset.

    Keras 3 ``model.fit`` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so the
    kit uses tf-keras by default, here (notebook kernel) as on the engines (``TFCluster(keras=)``).
    The variable only counts before TensorFlow's first import; set it to "0" for Keras 3.
    """
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    elif os.environ.get("TF_USE_LEGACY_KERAS") is None:
        warnings.warn("TensorFlow was imported before kit chose Keras; tf.keras is Keras 3 here. "
                      "Import kit (or set TF_USE_LEGACY_KERAS=1) before TensorFlow for tf-keras.",
                      stacklevel=3)
    import tensorflow as tf

    from ..core.tfconfig import this_task

    if this_task() != "local":  # on a kit engine: keep TF's INFO chatter out of the notebook
        tf.get_logger().setLevel(os.environ.get("KIT_TF_LOG_LEVEL", "WARNING"))
    return tf


def keras_flavour() -> str:
    """'tf-keras' or 'keras3': which Keras ``tf.keras`` is in this process."""
    tf = import_tensorflow()
    return "tf-keras" if tf.keras.__name__.startswith("tf_keras") else "keras3"
