"""Host firewall rules for a cluster on several hosts: each task's port admitted from the cluster's peers only.

A TensorFlow server binds every interface of its host and has no authentication (docs/security.md), so on
hosts that other machines reach, the task ports must be closed to everyone but the peers. From a running
cluster's tasks (``cluster.tasks``) this module writes, for each host (by its tasks' address):

- :func:`nft_rules`: an nftables script with a table of its own (``inet kit``: IPv4 and IPv6), to load as
  root with ``nft -f -`` on that host; loading it again replaces the table at once (after a restart gave the
  tasks new ports), and :func:`nft_delete` removes it and nothing else;
- :func:`iptables_rules`: the same as ``iptables``/``ip6tables`` commands in a chain of their own (``KIT``),
  for hosts without nftables; :func:`iptables_delete` removes the chain.

:func:`commands` prints both for a person to paste, host by host; :func:`reachable` is a bounded TCP connect,
to check the result. The peers are the tasks' own addresses (TF_CONFIG's hosts): a task connects to a peer's
address from its host's address on that network, which is the address the peers know it by. A firewall does
not keep out other users of a task's own host: their connections come from that host's address, a peer's.
Pure: the functions only write text; nothing here touches a firewall.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import shlex
import socket
from typing import Iterable

from kit.core import tfconfig
from kit.core.errors import KitError

#: The nftables table (family ``inet``) and the iptables chain the rules live in, unless told otherwise.
TABLE = "kit"
CHAIN = "KIT"
#: iptables' multiport match takes at most 15 ports per rule.
MULTIPORT_LIMIT = 15


class FirewallError(KitError, ValueError):
    """The tasks given cannot be turned into firewall rules; ``field`` names the offending part."""

    fix = "pass cluster.tasks of a running TFCluster whose engines are on other hosts (engines=...)"

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"{field}: {problem}", fix)


@dataclasses.dataclass(frozen=True)
class HostPorts:
    """One host's share of the rules: its address, and the ports of the task servers on it."""

    address: str                     #: the host's address, as its tasks' TF_CONFIG gives it
    ports: tuple[int, ...]           #: the ports of its tasks' servers, sorted
    tasks: tuple[str, ...]           #: the names of those tasks


def plan(tasks: Iterable) -> tuple[dict[str, HostPorts], list[str], list[str]]:
    """Each host's ports (by host address), and the peers' IPv4 and IPv6 addresses, from ``tasks``
    (records with ``.name`` and ``.address`` "host:port", as ``cluster.tasks``); checked, each problem
    raised as a :class:`FirewallError` naming the task's field and the fix."""
    hosts: dict[str, dict[str, list]] = {}
    tasks = list(tasks)
    if not tasks:
        raise FirewallError("tasks", "no tasks were given", "pass cluster.tasks of a running cluster")
    for index, task in enumerate(tasks):
        name = getattr(task, "name", None) or f"tasks[{index}]"
        address = getattr(task, "address", None)
        if tfconfig.parse_task(name)[0] == "evaluator" and not address:
            continue  # the evaluator runs no server (and connects to none)
        if not address:
            raise FirewallError(f"{name}.address", "the task has no address (no server to admit peers to)",
                                "pass the tasks of a running cluster (cluster.tasks after start()); only the "
                                "evaluator has none")
        host, port = tfconfig.parse_address(address, f"{name}.address")
        ip = _ip(host.strip("[]"), name, address)
        entry = hosts.setdefault(ip.compressed, {"ports": [], "tasks": []})
        entry["ports"].append(port)
        entry["tasks"].append(name)
    by_host = {h: HostPorts(h, tuple(sorted(set(e["ports"]))), tuple(e["tasks"])) for h, e in hosts.items()}
    ips = [ipaddress.ip_address(h) for h in by_host]
    return (by_host, [str(a) for a in sorted(a for a in ips if a.version == 4)],
            [str(a) for a in sorted(a for a in ips if a.version == 6)])


