"""HorovodCluster: one Horovod rank per ipyparallel engine, with Gloo and the kit's own rendezvous.

    with kit.HorovodCluster(workers=2) as cluster:
        results = cluster.run(train_fn)      # train_fn calls hvd.init() first, like under horovodrun

``horovodrun --gloo -np N`` does three things: it starts a rendezvous server (an HTTP key-value store
the ranks use to find each other), starts N processes with each one's rank, size and the server's
address in its environment, and stops them all when one fails. A HorovodCluster does the same with the
kit's engines: it is a :class:`kit.TFCluster` (same start, run, streaming, kill, restart, stop), whose
tasks ``worker:0 … worker:N-1`` are ranks 0 … N-1. After the engines are up, the rendezvous server is
started *inside rank 0's engine* (so it lives and dies with that process, and needs no port on the
machine that drives the cluster), and every engine gets Horovod's variables — the ones
``horovod/runner/gloo_run.py`` gives its processes — in place of TF_CONFIG, before Horovod is imported
there (TensorFlow may be: ``preload``). ``restart()`` gives fresh engines and a fresh rendezvous.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from typing import Any

from . import _lifeline, nojax
from .backend import Backend
from .cluster import TFCluster
from .errors import ClusterError, OptionError

#: The Horovod release the kit builds and tests (kit/tools/horovod_wheel.sh: `kit horovod`, `make horovod`).
HOROVOD_VERSION = "0.28.1"

#: Why Keras 3 is refused (also the message of the OptionError).
KERAS3_REFUSED = ("under Keras 3, Horovod 0.28.1's hvd.DistributedOptimizer does not all-reduce at all "
                  "(Keras 3 optimizers never call the get_gradients/_aggregate_gradients it overrides, so "
                  "the ranks silently train apart) and its BroadcastGlobalVariablesCallback fails "
                  "('Variable' object has no attribute 'ref')")

_BUILD_FIX = ("Fix: run `kit horovod` in a terminal (`!kit horovod` in a notebook cell, Colab's too): it "
              "builds Horovod for this Python's TensorFlow with cmake and g++ (2-5 minutes, once) and installs "
              "it; in a checkout, `make horovod`")


@dataclasses.dataclass(frozen=True)
class Rank:
    """One Horovod rank of a running HorovodCluster, as the kit assigned it."""

    task: str         #: the kit's name of its engine, e.g. "worker:1"
    rank: int
    size: int
    local_rank: int   #: rank among the ranks on the same host
    local_size: int
    cross_rank: int   #: index of its host among the hosts that have a rank with this local_rank
    cross_size: int
    host: str         #: HOROVOD_HOSTNAME: the name the ranks on one host share
    pid: int


class Horovod(Backend):
    """Horovod's ranks (:mod:`kit.core.backend`): at every start and restart, the rendezvous server in rank 0's
    engine and each rank's ``HOROVOD_*`` variables, instead of horovodrun's."""

    no_tf_config = ("a HorovodCluster's engines have no TF_CONFIG: Horovod ranks find each other through the "
                    "rendezvous server", "see cluster.horovod_env and cluster.ranks")

    def __init__(self) -> None:
        self.rendezvous: tuple[str, int] | None = None  #: (address, port) of the rendezvous server
        self.env: dict[str, dict[str, str]] = {}       #: each rank's Horovod variables, by task name

    def reset(self) -> None:
        self.rendezvous, self.env = None, {}

    def ranks(self, tasks: list) -> list[Rank]:
        """Each rank of ``tasks``: its task, rank, size, local and cross ranks, host and pid."""
        return [Rank(task=task.name, host=self.env[task.name]["HOROVOD_HOSTNAME"], pid=task.pid,
                     **{f: int(self.env[task.name][f"HOROVOD_{f.upper()}"]) for f in
                        ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")}) for task in tasks]

    def rows(self, tasks: list) -> list[dict[str, Any]]:
        return [dataclasses.asdict(r) for r in self.ranks(tasks)]

    def configure(self, group: Any, options: Any, log: Any) -> None:
        tasks = [group.info(name) for name in group.names]
        engine = {t.name: group.engine(t.name) for t in tasks}
        for name, view in engine.items():
            found = view.apply_sync(horovod_version)
            if found is None:
                raise ClusterError(f"{name}'s Python has no Horovod (horovod.tensorflow). {_BUILD_FIX}", [name])
            if found != HOROVOD_VERSION:
                raise ClusterError(f"{name} has Horovod {found}, but the kit is built and tested with "
                                   f"{HOROVOD_VERSION}. {_BUILD_FIX}", [name])
        # with emulated links each task is a host of its own (its own namespace and address): Horovod's
        # local ranks share memory and a host name, which tasks behind separate links do not
        hosts = [t.address.rpartition(":")[0] if options.link is not None else t.host for t in tasks]
        plan = slot_plan(hosts)
        rank0 = tasks[0]
        # the address the other ranks reach rank 0 at: the one TensorFlow would have used for it
        # (options.host on this machine, the engine's own address for engines from elsewhere)
        bind = rank0.address.rpartition(":")[0].strip("[]")
        port = engine[rank0.name].apply_sync(start_rendezvous, bind, plan)
        self.rendezvous = (bind, port)
        for task, slot in zip(tasks, plan):
            env = {
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": bind,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_HOSTNAME": slot["hostname"],
                **{f"HOROVOD_{k.upper()}": str(slot[k]) for k in
                   ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")},
            }
            # the interface (Gloo's) is each engine's own: the one that holds the address it reaches rank 0 from
            self.env[task.name] = engine[task.name].apply_sync(set_horovod_environment, env, bind)
        log.info("Horovod rendezvous on %s:%s (rank 0's engine) for %d ranks", bind, port, len(tasks))


class HorovodCluster(TFCluster):
    """Horovod ranks on ipyparallel engines: ``HorovodCluster(workers=2)`` gives ranks 0 and 1.

    A :class:`kit.TFCluster` with the :class:`Horovod` backend. Options are TFCluster's (:class:`kit.ClusterOptions`),
    less those that make no sense for Horovod (``chief``, ``ps``, ``evaluator``, ``keras="keras3"``).
    ``cluster.ranks`` lists the ranks, ``cluster.horovod_env`` each engine's Horovod variables and
    ``cluster.rendezvous`` the server's address. A function run on the cluster calls ``hvd.init()`` itself, as
    under horovodrun.
    """

    def __init__(self, workers: int = 2, **options: Any):
        for name in ("chief", "evaluator"):
            if options.get(name):
                raise OptionError(name, "a HorovodCluster has only ranks, all alike (rank 0 does the "
                                        "chief's saving by convention)",
                                  f"leave {name} out and ask for workers=N, which gives ranks 0..N-1")
        if options.get("ps"):
            raise OptionError("ps", "Horovod has no parameter servers: its ranks all-reduce gradients",
                              "leave ps out; for parameter servers use kit.TFCluster(chief=True, ps=1)")
        if options.get("keras", "tf-keras") == "keras3":
            raise OptionError("keras", f"keras='keras3' cannot be used: {KERAS3_REFUSED}",
                              "leave keras at 'tf-keras' (the default), which sets TF_USE_LEGACY_KERAS=1")
        super().__init__(workers, backend=Horovod(), **options)

    @property
    def ranks(self) -> list[Rank]:
        """Each rank: its task, rank, size, local and cross ranks, host and pid."""
        return self.backend.ranks(self.tasks)

    @property
    def horovod_env(self) -> dict[str, dict[str, str]]:
        """The Horovod variables each engine was given, by task name."""
        self._require_started()
        return {name: dict(env) for name, env in self.backend.env.items()}

    @property
    def rendezvous(self) -> tuple[str, int] | None:
        """(address, port) of the rendezvous server in rank 0's engine (None while stopped)."""
        return self.backend.rendezvous


