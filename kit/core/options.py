"""Every TFCluster option and every run option with its default and help text, checked on
construction; and TaskInfo.

Kept apart from :mod:`kit.core.cluster` so that the options (what ``kit demo --help`` lists) are in one
short file.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import ipyparallel as ipp

from .errors import OptionError

KERAS_CHOICES = {"tf-keras": "1", "keras3": "0"}
#: How a local cluster keeps its TensorFlow servers from the network (docs/security.md).
ISOLATION_CHOICES = {
    "auto": "a private network namespace where the system allows one; otherwise start with an "
            "ExposedPortsWarning that names the exposed ports",
    "required": "a private network namespace, or a ClusterError saying why there is none",
    "none": "the host's network: every task's server is reachable from other hosts (warned)",
}
VIEW_CHOICES = {
    "auto": "'widget' in a Jupyter kernel with ipywidgets, else 'text'",
    "widget": "a live table (state, progress, loss, examples/s per task) with each task's log in "
              "a collapsed panel",
    "text": "each task's lines prefixed with its name, and its progress every 10 s (papermill, "
            "nbval, terminals; make test sets KIT_VIEW=text)",
}


def _field(default: Any, help: str, **kwargs: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def check_names(cls: type, given: dict[str, Any], what: str) -> None:
    """Raise OptionError for the first name in ``given`` that is not a field of ``cls``, listing the valid ones."""
    unknown = set(given) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise OptionError(sorted(unknown)[0], f"is not {what}", f"use one of {', '.join(cls.help())}")


@dataclasses.dataclass
class ClusterOptions:
    """Every TFCluster option, with its default and help text (``kit demo --help`` shows them)."""

    workers: int = _field(2, "Number of worker tasks.")
    chief: bool = _field(False, "Add a chief task (ParameterServerStrategy's coordinator, or "
                                "MultiWorkerMirroredStrategy's worker 0 under another name).")
    ps: int = _field(0, "Number of parameter-server tasks (ParameterServerStrategy only).")
    evaluator: bool = _field(False, "Add an evaluator task (outside the training cluster).")
    keras: str = _field("tf-keras", "Keras on the workers: 'tf-keras' (Keras 2, sets "
                        "TF_USE_LEGACY_KERAS=1; works with MultiWorkerMirroredStrategy) or "
                        "'keras3' (TF's default since 2.16; model.fit fails under "
                        "MultiWorkerMirroredStrategy, keras-team/keras#20585).")
    threads: int | None = _field(None, "CPU threads per task (TF intra-op and OpenMP; inter-op gets at "
                                       "least 2); default: usable cores divided by the number of tasks.")
    host: str = _field("127.0.0.1", "Address the TF tasks use to reach each other, for engines "
                                    "started on this machine (a loopback address unless "
                                    "isolation='none').")
    isolation: str = _field(dataclasses.MISSING, "How a local cluster keeps its TensorFlow servers, "
                            "which run any op anyone who connects sends, from the network: " +
                            "; ".join(f"'{k}': {v}" for k, v in ISOLATION_CHOICES.items()) +
                            ". Default: $KIT_ISOLATION, else 'auto'.",
                            default_factory=lambda: os.environ.get("KIT_ISOLATION", "auto"))
    tf_logs: str = _field("quiet", "TensorFlow's log lines in each task's output: 'quiet' hides its C++ "
                                   "start-up lines (oneDNN, CUDA drivers, CPU features; they stay in "
                                   "cluster.output) and sets TF_CPP_MIN_LOG_LEVEL=2 (C++ warnings and errors "
                                   "only); 'all' shows everything.")
    view: str = _field(dataclasses.MISSING, "How cluster.run shows the tasks: " +
                       "; ".join(f"'{k}': {v}" for k, v in VIEW_CHOICES.items()) +
                       ". Default: $KIT_VIEW, else 'auto'.",
                       default_factory=lambda: os.environ.get("KIT_VIEW", "auto"))
    preload: bool = _field(True, "Local engines start with TensorFlow imported: one process imports it and "
                                 "forks every engine, which shares those pages (about half the memory of "
                                 "engines that import it each; docs/performance.md, change 24), and the first "
                                 "training step comes sooner. A task behind its own link=, or the one task of a "
                                 "one-task cluster, imports it in the background as it starts. TF_CONFIG still "
                                 "takes effect: TensorFlow reads it when a strategy is built. False: TensorFlow is "
                                 "imported when the function you run imports it (nothing for a task that never "
                                 "runs TensorFlow). Engines from elsewhere, and engines with tf_logs='all' (whose "
                                 "start-up lines then show in the run that imports TensorFlow), are never preloaded.")
    start_timeout: float = _field(60.0, "Seconds to wait for every engine to register and "
                                        "report its TF_CONFIG before giving up.")
    env: dict = _field(None, "Extra environment variables for every task, e.g. "
                             "{'TF_ENABLE_ONEDNN_OPTS': '0'}.")
    link: Any = _field(None, "Emulate a network link between hosts (root only): each task in a network "
                             "namespace of its own, joined through a bridge by a veth link shaped with tc, "
                             "e.g. '100mbit', '1gbit 2ms' (a delay needs the kernel's netem) or "
                             "kit.Link(100e6); None: the tasks share the cluster's loopback "
                             "(kit.core.links, notebook 10).")
    engines: Any = _field(None, "Use engines from elsewhere instead of starting local ones: an "
                                "ipyparallel.Cluster (its launcher starts one engine set per task, "
                                "or its running engines are used), an ipyparallel.Client, or the "
                                "path of an ipcontroller-client.json. Each task is reached at the "
                                "address its engine uses to reach the controller.")

    def __post_init__(self) -> None:
        for name in ("workers", "ps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise OptionError(name, f"{value!r} is not a whole number >= 0", f"e.g. {name}=2")
        for name in ("chief", "evaluator"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, f"{getattr(self, name)!r} is not True or False",
                                  f"{name}=True adds one {name} task")
        if self.workers == 0 and not self.chief:
            raise OptionError("workers", "the cluster has no worker and no chief",
                              "ask for workers=1 or more (or chief=True)")
        if self.keras not in KERAS_CHOICES:
            raise OptionError("keras", f"{self.keras!r} is not a known Keras choice",
                              f"use one of {', '.join(KERAS_CHOICES)}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise OptionError("threads", f"{self.threads!r} is not a whole number >= 1",
                              "leave it None to divide the cores among the tasks")
        if not isinstance(self.preload, bool):
            raise OptionError("preload", f"{self.preload!r} is not True or False",
                              "preload=False imports TensorFlow only when your function does")
        if not (isinstance(self.start_timeout, (int, float)) and self.start_timeout > 0):
            raise OptionError("start_timeout", f"{self.start_timeout!r} is not a positive number",
                              "give seconds, e.g. start_timeout=60")
        if self.tf_logs not in ("quiet", "all"):
            raise OptionError("tf_logs", f"{self.tf_logs!r} is neither 'quiet' nor 'all'",
                              "tf_logs='all' shows TensorFlow's start-up lines; 'quiet' (the default) hides them")
        if self.view not in VIEW_CHOICES:
            raise OptionError("view", f"{self.view!r} is not a known choice (from the argument or "
                              "$KIT_VIEW)", f"use one of {', '.join(VIEW_CHOICES)}")
        if self.isolation not in ISOLATION_CHOICES:
            raise OptionError("isolation", f"{self.isolation!r} is not a known choice (from the "
                              "argument or $KIT_ISOLATION)", f"use one of {', '.join(ISOLATION_CHOICES)}")
        if self.isolation != "none" and self.engines is None and not _is_loopback(self.host):
            raise OptionError("host", f"{self.host!r} is not a loopback address, but the tasks of a "
                              "local cluster live in a private network that has only loopback",
                              "leave host at 127.0.0.1, or pass isolation='none' to put the tasks "
                              "on the host's network (reachable from other hosts)")
        if self.isolation == "required" and self.engines is not None:
            raise OptionError("isolation", "engines from elsewhere must reach each other over the "
                              "network, so they cannot be isolated by the kit",
                              "protect them with a private network, firewall rules or SSH tunnels "
                              "(README, Security), and leave isolation at 'auto'")
        if self.link is not None:
            from .links import Link

            self.link = Link.parse(self.link)
            if self.engines is not None:
                raise OptionError("link", "emulated links are made on this machine, for the engines the kit "
                                  "starts", "leave link=None with engines from elsewhere (their real network "
                                  "is the link)")
            if self.isolation == "none":
                raise OptionError("link", "emulated links put every task in a network namespace of its own, "
                                  "which isolation='none' refuses", "leave isolation at 'auto' or 'required'")
        self.env = {str(k): str(v) for k, v in (self.env or {}).items()}
        if self.engines is not None and not isinstance(self.engines, (ipp.Cluster, ipp.Client, str, os.PathLike)):
            raise OptionError("engines", f"{type(self.engines).__name__} is not a source of engines",
                              "pass an ipyparallel.Cluster, an ipyparallel.Client or the path of "
                              "an ipcontroller-client.json")

    @classmethod
    def help(cls) -> dict[str, str]:
        """Option name → help text."""
        return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}

    def cluster_layout(self) -> dict[str, int]:
        """How many tasks of each type the cluster has."""
        layout = {"chief": int(self.chief), "worker": self.workers, "ps": self.ps,
                  "evaluator": int(self.evaluator)}
        return {t: n for t, n in layout.items() if n}


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How ``cluster.run`` runs a function: ``cluster.with_options(timeout=60, max_failures=1).run(fn, ...)``.

    Every keyword of ``run`` itself goes to the function; these options go through ``with_options``.
    """

    tasks: tuple | None = _field(None, "Run on these tasks only (names like 'worker:1'); default: every task.")
    timeout: float | None = _field(None, "Seconds the run may take; after that ClusterError names the tasks "
                                         "still running (and cluster.restart() is needed). Default: no bound.")
    stream: bool = _field(True, "Show each task's output as it comes, prefixed with its name (or in the "
                                "widget's log panels); False shows the table alone. Every line stays in "
                                "cluster.output either way.")
    max_failures: int = _field(0, "Supervise the run: when a task dies, raises or times out, replace every "
                                  "engine (cluster.restart()) and call the function again, up to this many "
                                  "times; then FailuresExhaustedError lists every failure. The function must "
                                  "resume by itself (e.g. Keras's BackupAndRestore). 0: no supervision.")
    on_restart: Callable | None = _field(None, "Called as on_restart(cluster) after each supervised restart, "
                                               "before the function again (e.g. to start "
                                               "ParameterServerStrategy's servers).")

    def __post_init__(self) -> None:
        if self.tasks is not None:
            if isinstance(self.tasks, str) or not all(isinstance(t, str) for t in self.tasks):
                raise OptionError("tasks", f"{self.tasks!r} is not a list of task names",
                                  "e.g. tasks=['worker:0'] (a list, even for one task)")
            object.__setattr__(self, "tasks", tuple(self.tasks))
        if self.timeout is not None and (isinstance(self.timeout, bool) or
                                         not isinstance(self.timeout, (int, float)) or self.timeout <= 0):
            raise OptionError("timeout", f"{self.timeout!r} is not a positive number of seconds",
                              "e.g. timeout=120, or None for no bound")
        if not isinstance(self.stream, bool):
            raise OptionError("stream", f"{self.stream!r} is not True or False",
                              "stream=False shows the table alone")
        if isinstance(self.max_failures, bool) or not isinstance(self.max_failures, int) or self.max_failures < 0:
            raise OptionError("max_failures", f"{self.max_failures!r} is not a whole number >= 0",
                              "e.g. max_failures=2 restarts the cluster at most twice")
        if self.on_restart is not None and not callable(self.on_restart):
            raise OptionError("on_restart", f"{self.on_restart!r} is not callable",
                              "pass a function that takes the cluster, e.g. on_restart=start_servers")

    @classmethod
    def help(cls) -> dict[str, str]:
        """Option name → help text."""
        return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}

    def updated(self, **changes: Any) -> "RunOptions":
        """These options with ``changes``; an unknown name raises OptionError listing the valid ones."""
        check_names(RunOptions, changes, "a run option")
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """One TF task of a running cluster, as its engine reported it."""

    name: str       #: e.g. "worker:1"
    type: str       #: chief, worker, ps or evaluator
    index: int
    address: str    #: host:port the other tasks reach it at ("" for the evaluator)
    engine_id: int  #: ipyparallel engine id
    pid: int
    host: str       #: hostname of the engine's machine
    keras: str      #: "tf-keras" or "keras3", as set in the engine's environment
    #: where its TensorFlow server listens, and who can reach it ("" for the evaluator: no server)
    listens_on: str = ""
    #: every host:port its server can be reached at from elsewhere: each address of its host's interfaces but
    #: loopback (the server binds them all); none in a local cluster's private network, none for the evaluator
    reachable_at: tuple[str, ...] = ()


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def engine_set_id(name: str) -> str:
    return name.replace(":", "-")
