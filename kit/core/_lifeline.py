"""A lifeline: a process that exits as soon as the processes owning it are gone.

A killed notebook kernel runs no ``atexit`` handler, and an ipyparallel engine notices a dead
controller only after ~50 missed heartbeats (minutes), while the controller's scheduler
processes outlive a killed controller. So every process a local cluster starts (its controller and
engines, through :mod:`kit.core._boot`; its network holders, :mod:`kit.core._netns`) gets
``KIT_LIFELINE="pid:start_time,..."`` in its environment and calls :func:`start`: a daemon thread polls
those processes and ends this one (``os._exit``) when any of them has exited. The start time guards
against a recycled pid. Engines on other hosts cannot see local pids; there the engine's own
heartbeat check (``--IPEngine.max_heartbeat_misses``) is the fallback, and the process may have *last
words*: ``KIT_LAST_WORDS`` names a JSON file of commands (e.g. ``[["scancel", "12", "13"]]``, which
:mod:`kit.core.attach` keeps current for the Slurm jobs of its engines) that the process runs, each bounded,
before it exits: a killed kernel's jobs then leave the queue at once instead of after the engines' missed
heartbeats (measured: 22.5 s).

This module imports no other module of the kit: :mod:`kit.core._netns` and :mod:`kit.core._boot` build on it.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
import time
from typing import Iterable

import psutil

LIFELINE_VAR = "KIT_LIFELINE"
LAST_WORDS_VAR = "KIT_LAST_WORDS"
POLL_SECONDS = 0.5
#: The bound of each last command (``scancel`` answers within a second when slurmctld is up).
LAST_WORDS_TIMEOUT_S = 10.0
#: Whether this kernel gives each process's start in ticks since boot (Linux), read once: every process of a
#: cluster must tell start times alike, also where a test fakes ``sys.platform``.
_PROC_STAT = sys.platform.startswith("linux")
#: Whether a process's end can be waited for with a pidfd (Linux 5.3 and later; not macOS).
_PIDFD = hasattr(os, "pidfd_open")


def start_time(pid: int) -> float:
    """When process ``pid`` started, as a number no change of the wall clock moves: on Linux the kernel's clock
    ticks since boot (``/proc/PID/stat``). psutil's ``create_time`` adds ``/proc/stat``'s ``btime``, whole seconds
    that a step of the clock by a few ms can move by one; then every live process looked dead
    (docs/performance.md, change 29). Elsewhere psutil's ``create_time``, which the kernel keeps as it was."""
    if _PROC_STAT:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # the name in (...) may hold spaces
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, the 20th after the name
    return psutil.Process(pid).create_time()


def token(pid: int) -> str:
    """``pid:start_time`` of a live process (:func:`start_time`), for ``KIT_LIFELINE``."""
    return f"{pid}:{start_time(pid):.3f}"


def parse(value: str) -> list[tuple[int, float]]:
    """Parse ``KIT_LIFELINE`` into ``[(pid, start_time), ...]``."""
    watched = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        pid_text, _, start_text = item.partition(":")
        watched.append((int(pid_text), float(start_text)))
    return watched


def is_alive(pid: int, started: float) -> bool:
    """Whether the process that had ``pid`` and started at ``started`` (:func:`start_time`) still runs (zombies
    are dead)."""
    try:
        return abs(start_time(pid) - started) < 0.005 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.NoSuchProcess):  # no /proc/PID: it has ended
        return False


def runs(process: psutil.Process | int | None) -> bool:
    """Whether ``process`` (a psutil.Process made while it ran, or a pid) still runs: psutil's ``is_running``
    tells a recycled pid by the start time since boot, which no step of the wall clock moves (``create_time``
    does: docs/performance.md, change 29); a zombie is dead here (killed daemons stay zombies for ~2 s)."""
    try:
        process = psutil.Process(process) if isinstance(process, int) else process
        return process is not None and process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap(pids: Iterable[int], grace: float = 0.0, seconds: float = 10.0) -> tuple[list[int], list[int]]:
    """End the processes ``pids`` (children or not), the one way the kit does: give each up to ``grace`` seconds
    to exit, SIGKILL those still running, and wait up to ``seconds`` for them to end (:func:`wait_ended`: a zombie
    has ended); a child of this process is then collected, so that none stays a zombie. Returns the pids it killed
    and the pids still running after ``seconds`` (for the caller to name)."""
    import signal

    pids = sorted(set(pids))
    deadline = time.monotonic() + grace
    killed = [pid for pid in pids if not wait_ended(pid, max(0.0, deadline - time.monotonic()))]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # ended since the wait
    deadline = time.monotonic() + seconds
    left = [pid for pid in killed if not wait_ended(pid, max(0.0, deadline - time.monotonic()))]
    for pid in set(pids) - set(left):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue  # not a child of this process (or already collected): its parent collects it
    return killed, left