def _ip(host: str, name: str, address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise FirewallError(f"{name}.address", f"{address!r} names the host {host!r}, not an IP address, and a "
                            "firewall matches addresses", f"resolve it first (socket.getaddrinfo({host!r}, None)) "
                            "and pass tasks with IP addresses; a TFCluster with engines=... gives them") from None
    if ip.is_loopback:
        raise FirewallError(f"{name}.address", f"{address!r} is a loopback address: a cluster on this machine, "
                            "which no other host reaches at it", "no rules are needed for a local cluster: its "
                            "private network namespace keeps it from the network (docs/security.md)")
    return ip


def nft_rules(tasks: Iterable, *, table: str = TABLE) -> dict[str, str]:
    """For each host address, the nftables script that admits its tasks' ports from the peers only.

    Load it as root on that host with ``nft -f -``. The table is the script's own (``inet``, so one drop
    covers IPv4 and IPv6, as the servers listen on both); its input chain, at the filter priority, accepts
    the ports from the peers and drops them from anyone else, and leaves every other port alone. The script
    first creates and deletes the table, so that loading it again (new ports after a restart) replaces the
    old rules in one transaction. Remove it with :func:`nft_delete`.
    """
    hosts, peers4, peers6 = plan(tasks)
    scripts = {}
    for address, host in hosts.items():
        ports = "{ " + ", ".join(map(str, host.ports)) + " }"
        accept = [f"\t\ttcp dport {ports} ip saddr {{ {', '.join(peers4)} }} accept\n"] if peers4 else []
        if peers6:
            accept.append(f"\t\ttcp dport {ports} ip6 saddr {{ {', '.join(peers6)} }} accept\n")
        scripts[address] = (
            f"# kit: the TensorFlow servers of {', '.join(host.tasks)} on {address}, from the cluster's peers only\n"
            f"table inet {table}\n"
            f"delete table inet {table}\n"
            f"table inet {table} {{\n"
            "\tchain input {\n"
            "\t\ttype filter hook input priority filter; policy accept;\n"
            + "".join(accept) +
            f"\t\ttcp dport {ports} drop\n"
            "\t}\n"
            "}\n")
    return scripts


def nft_delete(*, table: str = TABLE) -> list[str]:
    """The command that removes what :func:`nft_rules` loaded on a host (its table, nothing else)."""
    return ["nft", "delete", "table", "inet", table]


def iptables_rules(tasks: Iterable, *, chain: str = CHAIN) -> dict[str, list[list[str]]]:
    """For each host address, the ``iptables`` and ``ip6tables`` commands (argv lists, to run in order as
    root on that host) that admit its tasks' ports from the peers only, in a chain of their own jumped to
    first from INPUT. Run :func:`iptables_delete` first when replacing them (new ports after a restart)."""
    hosts, peers4, peers6 = plan(tasks)
    rules = {}
    for address, host in hosts.items():
        argvs: list[list[str]] = []
        for tool, peers in (("iptables", peers4), ("ip6tables", peers6)):
            argvs.append([tool, "-N", chain])
            for group in _groups(host.ports):
                match = ["-p", "tcp", "-m", "multiport", "--dports", ",".join(map(str, group))]
                if peers:
                    argvs.append([tool, "-A", chain, *match, "-s", ",".join(peers), "-j", "ACCEPT"])
                argvs.append([tool, "-A", chain, *match, "-j", "DROP"])
            argvs.append([tool, "-I", "INPUT", "1", "-j", chain])
        rules[address] = argvs
    return rules


def iptables_delete(*, chain: str = CHAIN) -> list[list[str]]:
    """The commands that remove what :func:`iptables_rules` added on a host (the jump, then the chain)."""
    return [[tool, *args] for tool in ("iptables", "ip6tables")
            for args in (("-D", "INPUT", "-j", chain), ("-F", chain), ("-X", chain))]


def _groups(ports: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [ports[i:i + MULTIPORT_LIMIT] for i in range(0, len(ports), MULTIPORT_LIMIT)]


def commands(tasks: Iterable, *, form: str = "nft") -> str:
    """The rules of every host as shell commands to paste, host by host (``form``: "nft" or "iptables"),
    with the commands that remove them: ``print(firewall.commands(cluster.tasks))``."""
    if form == "nft":
        removal = shlex.join(nft_delete())
        blocks = [f"# on {address} (as root)\nnft -f - <<'EOF'\n{script}EOF\n# to remove: {removal}\n"
                  for address, script in nft_rules(tasks).items()]
    elif form == "iptables":
        removal = "; ".join(shlex.join(c) for c in iptables_delete())
        blocks = [f"# on {address} (as root)\n" + "".join(shlex.join(c) + "\n" for c in argvs)
                  + f"# to remove: {removal}\n" for address, argvs in iptables_rules(tasks).items()]
    else:
        raise FirewallError("form", f"unknown form {form!r}", "use 'nft' or 'iptables'")
    return "\n".join(blocks)


def reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted within ``timeout`` seconds.

    False when it is refused, unreachable or unanswered (a firewall's drop: the connect then waits out the
    timeout); other errors (a bad address) are raised.
    """
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (ConnectionRefusedError, TimeoutError):
        return False
    except OSError as error:
        if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET):
            return False
        raise
