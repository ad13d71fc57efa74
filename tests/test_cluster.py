"""kit.TFCluster: start, run, errors, and that no process outlives its cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import psutil
import pytest

from conftest import REPO, broken_startup, describe, kit_processes
import kit
from kit.core import _lifeline, limits, roles, tfconfig
from kit.core.cluster import STARTUP_NOISE, Phase, TFCluster
from kit.core.errors import ClusterError, ExposedPortsWarning, OptionError, WorkerError


def wait_until_gone(pids, timeout):
    """Seconds until every pid has exited (zombies count as exited); fails after ``timeout``."""
    start = time.monotonic()
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    while time.monotonic() - start < timeout:
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                continue
        if not alive:
            return time.monotonic() - start
        psutil.wait_procs(alive, timeout=0.2)
    pytest.fail(f"still running after {timeout}s: {[p.pid for p in alive]}")


# ----- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, field", [({"workers": -1}, "workers"), ({"workers": "2"}, "workers"),
                                            ({"workers": 0}, "workers"), ({"ps": 1.5}, "ps"),
                                            ({"chief": "yes"}, "chief"), ({"keras": "keras2"}, "keras"),
                                            ({"threads": 0}, "threads"), ({"start_timeout": 0}, "start_timeout"),
                                            ({"tf_logs": "some"}, "tf_logs"),
                                            ({"worker": 2}, "worker")])
def test_bad_options_name_the_field(options, field):
    with pytest.raises(OptionError) as info:
        TFCluster(**options)
    assert info.value.field == field and "Fix:" in str(info.value)


def test_task_names_follow_the_layout():
    cluster = TFCluster(workers=2, chief=True, ps=1, evaluator=True)
    assert cluster.task_names == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
    with pytest.raises(ClusterError, match="not running"):
        cluster.run(print)


# ----- a running cluster ---------------------------------------------------------------------------
@pytest.mark.slow  # the shared cluster (2.8 s to start)
def test_tasks_describe_each_engine(two_workers):
    tasks = two_workers.tasks
    assert [t.name for t in tasks] == ["worker:0", "worker:1"]
    assert len({t.engine_id for t in tasks}) == 2 and len({t.address for t in tasks}) == 2
    assert all(psutil.pid_exists(t.pid) and t.keras == "tf-keras" for t in tasks)
    assert all(t.address.startswith("127.0.0.1:") for t in tasks)
    assert list(two_workers.describe().index) == ["worker:0", "worker:1"]


@pytest.mark.slow  # the shared cluster (2.8 s to start)
def test_each_engine_has_its_tf_config_and_environment_before_tensorflow(two_workers):
    def environment():
        import os
        return {k: os.environ.get(k) for k in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "TF_NUM_INTRAOP_THREADS",
                                               "OMP_NUM_THREADS", "KIT_TASK")} | {"pid": os.getpid()}

    threads = str(max(1, limits.read().cores // 2))
    for task, env in zip(two_workers.tasks, two_workers.run(environment)):
        config = tfconfig.loads(env["TF_CONFIG"], strategy="multi_worker_mirrored")
        assert config == two_workers.tf_configs[task.name]
        assert config["task"] == {"type": "worker", "index": task.index}
        assert env["TF_USE_LEGACY_KERAS"] == "1" and env["KIT_TASK"] == task.name
        assert env["TF_NUM_INTRAOP_THREADS"] == env["OMP_NUM_THREADS"] == threads
        assert env["pid"] == task.pid


@pytest.mark.slow  # the shared cluster (2.8 s to start)
def test_a_start_up_round_asks_every_engine_at_once_and_names_the_one_that_is_late(two_workers, tmp_path):
    def answer(seconds):
        import os
        import time
        time.sleep(seconds)
        return os.environ["KIT_TASK"]

    def meet(folder, names):
        """Mark this task's arrival, then wait (bounded) for every task's: only tasks asked at once all meet."""
        import os
        import time
        open(os.path.join(folder, os.environ["KIT_TASK"]), "w").close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(os.path.exists(os.path.join(folder, n)) for n in names):
            time.sleep(0.05)
        return sorted(n for n in names if os.path.exists(os.path.join(folder, n)))

    ids = {t.name: t.engine_id for t in two_workers.tasks}
    client = two_workers.engines.client
    names = sorted(ids)
    # Asked one after another, the first task would wait alone and see only itself.
    assert roles.on_each(client, ids, meet, {n: (str(tmp_path), names) for n in names}, timeout=60) == \
        {n: names for n in names}
    with pytest.raises(ClusterError) as info:
        roles.on_each(client, ids, answer, {"worker:0": (0.0,), "worker:1": (1.5,)}, timeout=0.5)
    assert info.value.tasks == ["worker:1"] and "answer" in str(info.value) and "0.5s" in str(info.value)
    client[ids["worker:1"]].apply_sync(answer, 0.0)  # the late call has ended: the engine is free again


@pytest.mark.slow  # the shared cluster (2.8 s to start)
def test_run_returns_results_in_task_order_with_args(two_workers):
    def scaled(x, factor=1):
        import os
        return (os.environ["KIT_TASK"], x * factor)

    assert two_workers.run(scaled, 3, factor=2) == [("worker:0", 6), ("worker:1", 6)]
    assert two_workers.with_options(tasks=["worker:1"]).run(scaled, 1) == [("worker:1", 1)]
    with pytest.raises(OptionError, match="worker:5"):
        two_workers.with_options(tasks=["worker:5"]).run(scaled, 1)


@pytest.mark.slow  # the shared cluster (4.1 s to start)
def test_every_keyword_goes_to_the_function_and_run_options_go_through_with_options(two_workers):
    """A training function may have parameters named like the run options: run passes them on."""
    def with_run_option_names(x, timeout=None, tasks=None, stream=None, max_failures=None, on_restart=None):
        import os
        return (os.environ["KIT_TASK"], x, timeout, tasks, stream, max_failures, on_restart)

    got = two_workers.run(with_run_option_names, 1, timeout=5, tasks=["ps:9"], stream="s", max_failures=7,
                          on_restart="r")
    assert got == [(n, 1, 5, ["ps:9"], "s", 7, "r") for n in ("worker:0", "worker:1")]
    only_one = two_workers.with_options(tasks=["worker:1"], timeout=30, stream=False)
    assert only_one.run(with_run_option_names, 2, timeout=3) == [("worker:1", 2, 3, None, None, None, None)]
    assert only_one.with_options(tasks=None).run(os.getpid) == [t.pid for t in two_workers.tasks]
    assert only_one.options.timeout == 30 and only_one.options.tasks == ("worker:1",)  # unchanged by with_options


@pytest.mark.parametrize("options, field", [({"timout": 3}, "timout"), ({"timeout": 0}, "timeout"),
                                            ({"timeout": "3"}, "timeout"), ({"tasks": "worker:0"}, "tasks"),
                                            ({"stream": "no"}, "stream"), ({"max_failures": -1}, "max_failures"),
                                            ({"max_failures": True}, "max_failures"),
                                            ({"on_restart": 3}, "on_restart")])
def test_bad_run_options_name_the_field(options, field):
    cluster = TFCluster(workers=1)  # options are checked before anything starts
    with pytest.raises(OptionError) as info:
        cluster.with_options(**options)
    assert info.value.field == field
    if field == "timout":
        assert "tasks, timeout, stream, max_failures, on_restart" in str(info.value)
    assert kit.RunOptions.help().keys() == {"tasks", "timeout", "stream", "max_failures", "on_restart"}


@pytest.mark.slow  # a cluster running TensorFlow: 14.5 s
def test_tensorflow_start_up_noise_is_hidden_but_kept(make_cluster, capsys):
    """TensorFlow's C++ start-up lines (written before TF_CPP_MIN_LOG_LEVEL is read) are not shown;
    what the task prints is, and cluster.output keeps every line. tf_logs="all" shows them."""
    # ipykernel forwards what C libraries write to the file descriptors, as in JupyterLab, except when it sees
    # PYTEST_CURRENT_TEST in its environment: the engines inherit the test's, and kit.core._boot drops it
    assert os.environ.get("PYTEST_CURRENT_TEST")
    def import_tensorflow():
        import os
        import tensorflow as tf
        print(f"TensorFlow {tf.__version__} on {os.environ['KIT_TASK']}, "
              f"log level {os.environ.get('TF_CPP_MIN_LOG_LEVEL')}")

    # preload=False: the run imports TensorFlow, so its start-up lines come in the run (a preloading engine
    # writes them to its log as it starts, before any run, where nothing shows them either)
    quiet = make_cluster(workers=1, preload=False)
    quiet.run(import_tensorflow)
    first = quiet.output["worker:0"]
    quiet.run(print, "next")  # lines written to the file descriptor may trail into the next run
    kept = first + "\n" + quiet.output["worker:0"]
    shown = capsys.readouterr()
    assert "[worker:0] TensorFlow 2.21" in shown.out and "log level 2" in shown.out
    noise = [line for line in kept.splitlines() if STARTUP_NOISE.match(line)]
    assert any("absl::InitializeLog" in line for line in noise), kept  # there was noise ...
    assert not [line for line in shown.err.splitlines() if STARTUP_NOISE.match(line.partition("] ")[2])]
    assert "absl::InitializeLog" not in shown.err and "cpu_feature_guard" not in shown.err  # ... not shown
    loud = make_cluster(workers=1, tf_logs="all")
    loud.run(import_tensorflow)
    loud.run(print, "next")
    assert "absl::InitializeLog" in capsys.readouterr().err


# ----- no process outlives its cluster -------------------------------------------------------------
@pytest.mark.slow  # a cluster: 4.0 s
def test_stop_ends_engines_and_controller(no_leaks):
    before = {p.pid for p in kit_processes(os.getpid())}
    cluster = TFCluster(workers=2).start()
    pids = [p.pid for p in kit_processes(os.getpid()) if p.pid not in before]
    assert set(pids) >= {t.pid for t in cluster.tasks} | {cluster.engines.ipp.controller.process.pid}
    cluster.stop()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    cluster.stop()  # idempotent


@pytest.mark.slow  # a cluster: 4.0 s
def test_exception_inside_with_block_stops_everything(no_leaks):
    with pytest.raises(KeyError):
        with TFCluster(workers=1) as cluster:
            pids = [t.pid for t in cluster.tasks]
            raise KeyError("user code failed")
    assert not any(psutil.pid_exists(p) for p in pids)


@pytest.mark.slow  # a cluster: 6.4 s
def test_engines_exit_when_the_controller_is_killed(make_cluster):
    cluster = make_cluster(workers=2)
    controller = cluster.engines.ipp.controller.process.pid
    everything = [p.pid for p in kit_processes(os.getpid())
                  if p.pid == controller or f",{controller}:" in p.environ()["KIT_LIFELINE"]
                  or p.ppid() == controller]
    assert len(everything) >= 4  # controller, its heart monitor, 2 engines
    # no nanny: one Python process fewer per engine, in memory and at start-up (docs/performance.md, change 17)
    assert not any("ipyparallel.engine.nanny" in " ".join(psutil.Process(p).cmdline()) for p in everything)
    os.kill(controller, signal.SIGKILL)
    seconds = wait_until_gone(everything, timeout=15)
    print(f"engines and the controller's helpers exited {seconds:.1f}s after the controller was killed")


@pytest.mark.slow  # a cluster in a child process: 6.7 s
def test_everything_exits_when_the_owner_is_killed(tmp_path, no_leaks):
    """A killed notebook kernel runs no atexit: the lifeline must take the cluster down."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from kit.core.cluster import TFCluster
        import psutil
        cluster = TFCluster(workers=2).start()
        print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]), flush=True)
        sys.stdin.read()  # block until killed
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    try:
        pids = json.loads(owner.stdout.readline())
        assert len(pids) >= 5 and all(psutil.pid_exists(p) for p in pids)
    finally:
        owner.kill()
        owner.wait()
    seconds = wait_until_gone(pids, timeout=15)
    print(f"controller and engines exited {seconds:.1f}s after their owner was killed")
    assert not kit_processes(owner.pid)


