"""Start-up through Slurm beside local engines: ``kit bench --only slurm``.

Two kinds of ``TFCluster(workers=2)``, interleaved ``repeats`` times on one clock (``time.time()``; the emulated
hosts are network namespaces of this machine, so they share its clock):

- *local*: the kit's own engines on this machine (``TFCluster(workers=2)``, TensorFlow preloaded);
- *slurm*: ``TFCluster(workers=2, engines=ipp.Cluster(profile_dir=...))`` with the profile of
  ``docs/profiles/slurm`` installed as a user installs it (only the login node's address differs), on an
  emulated 2-node cluster (:class:`kit.tools.sim_cluster.SimCluster`) brought up once for the section: the kit
  submits one job per task, ``sbatch``/``srun`` start the engines on the nodes.

Each run records, for the slowest task, seconds from entering ``TFCluster`` to: ``started`` (``TFCluster.start``
returned: every engine registered and given its role), ``imported`` (TensorFlow imported on the task) and
``strategy`` (MultiWorkerMirroredStrategy built: the tasks have met). Engines from elsewhere do not preload
TensorFlow, so the Slurm runs import it after their start. Where no emulated cluster can be made (not root,
missing packages, no checkout with the profile), the section records why and measures nothing.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator


#: What each run records, in order (seconds from entering TFCluster, slowest task).
MARKS = ("started", "imported", "strategy")
KINDS = ("local", "slurm")
#: The queued-start bound of the Slurm runs, as tests/test_slurm_ssh.py gives it (a run here takes ~10 s).
START_TIMEOUT_S = 120
#: After stop(), how long the kit's jobs may stay in the queue (COMPLETING) and their engines on the nodes
#: before the next run; the tests see them gone within a few seconds.
CLEAR_TIMEOUT_S = 60


def strategy_marks() -> dict[str, float]:
    """On a task: import TensorFlow and build MultiWorkerMirroredStrategy; when each was done."""
    from ..train._tf import import_tensorflow
    from ..train.strategies import build_strategy

    import_tensorflow()
    imported = time.time()
    build_strategy("multi_worker_mirrored")
    return {"imported": imported, "strategy": time.time()}


def why_not() -> str | None:
    """Why this machine cannot run the section, naming the fix; None if it can."""
    from .sim_cluster import PROFILES, missing

    problems = missing()
    if not (PROFILES / "slurm" / "ipcluster_config.py").is_file():
        problems.append(f"the Slurm profile {PROFILES / 'slurm' / 'ipcluster_config.py'}: run from a checkout of the kit")
    return "an emulated cluster needs " + "; ".join(problems) if problems else None


@contextlib.contextmanager
def slurm_environment(slurm_conf: Path) -> Iterator[None]:
    """This process's environment while a Slurm run lasts: ``sbatch``, ``squeue`` and ``scancel`` (which
    ipyparallel and the kit call with it) talk to the emulated cluster, and the jobs (``sbatch`` exports it)
    find this Python first on PATH."""
    saved = {key: os.environ.get(key) for key in ("SLURM_CONF", "PATH")}
    os.environ["SLURM_CONF"] = str(slurm_conf)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def timed_start(engines: Any = None) -> dict[str, float]:
    """One run: enter ``TFCluster(workers=2, engines=engines)``, build the strategy on both tasks; the marks."""
    from ..core.cluster import TFCluster
    from ..core.errors import ExposedPortsWarning

    options = {} if engines is None else {"engines": engines, "start_timeout": START_TIMEOUT_S}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExposedPortsWarning)  # the Slurm tasks' ports: known, and on the bridge
        entered = time.time()
        with TFCluster(workers=2, **options) as cluster:
            started = time.time()
            marks = cluster.with_options(stream=False).run(strategy_marks)
    return {"started": round(started - entered, 3),
            **{m: round(max(task[m] for task in marks) - entered, 3) for m in ("imported", "strategy")}}


def wait_until_clear(sim: Any) -> None:
    """Bounded: no job left in the queue and no process but the daemons on the nodes, so that the next run
    starts from an idle cluster."""
    from .sim_state import wait_for

    wait_for(lambda: not sim.jobs(), CLEAR_TIMEOUT_S, "the kit's Slurm jobs to leave the queue after stop()",
             lambda: f"; squeue: {sim.jobs()}")
    wait_for(lambda: not sim.leftovers(), CLEAR_TIMEOUT_S, "the engines to end on every node after stop()",
             lambda: f"; processes left: {sim.leftovers()}")


def summarize(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """The section's record from each kind's runs: the runs, each mark's median, and how much later the
    Slurm runs had their strategy than the local ones (medians)."""
    median = {kind: {m: round(statistics.median(run[m] for run in done), 3) for m in MARKS}
              for kind, done in runs.items()}
    return {"runs": runs, "median": median,
            "slurm_behind_local_s": round(median["slurm"]["strategy"] - median["local"]["strategy"], 3)}


def measure(repeats: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Bring up the emulated cluster, run both kinds ``repeats`` times interleaved, bring it down."""
    import ipyparallel as ipp

    from .sim_cluster import SimCluster

    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="kit-bench-slurm-") as folder:
        sim = SimCluster(hosts=2, ssh=False)
        began = time.monotonic()
        try:
            sim.up()
            up_s = time.monotonic() - began
            for rep in range(repeats):
                runs["local"].append(timed_start())
                profile = sim.install_profile("slurm", Path(folder) / f"profile_kit-slurm-{rep}")
                with slurm_environment(sim.slurm_conf):
                    runs["slurm"].append(timed_start(ipp.Cluster(profile_dir=str(profile), log_level=40)))
                    wait_until_clear(sim)
                log(f"slurm rep {rep + 1}: " + "; ".join(
                    f"{kind} " + ", ".join(f"{m} {done[-1][m]:.1f}s" for m in MARKS) for kind, done in runs.items()))
        finally:
            sim.down()
    return {**summarize(runs), "hosts": 2, "workers": 2, "sim_cluster_up_s": round(up_s, 2)}


def section(report: dict[str, Any], log: Callable[[str], None], repeats: int) -> None:
    """The bench's slurm section: ``report["slurm"]``, or ``report["slurm_skipped"]`` saying why."""
    why = why_not()
    if why:
        log(f"slurm: skipped, {why}")
        report["slurm_skipped"] = why
        return
    report["slurm"] = measured = measure(repeats, log)
    for kind, marks in measured["median"].items():
        log(f"slurm, {kind:5s} (median): " + ", ".join(f"{m} {s:.1f}s" for m, s in marks.items()))
    log(f"slurm: strategy built {measured['slurm_behind_local_s']:+.1f}s after the local engines'")
