"""The machine's limits as this process sees them: CPU quota, memory limit, out-of-memory kills.

A container (Binder, JupyterHub, Docker, Slurm) limits a notebook through cgroups, which
``os.sched_getaffinity`` and the machine's total memory do not show: mybinder.org gives about 2 GiB and
one CPU on a machine with many more. The kit sizes each task's threads from the CPU quota, warns
before starting a cluster that will not fit in memory, and names an engine the kernel's
out-of-memory killer ended as exactly that.

Read from cgroup v2 (``cpu.max``, ``memory.max``, ``memory.current``, ``memory.events``) or v1
(``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``memory.limit_in_bytes``, ``memory.usage_in_bytes``,
``memory.oom_control``), along the process's cgroup path up to the mount (the tightest limit on the
way counts), and from ``MEM_LIMIT`` (bytes), which JupyterHub and Binder set.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

#: What one TF task of the seeds' CNN costs while it trains (PSS, MB): `kit bench` measured 1,370 MB for
#: the kernel and two workers at 64 per worker (docs/performance.md, change 9), about 600 per worker.
TASK_MEMORY_MB = 600
#: v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages); anything above this is no limit.
_NO_LIMIT = 2**60


@dataclasses.dataclass(frozen=True)
class Limits:
    """What this process may use."""

    affinity: int                 #: CPUs it may run on (sched_getaffinity)
    cpu_quota: float | None       #: CPUs' worth of time the cgroup allows (None: no quota)
    memory_limit: int | None      #: bytes (None: no limit found)
    memory_used: int | None       #: bytes the cgroup uses now (None: not known)
    memory_limit_from: str = ""   #: where the limit was read

    @property
    def cores(self) -> int:
        """Cores to divide among tasks: the affinity, capped by the quota (at least 1)."""
        if self.cpu_quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.ceil(self.cpu_quota - 1e-9)))


def read(proc: str | Path = "/proc", environ: dict | None = None) -> Limits:
    """This process's limits (``proc`` and ``environ`` are for tests)."""
    environ = os.environ if environ is None else environ
    groups = cgroup_dirs(Path(proc))
    quota = _cpu_quota(groups)
    limit, used, source = _memory(groups)
    mem_limit = environ.get("MEM_LIMIT", "").strip()
    if mem_limit.isdigit() and int(mem_limit) > 0 and (limit is None or int(mem_limit) < limit):
        limit, source = int(mem_limit), "MEM_LIMIT"
    return Limits(affinity=_affinity(), cpu_quota=quota, memory_limit=limit, memory_used=used,
                  memory_limit_from=source)


def oom_kills(proc: str | Path = "/proc") -> int | None:
    """How many processes the out-of-memory killer has ended in this process's memory cgroup (None: unknown)."""
    groups = cgroup_dirs(Path(proc))
    for directory in groups.get("memory", [])[:1]:
        for name in ("memory.events", "memory.oom_control"):  # v2, v1
            fields = _key_values(directory / name)
            if "oom_kill" in fields:
                return fields["oom_kill"]
    return None


def memory_shortfall(tasks: int, limits: Limits) -> str:
    """Why ``tasks`` TF tasks will not fit in memory ("" if they will or nothing is known)."""
    if limits.memory_limit is None:
        return ""
    need = tasks * TASK_MEMORY_MB * 2**20
    used = limits.memory_used or 0
    free = limits.memory_limit - used
    if need <= free:
        return ""
    return (f"{tasks} task(s) need about {need / 2**30:.1f} GiB while they train (~{TASK_MEMORY_MB} MB "
            f"each), but the memory limit here is {limits.memory_limit / 2**30:.1f} GiB "
            f"({limits.memory_limit_from}) and {used / 2**30:.1f} GiB of it is in use")


