"""The kit on a real Slurm cluster and on SSH hosts: emulated hosts with slurmd and sshd (kit.tools.sim_cluster).

One emulated cluster (2 hosts) serves the module. The engines get there through ipyparallel's own Slurm and
SSH launchers, configured by the profiles in docs/profiles/ (only the login node's address differs), as a
user of a university cluster would: sbatch/srun/scancel, ssh/scp. As root only; on CI it must run (a missing
prerequisite fails instead of skipping).
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import ipyparallel as ipp

from kit.core import _lifeline
from kit.core.cluster import TFCluster
from kit.core.errors import ClusterError, ExposedPortsWarning
from conftest import exposed
from kit.core.options import engine_set_id
from kit.train import resilience
from kit.train.progress import OnTask
from kit.tools import firewall, sim_cluster, sim_state
from kit.tools.fault_trials import run_lesson
from kit.tools.sim_cluster import SimCluster

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "docs" / "profiles"

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::kit.core.errors.ExposedPortsWarning")]


def require_sim_tools() -> None:
    """Skip (fail on CI) where no emulated cluster can be made, naming what is missing."""
    problems = sim_cluster.missing()
    if problems:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("an emulated cluster needs " + "; ".join(problems))


@pytest.fixture(scope="module")
def sim():
    require_sim_tools()
    before, daemons = set(temporary_leftovers()), set(daemons_here())
    with SimCluster(hosts=2) as made:
        yield made
    left = sorted(set(temporary_leftovers()) - before)
    assert not left, f"the engines on the emulated hosts left {len(left)} entries in /tmp, e.g. {left[:3]}"
    started = sorted(set(daemons_here()) - daemons)
    assert not started, f"daemons of the emulated hosts left running in this machine's network namespace: {started}"


DAEMONS = {"sshd", "munged", "slurmd", "slurmctld", "slurmdbd"}


def daemons_here() -> list[str]:
    """The Slurm, munge and SSH daemons running in this process's network namespace (the emulated hosts' run in
    their own), as "name (pid)"."""
    here = os.readlink("/proc/self/ns/net")
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in DAEMONS:
            try:
                if os.readlink(f"/proc/{proc.pid}/ns/net") == here:
                    found.append(f"{proc.info['name']} ({proc.pid})")
            except OSError:  # gone meanwhile
                continue
    return found


def host_tmp_folders() -> list[str]:
    """Where the emulated hosts' engines write: /tmp, and this process's temporary folder (see below)."""
    return sorted({tempfile.gettempdir(), "/tmp"})


def temporary_leftovers() -> list[str]:
    """What an engine can leave in the hosts' temporary folder: they share this machine's /tmp, where SSH
    sessions' engines write (sshd passes no TMPDIR), and Slurm's jobs get this process's TMPDIR (sbatch exports
    the environment; under pytest-xdist a folder of the worker's own, tests/conftest.py)."""
    return [os.path.join(folder, name) for folder in host_tmp_folders() for name in os.listdir(folder)
            if name.startswith(("__autograph_generated_file", "kit-engine-"))]


@pytest.fixture
def slurm_env(sim, monkeypatch):
    """This process talks to the emulated Slurm; engines (sbatch exports the environment) find Python."""
    monkeypatch.setenv("SLURM_CONF", str(sim.slurm_conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    yield
    deadline = time.monotonic() + 30  # stop() has cancelled the kit's jobs: they may still be COMPLETING
    while sim.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)  # polling squeue
    left = sim.jobs()
    if left:
        subprocess.run(["scancel", *[job.split()[0] for job in left]], capture_output=True)
    assert not left, f"jobs left in the queue: {left}"


def profile(kind: str, sim: SimCluster, folder: Path) -> Path:
    """docs/profiles/<kind> as a user installs it, with the emulated login node's address."""
    return sim.install_profile(kind, folder / f"profile_kit-{kind}")


def own_tmpdirs(pid: int) -> list[str]:
    """The folders :func:`kit.core._remote.own_tmpdir` made for the engine with ``pid`` (SSH sessions' engines
    write under /tmp; the hosts share this machine's file system)."""
    return [p for base in host_tmp_folders() for p in glob.glob(f"{base}/kit-engine-{pid}-*")]


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.2)  # polling squeue / the process table


