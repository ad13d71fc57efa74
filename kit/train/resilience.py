"""Fault tolerance on the workers: injected failures, a step journal, and resumable training.

Everything here runs on the engines. A run keeps its state in a *run directory* that every task
can reach (one machine: any folder; several hosts: a shared file system):

- ``backup/``: Keras ``BackupAndRestore`` (tf-keras has the chief/worker logic: the chief writes
  here, the other workers write temporary copies that are deleted);
- ``journal/<task>.jsonl``: one line per training step and per (re)start, so that what a
  failure cost (steps redone, time to resume) can be measured after the fact;
- ``faults/``: marker files that make an injected failure fire once, not again after resume.
"""

from __future__ import annotations

import json
import os
import signal as signals
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import progress
from ._tf import import_tensorflow
from .strategies import build_strategy
from ..core.errors import KitError
from ..core.tfconfig import this_task


class Preempted(RuntimeError):
    """Raised on every worker after PreemptionCheckpointHandler saved for a preemption."""


def chief_task() -> str:
    """The chief of this engine's cluster: ``chief:0`` if ``TF_CONFIG`` has a chief, else ``worker:0``."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    return "chief:0" if cluster.get("chief") else "worker:0"


# ----- the journal ---------------------------------------------------------------------------------
class Journal:
    """Appends JSON lines to ``run_dir/journal/<task>.jsonl`` (one file per task: no shared writes)."""

    def __init__(self, run_dir: str | os.PathLike, task: str | None = None):
        self.task = task or this_task()
        self.path = Path(run_dir) / "journal" / f"{self.task.replace(':', '-')}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.attempt = sum(1 for r in self.read_own() if r["event"] == "start") + 1

    def read_own(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "task": self.task, "attempt": self.attempt, "time": time.time(), **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())  # a SIGKILL right after must not lose the line


def read_journal(run_dir: str | os.PathLike) -> list[dict]:
    """Every record of every task, in time order."""
    records = []
    for path in sorted((Path(run_dir) / "journal").glob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(records, key=lambda r: r["time"])


def wait_for_step(run_dir: str | os.PathLike, task: str, global_step: int, timeout: float = 120.0) -> dict:
    """Block until ``task``'s journal records ``global_step`` (or later); return that record.

    For injecting a failure from outside at a known point, e.g. from a thread in the notebook.
    """
    return _wait_for_record(run_dir, task, lambda r: r.get("event") == "step" and r["global_step"] >= global_step,
                            timeout, f"{task} did not reach step {global_step} within {timeout:g}s")


def wait_for_event(run_dir: str | os.PathLike, task: str, event: str, timeout: float = 60.0) -> dict:
    """Block until ``task``'s journal holds a record of ``event`` (e.g. "error"); return the first.

    For what a task writes after the kit has stopped following its run, e.g. a survivor's error
    after another task was killed.
    """
    return _wait_for_record(run_dir, task, lambda r: r.get("event") == event, timeout,
                            f"{task}'s journal has no {event!r} record after {timeout:g}s")


def _wait_for_record(run_dir: str | os.PathLike, task: str, match, timeout: float, why: str) -> dict:
    """The first record of ``task``'s journal that ``match`` accepts, once it is there (TimeoutError: ``why``)."""
    deadline = time.monotonic() + timeout
    path = Path(run_dir) / "journal" / f"{task.replace(':', '-')}.jsonl"
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line) if line.strip() else {}
                if match(record):
                    return record
        time.sleep(0.1)  # polling a file another process appends to; no event to wait on
    raise TimeoutError(why)


def final_losses(run_dir: str | os.PathLike, task: str = "worker:0") -> dict[int, float]:
    """Global step → loss, as the run finally kept it (a redone step keeps its last value)."""
    return {r["global_step"]: r["loss"] for r in read_journal(run_dir)
            if r["task"] == task and r["event"] == "step"}


