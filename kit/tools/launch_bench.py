"""Start-up beside a plain launch: ``kit bench --only launch``.

The same training (notebook 01's lesson, its ``train``: 3 epochs x 70 steps at 64 per worker) launched two ways,
interleaved, on one clock (``time.time()``):

- *plain*: ``workers`` ``python`` processes with TF_CONFIG, as TensorFlow's tutorial starts them
  (``python main.py &``), each in the same kind of private network namespace the kit's tasks get, with
  the environment the kit gives its tasks (threads, Keras choice, malloc arenas);
- *kit*: ``with kit.TFCluster(workers=...) as cluster: cluster.run(train, ...)``.

Each run reports, per worker, seconds from the launch (the ``Popen`` calls; entering ``TFCluster``)
to TensorFlow imported (with tf-keras, on the kit's preloading engines), to ``fit`` beginning (the strategy
built, the workers met, the model compiled), to the end of the first training step, and to the last one. The goal
(docs/performance.md): the kit's first step within 1 s of the plain launch's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..core.errors import KitError

#: What the probe records on each worker, in order.
MARKS = ("imported", "fit_begins", "first_step", "last_step", "returned")
LESSON = "01-single-vs-multi-worker"


def probe(train: Callable, per_worker_batch: int = 64, epochs: int = 3, steps_per_epoch: int = 70, seed: int = 1,
          mnist_path: str | None = None) -> dict[str, Any]:
    """On a task: import TensorFlow, then run the lesson's ``train`` with a callback that marks when ``fit`` begins,
    its first and its last step; return when each of :data:`MARKS` was passed, with the losses. MNIST: the kit's
    copy unless ``mnist_path`` says otherwise."""
    from ..train._tf import import_tensorflow
    from ..train.data import mnist_path as bundled

    tf = import_tensorflow()
    marks = {"imported": time.time()}

    class Marks(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            marks["fit_begins"] = time.time()

        def on_train_batch_end(self, batch, logs=None):
            marks.setdefault("first_step", time.time())
            marks["last_step"] = time.time()

    history = train(per_worker_batch, epochs, steps_per_epoch, str(bundled(mnist_path)), seed, callbacks=[Marks()])
    marks["returned"] = time.time()
    return {"marks": marks, "loss": history["loss"]}


def _lesson_train() -> Callable:
    from .cells import lesson

    return lesson(LESSON)["train"]


def plain_main() -> None:
    """A plain worker: the probe, its result as one JSON line on stdout (the last)."""
    print(json.dumps(probe(_lesson_train(), **json.loads(os.environ["KIT_PROBE_ARGS"]))), flush=True)


def plain_launch(workers: int = 2, **kwargs: Any) -> list[dict[str, float]]:
    """``workers`` plain processes with TF_CONFIG on 127.0.0.1, in a private network namespace."""
    from ..core import roles, tfconfig
    from ..core.options import ClusterOptions
    from ..core.plain import PlainProcesses

    ports = tfconfig.free_ports(workers)  # free here; the new namespace has none in use
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    options = ClusterOptions(workers=workers)  # the environment the kit gives its tasks (threads, Keras, arenas)
    # each worker's stderr (TensorFlow's C++ start-up lines: oneDNN, cuInit) goes to its log, not the bench's output
    with PlainProcesses() as plain, tempfile.TemporaryDirectory(prefix="kit-launch-bench-") as logs:
        launched = time.time()
        procs = []
        for i in range(workers):
            with open(Path(logs) / f"worker-{i}.log", "w") as log:
                procs.append(plain.popen(["kit.tools.launch_bench", "--worker"], stdout=subprocess.PIPE,
                                         stderr=log, text=True, env={
                                             **roles.task_environment(options, f"worker:{i}"),
                                             "TF_CONFIG": tfconfig.dumps(tfconfig.build(cluster, f"worker:{i}")),
                                             "KIT_PROBE_ARGS": json.dumps(kwargs)}))
        results = []
        for i, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                tail = "".join((Path(logs) / f"worker-{i}.log").read_text(errors="replace").splitlines(True)[-20:])
                raise KitError(f"plain worker:{i} exited with {proc.returncode}; the end of its log:\n{tail}",
                               fix="run it alone: python -m kit.tools.launch_bench --worker, with TF_CONFIG set")
            results.append(json.loads(out.strip().splitlines()[-1]))
    return [_since(launched, r["marks"]) for r in results]


def kit_launch(workers: int = 2, preload: bool = True, **kwargs: Any) -> list[dict[str, float]]:
    """The same training through ``kit.TFCluster(workers=..., preload=...).run``."""
    from ..core.cluster import TFCluster

    launched = time.time()
    with TFCluster(workers=workers, preload=preload) as cluster:
        results = cluster.with_options(stream=False).run(probe, _lesson_train(), **kwargs)
    return [_since(launched, r["marks"]) for r in results]


def _since(launched: float, marks: dict[str, float]) -> dict[str, float]:
    return {name: round(marks[name] - launched, 3) for name in MARKS}


def compare(repeats: int = 3, workers: int = 2, **kwargs: Any) -> dict[str, Any]:
    """Plain and kit launches, interleaved ``repeats`` times; each mark's median over runs of the
    slowest worker, and the kit's first step behind the plain one's."""
    runs: dict[str, list[list[dict[str, float]]]] = {"plain": [], "kit": []}
    for _ in range(repeats):
        runs["plain"].append(plain_launch(workers, **kwargs))
        runs["kit"].append(kit_launch(workers, **kwargs))
    medians = {how: {mark: statistics.median(max(w[mark] for w in run) for run in done) for mark in MARKS}
               for how, done in runs.items()}
    return {"runs": runs, "median": medians,
            "first_step_behind_plain_s": round(medians["kit"]["first_step"] - medians["plain"]["first_step"], 3)}


def _ready_replicas() -> int:
    """Build MultiWorkerMirroredStrategy and run its first all-reduce (a first step's communication);
    return the replicas it summed over."""
    from ..train._tf import import_tensorflow
    from ..train.strategies import build_strategy

    tf = import_tensorflow()
    strategy = build_strategy("multi_worker_mirrored")
    return int(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))


def time_to_ready(workers: int = 2, isolation: str = "auto") -> float:
    """Seconds from entering TFCluster to a MultiWorkerMirroredStrategy constructed on every worker
    and its first all-reduce done. ``isolation="none"``: the tasks on the host's network."""
    import warnings

    from ..core.cluster import TFCluster
    from ..core.errors import ExposedPortsWarning

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExposedPortsWarning)  # asked for: the comparison needs it
        with TFCluster(workers=workers, isolation=isolation) as cluster:
            replicas = cluster.with_options(stream=False).run(_ready_replicas)
            ready = time.perf_counter() - start
    if replicas != [workers] * workers:
        raise KitError(f"the first all-reduce summed {replicas} replicas, not {workers} on each worker",
                       fix="run the start-up test (pytest tests/test_cluster.py) and read its failure")
    return ready


