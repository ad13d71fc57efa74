"""The kernel's side of notebook 08's study (its lesson, in cells, trains; this reads what it measured).

- :func:`warmup_learning_rate`: gradual warmup (Goyal et al. 2017, "Accurate, Large Minibatch SGD") in plain
  Python, to check and draw what the lesson's ``warmup_schedule`` applied;
- :func:`recorder`: a Keras callback, made on each task, that writes down what each ``fit`` did;
- the study's tables: :func:`with_records`, :func:`rows_of`, :func:`scaling_efficiency`, :func:`step_times`,
  :func:`speed_table`; :func:`per_step_losses` and :func:`smooth` for the curves.

Everything here is plain Python (pandas for the tables) except :func:`recorder`, which runs on the tasks.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..core.errors import KitError, OptionError


def _positive(name: str, value: Any, example: str, whole: bool = False) -> None:
    kind = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 or \
            (isinstance(value, float) and not math.isfinite(value)):
        what = "a whole number > 0" if whole else "a number > 0"
        raise OptionError(name, f"{value!r} is not {what}", f"e.g. {name}={example}")


def warmup_learning_rate(step: int, target_lr: float, warmup_steps: int, warmup_from: float = 0.0) -> float:
    """Gradual warmup: ``warmup_from`` at step 0, rising linearly to ``target_lr`` at ``warmup_steps``.

    Constant at ``target_lr`` from then on; ``warmup_steps=0`` means no warmup.
    """
    if warmup_steps <= 0 or step >= warmup_steps:
        return float(target_lr)
    return float(warmup_from + (target_lr - warmup_from) * step / warmup_steps)


def per_step_losses(running_means: Sequence[float], steps_per_epoch: int) -> list[float]:
    """Each step's own loss from Keras's per-step running means (which restart every epoch).

    Keras logs the mean loss of the epoch so far; step ``i`` (1-based) of an epoch has its own loss
    ``i·m_i − (i−1)·m_(i−1)``. Exact for equal batches, as here (the dataset repeats).
    """
    _positive("steps_per_epoch", steps_per_epoch, "70", whole=True)
    losses = []
    for n, mean in enumerate(running_means):
        i = n % steps_per_epoch + 1
        previous = running_means[n - 1] if i > 1 else 0.0
        losses.append(float(i * mean - (i - 1) * previous))
    return losses


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` values (shorter at the start); NaN stays NaN."""
    window = max(1, int(window))
    values = [float(v) for v in values]
    out = []
    for n in range(len(values)):
        recent = values[max(0, n + 1 - window):n + 1]
        out.append(sum(recent) / len(recent) if all(math.isfinite(v) for v in recent) else float("nan"))
    return out


def scaling_efficiency(table, throughput: str = "examples_per_second", by: str = "per_worker_batch"):
    """Throughput and scaling efficiency per (``by``, workers) from a results table (pandas).

    Throughput is the median over the table's runs of each (``by``, workers) pair (the learning-rate
    rule does not change the speed). Efficiency = throughput(N) / (N × throughput(1 worker)): 1.0
    is perfect scaling; NaN where the table has no 1-worker run for that ``by``.
    """
    import pandas as pd

    missing = [c for c in ("workers", by, throughput) if c not in table.columns]
    if missing:
        raise OptionError("table", f"has no column(s) {', '.join(missing)}",
                          "pass a results table with workers, the grouping column and the throughput")
    ok = table[table[throughput].notna()] if "status" not in table.columns else \
        table[(table["status"] == "ok") & table[throughput].notna()]
    speed = ok.groupby([by, "workers"])[throughput].median().rename("examples_per_second").reset_index()
    one = speed[speed["workers"] == 1].set_index(by)["examples_per_second"]
    speed["speedup"] = speed["examples_per_second"] / speed[by].map(one)
    speed["efficiency"] = speed["speedup"] / speed["workers"]
    return pd.DataFrame(speed).sort_values([by, "workers"]).reset_index(drop=True)


# ----- notebook 08's study: measuring a run from outside its training function, and its table ------
#: The plan's columns that go into each row of the results table.
COLUMNS = ["workers", "per_worker_batch", "lr_rule", "warmup", "global_batch", "k", "learning_rate",
           "warmup_steps", "epochs", "steps_per_epoch", "steps", "examples"]