@pytest.mark.slow  # a cluster in a child process: 6.4 s
def test_interpreter_exit_without_stop_ends_everything(tmp_path, no_leaks):
    script = tmp_path / "forgetful.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(REPO)!r})
        import psutil
        from kit.core.cluster import TFCluster
        cluster = TFCluster(workers=1).start()  # never stopped: atexit must do it
        print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]), flush=True)
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pids = json.loads(result.stdout.splitlines()[-1])
    assert len(pids) >= 3
    wait_until_gone(pids, timeout=10)


@pytest.mark.slow  # a cluster in a kernel: 7.3-9.6 s each
@pytest.mark.parametrize("how", ["shutdown", "kill"])
def test_no_kit_process_outlives_its_notebook_kernel(how, no_leaks):
    """A Jupyter kernel (as JupyterLab, papermill and nbval start one) starts a cluster and is shut down
    or killed: the controller, the engines and the network holder all end."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", cwd=str(REPO))
    outputs: list[dict] = []
    try:
        reply = client.execute_interactive(
            "import json, psutil, kit\ncluster = kit.TFCluster(workers=2).start()\n"
            "print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]))",
            timeout=120, output_hook=lambda msg: outputs.append(msg))
        kernel_pid = manager.provisioner.process.pid
    except Exception:
        manager.shutdown_kernel(now=True)
        raise
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    pids = json.loads(next(m["content"]["text"] for m in outputs if m["msg_type"] == "stream"
                           and m["content"]["text"].startswith("[")))
    names = [" ".join(psutil.Process(p).cmdline()[1:4]) for p in pids]
    assert any("kit.core._netns" in n for n in names) and sum("ipyparallel.engine" in n for n in names) >= 2, names
    if how == "shutdown":
        manager.shutdown_kernel(now=False)  # a polite shutdown: atexit stops the cluster
    else:
        os.kill(kernel_pid, signal.SIGKILL)  # no atexit: the lifelines must do it
        manager.shutdown_kernel(now=True)
    wait_until_gone(pids, timeout=20)
    assert not kit_processes(kernel_pid)


@pytest.mark.slow  # two clusters: 8 s
def test_local_engines_are_forked_by_one_zygote_and_share_its_tensorflow(make_cluster):
    """With preload (the default) and more than one task, one zygote in the cluster's network imports TensorFlow and
    forks every engine, also the fresh ones of a restart; an engine's own (unique) memory after an op is then a
    fraction of an engine's that imported TensorFlow itself (measured: 57 against 248 MiB)."""
    def _tensorflow_op() -> float:
        import tensorflow as tf

        return float(tf.reduce_sum(tf.ones([3])))

    cluster = make_cluster(workers=2)
    assert cluster.run(_tensorflow_op) == [3.0, 3.0]
    zygotes = {psutil.Process(t.pid).parent().pid for t in cluster.tasks}
    (zygote,) = zygotes
    assert "kit.core._zygote" in " ".join(psutil.Process(zygote).cmdline())
    assert {os.readlink(f"/proc/{pid}/ns/net") for pid in [zygote, *(t.pid for t in cluster.tasks)]} == \
        {os.readlink(f"/proc/{cluster.tasks[0].pid}/ns/net")} != {os.readlink("/proc/self/ns/net")}
    forked = {t.name: psutil.Process(t.pid).memory_full_info().uss for t in cluster.tasks}
    before = [t.pid for t in cluster.tasks]
    cluster.restart()
    assert cluster.run(_tensorflow_op) == [3.0, 3.0]
    assert {psutil.Process(t.pid).parent().pid for t in cluster.tasks} == zygotes and \
        not {t.pid for t in cluster.tasks} & set(before)
    from kit.core import _zygote
    assert not _zygote.same_start([{"PYTHONPATH": "/a"}, {}]) and _zygote.same_start([{"KIT_TASK": "x"}, {}])
    itself = make_cluster(workers=1)  # one task: no zygote to share, the engine imports TensorFlow itself
    assert itself.run(_tensorflow_op) == [3.0]
    assert "kit.core._boot" in " ".join(psutil.Process(itself.tasks[0].pid).cmdline())
    alone = psutil.Process(itself.tasks[0].pid).memory_full_info().uss
    assert max(forked.values()) < alone / 2, (forked, alone)  # measured: 57 MiB against 248


