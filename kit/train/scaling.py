"""Learning-rate scaling rules and gradual warmup for large global batches (Goyal et al. 2017).

With synchronous data parallelism the global batch is ``workers × per_worker_batch``: more workers
mean fewer, larger steps over the same examples. Goyal et al. ("Accurate, Large Minibatch SGD:
Training ImageNet in 1 Hour", 2017) scale the learning rate with the batch and warm it up:

- ``none``: keep the base learning rate (fewer steps, each as long as before: training falls behind);
- ``linear``: multiply it by ``k = global_batch / base_batch`` (k small steps ≈ one large step);
- ``sqrt``: multiply it by ``√k`` (keeps the gradient noise's variance per example; a milder rule);
- gradual warmup: start at ``warmup_from`` and ramp linearly to the scaled rate over the first steps,
  so the early, large-gradient steps do not blow up.

Everything here is plain Python (no TensorFlow) except :func:`warmup_schedule`, which the training
function calls on the workers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from ..core.errors import KitError, OptionError

RULES = ("none", "linear", "sqrt")


def _positive(name: str, value: Any, example: str, whole: bool = False) -> None:
    kind = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 or \
            (isinstance(value, float) and not math.isfinite(value)):
        what = "a whole number > 0" if whole else "a number > 0"
        raise OptionError(name, f"{value!r} is not {what}", f"e.g. {name}={example}")


def scale_factor(global_batch: int, base_batch: int) -> float:
    """``k = global_batch / base_batch``: how many base batches one step now holds."""
    _positive("global_batch", global_batch, "128", whole=True)
    _positive("base_batch", base_batch, "64", whole=True)
    return global_batch / base_batch


def scaled_learning_rate(base_lr: float, k: float, rule: str) -> float:
    """The learning rate for a batch ``k`` times the base batch under ``rule`` (none, linear, sqrt)."""
    _positive("base_lr", base_lr, "0.05")
    _positive("k", k, "global_batch / base_batch")
    if rule == "none":
        return float(base_lr)
    if rule == "linear":
        return float(base_lr * k)
    if rule == "sqrt":
        return float(base_lr * math.sqrt(k))
    raise OptionError("lr_rule", f"{rule!r} is not a scaling rule", f"use one of {', '.join(RULES)}")


def warmup_learning_rate(step: int, target_lr: float, warmup_steps: int, warmup_from: float = 0.0) -> float:
    """Gradual warmup: ``warmup_from`` at step 0, rising linearly to ``target_lr`` at ``warmup_steps``.

    Constant at ``target_lr`` from then on; ``warmup_steps=0`` means no warmup.
    """
    if warmup_steps <= 0 or step >= warmup_steps:
        return float(target_lr)
    return float(warmup_from + (target_lr - warmup_from) * step / warmup_steps)


def warmup_schedule(target_lr: float, warmup_steps: int, warmup_from: float = 0.0):
    """:func:`warmup_learning_rate` as a Keras ``LearningRateSchedule`` for the optimizer (imports TF)."""
    from ._tf import import_tensorflow

    tf = import_tensorflow()

    class GradualWarmup(tf.keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, target_lr, warmup_steps, warmup_from):
            self.target_lr = float(target_lr)
            self.warmup_steps = int(warmup_steps)
            self.warmup_from = float(warmup_from)

        def __call__(self, step):
            fraction = tf.minimum(tf.cast(step, tf.float32) / max(self.warmup_steps, 1), 1.0)
            return self.warmup_from + (self.target_lr - self.warmup_from) * fraction

        def get_config(self):
            return {"target_lr": self.target_lr, "warmup_steps": self.warmup_steps,
                    "warmup_from": self.warmup_from}

    return GradualWarmup(target_lr, warmup_steps, warmup_from)


@dataclasses.dataclass(frozen=True)
class Trial:
    """One point of a scaling study, planned: the batch, the learning rate, the steps.

    Every point trains on the same number of examples (``examples``), so larger global batches take
    fewer steps — the comparison Goyal et al. make (same epochs, larger batch).
    """

    workers: int
    per_worker_batch: int
    lr_rule: str
    warmup: bool
    global_batch: int
    k: float                 #: global_batch / base_batch
    learning_rate: float     #: the scaled rate (reached after warmup)
    warmup_from: float       #: the rate at step 0 when warming up: the unscaled base rate
    warmup_steps: int
    epochs: int
    steps_per_epoch: int

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def examples(self) -> int:
        """Examples actually seen (the budget rounded to whole steps)."""
        return self.steps * self.global_batch

    def as_row(self) -> dict[str, Any]:
        """The plan as columns of a results table."""
        return {"workers": self.workers, "per_worker_batch": self.per_worker_batch,
                "lr_rule": self.lr_rule, "warmup": self.warmup, "global_batch": self.global_batch,
                "k": self.k, "learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps,
                "steps": self.steps, "examples": self.examples}

    def schedule_key(self) -> tuple:
        """Equal for trials that train identically (e.g. every rule at k = 1)."""
        warm = self.warmup_steps if self.warmup_steps and self.warmup_from != self.learning_rate else 0
        return (self.workers, self.per_worker_batch, self.epochs, self.steps_per_epoch,
                self.learning_rate, warm, self.warmup_from if warm else None)

    def train_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`kit.train.fit.train_mnist`."""
        return {"per_worker_batch": self.per_worker_batch, "epochs": self.epochs,
                "steps_per_epoch": self.steps_per_epoch, "learning_rate": self.learning_rate,
                "warmup_steps": self.warmup_steps, "warmup_from": self.warmup_from}


