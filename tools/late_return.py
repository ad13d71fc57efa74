"""How late ``fit`` returns after its last step: two plain ``python`` workers, with and without the kit's fix.

    python tools/late_return.py                      # 6 rounds of fix off/on x load off/on: 12 returns each
    python tools/late_return.py --rounds 2 --load on --fix on
    python tools/late_return.py --kit --load on --rounds 4     # on kit.TFCluster's engines, as the notebooks

Each run starts two workers (this file with ``--worker``) on 127.0.0.1 with TF_CONFIG and free ports; each
trains the tutorial's CNN under MultiWorkerMirroredStrategy, ``--epochs`` x ``--steps`` at ``--batch`` per
worker (3 x 70 x 64), on MNIST from ``kit.train.data.load_mnist`` through the notebooks' pipeline
(``from_tensor_slices(...).shuffle(60000).repeat().batch(...).map(scale)``). A worker times, with ``perf_counter``, its last step
(``on_train_batch_end``), ``on_train_end`` and ``fit``'s return, and reports examples/s over the epochs
after the first (``kit.train.progress.callback``). "fix on": the worker calls
``kit.core.tfdata_wakeup.install()`` before it imports TensorFlow (what the kit's engines do); the
alternatives: "user", ``options.autotune.enabled = False`` on the training dataset only; "debug",
``tf.data.experimental.enable_debug_mode()`` before any dataset. "load on":
one busy-looping process (``while True: pass``) runs beside the workers, as on Binder's one CPU. ``--kit``
runs the same training on ``kit.TFCluster(workers=2)``'s engines and also reports the kit's own measure,
``view.lags()``, from each task's last progress report to its result reaching this process.

A round runs every chosen condition once, in turn, so that the machine's own load falls on all alike. The
machine's load is measured, not assumed: for each run, the CPU time the whole machine spent (``/proc/stat``)
less what this tool and its children spent, as cores (``other cores``); 0 means a quiet machine.
Prints one line per run and a table per condition: returns, the largest delay, how many exceed 2 s,
examples/s. ``--json PATH`` also writes every run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kit.core.tfconfig import free_ports

ROOT = Path(__file__).resolve().parent.parent
MARK = "LATE_RETURN "
#: A return later than this many seconds after the last step counts as late (the issue's goal).
LATE_SECONDS = 2.0
RUN_TIMEOUT_SECONDS = 600
#: off: TensorFlow as it is; on: the kit's fix; user: autotuning off on the training dataset only;
#: debug: tf.data's debug mode.
FIXES = ("off", "on", "user", "debug")


# ------------------------------------------------------------------------------------------- the worker

def train_and_time(fix: str, epochs: int, steps: int, batch: int, seed: int) -> dict:
    """On one TF task (a plain worker or a kit engine): train, and time the last step, ``on_train_end`` and
    ``fit``'s return (``perf_counter``)."""
    if fix == "on":
        from kit.core import tfdata_wakeup

        tfdata_wakeup.install()
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    if fix == "debug":
        tf.data.experimental.enable_debug_mode()
    import numpy as np

    from kit.core import tfdata_wakeup
    from kit.tools.cells import lesson
    from kit.train import data, progress

    tf.keras.utils.set_random_seed(seed)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = batch * strategy.num_replicas_in_sync
    (x_train, y_train), _ = data.load_mnist()  # the notebooks' (and the tutorial's) pipeline, scaled per batch
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train.astype(np.int64)))
    dataset = dataset.shuffle(60000, seed=seed).repeat().batch(global_batch)
    dataset = dataset.map(lambda x, y: (tf.cast(x, tf.float32) / 255, y))
    if fix == "user":
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.with_options(options)
    with strategy.scope():
        model = lesson("01-single-vs-multi-worker")["build_and_compile_cnn_model"]()  # the tutorial's CNN

    marks: dict[str, float] = {}

    class Marks(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marks["last_step"] = time.perf_counter()

        def on_train_end(self, logs=None):
            marks["train_end"] = time.perf_counter()

    measured = progress.callback(global_batch)
    model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[measured, Marks()])
    returned = time.perf_counter()
    return {
        "task": int(json.loads(os.environ["TF_CONFIG"])["task"]["index"]),
        "after_train_end": returned - marks["train_end"],
        "after_last_step": returned - marks["last_step"],
        "examples_per_second": measured.summary()["examples_per_second"],
        "patched": tfdata_wakeup.installed(),
        "tensorflow": tf.__version__,
    }