@pytest.mark.slow  # one cluster: ~5 s
def test_not_on_linux_a_cluster_starts_plain_without_zygote_or_namespace(monkeypatch, make_cluster):
    """On macOS a fork without exec after TensorFlow's import is unsafe, and network namespaces are Linux only:
    with the platform faked, the engines start as plain processes (each imports TensorFlow itself) on the host's
    network, with the one-line warning, and train."""
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(_lifeline, "_PIDFD", False)  # no pidfd_open: the stop and the kill wait through psutil
    with pytest.warns(ExposedPortsWarning, match="Linux only"):
        cluster = make_cluster(workers=2)
    assert [" ".join(psutil.Process(t.pid).cmdline()[1:3]) for t in cluster.tasks] == ["-m kit.core._boot"] * 2
    assert all(psutil.Process(t.pid).parent().pid == psutil.Process(cluster.tasks[0].pid).parent().pid
               for t in cluster.tasks)
    assert {os.readlink(f"/proc/{t.pid}/ns/net") for t in cluster.tasks} == {os.readlink("/proc/self/ns/net")}
    assert cluster.run(lambda: __import__("tensorflow").reduce_sum([1.0, 2.0]).numpy().item()) == [3.0, 3.0]
    pids = [t.pid for t in cluster.tasks]
    cluster.stop()
    assert not any(psutil.pid_exists(pid) for pid in pids)  # ended and collected: no zombie left


