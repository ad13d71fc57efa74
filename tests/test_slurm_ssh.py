"""The kit on a real Slurm cluster and on SSH hosts: emulated hosts with slurmd and sshd (kit.tools.sim_cluster).

One emulated cluster (2 hosts) serves the module. The engines get there through ipyparallel's own Slurm and
SSH launchers, configured by the profiles in docs/profiles/ (only the login node's address differs), as a
user of a university cluster would: sbatch/srun/scancel, ssh/scp. As root only; on CI it must run (a missing
prerequisite fails instead of skipping).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import ipyparallel as ipp

from kit.core.cluster import TFCluster
from kit.core.errors import ClusterError
from kit.core.options import engine_set_id
from kit.train import resilience
from kit.tools import sim_cluster, sim_state
from kit.tools.sim_cluster import SimCluster

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "docs" / "profiles"
EXAMPLE = PROFILES / "slurm"  # mnist_slurm.py: the same training with and without the kit
sys.path.insert(0, str(EXAMPLE))
import mnist_slurm  # noqa: E402 (the engines import it by name, from PYTHONPATH)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::kit.core.errors.ExposedPortsWarning")]


def require_sim_tools() -> None:
    """Skip (fail on CI) where no emulated cluster can be made, naming what is missing."""
    problems = sim_cluster.missing()
    if problems:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("an emulated cluster needs " + "; ".join(problems))


@pytest.fixture(scope="module")
def sim():
    require_sim_tools()
    before = set(temporary_leftovers())
    with SimCluster(hosts=2) as made:
        yield made
    left = sorted(set(temporary_leftovers()) - before)
    assert not left, f"the engines on the emulated hosts left {len(left)} entries in /tmp, e.g. {left[:3]}"


def temporary_leftovers() -> list[str]:
    """What an engine can leave in the hosts' temporary folder (they share this machine's /tmp)."""
    import tempfile
    return [name for name in os.listdir(tempfile.gettempdir())
            if name.startswith(("__autograph_generated_file", "kit-engine-"))]


@pytest.fixture
def slurm_env(sim, monkeypatch):
    """This process talks to the emulated Slurm; engines (sbatch exports the environment) find Python and
    the example module."""
    monkeypatch.setenv("SLURM_CONF", str(sim.slurm_conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")])))
    yield
    deadline = time.monotonic() + 30  # stop() has cancelled the kit's jobs: they may still be COMPLETING
    while squeue() and time.monotonic() < deadline:
        time.sleep(0.2)  # polling squeue
    left = squeue()
    if left:
        subprocess.run(["scancel", *[job.split()[0] for job in left]], capture_output=True)
    assert not left, f"jobs left in the queue: {left}"


def squeue() -> list[str]:
    result = subprocess.run(["squeue", "-h", "-o", "%i %j %T %r"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line.strip()]


def profile(kind: str, sim: SimCluster, folder: Path) -> Path:
    """docs/profiles/<kind> as a user installs it, with the emulated login node's address."""
    target = folder / f"profile_kit-{kind}"
    target.mkdir(parents=True)
    text = (PROFILES / kind / "ipcluster_config.py").read_text()
    assert 'controller_location = "login1"' in text
    text = text.replace('controller_location = "login1"', f'controller_location = "{sim.controller_ip}"')
    (target / "ipcluster_config.py").write_text(text)
    return target


def processes_on_hosts(sim: SimCluster) -> list[str]:
    """Every process in the hosts' namespaces but their daemons (slurmd, sshd)."""
    daemons = set(sim.state.pids.values())
    found = []
    for host in sim.hosts:
        for pid in sim_state.namespace_pids(host.namespace):
            if pid in daemons:
                continue
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(f"{host.name} {pid}: {' '.join(proc.cmdline()[:4])}")
            except psutil.NoSuchProcess:
                continue
    return found


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.2)  # polling squeue / the process table


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
    assert not [p for p in pids if sim_state.alive(p)]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not [h for h in state.hosts if h.namespace in namespaces]
    assert state.bridge not in links
    assert not (tmp_path / "sim").exists()
    assert not [h for h in state.hosts if Path(sim_state.NETNS_ETC, h.namespace).exists()]


