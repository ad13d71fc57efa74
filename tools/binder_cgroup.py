"""Run a command inside a cgroup the size of a mybinder.org session: 2 GiB of memory and 1 CPU.

mybinder.org gives a session about 2 GiB of memory and one CPU for the notebook kernel and every
process it starts together; the kit's clusters start one process per TensorFlow task, so a notebook
that fits on a laptop can be killed for memory there. This tool gives a command (and, through
inheritance, everything it starts: the nbval kernels, the kit's controller and engines) exactly that
budget, as root, in a fresh cgroup:

    python tools/binder_cgroup.py --record out/binder-fit.json -- python -m pytest --nbval-lax notebooks/

- memory: ``memory.limit_in_bytes`` (v1) or ``memory.max`` (v2) = 2 GiB, and no swap
  (``memory.memsw.limit_in_bytes`` / ``memory.swap.max`` where the kernel has them);
- CPU: a CFS quota of one period per period (``cpu.cfs_quota_us = cpu.cfs_period_us`` in v1,
  ``cpu.max = "100000 100000"`` in v2), what Kubernetes sets for ``limits.cpu: 1``.

While the command runs, a sampler (every :data:`SAMPLE_SECONDS`) records which kit processes are in
the group (engines, controller, kernels) and whether any process the kit started for a process in
the group (``KIT_LIFELINE`` names its owner) is outside it, as read from ``/proc/PID/cgroup``. The
JSON record then says what the group allowed, what the command used (peak memory as the kernel
counted it, out-of-memory kills, CPU time, throttled time), its exit status and wall time, and where the
memory was at each notebook's peak (resident and anonymous memory by kind of process: kernel, engines,
nannies, controller, the Jupyter server, the rest).

On mybinder.org the Jupyter server (JupyterLab) runs inside the same limit as the kernels it starts.
``--with-server`` does the same here: before the command it starts ``jupyter lab`` inside the group (a
free port on 127.0.0.1, a random token, its root, runtime and config folders in a temporary folder),
waits until its HTTP API answers with the token (bounded: :data:`SERVER_READY_TIMEOUT`), and stops it
after the command (SIGTERM, then SIGKILL after :data:`SERVER_STOP_TIMEOUT`); the record's
``jupyter_server`` says it was inside, and its memory. The temporary folder goes with it.

    python tools/binder_cgroup.py --with-server --record out/binder-fit.json -- python -m pytest --nbval-lax notebooks/

On mybinder.org the server also starts the kernels. A notebook runner here (nbval) does that instead, so
inside the group it would count a second kernel manager. ``--kernels-inside`` keeps the command outside and
puts its kernels inside: it gets a kernelspec :data:`KERNEL_NAME` (this Python's ipykernel, joining the group
first) in a temporary ``JUPYTER_PATH``, which nbval starts with ``--nbval-kernel-name binder-cgroup``.

The group is always removed: leftover processes are killed and waited for (bounded) and the
folders deleted, also when the command fails or this tool is interrupted. Without root or without
cgroup memory and cpu controllers, :func:`unavailable` says what is missing, and ``--if-possible``
runs the command without limits instead (the record says why).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kit.core import _lifeline, limits  # noqa: E402  (the repository's own kit, also when not installed)
from kit.core.tfconfig import free_port  # noqa: E402

GiB = 2**30
#: mybinder.org's memory per session: "up to 2 GB", read as 2 GiB (2 GB would be 1,907 MiB).
BINDER_MEMORY = 2 * GiB
#: mybinder.org's CPUs per session.
BINDER_CPUS = 1.0
#: CFS period (µs): the kernel's default; the quota is ``cpus × period``.
CFS_PERIOD_US = 100_000
#: How often the sampler looks at the group. A kit engine lives for seconds at least (importing
#: TensorFlow alone takes 3-6 s here), so every engine is seen.
SAMPLE_SECONDS = 0.5
#: Bound on removing the group: SIGKILLed processes leave within milliseconds; an engine in the
#: middle of writing a large core or checkpoint may need a few seconds.
REMOVE_TIMEOUT = 30.0
#: Exit status when the command could not be started in the group.
SETUP_FAILED = 125
#: Bound on the Jupyter server's start, until its HTTP API answers: it starts in 3-10 s here, slower in a
#: group with 1 CPU on a busy machine.
SERVER_READY_TIMEOUT = 120.0
#: Bound on its stop after SIGTERM (it stops in about a second), before SIGKILL.
SERVER_STOP_TIMEOUT = 20.0

_MISSING = "needs root and a cgroup memory+cpu controller"


class CgroupError(RuntimeError):
    """The group could not be made, entered or removed; the message names the file or what was waited for."""


# ----- what this machine offers -----------------------------------------------------------------------
def unavailable() -> str | None:
    """Why no Binder-sized group can be made here ("needs root and a cgroup memory+cpu controller: …"),
    or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"{_MISSING}: this is {sys.platform}, not Linux"
    if os.geteuid() != 0:
        return f"{_MISSING}: this process is not root (uid {os.geteuid()})"
    try:
        _Layout.find(enable=False)
    except CgroupError as error:
        return f"{_MISSING}: {error}"
    return None


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where the new group's folders go: one parent per controller (v1), or one parent for both (v2)."""

    version: int
    parents: dict[str, Path]  # "memory"/"cpu" -> parent folder (v2: the same folder twice)

    @classmethod
    def find(cls, enable: bool = True) -> "_Layout":
        """This machine's layout; ``enable=False`` only checks, changing nothing (see :func:`_v2_parent`)."""
        groups = limits.cgroup_dirs(Path("/proc"))  # this process's cgroup folders
        missing = [c for c in ("memory", "cpu") if c not in groups]
        if missing:
            raise CgroupError(f"no cgroup {' and '.join(missing)} controller is mounted for this process "
                              "(see /proc/self/cgroup and /proc/self/mountinfo)")
        if (groups["memory"][0] / "cgroup.controllers").exists():
            return cls(2, dict.fromkeys(("memory", "cpu"), _v2_parent(groups["memory"], enable)))
        if (groups["cpu"][0] / "cgroup.controllers").exists():
            raise CgroupError("the memory controller is on cgroup v1 and the cpu controller on v2; "
                              "this tool needs both on the same version")
        for controller in ("memory", "cpu"):
            if not os.access(groups[controller][0], os.W_OK):
                raise CgroupError(f"cannot create a {controller} cgroup under {groups[controller][0]} "
                                  "(read-only: a container without cgroup write access?)")
        return cls(1, {c: groups[c][0] for c in ("memory", "cpu")})


