"""Fault tolerance for real: killed workers, supervised restarts, resumed training, preemption.

The training is the lessons' own (notebook 05's ``train`` and ``train_preemptible``, notebook 07's pieces, from
their cells tagged ``lesson``); the journal and the faults go in as callbacks (kit.tools.fault_trials.run_lesson).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import kit
from conftest import broken_startup
from kit.tools.cells import lesson
from kit.tools.fault_trials import run_lesson
from kit.train import resilience, watch
from kit.core.errors import FailuresExhaustedError

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # train_parameter_server: the engines cannot import tests/


# ----- the journal, without TensorFlow -------------------------------------------------------------
def write_records(run_dir, task, records):
    journal = resilience.Journal(run_dir, task=task)
    for event, fields in records:
        journal.write(event, **fields)
    return journal


def test_journal_counts_attempts_and_summarize_finds_redone_steps(tmp_path):
    write_records(tmp_path, "worker:0", [("start", {"initial_step": 0})] +
                  [("step", {"global_step": s, "loss": 1.0}) for s in range(1, 6)] +
                  [("epoch_end", {"epoch": 0, "loss": 1.0, "global_step": 5})])
    second = resilience.Journal(tmp_path, task="worker:0")
    assert second.attempt == 2
    for event, fields in [("start", {"initial_step": 3})] + \
            [("step", {"global_step": s, "loss": 0.5}) for s in range(4, 11)] + \
            [("epoch_end", {"epoch": 0, "loss": 0.5, "global_step": 5}),
             ("epoch_end", {"epoch": 1, "loss": 0.5, "global_step": 10}), ("end", {"global_step": 10})]:
        second.write(event, **fields)
    summary = resilience.summarize(tmp_path, "worker:0")
    assert summary["attempts"] == 2 and summary["completed"]
    assert summary["steps_redone"] == 2 and summary["distinct_steps"] == 10  # steps 4 and 5 twice
    assert summary["final_epochs"] == [0, 1]
    (resume,) = summary["resumes"]
    assert (resume["last_step_before"], resume["first_step_after"], resume["initial_step"]) == (5, 4, 3)


def test_fire_once_survives_restarts(tmp_path):
    assert resilience.fire_once(tmp_path, "kill-worker:1-30")
    assert not resilience.fire_once(tmp_path, "kill-worker:1-30")
    assert resilience.fire_once(tmp_path, "kill-worker:1-31")


def test_kill_waits_for_the_chief_s_journal_and_names_it_when_it_never_comes(tmp_path):
    resilience.Journal(tmp_path, task="worker:0").write("step", global_step=29, loss=1.0)
    with pytest.raises(TimeoutError, match="worker:0 did not reach step 30"):
        resilience.wait_for_step(tmp_path, "worker:0", 30, timeout=0.3)
    resilience.Journal(tmp_path, task="worker:0").write("step", global_step=30, loss=1.0)
    assert resilience.wait_for_step(tmp_path, "worker:0", 30, timeout=5)["global_step"] == 30


def test_wait_for_event_returns_the_first_record_of_that_event_or_names_what_is_missing(tmp_path):
    journal = resilience.Journal(tmp_path, task="worker:0")
    journal.write("step", global_step=1, loss=1.0)
    with pytest.raises(TimeoutError, match="worker:0's journal has no 'error' record"):
        resilience.wait_for_event(tmp_path, "worker:0", "error", timeout=0.3)
    journal.write("error", error="UnavailableError")
    journal.write("error", error="AbortedError")
    assert resilience.wait_for_event(tmp_path, "worker:0", "error", timeout=5)["error"] == "UnavailableError"


# ----- real failures ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("layout, victim", [({"workers": 2}, "worker:1"),
                                            ({"workers": 1, "chief": True}, "chief:0")])
def test_killed_task_restarts_and_resumes_without_losing_steps(make_cluster, tmp_path, layout, victim):
    cluster = make_cluster(**layout)
    results = run_lesson(cluster.with_options(max_failures=2), tmp_path, epochs=4, steps_per_epoch=20,
                         save_freq=10, kill_task=victim, kill_at_step=30)
    assert [f.task for f in cluster.failures] == [victim]
    assert all(r["global_step"] == 80 for r in results)
    # the live view followed the restart: every task restarted once, and finished
    assert [(row.state, row.restarts) for row in cluster.last_view.rows.values()] == [("done", 1)] * len(results)
    assert all(row.progress["epoch"] == 4 and row.progress["step"] == 20 for row in cluster.last_view.rows.values())
    for task in cluster.task_names:
        summary = resilience.summarize(tmp_path, task)
        assert summary["attempts"] == 2 and summary["completed"] and summary["final_epochs"] == [0, 1, 2, 3]
        # a backup every 10 steps, killed once the chief has journaled step 30 (its backup is on disk)
        assert summary["steps_redone"] == 0, summary
        (resume,) = summary["resumes"]
        assert (resume["last_step_before"], resume["first_step_after"]) == (30, 31), summary
    losses = [r["loss"] for r in results]
    assert all(loss == pytest.approx(losses[0], rel=1e-5) for loss in losses)
    assert not list((tmp_path / "backup").rglob("*")), "BackupAndRestore leaves its folder empty after a finished run"


@pytest.mark.slow
def test_epoch_backups_redo_the_interrupted_epoch_only(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    results = run_lesson(cluster.with_options(max_failures=1), tmp_path, epochs=3, steps_per_epoch=10,
                         save_freq="epoch", kill_task="worker:1", kill_at_step=15)
    assert results[0]["epochs_run"] == [1, 2]  # epoch 0 was backed up, epoch 1 starts over
    summary = resilience.summarize(tmp_path, "worker:0")
    assert summary["steps_redone"] == 5 and summary["final_epochs"] == [0, 1, 2]


@pytest.mark.slow
def test_sigterm_makes_all_workers_save_at_the_same_step(make_cluster, tmp_path):
    """Notebook 05's ``train_preemptible``: worker:1 sends itself a SIGTERM after step 12 (a callback, once)."""
    cluster = make_cluster(workers=2)
    callbacks = [kit.OnTask(watch.watcher, str(tmp_path), 128),
                 kit.OnTask(resilience.kill_at_step_callback, str(tmp_path), "worker:1", 12, signal.SIGTERM)]
    results = cluster.with_options(max_failures=1).run(lesson("05-fault-tolerance")["train_preemptible"], str(tmp_path / "checkpoints"),
        30, 64, 8192, 0.01, str(kit.train.data.mnist_path()), 42, callbacks=callbacks)
    (failure,) = cluster.failures
    assert "preempted: every worker saved" in failure.error
    assert all(r["global_step"] == 30 == r["iterations"] for r in results)
    resumes = {task: resilience.summarize(tmp_path, task)["resumes"] for task in cluster.task_names}
    saved = {resume["last_step_before"] for (resume,) in resumes.values()}
    assert len(saved) == 1 and min(saved) >= 12, resumes  # every worker saved at one step, at or after the SIGTERM
    for task, (resume,) in resumes.items():
        assert resume["first_step_after"] == resume["last_step_before"] + 1 == resume["initial_step"] + 1, resume
        summary = resilience.summarize(tmp_path, task)
        assert summary["steps_redone"] == 0 and summary["distinct_steps"] == 30, summary
    assert sorted(os.listdir(tmp_path / "checkpoints"))  # the chief's checkpoint is there


