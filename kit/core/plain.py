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

from . import _lifeline, _netns
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