def test_kit_trains_on_slurm_one_task_per_node(sim, slurm_env, tmp_path):
    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path)), log_level=40)
    started = time.monotonic()
    with TFCluster(workers=2, engines=engines, start_timeout=120) as cluster:
        ready_s = time.monotonic() - started
        jobs = squeue()
        assert len(jobs) == 2 and all("kit-engine RUNNING" in job for job in jobs), jobs
        hosts = cluster.run(socket.gethostname)
        assert sorted(hosts) == ["h1", "h2"]  # one task per node
        assert sorted(t.address.rpartition(":")[0] for t in cluster.tasks) == sorted(h.address for h in sim.hosts)
        with_kit = cluster.run(mnist_slurm.train)
    print(f"Slurm: TFCluster ready in {ready_s:.1f} s")
    assert with_kit[0]["workers"] == 2
    np.testing.assert_allclose(with_kit[0]["loss"], with_kit[1]["loss"], rtol=1e-6)
    wait_until(lambda: not squeue(), 30, "the kit's jobs to leave the queue after stop()")
    wait_until(lambda: not processes_on_hosts(sim), 30, "the engines to end on every node")
    assert not list(Path.cwd().glob("*.sbatch")), "a batch script was written outside the profile"

    # the same training without the kit: sbatch, srun, SlurmClusterResolver, no TF_CONFIG
    out = tmp_path / "resolver"
    out.mkdir()
    submitted = subprocess.run(["sbatch", "--parsable", f"--chdir={REPO}", f"--output={out / 'job.out'}",
                                str(EXAMPLE / "train.sbatch"), str(out)],
                               capture_output=True, text=True, timeout=30, check=True)
    job = submitted.stdout.strip().split(";")[0]
    wait_until(lambda: not squeue(), 180, f"job {job} (SlurmClusterResolver) to finish")
    results = [json.loads((out / f"losses-worker-{i}.json").read_text()) for i in range(2)]
    assert results[0]["cluster"] == {"worker": ["h1:8888", "h2:8888"]}, results[0]["cluster"]
    np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-6)
    np.testing.assert_allclose(results[0]["loss"], with_kit[0]["loss"], rtol=1e-5)  # same training, same losses
    assert "TF_CONFIG" not in (out / "job.out").read_text()


def job_of(engines: ipp.Cluster, task: str) -> str:
    """The Slurm job that holds ``task``'s engine (the kit submits one engine set per task)."""
    return engines.engines[engine_set_id(task)].job_id


def test_the_kit_waits_for_a_queued_job_and_names_the_jobs_when_the_limit_passes(sim, slurm_env, tmp_path):
    blocker = subprocess.run(["sbatch", "--parsable", "-N2", "--job-name=other-user", "--output=/dev/null",
                              "--wrap", "sleep 600"], capture_output=True, text=True, timeout=30, check=True)
    blocker = blocker.stdout.strip()
    wait_until(lambda: any(f"{blocker} other-user RUNNING" in job for job in squeue()), 30, "the blocking job")
    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path / "a")), log_level=40)
    with pytest.raises(ClusterError) as info:
        TFCluster(workers=2, engines=engines, start_timeout=8).start()
    message = str(info.value)
    print(message)
    assert "too few engines: 0 registered within 8s" in message and "PENDING, reason: Resources" in message
    assert "worker-0 job" in message and "worker-1 job" in message and "raise start_timeout" in message
    assert info.value.tasks == ["worker:0", "worker:1"]
    wait_until(lambda: [j.split()[1] for j in squeue()] == ["other-user"], 30, "the failed start's jobs to go")

    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path / "b")), log_level=40)
    cluster = TFCluster(workers=2, engines=engines, start_timeout=120)
    started = threading.Thread(target=cluster.start)
    started.start()
    try:
        wait_until(lambda: sum("kit-engine PENDING" in j for j in squeue()) == 2, 60, "the kit's jobs to queue")
        subprocess.run(["scancel", blocker], check=True, timeout=30)
        started.join(timeout=120)
        assert not started.is_alive(), "TFCluster.start did not return within 120 s of the queue clearing"
        assert sorted(cluster.run(socket.gethostname)) == ["h1", "h2"]
    finally:
        started.join(timeout=120)
        cluster.stop()
    wait_until(lambda: not squeue(), 30, "the kit's jobs to leave the queue after stop()")