class OomWatch:
    """Counts the out-of-memory killer's kills in this memory cgroup from a moment on, to say how an
    engine died: a TFCluster marks the moment at start and at each run, and asks when an engine is gone."""

    def __init__(self, tasks: int):
        self.tasks = tasks              #: the cluster's tasks, for the message's arithmetic
        self.since: int | None = None   #: the cgroup's kill count at the mark (None: unknown)

    def mark(self) -> None:
        """Count from now on."""
        self.since = oom_kills()

    def explain(self) -> str:
        """How a dead engine died, if the out-of-memory killer did it since the mark ("" otherwise): with
        the numbers and the fix."""
        now = oom_kills()
        if now is None or self.since is None or now <= self.since:
            return ""
        here = read()
        limit = (f"the memory limit here is {here.memory_limit / 2**30:.1f} GiB ({here.memory_limit_from})"
                 if here.memory_limit else "the machine ran out of memory")
        return (f"killed by the out-of-memory killer ({now - self.since} kill(s) in this memory cgroup since "
                f"the run began); {limit}, for the kernel and {self.tasks} task(s) of about {TASK_MEMORY_MB} MB "
                "each while they train. Fix: fewer tasks or a smaller batch, or a machine or session with more "
                "memory")


# ----- reading cgroups ------------------------------------------------------------------------------
def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def cgroup_dirs(proc: Path) -> dict[str, list[Path]]:
    """Controller ("cpu", "memory") → this process's cgroup folder and its parents up to the mount,
    innermost first; v2's unified hierarchy serves every controller it has. (Also for the tests and
    tools/binder_cgroup.py, which make child groups there.)"""
    try:
        mountinfo = (proc / "self" / "mountinfo").read_text().splitlines()
        membership = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:  # not Linux, or no /proc: no cgroups to read
        return {}
    mounts: dict[str, tuple[Path, str]] = {}  # controller (or "" for v2) → (mount point, mount root)
    for line in mountinfo:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mount_point, fstype, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("", (Path(mount_point), root))
        elif fstype == "cgroup":
            for controller in ("cpu", "memory"):
                if controller in options:
                    mounts.setdefault(controller, (Path(mount_point), root))
    found: dict[str, list[Path]] = {}
    for line in membership:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: serves the controllers enabled at its root (none on hybrid systems)
            if "" not in mounts:
                continue
            enabled = (_read(mounts[""][0] / "cgroup.controllers") or "").split()
            for controller in ("cpu", "memory"):
                if controller in enabled:
                    found.setdefault(controller, _ancestors(*mounts[""], path))
        else:
            for controller in {"cpu", "memory"} & set(controllers.split(",")):
                if controller in mounts:
                    found[controller] = _ancestors(*mounts[controller], path)
    return found


def _ancestors(mount_point: Path, mount_root: str, path: str) -> list[Path]:
    relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
    directory = mount_point / ("" if relative == "." else relative)
    if not directory.is_dir():  # a container that sees its own cgroup as the mount's root
        directory = mount_point
    chain = [directory]
    while chain[-1] != mount_point and mount_point in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None  # this level of the hierarchy has no such file: no limit set there


def _key_values(path: Path) -> dict[str, int]:
    text = _read(path) or ""
    pairs = (line.split() for line in text.splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].lstrip("-").isdigit()}


def _cpu_quota(groups: dict[str, list[Path]]) -> float | None:
    quotas = []
    for directory in groups.get("cpu", []):
        v2 = _read(directory / "cpu.max")
        if v2 is not None:
            quota, _, period = v2.partition(" ")
            if quota != "max" and period:
                quotas.append(int(quota) / int(period))
            continue
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0:
            quotas.append(int(quota) / int(period))
    return min(quotas) if quotas else None


def _memory(groups: dict[str, list[Path]]) -> tuple[int | None, int | None, str]:
    limit, source, used = None, "", None
    for level, directory in enumerate(groups.get("memory", [])):
        for name in ("memory.max", "memory.limit_in_bytes"):  # v2, v1
            value = _read(directory / name)
            if value is not None and value.isdigit() and int(value) < _NO_LIMIT and (limit is None or int(value) < limit):
                limit, source = int(value), f"cgroup {name} at {directory}"
        if level == 0:
            for name in ("memory.current", "memory.usage_in_bytes"):
                value = _read(directory / name)
                if value is not None and value.isdigit():
                    used = int(value)
                    break
    return limit, used, source
