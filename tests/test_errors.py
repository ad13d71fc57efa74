"""kit.core.errors: every error the kit raises says how to fix it; one first-line helper; one task name."""

from __future__ import annotations

import inspect

import pytest

from kit.core import errors, files, tfconfig
from kit.core.errors import (ClusterError, FailuresExhaustedError, GridError, KitError, OptionError, TFConfigError,
                             WorkerError, first_line)


def kit_error_classes() -> list[type[KitError]]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, KitError)]


def test_every_kit_error_class_has_a_fix():
    classes = kit_error_classes()
    assert {KitError, TFConfigError, ClusterError, OptionError, WorkerError, FailuresExhaustedError,
            GridError} <= set(classes)
    for cls in classes:
        assert isinstance(cls.fix, str) and cls.fix.strip(), cls
        if cls is not KitError:
            assert "fix" in vars(cls), f"{cls.__name__} inherits KitError's general fix instead of its own"


def test_fix_given_ends_the_message_and_is_kept():
    for error in (OptionError("steps", "-1 is negative", "give 1 or more"),
                  TFConfigError("task.index", "index -1 is negative", "task indices start at 0"),
                  GridError("lr", "is not a parameter", "add it to the parameters cell"),
                  KitError("the run broke", fix="run it again"),
                  ClusterError("no engines", ["worker:0"], fix="start them")):
        assert str(error).endswith(f"Fix: {error.fix}") and error.fix != type(error).fix


def test_fix_is_read_from_a_message_that_gives_one():
    error = KitError("MNIST not found at /x. Fix: pass path= to an mnist.npz")
    assert error.fix == "pass path= to an mnist.npz"
    assert str(error) == "MNIST not found at /x. Fix: pass path= to an mnist.npz"


def test_errors_without_their_own_fix_fall_back_to_the_class_advice():
    assert ClusterError("boom", ["worker:0"]).fix == ClusterError.fix
    # a task's own error may name a fix for the task's code; the WorkerError's fix is the class's
    failed = WorkerError("worker:1", "KitError: bad. Fix: give n=2", "Traceback ...")
    assert failed.fix == WorkerError.fix and failed.task == "worker:1"


def test_failures_exhausted_ends_with_its_fix():
    class Failure:
        attempt, task, error = 1, "worker:0", "ValueError: x"

    error = FailuresExhaustedError("train", [Failure(), Failure()])
    assert str(error).endswith(f"Fix: {FailuresExhaustedError.fix}") and error.fix == FailuresExhaustedError.fix
    with_logs = FailuresExhaustedError("train", [Failure(), Failure()], "\n--- last lines of worker:0's log ---\nL")
    assert "worker:0's log ---\nL\nFix:" in str(with_logs)


def test_first_line_drops_tensorflow_prefixes_and_frames():
    class FakeOpError(Exception):
        message = "{{function_node __wrapped__X}} Could not apply FILE based sharding\nmore"

    assert first_line(FakeOpError()) == "FakeOpError: Could not apply FILE based sharding"
    traced = AttributeError("in user code:\n\n    File \"x.py\", line 3\n\n    AttributeError: no read_value\n")
    assert first_line(traced) == "AttributeError: no read_value"
    assert first_line("one\ntwo") == "one" and first_line("") == ""
    assert first_line(RuntimeError("x" * 50), 10) == "RuntimeError"[:9] + "…"


def test_this_task_reads_kit_task_or_says_local(monkeypatch):
    monkeypatch.delenv(tfconfig.TASK_VARIABLE, raising=False)
    assert tfconfig.this_task() == "local"
    monkeypatch.setenv(tfconfig.TASK_VARIABLE, "worker:1")
    assert tfconfig.this_task() == "worker:1"


def test_write_atomic_replaces_the_whole_file(tmp_path):
    target = files.write_atomic(tmp_path / "sub" / "results.json", "first")
    assert target.read_text() == "first"
    files.write_atomic(target, "second")
    assert target.read_text() == "second" and sorted(p.name for p in target.parent.iterdir()) == ["results.json"]


