"""Run a lesson's exported ``main.py`` the way a cluster runs a job: plain processes, no kit.

    script = export("01-single-vs-multi-worker", tmp_path)
    results = run_tasks(script, {"worker": 2}, ["--epochs", "2"])   # one JSON result per task, in order

Each process gets its own ``TF_CONFIG`` (ports picked free on loopback just before), one thread pool each
(two processes on two cores), and a bound; every process is killed and reaped whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kit.core.tfconfig import free_port
from kit.tools.export import export as write_script

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
MNIST = str(REPO / "kit" / "train" / "datasets" / "mnist.npz")
#: What every plain task gets: quiet TensorFlow, one thread pool per process (as the kit's engines on 2 cores).
PLAIN_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
             "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def export(notebook: str, folder: Path) -> Path:
    """``kit export`` of ``notebooks/<notebook>*.ipynb`` into ``folder``; the path of main.py."""
    (path,) = NOTEBOOKS.glob(f"{notebook}*.ipynb")
    written = write_script(path, folder)
    return written[0]


def tf_configs(shape: dict[str, int]) -> list[dict]:
    """One TF_CONFIG per task of ``shape`` ({"chief": 1, "worker": 2, "ps": 1}), on loopback ports."""
    cluster = {kind: [f"127.0.0.1:{free_port('127.0.0.1')}" for _ in range(n)] for kind, n in shape.items()}
    return [{"cluster": cluster, "task": {"type": kind, "index": i}}
            for kind, n in shape.items() for i in range(n)]


class Tasks:
    """Plain processes of one job; :meth:`wait` bounds them, :meth:`stop` kills what is left."""

    def __init__(self, script: Path, configs: list[dict], args: list[str], env: dict | None = None,
                 logs: Path | None = None, python: str = sys.executable):
        self.script, self.configs, self.python = script, configs, python
        self.logs = logs or script.parent
        self.procs: list[subprocess.Popen] = []
        for config in configs:
            self.procs.append(self._start(config, args, env))

    def name(self, i: int) -> str:
        task = self.configs[i]["task"]
        return f"{task['type']}:{task['index']}"

    def _start(self, config: dict, args: list[str], env: dict | None) -> subprocess.Popen:
        task = config["task"]
        log = open(self.logs / f"{task['type']}-{task['index']}.log", "ab")
        # a temporary folder of its own: what a SIGKILLed task leaves there (TensorFlow's AutoGraph modules) goes
        # with the test's folder, not into the machine's /tmp
        tmpdir = self.logs / f"tmp-{task['type']}-{task['index']}"
        tmpdir.mkdir(exist_ok=True)
        environment = {**os.environ, **PLAIN_ENV, **(env or {}), "TF_CONFIG": json.dumps(config), "TMPDIR": str(tmpdir)}
        for name in ("KIT_TASK", "TF_USE_LEGACY_KERAS"):  # main.py chooses its Keras itself, as in a learner's shell
            environment.pop(name, None)
        try:
            return subprocess.Popen([self.python, str(self.script), *args], cwd=self.script.parent,
                                    env=environment, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        finally:
            log.close()

    def restart(self, i: int, args: list[str], env: dict | None = None) -> None:
        """Start task ``i`` again (after it exited or was killed), as a cluster manager would."""
        self.procs[i] = self._start(self.configs[i], args, env)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        os.killpg(self.procs[i].pid, sig)
        self.procs[i].wait(timeout=30)

    def wait(self, timeout: float, only: list[int] | None = None) -> list:
        """Each awaited task's result (the last line of its output, as JSON); a task that fails or outlives
        ``timeout`` raises, naming it, with the end of its log."""
        deadline = time.monotonic() + timeout
        results = []
        for i in only if only is not None else range(len(self.procs)):
            proc = self.procs[i]
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{self.name(i)} still running after {timeout:.0f}s:\n{self.log(i)}") from None
            if proc.returncode != 0:
                raise AssertionError(f"{self.name(i)} exited with {proc.returncode}:\n{self.log(i)}")
            lines = out.decode().strip().splitlines()
            assert lines, f"{self.name(i)} printed no result:\n{self.log(i)}"
            results.append(json.loads(lines[-1]))
        return results

    def log(self, i: int, lines: int = 30) -> str:
        task = self.configs[i]["task"]
        text = (self.logs / f"{task['type']}-{task['index']}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()

    def __enter__(self) -> "Tasks":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_tasks(script: Path, shape: dict[str, int], args: list[str], timeout: float = 300,
              env: dict | None = None, python: str = sys.executable) -> list:
    """Run ``script`` once per task of ``shape`` (with ``python``) and return every task's result, in task order."""
    with Tasks(script, tf_configs(shape), args, env, python=python) as tasks:
        return tasks.wait(timeout)
