"""The benchmark behind ``make bench``: distribution efficiency, start-up, recovery, memory, notebooks.

Start-up (:mod:`kit.tools.launch_bench`): the time to a strategy ready in the cluster's private network and
on the host's network, and the first training step beside a plain launch of the same training; through Slurm
on emulated hosts beside local engines (:mod:`kit.tools.slurm_bench`, root only).

Every figure is the median of ``repeats`` repetitions, interleaved (single process, two workers,
single process, ...) so that a slow spell of the machine hits all variants alike. Results go to
``bench.json`` and a printed table; the goals are the project's (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from ..core.errors import KitError, OptionError
from ..core.files import write_atomic
from .cells import lesson


GOALS = {
    "efficiency_512": (">=", 0.9), "efficiency_64": (">=", 0.6),
    "efficiency_512_tuned": (">=", 0.9), "efficiency_64_tuned": (">=", 0.6), "ready_s": ("<=", 10.0),
    "isolation_cost_s": ("<=", 1.0), "recovery_s": ("<=", 30.0), "pss_total_mb": ("<=", 2048.0), "uss_worker_mb": ("<=", 500.0),
    "notebook_max_s": ("<=", 120.0), "efficiency_64_fastest": (">=", 0.4),
    "first_step_behind_plain_s": ("<=", 1.0),
}
#: Every variant the throughput section can measure, in the order of the table; "fastest" is the best
#: two-worker one. Efficiency = a two-worker variant's examples/s ÷ the single process's. Each runs a lesson's
#: own code (its cells tagged ``lesson``, what ``kit export`` writes): see :data:`LESSONS`.
VARIANTS = ("single", "2 alone", "2 workers", "2 workers tuned", "2 Horovod", "2 Horovod fp16", "jax single", "2 jax")
#: The lesson each variant trains with.
LESSONS = {"single": "01-single-vs-multi-worker", "2 alone": "01-single-vs-multi-worker",
           "2 workers": "01-single-vs-multi-worker", "2 workers tuned": "08-scaling-experiments",
           "2 Horovod": "09-horovod", "2 Horovod fp16": "09-horovod", "jax single": "12-keras3-jax",
           "2 jax": "12-keras3-jax"}
#: The ceiling: two processes that each train the model on their own data on the same cores, with no all-reduce
#: (the sum of their examples/s). A two-worker variant's share of it says what the all-reduce costs, apart from
#: what two processes can do on these cores at all.
CEILING = "2 alone"
#: variant → the key of its efficiency in a report row
EFFICIENCY_KEYS = {"2 workers": "efficiency", "2 workers tuned": "efficiency_tuned",
                   "2 Horovod": "efficiency_horovod", "2 Horovod fp16": "efficiency_horovod_fp16",
                   "2 jax": "efficiency_jax"}




class MemorySampler:
    """Samples USS/PSS of some processes in a thread; keeps the peaks."""

    def __init__(self, pids: list[int], kernel_pid: int, period: float = 0.5):
        self.procs = [psutil.Process(p) for p in pids]
        self.kernel = psutil.Process(kernel_pid)
        self.period = period
        self.peak_uss = {p.pid: 0.0 for p in self.procs}
        self.peak_pss_total = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            total = 0.0
            for proc in [self.kernel, *self.procs]:
                try:
                    info = proc.memory_full_info()
                except psutil.NoSuchProcess:
                    continue  # a worker that finished: its last sample stays
                total += info.pss
                if proc.pid in self.peak_uss:
                    self.peak_uss[proc.pid] = max(self.peak_uss[proc.pid], info.uss)
            self.peak_pss_total = max(self.peak_pss_total, total)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


#: The tuned two-worker run (notebook 08, section 8): gradients summed in float16, ten steps per call.
TUNED = {"allreduce": "float16", "steps_per_execution": 10}


def alone(train: Callable, *args: Any, **kwargs: Any) -> Any:
    """On a task: ``train`` with this task as the only worker of its cluster (its TF_CONFIG cut to itself)."""
    config = json.loads(os.environ["TF_CONFIG"])
    me = config["cluster"][config["task"]["type"]][config["task"]["index"]]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [me]}, "task": {"type": "worker", "index": 0}})
    return train(*args, **kwargs)


def tuned(train: Callable, load_mnist: Callable, half_precision_allreduce: Callable, trial: dict[str, Any],
          mnist_path: str, callbacks: list) -> Any:
    """On a task: notebook 08's ``train`` of one planned trial with its float16 all-reduce (its section 8)."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return train(strategy, trial, load_mnist(mnist_path), callbacks, half_precision_allreduce(tf.keras.optimizers.SGD))


