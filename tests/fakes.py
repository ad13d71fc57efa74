"""In-process engines for the tests of a run's loop, as dask's tests use in-process workers: supervision, time-outs,
restarts and the live view, without a process per task. Real processes stay where the process is what is tested
(start-up, roles, TF_CONFIG, kills of real engines, TensorFlow).

- :class:`FakeEngines` implements :class:`kit.core.engines.Engines`: each task's engine runs what it is given in a
  thread of this process. ``signal`` ends an engine (its call never replies, as a killed process's), ``replace``
  gives fresh engine ids. Its ``client[ids]`` is a view whose ``apply_async`` returns a :class:`FakeResult` with
  what a run reads of ipyparallel's AsyncResult: ``wait``, ``ready``, ``metadata`` (status, error, data),
  ``stdout``/``stderr``, ``get``, ``msg_ids``, ``split``.
- :class:`FakeCluster` is what :class:`kit.core.runs.Run` uses of a cluster (its ``Cluster`` protocol) on
  FakeEngines: ``run``, ``with_options``, ``kill``, ``restart``, the stale state after a lost task or a time-out.

A function run on a fake engine is plain Python in this process: its ``print`` goes to its task's output,
:func:`publish` sends progress to the live view (as ``kit.train.progress.publish`` does on an engine) and
:func:`sleep` sleeps until the engine ends (then the thread leaves: :class:`EngineGone`), :func:`task` names it.
"""

from __future__ import annotations

import io
import itertools
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from ipyparallel.error import RemoteError

from kit.core import tfconfig
from kit.core.backend import Backend
from kit.core.engines import Engines
from kit.core.errors import ClusterError
from kit.core.group import TaskGroup, TaskRecord
from kit.core.options import ClusterOptions, RunOptions, TaskInfo
from kit.core.runs import Run
from kit.core.view import KEY

_here = threading.local()  #: the call a thread runs for (None in the test's own thread)
#: The longest a result's ``get`` waits, and a closing engine waits for its threads.
WAIT_SECONDS = 30.0


class EngineGone(BaseException):
    """Raised in a fake engine's thread by :func:`sleep` once its engine ended: the thread leaves, nothing replies."""


def task() -> str:
    """On a fake engine: the name of its task (``worker:1``), as ``KIT_TASK`` says on a real one."""
    return _here.call.engine.name


def publish(**fields: Any) -> None:
    """On a fake engine: progress fields for the live view (its newest value per key, as ipyparallel keeps it)."""
    _here.call.metadata["data"].setdefault(KEY, {}).update(fields)


def sleep(seconds: float) -> None:
    """On a fake engine: sleep ``seconds``, or until the engine ends (then :class:`EngineGone`)."""
    if _here.call.engine.ended.wait(seconds):
        raise EngineGone(_here.call.engine.name)


class _Output(io.TextIOBase):
    """sys.stdout or sys.stderr while fake engines exist: a fake engine's thread writes to its call's output."""

    def __init__(self, name: str, original: Any):
        self.name, self.original = name, original

    def write(self, text: str) -> int:
        call = getattr(_here, "call", None)
        if call is None:
            return self.original.write(text)
        call.output[self.name] += text
        return len(text)

    def flush(self) -> None:
        self.original.flush()


class _Engine:
    def __init__(self, engine_id: int, name: str):
        self.id, self.name = engine_id, name
        self.ended = threading.Event()


