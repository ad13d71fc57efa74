"""Links between hosts, emulated: each task in a network namespace of its own, joined through a bridge
by virtual ethernet links shaped with Linux ``tc``.

    with kit.TFCluster(workers=2, link="100mbit") as cluster:      # or kit.Link(100e6, delay_s=0.002)
        cluster.run(time_all_reduce, [2_770_634])                   # notebook 10b's

Topology (root only): one namespace per task (a :mod:`kit.core._netns` holder keeps it, the engine joins it
as usual) and one *switch* namespace with a bridge. Task i has ``eth0`` at ``10.88.0.(i+1)/24``; its veth
peer is a port of the bridge. Each task's NIC is full duplex at the link's rate: ``eth0``'s egress is shaped
(the upload), and so is its bridge port's egress (the download); a delay, if any, is added once, on the
upload. There is no other interface and no route out, so the tasks stay as unreachable from the network as
in the kit's private network (docs/security.md).

Shaping: ``tbf`` for the rate. Its bucket lets a burst through at once, so it is kept small: the bucket
holds the larger of two of the largest packets and one timer tick (1 ms) of the rate (:func:`burst_bytes`:
16 KiB at 100 Mbit/s, 1.25 MB at 10 Gbit/s). Below 1 Gbit/s the largest packet veth hands over is limited
to 8 KiB (``gso_max_size``, :func:`gso_bytes`), so that the bucket stays small; from 1 Gbit/s on it keeps
the default 64 KiB, because smaller packets cost the host more per byte (measured: the 11 MB all-reduce at
10 Gbit/s took 73 ms with 8 KiB packets, 41 ms with 64 KiB). The model counts that burst
(:func:`ring_all_reduce_seconds`'s ``burst``): a message smaller than the bucket is not slowed at all.
The queue holds up to :data:`QUEUE_LATENCY` of traffic, so that a gradient's burst is delayed, not dropped.
A delay needs ``netem``, which some kernels lack (it is a module, sch_netem, and e.g. CONFIG_NET_SCH_NETEM
is not set on the machine the kit is tested on): a link asking for a delay there is refused when the
cluster starts, saying so. Each namespace also sets
``net.ipv4.tcp_slow_start_after_idle=0``: gRPC keeps its connections between steps, and Linux would
otherwise restart TCP's slow start after every idle pause, i.e. at every step.

The ring all-reduce model, :func:`ring_all_reduce_seconds`, is what section 5 of notebook 10 and
``kit bench --only links`` compare the measurements with.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess

from .errors import ClusterError, OptionError

SUBNET = "10.88.0"
SMALL_GSO_BYTES, GSO_BYTES = 8 * 1024, 64 * 1024
QUEUE_LATENCY = "1s"
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclasses.dataclass(frozen=True)
class Link:
    """A host's network link: ``bandwidth_bps`` bits per second each way, ``delay_s`` one way."""

    bandwidth_bps: float
    delay_s: float = 0.0

    def __post_init__(self):
        if isinstance(self.bandwidth_bps, bool) or not isinstance(self.bandwidth_bps, (int, float)) \
                or not 1e3 <= self.bandwidth_bps <= 1e12:
            raise OptionError("link", f"bandwidth {self.bandwidth_bps!r} bit/s is not between 1 kbit/s and "
                                      "1 Tbit/s", "e.g. link='100mbit' or kit.Link(100e6)")
        if isinstance(self.delay_s, bool) or not isinstance(self.delay_s, (int, float)) \
                or not 0 <= self.delay_s <= 10:
            raise OptionError("link", f"delay {self.delay_s!r} s is not between 0 and 10 s",
                              "e.g. link='1gbit 2ms' or kit.Link(1e9, delay_s=0.002)")

    @classmethod
    def parse(cls, text: "str | Link") -> "Link":
        """``"100mbit"``, ``"1gbit 2ms"``, ``"10gbit 100us"`` (tc's units) → a Link; a Link is returned as is."""
        if isinstance(text, Link):
            return text
        if not isinstance(text, str):
            raise OptionError("link", f"{text!r} is not a link", "give e.g. link='100mbit' or kit.Link(100e6)")
        words = text.lower().split()
        rate = re.fullmatch(r"([0-9.]+)(bit|kbit|mbit|gbit|tbit)", words[0]) if words else None
        delay = re.fullmatch(r"([0-9.]+)(s|ms|us)", words[1]) if len(words) == 2 else None
        if rate is None or len(words) > 2 or (len(words) == 2 and delay is None):
            raise OptionError("link", f"{text!r} is not 'RATE' or 'RATE DELAY'",
                              "write the rate in tc's units (kbit, mbit, gbit) and the delay in s, ms or us, "
                              "e.g. '100mbit' or '1gbit 2ms'")
        try:
            bandwidth = float(rate.group(1)) * _UNITS[rate.group(2)]
            seconds = float(delay.group(1)) * _TIMES[delay.group(2)] if delay else 0.0
        except ValueError:
            raise OptionError("link", f"{text!r} has a number that is not one", "e.g. '2.5gbit'") from None
        return cls(bandwidth, seconds)

    def __str__(self) -> str:
        rate = next(f"{self.bandwidth_bps / f:g}{u}" for u, f in sorted(_UNITS.items(), key=lambda x: -x[1])
                    if self.bandwidth_bps >= f)
        return rate + (f" {self.delay_s * 1e3:g}ms" if self.delay_s else "")


