"""A local cluster's TensorFlow servers cannot be reached from another host (docs/security.md).

TensorFlow's gRPC server listens on every interface and runs any op a client sends. The attack:
from another "host" (a network namespace joined to this one by a veth pair), open a session on a
task's server and run ``tf.io.read_file`` on it. It must fail against a default local cluster, and
succeed against an unprotected server started here, so that the test can fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import cloudpickle
import psutil
import pytest

from conftest import REPO, can_make_namespaces, exposed, kit_processes, sh
from kit.core import _netns
from kit.core.cluster import TFCluster
from kit.core.errors import ClusterError, ExposedPortsWarning

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the engines cannot import this module
SUBNET = f"10.{97 + os.getpid() % 20}.{os.getpid() % 200}"  # a private /24 of this test run only
SUBNET6 = f"fd00:6b69:{os.getpid() % 65536:x}"

ATTACK = textwrap.dedent('''
    """From another host: connect to each target; then ask the TF server of those marked to read a file."""
    import json, socket, sys
    targets, path = json.loads(sys.argv[1]), sys.argv[2]
    results = []
    for host, port, run_tf in targets:
        row = {"host": host, "port": port}
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as s:
            s.settimeout(5)
            try:
                s.connect((host, port))
                row["connect"] = "connected"
            except OSError as error:
                row["connect"] = type(error).__name__ + ": " + str(error)
        if run_tf:
            import tensorflow as tf
            graph = tf.Graph()
            with graph.as_default():
                with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
                    read = tf.io.read_file(path)
                config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=4000)
                name = f"[{host}]" if ":" in host else host
                try:
                    with tf.compat.v1.Session(f"grpc://{name}:{port}", graph=graph, config=config) as session:
                        row["read"] = session.run(read, options=tf.compat.v1.RunOptions(timeout_in_ms=4000)).decode()
                except Exception as error:  # the outcome is the test's data: report it, whatever it is
                    row["error"] = type(error).__name__ + ": " + str(error).splitlines()[0]
        results.append(row)
    print("RESULTS " + json.dumps(results), flush=True)
''')


class Attacker:
    """A namespace "host" joined to this one by a veth pair; this side gets .1, the attacker .2."""

    def __init__(self):
        tag = uuid.uuid4().hex[:5]
        self.ns, self.outside, inside = f"kitatk{tag}", f"kha{tag}", f"kaa{tag}"
        self.address, self.address6 = f"{SUBNET}.1", f"{SUBNET6}::1"
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.outside, "type", "veth", "peer", "name", inside)
        sh("ip", "link", "set", inside, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.address}/24", "dev", self.outside)
        sh("ip", "-6", "addr", "add", f"{self.address6}/64", "dev", self.outside, "nodad")
        sh("ip", "link", "set", self.outside, "up")
        run = ["ip", "netns", "exec", self.ns]
        sh(*run, "ip", "link", "set", "lo", "up")
        sh(*run, "ip", "addr", "add", f"{SUBNET}.2/24", "dev", inside)
        sh(*run, "ip", "-6", "addr", "add", f"{SUBNET6}::2/64", "dev", inside, "nodad")
        sh(*run, "ip", "link", "set", inside, "up")

    def targets(self, ports: list[int], run_tf: int = 0) -> list[tuple[str, int, bool]]:
        """This machine's addresses as the attacker sees them, IPv4 and IPv6, for each port; the
        full TensorFlow attack on the first ``run_tf`` ports, a plain connection on the others."""
        return [(address, port, i < run_tf) for i, port in enumerate(ports)
                for address in (self.address, self.address6)]

    def attack(self, targets: list[tuple[str, int, bool]], path: str) -> tuple[list[dict], str]:
        """Run the attack from the attacker's namespace; return its results and everything it printed."""
        done = subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", ATTACK,
                               json.dumps(targets), path],
                              capture_output=True, text=True, timeout=240,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""})
        output = done.stdout + done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
        assert done.returncode == 0 and lines, f"the attack script itself failed:\n{output[-3000:]}"
        return json.loads(lines[-1][len("RESULTS "):]), output

    def remove(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.outside], capture_output=True)


@pytest.fixture(scope="module")
def attacker():
    reason = can_make_namespaces()  # fails instead on CI, where this must run
    if reason:
        pytest.skip(reason)
    made = Attacker()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text(f"secret-{uuid.uuid4().hex}")
    return path