def _v2_parent(chain: list[Path], enable: bool = True) -> Path:
    """The nearest folder, from this process's cgroup up, whose children get the cpu and memory controllers.

    In v2 a group with processes cannot hand controllers to children (the "no internal processes"
    rule), so this process's own group rarely can: the first ancestor that delegates both does, and
    the hierarchy's root (exempt from the rule) can be made to (only with ``enable``).
    """
    for directory in chain:
        enabled = (directory / "cgroup.subtree_control").read_text().split()
        if "cpu" in enabled and "memory" in enabled:
            return directory
    root = chain[-1]
    available = (root / "cgroup.controllers").read_text().split()
    if not {"cpu", "memory"} <= set(available):
        raise CgroupError(f"cgroup v2 at {root} offers {' '.join(available) or 'no controllers'}, "
                          "not both cpu and memory")
    if not enable:
        return root
    try:
        (root / "cgroup.subtree_control").write_text("+cpu +memory")
    except OSError as error:
        raise CgroupError(f"cannot enable the cpu and memory controllers for children of {root}: {error}") from error
    return root


# ----- the group ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Memory:
    """One reading of the group's memory (bytes).

    ``usage`` is what the kernel charges against the limit, page cache included; ``working_set``
    leaves out the inactive page cache, which the kernel drops before it kills anything (Kubernetes
    reports the same difference as a container's working set); ``anon`` is anonymous memory alone,
    which nothing can drop without swap.
    """

    usage: int
    working_set: int
    anon: int

    def max(self, other: "Memory") -> "Memory":
        return Memory(*(max(a, b) for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


#: Per kind of process: how many, their resident memory, and its anonymous part (``rss - shared``
#: from ``/proc/PID/statm``: what nothing can drop; a fork's copy-on-write pages count in each process).
ByKind = dict[str, dict[str, int]]


@dataclasses.dataclass
class KernelSpan:
    """The group's memory while one notebook kernel lived (first to last sample that saw it), and where
    it was (:data:`ByKind`) at the sample with the highest working set."""

    first_seen: float
    last_seen: float
    peak: Memory
    at_peak: ByKind = dataclasses.field(default_factory=dict)

    def update(self, now: float, memory: Memory, by_kind: ByKind) -> None:
        if memory.working_set > self.peak.working_set or not self.at_peak:
            self.at_peak = by_kind
        self.last_seen, self.peak = now, self.peak.max(memory)

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.last_seen - self.first_seen, 1), "peak_usage_bytes": self.peak.usage,
                "peak_working_set_bytes": self.peak.working_set, "peak_anon_bytes": self.peak.anon,
                "at_peak": self.at_peak}


@dataclasses.dataclass
class Sample:
    """What the sampler saw across the command's life."""

    samples: int = 0
    seen: dict[str, set[int]] = dataclasses.field(default_factory=dict)        # kind -> pids seen in the group
    max_concurrent: dict[str, int] = dataclasses.field(default_factory=dict)   # kind -> most at once
    escaped: dict[int, str] = dataclasses.field(default_factory=dict)          # pid -> its /proc/PID/cgroup
    peak: Memory = dataclasses.field(default_factory=lambda: Memory(0, 0, 0))  # each field's own maximum
    #: one per kernel the command itself started (nbval: one per notebook, in the order they ran);
    #: kernels that a notebook starts (papermill runs in notebook 08) count towards their notebook
    kernels: dict[int, KernelSpan] = dataclasses.field(default_factory=dict)
    #: the whole run, from the command's start (a Jupyter server started before it is in every sample)
    run: KernelSpan | None = None
    #: kind -> the most resident and anonymous memory its processes held together, in any one sample
    kind_peaks: ByKind = dataclasses.field(default_factory=dict)
    command_pid: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    users: dict[str, set[str]] = dataclasses.field(default_factory=dict)       # kind -> the users its processes ran as


