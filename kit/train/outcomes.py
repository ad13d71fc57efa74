"""What each worker's process ended with, written where the notebook can read it after the process is gone.

A worker that ends its own process (``os._exit``, as an uncaught exception ends ``python main.py``) cannot
return its result through ``cluster.run``. It writes it first with :func:`record`: one JSON file per process,
written whole (:func:`kit.core.files.write_atomic`), so a reader never sees half of it. The notebook
waits for as many as it expects with :func:`collect`, a bounded wait on the files themselves.

:func:`peer_watch` reads what TensorFlow set up in this process to notice a lost peer (two private
attributes, read only to show them).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..core.files import write_atomic


def record(outcome: dict[str, Any], directory: str | os.PathLike) -> Path:
    """Write ``outcome`` (JSON-able, with ``task``) as ``<task>-<pid>.json`` in ``directory``; return the path."""
    name = f"{outcome.get('task', 'local')}-{os.getpid()}".replace(":", "-")
    return write_atomic(Path(directory) / f"{name}.json", json.dumps(outcome))  # whole, or not there at all


def collect(directory: str | os.PathLike, at_least: int, wait_seconds: float = 60.0,
            poll_seconds: float = 0.2) -> list[dict[str, Any]]:
    """The outcomes recorded in ``directory`` (sorted by file name), once ``at_least`` are there, or after
    ``wait_seconds`` with what there is (the caller checks how many came)."""
    directory = Path(directory)
    deadline = time.monotonic() + wait_seconds
    while len(list(directory.glob("*.json"))) < at_least and time.monotonic() < deadline:
        time.sleep(poll_seconds)  # the files are the readiness signal: nothing else tells us they are written
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def peer_watch(strategy) -> dict[str, Any]:
    """How this process watches its peers under ``strategy``: the coordination service's type (None when
    TensorFlow started none) and whether the strategy's own (older) health check is on."""
    from tensorflow.python.eager import context

    service = getattr(context.context().coordination_service, "service_type", None)
    return {"coordination service": service,
            "strategy's health check": getattr(strategy.extended, "_enable_check_health", None)}


def watched_strategy(build, report) -> Any:
    """This process's strategy, ``build("multi_worker_mirrored")`` (one per process), after reporting with
    ``report(**peer_watch(strategy))`` how the process watches its peers. Notebook 04 passes
    ``kit.OnTask(watched_strategy, kit.train.strategies.build_strategy, kit.train.progress.publish)`` to its
    lesson's functions, so that ``cluster.last_view.measurements()`` says it without a function of its own."""
    strategy = build("multi_worker_mirrored")
    report(**peer_watch(strategy))
    return strategy