def summarize(run_dir: str | os.PathLike, task: str = "worker:0") -> dict[str, Any]:
    """What the journal of ``task`` says about a run: attempts, steps redone, time to resume.

    ``final_epochs`` are the epochs whose end some attempt recorded (a kill between an epoch's
    last step and its end leaves that epoch's end unrecorded, though all its steps were done);
    ``steps_missing`` lists global steps that no attempt ran (expected: none).
    """
    records = [r for r in read_journal(run_dir) if r["task"] == task]
    steps = [r for r in records if r["event"] == "step"]
    starts = [r for r in records if r["event"] == "start"]
    seen: dict[int, int] = {}
    redone = 0
    for r in steps:
        seen[r["global_step"]] = seen.get(r["global_step"], 0) + 1
        redone += seen[r["global_step"]] > 1
    epoch_ends: dict[int, dict] = {}
    for r in records:
        if r["event"] == "epoch_end":
            epoch_ends[r["epoch"]] = r  # a later attempt overrides an earlier one
    resumes = []
    for start in starts[1:]:
        before = [r for r in steps if r["time"] < start["time"]]
        after = [r for r in steps if r["time"] > start["time"]]
        if before and after:
            resumes.append({"attempt": start["attempt"], "last_step_before": before[-1]["global_step"],
                            "last_step_time": before[-1]["time"], "start_time": start["time"],
                            "first_step_after": after[0]["global_step"],
                            "first_step_time": after[0]["time"], "initial_step": start["initial_step"]})
    last = max(seen, default=0)
    return {"attempts": len(starts), "steps_run": len(steps), "distinct_steps": len(seen),
            "steps_missing": [s for s in range(1, last + 1) if s not in seen],
            "steps_redone": redone, "final_epochs": sorted(epoch_ends), "resumes": resumes,
            "completed": any(r["event"] == "end" for r in records)}


# ----- injected failures ---------------------------------------------------------------------------
def fire_once(run_dir: str | os.PathLike, name: str) -> bool:
    """True the first time it is called for ``name`` in ``run_dir`` (across restarts), then False."""
    marker = Path(run_dir) / "faults" / name
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{this_task()} {time.time()}\n".encode())
    os.close(fd)
    return True