def slot_plan(hosts: list[str]) -> list[dict[str, Any]]:
    """Horovod's slot of each task, in task order, from the host each runs on (rank = task order).

    As horovodrun assigns them: ``local_rank`` counts the ranks on the same host, ``cross_rank`` the
    hosts that have a rank with that local rank.
    """
    size = len(hosts)
    local_rank: list[int] = []
    seen: dict[str, int] = {}
    for host in hosts:
        local_rank.append(seen.get(host, 0))
        seen[host] = seen.get(host, 0) + 1
    cross_hosts: dict[int, list[str]] = {}
    for host, lr in zip(hosts, local_rank):
        cross_hosts.setdefault(lr, []).append(host)
    return [{"hostname": host, "rank": rank, "size": size, "local_rank": lr, "local_size": seen[host],
             "cross_rank": cross_hosts[lr].index(host), "cross_size": len(cross_hosts[lr])}
            for rank, (host, lr) in enumerate(zip(hosts, local_rank))]


# ----- run on the engines (by reference: the engines import this module) --------------------------

def horovod_version() -> str | None:
    """The installed Horovod's version if its TensorFlow extension is there (not imported), else None."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    try:
        found = version("horovod")
    except PackageNotFoundError:
        return None
    spec = find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(list(spec.submodule_search_locations)[0], "tensorflow")
    built = [f for f in os.listdir(folder) if f.startswith("mpi_lib")] if os.path.isdir(folder) else []
    return found if built else None


_RENDEZVOUS: dict[str, Any] = {}


def start_rendezvous(bind: str, plan: list[dict[str, Any]]) -> int:
    """Start Horovod's Gloo rendezvous server in this engine, on ``bind`` and a free port; return the port.

    The server is Horovod's own (``horovod.runner.http.http_server``), as horovodrun starts it, bound
    to one address rather than to all, in a daemon thread of this process: it ends with the engine.
    Importing it does not import TensorFlow.
    """
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    if "server" in _RENDEZVOUS:
        raise RuntimeError("this engine already runs a rendezvous server; restart the cluster for a new one")
    server = RendezvousHTTPServer((bind, 0), RendezvousHandler, 0)
    server.init([SlotInfo(**slot) for slot in plan])
    thread = threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True)
    thread.start()
    _RENDEZVOUS.update(server=server, thread=thread)
    return server.server_address[1]


def run_horovodrun(args: list[str], time_limit: float = 120.0) -> dict[str, Any]:
    """Run ``horovodrun *args`` on this engine and wait for it; for elastic Horovod, whose driver must own
    the training processes (notebook 09).

    Its servers and processes are this engine's (children, in its network namespace), without the
    engine's own Horovod settings or TF_CONFIG. Bounded by ``time_limit`` seconds: then the whole
    process group is killed and RuntimeError says so. Returns the exit code, the output (stdout and
    stderr, the last 20,000 characters), the seconds it took, and the pids of any process it started
    that was still alive 10 s after horovodrun exited (they are killed, so none is left behind).
    """
    import signal
    import subprocess
    import time

    import psutil

    before = {child.pid for child in psutil.Process().children(recursive=True)}  # e.g. ipyparallel's nanny
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_") and k != "TF_CONFIG"}
    env = nojax.environ(env)  # "python" is this one; the ranks import TensorFlow without JAX (kit.core.nojax)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", *map(str, args)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=time_limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise RuntimeError(f"horovodrun did not finish within {time_limit:g}s (time_limit=); it was killed. "
                           f"Its last output:\n{output[-3000:]}") from None
    finally:
        children = [c.pid for c in psutil.Process().children(recursive=True) if c.pid not in before]
        killed, _ = _lifeline.reap(children, grace=10)
    return {"returncode": proc.returncode, "output": output[-20000:], "seconds": time.monotonic() - started,
            "children_left": killed}


def listening_addresses(port: int) -> list[str]:
    """The addresses this process listens on at TCP ``port`` (run it on an engine: it sees the engine's
    own network namespace, which the driving process may not share)."""
    import psutil

    from ._remote import tcp_connections

    return sorted(c.laddr.ip for c in tcp_connections()
                  if c.status == psutil.CONN_LISTEN and c.laddr.port == port)


def set_horovod_environment(env: dict[str, str], rendezvous_address: str) -> dict[str, str]:
    """Give this engine its Horovod variables (and Gloo's interface) in place of TF_CONFIG; return them.

    Refused once Horovod is imported: it reads them at ``hvd.init()``, and an engine that ran Horovod keeps its
    first settings. TensorFlow may be imported (``preload``): it reads TF_CONFIG only when a strategy is built.
    """
    if "horovod.tensorflow" in sys.modules:
        raise RuntimeError("Horovod is already imported on this engine, so its new settings could come too "
                           "late; start fresh engines (cluster.restart()).")
    # env= of the cluster may name the interface; else the one that reaches rank 0
    iface = os.environ.get("HOROVOD_GLOO_IFACE") or interface_of(rendezvous_address)
    env = {**env, "HOROVOD_GLOO_IFACE": iface}
    os.environ.pop("TF_CONFIG", None)
    os.environ.update(env)
    return env


def interface_of(address: str) -> str:
    """The network interface of this host that reaches ``address``: the one holding the address this
    process uses to reach it (``lo`` for 127.0.0.1)."""
    import socket

    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))  # UDP connect sends nothing; it only picks the route
        local = probe.getsockname()[0]
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addresses):
            return name
    raise RuntimeError(f"no network interface holds {local}, the address this host reaches "
                       f"{address} from; Gloo needs one (set HOROVOD_GLOO_IFACE in env=)")