def in_namespace(host, *argv: str, script: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", host.namespace, *argv], input=script, capture_output=True,
                          text=True, timeout=30)


#: How long the login node's probe waits for a task's port: an open one answers on the bridge within a
#: millisecond, a dropped one never does.
PROBE_S = 0.5


def from_login_node(reachable_at: str, bridge: str) -> tuple[str, int]:
    """The host and port this machine connects to for a task's ``reachable_at`` entry: an IPv6 link-local
    address is reached through this machine's side of the link, the emulated cluster's bridge."""
    host, _, port = reachable_at.rpartition(":")
    host = host.strip("[]")
    return (f"{host.partition('%')[0]}%{bridge}" if "%" in host else host), int(port)


def test_the_emulated_cluster_comes_up_and_leaves_nothing(tmp_path):
    require_sim_tools()
    started = time.monotonic()
    sim = SimCluster(hosts=2, root=tmp_path / "sim").up()
    up_s = time.monotonic() - started
    env = {**os.environ, **sim.environment()}
    try:
        ran = subprocess.run(["srun", "-N2", "sh", "-c", "echo $(hostname) $SLURM_PROCID"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert sorted(ran.stdout.split("\n")[:2]) == ["h1 0", "h2 1"], ran
        over_ssh = subprocess.run(["ssh", "-F", str(sim.ssh_config), "h2", "hostname; echo $SSH_CONNECTION"],
                                  capture_output=True, text=True, timeout=60)
        assert over_ssh.stdout.split()[0] == "h2", over_ssh
        assert over_ssh.stdout.split()[3] == sim.hosts[1].address  # the session runs on h2's network
        state = sim.state
        pids = list(state.pids.values())
    finally:
        sim.down()
    print(f"emulated cluster up in {up_s:.1f} s")
    assert not [p for p in pids if _lifeline.runs(p)]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not [h for h in state.hosts if h.namespace in namespaces]
    assert state.bridge not in links
    assert not (tmp_path / "sim").exists()
    assert not [h for h in state.hosts if Path(sim_state.NETNS_ETC, h.namespace).exists()]


def kill_when_waiting(cluster: TFCluster, run_dir: Path, task: str) -> threading.Thread:
    """A thread that ``cluster.kill(task)`` once ``task`` waits to be ended: its fault callback journals "kill",
    runs a no-op command and waits (``kill_command=WAIT``). The run cannot move past that step meanwhile (the
    peers wait in the next all-reduce), so the kill lands at that step however late the signal arrives: sent at a
    step seen in the journal, it landed 20 or more steps later in some runs on a loaded machine."""
    def kill():
        resilience.wait_for_event(run_dir, task, "kill", timeout=120)
        cluster.kill(task)

    timer = threading.Thread(target=kill)
    timer.start()
    return timer


WAIT = ["true"]  # the fault callback's command: nothing; the task then waits to be ended from outside


def job_of(engines: ipp.Cluster, task: str) -> str:
    """The Slurm job that holds ``task``'s engine (the kit submits one engine set per task)."""
    return engines.engines[engine_set_id(task)].job_id


KERNEL = """
import socket, sys, ipyparallel as ipp
sys.path.insert(0, {repo!r})
from kit.core import _lifeline
from kit.core.cluster import TFCluster
on_slurm = TFCluster(workers=2, engines=ipp.Cluster(profile_dir={slurm!r}, log_level=40), start_timeout=120).start()
over_ssh = TFCluster(workers=2, engines=ipp.Cluster(profile_dir={ssh!r}, log_level=40), start_timeout=120).start()
print("ready", *sorted(on_slurm.run(socket.gethostname)), *sorted(over_ssh.run(socket.gethostname)), flush=True)
sys.stdin.read()
"""


def test_the_kit_waits_for_a_queued_job_and_a_killed_kernel_leaves_no_job(sim, slurm_env, tmp_path):
    """Another user's job holds both nodes. A start whose limit passes names the kit's jobs and why they wait;
    a notebook kernel's start waits for the nodes (and starts a cluster over SSH too). Then the kernel dies
    (SIGKILL: no atexit, no stop): its jobs and its engines on every host must still go."""
    blocker = subprocess.run(["sbatch", "--parsable", "-N2", "--job-name=other-user", "--output=/dev/null",
                              "--wrap", "sleep 600"], capture_output=True, text=True, timeout=30, check=True)
    blocker = blocker.stdout.strip()
    wait_until(lambda: any(f"{blocker} other-user RUNNING" in job for job in sim.jobs()), 30, "the blocking job")
    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path / "a")), log_level=40)
    with pytest.raises(ClusterError) as info:
        TFCluster(workers=2, engines=engines, start_timeout=8).start()
    message = str(info.value)
    print(message)
    assert "too few engines: 0 registered within 8s" in message and "PENDING, reason: Resources" in message
    assert "worker-0 job" in message and "worker-1 job" in message and "raise start_timeout" in message
    assert info.value.tasks == ["worker:0", "worker:1"]
    wait_until(lambda: [j.split()[1] for j in sim.jobs()] == ["other-user"], 30, "the failed start's jobs to go")

    profiles = {"slurm": profile("slurm", sim, tmp_path / "b"), "ssh": ssh_profile(sim, tmp_path / "c")}
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL.format(repo=str(REPO), **{k: str(v) for k, v in
                                                                                   profiles.items()})],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sum("kit-engine PENDING" in j for j in sim.jobs()) == 2, 60, "the kernel's jobs to queue")
        subprocess.run(["scancel", blocker], check=True, timeout=30)
        ready = kernel.stdout.readline().split()  # the kernel's start is bounded by its start_timeout (120 s)
        assert ready == ["ready", "h1", "h2", "h1", "h2"], ready
        assert sum("kit-engine RUNNING" in j for j in sim.jobs()) == 2
    finally:
        kernel.kill()
        kernel.wait(timeout=30)
    started = time.monotonic()
    wait_until(lambda: not sim.jobs(), 60, "the jobs of a killed kernel to end")
    wait_until(lambda: not sim.leftovers(), 30, "the engines of a killed kernel to end")
    print(f"jobs gone {time.monotonic() - started:.1f} s after the kernel was killed")
    # their temporary folders too: the Slurm engines' at SIGTERM, the SSH engines' by the lifeline's ssh commands,
    # which it runs one after another, each bounded (no later engine comes to these hosts in this test to sweep them)
    deadline = time.monotonic() + 30
    while temporary_leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the folders
    assert not temporary_leftovers(), f"the killed kernel's engines left {temporary_leftovers()}"
    # the controllers' lifelines ended them (kit.core._lifeline's last words), not the engines' missed heartbeats
    for kind, command in (("slurm", "scancel"), ("ssh", "ssh")):
        said = "".join(log.read_text() for log in (profiles[kind] / "log").glob("ipcontroller*.log"))
        assert f"kit lifeline: ran {command} " in said, said[-2000:]
        assert not (profiles[kind] / "kit-last-words.json").exists()  # said once, then removed


