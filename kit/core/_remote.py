"""Functions the kit runs *on the engines* (by reference, so engines import this module).

They must stay cheap and must not import TensorFlow: the kit calls them before training, while
TF_CONFIG and the thread limits can still take effect.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import threading
from importlib.util import find_spec
from typing import Any

from kit.core.errors import ClusterError
from kit.core.tfconfig import this_task


def report() -> dict[str, Any]:
    """What an engine tells the kit at readiness: who it is and what it was given."""
    return {
        "tensorflow_version": _version("tensorflow"),
        "cores": _cores(),
        "address": reachable_address(),
        "interfaces": interface_addresses(),
        "task": this_task(),  # "local" on an engine the kit did not start, until set_environment
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),  # the job it runs in, on Slurm (kit.core.attach)
        "slurm_node": os.environ.get("SLURMD_NODENAME"),  # and the node, as Slurm names it (kit.core.slurm)
        "tf_config": os.environ.get("TF_CONFIG"),
        "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
        "tensorflow_imported": "tensorflow" in sys.modules,
        "tensorflow_preloaded": PRELOAD is not None,
        "has_tf_keras": find_spec("tf_keras") is not None,
        "python": sys.version.split()[0],
        "malloc_arena_max": MALLOC_ARENA_MAX,
    }


def _cores() -> int:
    """This engine's usable cores, CPU quota included."""
    from kit.core.limits import read

    return read().cores


def set_environment(values: dict[str, str]) -> dict[str, Any]:
    """Set this engine's task environment (TF_CONFIG, threads, ...), then return its :func:`report`.

    Refused once TensorFlow is imported (it would be ignored). ``MALLOC_ARENA_MAX`` is also applied
    with glibc's ``mallopt``: glibc reads the variable only when the process starts, so for an engine
    started elsewhere (without it in its launch environment) setting the variable alone does nothing.
    """
    if "tensorflow" in sys.modules and PRELOAD is None:
        raise ClusterError("TensorFlow is already imported on this engine, so a new TF_CONFIG "
                           "would not take effect", fix="start fresh engines (cluster.restart())")
    late = [k for k in READ_AT_IMPORT if k in values and os.environ.get(k) != values[k]]
    if "tensorflow" in sys.modules and late:
        raise ClusterError(f"TensorFlow was imported as this engine started (preload), so {', '.join(late)} "
                           "would not take effect any more",
                           fix="start the cluster with preload=False to set them after the engines start")
    close_probe()  # every task has reached this one's port (kit.core.roles.check_reachability)
    os.environ.update(values)
    from .tfdata_wakeup import install

    install()  # engines of every kind: fit returns on time (kit.core.tfdata_wakeup); once is enough
    if "MALLOC_ARENA_MAX" in values:
        limit_malloc_arenas(int(values["MALLOC_ARENA_MAX"]))
    return report()


#: An engine from elsewhere gets a TMPDIR of its own under its host's temporary folder (:func:`own_tmpdir`),
#: named ``kit-engine-<pid>-<start time>``; the host's folder is kept in ``KIT_HOST_TMPDIR``.
OWN_TMP_PREFIX = "kit-engine-"
HOST_TMP_VAR = "KIT_HOST_TMPDIR"


