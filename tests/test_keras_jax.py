"""Keras 3 on JAX: the job variables a JaxCluster gives its processes (checked like TF_CONFIG), its refusals, and
notebook 12's lesson exported as main.py and run as a job runs it (plain processes, each with its variables)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from contextlib import ExitStack

import numpy as np
import psutil
import pytest

import kit
from kit.core import keras_jax, nojax
from kit.core.errors import OptionError
from kit.core.tfconfig import free_port

from take_home import MNIST, Tasks, export, tf_configs

LESSON = "12-keras3-jax"
ARGS = ["--mnist-path", MNIST, "--seed", "1", "--epochs", "2", "--train-examples", "1024", "--global-batch", "128"]


def test_each_process_gets_the_job_addresses_their_number_and_its_own_id():
    env = keras_jax.job_environment(["10.0.0.1:7000", "10.0.0.2:7001"], 1)
    assert env == {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
                   "KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:7000,10.0.0.2:7001",
                   "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "1"}, env
    checked = keras_jax.check_job_environment(env)
    assert checked["coordinator"] == "10.0.0.1:7000" and checked["process_id"] == 1, checked


@pytest.mark.parametrize("change, field, words", [
    ({"KERAS_DISTRIBUTION_PROCESS_ID": "2"}, "KERAS_DISTRIBUTION_PROCESS_ID", "outside 0..1"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "3"}, "KERAS_DISTRIBUTION_NUM_PROCESSES", "lists 2"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:7000,10.0.0.1:7000"}, "KERAS_DISTRIBUTION_JOB_ADDRESSES", "twice"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1,10.0.0.2:7001"}, "KERAS_DISTRIBUTION_JOB_ADDRESSES", "port"),
    ({"KERAS_BACKEND": "tensorflow"}, "KERAS_BACKEND", "'jax'"),
    ({"KERAS_DISTRIBUTION_PROCESS_ID": None}, "KERAS_DISTRIBUTION_PROCESS_ID", "not set"),
])
def test_a_bad_job_variable_is_named_with_its_fix(change, field, words):
    env = keras_jax.job_environment(["10.0.0.1:7000", "10.0.0.2:7001"], 0)
    env.update({k: v for k, v in change.items() if v is not None})
    for key in [k for k, v in change.items() if v is None]:
        del env[key]
    with pytest.raises(OptionError) as raised:
        keras_jax.check_job_environment(env)
    assert raised.value.field == field and words in str(raised.value) and "Fix:" in str(raised.value), raised.value


@pytest.mark.parametrize("options, field", [({"chief": True}, "chief"), ({"ps": 1}, "ps"),
                                            ({"keras": "keras3"}, "keras"), ({"preload": True}, "preload"),
                                            ({"tensorflow": "yes"}, "tensorflow")])
def test_a_jax_cluster_refuses_what_its_processes_cannot_be(options, field):
    with pytest.raises(OptionError) as raised:
        kit.JaxCluster(workers=2, **options)
    assert raised.value.field == field, raised.value


def test_a_jax_cluster_is_shown_by_its_own_name():
    cluster = kit.JaxCluster(workers=2)
    assert repr(cluster) == "<JaxCluster worker:0, worker:1 (stopped)>", repr(cluster)
    assert cluster._repr_html_().startswith("<b>JaxCluster</b>"), cluster._repr_html_()


def test_an_engine_refuses_the_variables_once_jax_is_imported(monkeypatch):
    for name in ("jax", "keras", "tensorflow"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "jax", object())
    with pytest.raises(RuntimeError, match="already imported on this engine: jax, so"):
        keras_jax.set_jax_environment(keras_jax.job_environment(["127.0.0.1:7000"], 0), tensorflow=False)


def test_the_exported_lesson_imports_no_kit_and_sets_keras_on_jax(tmp_path):
    script = export(LESSON, tmp_path)
    text = script.read_text()
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "kit" not in imported, f"expected main.py to import no kit, it imports {sorted(imported)}"
    assert 'os.environ.setdefault("KERAS_BACKEND", "jax")' in text and "TF_USE_LEGACY_KERAS" not in text, text[:2000]


@pytest.mark.slow  # three plain processes of Keras on JAX (~40 s on 2 cores)
@pytest.mark.check  # the take-home script beside the notebook
def test_the_exported_script_as_two_processes_trains_as_one_process_with_the_global_batch(tmp_path):
    """Two ``python main.py`` processes, each with its KERAS_DISTRIBUTION_* variables (no kit): the same losses on
    both, and the losses of one process that takes the whole global batch."""
    script = export(LESSON, tmp_path)
    env = {"JAX_PLATFORMS": "cpu"}
    one = _job(script, tmp_path / "one", 1, env)
    two = _job(script, tmp_path / "two", 2, env)
    print("losses: one process", one[0]["loss"], "two", [r["loss"] for r in two])
    assert two[0]["loss"] == two[1]["loss"], f"expected both processes to log the same losses, measured {two}"
    # the all-reduce adds the two halves in another order than one process adds the batch: float32 rounding only
    np.testing.assert_allclose(two[0]["loss"], one[0]["loss"], rtol=1e-4,
                               err_msg="expected two processes to train as one process with the global batch")
    assert one[0]["loss"][1] < one[0]["loss"][0], f"expected the loss to fall over 2 epochs, measured {one}"


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie has ended (its parent, the kit's zygote, reaps it a moment later)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _job(script, folder, processes: int, env: dict, extra: list[str] = ()) -> list:
    """Run ``script`` as a job of ``processes`` processes (each its own id, process 0 the coordinator), with ``ARGS``
    and ``extra``."""
    folder.mkdir()
    (main := folder / "main.py").write_text(script.read_text())
    addresses = ",".join(f"127.0.0.1:{free_port('127.0.0.1')}" for _ in range(processes))
    configs = tf_configs({"worker": processes})
    with ExitStack() as stack:
        jobs = [stack.enter_context(Tasks(main, [configs[i]], [*ARGS, *extra], {
            **env, "KERAS_DISTRIBUTION_JOB_ADDRESSES": addresses, "KERAS_DISTRIBUTION_NUM_PROCESSES": str(processes),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(i)})) for i in range(processes)]
        return [job.wait(timeout=300)[0] for job in jobs]


@pytest.mark.slow  # a 2-process JaxCluster: ~20 s
def test_a_process_that_raises_is_named_and_the_one_waiting_in_a_collective_is_ended(no_leaks):
    """Process 1 raises, alive; process 0 waits in an all-gather that JAX never times out. The run (through
    with_options, as through run) names worker:1 and ends both engines, instead of waiting."""
    def one_raises():  # defined here, so that it travels by value
        import keras
        import numpy as np
        keras.distribution.initialize()
        import jax
        from jax.experimental import multihost_utils
        if jax.process_index() == 1:
            raise RuntimeError("process 1 gave up")
        multihost_utils.process_allgather(np.ones(4))  # waits for process 1, which never comes
        multihost_utils.process_allgather(np.ones(4))

    with kit.JaxCluster(workers=2) as cluster:
        pids = [t.pid for t in cluster.tasks]
        with pytest.raises(kit.WorkerError) as raised:
            cluster.with_options(stream=False, timeout=120).run(one_raises)
        assert raised.value.task == "worker:1" and "process 1 gave up" in raised.value.failures["worker:1"], \
            raised.value
        assert "still running" in cluster.state.reason, cluster.state
        left = [pid for pid in pids if running(pid)]
        assert not left, f"expected both engines ended after the failed run, still running: {left}"
        cluster.restart()
        assert len(set(cluster.with_options(stream=False).run(os.getpid))) == 2, "expected fresh engines"


@pytest.mark.slow  # a TensorFlow import in a fresh process: ~5-8 s
def test_the_kits_tensorflow_import_leaves_jax_out_and_importable():
    """The zygote's import of TensorFlow does not import JAX: Keras 3 would, at the import of its callbacks (106
    MiB per process); and the engine's code can import JAX after it."""
    code = ("import sys; from kit.core import _remote, nojax; nojax.install(); _remote.import_tensorflow_and_keras(); "
            "import tensorflow as tf; tf.keras.callbacks; print('jax' in sys.modules); import jax; print(jax.__version__)")
    env = {name: value for name, value in os.environ.items() if name != "TF_USE_LEGACY_KERAS"}  # Keras 3
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0 and done.stdout.split() == ["False", keras_jax.jax_version()], \
        f"expected TensorFlow and Keras 3 imported without JAX, then JAX {keras_jax.jax_version()} importable, " \
        f"measured: {done.stdout}{done.stderr[-2000:]}"


