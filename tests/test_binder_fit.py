"""Every notebook fits what mybinder.org gives: 2 GiB of memory (and 1 CPU) for the kernel and all its tasks.

`make notebooks`, as root, runs the notebooks nbval runs (all but 00, 01 and 05, which
tests/test_browser.py runs in JupyterLab) inside a 2 GiB cgroup (tools/binder_cgroup.py), notebook 07
(chief, 2 workers, ps: 4 TensorFlow processes) inside one with 2 GiB and 1 CPU, and then runs the last
test here on the records they wrote (``KIT_BINDER_RECORD``): every notebook passed, nothing was killed
for memory, the peak stayed under the limit, and the kit's engines and controllers ran inside the group.
Every notebook with 1 CPU also passed (measured on 2 cores: 493 s for a run of all of them instead of
335 s), but that is too slow for make test's 20 minutes.

"Peak" is the group's working set (usage minus inactive page cache) and its anonymous memory, sampled
every 0.5 s, plus the kernel's own out-of-memory kill count, which misses nothing. The kernel's
``memory.max_usage_in_bytes`` is recorded too but not compared: page cache (TensorFlow's libraries,
checkpoints) fills the group up to the limit and is dropped there, so it reached 2048 MiB in a run
whose working set peaked at 1,997 MiB and anonymous memory at 1,792 MiB, with no kill.

The first tests check the tool itself in real cgroups: what runs inside is limited (also the processes
the kit starts), what it leaves behind is killed, and an out-of-memory kill shows in the record.
Without root or cgroup controllers they skip and say what is missing; on CI (root on Debian) a
missing controller fails instead.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from conftest import REPO

_spec = importlib.util.spec_from_file_location("binder_cgroup", REPO / "tools" / "binder_cgroup.py")
binder_cgroup = sys.modules.setdefault("binder_cgroup", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(binder_cgroup)  # registered first: its dataclasses look their module up

MiB, GiB = 2**20, 2**30
RECORD_VAR = "KIT_BINDER_RECORD"


def cgroups_or_skip() -> None:
    reason = binder_cgroup.unavailable()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI runs as root on Debian with cgroup controllers, where this must work: {reason}")
    pytest.skip(reason)


def test_a_process_whose_cgroup_file_names_the_group_is_inside_even_if_the_list_missed_it():
    """The sampler reads the group's process list, then every process: a child started in between is
    not in the list, but its /proc/PID/cgroup names the group for each controller (seen in a
    `make binder` run, and reported as an escape)."""
    group = object.__new__(binder_cgroup.BinderCgroup)
    group.name = "kit-binder-87a09ef3"
    group.dirs = {"memory": Path("/sys/fs/cgroup/memory/kit-binder-87a09ef3"),
                  "cpu": Path("/sys/fs/cgroup/cpu/kit-binder-87a09ef3")}
    inside = ("9:name=systemd:/\n4:memory:/process_api/0442/kit-binder-87a09ef3\n2:cpuacct:/\n"
              "1:cpu:/kit-binder-87a09ef3\n0::/")
    assert group._names_this_group(inside)
    assert not group._names_this_group("4:memory:/process_api/0442\n1:cpu:/kit-binder-87a09ef3\n0::/")
    assert not group._names_this_group("4:memory:/other-kit-binder-87a09ef3\n1:cpu:/\n0::/")
    group.dirs = {"memory": Path("/sys/fs/cgroup/kit-binder-87a09ef3"), "cpu": Path("/sys/fs/cgroup/kit-binder-87a09ef3")}
    assert group._names_this_group("0::/user.slice/kit-binder-87a09ef3")  # cgroup v2: one line


def test_without_root_the_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(binder_cgroup.os, "geteuid", lambda: 1000)
    reason = binder_cgroup.unavailable()
    if sys.platform.startswith("linux"):
        assert reason == "needs root and a cgroup memory+cpu controller: this process is not root (uid 1000)"
    else:
        assert reason.startswith("needs root and a cgroup memory+cpu controller: this is ")


@pytest.mark.slow
def test_inside_the_group_the_kit_sees_the_limits_and_its_processes_stay_in_it(tmp_path):
    cgroups_or_skip()
    script = textwrap.dedent('''
        import json, os, subprocess
        from kit.core.cluster import TFCluster, kit_processes

        def inside():
            from kit.core import limits
            found = limits.read()
            return {"cores": found.cores, "memory_limit": found.memory_limit}

        straggler = subprocess.Popen(["sleep", "600"], start_new_session=True)  # left behind on purpose
        with TFCluster(workers=1) as cluster:
            (engine,) = cluster.with_options(stream=False).run(inside)
            groups = {p.pid: open(f"/proc/{p.pid}/cgroup").read() for p in kit_processes(os.getpid())}
        groups[os.getpid()] = open("/proc/self/cgroup").read()
        print(json.dumps({"engine": engine, "groups": groups, "straggler": straggler.pid}))
    ''')
    out = tmp_path / "out.json"
    with binder_cgroup.BinderCgroup() as group, out.open("w") as stdout:
        record = group.run([sys.executable, "-c", script], timeout=240, stdout=stdout,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        dirs, name = list(group.dirs.values()), group.name
    seen = json.loads(out.read_text().splitlines()[-1])
    assert record["returncode"] == 0, record
    assert seen["engine"] == {"cores": 1, "memory_limit": 2 * GiB}
    assert len(seen["groups"]) >= 3, seen  # this script, the controller, the engine
    for pid, membership in seen["groups"].items():  # /proc/PID/cgroup: "id:controllers:path" per hierarchy
        for line in membership.splitlines():
            _, controllers, path = line.split(":", 2)
            if {"memory", "cpu"} & set(controllers.split(",")) or (controllers == "" and record["cgroup_version"] == 2):
                assert path.endswith("/" + name), f"process {pid} is in {controllers}:{path}, not in {name}"
    assert not alive(seen["straggler"]), "a process left in the group outlived it"
    assert not any(d.exists() for d in dirs), f"the group outlived its context: {dirs}"
    assert record["processes_seen"].get("engine") == 1 and record["processes_seen"].get("controller", 0) >= 1
    assert record["escaped_processes"] == {} and record["sampler_errors"] == []


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited: it waits for a parent that may be slow to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_out_of_memory_kill_inside_shows_in_the_record():
    cgroups_or_skip()
    hog = "blocks = [bytearray(16 * 2**20) for _ in range(64)]"  # 1 GiB, zero-filled: every page touched
    with binder_cgroup.BinderCgroup(memory=256 * MiB) as group:
        record = group.run([sys.executable, "-c", hog], timeout=60)
    assert record["returncode"] == -9 and record["oom_kills"] == 1, record
    assert record["peak_memory_bytes"] <= 256 * MiB


# ----- the notebooks' run ------------------------------------------------------------------------------
def test_the_notebook_run_fit_in_binder_limits():
    """Reads the records of `make notebooks`: every notebook in 2 GiB, notebook 07 also with 1 CPU."""
    cgroups_or_skip()
    if not os.environ.get(RECORD_VAR):
        pytest.skip(f"checks the records of the notebooks' run in Binder-sized cgroups, which `make notebooks` "
                    f"makes and then names in {RECORD_VAR} (unset here)")
    records = [json.loads(Path(path).read_text()) for path in os.environ[RECORD_VAR].split(os.pathsep)]
    covered: dict[str, dict] = {}  # notebook -> the record of the run it was in
    for record in records:
        assert record["in_cgroup"], f"the notebooks ran without the Binder-sized cgroup: {record.get('reason')}"
        assert record["memory_limit_bytes"] == 2 * GiB and record["cpus"] in (None, 1.0), record
        results = notebook_results(junit_path(record["command"]))
        table = format_table(results, record)
        print(table)
        covered.update(dict.fromkeys(results, record))
        failed = [name for name, result in results.items() if result["failed"]]
        assert not failed and record["returncode"] == 0, f"notebooks failed in the Binder-sized cgroup: {failed}\n{table}"
        assert record["oom_kills"] == 0, f"the out-of-memory killer ended {record['oom_kills']} process(es)\n{table}"
        assert record["peak_working_set_bytes"] < record["memory_limit_bytes"], table
        assert record["peak_anon_bytes"] < record["memory_limit_bytes"], table
        assert record["escaped_processes"] == {}, f"kit processes outside the group: {record['escaped_processes']}"
        assert record["processes_seen"].get("controller", 0) >= 1 and record["sampler_errors"] == [], record
    in_browser = browser_notebooks()
    notebooks = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]-*.ipynb"))
    missing = sorted(set(notebooks) - set(covered) - set(in_browser))
    assert not missing, f"the runs did not cover {missing}"
    print(f"not measured here: {', '.join(in_browser)}, which tests/test_browser.py runs in JupyterLab instead")
    ps_run = covered["07-parameter-server.ipynb"]
    assert ps_run["cpus"] == 1.0, "notebook 07 (chief, 2 workers, ps) must run with Binder's 1 CPU too"
    assert ps_run["processes_max_concurrent"].get("engine", 0) >= 4, "notebook 07's 4 engines were not seen inside"


def browser_notebooks() -> list[str]:
    """The notebooks tests/test_browser.py runs in JupyterLab (its ``NOTEBOOKS``), which nbval leaves out."""
    source = REPO / "tests" / "test_browser.py"
    if not source.exists():
        return []
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NOTEBOOKS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{source} has no NOTEBOOKS list: which notebooks does it run?")


def junit_path(command: list[str]) -> Path:
    """The ``--junitxml`` file of the recorded pytest command."""
    for arg in command:
        if arg.startswith("--junitxml="):
            return REPO / arg.split("=", 1)[1]
    raise AssertionError(f"the recorded command writes no --junitxml, so its notebooks are unknown: {command}")


def notebook_results(path: Path) -> dict[str, dict]:
    """Notebook (path under notebooks/) → cells run, seconds, whether any cell failed, in the order they ran.

    nbval makes one test case per cell, with the class name ``notebooks.<sub>.<name>.ipynb``.
    """
    results: dict[str, dict] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "").removeprefix("notebooks.").removesuffix(".ipynb")
        name = classname.replace(".", "/") + ".ipynb"
        result = results.setdefault(name, {"cells": 0, "seconds": 0.0, "failed": False})
        result["cells"] += 1
        result["seconds"] += float(case.get("time", 0))
        result["failed"] |= case.find("failure") is not None or case.find("error") is not None
    return results


def format_table(results: dict[str, dict], record: dict) -> str:
    """One line per notebook: cells, seconds, the group's peak memory while its kernel ran."""
    spans = record.get("kernels", [])
    lines = [f"{'notebook':40s} {'cells':>5s} {'s':>6s} {'peak working set MiB':>21s} {'peak anon MiB':>14s}  result"]
    for index, (name, result) in enumerate(results.items()):
        span = spans[index] if index < len(spans) and len(spans) == len(results) else None
        peak = f"{span['peak_working_set_bytes'] / MiB:21.0f} {span['peak_anon_bytes'] / MiB:14.0f}" if span else f"{'?':>21s} {'?':>14s}"
        lines.append(f"{name:40s} {result['cells']:5d} {result['seconds']:6.1f} {peak}  "
                     f"{'FAILED' if result['failed'] else 'passed'}")
    cpu = ("no CPU quota" if record["cpus"] is None else
           f"{record['cpus']:g} CPU (throttled in {record['cpu_throttled_periods']} of {record['cpu_periods']} periods)")
    lines.append(f"whole run, {cpu}: {record['wall_seconds']:.0f} s; peak {record['peak_memory_bytes'] / MiB:.0f} MiB "
                 f"({record['peak_memory_source']}), working set {record['peak_working_set_bytes'] / MiB:.0f} MiB, "
                 f"anonymous {record['peak_anon_bytes'] / MiB:.0f} MiB, of {record['memory_limit_bytes'] / MiB:.0f} MiB; "
                 f"{record['oom_kills']} out-of-memory kill(s)")
    return "\n".join(lines)
