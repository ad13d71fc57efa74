"""ipyparallel's controller, listening on unix sockets that its engines and clients can find.

A local cluster's controller listens on unix sockets (ZMQ ``ipc://``) in the cluster's 0700 profile
folder, not on TCP: its engines live in a private network namespace (:mod:`kit.core._netns`), which a
unix socket crosses and a loopback address does not.

The fix this module carries: ipyparallel 9.2's controller binds an ipc channel at
``ipc://PATH-PORT`` (``IPController.construct_url``), while its engines and clients connect to
``ipc://PATH:PORT`` (``EngineFactory`` and ``Client`` join interface and port with ``:``), so
nothing ever connects. The controller here binds the name they connect to. Drop it when
ipyparallel's controller joins ipc URLs with ``:``.
"""

from __future__ import annotations

from ipyparallel.controller.app import IPController


class Controller(IPController):
    """IPController whose ipc URLs are ``ipc://PATH:PORT``, as its engines and clients expect."""

    def construct_url(self, kind: str, channel: str, index=None) -> str:
        url = super().construct_url(kind, channel, index)
        if url.startswith("ipc://"):
            path, _, port = url.rpartition("-")
            return f"{path}:{port}"
        return url


if __name__ == "__main__":
    Controller.launch_instance()