def wait_ended(pid: int, seconds: float) -> bool:
    """Wait until process ``pid`` (not necessarily a child) has ended, at most ``seconds`` (a pidfd says when: a
    zombie has ended); whether it has. Without pidfds (macOS) the wait asks :func:`runs` every 10 ms until then
    (a kernel event for another process's end would need kqueue)."""
    import select

    if not _PIDFD:
        deadline = time.monotonic() + seconds
        while runs(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


def _say(text: str) -> None:
    try:
        print(f"kit lifeline: {text}", file=sys.__stderr__, flush=True)
    except OSError:
        pass  # stderr was a pipe to the owner, now gone (EPIPE): go on all the same


def last_words(path: str | None) -> None:
    """Run the commands of the JSON file ``path`` (a list of argv lists), each bounded; say what each did; then
    remove the file."""
    if not path or not os.path.exists(path):
        return
    try:
        with open(path) as f:
            commands = json.load(f)
    except (OSError, ValueError) as error:
        _say(f"cannot read the last commands in {path}: {error}")
        return
    for argv in commands:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=LAST_WORDS_TIMEOUT_S)
            _say(f"ran {' '.join(argv)}: exit {done.returncode} {done.stderr.strip()}".rstrip())
        except (OSError, subprocess.TimeoutExpired) as error:
            _say(f"could not run {' '.join(argv)}: {error}")
    try:
        os.remove(path)  # said once; the file was the owner's, who is gone
    except OSError as error:
        _say(f"cannot remove {path}: {error}")


def _watch(watched: list[tuple[int, float]], stop: threading.Event, words: str | None) -> None:
    while not stop.wait(POLL_SECONDS):
        for pid, start_time in watched:
            if not is_alive(pid, start_time):
                _say(f"process {pid} that owns this one is gone; exiting")
                last_words(words)
                os._exit(3)


def start(value: str | None = None) -> threading.Event:
    """Start the watchdog thread for ``value`` (default: ``$KIT_LIFELINE``); returns its stop event.

    A forked child (the controller forks its heart monitor) gets no copy of this thread, so one is
    started in it too, watching the same processes plus the parent that forked it.
    """
    stop = threading.Event()
    watched = parse(value if value is not None else os.environ.get(LIFELINE_VAR, ""))
    if watched:
        _start_thread(watched, stop, os.environ.get(LAST_WORDS_VAR))
        os.register_at_fork(after_in_child=lambda: _start_thread(  # the last words are the parent's to say
            [*watched, *parse(token(os.getppid()))], threading.Event(), None))
    return stop


def await_ready(process: subprocess.Popen, timeout: float, ready: str = "ready") -> str | None:
    """Wait at most ``timeout`` s for the first whole line a helper ``process`` writes to its stdout pipe.

    None when the line is ``ready``; otherwise the helper is killed and reaped, and the result says what it did
    instead ("did not report ready within 60s", "exited with code 1 before it was ready", ...), for the
    caller's error, which adds what the helper wrote to its own log. The pipe is closed either way: a helper
    says nothing more there (the zygote points its stdout at its log once ready).
    """
    deadline = time.monotonic() + timeout
    said, ended = b"", False
    fd = process.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in said and not ended:  # the bound holds for the whole line, not its first byte
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                break
            chunk = os.read(fd, 4096)  # not the buffered reader: a half-written line must not block
            said, ended = said + chunk, not chunk
    process.stdout.close()
    line, complete = said.partition(b"\n")[0].decode(errors="replace").strip(), b"\n" in said
    if complete and line == ready:
        return None
    if complete:
        how = f"wrote {line[:200]!r} instead of {ready!r}"
    elif ended:  # the end of its output: it exited, or is exiting, before it was ready
        try:
            how = f"exited with code {process.wait(timeout=10)} before it was {ready}"
        except subprocess.TimeoutExpired:
            how = f"closed its output before it was {ready}"
    else:
        how = f"did not report {ready} within {timeout:g}s" + (f" (it wrote {line[:200]!r})" if line else "")
    process.kill()
    process.wait(timeout=10)
    return how


class Held:
    """A helper process this process started and ends (a network's holder, the engines' zygote), which ends by
    itself through its lifeline should this process die first. It starts by writing ``ready`` to its stdout
    (:func:`await_ready`)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.pid = process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """End it (SIGKILL) and wait for it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _start_thread(watched: list[tuple[int, float]], stop: threading.Event, words: str | None) -> None:
    threading.Thread(target=_watch, args=(watched, stop, words), name="kit-lifeline", daemon=True).start()
