"""A local cluster's engines forked from one process that imported TensorFlow once.

Every engine of a local cluster imports TensorFlow (about 209 MiB of anonymous memory and 1.8 s of CPU each,
docs/performance.md, change 23). Forked from one *zygote* that imported it, they share those pages until
they write them: four processes that train a small Keras model took 455 MiB instead of 903, and the cluster's
first step no longer waits for one import per task on a machine with fewer cores than tasks.

    python -m kit.core._zygote ipyparallel.engine SOCKET      # started by kit.core.engines.LocalEngines

The zygote joins the cluster's private network (``KIT_NETNS``) while it has one thread, imports TensorFlow
(and tf_keras where ``TF_USE_LEGACY_KERAS=1``) and ipyparallel's engine, freezes the collector
(``gc.freeze``: the imported objects are never collected, so no child writes their pages for it), prints
``ready`` and answers on the unix socket ``SOCKET``: each connection sends one JSON line (the engine's
``_boot`` arguments, environment, working directory and log file) and gets back the forked engine's pid.
It never runs anything of its own, reaps its children, and exits when its lifeline (the kernel, the
controller) is gone. Its command line names ``ipyparallel.engine``, which its children keep: a census by
command line counts them as engines, and the zygote with them.

:class:`ForkedEngineSetLauncher` is the ipyparallel launcher of such engines (``Cluster(engine_launcher_class=
...)``): an engine whose environment names a zygote (``KIT_ZYGOTE``) is forked by it, any other is started as
ipyparallel starts one. ipyparallel's launchers follow a process through psutil, which waits for a process
that is not their child as well; the kit signals and reaps engines by pid as before.

This module imports neither TensorFlow nor ipyparallel at import (the kernel imports it for the launcher).
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Iterable

from . import _lifeline
from .errors import ClusterError

#: An engine's launch variable: the zygote's socket, which forks it (kit.core.engines.LocalEngines).
ZYGOTE_VAR = "KIT_ZYGOTE"
READY = "ready"
#: The module the children run, also in the zygote's command line (so its children keep it).
ENGINE_MODULE = "ipyparallel.engine"
#: How long a fork request may take (the zygote answers within milliseconds once ready).
REQUEST_TIMEOUT_S = 30.0


#: What a process reads as it starts (Python) or imports TensorFlow: a zygote can stand in for the start of every
#: task only when they all agree on these (else each engine starts and imports as usual).
STARTUP_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONHASHSEED",
                "PYTHONWARNINGS", "PYTHONOPTIMIZE", "TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL",
                "MALLOC_ARENA_MAX", "KIT_TFDATA_AUTOTUNE")


def can_fork() -> bool:
    """Whether engines may be forked from a process that imported TensorFlow: on Linux only. On macOS a fork
    without exec after such an import is unsafe (the Objective-C runtime and Accelerate refuse to run in the
    child), and elsewhere it is untested: there every engine imports TensorFlow itself (in the background)."""
    return sys.platform.startswith("linux")


def same_start(environments: Iterable[dict[str, str]]) -> bool:
    """Whether processes launched with these environments (over this process's) would start alike."""
    seen = {tuple({**os.environ, **env}.get(name) for name in STARTUP_VARS) for env in environments}
    return len(seen) <= 1


#: What to do when the zygote fails (the message says what it said).
ZYGOTE_FIX = ("start the cluster with preload=False (each engine then imports TensorFlow itself), and read the "
              "zygote's log (log/zygote.log in the cluster's folder)")


class ZygoteError(ClusterError):
    """The zygote did not start, or did not fork an engine; the message says what it said."""

    def __init__(self, message: str):
        super().__init__(message, fix=ZYGOTE_FIX)


class Zygote(_lifeline.Held):
    """The zygote of one cluster's engines, seen from the process that started it (its engines are the kit's to
    stop: :meth:`stop` ends the zygote only)."""

    def __init__(self, process: subprocess.Popen, socket_path: str, netns: str | None = None):
        super().__init__(process)
        self.socket_path = socket_path
        self.netns = netns  #: the private network it is in (``KIT_NETNS``), None for the host's

    @classmethod
    def start_in(cls, folder: Path, environment: dict[str, str], timeout: float) -> "Zygote":
        """Start the zygote of the local cluster whose folder (:mod:`kit.core.workdir`) is ``folder``: its socket
        in ``sockets/``, its log in ``log/``, its TMPDIR in ``tmp/zygote``; raise :class:`ZygoteError`."""
        from . import _netns, workdir

        (folder / "log").mkdir(mode=0o700, exist_ok=True)
        environment = {**environment, "TMPDIR": workdir.task_tmpdir(folder, "zygote")}
        zygote = cls.start(str(folder / "sockets" / "zygote"), environment, str(folder / "log" / "zygote.log"), timeout)
        zygote.netns = environment.get(_netns.NETNS_VAR)
        return zygote

    def serves(self, network: dict[str, str]) -> bool:
        """Whether it still runs, in the network an engine's launch ``network`` entry names."""
        from . import _netns

        return self.alive() and self.netns == network.get(_netns.NETNS_VAR)

    @classmethod
    def start(cls, socket_path: str, environment: dict[str, str], log_path: str, timeout: float) -> "Zygote":
        """Start a zygote listening on ``socket_path``; return once it imported TensorFlow (within ``timeout``)."""
        with open(log_path, "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", "kit.core._zygote", ENGINE_MODULE, socket_path],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                       env=environment, start_new_session=True)
        how = _lifeline.await_ready(process, timeout, READY)
        if how is not None:
            with open(log_path, errors="replace") as log:
                said = log.read().strip().splitlines()[-3:]
            raise ZygoteError(f"the engines' zygote (pid {process.pid}) {how}"
                              + (": " + " / ".join(said) if said else ""))
        return cls(process, socket_path)


