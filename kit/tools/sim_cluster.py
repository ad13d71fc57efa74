"""A cluster in a box: emulated hosts with Slurm and SSH, on this machine, for the tests and to try things.

Each *host* is a Linux network namespace on a bridge, with its own address and hostname (``h1``, ``h2``,
...), running what a compute node of a university cluster runs: ``slurmd`` (Debian's slurm-wlm) and an
``sshd`` with its own host key. On this machine: ``munged`` (Slurm's authentication) and ``slurmctld`` (the
controller) listen on the bridge's address, as a login node's would. ipyparallel's Slurm and SSH engine
launchers then start engines on the hosts exactly as on a real cluster: ``sbatch``/``srun``/``scancel``,
``ssh``/``scp``; the kit's ``TFCluster(engines=ipp.Cluster(...))`` groups them into TensorFlow tasks.

    kit sim-cluster up --hosts 2 --dir /tmp/kit-sim     # prints the hosts and the environment to use
    kit sim-cluster down --dir /tmp/kit-sim             # everything gone again

or, in Python (the tests' fixture)::

    with SimCluster(hosts=2) as sim:
        os.environ.update(sim.environment())            # SLURM_CONF for sbatch, squeue, scancel
        ...

Root only (network namespaces, daemons that run jobs as any user), with Debian's ``iproute2``, ``util-linux``,
``slurm-wlm``, ``munge``, ``openssh-server`` and ``nftables`` (the hosts' firewalls, :mod:`kit.tools.firewall`).
:func:`missing` names what is not there and the command that installs it. Everything it makes lives under one
folder (``state.json`` records it); :meth:`SimCluster.down` stops every daemon and every process left in the
namespaces, and removes the namespaces, links, bridge and folder. Every wait is bounded, and its error names
what was waited for.

Why each setting is there, as measured here: :mod:`kit.tools.sim_config`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import psutil

from ..core import tfconfig
from .sim_config import SLURM_CONF, SSH_CLIENT, SSHD_CONFIG
from .sim_state import (DAEMON_TIMEOUT_S, NETNS_ETC, PREFIX, STOP_TIMEOUT_S, Host, SimClusterError, State,
                        namespace_pids, run_command, teardown, wait_for)

#: The programs the emulated cluster needs, and the Debian package of each.
PROGRAMS = {"ip": "iproute2", "unshare": "util-linux", "nsenter": "util-linux", "munged": "munge",
            "mungekey": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm",
            "squeue": "slurm-wlm", "scancel": "slurm-wlm", "scontrol": "slurm-wlm", "sinfo": "slurm-wlm",
            "sshd": "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client",
            "nft": "nftables"}  # the rules of kit.tools.firewall, loaded in the hosts (tests/test_slurm_ssh.py)
SBIN = ("/usr/sbin", "/sbin")
#: The ipyparallel profiles the docs give (a checkout's; docs/profiles/slurm, docs/profiles/ssh).
PROFILES = Path(__file__).resolve().parents[2] / "docs" / "profiles"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def _which(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path=os.pathsep.join(SBIN))


def missing() -> list[str]:
    """What this machine lacks for an emulated cluster, each with the fix; empty when it can make one."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root: network namespaces and daemons that run jobs need it (run as root, or use "
                        "a machine where you are)")
    packages = sorted({package for program, package in PROGRAMS.items() if _which(program) is None})
    if packages:
        problems.append(f"the packages {', '.join(packages)}: apt-get install {' '.join(packages)}")
    return problems


def install_profile(kind: str, controller: str, folder: str | os.PathLike) -> Path:
    """docs/profiles/``kind``/ipcluster_config.py in ``folder`` (made), with ``controller`` as the login node's
    address (the profile's ``"login1"``); a checkout's profiles (an installed wheel has no docs/)."""
    source = PROFILES / kind / "ipcluster_config.py"
    line = 'controller_location = "login1"'
    if not source.is_file() or line not in source.read_text():
        raise SimClusterError(f"{source} does not exist or no longer sets {line}",
                              fix="run from a checkout of the kit, and keep the profile's login-node line")
    target = Path(folder)
    target.mkdir(parents=True)
    (target / "ipcluster_config.py").write_text(source.read_text().replace(line, f'controller_location = "{controller}"'))
    return target


