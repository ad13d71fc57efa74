"""JaxCluster: Keras 3 on JAX, one process per ipyparallel engine, as ``keras.distribution`` runs it.

    with kit.JaxCluster(workers=2) as cluster:
        results = cluster.run(train_fn)     # train_fn calls keras.distribution.initialize() first

Keras 3 trains over several processes the way its distribution guide shows: every process is given the
job's addresses (the first is the coordinator's), the number of processes and its own id, and calls
``keras.distribution.initialize()``, which reads them from ``KERAS_DISTRIBUTION_JOB_ADDRESSES``,
``KERAS_DISTRIBUTION_NUM_PROCESSES`` and ``KERAS_DISTRIBUTION_PROCESS_ID`` and calls
``jax.distributed.initialize``. A JaxCluster is a :class:`kit.TFCluster` (same start, run, live view,
kill, restart, stop) whose tasks ``worker:0 … worker:N-1`` are processes 0 … N-1. The ports the kit
picks, opens and checks for TF_CONFIG become the job's addresses (process 0's is where JAX's coordinator
listens), and each engine gets, in place of TF_CONFIG and before JAX or Keras is imported there:
``KERAS_BACKEND=jax``, ``JAX_PLATFORMS=cpu`` and Gloo for JAX's collectives across processes on CPU
(``JAX_CPU_COLLECTIVES_IMPLEMENTATION``).

By default its engines see no TensorFlow, as on a machine where only Keras and JAX are installed: with
TensorFlow installed, ``keras.distribution.initialize()`` imports it (to seed it, through
``keras.utils.set_random_seed``): notebook 12's training then peaked at 1,032-1,116 MiB per process instead of
600 (docs/performance.md, change 25). ``JaxCluster(tensorflow=True)`` lets a function use ``tf.data``, at that cost.

A process that dies closes its sockets, and the others' all-reduce fails at once (Gloo: the connection was closed
or reset by its peer); but a process whose function raises lives on, and the others wait in their all-reduce for a
peer that never joins (jax-ml/jax#38503 reports such a wait without end on GPUs). A failed run names the process that failed first (as for
TensorFlow tasks), and when others were left running (the cluster is stale) the JaxCluster ends every engine;
``restart()`` gives fresh ones.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from . import tfconfig
from .backend import Backend
from .cluster import Phase, TFCluster
from .errors import ClusterError, OptionError, TFConfigError

#: The oldest JAX the kit runs (pyproject.toml's floor for ``jax[cpu]``); the locks pin the newest each Python takes.
JAX_MIN = "0.10.2"
_INSTALL = ("pip install -c locks/py3.X.txt 'jax[cpu]' (the tested version for that Python) into the engines' "
            "Python, the kernel's too")

#: The variables ``keras.distribution.initialize()`` reads.
ADDRESSES, PROCESSES, PROCESS_ID = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                                    "KERAS_DISTRIBUTION_PROCESS_ID")
#: What every process gets besides them: Keras on JAX, JAX on the CPU, and Gloo, without which JAX has no
#: collectives between processes on CPU.
BACKEND = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}


def job_environment(addresses: list[str], process_id: int) -> dict[str, str]:
    """Process ``process_id``'s variables for a job whose processes listen at ``addresses`` (checked)."""
    env = {**BACKEND, ADDRESSES: ",".join(addresses), PROCESSES: str(len(addresses)), PROCESS_ID: str(process_id)}
    check_job_environment(env)
    return env


def check_job_environment(env: dict[str, str]) -> dict[str, Any]:
    """Check one process's variables as ``keras.distribution.initialize()`` and JAX will read them; return
    ``{"addresses", "processes", "process_id", "coordinator"}``. Raises OptionError naming the variable."""
    for name in (ADDRESSES, PROCESSES, PROCESS_ID, *BACKEND):
        if name not in env:
            raise OptionError(name, "is not set", f"set {name} (see kit.core.keras_jax.job_environment)")
    for name, value in BACKEND.items():
        if env[name] != value:
            raise OptionError(name, f"is {env[name]!r}, but a JaxCluster's processes need {value!r}",
                              f"leave {name} out of env= (the kit sets it)")
    addresses = env[ADDRESSES].split(",")
    for address in addresses:
        try:
            tfconfig.parse_address(address, ADDRESSES)
        except TFConfigError as error:
            raise OptionError(ADDRESSES, f"{address!r} is not a host:port address ({error.problem})",
                              "give every process as host:port, process 0's first") from None
    if len(set(addresses)) != len(addresses):
        raise OptionError(ADDRESSES, f"lists an address twice ({env[ADDRESSES]})", "give each process its own port")
    try:
        processes, process_id = int(env[PROCESSES]), int(env[PROCESS_ID])
    except ValueError:
        raise OptionError(PROCESSES, f"{PROCESSES}={env[PROCESSES]!r} and {PROCESS_ID}={env[PROCESS_ID]!r} "
                                     "must be whole numbers", "set them to N and 0..N-1") from None
    if processes != len(addresses):
        raise OptionError(PROCESSES, f"says {processes} processes but {ADDRESSES} lists {len(addresses)}",
                          f"set {PROCESSES} to the number of addresses")
    if not 0 <= process_id < processes:
        raise OptionError(PROCESS_ID, f"is {process_id}, outside 0..{processes - 1}",
                          f"give each process its own id from 0 to {processes - 1}")
    return {"addresses": addresses, "processes": processes, "process_id": process_id,
            "coordinator": addresses[0]}