def fork_engine(socket_path: str, argv: list[str], env: dict[str, str], cwd: str, log: str) -> int:
    """Ask the zygote at ``socket_path`` to fork an engine that runs ``python -m kit.core._boot *argv``; its pid."""
    request = json.dumps({"argv": argv, "env": env, "cwd": cwd, "log": log}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(REQUEST_TIMEOUT_S)
        try:
            client.connect(socket_path)
            client.sendall(request)
            reply = client.makefile("rb").readline()
        except OSError as error:
            raise ZygoteError(f"the engines' zygote at {socket_path} did not fork an engine: {error}") from None
    answer = json.loads(reply or b"{}")
    if "pid" not in answer:
        raise ZygoteError(f"the engines' zygote at {socket_path} did not fork an engine: "
                          f"{answer.get('error', reply)!r}")
    return int(answer["pid"])


@functools.cache
def engine_set_launcher():
    """ipyparallel's engine set launcher whose engines the zygote forks, for ``ipyparallel.Cluster(
    engine_launcher_class=...)`` (defined on first use: importing ipyparallel is not cheap)."""
    import psutil
    from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher

    class ForkedEngineLauncher(LocalEngineLauncher):
        """One engine, forked by the zygote its environment names; else started as ipyparallel starts one."""

        def start(self):
            socket_path = self.get_env().get(ZYGOTE_VAR)
            if not socket_path:
                return super().start()
            if self.state != "before":
                raise RuntimeError(f"the engine launcher was already started: {self.state}")
            args = list(self.args)
            boot = args.index("kit.core._boot")  # [python, -m, kit.core._boot, ipyparallel.engine, ...]
            env = {**os.environ, **self.get_env()}
            env.pop(ZYGOTE_VAR)
            self.pid = fork_engine(socket_path, args[boot + 1:], env, self.work_dir, self.output_file)
            self.process = psutil.Process(self.pid)
            self.notify_start(self.pid)
            self._start_waiting()

    class ForkedEngineSetLauncher(LocalEngineSetLauncher):
        launcher_class = ForkedEngineLauncher

    return ForkedEngineSetLauncher


# ----- the zygote's own process ---------------------------------------------------------------------
def _prepare() -> None:
    """Into the cluster's network (one thread yet), then the imports every engine shares."""
    import gc
    import importlib

    from . import _netns, _remote, nojax, tfdata_wakeup

    netns = os.environ.get(_netns.NETNS_VAR)
    if netns:
        _netns.enter(netns)
    tfdata_wakeup.install()
    nojax.install()  # TensorFlow without JAX; the engine's code may still import JAX
    _remote.import_tensorflow_and_keras()
    importlib.import_module("ipyparallel.engine.app")
    gc.collect()
    gc.freeze()


def _child(request: dict[str, Any]) -> None:
    """In a forked child: become the engine ``request`` describes (never returns)."""
    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # the engine's own TMPDIR (kit.core.workdir), not the zygote's
        from . import _boot

        _boot.run_forked(request["argv"])
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - the engine's log gets the traceback, the exit code says it failed
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve(listener: socket.socket, wakeup: int, wakeup_write: int, watched: list[tuple[int, float]]) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(wakeup, selectors.EVENT_READ)
        while all(_lifeline.is_alive(pid, start) for pid, start in watched):
            for key, _ in selector.select(timeout=_lifeline.POLL_SECONDS):
                if key.fileobj is listener:
                    connection, _ = listener.accept()
                    with connection:
                        _answer(connection, (listener, selector, wakeup, wakeup_write))
                else:
                    os.read(wakeup, 512)  # SIGCHLD: reaped below
            _reap()


def _answer(connection: socket.socket, inherited: tuple) -> None:
    """Fork one engine for the request on ``connection`` and tell its pid."""
    connection.settimeout(REQUEST_TIMEOUT_S)
    try:
        request = json.loads(connection.makefile("rb").readline())
    except (OSError, ValueError) as error:
        print(f"kit zygote: a bad request ({error})", file=sys.stderr, flush=True)
        return
    try:
        pid = os.fork()
    except OSError as error:  # EAGAIN, ENOMEM: the launcher raises it, naming the zygote
        connection.sendall(json.dumps({"error": f"fork: {error}"}).encode() + b"\n")
        return
    if pid == 0:
        listener, selector, wakeup, wakeup_write = inherited
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        selector.close()
        listener.close()
        os.close(wakeup)
        os.close(wakeup_write)
        _child(request)
    connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] != ENGINE_MODULE:
        raise SystemExit(f"usage: python -m kit.core._zygote {ENGINE_MODULE} SOCKET")
    socket_path = argv[1]
    watched = _lifeline.parse(os.environ.get(_lifeline.LIFELINE_VAR, ""))
    _prepare()
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop (set_wakeup_fd) to reap at once
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(socket_path)
        os.chmod(socket_path, 0o600)
        listener.listen(16)
        print(READY, flush=True)
        os.dup2(2, 1)  # the kit stops reading stdout: anything printed later goes to the log
        _serve(listener, read_end, write_end, watched)


if __name__ == "__main__":
    main(sys.argv[1:])