def gso_bytes(bandwidth_bps: float) -> int:
    """The largest packet a link of this rate hands over (see the module docstring)."""
    return SMALL_GSO_BYTES if bandwidth_bps < 1e9 else GSO_BYTES


def burst_bytes(bandwidth_bps: float) -> int:
    """The token bucket of a link's ``tbf``: two of the largest packets, or 1 ms of the rate if more."""
    return int(max(2 * gso_bytes(bandwidth_bps), bandwidth_bps / 8 * 1e-3))


def ring_all_reduce_seconds(nbytes: float, workers: int, bandwidth_bps: float, latency_s: float = 0.0,
                            host_bps: float | None = None, host_s: float = 0.0, burst: float = 0.0) -> float:
    """The ring all-reduce's time: 2(N−1) steps (reduce-scatter, then all-gather), in each of which every
    worker sends and receives ``nbytes``/N over its link and waits ``latency_s``: 2(N−1)/N · ``nbytes`` / b
    plus 2(N−1) latencies. The host's own cost adds in series: ``host_bps`` per byte and ``host_s`` per call
    (copying, serializing through gRPC; fitted unshaped). ``burst``: the bytes of each message a token-bucket
    link lets through at once (:func:`burst_bytes`; 0 for a real link)."""
    if workers < 2:
        return 0.0
    steps = 2 * (workers - 1)
    link = steps * max(0.0, nbytes / workers - burst) * 8 / bandwidth_bps
    moved = steps / workers * nbytes * 8
    return link + steps * latency_s + (moved / host_bps if host_bps else 0.0) + host_s


def available(link: "Link | None" = None) -> str | None:
    """None if emulated links (``link``'s delay included) can be made here; else the reason."""
    if not os.uname().sysname == "Linux":
        return f"emulated links need Linux network namespaces (this is {os.uname().sysname})"
    if os.geteuid() != 0:
        return "emulated links need root (they create network namespaces, veth links and tc qdiscs)"
    missing = [tool for tool in ("ip", "tc", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install iproute2 util-linux)"
    if link is not None and link.delay_s > 0:
        probe = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                                "1ms"], capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            return ("this kernel has no netem qdisc (sch_netem), which a delay needs: "
                    f"{(probe.stderr.strip() or 'tc failed').splitlines()[-1]}")
    return None


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise ClusterError(f"setting up the emulated links failed: {' '.join(args)}: {done.stderr.strip()}",
                           fix="run as root on Linux with iproute2; kit.core.links.available() says what is missing")


def _in(pid: int, *args: str) -> None:
    _run("nsenter", "-t", str(pid), "-n", *args)


class LinkedNetwork:
    """One namespace per task and a switch namespace, joined and shaped as the module docstring says."""

    def __init__(self, link: Link, names: list[str], lifeline: str):
        from . import _netns

        self.link = link
        self.names = list(names)
        self.addresses = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(self.names)}
        self.holders: dict[str, _netns.PrivateNetwork] = {}
        self.switch: _netns.PrivateNetwork | None = None
        try:
            self.switch = _netns.PrivateNetwork.start(lifeline)
            for name in self.names:
                self.holders[name] = _netns.PrivateNetwork.start(lifeline)
            self._wire()
        except BaseException:
            self.stop()
            raise

    def _wire(self) -> None:
        switch = self.switch.pid
        _in(switch, "ip", "link", "add", "name", "br0", "type", "bridge")
        _in(switch, "ip", "link", "set", "br0", "up")
        rate = f"{self.link.bandwidth_bps:.0f}bit"
        for i, name in enumerate(self.names):
            task = self.holders[name].pid
            port = f"p{i}"
            _run("ip", "link", "add", "name", "eth0", "netns", str(task), "type", "veth",
                 "peer", "name", port, "netns", str(switch))
            _in(task, "ip", "addr", "add", f"{self.addresses[name]}/24", "dev", "eth0")
            _in(task, "ip", "link", "set", "eth0", "gso_max_size", str(gso_bytes(self.link.bandwidth_bps)))
            _in(task, "ip", "link", "set", "eth0", "up")
            # /proc/sys/net shows the namespace of the writer (no procps needed for sysctl)
            _in(task, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle")
            _in(switch, "ip", "link", "set", port, "gso_max_size", str(gso_bytes(self.link.bandwidth_bps)))
            _in(switch, "ip", "link", "set", port, "master", "br0")
            _in(switch, "ip", "link", "set", port, "up")
            if self.link.delay_s > 0:  # netem shapes the rate and adds the delay on the upload
                _in(task, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay",
                    f"{self.link.delay_s * 1e6:.0f}us", "rate", rate, "limit", "100000")
            else:
                _in(task, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
                    "burst", str(burst_bytes(self.link.bandwidth_bps)), "latency", QUEUE_LATENCY)
            _in(switch, "tc", "qdisc", "add", "dev", port, "root", "tbf", "rate", rate,
                "burst", str(burst_bytes(self.link.bandwidth_bps)), "latency", QUEUE_LATENCY)

    def token(self, name: str) -> str:
        """The KIT_NETNS value that puts task ``name``'s engine in its namespace."""
        return self.holders[name].token

    def alive(self) -> bool:
        return self.switch is not None and self.switch.alive() and all(h.alive() for h in self.holders.values())

    def stop(self) -> None:
        """End every holder; each namespace, with its veth, goes when its last process has exited."""
        for holder in [*self.holders.values(), self.switch]:
            if holder is not None:
                holder.stop()
        self.holders, self.switch = {}, None