def test_a_killed_task_and_a_cancelled_job_are_lost_tasks_and_the_run_resumes(sim, slurm_env, tmp_path):
    """One run, two faults: ``cluster.kill("worker:1")`` at step 10, then, in the second attempt, a plain
    ``scancel`` of worker:0's job at step 30. Each is a lost task; each restart gets fresh jobs and resumes from the
    backup. Then a plain ``scancel`` of an idle engine's job: the next run names the task."""
    def fault_of_this_attempt(run_dir: str):
        """Notebook 05's lesson trains (run_lesson); this callback, built on each task, injects the attempt's fault.
        Attempt 1: worker:1 waits at step 10 for ``cluster.kill`` (:func:`kill_when_waiting`). Attempt 2:
        worker:0's own callback runs ``scancel`` of its job at step 30 (its job's shell has $SLURM_JOB_ID) and waits
        to be ended: sent from the test, the signal landed too late in 3 runs of 4 (an attempt's 50 steps take
        ~5 s). SIGTERM first, which the busy engine defers; Slurm's SIGKILL follows after KillWait (2 s here)."""
        from kit.train import resilience  # defined here, so that it travels by value

        if resilience.Journal(run_dir).attempt == 1:
            return resilience.kill_at_step_callback(run_dir, "worker:1", 10, after_task="worker:0",
                                                    command=["true"])  # WAIT
        return resilience.kill_at_step_callback(run_dir, "worker:0", 30, command=["scancel", "$SLURM_JOB_ID"])

    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path)), log_level=40)
    run_dir = tmp_path / "run"
    started = time.monotonic()
    with TFCluster(workers=2, engines=engines, start_timeout=120) as cluster:
        ready_s = time.monotonic() - started
        running = sim.jobs()
        assert len(running) == 2 and all("kit-engine RUNNING" in job for job in running), running
        assert sorted(cluster.run(socket.gethostname)) == ["h1", "h2"]  # one task per node, TF_CONFIG from the kit
        assert sorted(t.address.rpartition(":")[0] for t in cluster.tasks) == sorted(h.address for h in sim.hosts)
        jobs = [{task: job_of(engines, task) for task in cluster.task_names}]
        first_addresses = {t.address for t in cluster.tasks}
        timer = kill_when_waiting(cluster, run_dir, "worker:1")
        results = run_lesson(cluster.with_options(max_failures=2), run_dir, epochs=3, steps_per_epoch=20,
                             save_freq=5, callbacks=[OnTask(fault_of_this_attempt, str(run_dir))])
        timer.join(timeout=60)
        jobs.append({task: job_of(engines, task) for task in cluster.task_names})
        # fresh engines pick fresh ports on their hosts (kit.core.roles): firewall rules must be loaded again
        assert not first_addresses & {t.address for t in cluster.tasks}, (first_addresses, cluster.tasks)

        def malloc_arenas():  # defined here, so that it travels by value (the engines cannot import tests/)
            from kit.core import _remote
            return _remote.MALLOC_ARENA_MAX, _remote.ARENAS_WHEN_LIMITED, _remote.malloc_arenas()

        arenas = cluster.run(malloc_arenas)
        idle_job = jobs[-1]["worker:1"]
        subprocess.run(["scancel", idle_job], check=True, timeout=30)  # plain: an idle engine ends at once
        wait_until(lambda: not [j for j in sim.jobs() if j.split()[0] == idle_job], 30, f"job {idle_job} to end")
        with pytest.raises(ClusterError, match=r"worker:1: the engine process is gone") as info:
            cluster.run(socket.gethostname)
        assert info.value.tasks == ["worker:1"]
    assert [f.task for f in cluster.failures] == ["worker:1", "worker:0"], cluster.failures
    assert all("failed: its engine process exited" in f.error for f in cluster.failures), cluster.failures
    assert all(r["global_step"] == 60 for r in results), results
    summary = resilience.summarize(run_dir, "worker:0")
    assert summary["attempts"] == 3 and summary["completed"] and summary["steps_redone"] <= 5, summary  # backup every 5
    waited, kill = [r for r in resilience.read_journal(run_dir) if r["event"] == "kill"]
    assert (waited["task"], waited["global_step"], waited["command"]) == ("worker:1", 10, WAIT), waited
    assert kill["global_step"] == 30 and kill["task"] == "worker:0" and kill["command"][0] == "scancel", kill
    jobs.insert(1, {"worker:0": kill["command"][1]})  # the second attempt's job that was cancelled
    assert len({job for attempt in jobs for job in attempt.values()}) == 5, jobs  # fresh jobs for each attempt
    np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-5)
    # Slurm's engines start without MALLOC_ARENA_MAX (glibc then ignores the variable): the kit's mallopt kept
    # TensorFlow's threads from adding any arena to those the engine had before its role was set
    assert all(limit == 2 and now == before for limit, before, now in arenas), arenas
    print(f"Slurm: TFCluster ready in {ready_s:.1f} s")
    wait_until(lambda: not sim.jobs(), 30, "the kit's jobs to leave the queue after stop()")
    wait_until(lambda: not sim.leftovers(), 30, "the engines to end on every node")
    assert not list(Path.cwd().glob("*.sbatch")), "a batch script was written outside the profile"