def start_servers() -> int:
    """On each worker: build MultiWorkerMirroredStrategy (which starts the task's gRPC server) and
    run one all-reduce through it; return the port the server listens on, as this task sees it."""
    import json as _json
    import os as _os

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    assert float(total) == strategy.num_replicas_in_sync
    config = _json.loads(_os.environ["TF_CONFIG"])
    port = int(config["cluster"]["worker"][config["task"]["index"]].rpartition(":")[2])
    listening = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A":  # LISTEN
                    listening.add(int(local.rpartition(":")[2], 16))
    assert port in listening, f"the server of this task does not listen on {port}: {sorted(listening)}"
    return port


def listening_here(ports: list[int], owners: list[int]) -> list:
    """Sockets in this (the host's) network namespace that listen on any of ``ports`` and belong to one of the
    processes ``owners``. Not any process's: a port picked in a private namespace can be in use in the host's by
    chance (seen: another test's probe on 0.0.0.0 with the same port, beside this test under pytest-xdist)."""
    return [c for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports and c.pid in owners]


@pytest.fixture
def unprotected_server():
    """A bare TensorFlow server on this host's network, as a plain TF_CONFIG script would start it."""
    port = _free_port()
    script = textwrap.dedent(f'''
        import sys
        import tensorflow as tf
        server = tf.distribute.Server({{"worker": ["localhost:{port}"]}}, job_name="worker", task_index=0)
        print("ready", flush=True)
        sys.stdin.read()
    ''')
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        line = _read_line_within(proc, 120)
        assert line.strip() == "ready", f"the unprotected server did not start: {line!r}"
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _free_port() -> int:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::", 0))
        return s.getsockname()[1]


def _read_line_within(proc: subprocess.Popen, seconds: float) -> str:
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(seconds):
            raise AssertionError(f"process {proc.pid} printed nothing within {seconds}s")
    return proc.stdout.readline()


@pytest.mark.slow
@pytest.mark.check  # an emulated host (root)
def test_a_local_cluster_cannot_be_reached_from_another_host(attacker, secret, unprotected_server, make_cluster):
    cluster = make_cluster(workers=2)
    ports = cluster.with_options(stream=False).run(start_servers)
    assert sorted(ports) == sorted(int(t.address.rpartition(":")[2]) for t in cluster.tasks)
    assert all("private network" in t.listens_on for t in cluster.tasks)
    assert not cluster.exposed_because
    assert not listening_here(ports, [t.pid for t in cluster.tasks]), \
        "a task's server listens in the host's network namespace"

    # the full attack on the unprotected server and on worker:0 (a connection to a closed port then
    # fails the same way for any task); plain connections to every task, IPv4 and IPv6
    results, printed = attacker.attack(attacker.targets([unprotected_server, *ports], run_tf=2), str(secret))
    control, protected = results[:2], results[2:]
    # the attack works: the unprotected server hands over the file, over IPv4 and IPv6
    assert [row.get("read") for row in control] == [secret.read_text()] * 2, control
    # and fails against every task of the cluster, at the connection already
    for row in protected:
        assert "ConnectionRefused" in row["connect"] or "unreachable" in row["connect"].lower(), row
        assert "read" not in row
    assert [bool(row.get("error")) for row in protected] == [True, True] + [False] * (len(protected) - 2)
    assert printed.count(secret.read_text()) == 2, "the file's contents appeared beyond the control"


@pytest.mark.slow
def test_isolation_none_exposes_the_servers_and_says_so(attacker, make_cluster):
    with pytest.warns(ExposedPortsWarning) as warned:
        cluster = make_cluster(workers=2, isolation="none")
    ports = cluster.with_options(stream=False).run(start_servers)
    (message,) = exposed(warned)
    for task in cluster.tasks:
        assert f"{task.name} at {task.address}" in message
        assert "reachable from the network" in task.listens_on
    assert "isolation='none'" in message and "Fix: allow network namespaces" in message
    results, _ = attacker.attack(attacker.targets(ports), "/nonexistent")
    assert all(row["connect"] == "connected" for row in results), results


