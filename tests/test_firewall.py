"""The servers of a cluster on several hosts: where they can be reached (the ExposedPortsWarning names every
address), and host firewall rules that admit their ports from the peers only (kit.tools.firewall).

These tests read the generated text back; tests/test_slurm_ssh.py loads the rules on emulated hosts
(kit.tools.sim_cluster) and checks that the login node is shut out while the workers still train.
"""

from __future__ import annotations

import re
import socket
import time
from types import SimpleNamespace

import pytest

from kit.core import _remote, roles
from kit.core.errors import ExposedPortsWarning, TFConfigError
from kit.tools import firewall
from kit.tools.firewall import FirewallError



def task(name: str, address: str, reachable_at: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(name=name, address=address, reachable_at=reachable_at)


# ----- where the servers can be reached -------------------------------------------------------------
def test_the_warning_names_every_address_of_every_task():
    tasks = [task("worker:0", "10.66.0.2:2222", ("10.66.0.2:2222", "192.168.1.5:2222", "[fd00::2]:2222")),
             task("worker:1", "10.66.0.3:3333", ("10.66.0.3:3333", "[fe80::1%eth0]:3333")),
             task("evaluator", "")]
    warning = ExposedPortsWarning.about(tasks, "engines from elsewhere", "close the ports")
    message = warning.detail
    assert "\n" not in str(warning) and "docs/security.md" in str(warning) and "10.66" not in str(warning)
    assert ("worker:0 at 10.66.0.2:2222 (reachable at 10.66.0.2:2222, 192.168.1.5:2222, [fd00::2]:2222); "
            "worker:1 at 10.66.0.3:3333 (reachable at 10.66.0.3:3333, [fe80::1%eth0]:3333), "
            "listening on every interface (engines from elsewhere)") in message
    assert "evaluator" not in message  # it runs no server
    assert message.endswith("Fix: close the ports (docs/security.md).")
    # a task whose host showed no address but loopback keeps the old wording
    assert "worker:0 at 127.0.0.1:2222, listening" in ExposedPortsWarning.about(
        [task("worker:0", "127.0.0.1:2222")], "isolation='none' was asked for", "x").detail


def test_each_task_is_reachable_at_every_address_of_its_host(monkeypatch):
    def addr(family, address):
        return SimpleNamespace(family=family, address=address)

    monkeypatch.setattr("psutil.net_if_addrs", lambda: {
        "lo": [addr(socket.AF_INET, "127.0.0.1"), addr(socket.AF_INET6, "::1")],
        "eth0": [addr(socket.AF_INET6, "fe80::1%eth0"), addr(socket.AF_INET, "10.66.0.2"),
                 addr(socket.AF_PACKET, "02:42:ac:11:00:02")],
        "wg0": [addr(socket.AF_INET6, "fd00::2"), addr(socket.AF_INET, "192.168.9.1")]})
    assert _remote.interface_addresses() == ["10.66.0.2", "192.168.9.1", "fd00::2", "fe80::1%eth0"]

    report = {"interfaces": _remote.interface_addresses(), "legacy_keras": "1", "engine_id": 3, "pid": 10,
              "hostname": "h1"}
    config = {"cluster": {"worker": ["10.66.0.2:2222"]}, "task": {"type": "worker", "index": 0}}
    info = roles.task_info("worker:0", report, config, isolated=False)
    assert info.reachable_at == ("10.66.0.2:2222", "192.168.9.1:2222", "[fd00::2]:2222", "[fe80::1%eth0]:2222")
    evaluator = roles.task_info("evaluator", report, {**config, "task": {"type": "evaluator", "index": 0}}, False)
    assert evaluator.reachable_at == ()  # no server


# ----- the rules, read back -------------------------------------------------------------------------
CLUSTER = [task("chief", "10.66.0.2:2000"), task("worker:0", "10.66.0.3:2001"), task("worker:1", "10.66.0.2:2002"),
           task("ps:0", "[fd00::4]:2003"), task("evaluator", "")]


def read_nft(script: str) -> dict:
    """The table, hook line and rules of a script nft_rules wrote: {"accept": {family: (ports, peers)}, ...}."""
    def items(text):
        return sorted(text.strip("{} ").split(", "))

    accept = {family: (items(ports), items(peers)) for ports, family, peers in
              re.findall(r"tcp dport (\{[^}]*\}) (ip6?) saddr (\{[^}]*\}) accept", script)}
    drops = [items(ports) for ports in re.findall(r"tcp dport (\{[^}]*\}) drop", script)]
    tables = re.findall(r"^(table|delete table) inet (\w+)", script, re.M)
    return {"accept": accept, "drop": drops, "tables": tables,
            "hook": "type filter hook input priority filter; policy accept;" in script}


def test_nft_rules_admit_each_hosts_ports_from_the_peers_only():
    rules = firewall.nft_rules(CLUSTER)
    assert sorted(rules) == ["10.66.0.2", "10.66.0.3", "fd00::4"]
    peers = {"ip": (None, ["10.66.0.2", "10.66.0.3"]), "ip6": (None, ["fd00::4"])}
    for host, ports in (("10.66.0.2", ["2000", "2002"]), ("10.66.0.3", ["2001"]), ("fd00::4", ["2003"])):
        read = read_nft(rules[host])
        assert read["accept"] == {family: (ports, addresses) for family, (_, addresses) in peers.items()}, host
        assert read["drop"] == [ports] and read["hook"]
        assert read["tables"] == [("table", "kit"), ("delete table", "kit"), ("table", "kit")]  # replaces the old
        assert rules[host].index(" accept") < rules[host].index(" drop")
    only_v4 = firewall.nft_rules(CLUSTER[:3], table="mine")["10.66.0.3"]
    assert "ip6 saddr" not in only_v4 and read_nft(only_v4)["drop"] == [["2001"]]
    assert {t for _, t in read_nft(only_v4)["tables"]} == {"mine"}
    assert firewall.nft_delete(table="mine") == ["nft", "delete", "table", "inet", "mine"]


def test_iptables_rules_say_the_same():
    rules = firewall.iptables_rules(CLUSTER)
    assert sorted(rules) == ["10.66.0.2", "10.66.0.3", "fd00::4"]
    argvs = rules["10.66.0.2"]
    for tool, peers in (("iptables", "10.66.0.2,10.66.0.3"), ("ip6tables", "fd00::4")):
        mine = [a[1:] for a in argvs if a[0] == tool]
        match = ["-p", "tcp", "-m", "multiport", "--dports", "2000,2002"]
        assert mine == [["-N", "KIT"], ["-A", "KIT", *match, "-s", peers, "-j", "ACCEPT"],
                        ["-A", "KIT", *match, "-j", "DROP"], ["-I", "INPUT", "1", "-j", "KIT"]], tool
    # no IPv6 peer: IPv6 is still closed (the servers listen on [::])
    v6 = [a for a in firewall.iptables_rules(CLUSTER[:3])["10.66.0.3"] if a[0] == "ip6tables"]
    assert [a[-1] for a in v6] == ["KIT", "DROP", "KIT"]
    many = [task(f"worker:{i}", f"10.0.0.2:{3000 + i}") for i in range(17)]
    dports = [a[a.index("--dports") + 1] for a in firewall.iptables_rules(many)["10.0.0.2"]
              if a[0] == "iptables" and a[-1] == "DROP"]
    assert [len(d.split(",")) for d in dports] == [15, 2]  # multiport's limit
    assert firewall.iptables_delete()[:3] == [["iptables", "-D", "INPUT", "-j", "KIT"], ["iptables", "-F", "KIT"],
                                              ["iptables", "-X", "KIT"]]


def test_commands_print_every_host_with_its_removal():
    text = firewall.commands(CLUSTER)
    assert text.count("nft -f - <<'EOF'") == 3 and text.count("# to remove: nft delete table inet kit") == 3
    assert "# on 10.66.0.3 (as root)" in text
    assert "iptables -A KIT -p tcp -m multiport --dports 2001 -s 10.66.0.2,10.66.0.3 -j ACCEPT" in \
        firewall.commands(CLUSTER, form="iptables")
    with pytest.raises(FirewallError, match="form.*Fix: use 'nft' or 'iptables'"):
        firewall.commands(CLUSTER, form="pf")


@pytest.mark.parametrize("tasks, field, words", [
    ([task("worker:0", "10.0.0.2:2000"), task("worker:1", "")], "worker:1.address", "cluster.tasks after start()"),
    ([task("worker:0", "h1:2000")], "worker:0.address", "getaddrinfo('h1', None)"),
    ([task("worker:0", "127.0.0.1:2000")], "worker:0.address", "no rules are needed for a local cluster"),
    ([], "tasks", "pass cluster.tasks"),
])
def test_bad_tasks_are_refused_naming_the_field_and_the_fix(tasks, field, words):
    with pytest.raises(FirewallError) as info:
        firewall.nft_rules(tasks)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")
    assert words in info.value.fix, str(info.value)
    with pytest.raises(TFConfigError, match="'worker:0.address'.*port"):
        firewall.iptables_rules([task("worker:0", "10.0.0.2:http")])


def test_reachable_is_a_bounded_connect():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert firewall.reachable("127.0.0.1", port, 1.0)
    assert not firewall.reachable("127.0.0.1", port, 1.0)  # closed now: refused
    # a listener that accepts nothing, its queue full after one connection: Linux drops further SYNs, as a
    # firewall's drop does, and the connect waits out its timeout
    with socket.create_server(("127.0.0.1", 0), backlog=0) as server:
        port = server.getsockname()[1]
        assert firewall.reachable("127.0.0.1", port, 1.0)  # queued, never accepted
        started = time.monotonic()
        assert not firewall.reachable("127.0.0.1", port, 0.3)
        assert 0.25 < time.monotonic() - started < 5  # its own timeout, not the kernel's minutes of SYN retries