def test_a_busy_and_a_killed_slurm_engine_leave_no_folder_once_the_cluster_stops(sim, slurm_env, tmp_path):
    """The stop removes every Slurm engine's own folder on its node, with no later engine there to sweep it:
    worker:0's engine busy in a call (it would defer Slurm's SIGTERM), worker:1's killed before the stop."""
    def busy():  # defined here, so that it travels by value
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as deep in a collective: Python's handlers do not run
        time.sleep(300)

    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path)), log_level=40)
    client = None
    try:
        with TFCluster(workers=2, engines=engines, start_timeout=120) as cluster:
            pids = dict(zip(cluster.task_names, cluster.run(os.getpid)))
            assert all(len(own_tmpdirs(pid)) == 1 for pid in pids.values()), {p: own_tmpdirs(p) for p in pids.values()}
            client = engines.connect_client_sync()
            by_pid = {client[i].apply_sync(os.getpid): i for i in client.ids}
            cluster.kill("worker:1")
            engine = by_pid[pids["worker:0"]]
            client[engine].apply_async(busy)
            wait_until(lambda: client.queue_status(targets=[engine])[engine].get("queue"), 30, "worker:0 to be busy")
        left = {task: own_tmpdirs(pid) for task, pid in pids.items()}
        assert not any(left.values()), f"the stop left the engines' folders: {left}"
    finally:
        if client is not None:
            client.close()
    wait_until(lambda: not sim.jobs(), 30, "the kit's jobs to leave the queue after stop()")
    wait_until(lambda: not sim.leftovers(), 30, "the engines to end on every node")


