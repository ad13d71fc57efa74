"""Functions the kit runs *on the engines* (by reference, so engines import this module).

They must stay cheap and must not import TensorFlow: the kit calls them before training, while
TF_CONFIG and the thread limits can still take effect.
"""

from __future__ import annotations

import os
import socket
import sys
from importlib.util import find_spec
from typing import Any


def report() -> dict[str, Any]:
    """What an engine tells the kit at readiness: who it is and what it was given."""
    return {
        "task": os.environ.get("KIT_TASK"),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "tf_config": os.environ.get("TF_CONFIG"),
        "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
        "tensorflow_imported": "tensorflow" in sys.modules,
        "has_tf_keras": find_spec("tf_keras") is not None,
        "python": sys.version.split()[0],
    }


def port_is_free(port: int) -> bool:
    """Whether ``port`` can be bound on all interfaces of this engine's host."""
    from kit.tfconfig import port_is_free as check

    return check(port)


def free_port() -> int:
    """A port that is free on this engine's host now."""
    from kit.tfconfig import free_port as pick

    return pick()


def set_environment(values: dict[str, str]) -> None:
    """Update this engine's environment; refused once TensorFlow is imported (it would be ignored)."""
    if "tensorflow" in sys.modules:
        raise RuntimeError("TensorFlow is already imported on this engine, so a new TF_CONFIG "
                           "would not take effect; start fresh engines (cluster.restart()).")
    os.environ.update(values)