@pytest.mark.slow
def test_a_task_that_never_comes_back_exhausts_max_failures(make_cluster, tmp_path, monkeypatch):
    """After the first kill, worker:1 cannot start any more: a clear error, no hang, no leftovers."""
    broken_startup(tmp_path / "site", monkeypatch,
                   f"import os\nif os.path.exists({str(tmp_path / 'run' / 'faults')!r}):\n    os._exit(9)\n")
    cluster = make_cluster(workers=2, start_timeout=30)
    start = time.monotonic()
    with pytest.raises(FailuresExhaustedError) as info:
        run_lesson(cluster.with_options(max_failures=2), tmp_path / "run", epochs=2, steps_per_epoch=5,
                   kill_task="worker:1", kill_at_step=3)
    failures = info.value.failures
    assert len(failures) == 3 and failures[0].task == "worker:1"
    assert all("restart failed" in f.error and f.task == "worker:1" for f in failures[1:])
    assert "worker:1" in str(info.value) and "max_failures" in str(info.value)
    assert time.monotonic() - start < 120


@pytest.mark.slow
def test_a_run_that_gives_up_shows_every_task_s_engine_log(make_cluster):
    """A live peer's C++ stderr (e.g. its gRPC server refusing a request) is in the error, not only the
    failed task's."""
    cluster = make_cluster(workers=2)

    def fail_on_worker_1():
        import os
        os.write(2, f"stderr line of {os.environ['KIT_TASK']}\n".encode())  # as TensorFlow's C++ logs write
        if os.environ["KIT_TASK"] == "worker:1":
            raise ValueError("failing on purpose")

    with pytest.raises(FailuresExhaustedError) as info:
        cluster.with_options(max_failures=1).run(fail_on_worker_1)
    assert "last lines of worker:0's engine log" in str(info.value)
    assert "stderr line of worker:0" in str(info.value)  # the live peer's last line


