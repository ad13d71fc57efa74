"""Notebook 05 taken home: ``kit export`` writes its lesson (``train`` with ``BackupAndRestore``) as ``main.py``; two
plain ``python main.py`` workers, each with its own TF_CONFIG, are killed and restarted the way a cluster manager
does it, and ``BackupAndRestore`` resumes: the run ends with the steps and epochs of a run that was not killed."""

from __future__ import annotations

import signal
import subprocess
import time

import numpy as np
import pytest

from take_home import MNIST, Tasks, export, run_tasks, tf_configs

LESSON = "05-fault-tolerance"
EPOCHS, STEPS, SAVE_FREQ = 2, 20, 4
#: 2 workers, 2 epochs of 20 steps at 64 per worker, a backup every 4 steps in ./backup, the bundled MNIST, seed 1.
ARGS = ["--mnist-path", MNIST, "--seed", "1", "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS),
        "--save-freq", str(SAVE_FREQ), "--examples", "2048", "--backup-dir", "backup"]
#: Bounds (s) against hangs only: the first backup comes after TensorFlow's start and 4 steps (~10 s here).
FIRST_BACKUP_S, SURVIVOR_S, RUN_S = 240.0, 20.0, 300.0


@pytest.mark.slow  # three runs of two plain workers: 62 s at a load average of 7 on 2 cores (397 s at 17)
def test_a_worker_killed_mid_epoch_resumes_from_the_backup_after_every_task_restarts(tmp_path):
    script = export(LESSON, tmp_path)
    backup = tmp_path / "backup" / "chief" / "checkpoint"  # the chief's BackupAndRestore, written every SAVE_FREQ
    with Tasks(script, tf_configs({"worker": 2}), ARGS) as tasks:
        deadline = time.monotonic() + FIRST_BACKUP_S
        while not backup.exists():  # a bounded wait for the chief's first backup (step 4 of the first epoch)
            running = [p.poll() is None for p in tasks.procs]
            assert all(running) and time.monotonic() < deadline, \
                f"expected a backup at {backup} within {FIRST_BACKUP_S:.0f}s, running {running}:\n{tasks.log(0)}"
            time.sleep(0.05)  # polling a file another process writes: there is no event to wait on
        tasks.kill(1)  # SIGKILL, mid-epoch
        try:  # the survivor's next all-reduce fails (UnavailableError), or it hangs in it: killed too
            tasks.procs[0].wait(timeout=SURVIVOR_S)
        except subprocess.TimeoutExpired:
            tasks.kill(0)
        codes = [p.returncode for p in tasks.procs]
        assert codes[1] == -signal.SIGKILL and codes[0] != 0, f"expected both workers ended, exit codes {codes}"
        assert backup.exists(), "expected the backup to be left after the kill"
        for i in range(2):  # every task again, as a cluster manager restarts a failed job
            tasks.restart(i, ARGS)
        resumed = tasks.wait(RUN_S)
    assert not list((tmp_path / "backup").rglob("ckpt-*")), "expected the finished fit to delete its backup"
    reference = run_tasks(script, {"worker": 2}, [*ARGS[:-1], "reference-backup"], timeout=RUN_S)  # not killed
    expected = (EPOCHS * STEPS, list(range(EPOCHS)))  # global step (optimizer.iterations) and epochs run
    assert (reference[0]["global_step"], reference[0]["epochs_run"]) == expected, f"the run not killed: {reference}"
    for name, result in zip(("worker:0", "worker:1"), resumed):
        got = (result["global_step"], result["epochs_run"])
        assert got == expected, f"{name}: expected the steps and epochs {expected} of the run not killed, got {got}"
    np.testing.assert_allclose(resumed[1]["loss"], resumed[0]["loss"], rtol=1e-5, err_msg="the workers' losses")
    # resumed, not started over: the first epoch's loss is the mean of the steps after the backup only, which a
    # run from the first step (the same seed, the same data) does not give
    assert abs(resumed[0]["loss"][0] - reference[0]["loss"][0]) > 1e-3 * reference[0]["loss"][0], \
        f"expected the first epoch's loss of the resumed run {resumed[0]['loss']} to differ from {reference[0]['loss']}"
    np.testing.assert_allclose(resumed[0]["loss"][-1], reference[0]["loss"][-1], rtol=0.05,
                               err_msg="the final loss, resumed against not killed")
