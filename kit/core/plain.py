"""Plain processes, as TensorFlow's tutorial starts them (``python main.py &`` with TF_CONFIG), in a private
network namespace: what a lesson or the benchmark compares the kit's tasks with.

    with PlainProcesses() as plain:
        worker = plain.popen(["kit.tools.launch_bench", "--worker"], env={"TF_CONFIG": ...})

Each process runs ``python -m kit.core._boot MODULE ARGS...``: it joins the namespace first (TensorFlow's
servers listen on every interface and run any op a client sends, docs/security.md), takes a lifeline to
the process that started it (it ends when that one is gone, :mod:`kit.core._lifeline`), then runs the
module as ``__main__``, as ``python -m MODULE`` would. Every process is killed and waited for at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from . import _lifeline, _netns, _remote, nojax
from .errors import ClusterError


class PlainProcesses:
    """A private network namespace and the plain processes started in it."""

    def __init__(self) -> None:
        self.network: _netns.PrivateNetwork | None = None
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> "PlainProcesses":
        try:
            self.network = _netns.PrivateNetwork.start(_lifeline.token(os.getpid()))
        except _netns.Unavailable as error:
            raise ClusterError(f"no private network for plain processes here ({error})",
                               fix="run where network namespaces are allowed (Linux; root, or "
                                   "unprivileged user namespaces)") from None
        return self

    def popen(self, module_args: list[str], env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen:
        """Start ``python -m MODULE ARGS...`` (``module_args``) in the namespace, with ``env`` added to this
        process's environment; ``kwargs`` go to :class:`subprocess.Popen` (``stdout=``, ``cwd=``)."""
        if self.network is None:
            raise ClusterError("PlainProcesses is not entered", fix="use `with PlainProcesses() as plain:`")
        environment = {**os.environ, **(env or {}), _netns.NETNS_VAR: self.network.token,
                       _lifeline.LIFELINE_VAR: _lifeline.token(os.getpid())}
        process = subprocess.Popen([sys.executable, "-m", "kit.core._boot", *module_args], env=environment,
                                   **kwargs)
        self.processes.append(process)
        return process

    def __exit__(self, *exc_info: Any) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
        if self.network is not None:
            self.network.stop()
            self.network = None


# ----- plain processes from a lesson's cell: kit.launch ---------------------------------------------
def launch(commands: list[str], workdir: str, wait_seconds: float, ready: str = "",
           env: dict[str, str] | None = None, hold_port: int | None = None,
           start_seconds: float = 180) -> list[dict[str, Any]]:
    """Run each shell command as its own process, as a tutorial's ``%%bash --bg`` does, and wait, bounded.

    Each command runs under ``bash -c`` in ``workdir``, in a process group of its own, with its output
    (stdout and stderr) in ``workdir/job_N.log``. The commands set TF_CONFIG and the Keras choice themselves:
    both are taken out of the environment they inherit (plus ``env``; ``python`` is this interpreter).

    Given a ``ready`` line, first wait until every process has printed it or exited (at most
    ``start_seconds``, else TimeoutError); then wait at most ``wait_seconds`` for all of them to exit, and
    kill what is left (its whole group). ``hold_port``: a socket listens there all along and never answers.
    Every process also dies with the one that called this (``PR_SET_PDEATHSIG``): run it on an engine
    (``cluster.with_options(tasks=["worker:0"]).run(kit.launch, ...)``) and the processes live in the
    cluster's private network and go with the engine.

    Returns, per command: ``returncode``, ``killed`` (by the wait's bound), ``ended`` (how, in words:
    "exited (0)", "killed at the bound (6 s)", "died of signal 6"), ``pid``, ``peak_mb`` (resident memory,
    sampled), ``listening`` (the TCP addresses it listened on), ``network`` (its network namespace, as
    ``/proc/PID/ns/net`` names it; "" if it exited before it was sampled) and ``log`` (its output).
    """
    import ctypes
    import signal
    import socket
    import time
    from pathlib import Path

    import psutil

    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork; the child only calls prctl
    environment = nojax.environ({**os.environ, **(env or {})})  # this python; TensorFlow without JAX (kit.core.nojax)
    for name in ("TF_CONFIG", "TF_USE_LEGACY_KERAS"):  # the commands set these themselves
        environment.pop(name, None)
    holder = socket.create_server(("127.0.0.1", hold_port)) if hold_port else None
    logs = [Path(workdir) / f"job_{i}.log" for i in range(len(commands))]
    outputs = [log.open("w") for log in logs]
    processes = [subprocess.Popen(["bash", "-c", command], cwd=workdir, env=environment, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))  # PR_SET_PDEATHSIG
                 for command, out in zip(commands, outputs)]
    peak = [0] * len(processes)
    listening: list[set[str]] = [set() for _ in processes]
    network = [""] * len(processes)

    def watch(seconds: float) -> None:  # wait up to `seconds` for every process to exit, measuring meanwhile
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in processes):
            for i, process in enumerate(processes):
                try:
                    info = psutil.Process(process.pid)
                    peak[i] = max(peak[i], info.memory_info().rss)
                    listening[i] |= {f"{c.laddr.ip}:{c.laddr.port}" for c in _remote.tcp_connections(info)
                                     if c.status == psutil.CONN_LISTEN}
                    network[i] = network[i] or os.readlink(f"/proc/{process.pid}/ns/net")
                except (psutil.NoSuchProcess, FileNotFoundError):
                    continue  # exited since the poll: its exit code is read below
                except (psutil.AccessDenied, PermissionError):
                    continue  # mid-execve its /proc is briefly closed to its own user (not to root): next sample
            try:
                next(p for p in processes if p.poll() is None).wait(timeout=0.2)
            except (subprocess.TimeoutExpired, StopIteration):
                pass  # still running, or all done: the loop's condition decides

    try:
        started = time.monotonic()
        while ready and any(p.poll() is None and ready not in log.read_text() for p, log in zip(processes, logs)):
            if time.monotonic() - started > start_seconds:
                raise TimeoutError(f"no {ready!r} from every process within {start_seconds} s "
                                   f"(start_seconds); their logs are in {workdir}")
            watch(0.2)
        watch(wait_seconds)
        killed = [p.poll() is None for p in processes]
    finally:
        members = []  # every process of a group being killed: a SIGKILLed child may still run for a moment
        for process in processes:
            if process.poll() is None:
                try:
                    members += [c.pid for c in psutil.Process(process.pid).children(recursive=True)]
                except psutil.NoSuchProcess:
                    pass  # exited since the poll: its group is killed below all the same
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        _, left = _lifeline.reap(members, seconds=30)
        if left:
            raise TimeoutError(f"processes {left} still alive 30 s after their group was killed")
        for out in outputs:
            out.close()
        if holder:
            holder.close()
    return [{"returncode": p.returncode, "killed": k, "ended": _ended(p.returncode, k, wait_seconds), "pid": p.pid,
             "peak_mb": peak[i] / 1e6, "listening": sorted(listening[i]), "network": network[i],
             "log": log.read_text()}
            for i, (p, k, log) in enumerate(zip(processes, killed, logs))]


def _ended(returncode: int, killed: bool, wait_seconds: float) -> str:
    """How a launched process ended, in words."""
    if killed:
        return f"killed at the bound ({wait_seconds:g} s)"
    return f"exited ({returncode})" if returncode >= 0 else f"died of signal {-returncode}"
