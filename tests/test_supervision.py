"""A run's loop on in-process engines (tests/fakes.py): results, failures, time-outs, lost tasks, supervised
restarts and the live view, each in well under a second. The same with real processes, where the process is the
point: tests/test_cluster.py (a killed engine, start-up), tests/test_resilience.py (TensorFlow's recovery)."""

from __future__ import annotations

import logging
import threading

import pytest

import fakes
from fakes import FakeCluster
from kit.core import runs
from kit.core.errors import ClusterError, FailuresExhaustedError, WorkerError


@pytest.fixture
def cluster():
    with FakeCluster(workers=2) as started:
        yield started


def test_results_come_in_task_order_with_every_argument(cluster):
    def add(a, b=0):
        return f"{fakes.task()}: {a + b}"

    assert cluster.run(add, 1, b=2) == ["worker:0: 3", "worker:1: 3"]
    assert cluster.with_options(tasks=["worker:1"]).run(add, 5) == ["worker:1: 5"]
    assert cluster.last_view.states() == {"worker:1": "done"}


def test_an_exception_names_its_task_with_the_remote_traceback(cluster):
    def fails_on_worker_1():
        if fakes.task() == "worker:1":
            raise ValueError("bad value on purpose")
        return "ok"

    with pytest.raises(WorkerError) as info:
        cluster.run(fails_on_worker_1)
    error = info.value
    assert error.task == "worker:1" and error.failures == {"worker:1": "ValueError: bad value on purpose"}
    assert "fails_on_worker_1" in error.remote_traceback and "bad value on purpose" in str(error)
    assert cluster.last_view.states() == {"worker:0": "done", "worker:1": "failed"}
    assert cluster.run(fakes.task) == ["worker:0", "worker:1"]  # still usable: a failed function is not a lost task


def test_output_is_streamed_with_the_task_name_and_kept(cluster, capsys):
    import sys

    def chatty():
        print(f"hello from {fakes.task()}")
        print("progress\rdone", file=sys.stderr)

    cluster.run(chatty)
    shown = capsys.readouterr()
    assert "[worker:0] hello from worker:0" in shown.out and "[worker:1] hello from worker:1" in shown.out
    assert "[worker:1] done" in shown.err and "progress" not in shown.err  # a redrawn line: its last state
    assert cluster.output == {"worker:0": "hello from worker:0\ndone", "worker:1": "hello from worker:1\ndone"}
    cluster.with_options(stream=False).run(chatty)
    assert "hello" not in capsys.readouterr().out


def test_progress_published_on_a_task_reaches_the_live_view(cluster):
    def trains():
        fakes.publish(epoch=1, epochs=2, step=5, steps=10, loss=0.5)
        fakes.publish(step=10, examples_per_second=1234.0)  # fields accumulate
        return "trained"

    cluster.with_options(stream=False).run(trains)
    rows = cluster.last_view.rows
    assert rows["worker:1"].progress == {"epoch": 1, "epochs": 2, "step": 10, "steps": 10, "loss": 0.5,
                                         "examples_per_second": 1234.0}
    assert cluster.last_view.measurements()["worker:0"]["examples_per_second"] == 1234.0


def test_a_time_out_names_the_task_still_running_and_leaves_the_cluster_stale(cluster):
    """worker:1 returns, worker:0 waits (as for a collective its peer never joins): the error names worker:0 and
    says why; the next run is refused until a restart."""
    def waits_on_worker_0():
        if fakes.task() == "worker:0":
            fakes.sleep(60)
        return "left"

    with pytest.raises(ClusterError, match=r"timed out after 0.5s: worker:0 still running; worker:1 finished, "
                                           r"so it is probably waiting in a collective") as caught:
        cluster.with_options(timeout=0.5).run(waits_on_worker_0)
    assert caught.value.tasks == ["worker:0"] and "cluster.restart()" in caught.value.fix
    assert cluster.last_view.states() == {"worker:0": "failed", "worker:1": "done"}
    with pytest.raises(ClusterError, match="a run of waits_on_worker_0 timed out") as stale:
        cluster.run(fakes.task)
    assert stale.value.tasks == ["worker:0"]
    cluster.restart()
    assert cluster.run(fakes.task) == ["worker:0", "worker:1"]


