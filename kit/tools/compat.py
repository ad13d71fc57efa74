"""Which Keras works with which strategy, measured: the Keras compatibility table.

Each combination of Keras (tf-keras, Keras 3) × strategy (default, MirroredStrategy,
MultiWorkerMirroredStrategy, ParameterServerStrategy) × training API (``model.fit``, custom
loop) is *run* on a :class:`kit.TFCluster` started with ``keras="tf-keras"`` or ``keras="keras3"``,
for a few steps of a lesson's own training function (its cells tagged ``lesson``, what ``kit export``
writes as main.py): notebook 06's ``train`` / ``train_with_fit``, or for ParameterServerStrategy
notebook 07's ``train`` / ``train_fit``. The outcome is "ok" or the error's first line.

    python -m kit.tools.compat --out docs/keras-compatibility.md

Combinations that need the same cluster layout share one cluster (its processes run the custom
loop first, then ``model.fit``); a cluster that timed out or lost a task is restarted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..core.errors import ClusterError, KitError, WorkerError, first_line
from ..core.files import write_atomic
from ..train.strategies import STRATEGIES, build_strategy
from .cells import lesson as lesson_code

if TYPE_CHECKING:
    from ..core.cluster import TFCluster

KERAS = ("tf-keras", "keras3")
MODES = ("custom_loop", "fit")  # the order a process runs them in
TABLE_MODES = ("fit", "custom_loop")  # the order the table shows them in
#: The cluster each strategy runs on (TFCluster options).
TOPOLOGIES: dict[str, dict[str, Any]] = {
    "default": {"workers": 1},
    "mirrored": {"workers": 1},
    "multi_worker_mirrored": {"workers": 2},
    "parameter_server": {"chief": True, "workers": 2, "ps": 1},
}
STRATEGY_LABELS = {
    "default": "default (no distribution)",
    "mirrored": "MirroredStrategy (2 logical CPUs)",
    "multi_worker_mirrored": "MultiWorkerMirroredStrategy (2 workers)",
    "parameter_server": "ParameterServerStrategy (chief, 2 workers, 1 ps)",
}
MODE_LABELS = {"fit": "model.fit", "custom_loop": "custom loop"}
LOGICAL_CPUS = 2
DEFAULT_STEPS = 3
DEFAULT_TIMEOUT = 180.0
#: The longest error line a table cell holds.
ERROR_CHARS = 140


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What running one combination gave: ``ok``, or the first line of the error."""

    keras: str
    strategy: str
    mode: str
    ok: bool
    error: str = ""
    seconds: float = 0.0

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.keras, self.strategy, self.mode)

    @property
    def cell(self) -> str:
        """The table cell: ``ok`` or ``fails: `<error>```."""
        return "ok" if self.ok else f"fails: `{_escape(self.error)}`"


def _escape(text: str) -> str:
    """Fit an error line into a Markdown table cell inside backticks."""
    return text.replace("|", "/").replace("`", "'")


#: The lesson notebook that trains under each strategy, and its function for each mode.
LESSON_06 = ("06-custom-training-loop", {"custom_loop": "train", "fit": "train_with_fit"})
LESSONS = {"default": LESSON_06, "mirrored": LESSON_06, "multi_worker_mirrored": LESSON_06,
           "parameter_server": ("07-parameter-server", {"custom_loop": "train", "fit": "train_fit"})}


def lesson(strategy: str, mode: str) -> tuple[dict[str, Any], Callable]:
    """The lesson's namespace (its cells tagged ``lesson``, run in the kernel: they only define) and its
    function that trains under ``strategy`` with ``mode``.

    Notebook 06's ``make_strategy`` builds MirroredStrategy or MultiWorkerMirroredStrategy; for ``default``
    the namespace's ``make_strategy`` also gives the default strategy (:func:`_or_default`).
    """
    notebook, functions = LESSONS[strategy]
    code = lesson_code(notebook)
    if strategy != "parameter_server":
        code["make_strategy"] = functools.partial(_or_default, code["make_strategy"])
    return code, code[functions[mode]]


