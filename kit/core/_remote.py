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
        "tensorflow_version": _version("tensorflow"),
        "cores": _cores(),
        "address": reachable_address(),
        "task": os.environ.get("KIT_TASK"),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "tf_config": os.environ.get("TF_CONFIG"),
        "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
        "tensorflow_imported": "tensorflow" in sys.modules,
        "has_tf_keras": find_spec("tf_keras") is not None,
        "python": sys.version.split()[0],
    }


def _cores() -> int:
    """This engine's usable cores, CPU quota included."""
    from kit.core.limits import read

    return read().cores


def port_is_free(port: int) -> bool:
    """Whether ``port`` can be bound on all interfaces of this engine's host."""
    from kit.core.tfconfig import port_is_free as check

    return check(port)


def free_port() -> int:
    """A port that is free on this engine's host now."""
    from kit.core.tfconfig import free_port as pick

    return pick()


def set_environment(values: dict[str, str]) -> None:
    """Update this engine's environment; refused once TensorFlow is imported (it would be ignored)."""
    if "tensorflow" in sys.modules:
        raise RuntimeError("TensorFlow is already imported on this engine, so a new TF_CONFIG "
                           "would not take effect; start fresh engines (cluster.restart()).")
    os.environ.update(values)


def call_with_sources(sources: dict[str, tuple], fn, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` after adding the notebook's cell sources to this engine's linecache.

    A function sent from a notebook keeps its cell's file name (``/tmp/ipykernel_.../NNN.py``), which
    does not exist on the engine: without the source, AutoGraph cannot convert a ``map`` function or a
    ``tf.function`` defined in a cell (it warns, several lines per function, and runs it as is) and
    tracebacks show no code. With the kernel's entries (see :func:`kit.core.cluster.notebook_sources`),
    ``inspect.getsource`` works there as it does in the notebook, for the cell as it is now.
    """
    import linecache

    linecache.cache.update(sources)
    return fn(*args, **kwargs)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def reachable_address() -> str:
    """The IP address this engine uses to talk to its controller: the one other tasks can reach.

    Read from the engine's own TCP connections (to the controller); 127.0.0.1 when the controller
    is on this machine's loopback.
    """
    import psutil

    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and not conn.raddr.ip.startswith("127."):
            return conn.laddr.ip
    return "127.0.0.1"


_PROBE = None


def open_probe(port: int) -> None:
    """Listen on ``port`` (all interfaces) so that the other tasks can check they reach it."""
    global _PROBE
    close_probe()
    _PROBE = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _PROBE.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _PROBE.bind(("", port))
    _PROBE.listen(16)


def close_probe() -> None:
    global _PROBE
    if _PROBE is not None:
        _PROBE.close()
        _PROBE = None


def probe(addresses: dict[str, str], timeout: float = 3.0) -> dict[str, str]:
    """Try a TCP connection to each task's address; return the ones that failed, with the reason."""
    failed = {}
    for task, address in addresses.items():
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                pass
        except OSError as error:
            failed[task] = f"{address}: {error.strerror or error}"
    return failed