def own_tmpdir() -> str:
    """Give this engine a TMPDIR of its own, and remove those of this host's engines that are gone.

    For engines the kit did not launch (SSH, Slurm): AutoGraph writes a module per converted function to the
    temporary folder and deletes them at exit, and an engine ended with SIGKILL (a restart, a lost task) runs
    no exit handler. So each engine writes into its own folder, removes it at a normal exit, and removes the
    folders of engines on this host whose process is gone (pid and start time, :mod:`kit.core._lifeline`).
    Local engines get theirs in the cluster's folder at launch instead (:mod:`kit.core.workdir`).
    """
    import atexit
    import shutil
    import tempfile

    from . import _lifeline

    base = os.environ.get(HOST_TMP_VAR) or tempfile.gettempdir()
    os.environ[HOST_TMP_VAR] = base
    remove_dead_engines_tmpdirs(base)
    mine = os.path.join(base, f"{OWN_TMP_PREFIX}{_lifeline.token(os.getpid()).replace(':', '-')}")
    os.makedirs(mine, mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = mine
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    atexit.register(shutil.rmtree, mine, True)
    _remove_on_sigterm_when_idle(mine)
    return mine


#: How many calls of :func:`call_with_sources` run on this engine now (0: idle).
_RUNNING = 0


def _remove_on_sigterm_when_idle(folder: str) -> None:
    """On SIGTERM, remove ``folder`` at once if the engine is idle, then end as before (ipyparallel's handler).

    ``scancel`` or a job's time limit sends SIGTERM and, after Slurm's KillWait, SIGKILL. An idle engine gets
    the signal in its event loop, but its exit handlers come last and slowly: beside a busy loop, a cancelled
    idle engine's folder stayed in 1 of 2 runs (tests/test_slurm_ssh.py). A busy engine keeps its folder: it
    runs on until its function returns (ipyparallel stops its loop after it). A cluster's stop removes it in a
    step of the engine's job (:mod:`kit.core.slurm`); after a plain ``scancel``, the next engine on its host."""
    import shutil
    import signal

    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a handler (ipyparallel runs calls there)
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is None:
        return  # an engine that ignores SIGTERM lives on: its folder stays in use

    def on_sigterm(signum, frame):
        if not _RUNNING:
            shutil.rmtree(folder, ignore_errors=True)
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL: end as the signal would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def remove_own_tmpdir() -> None:
    """Remove this engine's own TMPDIR (:func:`own_tmpdir`), just before the kit ends it with SIGKILL, and those
    of this host's engines that are gone meanwhile (e.g. one SIGKILLed by Slurm while busy, when no engine may
    start on this host again)."""
    import shutil

    if os.environ.get(HOST_TMP_VAR) and os.path.basename(os.environ.get("TMPDIR", "")).startswith(OWN_TMP_PREFIX):
        shutil.rmtree(os.environ["TMPDIR"], ignore_errors=True)
        remove_dead_engines_tmpdirs(os.environ[HOST_TMP_VAR])


def remove_dead_engines_tmpdirs(base: str) -> None:
    """Remove the folders :func:`own_tmpdir` made under ``base`` for engines whose process is gone."""
    import shutil

    from . import _lifeline

    for entry in os.listdir(base):
        if not entry.startswith(OWN_TMP_PREFIX):
            continue
        pid, _, start = entry[len(OWN_TMP_PREFIX):].partition("-")
        if pid.isdigit() and not _lifeline.is_alive(int(pid), float(start or 0)):
            try:
                shutil.rmtree(os.path.join(base, entry))
            except FileNotFoundError:
                continue  # another engine on this host removed it first


#: A local engine's launch variable (``ClusterOptions.preload``): import TensorFlow in the background as the
#: engine starts (:mod:`kit.core._boot`), while the kit gives the tasks their roles. TensorFlow reads TF_CONFIG
#: when a strategy is built and starts its runtime at the first op, so both still take effect; the
#: variables it reads at import (:data:`READ_AT_IMPORT`) are in the launch environment already.
PRELOAD_VAR = "KIT_PRELOAD"
READ_AT_IMPORT = ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "MALLOC_ARENA_MAX")
#: The preload's thread, once started in this process.
PRELOAD: threading.Thread | None = None


def preload_tensorflow() -> threading.Thread | None:
    """Import TensorFlow (and tf_keras, where TF_USE_LEGACY_KERAS=1 asks for it) in a background thread.

    A function that imports TensorFlow meanwhile waits for this import (Python's module lock) instead of
    starting its own. A failed import prints its traceback to the engine's log; the function's own
    ``import tensorflow`` then raises the same error where the learner sees it.
    """
    global PRELOAD
    if "tensorflow" in sys.modules:  # imported at start-up by something else (a sitecustomize): the kit's
        return None                  # check refuses such an engine (kit.core.roles.check_engines)

    PRELOAD = threading.Thread(target=import_tensorflow_and_keras, name="kit-preload", daemon=True)
    PRELOAD.start()
    return PRELOAD


def import_tensorflow_and_keras() -> None:
    """Import TensorFlow, and tf_keras where ``TF_USE_LEGACY_KERAS=1`` asks for it (the preload, the zygote); without
    JAX in processes that installed :mod:`kit.core.nojax` (every engine does)."""
    importlib.import_module("tensorflow")
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1" and find_spec("tf_keras") is not None:
        importlib.import_module("tf_keras")