def variant_call(variant: str, batch: int, epochs: int, steps: int, data: str) -> tuple[Any, tuple, int]:
    """The cluster, the run's function and arguments, and the global batch of one sample of ``variant``."""
    from ..core.cluster import TFCluster
    if variant not in VARIANTS:
        raise OptionError("variant", f"{variant!r} is unknown", f"use one of {', '.join(VARIANTS)}")
    if steps * 2 * batch > 60_000 and LESSONS[variant] in ("08-scaling-experiments", "12-keras3-jax"):  # no repeat
        raise OptionError("steps", f"{steps} x {2 * batch} examples: 08 and 12 take MNIST's 60,000 once", f"use at most {60_000 // (2 * batch)}")
    if LESSONS[variant] == "08-scaling-experiments":  # its float16 sum is in cells tagged "training" only
        code = lesson(LESSONS[variant], "training")
        trial = code["plan"](2, batch, "none", False, base_lr=0.001, base_batch=64, examples=epochs * steps * 2 * batch,
                             epochs=epochs, warmup_fraction=0.0, eval_examples=0, seed=42)
        return TFCluster(workers=2), (tuned, code["train"], code["load_mnist"], code["half_precision_allreduce"],
                                      {**trial, **TUNED}, data), 2 * batch
    train = lesson(LESSONS[variant])["train"]
    if variant == "single":
        return TFCluster(workers=1), (train, 2 * batch, epochs, steps, data, 42), 2 * batch
    if variant == "2 workers":
        return TFCluster(workers=2), (train, batch, epochs, steps, data, 42), 2 * batch
    if variant == CEILING:
        return TFCluster(workers=2), (alone, train, batch, epochs, steps, data, 42), batch
    if "Horovod" in variant:  # 09's steps_per_epoch is one process's: each of the ranks runs its share
        from ..core.horovod import HorovodCluster
        compression = "fp16" if "fp16" in variant else "none"
        return HorovodCluster(workers=2), (train, batch, epochs, 2 * steps, 0.001, 60000, data, None, compression, 42), \
            2 * batch
    from ..core.keras_jax import JaxCluster  # 12's train takes the global batch and the examples of an epoch
    return JaxCluster(workers=1 if variant == "jax single" else 2), (train, 2 * batch, epochs, steps * 2 * batch,
                                                                      0.001, 42, data), 2 * batch


def measure_variant(variant: str, batch: int, epochs: int, steps: int, memory: bool = False) -> dict[str, Any]:
    """Examples/s of one sample of one variant (see :data:`VARIANTS`) at ``batch`` per worker (one process: the
    global batch of two), as ``kit.Progress`` measures it on the first task (summed over the tasks for
    :data:`CEILING`), on a fresh cluster; with ``memory``, the peak memory of the run."""
    from ..train.data import mnist_path
    from ..train.progress import Progress

    cluster, call, global_batch = variant_call(variant, batch, epochs, steps, str(mnist_path()))
    with cluster:
        sampler = MemorySampler([t.pid for t in cluster.tasks], os.getpid()) if memory else None
        with sampler or contextlib.nullcontext():
            cluster.with_options(stream=False).run(*call, callbacks=[Progress(global_batch)])
        measured = [m["examples_per_second"] for m in cluster.last_view.measurements().values()]
    row = {"examples_per_second": sum(measured) if variant == CEILING else measured[0], "lesson": LESSONS[variant]}
    if sampler:
        row["uss_worker_mb"] = max(sampler.peak_uss.values()) / 2**20
        row["pss_total_mb"] = sampler.peak_pss_total / 2**20
    return row


def recovery_time(seed: int) -> float:
    """Seconds from a SIGKILL of worker:1 to the first training step after the resume."""
    from .fault_trials import kill_trial

    with tempfile.TemporaryDirectory(prefix="kit-bench-") as run_dir:
        row = kill_trial(run_dir, {"workers": 2}, "worker:1", kill_step=15 + seed % 10, epochs=2,
                         steps_per_epoch=20, save_freq=10)
    if not row["completed_exactly"] or row["processes_left"]:
        raise KitError(f"recovery trial went wrong: {row}", fix="run kit faults --trials 1 "
                       "and read its rows: a trial must complete exactly once and leave no processes")
    return row["kill_to_first_step_s"]


def notebook_times(notebooks: list[Path]) -> dict[str, float]:
    """Wall time of each notebook at its default parameters, run as nbval runs it (nbclient, which
    lets cells tagged ``raises-exception`` raise), in a temporary folder."""
    import nbformat
    from nbclient import NotebookClient

    from ..core.view import text_in_kernels_started_here

    times = {}
    with tempfile.TemporaryDirectory(prefix="kit-bench-nb-") as out, text_in_kernels_started_here():
        for nb_path in notebooks:
            notebook = nbformat.read(nb_path, as_version=4)
            start = time.perf_counter()
            NotebookClient(notebook, kernel_name="python3", resources={"metadata": {"path": out}}).execute()
            times[nb_path.stem] = time.perf_counter() - start
    return times