@pytest.mark.slow  # clusters: 4.7 s
def test_without_namespaces_auto_warns_and_required_refuses(monkeypatch, make_cluster, no_leaks):
    def unavailable(*args, **kwargs):
        raise _netns.Unavailable("unshare(CLONE_NEWUSER | CLONE_NEWNET): Operation not permitted")

    monkeypatch.setattr(_netns.PrivateNetwork, "start", unavailable)
    with pytest.warns(ExposedPortsWarning, match="Operation not permitted") as warned:
        cluster = make_cluster(workers=2)
    (message,) = exposed(warned)
    assert all(f"{t.name} at {t.address}" in message for t in cluster.tasks)
    assert cluster.run(os.getpid) == [t.pid for t in cluster.tasks]  # it works, exposed
    with pytest.raises(ClusterError, match="isolation='required'.*Fix:") as info:
        TFCluster(workers=1, isolation="required").start()
    assert "Operation not permitted" in str(info.value)


def test_isolation_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("KIT_ISOLATION", "required")
    assert TFCluster(workers=1).options.isolation == "required"
    monkeypatch.setenv("KIT_ISOLATION", "sometimes")
    with pytest.raises(Exception, match="option 'isolation'.*KIT_ISOLATION.*Fix: use one of auto, required, none"):
        TFCluster(workers=1)


@pytest.mark.slow  # a cluster: 4.0 s
def test_the_controller_and_the_engines_open_no_port_on_the_host(make_cluster):
    """The kernel reaches the controller over unix sockets: nothing the cluster started listens on
    the host's network (the engines' sockets, if any, are in their private namespace)."""
    cluster = make_cluster(workers=2)
    pids = [p.pid for p in kit_processes(os.getpid())]
    assert cluster.tasks[0].pid in pids
    tcp = [c for c in psutil.net_connections("inet") if c.pid in pids]
    assert not tcp, tcp
    security = Path(cluster.engines.ipp.profile_dir) / "security"  # what the kernel connects to
    client = json.loads(next(security.glob("*client.json")).read_text())
    assert client["interface"].startswith(f"ipc://{cluster.engines.ipp.profile_dir}/")
    assert oct(os.stat(cluster.engines.ipp.profile_dir).st_mode & 0o777) == "0o700"


def test_the_controller_binds_the_ipc_names_its_engines_and_clients_connect_to():
    from kit.core._controller import Controller

    controller = Controller()
    controller.engine_info = {"interface": "ipc:///tmp/kit-cluster-a-b/sockets/c", "mux": 1234}
    controller.client_info = {"interface": "tcp://127.0.0.1", "mux": 1234}
    assert controller.construct_url("engine", "mux") == "ipc:///tmp/kit-cluster-a-b/sockets/c:1234"
    assert controller.construct_url("client", "mux") == "tcp://127.0.0.1:1234"


def test_an_unprivileged_user_gets_a_private_network_too(attacker, tmp_path):
    """Without root, the holder makes a user namespace first. Run it as `nobody`: a process that joins
    the namespace listens on every interface, and neither this host nor the attacker reaches it."""
    probe = textwrap.dedent('''
        import os, socket, sys
        from kit.core import _netns
        _netns.enter(os.environ["KIT_NETNS"])
        s = socket.socket(socket.AF_INET6)
        s.bind(("::", 0))
        s.listen()
        print(s.getsockname()[1], os.getuid(), open("/proc/self/net/dev").read().count(":"), flush=True)
        sys.stdin.read()
    ''')
    script = textwrap.dedent('''
        import os, subprocess, sys
        import psutil
        from kit.core import _lifeline, _netns
        network = _netns.PrivateNetwork.start(_lifeline.token(os.getpid()))
        probe = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, "KIT_NETNS": network.token},
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        port, uid, interfaces = probe.stdout.readline().split()
        readable = int(bool(psutil.Process(probe.pid).environ().get("KIT_NETNS")))  # as this same user
        print(network.pid, probe.pid, port, uid, interfaces, readable, flush=True)
        sys.stdin.read()
        probe.kill()
        probe.wait()
        network.stop()
    ''')
    if subprocess.run(["unshare", "--user", "--net", "true"], user=65534, capture_output=True).returncode:
        pytest.skip("unprivileged user namespaces are disabled on this system (the kit then warns)")
    # the interpreter may live in a folder only root can read (/root/.pyenv): lend `nobody` the
    # right to read files, nothing else; namespaces need no capability from outside
    runner = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+dac_read_search",
         "--ambient-caps=+dac_read_search", sys.executable, "-c", script, probe],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}, cwd=tmp_path)
    try:
        line = _read_line_within(runner, 60)
        assert line, runner.stderr.read()
        holder, probe, port, uid, interfaces, readable = (int(x) for x in line.split())
        assert psutil.Process(holder).uids().real == 65534 and uid == 65534
        assert os.readlink(f"/proc/{holder}/ns/user") != os.readlink("/proc/self/ns/user")
        assert os.readlink(f"/proc/{probe}/ns/net") == os.readlink(f"/proc/{holder}/ns/net")
        assert interfaces == 1, "the private network has only the loopback interface"
        assert readable, "its own user can read its environment (the kit's census of its processes)"
        assert not listening_here([port], [probe])
        results, _ = attacker.attack(attacker.targets([port]), "/nonexistent")
        assert all("ConnectionRefused" in row["connect"] for row in results), results
    finally:
        runner.stdin.close()
        runner.wait(timeout=30)
        runner.stdout.close()
        runner.stderr.close()


