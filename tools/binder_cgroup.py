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
counted it, out-of-memory kills, CPU time, throttled time), its exit status and wall time.

The group is always removed: leftover processes are killed and waited for (bounded) and the
folders deleted, also when the command fails or this tool is interrupted. Without root or without
cgroup memory and cpu controllers, :func:`unavailable` says what is missing, and ``--if-possible``
runs the command without limits instead (the record says why).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kit.core import _lifeline, limits  # noqa: E402  (the repository's own kit, also when not installed)

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
        groups = limits._cgroup_dirs(Path("/proc"))  # noqa: SLF001  (this process's cgroup folders)
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


@dataclasses.dataclass
class KernelSpan:
    """The group's memory while one notebook kernel lived (first to last sample that saw it)."""

    first_seen: float
    last_seen: float
    peak: Memory

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.last_seen - self.first_seen, 1), "peak_usage_bytes": self.peak.usage,
                "peak_working_set_bytes": self.peak.working_set, "peak_anon_bytes": self.peak.anon}


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
    command_pid: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


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

    def _names_this_group(self, proc_cgroup: str) -> bool:
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
    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``command`` inside the group: a shell joins it, then execs the command, so the
        command and all it starts are inside from their first instruction."""
        procs_files = "\n".join(str(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values()))
        join = ("IFS='\n'; for f in $KIT_BINDER_CGROUP_PROCS; do "
                'echo $$ > "$f" || { echo "cannot join the cgroup: $f" >&2; exit %d; }; done; '
                'unset IFS KIT_BINDER_CGROUP_PROCS; exec "$@"' % SETUP_FAILED)
        env = {**(kwargs.pop("env", None) or os.environ), "KIT_BINDER_CGROUP_PROCS": procs_files}
        return subprocess.Popen(["/bin/sh", "-c", join, "binder-cgroup", *command], env=env, **kwargs)

    def start(self, command: list[str], **kwargs: Any) -> "Watched":
        """Start ``command`` in the group (:meth:`popen`) and sample the group until :meth:`Watched.record`.

        For a process that a test stops itself (a Jupyter server, say); :meth:`run` waits for one.
        """
        process = self.popen(command, **kwargs)
        return Watched(self, command, process)

    def run(self, command: list[str], timeout: float | None = None, **kwargs: Any) -> dict[str, Any]:
        """Run ``command`` in the group until it ends (or ``timeout`` s: then it is killed and
        :class:`subprocess.TimeoutExpired` raised); return the record (see :meth:`Watched.record`)."""
        watched = self.start(command, **kwargs)
        try:
            watched.process.wait(timeout=timeout)
        except BaseException:  # a timeout, or this tool interrupted: the group's processes must go too
            watched.process.kill()
            watched.process.wait(timeout=REMOVE_TIMEOUT)
            watched.record()  # stops the sampler; the group goes with the context
            raise
        return watched.record()

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
        for proc in psutil.process_iter(["pid", "ppid", "cmdline", "environ"]):
            info = proc.info
            if info["environ"] is None or info["cmdline"] is None:
                continue  # gone meanwhile, or a zombie
            kind = _kind(info["cmdline"])
            owners = {pid for pid, _ in _lifeline.parse(info["environ"].get(_lifeline.LIFELINE_VAR, ""))}
            if info["pid"] in inside:
                if kind:
                    sample.seen.setdefault(kind, set()).add(info["pid"])
                    counts[kind] = counts.get(kind, 0) + 1
                if kind == "kernel" and info["ppid"] == sample.command_pid:
                    span = sample.kernels.setdefault(info["pid"], KernelSpan(now, now, memory))
                    span.last_seen, span.peak = now, span.peak.max(memory)
            elif owners & inside:  # the kit started it for a process in the group, yet it is outside
                try:
                    cgroups = Path(f"/proc/{info['pid']}/cgroup").read_text().strip()
                except FileNotFoundError:
                    continue  # exited meanwhile
                if self._names_this_group(cgroups):
                    continue  # started after the group's list was read: a child stays in its parent's group
                sample.escaped[info["pid"]] = cgroups
        for kind, count in counts.items():
            sample.max_concurrent[kind] = max(sample.max_concurrent.get(kind, 0), count)


class Watched:
    """A command started in a :class:`BinderCgroup`, with the sampler that watches the group."""

    def __init__(self, group: BinderCgroup, command: list[str], process: subprocess.Popen):
        self.group, self.command, self.process = group, command, process
        self.started = time.monotonic()
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
                "wall_seconds": round(time.monotonic() - self.started, 1), **self.group.describe(),
                **self.group.readings(self.sample), **_processes(self.sample)}


def _kind(cmdline: list[str]) -> str | None:
    """The kit's process kinds, by command line."""
    text = " ".join(cmdline)
    if "kit.core._lifeline ipyparallel.engine" in text:
        return "engine"
    if "kit.core._lifeline kit.core._controller" in text:
        return "controller"
    if "ipykernel_launcher" in text or "-m ipykernel" in text:
        return "kernel"
    return None


def _processes(sample: Sample) -> dict[str, Any]:
    return {"samples": sample.samples,
            "processes_seen": {k: len(v) for k, v in sorted(sample.seen.items())},
            "processes_max_concurrent": dict(sorted(sample.max_concurrent.items())),
            "escaped_processes": {str(pid): cgroup for pid, cgroup in sample.escaped.items()},
            "kernels": [span.as_dict() for span in sample.kernels.values()],
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
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    reason = unavailable()
    if reason is not None:
        if not args.if_possible:
            print(f"binder-cgroup: {reason}", file=sys.stderr)
            return SETUP_FAILED
        print(f"binder-cgroup: running without the Binder-sized cgroup ({_size(args.memory_gib, args.cpus)}): "
              f"{reason}", file=sys.stderr)
        started = time.monotonic()
        returncode = subprocess.call(command)
        _write_record(args.record, {"in_cgroup": False, "reason": reason, "command": command,
                                    "returncode": returncode, "wall_seconds": round(time.monotonic() - started, 1)})
        return returncode
    # SIGTERM (CI cancelling, make killed) must still remove the group: turn it into an exception here
    signal.signal(signal.SIGTERM, _interrupted)
    with BinderCgroup(memory=int(args.memory_gib * GiB), cpus=args.cpus) as group:
        print(f"binder-cgroup: running in cgroup v{group.layout.version} {group.name}: "
              f"{_size(args.memory_gib, args.cpus)}", file=sys.stderr)
        record = group.run(command)
    _write_record(args.record, record)
    print(f"binder-cgroup: exit {record['returncode']} after {record['wall_seconds']:.0f} s; peak memory "
          f"{record['peak_memory_bytes'] / 2**20:.0f} MiB of {group.memory / 2**20:.0f} "
          f"(working set {record['peak_working_set_bytes'] / 2**20:.0f} MiB, sampled), "
          f"{record['oom_kills']} out-of-memory kill(s); processes seen inside: {record['processes_seen']}",
          file=sys.stderr)
    return record["returncode"]


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