def test_a_zygote_that_cannot_start_or_fork_is_a_clear_error(tmp_path):
    """What the zygote said reaches the error, with the way around it (preload=False); no process is left."""
    from kit.core import _zygote

    (tmp_path / "tensorflow").mkdir()  # a TensorFlow that cannot be imported, first on the path
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('no TensorFlow here')\n")
    with pytest.raises(_zygote.ZygoteError) as info:
        _zygote.Zygote.start(str(tmp_path / "zygote.sock"), {**os.environ, "PYTHONPATH": str(tmp_path)},
                             str(tmp_path / "zygote.log"), timeout=30)
    assert "exited with code 1 before it was ready" in str(info.value) and "no TensorFlow here" in str(info.value)
    assert "preload=False" in info.value.fix and isinstance(info.value, ClusterError)
    with pytest.raises(_zygote.ZygoteError, match="did not fork an engine"):
        _zygote.fork_engine(str(tmp_path / "nobody.sock"), ["ipyparallel.engine"], {}, str(tmp_path), "log")


@pytest.mark.slow  # a cluster: 9.7 s
def test_a_killed_task_fails_the_run_then_restart_gives_fresh_engines(make_cluster):
    cluster = make_cluster(workers=2)
    old = {t.name: t for t in cluster.tasks}

    def wait_forever():
        import time
        while True:
            time.sleep(0.1)

    import threading
    killer = threading.Timer(1.0, cluster.kill, args=("worker:1",))
    killer.start()
    with pytest.raises(WorkerError) as info:
        cluster.with_options(timeout=30).run(wait_forever)
    killer.join()
    assert info.value.task == "worker:1" and "exited" in info.value.error
    assert cluster.state.phase is Phase.STALE and cluster.state.tasks == ("worker:1",) and cluster.started
    assert cluster.state.reason == "the cluster lost worker:1"
    with pytest.raises(ClusterError, match="the cluster lost worker:1. Fix: call cluster.restart") as stale:
        cluster.run(os.getpid)
    assert stale.value.tasks == ["worker:1"]
    assert stale.value.fix == "call cluster.restart() for fresh engines"
    cluster.restart()
    assert cluster.state.phase is Phase.READY and cluster.state.reason == ""
    new = {t.name: t for t in cluster.tasks}
    assert all(new[n].pid != old[n].pid and new[n].engine_id != old[n].engine_id for n in new)
    assert not psutil.pid_exists(old["worker:0"].pid)  # the survivor was replaced too
    assert cluster.run(os.getpid) == [new["worker:0"].pid, new["worker:1"].pid]
    assert cluster.tf_configs["worker:1"]["cluster"] == cluster.tf_configs["worker:0"]["cluster"]


