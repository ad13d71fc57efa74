"""``fit`` returns on time: the kit turns ``tf.data`` autotuning off where TensorFlow makes an iterator.

Why (docs/performance.md, change 13; the upstream report is docs/upstream/tf-data-autotuner-late-return.md):
deleting a ``tf.data`` iterator that autotunes cancels its autotuner thread (``Model::OptimizeLoop``) and
joins it, and the cancellation can be lost: tsl's ``CancellationManager::StartCancelWithStatus`` runs the
callback that wakes the thread *before* it sets its cancelled flag, so the woken thread can see "not
cancelled" and sleep out the rest of its period (10 ms, doubling up to 60 s). ``fit`` deletes its input
iterator after ``on_train_end``, so it returned up to that sleep late: two workers, 3 x 70 steps, 8 of 24
returns later than 2 s, up to 19.8 s, on a machine whose other processes used about one of its two cores
(``python tools/late_return.py``; docs/performance.md has the table). Under a ``tf.distribute`` strategy
there are two autotuning roots, the user's dataset (inside the ``MultiDeviceIterator``) and each per-device
dataset (``multi_device_iterator_ops._create_device_dataset``, which never sees the user's options), so the
user's ``options.autotune.enabled = False`` alone left one autotuner to wait for (1 of 6 returns 13.3 s late).

What :func:`install` does: once ``tensorflow.python.data.ops.dataset_ops`` has been imported (a finder on
``sys.meta_path`` waits for it, so importing this module never imports TensorFlow), it wraps the private
``DatasetV2._apply_debug_options``, the one method every iterator's dataset passes through (``iter``,
``MultiDeviceIterator``, the per-device datasets, ``reduce``, a dataset sent to another process): a dataset
that leaves ``options.autotune.enabled`` unset gets ``False``; one that sets it is left as it is. No
autotuner thread is started, so none is left to wait for: 0 of 24 returns later than 2 s (at most 0.39 s)
under the same conditions, at the same examples/s within the run-to-run spread. Parallelism and
prefetching stay; an ``AUTOTUNE`` parallelism keeps its starting value, min(16, tf.data's thread pool),
instead of being tuned.

If TensorFlow lacks that method, :func:`install` warns once (:class:`TFDataWakeupWarning`, naming the
TensorFlow version and the fix) and changes nothing. ``KIT_TFDATA_AUTOTUNE=1`` in the environment leaves
autotuning on (to see the late return, or to compare).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import warnings
from typing import Any

#: The module whose class is patched, and what is patched in it.
TARGET_MODULE = "tensorflow.python.data.ops.dataset_ops"
METHOD = "_apply_debug_options"
TARGET = f"DatasetV2.{METHOD}"
#: Set to "1" to leave tf.data's autotuning on in this process (install() then does nothing).
KEEP_AUTOTUNE_VAR = "KIT_TFDATA_AUTOTUNE"

_lock = threading.RLock()
_state = {"patched": False, "warned": False}


class TFDataWakeupWarning(UserWarning):
    """The kit could not turn ``tf.data`` autotuning off (see :mod:`kit.core.tfdata_wakeup`); the
    message names the TensorFlow version and the fix."""


def _tf_version() -> str:
    versions = sys.modules.get("tensorflow.python.framework.versions")
    version = getattr(versions, "VERSION", None) or getattr(versions, "__version__", None)
    if version:
        return str(version)
    from importlib import metadata

    for distribution in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _warn(problem: str) -> None:
    with _lock:
        if _state["warned"]:
            return
        _state["warned"] = True
    warnings.warn(
        f"kit.core.tfdata_wakeup: TensorFlow {_tf_version()}: {problem}, so tf.data autotuning stays on and "
        "fit may return seconds after its last step (docs/performance.md, change 13). Fix: give your dataset "
        "options with autotune.enabled = False (a strategy's per-device datasets keep autotuning), or call "
        "tf.data.experimental.enable_debug_mode() before building any dataset (no parallelism, no "
        "prefetch), or use TensorFlow 2.21, which the kit's patch was measured on",
        TFDataWakeupWarning, stacklevel=2)


def _without_autotune(dataset: Any, options_class: type, errors: tuple) -> Any:
    """``dataset`` with ``autotune.enabled = False`` unless its options already say (True or False)."""
    try:
        if dataset.options().autotune.enabled is not None:
            return dataset
        options = options_class()
        options.autotune.enabled = False
        return dataset.with_options(options)
    except errors as error:  # never break a pipeline over this: leave it as TensorFlow made it
        _warn(f"setting autotune.enabled on a {type(dataset).__name__} failed ({type(error).__name__}: "
              f"{error})")
        return dataset


def _patch(module: Any) -> bool:
    """Wrap ``module.DatasetV2._apply_debug_options`` (once); False, after one warning, if it is missing."""
    cls = getattr(module, "DatasetV2", None)
    original = getattr(cls, METHOD, None)
    options_class = getattr(getattr(module, "options_lib", None), "Options", None)
    if not callable(original) or options_class is None:
        missing = TARGET if not callable(original) else "options_lib.Options"
        _warn(f"{TARGET_MODULE} has no {missing}")
        return False
    if getattr(original, "kit_tfdata_wakeup", False):
        return True
    errors_impl = sys.modules.get("tensorflow.python.framework.errors_impl")
    errors = (TypeError, ValueError, AttributeError, RuntimeError)
    if errors_impl is not None and isinstance(getattr(errors_impl, "OpError", None), type):
        errors += (errors_impl.OpError,)

    @functools.wraps(original)
    def wrapper(self):
        return _without_autotune(original(self), options_class, errors)

    wrapper.kit_tfdata_wakeup = True  # marks the wrapper: a second install() leaves it alone
    with _lock:
        if not getattr(getattr(cls, METHOD), "kit_tfdata_wakeup", False):
            setattr(cls, METHOD, wrapper)
        _state["patched"] = True
    return True


def _check_tensorflow(module: Any) -> None:
    """After ``import tensorflow``: ``dataset_ops`` came with it (TF 2.21); if it did not, say so once."""
    if not _state["patched"] and TARGET_MODULE not in sys.modules:
        _warn(f"importing it did not import {TARGET_MODULE}")


class _AfterExec(importlib.abc.Loader):
    """Runs the real loader, gives the module its own loader back, then calls ``then(module)``."""

    def __init__(self, loader: importlib.abc.Loader, then):
        self._loader = loader
        self._then = then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._then(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for :data:`TARGET_MODULE` (and ``tensorflow``) it wraps the normal spec's loader."""

    HOOKS = {TARGET_MODULE: _patch, "tensorflow": _check_tensorflow}

    def find_spec(self, fullname, path, target=None):
        then = self.HOOKS.get(fullname)
        if then is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterExec(spec.loader, then)
        return spec


_FINDER = _Finder()


def install() -> bool:
    """Turn ``tf.data`` autotuning off for datasets that do not ask for it, in this process; idempotent.

    Call it before or after TensorFlow's import: before, the patch waits on ``sys.meta_path`` for
    ``dataset_ops`` (TensorFlow is not imported here); after, it is applied at once. Returns False when
    ``KIT_TFDATA_AUTOTUNE=1`` keeps autotuning on or TensorFlow lacks the private method (then one
    :class:`TFDataWakeupWarning`), True otherwise.
    """
    if os.environ.get(KEEP_AUTOTUNE_VAR, "") == "1":
        return False
    module = sys.modules.get(TARGET_MODULE)
    if module is not None and getattr(module, "DatasetV2", None) is not None:
        return _patch(module)
    with _lock:
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    return True


def installed() -> bool:
    """True once the patch is in place (TensorFlow's ``dataset_ops`` imported and wrapped)."""
    return _state["patched"]