def ready_section(report: dict[str, Any], log: Callable[[str], None], repeats: int) -> None:
    """``kit bench --only ready``: time to a strategy ready, private network and host network, interleaved."""
    ready: dict[str, list[float]] = {"auto": [], "none": []}
    for _ in range(repeats):
        for isolation, samples in ready.items():
            samples.append(time_to_ready(isolation=isolation))
    report["ready_s"], report["ready_samples"] = statistics.median(ready["auto"]), ready["auto"]
    report["ready_host_network_s"] = statistics.median(ready["none"])
    report["ready_host_network_samples"] = ready["none"]
    log(f"ready: {report['ready_s']:.1f}s in the private network, "
        f"{report['ready_host_network_s']:.1f}s on the host's network")


def launch_section(report: dict[str, Any], log: Callable[[str], None], repeats: int) -> None:
    """``kit bench --only launch``: the first and last steps beside a plain launch (:func:`compare`)."""
    report["launch"] = launched = compare(repeats)
    for how, marks in launched["median"].items():
        log(f"launch, {how:5s}: " + ", ".join(f"{mark} {seconds:.1f}s" for mark, seconds in marks.items()))
    log(f"launch: the kit's first step {launched['first_step_behind_plain_s']:+.1f}s after the plain launch's")


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        plain_main()
    else:
        print(json.dumps(compare(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 1), indent=1))