def test_papermill_kernels_listen_on_loopback_only():
    """A sweep's notebooks run in kernels that jupyter_client starts; their ZMQ ports are on 127.0.0.1."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        assert manager.ip == "127.0.0.1"
        listening = [c for c in psutil.Process(manager.provisioner.process.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening), listening
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def horovod_ports() -> list[int]:
    """On each rank: hvd.init() and one all-reduce (Gloo's ring is up); every TCP port this task listens
    on, as it sees them (the rendezvous server on rank 0, Gloo's sockets)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == hvd.size()
    listening = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    listening.add(int(fields[1].rpartition(":")[2], 16))
    return sorted(listening)


@pytest.mark.slow
def test_horovod_ranks_are_not_reachable_from_another_host(attacker, no_leaks):
    """Horovod's rendezvous server (on rank 0's engine) and its Gloo ring live in the private network too."""
    from test_horovod import HOROVOD_MISSING, MISSING

    if HOROVOD_MISSING:
        if os.geteuid() == 0:
            pytest.fail(MISSING)  # as root (CI) `make check` builds it
        pytest.skip(MISSING)
    from kit.core.horovod import HorovodCluster

    with HorovodCluster(workers=2, env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
        ports = sorted({port for ranks in cluster.with_options(stream=False).run(horovod_ports) for port in ranks})
        assert cluster.rendezvous[1] in ports and len(ports) > 1, (cluster.rendezvous, ports)  # + Gloo
        print("listening in the private network:", ports)
        assert not listening_here(ports, [t.pid for t in cluster.tasks]), \
            "a rank listens in the host's network namespace"
        results, _ = attacker.attack(attacker.targets(ports), "/nonexistent")
    assert results and all("ConnectionRefused" in row["connect"] for row in results), results


@pytest.mark.slow  # a kernel and two one-task clusters: ~15 s
def test_a_kernel_shows_the_exposed_servers_warning_once_and_in_two_lines(no_leaks):
    """Without a private network every cluster is exposed: the learner reads the warning once per kernel (not at
    every cluster and restart), as one line of text and the line of code it came from."""
    import nbformat
    from nbclient import NotebookClient

    cells = ["import kit\nwith kit.TFCluster(workers=1, isolation='none') as cluster:\n    pass",
             "with kit.TFCluster(workers=1, isolation='none') as cluster:\n    cluster.restart()\n"
             "    print(cluster.describe().columns.tolist())"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(REPO)}},
                   ).execute()
    stderr = ["".join(o["text"] for o in c.outputs if o.get("name") == "stderr") for c in notebook.cells]
    assert "ExposedPortsWarning" in stderr[0] and len(stderr[0].strip().splitlines()) <= 2, stderr[0]
    assert "docs/security.md" in stderr[0] and "cluster.describe()" in stderr[0], stderr[0]
    assert "ExposedPortsWarning" not in stderr[1], f"the second cluster warned again: {stderr[1]}"
    stdout = "".join(o.get("text", "") for o in notebook.cells[1].outputs if o.get("name") == "stdout")
    assert "reachable_at" in stdout and "listens_on" in stdout, f"describe() lacks the detail: {stdout}"
