"""Fault tolerance on the workers: injected failures and a step journal, around the lessons' training.

The training itself is the lessons' (notebook 05's ``train``, ``train_preemptible``; notebook 07's ``train``):
what the kit measures goes in from outside, as Keras callbacks (:func:`kit.train.watch.watcher` journals,
:func:`kill_at_step_callback` kills). A run keeps its state in a *run directory* that every task can reach
(one machine: any folder; several hosts: a shared file system):

- ``backup/``: the lesson's Keras ``BackupAndRestore`` (tf-keras has the chief/worker logic: the chief writes
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

from ._tf import import_tensorflow
from ..core.errors import KitError
from ..core.tfconfig import this_task


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