def test_a_keras3_jax_job_trains_on_slurm_nodes_as_one_process_does(sim, slurm_env, tmp_path):
    """A JaxCluster on two Slurm nodes (one process per host, over the emulated network): each process gets the job's
    addresses (its node's, process 0's first), and the two train, DataParallel, to the losses of one process."""
    from kit.core.keras_jax import JaxCluster
    from kit.tools.cells import lesson

    train, mnist = lesson("12-keras3-jax")["train"], str(REPO / "kit" / "train" / "datasets" / "mnist.npz")
    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path)), log_level=40)
    with JaxCluster(workers=2, engines=engines, start_timeout=120) as cluster:
        assert sorted(cluster.run(socket.gethostname)) == ["h1", "h2"]  # one process per node
        addresses = cluster.jax_env["worker:1"]["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")
        assert addresses == [t.address for t in cluster.tasks] and not addresses[0].startswith("127."), addresses
        two = cluster.with_options(stream=False).run(train, 32, 2, 128, 0.05, 1, mnist)   # notebook 12's lesson
    with JaxCluster(workers=1) as one:
        [single] = one.with_options(stream=False).run(train, 32, 2, 128, 0.05, 1, mnist)
    assert two[0]["loss"] == two[1]["loss"], f"expected both nodes to log the same losses, measured {two}"
    np.testing.assert_allclose(two[0]["loss"], single["loss"], rtol=1e-4,
                               err_msg="expected the two nodes to train as one process with the global batch")
    wait_until(lambda: not sim.jobs(), 30, "the kit's jobs to leave the queue after stop()")
    wait_until(lambda: not sim.leftovers(), 30, "the engines to end on every node")


# ----- SSH -----------------------------------------------------------------------------------------
def ssh_profile(sim: SimCluster, folder: Path) -> Path:
    """docs/profiles/ssh as a user edits it: the hosts, this machine's address, the ssh_config, the Python."""
    target = profile("ssh", sim, folder)
    config = target / "ipcluster_config.py"
    text = config.read_text()
    for old, new in ((('"node1": 1, "node2": 1'), ", ".join(f'"{h.name}": 1' for h in sim.hosts)),
                     ("/home/you/.ssh/kit-cluster.config", str(sim.ssh_config)),
                     ("/path/to/project/.venv/bin/python", sys.executable)):
        assert old in text, old
        text = text.replace(old, new)
    config.write_text(text)
    return target