# ----- ParameterServerStrategy: notebook 07's lesson -----------------------------------------------
PS_SERVERS = ["worker:0", "worker:1", "ps:0"]
PS_TRAINING = dict(per_worker_batch=32, examples=2048, learning_rate=0.05, max_shards=2, min_shard_bytes=256 << 10)


#: The functions of notebook 07's lesson that train_parameter_server builds its loop from.
PS_LESSON_FUNCTIONS = ("load_mnist", "make_strategy", "build_and_compile_cnn_model", "make_dataset_fn", "make_step_fn")


def train_parameter_server(run_dir: str, lesson: dict[str, Any], steps: int = 40, per_worker_batch: int = 32,
                           checkpoint_every: int = 10, kill_pid: int | None = None,
                           kill_after_step: int | None = None, learning_rate: float = 0.05, examples: int = 2048,
                           max_shards: int = 2, min_shard_bytes: int = 256 << 10,
                           mnist_path: str | None = None) -> dict[str, Any]:
    """On the chief: notebook 07's model, data and step (``lesson``: its functions PS_LESSON_FUNCTIONS),
    scheduled ``steps`` times in chunks of ``checkpoint_every``, with a checkpoint after each chunk, resuming
    from the latest checkpoint when called again. The lesson has no such resume (its exercise 3 loses the ps
    and stops there); this loop is the test's, for the supervised restart after a lost ps
    (``cluster.with_options(max_failures=1, on_restart=start_servers).run(...)``).

    ``kill_pid``/``kill_after_step`` SIGKILL one process of this machine (e.g. the ps) once, while the chunk
    holding that step runs: ``join`` then raises, and the supervised run calls this again.
    """
    from kit.core.tfconfig import this_task
    from kit.train._tf import import_tensorflow
    from kit.train.resilience import Journal, fire_once

    tf = import_tensorflow()
    journal = Journal(run_dir)
    strategy = lesson["make_strategy"](max_shards, min_shard_bytes)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    (x_train, y_train), _ = lesson["load_mnist"](mnist_path)
    with strategy.scope():
        model = lesson["build_and_compile_cnn_model"](learning_rate)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(Path(run_dir) / "ps-checkpoints"), max_to_keep=2)
    manager.restore_or_initialize()
    first = int(model.optimizer.iterations.numpy())
    journal.write("start", initial_step=first)
    dataset_fn = lesson["make_dataset_fn"](x_train[:examples], y_train[:examples], per_worker_batch)
    per_worker_dataset_fn = tf.function(lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
    step_fn = lesson["make_step_fn"](strategy, model)
    scheduled = first
    while scheduled < steps:
        chunk = min(checkpoint_every, steps - scheduled)
        remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(chunk)]
        if (kill_pid is not None and kill_after_step is not None
                and scheduled < kill_after_step <= scheduled + chunk
                and fire_once(run_dir, f"kill-pid-{kill_pid}")):
            remotes[kill_after_step - scheduled - 1].fetch()  # that step has run: kill now
            journal.write("kill", global_step=kill_after_step, pid=kill_pid)
            os.kill(kill_pid, signal.SIGKILL)
        coordinator.join()
        for n, remote in enumerate(remotes, start=scheduled + 1):
            journal.write("step", global_step=n, loss=float(remote.fetch()))
        scheduled += chunk
        manager.save(checkpoint_number=scheduled)
    journal.write("end", global_step=int(model.optimizer.iterations.numpy()))
    return {"task": this_task(), "attempt": journal.attempt, "first_step": first,
            "scheduled": scheduled, "model_version": int(model.optimizer.iterations.numpy())}


