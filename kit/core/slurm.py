"""The Slurm commands the kit runs for engines in Slurm jobs: ``squeue`` for the jobs' states, and ``srun`` steps
that remove an engine's own temporary folder (:func:`kit.core._remote.own_tmpdir`) on its node."""

from __future__ import annotations

import logging
import shlex
import subprocess
import time
from typing import NamedTuple

log = logging.getLogger("kit.core.slurm")

#: Bound on the cleanup steps of one stop, all of them together: a step on a running job's node starts in
#: ~0.2 s on the emulated cluster; a step on a free node waits at most its ``--immediate``.
CLEANUP_TIMEOUT_S = 20.0


class JobEngine(NamedTuple):
    """An engine in a Slurm job: the job, the node, the engine's pid there, and its own temporary folder."""
    job: str
    node: str
    pid: int
    folder: str


def squeue(jobs: list[str]) -> dict[str, tuple[str, str]] | None:
    """Job id → (state, reason) of ``jobs`` as ``squeue`` shows them (a finished job is absent); None if squeue
    failed, with a warning."""
    if not jobs:
        return {}
    shown = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T %r"], capture_output=True,
                           text=True, timeout=30)
    if shown.returncode != 0 and "Invalid job id" not in shown.stderr:
        log.warning("squeue failed (the jobs' states are unknown): %s", shown.stderr.strip())
        return None
    rows = (line.split(None, 2) + ["", ""] for line in shown.stdout.splitlines() if line.strip())
    return {job: (state, reason.strip()) for job, state, reason, *_ in rows}


def end_engines_and_remove_folders(engines: list[JobEngine], running: set[str]) -> None:
    """End each engine and remove its folder on its node, whether it is idle, busy in a collective or already
    gone: in a step of its own job while the job runs (``srun --jobid --overlap``), the folder first and then
    the engine (the engine's end ends the job, and the job's end its steps; and an engine cannot make files in a
    folder that is gone); after the job (or when it ended meanwhile), in a short job on the same node
    (``--immediate``: a node taken meanwhile is not waited for). The steps of a round run at once, bounded
    together by :data:`CLEANUP_TIMEOUT_S`; a failure is logged, and the next engine on that node removes the
    folder (:func:`kit.core._remote.own_tmpdir`)."""
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    failed = _round([(engine, engine.job in running) for engine in engines], deadline)
    # a job squeue showed running may have ended since (a killed engine's): its node, in a job of its own
    again = _round([(engine, False) for engine, in_job, _ in failed if in_job], deadline)
    for engine, _, error in [f for f in failed if not f[1]] + again:
        log.warning("srun could not remove %s on %s (the next engine there will): %s", engine.folder, engine.node,
                    error)


def _round(engines: list[tuple[JobEngine, bool]], deadline: float) -> list[tuple[JobEngine, bool, str]]:
    """One ``srun`` per engine, in its job or (False) in a new one on its node, all at once; the failed ones."""
    steps = []
    for engine, in_job in engines:
        command = f"rm -rf -- {shlex.quote(engine.folder)}; kill -9 {int(engine.pid)} 2>/dev/null; true"
        where = ([f"--jobid={engine.job}", "--overlap"] if in_job else
                 [f"--nodelist={engine.node}", f"--immediate={int(CLEANUP_TIMEOUT_S) // 4}",
                  "--job-name=kit-cleanup"])
        steps.append((engine, in_job, subprocess.Popen(
            ["srun", *where, "--nodes=1", "--ntasks=1", "sh", "-c", command],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    failed = []
    for engine, in_job, step in steps:
        try:
            _, error = step.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            step.kill()
            step.communicate()
            failed.append((engine, in_job, f"no answer within {CLEANUP_TIMEOUT_S:g} s"))
            continue
        if step.returncode:
            failed.append((engine, in_job, f"exit {step.returncode}: {error.strip()}"))
    return failed
