"""Runs on a TFCluster: call a function on every task, follow its output, collect, supervise.

    cluster.run(train, epochs=3)                                      # every keyword goes to train
    cluster.with_options(timeout=600, max_failures=2).run(train, epochs=3)

:class:`Run` is a cluster with :class:`kit.core.options.RunOptions` bound (``cluster.with_options``,
like tf.data's ``Dataset.with_options``); ``cluster.run`` is ``Run`` with the default options. Every
supervision message (a failure, a restart, giving up) is an event of the run's live view, which shows it
(the widget, or ``[kit] ...`` on stderr) and logs it to the ``kit`` logger.

A run knows its cluster only through :class:`Cluster` (what it reads and calls, all public) and the
cluster's :class:`kit.core.group.TaskGroup` (the tasks, their engines, liveness, how one died, marking
the cluster stale), which it asks for at every attempt. Supervision (when to give up, what to restart)
is :meth:`Run.run` and :meth:`Run._supervised_restart`; how engines are replaced is the engines' kind's
``replace`` (:mod:`kit.core.engines`, :mod:`kit.core.attach`).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, Protocol

from . import _remote, view as views
from .backend import Backend
from .errors import ClusterError, FailuresExhaustedError, WorkerError
from .group import TaskGroup
from .options import ClusterOptions, RunOptions, TaskInfo

#: After one task fails, how long the others get to finish before the cluster is marked stale.
FAILED_PEERS_GRACE_SECONDS = 2.0
#: After a task's engine is lost, how long the others get to show their error: a collective whose peer is gone
#: fails within a second on a quiet machine (TensorFlow, Horovod, JAX's Gloo), but took over 2 s with 1 CPU
#: beside other runs (notebook 12 in `make binder`). The wait ends as soon as they have all replied.
LOST_PEERS_GRACE_SECONDS = 10.0

#: TensorFlow's start-up lines that say nothing to a learner: written by its C++ layer before its log
#: settings are read (so TF_CPP_MIN_LOG_LEVEL cannot silence them), on every import, on every task.
STARTUP_NOISE = re.compile("|".join([
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    r"I\d{4} [\d:.]+\s+\d+ \S+:\d+\] ",  # C++ INFO lines (oneDNN, cuda drivers, cpu_feature_guard, ...)
    r"E\d{4} [\d:.]+\s+\d+ cuda_\w+\.cc:\d+\] failed call to cuInit",  # no GPU on this machine
    r"To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
]))

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass
class Failure:
    """One failure seen by a supervised run."""

    attempt: int      #: 1 for the first failure of a run
    task: str         #: the task that failed first
    error: str        #: one line
    failed_at: float  #: time.time() when the kit saw it
    restarted_at: float | None = None  #: time.time() when fresh engines were ready


class Cluster(Protocol):
    """What a run uses of its cluster (:class:`kit.core.cluster.TFCluster` has it): the tasks through
    :meth:`task_group`, a fresh start or restart for supervision, and where the run's record goes."""

    options: ClusterOptions
    backend: Backend                #: told of a run that raised (kit.core.backend)
    failures: list[Failure]         #: every failure a supervised run saw
    output: dict[str, str]          #: each task's whole output of the last run
    last_view: views.RunView | None  #: the live view of the last run

    @property
    def started(self) -> bool: ...
    @property
    def tasks(self) -> list[TaskInfo]: ...
    def task_group(self, ready: bool = True) -> TaskGroup: ...
    def start(self) -> Any: ...
    def restart(self) -> Any: ...