def start_ps_servers(cluster):
    from kit.train import ps
    cluster.with_options(tasks=PS_SERVERS, stream=False).run(ps.serve, lesson("07-parameter-server")["start_server"])


@pytest.mark.slow
def test_ps_a_lost_worker_s_functions_are_rescheduled(make_cluster, tmp_path):
    """Notebook 07's ``train``: worker:1 is SIGKILLed once the chief journaled the first epoch; the rest go on."""
    import psutil

    cluster = make_cluster(chief=True, workers=2, ps=1)
    start_ps_servers(cluster)
    victim = {t.name: t.pid for t in cluster.tasks}["worker:1"]
    killer = watch.kill_after_step(cluster, "worker:1", tmp_path, 10)
    (result,) = cluster.with_options(tasks=["chief:0"]).run(
        lesson("07-parameter-server")["train"], epochs=4, steps_per_epoch=10, eval_steps=4,
        mnist_path=str(kit.train.data.mnist_path()), callbacks=[kit.OnTask(watch.watcher, str(tmp_path), 32)],
        **PS_TRAINING)
    killed_at = killer.join(timeout=60)
    assert not cluster.failures  # the coordinator coped; nothing was restarted
    assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
    epoch_ends = [r for r in resilience.read_journal(tmp_path) if r["event"] == "epoch_end"]
    assert any(r["time"] > killed_at for r in epoch_ends), epoch_ends  # epochs ended after the kill
    # every function ran; the coordinator retries at least once, so the one function the killed worker
    # had in flight may have updated the ps before the kill and then again on the survivor
    assert epoch_ends[-1]["global_step"] in (40, 41), epoch_ends
    assert len(result["loss"]) == 4 and 0 < result["eval_accuracy"] <= 1, result


@pytest.mark.slow
def test_ps_a_lost_parameter_server_restarts_the_run_from_the_checkpoint(make_cluster, tmp_path):
    """No lesson resumes after a lost ps (notebook 07 stops there): train_parameter_server, on the
    lesson's model, data and step, checkpoints every 10 steps; ps:0 is SIGKILLed after step 15."""
    cluster = make_cluster(chief=True, workers=2, ps=1)
    start_ps_servers(cluster)
    pieces = {name: f for name, f in lesson("07-parameter-server").items()
              if name in PS_LESSON_FUNCTIONS}
    supervised = cluster.with_options(tasks=["chief:0"], max_failures=1, on_restart=start_ps_servers)
    (result,) = supervised.run(train_parameter_server, str(tmp_path), pieces, steps=40,
                               checkpoint_every=10, kill_pid={t.name: t.pid for t in cluster.tasks}["ps:0"],
                               kill_after_step=15, mnist_path=str(kit.train.data.mnist_path()), **PS_TRAINING)
    (failure,) = cluster.failures
    assert failure.task == "chief:0" and ("Unavailable" in failure.error or "Aborted" in failure.error)
    assert result["attempt"] == 2 and result["first_step"] == 10  # the last checkpoint before the kill
    assert result["model_version"] == 40