@pytest.mark.slow  # a cluster and a restart: ~15 s
def test_engines_wait_for_a_controller_slow_to_answer_their_registration(make_cluster, monkeypatch):
    """The fresh engines of a restart register with a controller stopped (SIGSTOP) for 7 s, longer than
    ipyparallel's 5 s registration timeout: they wait for it within start_timeout instead of exiting, as they did
    with 1 CPU under load (make binder: "the engine of worker:1 exited during start-up")."""
    import threading

    from kit.core import engines

    cluster = make_cluster(workers=2)  # forked by the zygote: they register at once, while the controller is stopped
    controller = [p for p in kit_processes(os.getpid()) if "kit.core._controller" in " ".join(p.cmdline())]
    assert controller, describe(kit_processes(os.getpid()))
    start = engines.LocalEngines.start

    def start_while_the_controller_is_stopped(self, names, environments):
        for process in controller:
            process.send_signal(signal.SIGSTOP)
        threading.Timer(7.0, lambda: [process.send_signal(signal.SIGCONT) for process in controller]).start()
        return start(self, names, environments)

    monkeypatch.setattr(engines.LocalEngines, "start", start_while_the_controller_is_stopped)
    began = time.monotonic()
    cluster.restart()
    assert time.monotonic() - began > 7, "expected the restart to wait for the stopped controller"
    assert cluster.run(os.getpid) == [task.pid for task in cluster.tasks]