def _or_default(make_strategy: Callable, name: str, logical_cpus: int) -> Any:
    """On a task: ``tf.distribute.get_strategy()`` for ``name="default"``, else the lesson's ``make_strategy``."""
    return build_strategy("default") if name == "default" else make_strategy(name, logical_cpus)


def arguments(strategy: str, mode: str, steps: int, checkpoint_dir: str) -> dict[str, Any]:
    """The lesson function's arguments for one combination (besides ``mnist_path``, set on the task):
    one epoch of ``steps`` steps of 16 examples per replica (or worker), out of 512."""
    if strategy == "parameter_server":  # 07: variables not partitioned; its custom loop evaluates inline
        found = dict(epochs=1, steps_per_epoch=steps, per_worker_batch=16, examples=512, learning_rate=0.05,
                     max_shards=1, min_shard_bytes=256 << 10)
        return {**found, "eval_steps": 1} if mode == "custom_loop" else found
    found = dict(per_replica_batch_size=16, epochs=1, steps_per_epoch=steps, learning_rate=0.05, l2=1e-4,
                 examples=512, eval_steps=1, logical_cpus=LOGICAL_CPUS, seed=42, strategy_name=strategy)
    return {**found, "checkpoint_dir": checkpoint_dir} if mode == "custom_loop" else found


def attempt(train: Callable, kwargs: dict[str, Any], logical_cpus: int = 0) -> dict[str, Any]:
    """On a task: ``train(**kwargs)`` (a lesson's function), with the kit's MNIST; never raises.

    Returns ``{"ok", "error", "seconds", "keras"}``. With ``logical_cpus`` the CPU is first split
    into that many logical devices (this must be the process's first TensorFlow work: the default
    strategy and MirroredStrategy share a process, and MirroredStrategy needs the split).
    """
    from ..train._tf import keras_flavour
    from ..train.data import mnist_path

    started = time.perf_counter()
    try:
        if logical_cpus:
            from ..train.mirrored import split_cpu

            split_cpu(logical_cpus)
        train(**kwargs, mnist_path=str(mnist_path()))
        ok, error = True, ""
    except Exception as e:  # the outcome *is* the error: record it, do not raise
        ok, error = False, first_line(e, ERROR_CHARS)
    return {"ok": ok, "error": error, "seconds": time.perf_counter() - started,
            "keras": keras_flavour()}


def run_on_cluster(cluster: "TFCluster", strategy: str, mode: str, steps: int = DEFAULT_STEPS,
                   timeout: float = DEFAULT_TIMEOUT) -> Outcome:
    """Run one combination on a started cluster of the strategy's topology (its Keras choice).

    The lesson's cells run in this process, which never imports TensorFlow; each task's Keras is
    the one its process started with (``TF_USE_LEGACY_KERAS`` from ``TFCluster(keras=)``), checked
    against the cluster's. A timeout or a lost task is recorded as the outcome, and the cluster is
    restarted so that the next combination starts from fresh processes.
    """
    keras = cluster.options.keras
    code, train = lesson(strategy, mode)
    if strategy == "parameter_server":  # 07's servers, kept serving beside the engines; the chief coordinates
        from ..train.ps import serve

        servers = [n for n in cluster.task_names if n != "chief:0"]
        cluster.with_options(tasks=servers, stream=False).run(serve, code["start_server"])
        tasks = ["chief:0"]
    else:
        tasks = cluster.task_names
    split = LOGICAL_CPUS if strategy in ("default", "mirrored") else 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kit-compat-", ignore_cleanup_errors=True) as scratch:
        kwargs = arguments(strategy, mode, steps, f"{scratch}/ckpt")  # a fresh checkpoint: nothing to restore
        try:
            results = cluster.with_options(tasks=tasks, timeout=timeout, stream=False).run(attempt, train, kwargs,
                                                                                        split)
        except (ClusterError, WorkerError) as e:
            cluster.restart()
            return Outcome(keras, strategy, mode, False, first_line(e, ERROR_CHARS), time.perf_counter() - started)
    failed = [r for r in results if not r["ok"]]
    flavours = {r["keras"] for r in results}
    if flavours != {keras}:
        raise KitError(f"the cluster was started with keras={keras!r} but its tasks run "
                       f"{', '.join(sorted(flavours))}. Fix: start engines before TensorFlow is "
                       "imported, with TFCluster(keras=...)")
    return Outcome(keras, strategy, mode, not failed, failed[0]["error"] if failed else "",
                   max(r["seconds"] for r in results))