class BinderCgroup:
    """A fresh cgroup with Binder's limits; a context manager that always removes it.

        with BinderCgroup() as group:
            record = group.run(["python", "-m", "pytest", ...])
    """

    def __init__(self, memory: int = BINDER_MEMORY, cpus: float | None = BINDER_CPUS, name: str | None = None):
        """``cpus=None``: no CPU quota (the memory limit alone)."""
        self.memory, self.cpus = memory, cpus
        self.name = name or f"kit-binder-{uuid.uuid4().hex[:8]}"
        self.layout = _Layout.find()
        self.dirs: dict[str, Path] = {}

    # -- life cycle
    def __enter__(self) -> "BinderCgroup":
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _create(self) -> None:
        for controller, parent in self.layout.parents.items():
            directory = parent / self.name
            if directory not in self.dirs.values():
                directory.mkdir()
            self.dirs[controller] = directory
        if self.layout.version == 1:
            self._write("memory", "memory.limit_in_bytes", self.memory)
            self._write("memory", "memory.memsw.limit_in_bytes", self.memory, optional=True)  # no swap
        else:
            self._write("memory", "memory.max", self.memory)
            self._write("memory", "memory.swap.max", 0, optional=True)
        if self.cpus is None:
            return  # the cpu group still counts throttling and CPU time, with no quota
        quota = int(self.cpus * CFS_PERIOD_US)
        if self.layout.version == 1:
            self._write("cpu", "cpu.cfs_period_us", CFS_PERIOD_US)
            self._write("cpu", "cpu.cfs_quota_us", quota)
        else:
            self._write("cpu", "cpu.max", f"{quota} {CFS_PERIOD_US}")

    def _write(self, controller: str, name: str, value: object, optional: bool = False) -> None:
        path = self.dirs[controller] / name
        if optional and not path.exists():
            return  # e.g. memsw without swap accounting: nothing to limit, the machine has no swap
        try:
            path.write_text(str(value))
        except OSError as error:
            raise CgroupError(f"cannot write {value} to {path}: {error}") from error

    def remove(self, timeout: float = REMOVE_TIMEOUT) -> None:
        """Kill every process still in the group, wait (at most ``timeout`` s) until it is empty, delete it."""
        if not self.dirs:
            return
        deadline = time.monotonic() + timeout
        kill_file = next(iter(self.dirs.values())) / "cgroup.kill"  # v2, Linux >= 5.14: kills the subtree
        while True:
            left = self.pids()
            if not left:
                break
            if time.monotonic() > deadline:
                raise CgroupError(f"waited {timeout:.0f} s for the processes in cgroup {self.name} to exit "
                                  f"after SIGKILL; still there: {sorted(left)}")
            if kill_file.exists():
                kill_file.write_text("1")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue  # exited between the listing and the signal
            time.sleep(0.05)  # SIGKILLed processes leave within milliseconds; no event to wait on in v1
        for directory in dict.fromkeys(self.dirs.values()):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as error:  # EBUSY for a moment after the last process left
                    if time.monotonic() > deadline:
                        raise CgroupError(f"waited {timeout:.0f} s to delete {directory}: {error}") from error
                    time.sleep(0.05)
        self.dirs = {}

    # -- readings
    def pids(self) -> set[int]:
        """Every process in the group (any controller's folder)."""
        found: set[int] = set()
        for directory in dict.fromkeys(self.dirs.values()):
            try:
                found |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
            except FileNotFoundError:
                continue  # already removed
        return found

    def names_this_group(self, proc_cgroup: str) -> bool:
        """Whether a /proc/PID/cgroup text puts the process in this group for every controller that has it."""
        paths = [line.split(":", 2)[2] for line in proc_cgroup.splitlines() if line.count(":") >= 2]
        ours = [path for path in paths if path.rstrip("/").endswith("/" + self.name)]
        return bool(ours) and len(ours) == len({str(d) for d in self.dirs.values()})

    def _read_int(self, controller: str, name: str) -> int | None:
        try:
            return int((self.dirs[controller] / name).read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None  # not offered by this kernel or version

    def _stat(self, controller: str, name: str) -> dict[str, int]:
        return limits._key_values(self.dirs[controller] / name)  # noqa: SLF001

    def memory_now(self) -> Memory:
        """The group's memory now (see :class:`Memory`)."""
        stat = self._stat("memory", "memory.stat")
        if self.layout.version == 1:
            usage = self._read_int("memory", "memory.usage_in_bytes") or 0
            inactive_file, anon = stat.get("total_inactive_file", 0), stat.get("total_rss", 0)
        else:
            usage = self._read_int("memory", "memory.current") or 0
            inactive_file, anon = stat.get("inactive_file", 0), stat.get("anon", 0)
        return Memory(usage=usage, working_set=max(0, usage - inactive_file), anon=anon)

    def readings(self, sample: Sample) -> dict[str, Any]:
        """Peak memory, OOM kills and CPU use, as the kernel counted them for the group."""
        if self.layout.version == 1:
            peak, source = self._read_int("memory", "memory.max_usage_in_bytes"), "memory.max_usage_in_bytes"
            oom_kills = self._stat("memory", "memory.oom_control").get("oom_kill")
            failcnt = self._read_int("memory", "memory.failcnt")
            cpu_stat = self._stat("cpu", "cpu.stat")
            usage_ns = self._read_int("cpu", "cpuacct.usage")  # present when cpu and cpuacct share a mount
            cpu_seconds = usage_ns / 1e9 if usage_ns is not None else None
            throttled = cpu_stat.get("throttled_time", 0) / 1e9
        else:
            peak, source = self._read_int("memory", "memory.peak"), "memory.peak"  # Linux >= 5.19
            oom_kills = self._stat("memory", "memory.events").get("oom_kill")
            failcnt = self._stat("memory", "memory.events").get("max")
            cpu_stat = self._stat("cpu", "cpu.stat")
            cpu_seconds = cpu_stat.get("usage_usec", 0) / 1e6
            throttled = cpu_stat.get("throttled_usec", 0) / 1e6
        if peak is None:
            peak, source = sample.peak.usage, f"sampled every {SAMPLE_SECONDS} s"
        return {"peak_memory_bytes": peak, "peak_memory_source": source,
                "peak_working_set_bytes": sample.peak.working_set, "peak_anon_bytes": sample.peak.anon,
                "oom_kills": oom_kills,
                "times_at_memory_limit": failcnt, "cpu_seconds": cpu_seconds,
                "cpu_periods": cpu_stat.get("nr_periods"), "cpu_throttled_periods": cpu_stat.get("nr_throttled"),
                "cpu_throttled_seconds": throttled}

    # -- running
    def joining(self, command: list[str]) -> tuple[list[str], dict[str, str]]:
        """``command`` as a shell that joins the group, then execs it, so that the command and all it starts
        are inside from their first instruction; and the environment variable that shell reads."""
        procs_files = "\n".join(str(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values()))
        join = ("IFS='\n'; for f in $KIT_BINDER_CGROUP_PROCS; do "
                'echo $$ > "$f" || { echo "cannot join the cgroup: $f" >&2; exit %d; }; done; '
                'unset IFS KIT_BINDER_CGROUP_PROCS; exec "$@"' % SETUP_FAILED)
        return ["/bin/sh", "-c", join, "binder-cgroup", *command], {"KIT_BINDER_CGROUP_PROCS": procs_files}

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``command`` inside the group (:meth:`joining`)."""
        argv, env = self.joining(command)
        return subprocess.Popen(argv, env={**(kwargs.pop("env", None) or os.environ), **env}, **kwargs)

    def start(self, command: list[str], inside: bool = True, **kwargs: Any) -> "Watched":
        """Start ``command`` in the group (:meth:`popen`) and sample the group until :meth:`Watched.record`.
        ``inside=False``: the command itself stays outside (a notebook runner whose kernels join the group
        through :func:`write_kernelspec`).

        For a process that a test stops itself (a Jupyter server, say); :meth:`run` waits for one.
        """
        process = self.popen(command, **kwargs) if inside else subprocess.Popen(command, **kwargs)
        return Watched(self, command, process)

    def run(self, command: list[str], timeout: float | None = None, server: "JupyterServer | None" = None,
            inside: bool = True, **kwargs: Any) -> dict[str, Any]:
        """Run ``command`` in the group until it ends (or ``timeout`` s: then it is killed and
        :class:`subprocess.TimeoutExpired` raised); return the record (see :meth:`Watched.record`).

        With ``server`` (a :class:`JupyterServer` of this group), the server starts in the group first
        and is stopped after the command, also when it fails; the record's ``jupyter_server`` describes it.
        """
        if server is not None:
            server.start()  # a ServerError leaves nothing behind: the server is stopped, its folder gone
        try:
            watched = self.start(command, inside=inside, **kwargs)
            try:
                watched.process.wait(timeout=timeout)
                watched.ended = time.monotonic()
            except BaseException:  # a timeout, or this tool interrupted: the group's processes must go too
                watched.process.kill()
                watched.process.wait(timeout=REMOVE_TIMEOUT)
                watched.record()  # stops the sampler; the group goes with the context
                raise
        finally:
            if server is not None:
                server.stop()
        record = watched.record()
        record["jupyter_server"] = server.describe(record) if server is not None else None
        record["command_inside"] = inside
        return record

    def describe(self) -> dict[str, Any]:
        return {"cgroup_version": self.layout.version,
                "cgroup": {c: str(d) for c, d in self.dirs.items()},
                "memory_limit_bytes": self.memory, "cpus": self.cpus, "swap_limited": self._swap_limited()}

    def _swap_limited(self) -> bool:
        name = "memory.memsw.limit_in_bytes" if self.layout.version == 1 else "memory.swap.max"
        return (self.dirs["memory"] / name).exists()

    def _sample_until(self, sample: Sample, stop: threading.Event) -> None:
        """Sample until ``stop`` is set; a sampling error is recorded (the record shows it), not raised."""
        while True:
            try:
                self._sample_once(sample)
            except (OSError, ValueError) as error:  # e.g. the group removed under us, or a malformed
                # KIT_LIFELINE: recorded (tests/test_binder_fit.py fails on it), and sampling goes on
                sample.errors.append(f"{type(error).__name__}: {error}")
            if stop.wait(SAMPLE_SECONDS):
                return

    def _sample_once(self, sample: Sample) -> None:
        import psutil

        inside = self.pids()
        memory, now = self.memory_now(), time.monotonic()
        sample.samples += 1
        sample.peak = sample.peak.max(memory)
        counts: dict[str, int] = {}
        by_kind: ByKind = {}
        kernels: list[int] = []
        for proc in psutil.process_iter(["pid", "ppid", "cmdline", "environ", "username"]):
            info = proc.info
            if info["environ"] is None or info["cmdline"] is None:
                continue  # gone meanwhile, or a zombie
            kind = _kind(info["cmdline"])
            owners = {pid for pid, _ in _lifeline.parse(info["environ"].get(_lifeline.LIFELINE_VAR, ""))}
            if info["pid"] in inside:
                if kind:
                    sample.seen.setdefault(kind, set()).add(info["pid"])
                    sample.users.setdefault(kind, set()).add(info["username"])
                    counts[kind] = counts.get(kind, 0) + 1
                if kind == "kernel" and info["ppid"] == sample.command_pid:
                    kernels.append(info["pid"])
                try:
                    rss, shared = proc.memory_info()[:3:2]  # rss, shared (/proc/PID/statm: cheap)
                except psutil.Error:
                    continue  # exited meanwhile
                mine = by_kind.setdefault(kind or _other_kind(info["cmdline"]), {"processes": 0, "rss": 0, "anon": 0})
                mine["processes"] += 1
                mine["rss"] += rss
                mine["anon"] += rss - shared
            elif owners & inside:  # the kit started it for a process in the group, yet it is outside
                try:
                    cgroups = Path(f"/proc/{info['pid']}/cgroup").read_text().strip()
                except FileNotFoundError:
                    continue  # exited meanwhile
                if self.names_this_group(cgroups):
                    continue  # started after the group's list was read: a child stays in its parent's group
                sample.escaped[info["pid"]] = cgroups
        for kind, count in counts.items():
            sample.max_concurrent[kind] = max(sample.max_concurrent.get(kind, 0), count)
        for kind, held in by_kind.items():
            peak = sample.kind_peaks.setdefault(kind, {"rss": 0, "anon": 0})
            peak["rss"], peak["anon"] = max(peak["rss"], held["rss"]), max(peak["anon"], held["anon"])
        for pid in kernels:
            sample.kernels.setdefault(pid, KernelSpan(now, now, memory)).update(now, memory, by_kind)
        if sample.run is None:
            sample.run = KernelSpan(now, now, memory)
        sample.run.update(now, memory, by_kind)


class Watched:
    """A command started in a :class:`BinderCgroup`, with the sampler that watches the group."""

    def __init__(self, group: BinderCgroup, command: list[str], process: subprocess.Popen):
        self.group, self.command, self.process = group, command, process
        self.started = time.monotonic()
        self.ended: float | None = None  # when the command ended, if it was waited for (not a server's stop)
        self.sample, self._stop = Sample(command_pid=process.pid), threading.Event()
        self._sampler = threading.Thread(target=group._sample_until, args=(self.sample, self._stop),
                                         daemon=True, name=f"binder-cgroup-sampler-{process.pid}")
        self._sampler.start()

    def record(self) -> dict[str, Any]:
        """Stop sampling and return the record: the command's exit status (None while it runs), wall
        time, the group's limits, its peak memory, out-of-memory kills, CPU use and the processes seen."""
        self._stop.set()
        bound = 10 * SAMPLE_SECONDS + 5  # one sample reads a few /proc files per process: milliseconds
        self._sampler.join(timeout=bound)
        if self._sampler.is_alive():
            raise CgroupError(f"the sampler of cgroup {self.group.name} did not stop within {bound:.0f} s")
        return {"in_cgroup": True, "command": self.command, "returncode": self.process.poll(),
                "wall_seconds": round((self.ended or time.monotonic()) - self.started, 1), **self.group.describe(),
                **self.group.readings(self.sample), **_processes(self.sample)}


class ServerError(CgroupError):
    """The Jupyter server did not start or answer in time; the message names its command and log."""


class JupyterServer:
    """``jupyter lab`` inside a :class:`BinderCgroup`, as on mybinder.org, where the server and the kernels
    it starts share the session's memory.

        with BinderCgroup() as group:
            record = group.run(command, server=JupyterServer(group))

    It listens on a free port of 127.0.0.1 and answers only with its random token (given in
    ``JUPYTER_TOKEN``, so it is in no command line); its root, runtime (``jpserver-*.json``) and config
    folders are in a temporary folder that :meth:`stop` deletes. Its log goes to ``log`` (kept) or into
    that folder (then a failure's message holds the log's last lines).
    """

    def __init__(self, group: BinderCgroup, log: Path | None = None, python: str = sys.executable,
                 ready_timeout: float = SERVER_READY_TIMEOUT, stop_timeout: float = SERVER_STOP_TIMEOUT,
                 argv: list[str] | None = None):
        """``argv``: another server command (tests), with ``{port}`` and ``{root}`` filled in."""
        self.group, self.python, self.keep_log = group, python, log
        self.ready_timeout, self.stop_timeout, self.argv = ready_timeout, stop_timeout, argv
        self.process: subprocess.Popen | None = None
        self.folder: Path | None = None
        self.port = 0
        self.token = secrets.token_hex(24)
        self.facts: dict[str, Any] = {}

    @property
    def log(self) -> Path:
        return self.keep_log or (self.folder or Path(tempfile.gettempdir())) / "server.log"

    def command(self) -> list[str]:
        root = str(self.folder / "root")
        if self.argv is not None:
            return [arg.format(port=self.port, root=root) for arg in self.argv]
        as_root = ["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []  # this tool runs as root; Binder does not
        return [self.python, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}", *as_root]

    def start(self) -> None:
        """Start the server in the group and wait until ``GET /api/status`` answers with the token;
        a :class:`ServerError` (after stopping it) if it exits first or does not answer in time."""
        started = time.monotonic()
        try:
            self.folder = Path(tempfile.mkdtemp(prefix="kit-binder-server-"))
            for name in ("root", "runtime", "config"):
                (self.folder / name).mkdir()
            self.port = free_port("127.0.0.1")  # the server is told not to try another: port_retries=0
            env = {**os.environ, "JUPYTER_TOKEN": self.token, "JUPYTER_RUNTIME_DIR": str(self.folder / "runtime"),
                   "JUPYTER_CONFIG_DIR": str(self.folder / "config")}
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("wb") as log:
                self.process = self.group.popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env, cwd=self.folder)
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.facts["ready_seconds"] = round(time.monotonic() - started, 1)
        self.facts["in_group"] = self.group.names_this_group(Path(f"/proc/{self.process.pid}/cgroup").read_text())
        import psutil

        rss, shared = psutil.Process(self.process.pid).memory_info()[:3:2]
        self.facts.update(rss_bytes_at_ready=rss, anon_bytes_at_ready=rss - shared)

    def _wait_ready(self, started: float) -> None:
        url = f"http://127.0.0.1:{self.port}/api/status"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        request = urllib.request.Request(url, headers={"Authorization": f"token {self.token}"})
        last = "no answer yet"
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerError(f"the Jupyter server ({self._described()}) exited with status {code} before "
                                  f"{url} answered; {self._log_tail()}")
            try:
                with opener.open(request, timeout=5) as answer:
                    json.load(answer)
                    return
            except (urllib.error.URLError, OSError, ValueError) as error:
                last = f"{type(error).__name__}: {getattr(error, 'reason', error)}"
            if time.monotonic() - started > self.ready_timeout:
                raise ServerError(f"the Jupyter server ({self._described()}) did not answer {url} within "
                                  f"{self.ready_timeout:.0f} s (last: {last}); {self._log_tail()}")
            time.sleep(0.25)

    def _described(self) -> str:
        return f"pid {self.process.pid}: {' '.join(self.command())}" if self.process else "not started"

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError as error:
            return f"its log {self.log} could not be read: {error}"
        kept = "" if self.keep_log else " (deleted with the server's temporary folder)"
        return f"its log {self.log}{kept} ends:\n" + "\n".join(tail)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :attr:`stop_timeout` s; then its temporary folder goes."""
        try:
            if self.process is not None and self.process.poll() is not None and "stopped" not in self.facts:
                self.facts["stopped"] = f"had exited by itself (status {self.process.returncode})"
            if self.process is not None and self.process.poll() is None:
                stopping = time.monotonic()
                self.process.terminate()
                try:
                    self.process.wait(timeout=self.stop_timeout)
                    self.facts["stopped"] = f"SIGTERM: exited in {time.monotonic() - stopping:.1f} s"
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=REMOVE_TIMEOUT)
                    self.facts["stopped"] = f"SIGKILL after {self.stop_timeout:.0f} s of SIGTERM"
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.facts["folder_removed"] = not self.folder.exists()

    def describe(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record's ``jupyter_server``: inside the group (as the sampler saw it, and its /proc cgroup
        file at start), its memory at start and at most, how it stopped."""
        peak = record.get("peak_by_kind", {}).get("jupyter-server", {})
        return {"inside": record["processes_seen"].get("jupyter-server", 0) >= 1 and self.facts.get("in_group", False),
                "command": self.command() if self.process else None, "pid": self.process.pid if self.process else None,
                **self.facts, "peak_rss_bytes": peak.get("rss"), "peak_anon_bytes": peak.get("anon"),
                "log": str(self.keep_log) if self.keep_log else None}


def _kind(cmdline: list[str]) -> str | None:
    """The kit's process kinds, the notebook kernels and the Jupyter server, by command line."""
    text = " ".join(cmdline)
    if "kit.core._boot ipyparallel.engine" in text or "kit.core._zygote ipyparallel.engine" in text:
        return "engine"  # the zygote's forked engines keep its command line (kit.core._zygote); it counts too
    if "kit.core._boot kit.core._controller" in text:
        return "controller"
    if cmdline[3:4] == ["binder-cgroup"] or any(Path(arg).name == "sandbox.py" for arg in cmdline[:2]):
        return None  # a kernel on its way in (joining the group, then dropping to --as-user): it execs the kernel
    if "ipykernel_launcher" in text or "-m ipykernel" in text:
        return "kernel"
    if (cmdline[1:3] in (["-m", "jupyterlab"], ["-m", "jupyter_server"])
            or any(Path(arg).name in ("jupyter-lab", "jupyter-server") for arg in cmdline[:2])):
        return "jupyter-server"  # by its program, not by any mention (a `python -c` script may name it)
    return None


def _other_kind(cmdline: list[str]) -> str:
    """How the memory breakdown names a process that :func:`_kind` does not."""
    text = " ".join(cmdline)
    if "ipyparallel.engine.nanny" in text:
        return "nanny"  # ipyparallel's per-engine watcher (one per engine)
    if "pytest" in text:
        return "pytest"  # the command: nbval and the notebooks' cells' results
    return "other"


def _processes(sample: Sample) -> dict[str, Any]:
    return {"samples": sample.samples,
            "processes_seen": {k: len(v) for k, v in sorted(sample.seen.items())},
            "processes_max_concurrent": dict(sorted(sample.max_concurrent.items())),
            "users_seen": {k: sorted(v) for k, v in sorted(sample.users.items())},
            "escaped_processes": {str(pid): cgroup for pid, cgroup in sample.escaped.items()},
            "kernels": [span.as_dict() for span in sample.kernels.values()],
            "at_peak": sample.run.at_peak if sample.run else {},
            "peak_by_kind": dict(sorted(sample.kind_peaks.items())),
            "sampler_errors": sample.errors}


# ----- command line ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [options] -- command [args...]")
    parser.add_argument("--memory-gib", type=float, default=BINDER_MEMORY / GiB, help="memory limit (GiB)")
    parser.add_argument("--cpus", type=_cpus, default=BINDER_CPUS,
                        help=f"CPU quota, in CPUs, or 'none' for no quota (default {BINDER_CPUS:g}, Binder's)")
    parser.add_argument("--record", type=Path, help="write the JSON record here")
    parser.add_argument("--if-possible", action="store_true",
                        help="without root or cgroup controllers, run the command without limits (and say so)")
    parser.add_argument("--with-server", action="store_true",
                        help="start a Jupyter server (jupyter lab) inside the group before the command and stop "
                             "it after, as on mybinder.org; its log goes next to --record (.server.log)")
    parser.add_argument("--kernels-inside", action="store_true",
                        help=f"run the command (a notebook runner: nbval) outside the group and only the notebook "
                             f"kernels it starts inside: it gets a kernelspec named {KERNEL_NAME} (pass "
                             f"--nbval-kernel-name {KERNEL_NAME}). On mybinder.org the Jupyter server starts the "
                             f"kernels; a runner inside the group as well would count twice")
    parser.add_argument("--as-user", metavar="USER",
                        help="with --kernels-inside: run the kernels as USER (created if missing) with new namespaces "
                             "refused, as mybinder.org runs them (user jovyan, Docker's seccomp profile: "
                             "tools/sandbox.py); needs root")
    parser.add_argument("--writable", type=Path, action="append", default=[], metavar="DIR",
                        help="with --as-user: a folder the kernels write in (the notebooks' outputs); repeatable")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.as_user and not (args.kernels_inside and os.geteuid() == 0):
        parser.error("--as-user needs --kernels-inside and root (it drops the kernels to that user)")
    reason = unavailable()
    if reason is not None:
        if not args.if_possible:
            print(f"binder-cgroup: {reason}", file=sys.stderr)
            return SETUP_FAILED
        print(f"binder-cgroup: running without the Binder-sized cgroup ({_size(args.memory_gib, args.cpus)}): "
              f"{reason}", file=sys.stderr)
        started = time.monotonic()
        with kernels_environment(args.kernels_inside, None, args.as_user, args.writable) as env:
            returncode = subprocess.call(command, env=env)
        _write_record(args.record, {"in_cgroup": False, "reason": reason, "command": command,
                                    "returncode": returncode, "wall_seconds": round(time.monotonic() - started, 1)})
        return returncode
    # SIGTERM (CI cancelling, make killed) must still remove the group: turn it into an exception here
    signal.signal(signal.SIGTERM, _interrupted)
    with BinderCgroup(memory=int(args.memory_gib * GiB), cpus=args.cpus) as group:
        server = None
        if args.with_server:
            log = args.record.with_suffix(".server.log") if args.record else None
            server = JupyterServer(group, log=log)
        print(f"binder-cgroup: running in cgroup v{group.layout.version} {group.name}: "
              f"{_size(args.memory_gib, args.cpus)}" + (", with a Jupyter server inside" if server else "")
              + (", the command outside and its kernels inside" if args.kernels_inside else ""), file=sys.stderr)
        try:
            with kernels_environment(args.kernels_inside, group, args.as_user, args.writable) as env:
                record = group.run(command, server=server, inside=not args.kernels_inside, env=env)
        except ServerError as error:
            print(f"binder-cgroup: {error}", file=sys.stderr)
            return SETUP_FAILED
    record["kernels_as"] = args.as_user and {"user": args.as_user, "namespaces": "refused"}
    _write_record(args.record, record)
    served = record["jupyter_server"]
    print(f"binder-cgroup: exit {record['returncode']} after {record['wall_seconds']:.0f} s; peak memory "
          f"{record['peak_memory_bytes'] / 2**20:.0f} MiB of {group.memory / 2**20:.0f} "
          f"(working set {record['peak_working_set_bytes'] / 2**20:.0f} MiB, sampled), "
          f"{record['oom_kills']} out-of-memory kill(s); processes seen inside: {record['processes_seen']}"
          + (f"; Jupyter server inside: {served['inside']}, {served['rss_bytes_at_ready'] / 2**20:.0f} MiB "
             f"resident at start, {(served['peak_rss_bytes'] or 0) / 2**20:.0f} MiB at most" if served else ""),
          file=sys.stderr)
    return record["returncode"]


#: The kernel name ``--kernels-inside`` gives the command (nbval: ``--nbval-kernel-name binder-cgroup``).
KERNEL_NAME = "binder-cgroup"


@contextlib.contextmanager
def kernels_environment(kernels_inside: bool, group: BinderCgroup | None, user: str | None = None,
                        writable: list[Path] | None = None):
    """The command's environment: with ``--kernels-inside``, this one plus a temporary ``JUPYTER_PATH`` holding
    the kernelspec of :func:`write_kernelspec` (removed afterwards); else None (the command inherits ours).
    ``user``: the kernels run as that user with namespaces refused (tools/sandbox.py), allowed to run this Python
    and to write in ``writable``, until the command ends."""
    if not kernels_inside:
        yield None
        return
    with contextlib.ExitStack() as undo, tempfile.TemporaryDirectory(prefix="kit-binder-kernels-") as folder:
        learner = None
        if user:
            learner = undo.enter_context(_granted(user, writable or []))
            os.chmod(folder, 0o711)  # the user enters it to read its copy of each connection file
            os.mkdir(Path(folder) / "connections", 0o700)
            os.chown(Path(folder) / "connections", learner.pw_uid, learner.pw_gid)
        yield {**os.environ, **write_kernelspec(Path(folder), group, learner)}


#: Runs of this tool at once (make notebooks starts two) share the user's permissions: the last one out takes them back.
#: The file names the runs that hold them (their lifeline tokens, pid and start time): a run that was killed
#: (SIGKILL) never takes itself out, so a later run finds it dead, takes back what the dead ones granted, and grants
#: afresh.
GRANTS_FILE = Path(tempfile.gettempdir()) / "kit-binder-learner.count"


@contextlib.contextmanager
def _granted(user: str, writable: list[Path]):
    """``user`` (created if missing) may run this Python and write in ``writable`` while any run holds this."""
    import fcntl

    import sandbox  # tools/, beside this file

    me = _lifeline.token(os.getpid())

    def hold(taking: bool) -> None:
        with open(GRANTS_FILE, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            f.seek(0)
            state = json.loads(f.read() or '{"holders": [], "before": {}}')
            holders = [h for h in state.get("holders", []) if h != me and _lifeline.is_alive(*_lifeline.parse(h)[0])]
            if not holders and (not taking or state.get("holders")):  # the last out, or only dead runs held them
                sandbox.revoke_reach(user, sandbox.grant_reach(user))  # granting again names the folders
                for path, extended in state["before"].items():
                    if Path(path).exists():
                        sandbox.revoke_writing(user, Path(path), extended)
                state["before"] = {}
            if taking:
                holders.append(me)
                sandbox.grant_reach(user)
                for path in (p.resolve() for p in writable):
                    if str(path) not in state["before"]:  # the first run to ask for it: what it had before
                        path.mkdir(parents=True, exist_ok=True)
                        state["before"][str(path)] = sandbox.extended_acls(path)
                        sandbox.grant_writing(user, path)
            f.seek(0), f.truncate(), f.write(json.dumps({"holders": holders, "before": state["before"]}))
            if not holders:
                GRANTS_FILE.unlink()

    learner = sandbox.ensure_user(user)
    hold(True)
    try:
        yield learner
    finally:
        hold(False)


def write_kernelspec(folder: Path, group: BinderCgroup | None, user: Any = None) -> dict[str, str]:
    """A Jupyter kernelspec :data:`KERNEL_NAME` in ``folder``: this Python's ipykernel, which joins ``group``
    first (:meth:`BinderCgroup.joining`; as it is without a group), and with ``user`` (a ``pwd`` entry) runs as
    that user with namespaces refused (tools/sandbox.py; the connection file handed over in ``folder``). Returns
    the environment that lets Jupyter find it (``JUPYTER_PATH``)."""
    argv, env = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], {}
    if user is not None:
        argv = [sys.executable, str(Path(__file__).with_name("sandbox.py")), "--user", user.pw_name, "--no-namespaces",
                "--hand-over", "{connection_file}", "--into", str(folder / "connections"), "--", *argv]
    if group is not None:
        argv, env = group.joining(argv)
    spec = {"argv": argv, "env": env, "language": "python", "display_name": "Python 3 (Binder-sized cgroup)"}
    (folder / "kernels" / KERNEL_NAME).mkdir(parents=True)
    (folder / "kernels" / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec, indent=1))
    return {"JUPYTER_PATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("JUPYTER_PATH")]))}


def _cpus(text: str) -> float | None:
    if text.lower() in ("none", "0"):
        return None
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--cpus must be positive or 'none', not {text}")
    return value


def _size(memory_gib: float, cpus: float | None) -> str:
    return f"{memory_gib:g} GiB of memory, " + ("no CPU quota" if cpus is None else f"{cpus:g} CPU")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _write_record(path: Path | None, record: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
