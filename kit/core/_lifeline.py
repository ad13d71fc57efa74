"""A lifeline: a process that exits as soon as the processes owning it are gone.

A killed notebook kernel runs no ``atexit`` handler, and an ipyparallel engine notices a dead
controller only after ~50 missed heartbeats (minutes), while the controller's scheduler
processes outlive a killed controller. So every process a local cluster starts (its controller and
engines, through :mod:`kit.core._boot`; its network holders, :mod:`kit.core._netns`) gets
``KIT_LIFELINE="pid:start_time,..."`` in its environment and calls :func:`start`: a daemon thread polls
those processes and ends this one (``os._exit``) when any of them has exited. The start time guards
against a recycled pid. Engines on other hosts cannot see local pids; there the engine's own
heartbeat check (``--IPEngine.max_heartbeat_misses``) is the fallback.

This module imports no other module of the kit: :mod:`kit.core._netns` and :mod:`kit.core._boot` build on it.
"""

from __future__ import annotations

import os
import sys
import threading

import psutil

LIFELINE_VAR = "KIT_LIFELINE"
POLL_SECONDS = 0.5


def token(pid: int) -> str:
    """``pid:start_time`` of a live process, for ``KIT_LIFELINE``."""
    return f"{pid}:{psutil.Process(pid).create_time():.3f}"


def parse(value: str) -> list[tuple[int, float]]:
    """Parse ``KIT_LIFELINE`` into ``[(pid, start_time), ...]``."""
    watched = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        pid_text, _, start_text = item.partition(":")
        watched.append((int(pid_text), float(start_text)))
    return watched


def is_alive(pid: int, start_time: float) -> bool:
    """Whether the process that had ``pid`` and started at ``start_time`` still runs (zombies are dead)."""
    try:
        proc = psutil.Process(pid)
        return (abs(proc.create_time() - start_time) < 0.01
                and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _watch(watched: list[tuple[int, float]], stop: threading.Event) -> None:
    while not stop.wait(POLL_SECONDS):
        for pid, start_time in watched:
            if not is_alive(pid, start_time):
                try:
                    print(f"kit lifeline: process {pid} that owns this one is gone; exiting",
                          file=sys.__stderr__, flush=True)
                except OSError:
                    pass  # stderr was a pipe to the owner, now gone (EPIPE): exit all the same
                os._exit(3)


def start(value: str | None = None) -> threading.Event:
    """Start the watchdog thread for ``value`` (default: ``$KIT_LIFELINE``); returns its stop event.

    A forked child (the controller forks its heart monitor) gets no copy of this thread, so one is
    started in it too, watching the same processes plus the parent that forked it.
    """
    stop = threading.Event()
    watched = parse(value if value is not None else os.environ.get(LIFELINE_VAR, ""))
    if watched:
        _start_thread(watched, stop)
        os.register_at_fork(after_in_child=lambda: _start_thread(
            [*watched, *parse(token(os.getppid()))], threading.Event()))
    return stop


def _start_thread(watched: list[tuple[int, float]], stop: threading.Event) -> None:
    threading.Thread(target=_watch, args=(watched, stop), name="kit-lifeline", daemon=True).start()
