"""Notebook 01 taken home: ``kit export`` writes its lesson (the cells tagged ``lesson``) as ``main.py``, which
runs as a cluster runs a job (plain ``python main.py`` processes, each with its own TF_CONFIG, no kit), and trains
what the notebook's ``train`` trains on a ``kit.TFCluster`` from the same seed."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest

from take_home import MNIST, PLAIN_ENV, export, run_tasks

LESSON = "01-single-vs-multi-worker"
#: The run of the test: 2 workers, 2 epochs of 10 steps at 64 per worker, the bundled MNIST, seed 1.
ARGS = ["--mnist-path", MNIST, "--seed", "1", "--epochs", "2", "--steps-per-epoch", "10"]
KWARGS = {"per_worker_batch_size": 64, "epochs": 2, "steps_per_epoch": 10, "mnist_path": MNIST, "seed": 1}
#: Plain processes against the kit's engines: the same code, seed, data order and one thread pool each, so the
#: same arithmetic: measured equal to the last bit (final loss 2.2855167388916016 in both, 2026-11-27, load
#: average 12 on 2 cores). 1e-4 leaves room for float32 rounding in another summation order, and still fails a
#: different run: after 20 steps, seeds 1 to 5 differ by 1e-3 to 5e-3 (relative) in the loss.
RTOL_KIT = 1e-4


def test_the_exported_script_imports_no_kit_and_answers_help_without_tensorflow(tmp_path):
    script = export(LESSON, tmp_path)
    tree = ast.parse(script.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "kit" not in imported, f"expected main.py to import no kit, it imports {sorted(imported)}"
    env = {**os.environ, **PLAIN_ENV}
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env=env)
    assert shown.returncode == 0, f"expected `python main.py --help` to exit 0, it exited {shown.returncode}: " \
                                  f"{shown.stderr}"
    for option in ("--per-worker-batch-size", "--epochs", "--steps-per-epoch", "--mnist-path", "--seed"):
        assert option in shown.stdout, f"expected {option} in main.py's help, got:\n{shown.stdout}"
    # the lesson imports TensorFlow inside its functions: loading the script (and --help) does not
    loaded = subprocess.run([sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='lesson');"
                             " print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules))",
                             str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", \
        f"expected main.py to load without TensorFlow, measured: {loaded.stdout}{loaded.stderr}"


@pytest.mark.slow  # two plain workers (~30 s on 2 cores) and a 2-worker kit cluster (~30 s)
def test_the_exported_script_trains_as_two_plain_workers_as_the_notebooks_train_on_the_kit(
        tmp_path, make_cluster, monkeypatch):
    script = export(LESSON, tmp_path)
    plain = run_tasks(script, {"worker": 2}, ARGS, timeout=300)
    assert [len(r["loss"]) for r in plain] == [2, 2], f"expected 2 epochs of history per worker, got {plain}"
    np.testing.assert_allclose(plain[1]["loss"], plain[0]["loss"], rtol=1e-5,
                               err_msg="expected both plain workers to end with the same loss")

    # the notebook's train, from the lesson's code as exported (sent by value: its module is no importable one)
    namespace = {"__name__": "lesson_01"}
    with mock.patch.dict(os.environ):  # main.py sets TF_USE_LEGACY_KERAS at its top: not for this process
        exec(compile(script.read_text(), str(script), "exec"), namespace)  # noqa: S102 - the test's own export
    monkeypatch.setenv("KIT_VIEW", "text")
    cluster = make_cluster(workers=2)
    on_kit = cluster.run(namespace["train"], **KWARGS)
    print(f"final losses: plain {[r['loss'][-1] for r in plain]}, kit {[r['loss'][-1] for r in on_kit]}")
    for task, result in zip(cluster.task_names, on_kit):
        np.testing.assert_allclose(result["loss"], plain[0]["loss"], rtol=RTOL_KIT,
                                   err_msg=f"expected {task} on the kit to train as the plain workers did")