class Jax(Backend):
    """Keras 3 on JAX's processes (:mod:`kit.core.backend`): at every start and restart, each process's
    ``keras.distribution`` job variables, checked; after a run that failed and left the cluster stale, every
    process still alive is ended: a JAX process waiting in a collective for a peer that failed but lives on would
    go on waiting."""

    no_tf_config = ("a JaxCluster's engines have no TF_CONFIG: Keras finds the other processes through "
                    f"{ADDRESSES}", "see cluster.jax_env")

    def __init__(self, tensorflow: bool) -> None:
        self.tensorflow = tensorflow
        self.env: dict[str, dict[str, str]] = {}  #: each process's variables, by task name

    def reset(self) -> None:
        self.env = {}

    def rows(self, tasks: list) -> list[dict[str, Any]]:
        return [{"task": t.name, "process_id": int(self.env[t.name][PROCESS_ID]), "address": t.address, "pid": t.pid}
                for t in tasks]

    def configure(self, group: Any, options: Any, log: Any) -> None:
        tasks = [group.info(name) for name in group.names]
        from packaging.version import Version

        found = {task.name: group.engine(task.name).apply_sync(jax_version) for task in tasks}
        for name, version in found.items():
            if version is None or Version(version) < Version(JAX_MIN):
                raise ClusterError(f"{name}'s Python has {'JAX ' + version if version else 'no JAX'}, but the kit "
                                   f"needs JAX {JAX_MIN} or later. Fix: {_INSTALL}", [name])
        if len(set(found.values())) > 1:
            raise ClusterError(f"the processes run different JAX releases ({found}): one program over several "
                               f"processes needs the same on each. Fix: {_INSTALL}", sorted(found))
        addresses = [t.address for t in tasks]  # the ports the kit opened and checked, process 0's first
        self.env = {t.name: group.engine(t.name).apply_sync(
            set_jax_environment, job_environment(addresses, i), self.tensorflow) for i, t in enumerate(tasks)}
        log.info("JAX coordinator at %s for %d processes", addresses[0], len(tasks))

    def after_failed_run(self, cluster: Any) -> None:
        if cluster.state.phase is not Phase.STALE:
            return
        group = cluster.task_group(ready=False)
        dead = group.dead(group.names)
        for name in group.names:
            if name not in dead:
                cluster.kill(name, signal.SIGKILL)


class JaxCluster(TFCluster):
    """Keras 3 + JAX processes on ipyparallel engines: ``JaxCluster(workers=2)`` gives processes 0 and 1.

    A :class:`kit.TFCluster` with the :class:`Jax` backend. Options are TFCluster's (:class:`kit.ClusterOptions`),
    less those of TensorFlow's own tasks (``chief``, ``ps``, ``evaluator``, ``keras``, ``preload``), and
    ``tensorflow`` (default False: the engines see no TensorFlow, as where only Keras and JAX are installed).
    ``cluster.jax_env`` has each engine's variables. A function run on the cluster calls
    ``keras.distribution.initialize()`` first, as in a script.
    """

    def __init__(self, workers: int = 2, *, tensorflow: bool = False, **options: Any):
        if not isinstance(tensorflow, bool):
            raise OptionError("tensorflow", f"{tensorflow!r} is not True or False",
                              "tensorflow=True lets your function import TensorFlow (for tf.data)")
        for name in ("chief", "ps", "evaluator"):
            if options.get(name):
                raise OptionError(name, "a JaxCluster has only processes, all alike (process 0 coordinates)",
                                  f"leave {name} out and ask for workers=N, which gives processes 0..N-1")
        for name in ("keras", "preload"):
            if name in options:
                raise OptionError(name, "a JaxCluster's engines run Keras 3 on JAX and never import TensorFlow "
                                        "before your function does", f"leave {name} out")
        super().__init__(workers, backend=Jax(tensorflow), **{**options, "keras": "keras3", "preload": False})

    @property
    def tensorflow(self) -> bool:
        """Whether the engines may import TensorFlow."""
        return self.backend.tensorflow

    @property
    def jax_env(self) -> dict[str, dict[str, str]]:
        """The variables each engine was given, by task name."""
        self._require_started()
        return {name: dict(env) for name, env in self.backend.env.items()}


# ----- run on the engines (by reference: the engines import this module) --------------------------

def jax_version() -> str | None:
    """The installed JAX's version (without importing it), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("jaxlib")  # JAX without its library cannot run
        return version("jax")
    except PackageNotFoundError:
        return None


def set_jax_environment(env: dict[str, str], tensorflow: bool) -> dict[str, str]:
    """Give this engine its job variables in place of TF_CONFIG; return them. Refused once JAX or Keras is
    imported here (they read them at their start). Without ``tensorflow``, an import of TensorFlow here fails
    as where it is not installed (Python's import system treats a module set to None so)."""
    early = [m for m in ("jax", "keras", "tensorflow") if m in sys.modules]
    if early:
        raise RuntimeError(f"already imported on this engine: {', '.join(early)}, so the job's variables would "
                           "come too late; start fresh engines (cluster.restart())")
    os.environ.pop("TF_CONFIG", None)
    os.environ.update(env)
    if not tensorflow:
        sys.modules["tensorflow"] = None  # type: ignore[assignment]
    return {k: os.environ[k] for k in env}