class Run:
    """A cluster with run options bound: ``.run(fn, *args, **kwargs)`` passes every argument to ``fn``."""

    def __init__(self, cluster: Cluster, options: RunOptions | None = None):
        self.cluster = cluster
        self.options = options or RunOptions()

    def with_options(self, **options: Any) -> "Run":
        """These options with ``options`` changed (see :class:`RunOptions`)."""
        return Run(self.cluster, self.options.updated(**options))

    def __repr__(self) -> str:
        changed = {f.name: getattr(self.options, f.name) for f in dataclasses.fields(RunOptions)
                   if getattr(self.options, f.name) != f.default}
        return f"<Run on {self.cluster!r} with {changed or 'the default options'}>"

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on the tasks at once; return the results in task order.

        A failure on any task raises :class:`WorkerError` naming the task that failed first, with its
        remote traceback. With ``max_failures=N`` (:class:`RunOptions`) a failure replaces every engine
        and calls ``fn`` again, up to N times; each failure is kept in ``cluster.failures``.
        """
        try:
            return self._run(fn, args, kwargs)
        except BaseException:
            self.cluster.backend.after_failed_run(self.cluster)
            raise

    def _run(self, fn: Callable, args: tuple, kwargs: dict) -> list:
        cluster, options = self.cluster, self.options
        name = getattr(fn, "__name__", str(fn))
        group = cluster.task_group(ready=False)  # a stale cluster's tasks still show; none after a failed restart
        names = group.select(options.tasks)
        cluster.last_view = live = views.RunView(
            f"{name} on {', '.join(names)}", [group.info(n) for n in names],
            mode=views.choose(cluster.options.view), show_lines=options.stream)
        failures: list[Failure] = []
        while True:
            try:
                return self._run_once(fn, args, kwargs, names, live)
            except (WorkerError, ClusterError) as error:
                if options.max_failures == 0:
                    raise
                failure = self._failed(failures, _failed_task(error), str(error).split("\n")[0])
                if len(failures) > options.max_failures:
                    live.event(f"{failure.task} failed again: {failure.error}; giving up after "
                               f"{options.max_failures} restart(s)")
                    # every task's log, not only a dead one's or the run's: a live peer's C++ lines (its
                    # gRPC server's) can say why it refused a request (docs/performance.md, change 19)
                    now = cluster.task_group(ready=False)
                    logs = "".join(now.log_tail(task) for task in now.names)
                    raise FailuresExhaustedError(name, failures, logs) from error
                live.event(f"attempt {failure.attempt}: {failure.task} failed: {failure.error}")
                live.restarting(f"restarting all {len(group.names)} tasks with fresh engines "
                                f"(restart {len(failures)} of at most {options.max_failures})")
                self._supervised_restart(failures, name, live)
                if options.on_restart is not None:
                    options.on_restart(cluster)
                failure.restarted_at = time.time()
                live.restarted(cluster.tasks, f"restarted in {failure.restarted_at - failure.failed_at:.1f}s; "
                                              f"running {name} again")

    def _failed(self, failures: list[Failure], task: str, error: str) -> Failure:
        failure = Failure(attempt=len(failures) + 1, task=task, error=error, failed_at=time.time())
        failures.append(failure)
        self.cluster.failures.append(failure)
        return failure

    def _supervised_restart(self, failures: list[Failure], name: str, live: views.RunView) -> None:
        """Restart until the cluster is up; a restart that fails counts as one more failure."""
        cluster = self.cluster
        while True:
            try:
                if cluster.started:
                    cluster.restart()
                else:  # a previous restart failed half-way: start from scratch
                    cluster.start()
                return
            except ClusterError as error:
                failure = self._failed(failures, _failed_task(error),
                                       f"restart failed: {str(error).splitlines()[0]}")
                live.event(failure.error)
                if len(failures) > self.options.max_failures:
                    raise FailuresExhaustedError(name, failures) from error

    @staticmethod
    def _lost(dead: list[str], group: Any, engines: Any, result: Any, names: list[str], name: str,
              follower: "OutputFollower", live: views.RunView) -> None:
        """Tasks in ``dead`` lost their engine process during the run: mark the cluster stale and raise
        WorkerError naming the first of them, with the others' errors, once they had a moment to show."""
        group.mark_stale(f"the cluster lost {', '.join(dead)}", dead)
        oom = group.explain_exit()
        for task in dead:
            live.fail(task, oom or "its engine process exited")
        # the others usually fail within a second (a collective's peer is gone): let their
        # rows and output show it before raising
        survivors = [msg for n, msg in zip(names, result.msg_ids) if n not in dead]
        if survivors:
            deadline = time.monotonic() + LOST_PEERS_GRACE_SECONDS
            engines.wait(survivors, timeout=LOST_PEERS_GRACE_SECONDS)
            # a reply's status and its error come on two sockets (ipyparallel's shell and IOPub channels), and under
            # load the error can trail the status ("error:" with no text, and no error to report): wait, in the same
            # bound, for each survivor's output to end
            for part in result.split():
                if part.msg_ids[0] in survivors:
                    part.wait_for_output(max(0.0, deadline - time.monotonic()))
            follower.update(result)
            live.follow(result, names)
            for task, meta in zip(names, result.metadata):  # on a loaded machine the reply can trail
                if task not in dead and meta.get("status") is None:  # its error: the run is abandoned all the same
                    live.fail(task, f"no reply {LOST_PEERS_GRACE_SECONDS:g} s after {dead[0]} was lost; "
                                    "the run stopped here")
        failures = {n: oom or "process exited" for n in dead}
        for task, meta in zip(names, result.metadata):
            if task not in dead and meta.get("status") == "error" and meta.get("error") is not None:
                error = meta["error"]
                failures[task] = f"{getattr(error, 'ename', type(error).__name__)}: {getattr(error, 'evalue', error)}"
        raise WorkerError(dead[0], f"its engine process exited while running {name}"
                          f"{oom and ': ' + oom}{group.log_tail(dead[0])}", failures=failures)

    def _run_once(self, fn: Callable, args: tuple, kwargs: dict, names: list[str], live: views.RunView) -> list:
        cluster, timeout = self.cluster, self.options.timeout
        group = cluster.task_group()  # the engines of the moment (new ones after a restart), ready
        name = getattr(fn, "__name__", str(fn))
        gone = group.dead(names)
        if gone:  # e.g. a signal ended an idle engine: say so, instead of ipyparallel's KeyError
            group.mark_stale(f"the cluster lost {', '.join(gone)}", gone)
            raise ClusterError(f"{', '.join(gone)}: the engine process is gone (it exited or was killed "
                               f"before this run of {name})", gone, fix="call cluster.restart() for fresh engines")
        group.watch_memory()
        engines = group.view(names)
        result = engines.apply_async(_remote.call_with_sources, notebook_sources(), fn, *args, **kwargs)
        live.submitted(names)
        follower = OutputFollower(names, sink=live.line, quiet=cluster.options.tf_logs == "quiet")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not result.wait(0.2):
                follower.update(result)
                live.follow(result, names)
                dead = group.dead(names)
                if dead:
                    self._lost(dead, group, engines, result, names, name, follower, live)
                if any(meta.get("status") == "error" for meta in result.metadata):
                    # one task failed; the others may be blocked in a collective waiting for it
                    if not result.wait(FAILED_PEERS_GRACE_SECONDS):
                        dead = group.dead(names)
                        if dead:  # a peer died, and the task that failed first only felt it (Horovod's
                            # all-reduce fails at once when a rank is killed): name the cause
                            self._lost(dead, group, engines, result, names, name, follower, live)
                        running = [n for n, meta in zip(names, result.metadata)
                                   if meta.get("status") is None]
                        group.mark_stale(f"{', '.join(running)} still running {name} after "
                                         "another task failed", running)
                        for task in running:  # perhaps waiting in a collective for a peer that failed
                            live.fail(task, f"still running {FAILED_PEERS_GRACE_SECONDS:g} s after another task "
                                            "failed; the run stopped here")
                        collect(result, names, group.explain_exit, partial=True)
                    break
                if deadline is not None and time.monotonic() > deadline:
                    running = [n for n, meta in zip(names, result.metadata) if meta.get("status") is None]
                    group.mark_stale(f"a run of {name} timed out", running)
                    finished = [n for n in names if n not in running]
                    for task in running:
                        live.fail(task, f"still running after {timeout:g}s (timeout)")
                    why = (f"; {', '.join(finished)} finished, so {'it is' if len(running) == 1 else 'they are'} "
                           "probably waiting in a collective (an all-reduce, a save) that the others never "
                           "joined" if finished else "")
                    raise ClusterError(f"run of {name} timed out after {timeout:g}s: {', '.join(running)} "
                                       f"still running{why}", running,
                                       fix="call cluster.restart() before the next run (a task stuck in a "
                                           "collective cannot be freed)")
        finally:
            if result.ready():
                result.wait_for_output(timeout=5)  # iopub output may trail the reply a little
            follower.update(result, final=True)
            live.follow(result, names)
            live.draw(final=True)
            cluster.output = follower.output()
        return collect(result, names, group.explain_exit)