SECTIONS = ("throughput", "ready", "launch", "slurm", "recovery", "notebooks", "links")


def run(repeats: int = 3, batches: tuple[int, ...] = (64, 256, 512), epochs: int = 2, steps: int = 30,
        notebooks: bool = True, log: Callable[[str], None] = print,
        save: Callable[[dict], None] = lambda report: None,
        sections: tuple[str, ...] = SECTIONS, variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    """Every figure of the benchmark (or those of ``sections``); see the module docstring.
    ``save(report)`` is called after each section, so that a failure later on keeps what was measured.
    ``variants`` chooses what the throughput section measures (the Horovod ones are left out, with a
    note, where Horovod is not installed)."""
    from ..core import limits
    from ..core.horovod import horovod_version

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise OptionError("variants", f"{unknown[0]!r} is unknown", f"use some of {', '.join(VARIANTS)}")
    if horovod_version() is None and any("Horovod" in v for v in variants):
        log("Horovod is not installed here (make horovod): its variants are left out")
        variants = tuple(v for v in variants if "Horovod" not in v)

    report: dict[str, Any] = {"machine": {"cores": limits.read().cores, "python": sys.version.split()[0]},
                              "repeats": repeats, "epochs": epochs, "steps_per_epoch": steps}
    efficiency = {}
    for batch in batches if "throughput" in sections else ():
        samples: dict[str, list[float]] = {v: [] for v in variants}
        memory = []
        for rep in range(repeats):  # interleaved
            for variant in variants:
                row = measure_variant(variant, batch, epochs, steps, memory=(batch == 64 and variant == "2 workers"))
                samples[variant].append(row["examples_per_second"])
                if "pss_total_mb" in row:
                    memory.append(row)
            log(f"batch {batch}/worker rep {rep + 1}: " +
                ", ".join(f"{k} {v[-1]:.0f} ex/s" for k, v in samples.items()))
        medians = {k: statistics.median(v) for k, v in samples.items()}
        singles = [medians[k] for k in ("single",) if k in medians]
        efficiency[batch] = {"examples_per_second": medians, "samples": samples}
        if singles:
            reference = max(singles)
            for variant, key in EFFICIENCY_KEYS.items():
                if variant in medians:
                    efficiency[batch][key] = medians[variant] / reference
        if CEILING in medians:
            efficiency[batch]["of_ceiling"] = {v: medians[v] / medians[CEILING] for v in EFFICIENCY_KEYS if v in medians}
        if memory:
            report["memory"] = {"uss_worker_mb": statistics.median(m["uss_worker_mb"] for m in memory),
                                "pss_total_mb": statistics.median(m["pss_total_mb"] for m in memory),
                                "measured_at": "2 workers training, 64 per worker; PSS of this "
                                               "process (the 'kernel') plus both workers"}
        report["throughput"] = efficiency
        save(report)
    for name in ("ready", "launch"):  # start-up: kit.tools.launch_bench
        if name in sections:
            from . import launch_bench
            getattr(launch_bench, f"{name}_section")(report, log, repeats)
            save(report)
    if "recovery" in sections:
        report["recovery_samples"] = [recovery_time(seed) for seed in range(repeats)]
        report["recovery_s"] = statistics.median(report["recovery_samples"])
        log(f"recovery: {report['recovery_s']:.1f}s")
        save(report)
    if "links" in sections:  # emulated links between hosts (root only): kit.tools.link_bench
        from .link_bench import section
        section(report, log)
        save(report)
    if "slurm" in sections:  # through Slurm on emulated hosts (root only): kit.tools.slurm_bench
        from . import slurm_bench
        slurm_bench.section(report, log, repeats)
        save(report)
    if notebooks and "notebooks" in sections:
        from .export import notebooks_dir

        report["notebooks_s"] = notebook_times(sorted(notebooks_dir().glob("[0-9][0-9]*-*.ipynb")))
        log(f"notebooks: {report['notebooks_s']}")
    report["goals"] = check_goals(report)
    return report


def check_goals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Where each goal stands: the measured value, the target, met or not."""
    values = {}
    throughput = report.get("throughput", {})
    for batch in (512, 64):
        row = throughput.get(batch) or throughput.get(str(batch))
        for suffix in ("", "_tuned"):
            if row and f"efficiency{suffix}" in row:
                values[f"efficiency_{batch}{suffix}"] = row[f"efficiency{suffix}"]
        measured = [row[key] for key in EFFICIENCY_KEYS.values() if row and key in row]
        if batch == 64 and measured:
            values["efficiency_64_fastest"] = max(measured)
    for key in ("ready_s", "recovery_s"):
        if key in report:
            values[key] = report[key]
    if "launch" in report:
        values["first_step_behind_plain_s"] = report["launch"]["first_step_behind_plain_s"]
    if "ready_s" in report and "ready_host_network_s" in report:
        values["isolation_cost_s"] = report["ready_s"] - report["ready_host_network_s"]
    for key in ("pss_total_mb", "uss_worker_mb"):
        if key in report.get("memory", {}):
            values[key] = report["memory"][key]
    if report.get("notebooks_s"):
        values["notebook_max_s"] = max(report["notebooks_s"].values())
    goals = {}
    for key, value in values.items():
        op, target = GOALS[key]
        goals[key] = {"value": value, "target": f"{op} {target:g}",
                      "met": value >= target if op == ">=" else value <= target}
    return goals


def format_report(report: dict[str, Any]) -> str:
    columns = [v for v in VARIANTS if any(v in row["examples_per_second"]
                                          for row in report.get("throughput", {}).values())]
    header = ["per-worker batch"]
    for variant in columns:
        header.append(variant)
        if variant in EFFICIENCY_KEYS:
            header.append("efficiency")
    lines = [" | ".join(header), "-|-".join("-" * len(h) for h in header)] if columns else []
    for batch, row in report.get("throughput", {}).items():
        cells = [f"{batch:>{len(header[0])}}"]
        for variant in columns:
            value = row["examples_per_second"].get(variant)
            cells.append(f"{value:>{len(variant)}.0f}" if value is not None else f"{'-':>{len(variant)}}")
            if variant in EFFICIENCY_KEYS:
                key = EFFICIENCY_KEYS[variant]
                cells.append(f"{row[key]:>10.2f}" if key in row else f"{'-':>10}")
        lines.append(" | ".join(cells))
    for batch, row in report.get("throughput", {}).items():
        if row.get("of_ceiling"):
            lines.append(f"{batch}/worker, share of the ceiling ({CEILING}: two processes, no all-reduce): " +
                         ", ".join(f"{v} {share:.2f}" for v, share in row["of_ceiling"].items()))
    lines += ["(each variant trains with a lesson's code: " + "; ".join(
        f"{', '.join(v for v in columns if LESSONS[v] == name)}: {name}" for name in dict.fromkeys(LESSONS[v] for v in columns))
        + "; tuned: " + ", ".join(f"{k}={v}" for k, v in TUNED.items()) + "; Horovod over Gloo, fp16: "
        "hvd.Compression.fp16; jax: Keras 3 on JAX, DataParallel; " + CEILING + ": two processes training alone "
        "at the same time, summed)", ""] if columns else []
    for key, goal in report.get("goals", {}).items():
        lines.append(f"{key:<21} {goal['value']:>10.2f}  goal {goal['target']:<8} "
                     f"{'met' if goal['met'] else 'NOT met'}")
    if "slurm" in report:
        for kind, marks in report["slurm"]["median"].items():
            lines.append(f"slurm start-up, {kind:<6} " + ", ".join(f"{m} {s:.1f}s" for m, s in marks.items()))
    if "slurm_skipped" in report:
        lines.append(f"slurm start-up: skipped, {report['slurm_skipped']}")
    for name, seconds in report.get("notebooks_s", {}).items():
        lines.append(f"notebook {name:<40} {seconds:>6.1f}s")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per figure (median; default 3)")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256, 512],
                        help="per-worker batches (default 64 256 512)")
    parser.add_argument("--steps", type=int, default=30,
                        help="steps per epoch (2 epochs; the first is warm-up; default 30)")
    parser.add_argument("--no-notebooks", dest="notebooks", action="store_false",
                        help="skip timing the notebooks")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="measure only these sections (default: all)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS, metavar="VARIANT",
                        help=f"what the throughput section measures (default all: {', '.join(VARIANTS)})")
    parser.add_argument("--out", default="out/bench", help="folder for bench.json (default out/bench)")
    parser.add_argument("--links-csv", default=None, metavar="FILE",
                        help="also write the links section's table there as CSV (with --only links: "
                             "OUT/links.csv by default; notebook 10 reads notebooks/results/links.csv)")


def run_from_args(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only == ["links"] and args.links_csv is None:
        args.links_csv = str(out / "links.csv")

    def save(report: dict) -> None:
        write_atomic(out / "bench.json", json.dumps(report, indent=1, default=str))  # saved after each section

    report = run(repeats=args.repeats, batches=tuple(args.batches), steps=args.steps,
                 notebooks=args.notebooks, save=save, sections=tuple(args.only),
                 variants=tuple(args.variants))
    save(report)
    if report.get("links") and args.links_csv:
        from .link_bench import save_csv
        save_csv(report["links"], args.links_csv)
        print(f"links table: {args.links_csv}")
    print(format_report(report))
    print(f"\nwritten: {out / 'bench.json'}")
    return 0