def worker(args: argparse.Namespace) -> None:
    """A plain worker: print :func:`train_and_time`'s report as one JSON line (read by :func:`run_once`)."""
    report = train_and_time(args.fix, args.epochs, args.steps, args.batch, args.seed)
    print(MARK + json.dumps(report), flush=True)


# ------------------------------------------------------------------------------------------- the driver

def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``, all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds this process and its reaped children have used."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_once(args: argparse.Namespace, fix: str, load: str) -> dict:
    """Two workers (and a busy loop when ``load == "on"``): their reports and the machine's other load."""
    if args.kit:
        return run_on_kit(args, fix, load)
    ports = free_ports(2, "127.0.0.1")
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    env.pop("KIT_TFDATA_AUTOTUNE", None)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--fix", fix, "--epochs", str(args.epochs), "--steps", str(args.steps), "--batch",
               str(args.batch), "--seed", str(args.seed)]
    busy0, own0, wall0 = busy_cpu_seconds(), own_cpu_seconds(), time.monotonic()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "on" else None
    workers = []
    try:
        for index in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            workers.append(subprocess.Popen(command, env=dict(env, TF_CONFIG=tf_config), cwd=ROOT,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [w.communicate(timeout=RUN_TIMEOUT_SECONDS) for w in workers]
    finally:
        for process in [*workers, *([hog] if hog else [])]:
            if process.poll() is None:
                process.kill()
            process.wait()
    wall = time.monotonic() - wall0
    other = max(0.0, (busy_cpu_seconds() - busy0) - (own_cpu_seconds() - own0)) / wall
    reports = []
    for process, (out, err) in zip(workers, outputs):
        lines = [line for line in out.splitlines() if line.startswith(MARK)]
        if process.returncode != 0 or not lines:
            tail = "\n".join(err.strip().splitlines()[-15:])
            raise SystemExit(f"a worker failed (exit {process.returncode}):\n{tail}\nFix: run one worker by "
                             "hand with the same TF_CONFIG to see the whole error")
        reports.append(json.loads(lines[-1][len(MARK):]))
    return {"fix": fix, "load": load, "wall_seconds": wall, "other_cores": other,
            "workers": sorted(reports, key=lambda r: r["task"])}


def run_on_kit(args: argparse.Namespace, fix: str, load: str) -> dict:
    """The same training on a ``kit.TFCluster(workers=2)`` (the engines the notebooks use); each worker's
    report also holds ``lag``, the kit's seconds from its last progress report to its result
    (``view.lags()``, what notebook 01 prints). Fix "off" asks the engines to keep autotuning
    (``KIT_TFDATA_AUTOTUNE=1``); ``patched`` says whether the fix was in place all the same."""
    import kit

    env = {"KIT_TFDATA_AUTOTUNE": "1"} if fix != "on" else {}
    busy0, own0, wall0 = busy_cpu_seconds(), own_cpu_seconds(), time.monotonic()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "on" else None
    try:
        with kit.TFCluster(workers=2, env=env) as cluster:
            reports = cluster.with_options(stream=False).run(train_and_time, fix, args.epochs,
                                                             args.steps, args.batch, args.seed)
            lags = cluster.last_view.lags()
    finally:
        if hog:
            hog.kill()
            hog.wait()
    wall = time.monotonic() - wall0
    # the engines are not all children of this process: their CPU may count as "other" here
    other = max(0.0, (busy_cpu_seconds() - busy0) - (own_cpu_seconds() - own0)) / wall
    for report in reports:
        report["lag"] = lags.get(f"worker:{report['task']}")
    return {"fix": fix, "load": load, "wall_seconds": wall, "other_cores": other,
            "workers": sorted(reports, key=lambda r: r["task"]), "kit": True}


def summarize(runs: list[dict]) -> list[dict]:
    """One row per condition: returns, max and median delay, count late, examples/s, the machine's load."""
    rows = []
    for fix, load in sorted({(r["fix"], r["load"]) for r in runs}, key=lambda c: (FIXES.index(c[0]), c[1])):
        chosen = [r for r in runs if (r["fix"], r["load"]) == (fix, load)]
        delays = [w["after_last_step"] for r in chosen for w in r["workers"]]
        rates = [w["examples_per_second"] for r in chosen for w in r["workers"] if w["examples_per_second"]]
        others = [r["other_cores"] for r in chosen]
        lags = [w["lag"] for r in chosen for w in r["workers"] if w.get("lag") is not None]
        rows.append({"fix": fix, "load": load, "returns": len(delays), "max_s": max(delays),
                     "max_lag_s": max(lags) if lags else None, "lags_over_2s": sum(g > LATE_SECONDS for g in lags),
                     "median_s": statistics.median(delays), "over_2s": sum(d > LATE_SECONDS for d in delays),
                     "examples_per_second": statistics.mean(rates) if rates else float("nan"),
                     "other_cores": f"{min(others):.2f}-{max(others):.2f}"})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=6, help="runs of each condition (2 returns each)")
    parser.add_argument("--fix", choices=(*FIXES, "both", "all"), default="both",
                        help="both: off and on; all: every variant")
    parser.add_argument("--load", choices=("off", "on", "both"), default="both")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--batch", type=int, default=64, help="examples per worker per step")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--kit", action="store_true",
                        help="train on kit.TFCluster(workers=2)'s engines instead of plain workers")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    fixes = {"both": ("off", "on"), "all": FIXES}.get(args.fix, (args.fix,))
    loads = ("off", "on") if args.load == "both" else (args.load,)
    runs = []
    for round_ in range(args.rounds):
        for load in loads:
            for fix in fixes:
                run = run_once(args, fix, load)
                runs.append(run)
                delays = " ".join(f"{w['after_train_end']:.2f}/{w['after_last_step']:.2f}" for w in run["workers"])
                rates = " ".join(f"{w['examples_per_second']:.0f}" for w in run["workers"])
                if args.kit:
                    delays += "; kit lags " + " ".join(f"{w['lag']:.2f}" for w in run["workers"] if w["lag"] is not None)
                if fix != "on" and any(w["patched"] for w in run["workers"]):
                    delays += " (the fix was in place all the same)"
                print(f"round {round_ + 1} fix {fix:5} load {load:3}: s after on_train_end/last step {delays}; "
                      f"examples/s {rates}; other cores {run['other_cores']:.2f}; wall {run['wall_seconds']:.0f} s",
                      flush=True)
                if args.json:
                    args.json.write_text(json.dumps(runs, indent=1) + "\n")
    where = "workers on kit.TFCluster's engines" if args.kit else "plain workers"
    print(f"\n{args.epochs} x {args.steps} steps at {args.batch} per worker, 2 {where}; "
          f"delay = seconds from the last step to fit's return" + ("; kit lag = view.lags()" if args.kit else ""))
    lag_head, lag_rule = (" max kit lag s | lags > 2 s |", "---|---|") if args.kit else ("", "")
    print(f"| fix | load | returns | max delay s | median s | > 2 s |{lag_head} examples/s | other cores |")
    print(f"|---|---|---|---|---|---|{lag_rule}---|---|")
    for row in summarize(runs):
        lag = f" {row['max_lag_s']:.2f} | {row['lags_over_2s']} |" if args.kit and row["max_lag_s"] is not None else ""
        print(f"| {row['fix']} | {row['load']} | {row['returns']} | {row['max_s']:.2f} | {row['median_s']:.2f} | "
              f"{row['over_2s']} |{lag} {row['examples_per_second']:.0f} | {row['other_cores']} |")


if __name__ == "__main__":
    main()
