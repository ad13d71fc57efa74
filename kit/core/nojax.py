"""JAX kept out of TensorFlow's import, from the kit's side (no installed file is changed).

Where JAX is installed, ``import tensorflow`` (2.21) imports it too: TFLite's ``util`` for its JAX converter alone, and
Keras 3's Orbax callback as ``tf.keras`` loads: 106 MiB and 1-2 s more in every process (docs/performance.md, change
26), which Binder's 2 GiB cannot spare beside notebook 09's ranks. :func:`install` adds an import finder that refuses
``jax`` to an import made while a TensorFlow module runs its top level; TensorFlow goes on without it, as where JAX is
not installed. Any other ``import jax`` (the learner's, Keras on the JAX backend) is untouched.

The kit installs it in its engines and plain processes (:mod:`kit.core._boot`, the zygote), and :data:`SITE`, put in
front of ``PYTHONPATH`` (:func:`environ`), installs it in the Python processes of a command the kit runs (``kit.launch``,
horovodrun's ranks) before their script starts. The change TensorFlow could make instead:
docs/upstream/tensorflow-jax-on-use.md.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

#: A folder whose ``sitecustomize`` installs the finder (and then runs the environment's own sitecustomize).
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nojax_site")


class RefuseJaxToTensorFlow(importlib.abc.MetaPathFinder):
    """Refuses ``jax`` while a ``tensorflow`` module runs its top level, in the importing thread."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 - importlib's signature
        if name != "jax":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            module = frame.f_globals.get("__name__") or ""
            if frame.f_code.co_name == "<module>" and (module == "tensorflow" or module.startswith("tensorflow.")):
                raise ModuleNotFoundError(f"JAX is not imported by {module} in this process (kit.core.nojax)",
                                          name="jax")
            frame = frame.f_back
        return None


def install() -> None:
    """Add the finder to this process (once)."""
    if not any(isinstance(finder, RefuseJaxToTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, RefuseJaxToTensorFlow())


def environ(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a command the kit runs (``kit.launch``, ``horovodrun``): :data:`SITE` in front of its
    ``PYTHONPATH`` (its Python processes start with the finder) and this Python's folder in front of its ``PATH``
    (its ``python`` is this one)."""
    rest = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != SITE]
    return {**env, "PYTHONPATH": os.pathsep.join([SITE, *rest]),
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])}