def collect(result: Any, names: list[str], explain_exit: Callable[[], str], partial: bool = False) -> list:
    """The results in task order; raise WorkerError naming the task that failed first, if any did (a task
    whose engine died before any other).

    ``partial``: some tasks are still running; look only at those that finished. ``explain_exit``
    says why an engine died (the out-of-memory killer), or "".
    """
    if partial:
        values = [meta.get("error") if meta.get("status") == "error" else None
                  for meta in result.metadata]
    else:
        values = result.get(return_exceptions=True)
    failures = {}
    order = []
    for name, value, meta in zip(names, values, result.metadata):
        if isinstance(value, BaseException):
            ename = getattr(value, "ename", type(value).__name__)
            evalue = getattr(value, "evalue", str(value))
            error = f"{ename}: {evalue}"
            if ename == "EngineError":  # the controller saw the engine die before the kit did
                error += f"; {explain_exit() or 'its process exited'}"
            failures[name] = (error, _ANSI.sub("", getattr(value, "traceback", "") or ""))
            order.append((meta.get("completed") or meta.get("received") or 0, name))
    if failures:
        # a task whose engine died is the cause; the others failed because a peer was gone
        died = {n for n, (e, _) in failures.items() if e.startswith("EngineError")}
        first = min(order, key=lambda item: (item[1] not in died, str(item[0]), names.index(item[1])))[1]
        error, traceback = failures[first]
        raise WorkerError(first, error, remote_traceback=traceback,
                          failures={n: e for n, (e, _) in failures.items()})
    return values