# ----- start-up failures ---------------------------------------------------------------------------
@pytest.mark.slow  # a cluster: 4.0-5.0 s each
@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_a_port_taken_after_it_was_picked_is_replaced(make_cluster, monkeypatch, isolation):
    """On the host's network a port taken since it was picked is replaced; in the cluster's private
    network the host's ports are not the tasks' ports, so the same port is free there and kept."""
    with socket.socket() as squatter:
        squatter.bind(("", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        original = roles.pick_ports

        def pick_a_taken_port(client, reports, host_of):
            ports = original(client, reports, host_of)  # picked on each engine
            ports["worker:1"] = taken
            return ports

        monkeypatch.setattr(roles, "pick_ports", pick_a_taken_port)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExposedPortsWarning)  # isolation="none" is asked for
            cluster = make_cluster(workers=2, isolation=isolation)
        addresses = [t.address for t in cluster.tasks]
        assert (f"127.0.0.1:{taken}" in addresses) == (isolation == "auto")

        def seen_tf_config():
            import json
            import os
            return json.loads(os.environ["TF_CONFIG"])

        assert cluster.run(seen_tf_config) == [cluster.tf_configs[n] for n in cluster.task_names]


@pytest.mark.slow  # a cluster: 3.0 s
def test_a_task_that_crashes_at_start_is_named(tmp_path, monkeypatch, no_leaks):
    broken_startup(tmp_path, monkeypatch,
                   "import os, sys\nprint('engine refuses to start', file=sys.stderr)\nos._exit(7)\n")
    with pytest.raises(ClusterError) as info:
        TFCluster(workers=2, start_timeout=30).start()
    assert info.value.tasks == ["worker:1"]
    assert "exited during start-up" in str(info.value)
    # what it printed: ipyparallel removes an ended engine's log file once it has read it
    assert "engine refuses to start" in str(info.value), f"expected the engine's last words, got: {info.value}"


@pytest.mark.slow  # a cluster: 14.0 s
def test_a_task_that_never_comes_up_is_named_after_the_timeout(tmp_path, monkeypatch, no_leaks):
    broken_startup(tmp_path, monkeypatch, "import time\ntime.sleep(120)\n")
    start = time.monotonic()
    with pytest.raises(ClusterError) as info:
        TFCluster(workers=2, start_timeout=12).start()
    assert info.value.tasks == ["worker:1"] and "start_timeout" in str(info.value)
    assert time.monotonic() - start < 60


# ----- training ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_workers_train_in_lockstep(make_cluster):
    """Notebook 01's lesson on two workers, then the benchmark's tuned run (notebook 08's float16 sum, five steps per
    call) on fresh processes (one MultiWorkerMirroredStrategy per process): both in lockstep."""
    from kit.tools import bench, cells
    from kit.train.progress import Progress

    mnist = str(REPO / "kit" / "train" / "datasets" / "mnist.npz")
    cluster = make_cluster(workers=2)
    histories = cluster.run(cells.lesson("01-single-vs-multi-worker")["train"], 32, 2, 5, mnist, 1,
                            callbacks=[Progress(64)])
    measured = [cluster.last_view.measurements()[task] for task in cluster.task_names]
    np.testing.assert_allclose(histories[0]["loss"], histories[1]["loss"], rtol=1e-5)
    assert [len(m["step_loss"]) for m in measured] == [10, 10]
    # the last step's logged loss ("first": the global mean) is the epoch's loss
    np.testing.assert_allclose(measured[0]["logged_loss"][4::5], histories[0]["loss"], rtol=1e-4)

    cluster.restart()
    _, call, _ = bench.variant_call("2 workers tuned", 32, 2, 5, mnist)
    trial = {**call[4], "steps_per_execution": 5}
    cluster.run(*call[:4], trial, mnist, callbacks=[Progress(64)])
    tuned = [cluster.last_view.measurements()[task] for task in cluster.task_names]
    np.testing.assert_allclose(tuned[0]["step_loss"], tuned[1]["step_loss"], rtol=1e-5)  # still in lockstep
    assert len(tuned[0]["step_loss"]) == 2  # one entry per execution of 5 steps


@pytest.mark.slow
def test_keras3_choice_is_visible_and_real(make_cluster):
    cluster = make_cluster(workers=1, keras="keras3")
    assert cluster.tasks[0].keras == "keras3"

    def flavour():
        from kit.train._tf import keras_flavour
        return keras_flavour()

    assert cluster.run(flavour) == ["keras3"]


def test_user_env_overrides_thread_settings_but_not_the_task_identity():
    cluster = TFCluster(workers=2, env={"TF_NUM_INTEROP_THREADS": "1", "KIT_TASK": "chief:9", "TF_CONFIG": "{}"})
    env = roles.task_environment(cluster.options, "worker:1")
    assert env["TF_NUM_INTEROP_THREADS"] == "1"  # the user's choice wins over the kit's default of >= 2
    assert env["KIT_TASK"] == "worker:1"
    assert "TF_CONFIG" not in env  # the kit's own comes with the port picked on the engine, never the user's
    configs = roles.build_configs(cluster.task_names, {"worker:0": 2222, "worker:1": 2223},
                                  {name: cluster.options.host for name in cluster.task_names})
    assert configs["worker:1"]["task"] == {"type": "worker", "index": 1}
    assert configs["worker:1"]["cluster"] == {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


def test_an_engine_unregistering_during_the_wait_is_logged_not_fatal(caplog):
    """After a restart the controller may declare a killed engine of the old set dead while the new
    engines register; ipyparallel raises EngineError from the wait, which must not end the start."""
    import logging

    import ipyparallel as ipp

    from kit.core.engines import wait_for_one_more_engine

    class ClientWhoseOldEngineUnregisters:
        ids = [4, 5]

        def wait_for_engines(self, n, timeout, interactive):
            raise ipp.error.EngineError("Engine 6 unregistered while waiting for engines.")

    with caplog.at_level(logging.INFO, logger="kit.core.engines"):
        wait_for_one_more_engine(ClientWhoseOldEngineUnregisters())
    assert "Engine 6 unregistered" in caplog.text


ARENAS_SCRIPT = """
import sys, threading
sys.path.insert(0, sys.argv[2])
from kit.core import _remote
if sys.argv[1] == "set":
    assert _remote.set_environment({"MALLOC_ARENA_MAX": "2"})["malloc_arena_max"] == 2
barrier = threading.Barrier(9)
def allocate():
    held = [bytearray(4000) for _ in range(100)]  # > 512 bytes: glibc malloc, in the thread arena
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
arenas = _remote.malloc_arenas()  # while all 8 threads hold their memory
barrier.wait()
print(arenas)
"""


def test_malloc_arena_max_takes_effect_when_set_after_start_up():
    """Engines from elsewhere get MALLOC_ARENA_MAX after start-up, when glibc no longer reads the variable:
    the kit applies it with mallopt. Eight threads allocating at once make eight arenas without it, at most
    two with it."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    counts = {}
    for how in ("leave", "set"):
        done = subprocess.run([sys.executable, "-c", ARENAS_SCRIPT, how, str(REPO)], capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        counts[how] = int(done.stdout)
    assert counts["leave"] > 2 and counts["set"] <= 2, counts


@pytest.mark.slow  # the shared cluster: 1.9 s
def test_engines_run_with_at_most_two_malloc_arenas(two_workers):
    def arenas_under_load():
        import threading

        from kit.core import _remote
        barrier = threading.Barrier(9)

        def allocate():
            held = [bytearray(4000) for _ in range(100)]  # noqa: F841 - held until every thread has allocated
            barrier.wait()

        threads = [threading.Thread(target=allocate) for _ in range(8)]
        for thread in threads:
            thread.start()
        arenas = _remote.malloc_arenas()
        barrier.wait()
        return arenas, _remote.MALLOC_ARENA_MAX

    assert two_workers.run(arenas_under_load) == [(a, 2) for a, _ in two_workers.run(arenas_under_load)]
    assert all(arenas <= 2 for arenas, _ in two_workers.run(arenas_under_load))


def test_an_ended_engines_last_words_are_shown_after_ipyparallel_removed_its_log(tmp_path, monkeypatch):
    """ipyparallel reads the log of an engine it saw end, keeps the text and removes the file: the kit's error
    still shows the engine's last lines, whichever of the two noticed the end first."""
    from ipyparallel.cluster.launcher import LocalProcessLauncher

    from kit.core.engines import LocalEngines
    from kit.core.options import ClusterOptions

    launcher = LocalProcessLauncher(output_file=str(tmp_path / "engine.log"))
    (tmp_path / "engine.log").write_text("starting\nengine refuses to start\n")
    launcher.get_output(remove=True)  # what ipyparallel's launcher does once it has seen the process end
    assert not (tmp_path / "engine.log").exists()
    engines = LocalEngines(ClusterOptions(workers=2))
    monkeypatch.setattr(engines, "_launcher", lambda name: launcher)
    assert engines.log_tail("worker:1").endswith("---\nstarting\nengine refuses to start"), engines.log_tail("worker:1")



@pytest.mark.slow
def test_a_backend_configures_the_ready_tasks_at_every_start_describes_them_and_hears_of_a_failed_run(make_cluster):
    """A framework other than TensorFlow is a Backend (kit.core.backend): here one that gives each task a variable,
    as Horovod's gives its ranks theirs."""
    from kit.core.backend import Backend

    def set_rank(rank):
        import os
        os.environ["MY_RANK"] = str(rank)

    def rank_here():
        import os
        return os.environ["MY_RANK"]

    def fail():
        raise RuntimeError("on purpose")

    class Ranks(Backend):
        no_tf_config = ("these tasks have ranks, not a TF_CONFIG", "see cluster.backend.env")

        def __init__(self):
            self.env, self.configured, self.failed_runs = {}, 0, 0

        def configure(self, group, options, log):
            self.configured += 1
            for rank, name in enumerate(group.names):
                group.engine(name).apply_sync(set_rank, rank)
                self.env[name] = {"MY_RANK": str(rank)}

        def rows(self, tasks):
            return [{"task": t.name, "rank": int(self.env[t.name]["MY_RANK"])} for t in tasks]

        def after_failed_run(self, cluster):
            self.failed_runs += 1

        def reset(self):
            self.env = {}

    ranks = Ranks()
    cluster = make_cluster(workers=2, backend=ranks)
    assert cluster.with_options(stream=False).run(rank_here) == ["0", "1"]
    assert cluster.describe()["rank"].tolist() == [0, 1]
    with pytest.raises(ClusterError, match="these tasks have ranks, not a TF_CONFIG"):
        cluster.tf_configs
    with pytest.raises(WorkerError):
        cluster.with_options(stream=False).run(fail)
    assert ranks.failed_runs == 1
    cluster.restart()
    assert ranks.configured == 2 and cluster.with_options(stream=False).run(rank_here) == ["0", "1"]
    cluster.stop()
    assert ranks.env == {}