def mark_preloaded() -> None:
    """Count TensorFlow as preloaded in an engine forked after its import (:mod:`kit.core._zygote`)."""
    global PRELOAD
    if PRELOAD is None:
        PRELOAD = threading.Thread(target=lambda: None, name="kit-preload (before the fork)", daemon=True)
        PRELOAD.start()
        PRELOAD.join()


#: What :func:`limit_malloc_arenas` set in this process (None: nothing yet, or not glibc), and how many
#: arenas the process had then: those stay, and none is added after (tests/test_multihost.py checks).
MALLOC_ARENA_MAX: int | None = None
ARENAS_WHEN_LIMITED: int | None = None
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` from now on (``mallopt(M_ARENA_MAX, arenas)``).

    Takes effect for arenas made afterwards, as long as glibc has not fixed its limit yet (it does once
    the process has more than 8 arenas); arenas made before stay. The kit calls it before TensorFlow
    starts its threads. Returns False where the C library is not glibc.
    """
    global MALLOC_ARENA_MAX, ARENAS_WHEN_LIMITED
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    if ctypes.CDLL(None).mallopt(_M_ARENA_MAX, arenas) != 1:
        raise ClusterError(f"mallopt(M_ARENA_MAX, {arenas}) failed on this engine",
                           fix="remove MALLOC_ARENA_MAX from env= or give a whole number >= 1")
    MALLOC_ARENA_MAX, ARENAS_WHEN_LIMITED = arenas, malloc_arenas()
    return True


def malloc_arenas() -> int:
    """How many malloc arenas this process has now (glibc's malloc_info, one ``<heap>`` each)."""
    import ctypes
    import tempfile

    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        return out.read().count("<heap nr=")


def call_with_sources(sources: dict[str, tuple], fn, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` after adding the notebook's cell sources to this engine's linecache.

    A function sent from a notebook keeps its cell's file name (``/tmp/ipykernel_.../NNN.py``), which
    does not exist on the engine: without the source, AutoGraph cannot convert a ``map`` function or a
    ``tf.function`` defined in a cell (it warns, several lines per function, and runs it as is) and
    tracebacks show no code. With the kernel's entries (see :func:`kit.core.runs.notebook_sources`),
    ``inspect.getsource`` works there as it does in the notebook, for the cell as it is now.
    """
    import linecache

    global _RUNNING
    linecache.cache.update(sources)
    _RUNNING += 1
    try:
        return fn(*args, **kwargs)
    finally:
        _RUNNING -= 1


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

    for conn in tcp_connections():
        if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and not conn.raddr.ip.startswith("127."):
            return conn.laddr.ip
    return "127.0.0.1"


def interface_addresses() -> list[str]:
    """Every address of this engine's host (or network namespace) but loopback, IPv4 then IPv6.

    A TensorFlow server binds every interface (``[::]:PORT``), so it is reachable at each of these. An
    IPv6 link-local address keeps its zone (``fe80::1%eth0``): it is reachable from that link only.
    """
    import ipaddress

    import psutil

    found: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family in found and not ipaddress.ip_address(entry.address.partition("%")[0]).is_loopback:
                found[entry.family].append(entry.address)
    return [*sorted(found[socket.AF_INET]), *sorted(found[socket.AF_INET6])]


_PROBE = None


def open_probe(port: int) -> bool:
    """Listen on ``port`` (all interfaces) so that the other tasks can check they reach it; False if
    the port is taken on this engine's host (or network namespace)."""
    import errno

    global _PROBE
    close_probe()
    try:
        _PROBE = socket.create_server(("", port), backlog=16)  # SO_REUSEADDR on POSIX; closed if it fails
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            return False
        raise
    return True


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


def tcp_connections(process: Any = None) -> list:
    """The TCP connections of ``process`` (a psutil.Process; this one by default): psutil's ``net_connections``, or
    ``connections`` before psutil 6 (Colab's runtime has 5.9.5 loaded in its kernel, and kit.tools.install keeps it)."""
    import psutil

    process = process or psutil.Process()
    return (getattr(process, "net_connections", None) or process.connections)(kind="tcp")