def test_a_killed_task_and_a_cancelled_job_are_lost_tasks_and_the_run_resumes(sim, slurm_env, tmp_path):
    engines = ipp.Cluster(profile_dir=str(profile("slurm", sim, tmp_path)), log_level=40)
    with TFCluster(workers=2, engines=engines, start_timeout=120) as cluster:
        for fault, run_dir in (("kill", tmp_path / "killed"), ("scancel", tmp_path / "cancelled")):
            jobs = {task: job_of(engines, task) for task in cluster.task_names}

            def inject():
                resilience.wait_for_step(run_dir, "worker:1", 10, timeout=120)
                if fault == "kill":
                    cluster.kill("worker:1")
                else:
                    # SIGKILL to the engine's job step (<job>.0), as a node failure or the OOM killer would end
                    # it. A plain `scancel <job>` sends SIGTERM, which a busy ipyparallel engine defers until
                    # its task ends; Slurm's SIGKILL follows after KillWait (30 s by default, 2 s here).
                    subprocess.run(["scancel", "--signal=KILL", f"{jobs['worker:1']}.0"], check=True, timeout=30)

            timer = threading.Thread(target=inject)
            timer.start()
            results = cluster.with_options(max_failures=1).run(
                resilience.train_resumable, str(run_dir), epochs=3, steps_per_epoch=20, save_freq=5)
            timer.join(timeout=60)
            assert [f.task for f in cluster.failures][-1:] == ["worker:1"], (fault, cluster.failures)
            assert "worker:1 failed: its engine process exited" in cluster.failures[-1].error, (fault, cluster.failures)
            assert all(r["attempt"] == 2 and r["global_step"] == 60 for r in results), (fault, results)
            summary = resilience.summarize(run_dir, "worker:0")
            assert summary["completed"] and summary["steps_redone"] <= 5, (fault, summary)  # a backup every 5
            new_jobs = {task: job_of(engines, task) for task in cluster.task_names}
            assert not set(new_jobs.values()) & set(jobs.values()), (fault, jobs, new_jobs)  # fresh jobs
            np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-5)
            resilience.remove_backup_dir(run_dir)
    wait_until(lambda: not squeue(), 30, "the kit's jobs to leave the queue after stop()")
    wait_until(lambda: not processes_on_hosts(sim), 30, "the engines to end on every node")


KERNEL = """
import sys, ipyparallel as ipp
sys.path.insert(0, {repo!r})
from kit.core.cluster import TFCluster
cluster = TFCluster(workers=2, engines=ipp.Cluster(profile_dir={profile!r}, log_level=40), start_timeout=120).start()
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_killed_kernel_leaves_no_job_and_no_engine(sim, slurm_env, tmp_path):
    """The notebook's kernel dies (SIGKILL: no atexit, no stop): the jobs and engines must still go."""
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL.format(repo=str(REPO), profile=str(
        profile("slurm", sim, tmp_path)))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdout.readline().strip() == "ready"
        assert sum("kit-engine RUNNING" in j for j in squeue()) == 2
    finally:
        kernel.kill()
        kernel.wait(timeout=30)
    started = time.monotonic()
    wait_until(lambda: not squeue(), 60, "the jobs of a killed kernel to end")
    wait_until(lambda: not processes_on_hosts(sim), 30, "the engines of a killed kernel to end")
    print(f"jobs gone {time.monotonic() - started:.1f} s after the kernel was killed")


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


def test_kit_trains_over_ssh_restarts_and_leaves_no_process(sim, tmp_path):
    engines = ipp.Cluster(profile_dir=str(ssh_profile(sim, tmp_path)), log_level=40)
    started = time.monotonic()
    with TFCluster(workers=2, engines=engines, start_timeout=120) as cluster:
        ready_s = time.monotonic() - started
        assert sorted(cluster.run(socket.gethostname)) == ["h1", "h2"]  # one task per host
        from kit.train.fit import train_mnist  # importable there: over SSH the hosts' environment is their own
        first = cluster.run(train_mnist, per_worker_batch=32, epochs=1, steps_per_epoch=5, verbose=0)
        np.testing.assert_allclose(first[0]["loss"], first[1]["loss"], rtol=1e-6)
        run_dir = tmp_path / "run"

        def kill_worker_1():
            resilience.wait_for_step(run_dir, "worker:1", 10, timeout=120)
            cluster.kill("worker:1")

        timer = threading.Thread(target=kill_worker_1)
        timer.start()
        results = cluster.with_options(max_failures=1).run(
            resilience.train_resumable, str(run_dir), epochs=3, steps_per_epoch=20, save_freq=5)
        timer.join(timeout=60)
        assert [f.task for f in cluster.failures] == ["worker:1"], cluster.failures
        assert all(r["attempt"] == 2 and r["global_step"] == 60 for r in results), results
        assert sorted(cluster.run(socket.gethostname)) == ["h1", "h2"]  # the fresh engines: one per host again
        resilience.remove_backup_dir(run_dir)
    print(f"SSH: TFCluster ready in {ready_s:.1f} s")
    wait_until(lambda: not processes_on_hosts(sim), 30, "the engines to end on every host after stop()")