def kill_at_step_callback(run_dir: str | os.PathLike, task: str, global_step: int,
                          sig: int = signals.SIGKILL, after_task: str | None = None,
                          timeout: float = 120.0, command: Sequence[str] | None = None):
    """A Keras callback that sends ``sig`` to its own process on ``task`` after ``global_step`` (or runs
    ``command``, e.g. ``["scancel", "$SLURM_JOB_ID"]``, then waits up to ``timeout`` to be ended from outside,
    so that the run cannot finish before the fault lands). Fires once per run directory, so the resumed run passes the same step. The journal records
    the kill time just before the signal. With ``after_task`` (the chief), the kill waits until
    that task's journal records the step: its callbacks journal a step after BackupAndRestore has
    written that step's backup, so the failure lands after the backup is on disk. Without the
    wait the cluster's restart can SIGKILL the chief while it still writes the backup, and the
    run resumes from the backup before (seen on a loaded machine: 9 steps redone, not 0).
    """
    tf = import_tensorflow()
    journal_dir = run_dir

    class KillAtStep(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            if this_task() == task and step == global_step and fire_once(journal_dir, f"kill-{task}-{step}"):
                if after_task is not None and after_task != task:
                    wait_for_step(journal_dir, after_task, step, timeout=timeout)
                if command is None:
                    Journal(journal_dir).write("kill", global_step=step, signal=int(sig))
                    os.kill(os.getpid(), sig)
                    return
                argv = [os.path.expandvars(part) for part in command]
                Journal(journal_dir).write("kill", global_step=step, command=argv)
                subprocess.run(argv, check=True, timeout=timeout)
                time.sleep(timeout)  # ended from outside meanwhile; no event to wait on
                raise KitError(f"{task} still runs {timeout:g} s after {' '.join(argv)}", fix="check the command")

    return KillAtStep()


def journal_callback(journal: Journal):
    """A Keras callback that journals every step (global step, loss) and epoch end.

    The step's loss is tf-keras's per-batch log divided by the replicas it summed over
    (:func:`kit.train.progress.summed_replicas_of`), so it is on the epoch losses' scale.
    """
    tf = import_tensorflow()

    class JournalCallback(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.summed = progress.summed_replicas_of(self.model)
            journal.write("start", initial_step=int(self.model.optimizer.iterations.numpy()))

        def on_train_batch_end(self, batch, logs=None):
            journal.write("step", global_step=int(self.model.optimizer.iterations.numpy()),
                          loss=float(logs["loss"]) / self.summed)

        def on_epoch_end(self, epoch, logs=None):
            journal.write("epoch_end", epoch=int(epoch), loss=float(logs["loss"]),
                          global_step=int(self.model.optimizer.iterations.numpy()))

        def on_train_end(self, logs=None):
            journal.write("end", global_step=int(self.model.optimizer.iterations.numpy()))

    return JournalCallback()


# ----- resumable training --------------------------------------------------------------------------
def train_resumable(run_dir: str, per_worker_batch: int = 64, epochs: int = 4, steps_per_epoch: int = 20,
                    save_freq: str | int = "epoch", kill_task: str | None = None,
                    kill_at_global_step: int | None = None, kill_signal: int = signals.SIGKILL,
                    learning_rate: float = 0.001, seed: int = 42, verbose: int = 0,
                    kill_command: Sequence[str] | None = None) -> dict[str, Any]:
    """The seeds' example under MultiWorkerMirroredStrategy, resumable with ``BackupAndRestore``.

    Call it again after a failure (``cluster.with_options(max_failures=2).run(train_resumable, ...)``): it
    resumes from the last backup in ``run_dir/backup`` (per epoch, or every ``save_freq`` steps).
    ``kill_task``/``kill_at_global_step`` inject one failure (``kill_signal``, or ``kill_command`` run there, e.g.
    ``["scancel", "$SLURM_JOB_ID"]``: :func:`kill_at_step_callback`). Returns this attempt's history.
    """
    tf = import_tensorflow()
    from . import data, models
    tf.keras.utils.set_random_seed(seed)
    strategy = build_strategy("multi_worker_mirrored")  # one per process (kit.train.strategies says why)
    workers = strategy.num_replicas_in_sync
    journal = Journal(run_dir)
    dataset = data.mnist_dataset(per_worker_batch * workers, shuffle_seed=seed)
    with strategy.scope():
        model = models.build_and_compile_cnn_model(learning_rate=learning_rate)
    callbacks = [
        tf.keras.callbacks.BackupAndRestore(backup_dir=str(Path(run_dir) / "backup"), save_freq=save_freq),
        journal_callback(journal),
        progress.callback(per_worker_batch * workers),  # the notebook's live view
    ]
    if kill_task is not None and kill_at_global_step is not None:
        callbacks.append(kill_at_step_callback(run_dir, kill_task, kill_at_global_step, kill_signal,
                                               after_task=chief_task(), command=kill_command))
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=verbose,
                        callbacks=callbacks)
    return {"task": this_task(), "attempt": journal.attempt, "epochs_run": list(history.epoch),
            "loss": [float(v) for v in history.history["loss"]],
            "global_step": int(model.optimizer.iterations.numpy())}


def remove_backup_dir(run_dir: str | os.PathLike) -> None:
    """After a finished run: remove ``run_dir/backup``, which BackupAndRestore left empty.

    Raises if files remain there (a run that did not finish, or a worker's temporary copy that
    was not deleted), so that nothing is removed that could still be needed.
    """
    backup = Path(run_dir) / "backup"
    if not backup.exists():
        return
    left = [str(p.relative_to(backup)) for p in backup.rglob("*")]
    if left:
        raise KitError(f"{backup} still holds {left[:5]}: the run did not finish cleanly",
                       fix="finish the run (call the training function again: it resumes), or look at the files "
                           "and remove the folder yourself")
    backup.rmdir()


# ----- preemption: all workers save at the same step ----------------------------------------------
def _raise_preempted() -> None:
    raise Preempted("PreemptionCheckpointHandler saved a checkpoint for a preemption; "
                    "restart the cluster to resume")


def train_preemptible(run_dir: str, total_steps: int = 60, per_worker_batch: int = 64,
                      preempt_task: str | None = None, preempt_at_step: int | None = None,
                      learning_rate: float = 0.01, seed: int = 42) -> dict[str, Any]:
    """A custom loop under ``PreemptionCheckpointHandler``: a SIGTERM on one worker makes every
    worker save a checkpoint at the same step and raise :class:`Preempted`; called again, the loop
    restores it and continues at exactly that step (``handler.total_run_calls``).

    ``preempt_task``/``preempt_at_step`` send that SIGTERM once, from inside the worker.
    """
    tf = import_tensorflow()
    from . import data, models
    tf.keras.utils.set_random_seed(seed)
    strategy = build_strategy("multi_worker_mirrored")  # one per process (kit.train.strategies says why)
    journal = Journal(run_dir)
    global_batch = per_worker_batch * strategy.num_replicas_in_sync
    with strategy.scope():
        model = models.build_and_compile_cnn_model(learning_rate=learning_rate)
        optimizer = model.optimizer
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, str(Path(run_dir) / "checkpoints"),
        termination_config=tf.distribute.experimental.TerminationConfig(exit_fn=_raise_preempted))
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                            reduction=tf.keras.losses.Reduction.NONE)
    iterator = iter(strategy.experimental_distribute_dataset(
        data.mnist_dataset(global_batch, shuffle_seed=seed)))

    @tf.function
    def train_step(iterator):
        def step(images, labels):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(labels, model(images, training=True)),
                                                  global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        per_replica = strategy.run(step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    first = handler.total_run_calls
    journal.write("start", initial_step=int(first))
    meter = progress.Meter(global_batch).begin(steps=total_steps)  # the notebook's live view
    while handler.total_run_calls < total_steps:
        step_number = int(handler.total_run_calls) + 1
        if (preempt_task == this_task() and step_number == preempt_at_step
                and fire_once(run_dir, f"sigterm-{preempt_task}-{step_number}")):
            journal.write("kill", global_step=step_number - 1, signal=int(signals.SIGTERM))
            os.kill(os.getpid(), signals.SIGTERM)
        loss = handler.run(train_step, iterator)
        journal.write("step", global_step=int(handler.total_run_calls), loss=float(loss))
        meter.step(None, int(handler.total_run_calls), float(loss), force=handler.total_run_calls == total_steps)
    journal.write("end", global_step=int(handler.total_run_calls))
    return {"task": this_task(), "attempt": journal.attempt, "first_step": int(first),
            "global_step": int(handler.total_run_calls),
            "optimizer_iterations": int(optimizer.iterations.numpy())}


# ----- ParameterServerStrategy: lost workers are rescheduled, a lost ps restarts the run ----------
def train_parameter_server(run_dir: str, steps: int = 60, per_worker_batch: int = 32,
                           checkpoint_every: int = 10, kill_pid: int | None = None,
                           kill_after_step: int | None = None, learning_rate: float = 0.05,
                           seed: int = 42) -> dict[str, Any]:
    """On the chief: schedule ``steps`` steps in chunks of ``checkpoint_every``, checkpointing after
    each chunk and resuming from the latest checkpoint when called again.

    ``kill_pid``/``kill_after_step`` SIGKILL one process of this machine (a worker or a ps) once,
    while the chunk holding that step runs. A lost worker's functions are rescheduled on the other
    workers by the ``ClusterCoordinator`` — at least once, not exactly once: a function whose update
    reached the ps before its worker died runs again, so ``model_version`` can exceed ``scheduled`` by
    the one function each lost worker had in flight. A lost ps makes ``join`` raise, and the supervised run
    (``cluster.with_options(max_failures=1, on_restart=start_servers).run(...)``) calls this again.
    """
    tf = import_tensorflow()
    from .custom_loop import build_model
    from .ps import make_step_fn, mnist_dataset_fn

    journal = Journal(run_dir)
    strategy = build_strategy("parameter_server")
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    tf.keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = build_model(learning_rate=learning_rate)
        optimizer = tf.keras.optimizers.SGD(learning_rate=learning_rate)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(Path(run_dir) / "ps-checkpoints"), max_to_keep=2)
    manager.restore_or_initialize()
    first = int(optimizer.iterations.numpy())
    journal.write("start", initial_step=first)
    dataset_fn = mnist_dataset_fn(per_worker_batch, seed=seed)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
    step_fn = make_step_fn(strategy, model, optimizer)
    scheduled = first
    workers_seen: list[int] = []
    while scheduled < steps:
        chunk = min(checkpoint_every, steps - scheduled)
        remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(chunk)]
        if (kill_pid is not None and kill_after_step is not None
                and scheduled < kill_after_step <= scheduled + chunk
                and fire_once(run_dir, f"kill-pid-{kill_pid}")):
            remotes[kill_after_step - scheduled - 1].fetch()  # that step has run: kill now
            journal.write("kill", global_step=kill_after_step, pid=kill_pid)
            os.kill(kill_pid, signals.SIGKILL)
        coordinator.join()
        scheduled += chunk
        for remote in remotes:
            record = remote.fetch()
            workers_seen.append(int(record["worker"]))
            journal.write("step", global_step=int(record["after"]), loss=float(record["loss"]),
                          worker=int(record["worker"]))
        manager.save(checkpoint_number=scheduled)
    journal.write("end", global_step=int(optimizer.iterations.numpy()))
    return {"task": this_task(), "attempt": journal.attempt, "first_step": first,
            "scheduled": scheduled, "model_version": int(optimizer.iterations.numpy()),
            "steps_per_worker": {w: workers_seen.count(w) for w in sorted(set(workers_seen))}}