class _Call:
    """One engine's part of an ``apply_async``: run in its own thread."""

    ids = itertools.count()

    def __init__(self, engine: _Engine, fn: Callable, args: tuple, kwargs: dict):
        self.engine, self.msg_id = engine, f"fake-{next(self.ids)}"
        self.metadata: dict[str, Any] = {"status": None, "error": None, "data": {}, "received": None,
                                         "completed": None, "engine_id": engine.id}
        self.output = {"stdout": "", "stderr": ""}
        self.value: Any = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True, name=self.msg_id)
        self.thread.start()

    def _run(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        _here.call = self
        try:
            value, status, error = fn(*args, **kwargs), "ok", None
        except EngineGone:
            return  # a killed process sends nothing
        except BaseException as caught:  # what the engine sends back: the error as an ipyparallel RemoteError
            value = error = RemoteError(type(caught).__name__, str(caught), traceback.format_exc())
            status = "error"
        if self.engine.ended.is_set():
            return
        self.value = value
        self.metadata.update(status=status, error=error, completed=time.time())
        self.done.set()


class FakeResult:
    """What a run reads of ipyparallel's AsyncResult, for calls on fake engines (in task order)."""

    def __init__(self, calls: list[_Call]):
        self.calls = calls
        self.msg_ids = [c.msg_id for c in calls]

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        return all(c.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for c in self.calls)

    def ready(self) -> bool:
        return all(c.done.is_set() for c in self.calls)

    def wait_for_output(self, timeout: float | None = None) -> bool:
        return True  # the output is written before the reply

    @property
    def metadata(self) -> list[dict]:
        return [c.metadata for c in self.calls]

    @property
    def stdout(self) -> list[str]:
        return [c.output["stdout"] for c in self.calls]

    @property
    def stderr(self) -> list[str]:
        return [c.output["stderr"] for c in self.calls]

    def get(self, return_exceptions: bool = False, timeout: float = WAIT_SECONDS) -> list:
        if not self.wait(timeout):
            late = [c.engine.name for c in self.calls if not c.done.is_set()]
            raise TimeoutError(f"no reply from {', '.join(late)} within {timeout:g} s (a fake engine's call)")
        values = [c.value for c in self.calls]
        failed = [v for v in values if isinstance(v, RemoteError)]
        if failed and not return_exceptions:
            raise failed[0]
        return values

    def split(self) -> list["FakeResult"]:
        return [FakeResult([c]) for c in self.calls]


class _View:
    def __init__(self, fakes: "FakeEngines", ids: list[int]):
        self.fakes, self.ids = fakes, ids

    def apply_async(self, fn: Callable, *args: Any, **kwargs: Any) -> FakeResult:
        self.fakes.route_output()
        calls = [_Call(self.fakes.engine(i), fn, args, kwargs) for i in self.ids]
        self.fakes.calls.extend(calls)
        return FakeResult(calls)

    def wait(self, msg_ids: list[str], timeout: float | None = None) -> bool:
        return FakeResult([c for c in self.fakes.calls if c.msg_id in msg_ids]).wait(timeout)


class _Client:
    def __init__(self, fakes: "FakeEngines"):
        self.fakes = fakes

    def __getitem__(self, ids: int | list[int]) -> _View:
        return _View(self.fakes, ids if isinstance(ids, list) else [ids])


class FakeEngines(Engines):
    """One in-process engine per task (see the module's docstring); ``started`` counts the engines ever made."""

    def __init__(self) -> None:
        self.client = _Client(self)
        self.engines: dict[int, _Engine] = {}   #: engine id → engine, the ended ones too
        self.current: dict[str, _Engine] = {}   #: task name → its engine of the moment
        self.calls: list[_Call] = []
        self._ids = itertools.count()

    def route_output(self) -> None:
        """A fake engine's prints go to its call's output: sys.stdout and sys.stderr as they are now, wrapped (at
        each run: pytest's capture may have replaced them since)."""
        if not isinstance(sys.stdout, _Output):
            sys.stdout = _Output("stdout", sys.stdout)
        if not isinstance(sys.stderr, _Output):
            sys.stderr = _Output("stderr", sys.stderr)

    def engine(self, engine_id: int) -> _Engine:
        return self.engines[engine_id]

    def start(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        reports = {}
        for name in names:
            engine = _Engine(next(self._ids), name)
            self.engines[engine.id] = self.current[name] = engine
            reports[name] = {"engine_id": engine.id, "pid": os.getpid(), "hostname": "fake", "interfaces": []}
        return reports

    def replace(self, names: list[str], environments: dict[str, dict[str, str]]) -> dict[str, dict]:
        for engine in self.current.values():
            engine.ended.set()
        return self.start(names, environments)

    def signal(self, name: str, engine_id: int, sig: int) -> None:
        self.engines[engine_id].ended.set()  # any signal ends a fake engine

    def alive(self, name: str) -> bool:
        return not self.current[name].ended.is_set()

    def task_host(self, report: dict) -> str:
        return "127.0.0.1"

    def close(self) -> None:
        """End every engine and wait for their threads: a function that does not leave (it blocks without
        :func:`sleep`) fails the test that ran it."""
        for engine in self.engines.values():
            engine.ended.set()
        deadline = time.monotonic() + WAIT_SECONDS
        for call in self.calls:
            call.thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [f"{c.engine.name} ({c.msg_id})" for c in self.calls if c.thread.is_alive()]
        if isinstance(sys.stdout, _Output):
            sys.stdout = sys.stdout.original
        if isinstance(sys.stderr, _Output):
            sys.stderr = sys.stderr.original
        if stuck:
            raise AssertionError(f"calls still running {WAIT_SECONDS:g} s after their engines ended: {', '.join(stuck)}"
                                 " (sleep with fakes.sleep, which leaves when the engine ends)")


class FakeCluster:
    """``workers`` tasks on :class:`FakeEngines`, with what a run uses of a TFCluster (``kit.core.runs.Cluster``)."""

    def __init__(self, workers: int = 2, **options: Any):
        self.options = ClusterOptions(workers=workers, view="text", **options)
        self.backend = Backend()
        self.failures: list = []
        self.output: dict[str, str] = {}
        self.last_view = None
        self.engines = FakeEngines()
        self.task_names = [tfconfig.task_name("worker", i) for i in range(workers)]
        self.stale: tuple[str, list[str]] | None = None
        self.starts = 0  #: how many times the engines were started (the first start, then each restart)
        self._group: TaskGroup | None = None

    def __enter__(self) -> "FakeCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.engines.close()

    @property
    def started(self) -> bool:
        return self._group is not None

    @property
    def tasks(self) -> list[TaskInfo]:
        return [self._group.info(n) for n in self._group.names]

    def task_group(self, ready: bool = True) -> TaskGroup:
        if self._group is None or (ready and self.stale):
            reason, tasks = self.stale or ("the cluster is not running", [])
            raise ClusterError(reason, tasks, fix="call cluster.restart() for fresh engines")
        return self._group

    def start(self) -> "FakeCluster":
        return self._ready(self.engines.start(self.task_names, {}))

    def restart(self) -> "FakeCluster":
        return self._ready(self.engines.replace(self.task_names, {}))

    def _ready(self, reports: dict[str, dict]) -> "FakeCluster":
        from kit.core.limits import OomWatch

        self.starts += 1
        self.stale = None
        records = {}
        for index, name in enumerate(self.task_names):
            info = TaskInfo(name=name, type="worker", index=index, address=f"127.0.0.1:{2222 + index}",
                            engine_id=reports[name]["engine_id"], pid=os.getpid(), host="fake", keras="tf-keras")
            records[name] = TaskRecord(info, {}, self.engines.client[info.engine_id])
        self._group = TaskGroup(records, self.engines, OomWatch(len(records)), self._mark_stale)
        return self

    def _mark_stale(self, reason: str, tasks: list[str]) -> None:
        self.stale = (reason, tasks)

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        return Run(self).run(fn, *args, **kwargs)

    def with_options(self, **options: Any) -> Run:
        return Run(self, RunOptions().updated(**options))

    def kill(self, task: str) -> None:
        info = self._group.info(task)
        self.engines.signal(task, info.engine_id, 9)