def recorder():
    """A Keras callback that writes down what each ``fit`` did on this task, in ``.record`` (the last) and ``.records``
    (every fit it saw): ``running_loss`` and ``learning_rate`` after each call into TensorFlow, ``loss`` (the
    epoch's), ``steps_done`` (the optimizer's count) and ``epoch_seconds`` at each epoch's end, and the task, its pid,
    the model's parameters and the wall time of ``fit``. At each fit's end it sends ``records`` to the notebook
    (``cluster.last_view.measurements()[task]["records"]``): a lesson's function takes it in ``callbacks`` and
    returns only what the lesson returns. It measures; the training does not depend on it (imports TensorFlow)."""
    import os
    import time

    from ..core.tfconfig import this_task
    from ._tf import import_tensorflow
    from .progress import publish

    tf = import_tensorflow()

    class Recorder(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.records: list[dict] = []
            self.record: dict = {}

        def on_train_begin(self, logs=None):
            self.started = time.perf_counter()
            self.record = {"task": this_task(), "pid": os.getpid(), "running_loss": [], "learning_rate": [],
                           "loss": [], "steps_done": [], "epoch_seconds": [], "parameters": self.model.count_params()}

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.record["running_loss"].append(float(logs["loss"]))    # Keras: mean over the epoch so far
            self.record["learning_rate"].append(float(tf.keras.backend.get_value(self.model.optimizer.learning_rate)))

        def on_epoch_end(self, epoch, logs=None):
            self.record["epoch_seconds"].append(time.perf_counter() - self.epoch_started)
            self.record["steps_done"].append(int(self.model.optimizer.iterations.numpy()))
            self.record["loss"].append(float(logs["loss"]))

        def on_train_end(self, logs=None):
            self.record["wall_seconds"] = time.perf_counter() - self.started
            self.records.append(self.record)
            publish(records=self.records)

    return Recorder()


def with_records(returned: Sequence[Sequence[Any]], measurements: dict[str, dict], names: Sequence[str]) -> list:
    """Per task, one record per trial: what :func:`recorder` wrote down of each fit (``measurements``, from
    ``cluster.last_view.measurements()``) with the ``(test_loss, test_accuracy)`` the task returned for it."""
    out = []
    for name, results in zip(names, returned):
        records = measurements[name].get("records", [])
        if len(records) != len(results):
            raise KitError(f"{name}: {len(results)} trials returned but {len(records)} recorded",
                           fix="pass kit.OnTask(kit.train.scaling.recorder) in the run's callbacks")
        out.append([{**r, "test_loss": loss, "test_accuracy": accuracy} for r, (loss, accuracy) in zip(records, results)])
    return out


def same_training(trial: dict[str, Any]) -> tuple:
    """Equal for planned trials (dicts) that train identically: e.g. every rule at k = 1."""
    warm = trial["warmup_steps"] if trial["warmup_from"] != trial["learning_rate"] else 0
    return (trial["workers"], trial["per_worker_batch"], trial["learning_rate"], warm)


def distinct(trials: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``trials`` without the ones that would train exactly like an earlier one (:func:`same_training`)."""
    return list({same_training(t): t for t in trials}.values())


def as_row(trial: dict[str, Any], results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row of the results table from a planned trial and every task's record of it (:func:`recorder`,
    plus ``test_loss`` and ``test_accuracy``): the plan, test accuracy, final loss (mean of the last eighth of
    the steps), examples/s (epochs after the first, which traces), whether the workers logged the same losses,
    and the per-step losses."""
    import numpy as np

    first = results[0]
    curve = per_step_losses(first["running_loss"], trial["steps_per_epoch"])
    timed = first["epoch_seconds"][1:]
    return {**{name: trial[name] for name in COLUMNS},
            "test_accuracy": first["test_accuracy"], "test_loss": first["test_loss"],
            "final_loss": float(np.mean(curve[-max(1, len(curve) // 8):])),
            "examples_per_second": trial["global_batch"] * trial["steps_per_epoch"] * len(timed) / sum(timed),
            "wall_seconds": max(r["wall_seconds"] for r in results),
            "workers_agree": all(np.allclose(r["loss"], first["loss"], rtol=1e-5, equal_nan=True) for r in results),
            "steps_counted": first["steps_done"], "epoch_loss": first["loss"], "parameters": first["parameters"],
            "loss_curve": curve, "lr_curve": first["learning_rate"], "pids": sorted(r["pid"] for r in results)}


def rows_of(trials: Sequence[dict[str, Any]], trained: Sequence[dict[str, Any]], results) -> list[dict[str, Any]]:
    """A row per trial of ``trials``, each from the run of ``trained`` (:func:`distinct`) that trains alike;
    ``results``: what ``cluster.run`` returned, one list per task with one record per trained trial."""
    done = {same_training(t): as_row(t, [task[n] for task in results]) for n, t in enumerate(trained)}
    return [{**done[same_training(t)], **{name: t[name] for name in COLUMNS}, "status": "ok"} for t in trials]


def step_times(speed):
    """Milliseconds per step of one worker and of N at the same per-worker batch, from
    :func:`scaling_efficiency`'s table: what N workers add per step (all-reduce, waiting, contention)."""
    import pandas as pd

    one = speed[speed["workers"] == 1].set_index("per_worker_batch")["examples_per_second"]
    rows = []
    for _, r in speed[speed["workers"] > 1].iterrows():
        alone = 1000 * r["per_worker_batch"] / one[r["per_worker_batch"]]
        together = 1000 * r["per_worker_batch"] * r["workers"] / r["examples_per_second"]
        rows.append({"workers": int(r["workers"]), "per_worker_batch": int(r["per_worker_batch"]),
                     "ms per step, 1 worker": alone, "ms per step": together, "added ms": together - alone,
                     "efficiency": r["efficiency"]})
    return pd.DataFrame(rows).round(2)


def speed_table(trials: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]):
    """The speed-options comparison as a table: one row per run (one task's records)."""
    import pandas as pd

    return pd.DataFrame([{"all-reduce": t["allreduce"], "steps per execution": t["steps_per_execution"],
                          "steps": t["steps"], "batch-end calls": len(r["running_loss"]), "final loss": r["loss"][-1],
                          "examples/s": t["global_batch"] * t["steps_per_epoch"] * (t["epochs"] - 1)
                          / sum(r["epoch_seconds"][1:])} for t, r in zip(trials, records)])
