"""Notebook 11 (the kit on Slurm and over SSH) runs live on an emulated cluster, and without one from its saved run.

`make notebooks` and `make binder` leave it out of nbval (the Makefile's NOT_ON_BINDER; its metadata
``kit.not_on_binder`` says why): live, it starts Slurm's and sshd's daemons and network namespaces as root,
which do not belong in Binder's memory-limited cgroup. Here papermill runs it, as ``kit sweep`` runs notebooks:
live as root (on CI it must, as tests/test_slurm_ssh.py), and with ``LIVE=False``, as a learner without root
meets it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from kit.tools import sim_cluster, sim_state
from kit.tools.experiments import ipc_kernels

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "11-your-own-cluster.ipynb"
SAVED = REPO / "notebooks" / "results" / "11-your-own-cluster.json"
CELL_TIMEOUT = 420  # seconds for one cell: above JOB_TIMEOUT (300 s), the bound of step 5's sbatch job (123 s, and the
#                    SSH step 110 s, on 2 cores beside other engineers' runs)
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb"))


def execute(parameters: dict, out: Path) -> dict:
    """Run notebook 11 with papermill (its kernel on unix sockets), in notebooks/ as Jupyter would."""
    import papermill

    with ipc_kernels() as kernels:
        papermill.execute_notebook(str(NOTEBOOK), str(out), parameters=parameters, cwd=str(REPO / "notebooks"),
                                   kernel_name="python3", progress_bar=False, execution_timeout=CELL_TIMEOUT,
                                   **kernels)
    return json.loads(out.read_text())


def printed(notebook: dict) -> str:
    """Every stream the executed notebook's cells printed, in order."""
    return "".join("".join(o.get("text", "")) for c in notebook["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def check_cells(notebook: dict) -> list[dict]:
    return [c for c in notebook["cells"] if "check" in c.get("metadata", {}).get("tags", [])]


def check_saved_run(shown: dict) -> None:
    """What any run of notebook 11 records: one task per host, equal losses, the resolver's too, no job left."""
    hosts = sorted(shown["hosts"])
    assert sorted(shown["slurm hostnames"]) == hosts and sorted(shown["ssh hostnames"]) == hosts
    losses = np.array(list(shown["kit losses"].values()))
    assert losses.shape == (len(hosts), shown["parameters"]["EPOCHS"]), losses.shape  # one loss per epoch
    assert np.allclose(losses, losses[0], rtol=1e-6, atol=0), losses  # every worker, every step
    for task, resolver in shown["resolver losses"].items():
        np.testing.assert_allclose(resolver, shown["kit losses"][task], rtol=1e-5)
    assert shown["resolver cluster"] == {"worker": [f"{h}:8888" for h in hosts]}
    assert all(shown["login reaches, before"].values()) and not any(shown["login reaches, after"].values())
    assert shown["queue at the end"][1:] == [], shown["queue at the end"]
    assert len(shown["slurm warning"]) == 1 and not shown["ssh warning"], "expected the exposed-ports warning once"
    assert shown["made"] and shown["machine"], "the saved run does not say when and where it was made"


# ----- fast: the Makefile and the committed run ------------------------------------------------------
def test_the_makefile_leaves_out_of_nbval_exactly_the_notebooks_not_on_binder():
    text = (REPO / "Makefile").read_text()
    found = re.search(r"^NOT_ON_BINDER := (.*)$", text, re.M)
    assert found, "the Makefile has no NOT_ON_BINDER line"
    marked = [f"--ignore=notebooks/{p.name}" for p in NOTEBOOKS
              if json.loads(p.read_text())["metadata"].get("kit", {}).get("not_on_binder")]
    assert f"--ignore=notebooks/{NOTEBOOK.name}" in marked
    assert sorted(found.group(1).split()) == sorted(marked), "NOT_ON_BINDER and the notebooks' metadata disagree"
    every = text[text.index("NBVAL_ALL :="):text.index("NBVAL :=")]
    nbval = text[text.index("NBVAL :="):text.index("IN_BINDER :=")]
    binder = text[text.index("\nbinder:"):text.index("\nlab:")]
    assert "$(NOT_ON_BINDER)" in every and "$(NBVAL_ALL)" in nbval and "$(NBVAL_ALL)" in binder


def test_the_saved_run_is_committed_and_consistent():
    check_saved_run(json.loads(SAVED.read_text()))


# ----- slow: the notebook runs -----------------------------------------------------------------------
@pytest.mark.slow  # a kernel and the notebook's cells, no cluster: ~10 s
def test_without_the_cluster_the_notebook_shows_the_saved_run(tmp_path):
    seen: set[str] = set()
    done = threading.Event()

    def watch():  # anything of ipyparallel the kernel starts: a TFCluster's controller or engines
        while not done.wait(0.2):
            for child in psutil.Process().children(recursive=True):
                try:
                    line = " ".join(child.cmdline())
                except psutil.Error:
                    continue  # gone meanwhile
                if "ipyparallel" in line or "kit.core._boot" in line:
                    seen.add(line)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        notebook = execute({"LIVE": False}, tmp_path / "11-saved.ipynb")
    finally:
        done.set()
        watcher.join(timeout=10)
    saved = json.loads(SAVED.read_text())
    text = printed(notebook)
    assert text.startswith(f"saved: every step shows the run of {saved['made']} ({saved['machine']})"), text[:300]
    assert not seen, f"the notebook started a cluster without being live: {sorted(seen)}"
    checks = check_cells(notebook)
    # one print can arrive as two stream outputs ("checked: ..." and "\n") when the kernel flushes between its
    # writes, as it did beside a busy loop: a cell's streams are read together, as JupyterLab shows them
    shown_by = {n: printed({"cells": [c]}) for n, c in enumerate(checks)}
    unconfirmed = {n: text for n, text in shown_by.items() if not text.startswith("checked:")}
    assert len(checks) >= 7 and not unconfirmed, f"a check cell printed no confirmation: {unconfirmed}"
    assert str(saved["slurm hostnames"]) in text and saved["squeue"][1] in text  # the saved values, shown
    assert not re.search(r"^\[worker:\d\]", text, re.M), "a task printed: something ran on a cluster"


@pytest.mark.slow  # the emulated cluster, the kit on Slurm and on SSH, an sbatch job: 480 s beside other runs
@pytest.mark.check
def test_live_the_notebook_trains_on_slurm_and_ssh_and_leaves_nothing(tmp_path):
    problems = sim_cluster.missing()
    if problems:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("an emulated cluster needs " + "; ".join(problems))
    namespaces_before = set(sim_state.emulated_namespaces())
    sim_dir, record = tmp_path / "sim", tmp_path / "run.json"
    started = time.monotonic()
    try:
        notebook = execute({"LIVE": True, "RECORD": str(record), "SIM_DIR": str(sim_dir)}, tmp_path / "11-live.ipynb")
    finally:
        seconds = time.monotonic() - started
        left_up = (sim_dir / "state.json").exists()
        if left_up:  # the notebook failed before its last cells (the kernel's atexit normally does this)
            subprocess.run([sys.executable, "-m", "kit.tools.cli", "sim-cluster", "down", "--dir", str(sim_dir)],
                           timeout=120, check=False)
    print(f"notebook 11, live: {seconds:.0f} s")
    assert not left_up, "the notebook left its emulated cluster up"
    assert printed(notebook).startswith("live: an emulated cluster of 2 hosts")
    shown = json.loads(record.read_text())
    check_saved_run(shown)
    assert len(shown["kit losses"]) == 2 and shown["parameters"] == {"HOSTS": 2, "EPOCHS": 3}
    assert not sim_dir.exists(), f"{sim_dir} is still there"
    namespaces_after = set(sim_state.emulated_namespaces())
    assert namespaces_after <= namespaces_before, f"namespaces left: {sorted(namespaces_after - namespaces_before)}"
    ours = []
    for proc in psutil.process_iter():
        try:
            if str(sim_dir) in " ".join(proc.cmdline()):
                ours.append(proc)
        except psutil.Error:
            continue  # gone meanwhile, or not ours to read
    # the lifeline sees the cluster gone at its next look (sim_lifeline.POLL_SECONDS) and exits by itself
    _, alive = psutil.wait_procs(ours, timeout=10)
    daemons = [f"{p.pid}: {p.name()}" for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not daemons, f"daemons of the emulated cluster still running 10 s after the notebook: {daemons}"