def test_save_figure_creates_the_folder_or_saves_nothing(tmp_path):
    class Figure:
        saved: list = []

        def savefig(self, path, **options):
            self.saved.append((str(path), options))

    fig = Figure()
    assert files.save_figure(fig, None) is fig and fig.saved == []
    files.save_figure(fig, tmp_path / "new" / "a.png", bbox_inches="tight")
    assert (tmp_path / "new").is_dir()
    assert fig.saved == [(str(tmp_path / "new" / "a.png"), {"dpi": files.FIGURE_DPI, "bbox_inches": "tight"})]


@pytest.mark.parametrize("name", ["mirored", "parameter_server", ""])
def test_an_unknown_strategy_name_is_an_option_error(name):
    from kit.train.strategies import BUILT_HERE, build_strategy

    with pytest.raises(OptionError) as refused:
        build_strategy(name)
    assert refused.value.field == "strategy" and all(s in refused.value.fix for s in BUILT_HERE)


def test_a_task_whose_engine_died_is_named_before_the_peer_that_failed_for_it():
    """kit.core.runs.collect: worker:0's error came first in time, but worker:1's engine died (Horovod's
    all-reduce fails at once on the survivor): the run names worker:1, and keeps both errors."""
    from types import SimpleNamespace

    from kit.core.runs import collect

    def remote(ename, evalue):
        error = Exception(evalue)
        error.ename, error.evalue, error.traceback = ename, evalue, ""
        return error

    result = SimpleNamespace(
        get=lambda return_exceptions: [remote("HorovodInternalError", "Horovod has been shut down"),
                                       remote("EngineError", "Engine 1 died")],
        metadata=[{"completed": "2026-11-25T10:00:01"}, {"completed": "2026-11-25T10:00:02"}])
    with pytest.raises(WorkerError) as info:
        collect(result, ["worker:0", "worker:1"], lambda: "")
    assert info.value.task == "worker:1" and "EngineError" in info.value.error
    assert set(info.value.failures) == {"worker:0", "worker:1"}


def test_a_lost_task_reports_the_survivors_error_that_trails_its_reply():
    """ipyparallel brings a reply's status (shell channel) and its error (IOPub) on two sockets; under load the error
    came after the status, and the run reported the survivor as "error:" with nothing (notebook 12's kill check failed).
    The run now waits, within the grace, for each survivor's output to end before it reads the error."""
    from types import SimpleNamespace

    from kit.core.runs import Run

    metadata = [{"status": None, "error": None}, {"status": "error", "error": None}]  # worker:0 lost; 1's error trails
    gloo = SimpleNamespace(ename="ValueError", evalue="Gloo AllGather failed: Connection reset by peer")

    class Part:
        def __init__(self, msg_id):
            self.msg_ids = [msg_id]

        def wait_for_output(self, timeout):
            assert 0 < timeout <= 10, timeout
            if self.msg_ids == ["m1"]:
                metadata[1]["error"] = gloo  # the IOPub message arrives

    result = SimpleNamespace(msg_ids=["m0", "m1"], metadata=metadata, split=lambda: (Part("m0"), Part("m1")))
    group = SimpleNamespace(mark_stale=lambda *a: None, explain_exit=lambda: "", log_tail=lambda name: "")
    engines = SimpleNamespace(wait=lambda ids, timeout: True)
    quiet = SimpleNamespace(update=lambda r: None, fail=lambda *a: None, follow=lambda *a: None)
    with pytest.raises(WorkerError) as raised:
        Run._lost(["worker:0"], group, engines, result, ["worker:0", "worker:1"], "train", quiet, quiet)
    assert raised.value.failures == {"worker:0": "process exited",
                                     "worker:1": "ValueError: Gloo AllGather failed: Connection reset by peer"}