def run_all(keras: Iterable[str] = KERAS, strategies: Iterable[str] = STRATEGIES,
            modes: Iterable[str] = MODES, steps: int = DEFAULT_STEPS,
            timeout: float = DEFAULT_TIMEOUT,
            progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run every combination; one cluster per Keras choice and topology. Returns the outcomes
    in table order (strategy, mode, Keras)."""
    from ..core.cluster import TFCluster

    keras, strategies, modes = list(keras), list(strategies), list(modes)
    for k in keras:
        for s in strategies:
            for m in modes:
                _check(k, s, m)
    groups: dict[tuple, list[str]] = {}
    for s in strategies:
        groups.setdefault(tuple(sorted(TOPOLOGIES[s].items())), []).append(s)
    outcomes: dict[tuple, Outcome] = {}
    for k in keras:
        for layout, members in groups.items():
            with TFCluster(**dict(layout), keras=k) as cluster:
                for s in members:
                    for m in modes:
                        outcome = run_on_cluster(cluster, s, m, steps, timeout)
                        outcomes[outcome.key] = outcome
                        if progress:
                            progress(outcome)
    return [outcomes[(k, s, m)] for s in strategies for m in TABLE_MODES if m in modes for k in keras]


def _check(keras: str, strategy: str, mode: str) -> None:
    for value, choices, name in ((keras, KERAS, "keras"), (strategy, STRATEGIES, "strategy"),
                                 (mode, MODES, "mode")):
        if value not in choices:
            raise KitError(f"{name}={value!r} is unknown. Fix: use one of {', '.join(choices)}")


def versions() -> dict[str, str]:
    """Versions of what the table depends on, from the installed distributions."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("tensorflow", "tf-keras", "keras", "ipyparallel"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def to_markdown(outcomes: list[Outcome], steps: int = DEFAULT_STEPS,
                when: datetime.date | None = None, seconds: float | None = None,
                command: str | None = None) -> str:
    """The compatibility table as a Markdown document, with how and when it was measured."""
    when = when or datetime.date.today()
    command = command or f"python -m kit.tools.compat --out docs/keras-compatibility.md --steps {steps}"
    found = versions()
    keras = [k for k in KERAS if any(o.keras == k for o in outcomes)]
    by_key = {o.key: o for o in outcomes}
    rows = []
    for s in STRATEGIES:
        for m in TABLE_MODES:
            if any((k, s, m) in by_key for k in keras):
                cells = [by_key[(k, s, m)].cell if (k, s, m) in by_key else "not run" for k in keras]
                rows.append(f"| {STRATEGY_LABELS[s]} | {MODE_LABELS[m]} | " + " | ".join(cells) + " |")
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    complete = [k for k in keras if all(by_key[key].ok for key in by_key if key[0] == k)]
    verdict = f"Every combination ran with: {', '.join(complete) or 'neither'}."
    if "tf-keras" in complete and complete != keras:
        verdict += " That is why the kit uses tf-keras by default (`TFCluster(keras=\"tf-keras\")`)."
    return "\n".join([
        "# Keras compatibility, measured",
        "",
        "Which Keras trains the lessons' MNIST CNN under which `tf.distribute` strategy, with `model.fit` "
        "and with a custom training loop. Every cell comes from running that combination of a lesson's own "
        "code; a failure shows the first line of its error.",
        "",
        "| strategy | training | " + " | ".join(keras) + " |",
        "|---|---|" + "---|" * len(keras),
        *rows,
        "",
        verdict,
        "",
        "## How it was produced",
        "",
        f"`{command}` ({when.isoformat()}{took}). "
        "For each Keras choice it starts a `kit.TFCluster` with `keras=\"tf-keras\"` "
        "(`TF_USE_LEGACY_KERAS=1`) or `keras=\"keras3\"` (`TF_USE_LEGACY_KERAS=0`) and runs, through "
        f"`kit.tools.compat.attempt`, one epoch of {steps} steps of a lesson's own training function (its cells "
        "tagged `lesson`, what `kit export` writes as main.py, loaded with `kit.tools.cells.lesson`): "
        "notebook 06's `train` (custom loop) / `train_with_fit` (`model.fit`) for the default strategy and "
        f"MirroredStrategy (one task, the CPU split into {LOGICAL_CPUS} logical devices; 06 builds no default "
        "strategy, so there its `make_strategy` gives `tf.distribute.get_strategy()`) and for "
        "MultiWorkerMirroredStrategy (2 workers); notebook 07's `train` (custom loop, a `ClusterCoordinator`) / "
        "`train_fit` (`model.fit` with a `DatasetCreator`, which Keras 3 does not have) on the chief for "
        "ParameterServerStrategy (chief, 2 workers and 1 ps serving 07's `start_server`; variables not "
        "partitioned). \"ok\" means the steps "
        "ran without an error; it does not check the losses. Strategies with the same cluster layout "
        "share its processes; each process runs the custom loop first, then `model.fit`. "
        "`tests/test_keras_compat.py` re-runs the MultiWorkerMirroredStrategy rows and checks them "
        "against this file.",
        "",
        "Versions: " + ", ".join(f"{name} {v}" for name, v in found.items())
        + f"; {platform.system()} {platform.machine()}.",
        "",
    ])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m kit.tools.compat`` and ``kit compat``."""
    parser.add_argument("--out", type=Path, default=None,
                        help="write the Markdown table here (default: print it)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"training steps per run (default {DEFAULT_STEPS})")
    parser.add_argument("--keras", nargs="+", choices=KERAS, default=list(KERAS),
                        help="the Keras choices to measure (default all)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        help="the strategies to measure (default all)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="the training APIs to measure (default both)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds one combination may take before it counts as hung "
                             f"(default {DEFAULT_TIMEOUT:g})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.tools.compat", description=__doc__.split("\n")[0])
    add_arguments(parser)
    try:
        return run_from_args(parser.parse_args(argv))
    except KitError as e:
        print(f"python -m kit.tools.compat: {e}", file=sys.stderr)
        return 2


def run_from_args(args: argparse.Namespace) -> int:
    """Measure what ``args`` asks for (see :func:`add_arguments`); print or write the table."""
    if args.steps < 1:  # checked before any cluster starts
        raise KitError(f"--steps {args.steps}: each combination must run at least one step. Fix: "
                       f"--steps {DEFAULT_STEPS} (the default) or more")
    if not args.timeout > 0:
        raise KitError(f"--timeout {args.timeout:g}: it must be positive. Fix: --timeout "
                       f"{DEFAULT_TIMEOUT:g} (the default)")

    def report(o: Outcome) -> None:
        print(f"{o.keras:>8}  {STRATEGY_LABELS[o.strategy]:<50} {MODE_LABELS[o.mode]:<11} "
              f"{o.seconds:5.1f}s  {o.cell}", flush=True)

    started = time.perf_counter()
    outcomes = run_all(args.keras, args.strategies, args.modes, args.steps, args.timeout, report)
    command = ["python -m kit.tools.compat"] + ([f"--out {args.out}"] if args.out else []) + [f"--steps {args.steps}"]
    for name, everything in (("keras", KERAS), ("strategies", STRATEGIES), ("modes", MODES)):
        if list(getattr(args, name)) != list(everything):
            command.append(f"--{name} {' '.join(getattr(args, name))}")
    text = to_markdown(outcomes, args.steps, seconds=time.perf_counter() - started,
                       command=" ".join(command))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