def test_kit_trains_over_ssh_restarts_and_then_behind_the_peer_only_firewall(sim, tmp_path):
    """Over SSH, one task per host: a killed task restarts the run on fresh engines. The warning named every
    address of every task; on the fresh engines the rules of kit.tools.firewall (for their new ports) shut this
    machine (the login node: the controller's host, not a peer) out of every address, and the workers still
    train, to the same losses. Nothing is left on any host."""
    engines = ipp.Cluster(profile_dir=str(ssh_profile(sim, tmp_path)), log_level=40)
    hosts = {h.address: h for h in sim.hosts}
    loaded = []
    started = time.monotonic()
    try:
        with pytest.warns(ExposedPortsWarning) as warned, \
                TFCluster(workers=2, engines=engines, start_timeout=120) as cluster:
            ready_s = time.monotonic() - started
            assert sorted(cluster.run(socket.gethostname)) == ["h1", "h2"]  # one task per host
            (message,) = exposed(warned)
            for t in cluster.tasks:  # each host's every address: its bridge address, and its IPv6 link-local one
                assert t.address in t.reachable_at and len(t.reachable_at) >= 2, t
                assert f"{t.name} at {t.address} (reachable at {', '.join(t.reachable_at)})" in message
            assert all("reachable from the network" in t.listens_on for t in cluster.tasks)

            run_dir = tmp_path / "run"
            timer = kill_when_waiting(cluster, run_dir, "worker:1")
            results = run_lesson(cluster.with_options(max_failures=1), run_dir, epochs=3, steps_per_epoch=20,
                                 save_freq=5, kill_task="worker:1", kill_at_step=10, kill_command=WAIT)
            timer.join(timeout=60)
            assert [f.task for f in cluster.failures] == ["worker:1"], cluster.failures
            assert all(r["global_step"] == 60 for r in results), results
            assert resilience.summarize(run_dir, "worker:0")["attempts"] == 2
            np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-5)
            assert sorted(cluster.run(socket.gethostname)) == ["h1", "h2"]  # the fresh engines: one per host again
            # shown once in a kernel, not again for the restart; its fresh tasks' addresses are in describe()
            assert len(exposed(warned)) == 1, exposed(warned)
            assert cluster.describe()["address"].tolist() == [t.address for t in cluster.tasks]
            assert not list((run_dir / "backup").rglob("*"))  # BackupAndRestore's folder: empty after the run

            # a task's server starts when the strategy is built and lives as long as its engine: after one run
            # every fresh task listens, and the login node can connect to each of its addresses
            targets = [from_login_node(a, sim.state.bridge) for t in cluster.tasks for a in t.reachable_at]
            with_kit = run_lesson(cluster, tmp_path / "open", epochs=1, steps_per_epoch=20)
            assert [f"{h}:{p}" for h, p in targets if firewall.reachable(h, p, PROBE_S)] == \
                [f"{h}:{p}" for h, p in targets]
            for address, script in firewall.nft_rules(cluster.tasks).items():
                loaded.append(hosts[address])
                done = in_namespace(hosts[address], "nft", "-f", "-", script=script)
                assert done.returncode == 0, done.stderr
            shut = [f"{h}:{p}" for h, p in targets if firewall.reachable(h, p, PROBE_S)]
            assert not shut, f"the login node still reaches {shut}"
            # the rules match every packet (no connection state): all of the workers' traffic passed them
            behind_rules = run_lesson(cluster, tmp_path / "shut", epochs=1, steps_per_epoch=20)

            # an engine still busy at stop() cannot remove its own folder first (the round asks idle engines
            # only), and no engine starts on its host after it: the kit removes it over ssh once it is gone
            busy = cluster.tasks[1]
            client = engines.connect_client_sync()
            client[busy.engine_id].apply_async(time.sleep, 300)
            wait_until(lambda: client.queue_status(targets=[busy.engine_id])[busy.engine_id]["queue"], 10,
                       f"{busy.name}'s engine to start its call")
            assert own_tmpdirs(busy.pid), f"{busy.name}'s engine has no folder of its own"
        client.close()
        assert not own_tmpdirs(busy.pid), f"{busy.name}'s engine, busy at stop(), left its folder"
    finally:
        for host in loaded:
            removed = in_namespace(host, *firewall.nft_delete())
            assert removed.returncode == 0, removed.stderr
    print(f"SSH: TFCluster ready in {ready_s:.1f} s")
    np.testing.assert_allclose(with_kit[0]["loss"], with_kit[1]["loss"], rtol=1e-6)
    np.testing.assert_allclose(behind_rules[0]["loss"], with_kit[0]["loss"], rtol=1e-5)
    np.testing.assert_allclose(behind_rules[1]["loss"], with_kit[0]["loss"], rtol=1e-5)
    assert not [h.name for h in sim.hosts if "inet kit" in in_namespace(h, "nft", "list", "tables").stdout]
    wait_until(lambda: not sim.leftovers(), 30, "the engines to end on every host after stop()")


