"""Fault-injection trials: kill a random task at a random step, many times, and measure.

    kit faults --trials 10 --out out/fault-trials

Each trial starts a fresh cluster, runs notebook 05's lesson ``train`` (``BackupAndRestore``, from the
notebook's cells tagged ``lesson``: :func:`run_lesson`) under a supervised run (``max_failures``), kills one
task (SIGKILL) at a random global step from inside that task, and records from the journal: did the run
complete with exactly the requested epochs, how many steps were redone, and how long from the kill to the
first step after the resume. After each trial it counts the kit's processes still alive (expected: none).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.files import write_atomic
from ..train import data, resilience, watch
from ..train.progress import OnTask
from . import cells

#: The lesson the trials run: notebook 05's ``train``, tf-keras ``BackupAndRestore``.
LESSON = "05-fault-tolerance"


def run_lesson(runner: Any, run_dir: str | Path, *, epochs: int, steps_per_epoch: int,
               save_freq: int | str = "epoch", kill_task: str | None = None, kill_at_step: int | None = None,
               kill_signal: int = signal.SIGKILL, kill_command: Sequence[str] | None = None,
               callbacks: Sequence[Any] = (), per_worker_batch: int = 64, examples: int = 8192,
               learning_rate: float = 0.01, seed: int = 42) -> list[dict[str, Any]]:
    """Notebook 05's lesson ``train`` on ``runner`` (a TFCluster, or ``cluster.with_options(...)``), resumable
    from ``run_dir/backup``; what the kit measures goes in as callbacks built on each task, as the notebook
    passes them: :func:`kit.train.watch.watcher` (the journal in ``run_dir``, and the live view), and, with
    ``kill_task``/``kill_at_step``, :func:`kit.train.resilience.kill_at_step_callback` (``kill_signal``, or
    ``kill_command`` run there; after the chief journaled that step), then ``callbacks``. Returns the lesson's
    results (``loss``, ``epochs_run``, ``global_step`` of the last attempt), in task order."""
    tasks = getattr(runner, "cluster", runner).task_names  # the chief first (chief:0, else worker:0)
    measure = [OnTask(watch.watcher, str(run_dir), per_worker_batch * len(tasks))]
    if kill_task is not None and kill_at_step is not None:
        measure.append(OnTask(resilience.kill_at_step_callback, str(run_dir), kill_task, kill_at_step, kill_signal,
                              after_task=tasks[0], command=kill_command))
    return runner.run(cells.lesson(LESSON)["train"], str(Path(run_dir) / "backup"), per_worker_batch, epochs, steps_per_epoch,
                      save_freq, learning_rate, examples, mnist_path=str(data.mnist_path()), seed=seed,
                      callbacks=[*measure, *callbacks])


def kill_trial(run_dir: str, layout: dict[str, Any], victim: str, kill_step: int, epochs: int,
               steps_per_epoch: int, save_freq: int | str, max_failures: int = 2) -> dict[str, Any]:
    """One trial on a fresh cluster; returns what the journal and the supervisor saw."""
    from ..core.cluster import TFCluster, kit_processes

    started = time.time()
    with TFCluster(**layout) as cluster:
        supervised = cluster.with_options(max_failures=max_failures, stream=False)
        results = run_lesson(supervised, run_dir, epochs=epochs, steps_per_epoch=steps_per_epoch,
                             save_freq=save_freq, kill_task=victim, kill_at_step=kill_step)
        failures = list(cluster.failures)
        tasks = cluster.task_names
    leftovers = kit_processes(os.getpid())
    summaries = {t: resilience.summarize(run_dir, t) for t in tasks}
    kill = next(r for r in resilience.read_journal(run_dir) if r["event"] == "kill")
    first_after = min(s["resumes"][0]["first_step_time"] for s in summaries.values() if s["resumes"])
    total = epochs * steps_per_epoch
    # exactly the requested training: every step 1..total ran, and the model ends at step total
    exact = all(s["completed"] and s["distinct_steps"] == total and not s["steps_missing"]
                for s in summaries.values())
    return {
        "victim": victim, "kill_step": kill_step, "save_freq": save_freq,
        "completed_exactly": exact and all(r["global_step"] == total for r in results),
        "epochs_recorded": summaries[tasks[0]]["final_epochs"],
        "failures": len(failures),
        "steps_redone": max(s["steps_redone"] for s in summaries.values()),
        "resumed_at_step": summaries[tasks[0]]["resumes"][0]["first_step_after"],
        "kill_to_first_step_s": first_after - kill["time"],
        "restart_s": failures[0].restarted_at - failures[0].failed_at if failures else None,
        "processes_left": len(leftovers),
        "wall_s": time.time() - started,
    }


def run_trials(trials: int = 10, seed: int = 0, epochs: int = 3, steps_per_epoch: int = 20,
               save_freq: int | str = 10, out: str | None = None) -> list[dict[str, Any]]:
    """``trials`` random kills (a random worker, or the chief in a chief+worker cluster)."""
    from ..core.cluster import TFCluster

    rng = random.Random(seed)
    rows = []
    base = Path(out or tempfile.mkdtemp(prefix="kit-fault-trials-"))
    for i in range(trials):
        layout = rng.choice([{"workers": 2}, {"workers": 1, "chief": True}])
        victim = rng.choice(TFCluster(**layout).task_names)
        kill_step = rng.randint(2, epochs * steps_per_epoch - 2)
        row = {"trial": i, **kill_trial(str(base / f"trial-{i:02d}"), layout, victim, kill_step, epochs,
                                        steps_per_epoch, save_freq)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def summarize_trials(rows: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["kill_to_first_step_s"] for r in rows]
    return {"trials": len(rows),
            "completed_exactly": sum(r["completed_exactly"] for r in rows),
            "steps_redone_max": max(r["steps_redone"] for r in rows),
            "steps_redone_mean": statistics.mean(r["steps_redone"] for r in rows),
            "kill_to_first_step_s_median": statistics.median(times),
            "kill_to_first_step_s_max": max(times),
            "processes_left_total": sum(r["processes_left"] for r in rows),
            "victims": sorted({r["victim"] for r in rows})}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=10, help="number of trials (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for victims and steps")
    parser.add_argument("--save-freq", default="10", help="BackupAndRestore save_freq: steps or 'epoch'")
    parser.add_argument("--out", default=None, help="folder for the run directories and trials.json")


def run_from_args(args: argparse.Namespace) -> int:
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    rows = run_trials(args.trials, seed=args.seed, save_freq=save_freq, out=args.out)
    summary = summarize_trials(rows)
    print(json.dumps(summary, indent=1))
    if args.out:
        write_atomic(Path(args.out, "trials.json"), json.dumps({"rows": rows, "summary": summary}, indent=1))
    ok = summary["completed_exactly"] == len(rows) and summary["processes_left_total"] == 0
    return 0 if ok else 1