def test_a_failed_task_gives_its_waiting_peers_a_grace_then_the_run_stops(cluster, monkeypatch):
    monkeypatch.setattr(runs, "FAILED_PEERS_GRACE_SECONDS", 0.3)

    def fails_while_its_peer_waits():
        if fakes.task() == "worker:1":
            raise RuntimeError("collective failed")
        fakes.sleep(60)

    with pytest.raises(WorkerError) as info:
        cluster.run(fails_while_its_peer_waits)
    assert info.value.task == "worker:1"
    assert cluster.stale == ("worker:0 still running fails_while_its_peer_waits after another task failed",
                             ["worker:0"])
    assert "still running 0.3 s after another task failed" in cluster.last_view.rows["worker:0"].note


def test_a_task_lost_during_a_run_is_named_and_its_peers_errors_kept(cluster, monkeypatch):
    monkeypatch.setattr(runs, "LOST_PEERS_GRACE_SECONDS", 2.0)

    def peer_fails_once_the_other_is_gone():
        if fakes.task() == "worker:1":
            fakes.sleep(60)
        while cluster.engines.alive("worker:1"):
            fakes.sleep(0.01)
        raise ConnectionError("peer worker:1 is gone")

    killer = threading.Timer(0.2, cluster.kill, args=("worker:1",))
    killer.start()
    with pytest.raises(WorkerError) as info:
        cluster.run(peer_fails_once_the_other_is_gone)
    killer.join()
    assert info.value.task == "worker:1" and "its engine process exited" in info.value.error
    assert info.value.failures == {"worker:1": "process exited", "worker:0": "ConnectionError: peer worker:1 is gone"}
    assert cluster.stale == ("the cluster lost worker:1", ["worker:1"])


def test_a_task_lost_between_runs_is_named_before_the_next_run(cluster):
    cluster.kill("worker:1")
    with pytest.raises(ClusterError, match=r"worker:1: the engine process is gone.*cluster.restart\(\)") as info:
        cluster.run(fakes.task)
    assert info.value.tasks == ["worker:1"]
    cluster.restart()
    assert cluster.run(fakes.task) == ["worker:0", "worker:1"]


def test_a_supervised_run_restarts_every_task_and_says_so_once_in_the_view_and_the_log(cluster, caplog, capsys):
    attempts = []
    restarts = []

    def fails_once():
        if fakes.task() == "worker:0":
            attempts.append(1)
            if len(attempts) == 1:
                raise ValueError("first attempt fails on purpose")
        return fakes.task()

    first = [t.engine_id for t in cluster.tasks]
    with caplog.at_level(logging.INFO, logger="kit"):
        result = cluster.with_options(max_failures=2, stream=False, on_restart=restarts.append).run(fails_once)
    assert result == ["worker:0", "worker:1"] and cluster.starts == 2 and restarts == [cluster]
    assert not set(first) & {t.engine_id for t in cluster.tasks}  # every task on a fresh engine
    logged = [r.getMessage() for r in caplog.records if r.name == "kit.core.view"]
    shown = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[kit] ")]
    assert len(logged) == len(shown) == 3, (logged, shown)
    assert "attempt 1: worker:0 failed:" in logged[0] and "ValueError: first attempt fails on purpose" in logged[0]
    assert [line.removeprefix("[kit] ") for line in shown] == [m.partition(": ")[2] for m in logged]
    assert "restarting all 2 tasks" in logged[1] and "running fails_once again" in logged[2]
    assert [f.task for f in cluster.failures] == ["worker:0"] and cluster.failures[0].restarted_at


def test_a_supervised_run_gives_up_after_its_restarts_with_every_failure(cluster):
    def always_fails():
        if fakes.task() == "worker:0":
            raise ValueError("worker:0 fails")

    with pytest.raises(FailuresExhaustedError) as info:
        cluster.with_options(max_failures=2, stream=False).run(always_fails)
    assert [f.attempt for f in info.value.failures] == [1, 2, 3] and cluster.starts == 3
    assert all(f.task == "worker:0" and "ValueError: worker:0 fails" in f.error for f in info.value.failures)
    assert "always_fails" in str(info.value)


def test_a_lost_task_under_supervision_is_replaced_and_the_run_completes(cluster):
    killed = []

    def killed_once():
        if fakes.task() == "worker:1" and not killed:
            killed.append(1)
            threading.Thread(target=cluster.kill, args=("worker:1",)).start()
            fakes.sleep(60)
        return fakes.task()

    assert cluster.with_options(max_failures=1, stream=False).run(killed_once) == ["worker:0", "worker:1"]
    assert [(f.task, f.error) for f in cluster.failures] == \
        [("worker:1", "task worker:1 failed: its engine process exited while running killed_once")]
