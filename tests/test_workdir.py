"""Nothing left in the temporary folder: each task's TMPDIR is in its cluster's folder, which goes at
stop, and the folder of a cluster whose kernel was killed goes at the next cluster's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest

from conftest import REPO, kit_processes
from kit.core import _lifeline, workdir

TMP = Path(tempfile.gettempdir())


def entries() -> set[str]:
    return set(os.listdir(TMP))


def new_entries(before: set[str]) -> set[str]:
    """Entries of the temporary folder made since ``before``, less the folders of clusters that other
    live processes on this machine own (another test run, a notebook)."""
    def others(name: str) -> bool:
        folder = TMP / name
        return (name.startswith(workdir.PREFIX) and bool(workdir.owner_alive(folder))
                and not (folder / workdir.OWNER_FILE).read_text().startswith(f"{os.getpid()}:"))
    return {name for name in entries() - before if not others(name)}


def test_sweep_removes_only_folders_whose_owner_is_gone(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_token = _lifeline.token(dead.pid)
    dead.wait()
    folders = {}
    for name, owner in [("gone", dead_token), ("alive", _lifeline.token(os.getpid())), ("unknown", None)]:
        folders[name] = tmp_path / f"{workdir.PREFIX}{name}"
        folders[name].mkdir()
        if owner is not None:
            (folders[name] / workdir.OWNER_FILE).write_text(owner)
    (tmp_path / "kit-other").mkdir()
    assert workdir.sweep(tmp_path) == [folders["gone"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kit-cluster-alive", "kit-cluster-unknown", "kit-other"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat's btime is Linux's")
def test_a_step_of_the_wall_clock_leaves_live_processes_alive_and_dead_ones_dead(monkeypatch):
    """psutil's create_time is the start in ticks since boot plus /proc/stat's btime, a whole second that a step
    of the clock by a few ms moves by one (here btime was 5 ms past a second); the lifelines' start times are not."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        token, process = _lifeline.token(child.pid), psutil.Process(child.pid)
        cached = process.create_time()  # ipyparallel's launcher keeps such a Process, with this cached
        btime = psutil.boot_time()
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: btime - 1)  # /proc/stat after the step
        assert psutil.Process(child.pid).create_time() == cached - 1, "the step does not show in psutil"
        assert _lifeline.is_alive(*_lifeline.parse(token)[0]), f"{token} looks dead after the clock's step"
        assert _lifeline.runs(process), f"{process} looks dead after the clock's step"
    finally:
        child.kill()
        child.wait()
    assert not _lifeline.is_alive(*_lifeline.parse(token)[0]) and not _lifeline.runs(process)


def test_a_new_folder_names_its_owner_and_gives_each_task_an_empty_tmpdir():
    folder = workdir.create(os.getpid())
    try:
        assert folder.parent == TMP and oct(folder.stat().st_mode & 0o777) == "0o700"
        assert workdir.owner_alive(folder) is True
        tmp = Path(workdir.task_tmpdir(folder, "worker-0"))
        (tmp / "left-by-a-killed-engine.py").write_text("")
        assert list(Path(workdir.task_tmpdir(folder, "worker-0")).iterdir()) == []
    finally:
        workdir.remove(folder)
    assert not folder.exists()


#: A function AutoGraph converts (a Python ``if`` on a tensor), so it writes a module to TMPDIR; as source,
#: so that the test and the owner process below both send it by value.
AUTOGRAPH_STEP = textwrap.dedent("""
    def autograph_step():
        import glob, os, tempfile
        from kit.train._tf import import_tensorflow
        tf = import_tensorflow()

        @tf.function
        def clip(x):
            if tf.reduce_sum(x) > 0:
                x = x - 1.0
            return x

        clip(tf.ones(3))
        return {"tmpdir": tempfile.gettempdir(),
                "modules": glob.glob(os.path.join(tempfile.gettempdir(), "__autograph_generated_file*"))}
""")


def autograph_step():
    """The function, defined the way a notebook cell defines one: its source in linecache with no mtime
    (the kit sends such sources to the engines, where AutoGraph reads them), its module not importable
    (cloudpickle sends it by value)."""
    import linecache

    filename = "<kit-test-autograph>"
    linecache.cache[filename] = (len(AUTOGRAPH_STEP), None, AUTOGRAPH_STEP.splitlines(True), filename)
    namespace = {"__name__": "kit_test_autograph"}
    exec(compile(AUTOGRAPH_STEP, filename, "exec"), namespace)
    return namespace["autograph_step"]