# ----- notebook 11's lesson, taken home (issue 37: the exported script on Slurm, without the kit) -------------
TAKE_HOME_JOB = "take-home-11"


def test_notebook_11s_exported_lesson_trains_as_an_sbatch_job_with_srun(sim, slurm_env, tmp_path):
    """``kit export`` of notebook 11, submitted as a learner submits it: a batch script of two nodes whose one
    command is ``srun python main.py``. Nothing of the kit starts anything: ``SlurmClusterResolver`` in the lesson's
    ``train`` builds the cluster from Slurm's variables (no TF_CONFIG), and both tasks train to the same loss."""
    from take_home import MNIST, PLAIN_ENV, export

    script = export("11-your-own-cluster", tmp_path / "take-home")
    assert "import kit" not in script.read_text() and "SlurmClusterResolver(" in script.read_text()
    batch = tmp_path / "train.sbatch"
    batch.write_text("#!/bin/bash\n"
                     f"#SBATCH --job-name={TAKE_HOME_JOB}\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                     "#SBATCH --exclusive\n#SBATCH --time=00:05:00\n"
                     f"srun --label python main.py --mnist-path {MNIST} --seed 1 --epochs 2 --steps-per-epoch 5\n")
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, **PLAIN_ENV, "TMPDIR": str(tmp_path / "tmp")}  # sbatch hands the job this environment
    env.pop("TF_CONFIG", None)
    out = tmp_path / "job.out"
    started = time.monotonic()
    try:
        job = subprocess.run(["sbatch", "--wait", f"--chdir={script.parent}", f"--output={out}", str(batch)],
                             env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", f"--name={TAKE_HOME_JOB}"], capture_output=True, timeout=30)
        raise AssertionError(f"the job still ran after 240 s:\n{out.read_text()[-3000:] if out.exists() else ''}")
    printed = out.read_text() if out.exists() else ""
    assert job.returncode == 0, f"expected the job to succeed, it exited {job.returncode}: {job.stderr}{printed[-3000:]}"
    results = {}
    for line in printed.splitlines():  # srun --label: "0: {...}", the last line each task printed
        task, _, text = line.partition(": ")
        if text.startswith("{"):
            results[int(task)] = json.loads(text)
    print(f"notebook 11's main.py as an sbatch job: {time.monotonic() - started:.0f} s")
    assert sorted(results) == [0, 1], f"expected a result from tasks 0 and 1, found {sorted(results)}:\n{printed[-3000:]}"
    expected = {"worker": ["h1:8888", "h2:8888"]}
    assert all(r["cluster"] == expected for r in results.values()), f"expected the cluster {expected}: {results}"
    assert len(results[0]["loss"]) == 2, results[0]
    np.testing.assert_allclose(results[1]["loss"][-1], results[0]["loss"][-1], rtol=1e-5)