def notebook_sources() -> dict[str, tuple]:
    """The linecache entries of the code cells this kernel ran (IPython keeps them with no mtime).

    Sent with every run (:func:`kit.core._remote.call_with_sources`) so that a function defined in a cell
    has its source on the engines too. Empty outside IPython.
    """
    import linecache

    return {name: entry for name, entry in list(linecache.cache.items())
            if len(entry) == 4 and entry[1] is None and entry[2]}


class OutputFollower:
    """Hands each task's new stdout/stderr lines to ``sink(task, stream, line)`` as they arrive
    (the live view: a task's log, or printed with the task's name in front), without TensorFlow's
    start-up noise (``quiet``); keeps every line, hidden or not."""

    def __init__(self, names: list[str], sink: Callable[[str, str, str], None], quiet: bool = True):
        self.names = names
        self.sink = sink
        self.quiet = quiet
        self.offsets = {(n, s): 0 for n in names for s in ("stdout", "stderr")}
        self.partial = {key: "" for key in self.offsets}
        self.lines: dict[str, list[str]] = {n: [] for n in names}

    def output(self) -> dict[str, str]:
        return {name: "\n".join(lines) for name, lines in self.lines.items()}

    def update(self, result: Any, final: bool = False) -> None:
        for stream_name in ("stdout", "stderr"):
            texts = getattr(result, stream_name)
            for name, text in zip(self.names, texts):
                key = (name, stream_name)
                new = text[self.offsets[key]:]
                self.offsets[key] = len(text)
                buffered = self.partial[key] + new
                *lines, rest = buffered.split("\n")
                if final and rest:
                    lines.append(rest)
                    rest = ""
                self.partial[key] = rest
                for line in lines:
                    shown = line.rsplit("\r", 1)[-1]  # progress bars redraw with \r: keep the last
                    if not shown.strip():
                        continue
                    self.lines[name].append(shown)
                    if not (self.quiet and STARTUP_NOISE.match(shown)):
                        self.sink(name, stream_name, shown)


def _failed_task(error: Exception) -> str:
    if isinstance(error, WorkerError):
        return error.task
    tasks = getattr(error, "tasks", None)
    return tasks[0] if tasks else "cluster"