@pytest.mark.slow
def test_a_run_with_autograph_a_restart_and_a_stop_leave_nothing_in_tmp(make_cluster):
    before = entries()
    cluster = make_cluster(workers=2)
    first = cluster.run(autograph_step())
    assert all(r["modules"] and r["tmpdir"] != str(TMP) for r in first), first
    (folder,) = [n for n in new_entries(before) if n.startswith(workdir.PREFIX)  # this cluster's
                 and (TMP / n / workdir.OWNER_FILE).read_text().startswith(f"{os.getpid()}:")]
    assert all(Path(r["tmpdir"]).is_relative_to(TMP / folder) for r in first)
    cluster.restart()  # SIGKILLs the engines: no exit handler deletes their modules
    assert all(not os.path.exists(m) for r in first for m in r["modules"])
    cluster.run(autograph_step())
    cluster.stop()
    assert new_entries(before) == set()


@pytest.mark.slow  # a cluster in a child process, killed, then one more cluster: ~15 s
def test_the_folder_of_a_killed_kernel_goes_with_the_next_cluster(tmp_path, make_cluster):
    before = entries()
    script = tmp_path / "owner.py"
    script.write_text(AUTOGRAPH_STEP + textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(REPO)!r})
        from kit.core.cluster import TFCluster
        cluster = TFCluster(workers=1).start()
        print(json.dumps(cluster.run(autograph_step)), flush=True)
        sys.stdin.read()  # block until killed, like a kernel
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    try:
        (result,) = json.loads(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait()
    psutil.wait_procs(kit_processes(owner.pid), timeout=15)
    (left,) = new_entries(before)  # the killed owner's folder, with its task's AutoGraph module
    assert left.startswith(workdir.PREFIX) and Path(result["modules"][0]).is_relative_to(TMP / left)
    make_cluster(workers=1).stop()
    assert new_entries(before) == set()


def test_a_lifeline_s_last_words_run_bounded_and_say_what_they_did(tmp_path, capfd):
    """The commands kit.core.attach leaves for its controller (scancel of the cluster's jobs) run when the owner
    is gone; a missing file is no command, a broken one is said, a failing command does not stop the next."""
    words = tmp_path / "kit-last-words.json"
    _lifeline.last_words(str(words))  # no file yet: nothing to do
    words.write_text(json.dumps([["sh", "-c", f"echo done > {tmp_path / 'ran'}"], ["false"], ["no-such-command-x"],
                                 ["sh", "-c", f"echo too > {tmp_path / 'also'}"]]))
    _lifeline.last_words(str(words))
    assert (tmp_path / "ran").read_text() == "done\n" and (tmp_path / "also").read_text() == "too\n"
    assert not words.exists()  # said once
    said = capfd.readouterr().err
    assert "kit lifeline: ran false: exit 1" in said and "could not run no-such-command-x" in said
    words.write_text("[[")
    _lifeline.last_words(str(words))
    assert "cannot read the last commands" in capfd.readouterr().err


@pytest.mark.parametrize("code, timeout, expected", [
    ("print('ready')", 30, None),
    ("import sys; sys.exit(2)", 30, "exited with code 2 before it was ready"),
    ("print('cannot do that')", 30, "wrote 'cannot do that' instead of 'ready'"),
    ("import time; time.sleep(60)", 0.5, "did not report ready within 0.5s"),
    ("import sys, time; sys.stdout.write('rea'); sys.stdout.flush(); time.sleep(60)", 0.5,
     "did not report ready within 0.5s (it wrote 'rea')"),  # the bound holds for the whole line
])
def test_a_helper_that_is_not_ready_is_said_why_and_reaped(code, timeout, expected):
    """The network holder and the zygote start alike: their first line says ready, within a bound; anything else
    kills and reaps the helper and names what it did instead (the callers add the helper's own log)."""
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert _lifeline.await_ready(process, timeout) == expected
        assert process.stdout.closed  # the helper says nothing more there
        if expected is not None:
            assert process.returncode is not None
    finally:
        process.kill()
        process.wait(timeout=10)


def test_reap_waits_out_the_grace_then_kills_and_collects_and_names_what_it_killed():
    """The one kill-and-reap of the kit: a process that exits within the grace is not killed; one that does not is
    SIGKILLed, and a child of ours is collected (no zombie left); a pid that is not there is no error."""
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed, left = _lifeline.reap([polite.pid, stubborn.pid, gone.pid], grace=5, seconds=10)
    assert killed == [stubborn.pid] and left == []
    for process in (polite, stubborn):
        assert not psutil.pid_exists(process.pid), f"{process.pid} is still in the process table (a zombie?)"
        process.wait(timeout=1)  # collected already: Popen takes the missing child as ended