def plan(workers: int, per_worker_batch: int, lr_rule: str, *, base_lr: float, base_batch: int,
         examples: int, warmup: bool = False, warmup_fraction: float = 0.25, epochs: int = 2) -> Trial:
    """Plan one point: global batch, scaled learning rate, and steps for an ``examples`` budget.

    ``epochs`` splits the steps into equal epochs (the kit measures throughput on the epochs after
    the first, which includes tracing). With ``warmup`` the rate ramps from ``base_lr`` to the scaled
    rate over the first ``warmup_fraction`` of the steps (Goyal et al.: 5 of 90 epochs).
    """
    _positive("workers", workers, "2", whole=True)
    _positive("per_worker_batch", per_worker_batch, "64", whole=True)
    _positive("examples", examples, "8192", whole=True)
    _positive("epochs", epochs, "2", whole=True)
    if not isinstance(warmup, bool):
        raise OptionError("warmup", f"{warmup!r} is not True or False", "warmup=True ramps the rate up")
    if not (isinstance(warmup_fraction, (int, float)) and 0 <= warmup_fraction < 1):
        raise OptionError("warmup_fraction", f"{warmup_fraction!r} is not in [0, 1)",
                          "e.g. warmup_fraction=0.25 warms up over the first quarter of the steps")
    global_batch = workers * per_worker_batch
    k = scale_factor(global_batch, base_batch)
    learning_rate = scaled_learning_rate(base_lr, k, lr_rule)
    steps_per_epoch = max(1, round(examples / global_batch / epochs))
    steps = steps_per_epoch * epochs
    if steps < 2 * epochs:
        raise OptionError("examples", f"{examples} examples give only {steps} step(s) at global batch "
                          f"{global_batch}", f"raise examples to at least {2 * epochs * global_batch}")
    warmup_steps = max(1, round(warmup_fraction * steps)) if warmup and warmup_fraction > 0 else 0
    return Trial(workers=workers, per_worker_batch=per_worker_batch, lr_rule=lr_rule, warmup=warmup,
                 global_batch=global_batch, k=k, learning_rate=learning_rate,
                 warmup_from=float(base_lr), warmup_steps=warmup_steps, epochs=epochs,
                 steps_per_epoch=steps_per_epoch)


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


def summed_third(strategy, optimizer_class) -> float:
    """The sum across replicas that ``optimizer_class.aggregate_gradients`` makes of the gradient 1/3 given
    by every replica (a probe of the optimizer's all-reduce; call on every task; imports TensorFlow)."""
    from ._tf import import_tensorflow

    tf = import_tensorflow()
    with strategy.scope():
        variable = tf.Variable([0.0])
        optimizer = optimizer_class(learning_rate=0.0)

    @tf.function
    def aggregate():
        return strategy.run(lambda: optimizer.aggregate_gradients([(tf.constant([1 / 3]), variable)])[0][0])

    return float(strategy.experimental_local_results(aggregate())[0][0])


def speed_table(trials: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]):
    """The speed-options comparison as a table: one row per run (one task's records)."""
    import pandas as pd

    return pd.DataFrame([{"all-reduce": t["allreduce"], "steps per execution": t["steps_per_execution"],
                          "steps": t["steps"], "batch-end calls": len(r["running_loss"]), "final loss": r["loss"][-1],
                          "examples/s": t["global_batch"] * t["steps_per_epoch"] * (t["epochs"] - 1)
                          / sum(r["epoch_seconds"][1:])} for t, r in zip(trials, records)])