@pytest.mark.slow  # a TensorFlow import in a fresh process: ~5-8 s
def test_a_process_started_with_the_kits_environment_imports_tensorflow_without_jax_and_its_sitecustomize(tmp_path):
    """A command the kit runs (kit.launch, horovodrun's ranks) gets kit.core.nojax's folder in front of PYTHONPATH: its
    `import tensorflow` with tf-keras leaves JAX out, its own `import jax` works, and a sitecustomize the
    environment already had still runs. No installed file is changed (tests/test_packaging.py)."""
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_RAN = True\n")
    code = "import builtins, sys, tensorflow, tf_keras; print('jax' in sys.modules, builtins.SITE_RAN); import jax"
    env = nojax.environ({**os.environ, "PYTHONPATH": str(tmp_path), "TF_USE_LEGACY_KERAS": "1",
                         "TF_CPP_MIN_LOG_LEVEL": "3"})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["False", "True"], \
        f"expected TensorFlow without JAX, then JAX importable, and the old sitecustomize run: {done.stdout}" \
        f"{done.stderr[-2000:]}"
    plain = subprocess.run([sys.executable, "-c", "import sys, tensorflow; print('jax' in sys.modules)"],
                           capture_output=True, text=True, timeout=180, env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert plain.stdout.split() == ["True"], "TensorFlow no longer imports JAX by itself: kit.core.nojax can go " \
        f"(and docs/upstream/tensorflow-jax-on-use.md): {plain.stdout}{plain.stderr[-1000:]}"


@pytest.mark.slow  # two 2-process jobs of Keras on JAX: ~40 s
@pytest.mark.check  # the take-home script beside the notebook
def test_the_exported_script_reaches_model_parallel_from_its_command_line(tmp_path):
    """`python main.py --parallel model` trains step 4's ModelParallel: the hidden kernel split over the processes."""
    script = export(LESSON, tmp_path)
    folder = tmp_path / "model"
    results = _job(script, folder, 2, {"JAX_PLATFORMS": "cpu"}, ["--parallel", "model", "--epochs", "1"])
    assert [r["layout"] for r in results] == ["P(None, 'model')"] * 2, results
    assert results[0]["this process"] != results[0]["whole"], f"expected each process to hold part of it: {results}"