def _subnet() -> str:
    """A /24 under 10.66-10.95 that no interface of this machine uses."""
    used = run_command("ip", "-o", "-4", "addr", "show", what="list this machine's addresses").stdout
    for _ in range(200):
        candidate = f"10.{66 + uuid.uuid4().int % 30}.{uuid.uuid4().int % 250}"
        if f" {candidate}." not in used:
            return candidate
    raise SimClusterError("no free 10.x.y.0/24 subnet for the bridge", fix="remove unused interfaces")


class SimCluster:
    """N emulated hosts with slurmd and sshd, and munged and slurmctld on this machine (see the module).

    ``hosts``: how many; ``root``: the folder for everything (default: a new one under the temporary
    folder); ``cpus``: the CPUs each node offers to Slurm (default: this machine's, which slurmd checks);
    ``ssh`` / ``slurm``: which services to run.
    """

    def __init__(self, hosts: int = 2, root: str | os.PathLike | None = None, *, cpus: int | None = None,
                 slurm: bool = True, ssh: bool = True):
        if not isinstance(hosts, int) or not 1 <= hosts <= 16:
            raise SimClusterError(f"hosts={hosts!r}: the emulated cluster has 1 to 16 hosts",
                                  fix="give hosts=2, say")
        self.n_hosts = hosts
        self.cpus = cpus or os.cpu_count() or 1
        self.slurm, self.ssh = slurm, ssh
        self._root_arg = root
        self.state: State | None = None
        self._processes: dict[str, subprocess.Popen] = {}

    # ----- what users read -----------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return Path(self._need().root)

    @property
    def hosts(self) -> list[Host]:
        return list(self._need().hosts)

    @property
    def controller_ip(self) -> str:
        """This machine's address on the bridge: where engines reach the ipyparallel controller."""
        return self._need().controller_ip

    @property
    def slurm_conf(self) -> Path:
        return self.root / "slurm" / "slurm.conf"

    @property
    def ssh_config(self) -> Path:
        """An ssh_config naming every host (``ssh -F <this> h1``): the key, no host-key prompts or files."""
        return self.root / "ssh" / "config"

    def environment(self) -> dict[str, str]:
        """The variables for Slurm's commands (``SLURM_CONF``) to talk to this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def jobs(self) -> list[str]:
        """The queue as ``squeue`` shows it, a job a line: ``id name state reason``."""
        shown = run_command("squeue", "-h", "-o", "%i %j %T %r", what="list the jobs (squeue)",
                            env={**os.environ, **self.environment()})
        return [line for line in shown.stdout.splitlines() if line.strip()]

    def leftovers(self) -> list[str]:
        """Every live process in the hosts but their daemons (slurmd, sshd): ``host pid: command``."""
        daemons = set(self._need().pids.values())
        found = []
        for host in self.hosts:
            for pid in namespace_pids(host.namespace):
                if pid in daemons:
                    continue
                try:
                    process = psutil.Process(pid)
                    if process.status() != psutil.STATUS_ZOMBIE:
                        found.append(f"{host.name} {pid}: {' '.join(process.cmdline()[:4])}")
                except psutil.NoSuchProcess:
                    continue
        return found

    def install_profile(self, kind: str, folder: str | os.PathLike) -> Path:
        """docs/profiles/``kind`` (``slurm``, ``ssh``) installed in ``folder`` as a user installs it, with this
        machine's bridge address as the login node's."""
        return install_profile(kind, self.controller_ip, folder)

    def _need(self) -> State:
        if self.state is None:
            raise SimClusterError("the emulated cluster is not up", fix="call up() first, or use `with SimCluster()`")
        return self.state

    # ----- up --------------------------------------------------------------------------------------
    def up(self) -> "SimCluster":
        problems = missing()
        if problems:
            raise SimClusterError("an emulated cluster needs " + "; ".join(problems),
                                  fix="install what is named, as root")
        root = Path(self._root_arg) if self._root_arg else Path(tempfile.mkdtemp(prefix="kit-sim-"))
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)   # munged refuses a socket folder that others may write to
        tag = uuid.uuid4().hex[:5]
        subnet = _subnet()
        self.state = State(root=str(root), bridge=f"{PREFIX}{tag}", controller_ip=f"{subnet}.1")
        self.state.save()
        try:
            self._network(tag, subnet)
            if self.slurm:
                self._munge()
                self._slurm()
            if self.ssh:
                self._sshd()
        except BaseException:
            self.down()
            raise
        return self

    def _network(self, tag: str, subnet: str) -> None:
        state = self.state
        run_command("ip", "link", "add", state.bridge, "type", "bridge", what="make the bridge")
        state.links.append(state.bridge)
        state.save()
        run_command("ip", "addr", "add", f"{state.controller_ip}/24", "dev", state.bridge, what="address the bridge")
        run_command("ip", "link", "set", state.bridge, "up", what="bring the bridge up")
        for number in range(1, self.n_hosts + 1):
            host = Host(name=f"h{number}", address=f"{subnet}.{number + 1}", namespace=f"{PREFIX}{tag}h{number}")
            outside, inside = f"{PREFIX}{tag}v{number}", f"{PREFIX}{tag}p{number}"
            run_command("ip", "netns", "add", host.namespace, what=f"make the namespace of {host.name}")
            state.hosts.append(host)
            state.links.append(outside)
            state.save()
            run_command("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, what=f"link {host.name}")
            run_command("ip", "link", "set", outside, "master", state.bridge, what=f"link {host.name}")
            run_command("ip", "link", "set", outside, "up", what=f"link {host.name}")
            run_command("ip", "link", "set", inside, "netns", host.namespace, what=f"link {host.name}")
            inns = ("ip", "netns", "exec", host.namespace)
            run_command(*inns, "ip", "link", "set", "lo", "up", what=f"loopback of {host.name}")
            run_command(*inns, "ip", "addr", "add", f"{host.address}/24", "dev", inside, what=f"address {host.name}")
            run_command(*inns, "ip", "link", "set", inside, "up", what=f"link {host.name}")
        # the hosts find each other by name, as on a real cluster (SlurmClusterResolver uses the node names):
        # `ip netns exec` bind-mounts /etc/netns/<namespace>/hosts over /etc/hosts
        names = "".join(f"{h.address} {h.name}\n" for h in state.hosts)
        machine = Path("/etc/hosts").read_text() if Path("/etc/hosts").is_file() else ""
        for host in state.hosts:
            folder = Path(NETNS_ETC, host.namespace)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(machine + f"# the emulated cluster in {state.root}\n" + names)

    def _daemon(self, name: str, args: list[str], host: Host | None = None, log: Path | None = None) -> int:
        """Start a daemon in the foreground (so its pid is ours to signal), inside ``host`` if given."""
        if host is not None:
            script = (f"hostname {host.name} && mount -t tmpfs kit-cgroup /sys/fs/cgroup && "
                      f"exec {shlex.join(map(str, args))}")
            args = ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "sh", "-c", script]
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True, env={**os.environ, **self.environment()})
        finally:
            if log:
                out.close()
        self._processes[name] = process
        self.state.pids[name] = process.pid
        self.state.save()
        return process.pid

    def _exited(self, name: str) -> str:
        process = self._processes.get(name)
        if process is not None and process.poll() is not None:
            return f"; {name} exited with {process.returncode}"
        return ""

    def _munge(self) -> None:
        folder = self.root / "munge"
        folder.mkdir(mode=0o755)
        key = folder / "munge.key"
        run_command("mungekey", "--create", f"--keyfile={key}", what="make munge's key")
        socket_path = folder / "munge.socket"
        self._daemon("munged", [_which("munged"), "--foreground", "--force", f"--socket={socket_path}",
                                f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
                                f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"])
        wait_for(lambda: socket_path.exists(), DAEMON_TIMEOUT_S, f"munged's socket {socket_path}",
              lambda: self._exited("munged") + f" (its log: {folder / 'munged.log'})")

    def _slurm(self) -> None:
        state = self.state
        folder = self.root / "slurm"
        folder.mkdir()
        (folder / "state").mkdir()
        for host in state.hosts:
            (folder / f"spool-{host.name}").mkdir()
        state.slurmctld_port = tfconfig.free_port()
        state.save()
        this_host = socket.gethostname().split(".")[0]
        nodes = "".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={self.cpus} State=UNKNOWN\n"
                        for h in state.hosts)
        self.slurm_conf.write_text(SLURM_CONF.format(
            host=this_host, ip=state.controller_ip, port=state.slurmctld_port, folder=folder,
            socket=self.root / "munge" / "munge.socket", nodes=nodes))
        (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.slurm_conf)],
                     log=folder / "slurmctld.out")
        env = {**os.environ, **self.environment()}
        wait_for(lambda: run_command("scontrol", "ping", what="ask slurmctld", env=env, check=False).returncode == 0,
              DAEMON_TIMEOUT_S, f"slurmctld at {state.controller_ip}:{state.slurmctld_port} to answer",
              lambda: self._exited("slurmctld") + f" (its log: {folder / 'slurmctld.log'})")
        for host in state.hosts:
            self._daemon(f"slurmd {host.name}", [_which("slurmd"), "-D", "-N", host.name, "-f", str(self.slurm_conf)],
                         host=host, log=folder / f"slurmd-{host.name}.out")

        def idle() -> bool:
            shown = run_command("sinfo", "-h", "-N", "-o", "%N %t", what="list the nodes", env=env, check=False).stdout
            states = dict(line.split() for line in shown.splitlines() if line.strip())
            return all(states.get(h.name) == "idle" for h in state.hosts)

        wait_for(idle, DAEMON_TIMEOUT_S, "every Slurm node to be idle",
              lambda: "; sinfo: " + run_command("sinfo", "-h", "-N", "-o", "%N %t %E", what="list the nodes", env=env,
                                         check=False).stdout.strip().replace("\n", ", ")
              + "".join(self._exited(f"slurmd {h.name}") for h in state.hosts))

    def _sshd(self) -> None:
        folder = self.root / "ssh"
        folder.mkdir(mode=0o700)
        client_key = folder / "id_ed25519"
        run_command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kit-sim", "-f", str(client_key),
             what="make the client key")
        (folder / "authorized_keys").write_text((folder / "id_ed25519.pub").read_text())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # sshd's privilege-separation folder
        lines = []
        for host in self.state.hosts:
            host_key = folder / f"host_{host.name}"
            run_command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key), what=f"host key of {host.name}")
            config = folder / f"sshd_{host.name}"
            config.write_text(SSHD_CONFIG.format(address=host.address, key=host_key, folder=folder,
                                                 host=host.name, sftp=SFTP_SERVER))
            self._daemon(f"sshd {host.name}", [_which("sshd"), "-D", "-e", "-f", str(config)], host=host,
                         log=folder / f"sshd_{host.name}.log")
            lines.append(f"Host {host.name}\n  HostName {host.address}\n")
        self.ssh_config.write_text("".join(lines) + SSH_CLIENT.format(key=client_key))
        for host in self.state.hosts:
            wait_for(lambda h=host: self._ssh_answers(h), DAEMON_TIMEOUT_S, f"sshd on {host.name} ({host.address}:22)",
                  lambda h=host: self._exited(f"sshd {h.name}") + f" (its log: {folder / f'sshd_{h.name}.log'})")

    def _ssh_answers(self, host: Host) -> bool:
        try:
            with socket.create_connection((host.address, 22), timeout=1) as s:
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    # ----- down ------------------------------------------------------------------------------------
    def down(self) -> None:
        """Stop every job, daemon and process of the cluster, and remove everything it made."""
        if self.state is None:
            return
        teardown(self.state)
        self.state = None
        for process in self._processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
        self._processes.clear()

    def detach(self) -> None:
        """Let the daemons outlive this object (``kit sim-cluster up``); ``down`` with its folder ends them."""
        self._processes.clear()

    def __enter__(self) -> "SimCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


# ----- the command line: kit sim-cluster up/down --------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["up", "down"], help="up: start the hosts and daemons; down: remove them")
    parser.add_argument("--hosts", type=int, default=2, help="how many hosts (default 2)")
    parser.add_argument("--dir", required=True, help="the folder for everything; give `down` the same one")


def run_from_args(args: argparse.Namespace) -> int:
    if args.action == "down":
        teardown(State.load(args.dir))
        print(f"down: {args.dir} removed")
        return 0
    sim = SimCluster(args.hosts, args.dir).up()
    sim.detach()   # the daemons outlive this command, until `down`
    print(f"up: {', '.join(f'{h.name} {h.address}' for h in sim.hosts)}; this machine: {sim.controller_ip}")
    print(f"export SLURM_CONF={sim.slurm_conf}")
    print(f"ssh -F {sim.ssh_config} h1 hostname")
    print(f"kit sim-cluster down --dir {args.dir}")
    return 0
