"""Build, parse and validate TF_CONFIG, the JSON that tells each TensorFlow task who it is.

Pure functions, no TensorFlow import: ``kit tfconfig`` answers at once, and a bad TF_CONFIG is
rejected with a :class:`~kit.core.errors.TFConfigError` naming the field and the fix *before* a worker
waits minutes for peers that can never appear.

A TF_CONFIG looks like::

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]},
     "task": {"type": "worker", "index": 1}}
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Iterable, Mapping

from .errors import TFConfigError

#: Task types TensorFlow knows, in the order the kit lists tasks.
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
#: Top-level keys TensorFlow reads from TF_CONFIG besides ``cluster`` and ``task``.
OPTIONAL_KEYS = ("environment", "rpc_layer", "session_master")
#: The strategies ``validate(..., strategy=...)`` checks a cluster for, by each accepted spelling.
CHECKED_STRATEGIES = {
    "multi_worker_mirrored": "multi_worker_mirrored",
    "MultiWorkerMirroredStrategy": "multi_worker_mirrored",
    "parameter_server": "parameter_server",
    "ParameterServerStrategy": "parameter_server",
}
_SINGLETON_TYPES = ("chief", "evaluator")


#: The environment variable the kit sets on each engine it starts: the engine's task name, e.g. ``worker:1``.
TASK_VARIABLE = "KIT_TASK"
#: The key of a task's progress in ipyparallel's data messages (sent by kit.train.progress, shown by kit.core.view).
PROGRESS_KEY = "kit_progress"


def this_task() -> str:
    """This process's task name (``worker:1``, from ``KIT_TASK``), or ``local`` outside a kit cluster."""
    return os.environ.get(TASK_VARIABLE) or "local"


def task_name(task_type: str, index: int) -> str:
    """The kit's name for a task, e.g. ``worker:1`` (used in logs, errors and ``cluster.run``)."""
    return f"{task_type}:{index}"


def parse_task(name: str) -> tuple[str, int]:
    """Parse ``"worker:1"`` into ``("worker", 1)``; ``"chief"`` and ``"evaluator"`` mean index 0."""
    text = str(name).strip()
    task_type, sep, index_text = text.partition(":")
    if task_type not in TASK_TYPES:
        raise TFConfigError("task.type", f"unknown task type {task_type!r} in {text!r}",
                            f"use one of {', '.join(TASK_TYPES)}, e.g. 'worker:1'")
    if not sep:
        if task_type in _SINGLETON_TYPES:
            return task_type, 0
        raise TFConfigError("task.index", f"{text!r} has no index",
                            f"write '{task_type}:0' (type, colon, index)")
    try:
        index = int(index_text)
    except ValueError:
        raise TFConfigError("task.index", f"index {index_text!r} in {text!r} is not an integer",
                            f"write e.g. '{task_type}:0'") from None
    if index < 0:
        raise TFConfigError("task.index", f"index {index} in {text!r} is negative",
                            "task indices start at 0")
    return task_type, index


def parse_address(address: Any, field: str = "cluster") -> tuple[str, int]:
    """Split ``host:port`` (or ``[ipv6]:port``) and check the port; raise naming ``field``."""
    if not isinstance(address, str):
        raise TFConfigError(field, f"address {address!r} is a {type(address).__name__}, not a string",
                            "write each address as a 'host:port' string")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text:
        raise TFConfigError(field, f"address {address!r} is not 'host:port'",
                            "write e.g. 'localhost:12345' or '10.0.0.2:2222'")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise TFConfigError(field, f"address {address!r} has a malformed host",
                            "write IPv6 hosts in brackets, e.g. '[::1]:2222'")
    if any(c.isspace() for c in host):
        raise TFConfigError(field, f"address {address!r} has white space in its host",
                            "remove the spaces")
    if not port_text.isdigit():
        raise TFConfigError(field, f"port {port_text!r} of {address!r} is not a number",
                            "write a port number from 1 to 65535 after the colon")
    port = int(port_text)
    if port == 0:
        raise TFConfigError(field, f"port 0 in {address!r} means 'any free port' to a socket, "
                            "but every task must know the others' ports in advance",
                            "pick a fixed free port, e.g. with kit.core.tfconfig.free_port()")
    if not 1 <= port <= 65535:
        raise TFConfigError(field, f"port {port} of {address!r} is outside 1-65535",
                            "use a port number from 1 to 65535 (above 1024 needs no privileges)")
    return host, port


def _check_cluster(cluster: Any) -> dict[str, list[str]]:
    if not isinstance(cluster, Mapping):
        raise TFConfigError("cluster", f"is a {type(cluster).__name__}, not an object",
                            'write e.g. {"worker": ["localhost:12345", "localhost:23456"]}')
    if not cluster:
        raise TFConfigError("cluster", "is empty", "list at least one worker address")
    seen: dict[str, str] = {}
    result: dict[str, list[str]] = {}
    for task_type, addresses in cluster.items():
        field = f"cluster.{task_type}"
        if task_type not in TASK_TYPES:
            raise TFConfigError(field, f"unknown task type {task_type!r}",
                                f"use only {', '.join(TASK_TYPES)}")
        if isinstance(addresses, str) or not isinstance(addresses, (list, tuple)):
            raise TFConfigError(field, f"is a {type(addresses).__name__}, not a list of addresses",
                                f'write e.g. "{task_type}": ["localhost:12345"]')
        if not addresses:
            raise TFConfigError(field, "is an empty list", f"list the {task_type} addresses or "
                                f"leave out the {task_type!r} key")
        if task_type in _SINGLETON_TYPES and len(addresses) > 1:
            raise TFConfigError(field, f"has {len(addresses)} addresses; there can be only one "
                                f"{task_type}", f"keep one {task_type} and make the others workers")
        for i, address in enumerate(addresses):
            parse_address(address, f"{field}[{i}]")
            if address in seen:
                raise TFConfigError(f"{field}[{i}]", f"address {address!r} is also used by "
                                    f"{seen[address]}", "give every task its own host:port")
            seen[address] = task_name(task_type, i)
        result[task_type] = list(addresses)
    return result


def _check_task(task: Any, cluster: Mapping[str, list[str]]) -> dict[str, Any]:
    if not isinstance(task, Mapping):
        raise TFConfigError("task", f"is a {type(task).__name__}, not an object",
                            'write e.g. {"type": "worker", "index": 0}')
    for key in ("type", "index"):
        if key not in task:
            raise TFConfigError(f"task.{key}", "is missing", 'write e.g. {"type": "worker", "index": 0}')
    task_type, index = task["type"], task["index"]
    if task_type not in TASK_TYPES:
        raise TFConfigError("task.type", f"unknown task type {task_type!r}",
                            f"use one of {', '.join(TASK_TYPES)}")
    if task_type not in cluster and task_type != "evaluator":
        raise TFConfigError("task.type", f"{task_type!r} has no addresses in 'cluster' "
                            f"(it has {', '.join(cluster)})",
                            f"add a {task_type!r} list to 'cluster' or pick a task type it has")
    if isinstance(index, bool) or not isinstance(index, int):
        raise TFConfigError("task.index", f"{index!r} is a {type(index).__name__}, not an integer",
                            'write the index as a JSON number, e.g. "index": 0')
    if index < 0:
        raise TFConfigError("task.index", f"{index} is negative", "task indices start at 0")
    count = len(cluster.get(task_type, [])) or 1  # an evaluator outside 'cluster' is index 0
    if index >= count:
        raise TFConfigError("task.index", f"{index} is out of range: 'cluster' has {count} "
                            f"{task_type} address(es), so the index must be below {count}",
                            f"use an index from 0 to {count - 1} or add addresses")
    return {"type": task_type, "index": index}


def check_strategy(cluster: Mapping[str, list[str]], strategy: str | None) -> None:
    """Check that ``cluster`` has the tasks ``strategy`` needs (``None`` checks nothing)."""
    if strategy is None:
        return
    if strategy not in CHECKED_STRATEGIES:
        raise TFConfigError("strategy", f"unknown strategy {strategy!r}",
                            f"use one of {', '.join(sorted(set(CHECKED_STRATEGIES.values())))}")
    kind = CHECKED_STRATEGIES[strategy]
    if kind == "multi_worker_mirrored":
        if "ps" in cluster:
            raise TFConfigError("cluster.ps", "MultiWorkerMirroredStrategy has no parameter servers",
                                "remove the 'ps' tasks, or use ParameterServerStrategy")
        if not cluster.get("worker") and not cluster.get("chief"):
            raise TFConfigError("cluster.worker", "MultiWorkerMirroredStrategy needs workers",
                                "add a 'worker' list")
    else:
        missing = [t for t in ("chief", "worker", "ps") if not cluster.get(t)]
        if missing:
            raise TFConfigError(f"cluster.{missing[0]}", "ParameterServerStrategy needs a chief "
                                f"(the coordinator), workers and ps tasks; missing: {', '.join(missing)}",
                                "e.g. TFCluster(chief=True, workers=2, ps=1)")


def validate(tf_config: Any, strategy: str | None = None) -> dict[str, Any]:
    """Validate a TF_CONFIG (dict or JSON text) and return it normalized as a dict.

    ``strategy`` ("multi_worker_mirrored" or "parameter_server") adds that strategy's checks.
    """
    if isinstance(tf_config, (str, bytes)):
        return loads(tf_config, strategy=strategy)
    if not isinstance(tf_config, Mapping):
        raise TFConfigError("TF_CONFIG", f"is a {type(tf_config).__name__}, not an object",
                            'write {"cluster": {...}, "task": {...}}')
    for key in ("cluster", "task"):
        if key not in tf_config:
            raise TFConfigError(key, "is missing",
                                'write {"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 0}}')
    unknown = [k for k in tf_config if k not in ("cluster", "task", *OPTIONAL_KEYS)]
    if unknown:
        raise TFConfigError(unknown[0], "is not a TF_CONFIG key",
                            f"use only cluster, task, {', '.join(OPTIONAL_KEYS)} (check the spelling)")
    cluster = _check_cluster(tf_config["cluster"])
    task = _check_task(tf_config["task"], cluster)
    check_strategy(cluster, strategy)
    result = {"cluster": cluster, "task": task}
    result.update({k: tf_config[k] for k in OPTIONAL_KEYS if k in tf_config})
    return result


def loads(text: str | bytes, strategy: str | None = None) -> dict[str, Any]:
    """Parse TF_CONFIG JSON text and validate it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise TFConfigError("TF_CONFIG", f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})",
                            "check quotes (JSON needs double quotes), commas and brackets") from None
    return validate(value, strategy=strategy)


def dumps(tf_config: Mapping[str, Any]) -> str:
    """Serialize a TF_CONFIG compactly, as it goes into the environment."""
    return json.dumps(tf_config, separators=(",", ":"))


def build(cluster: Mapping[str, list[str]], task: str | tuple[str, int],
          strategy: str | None = None) -> dict[str, Any]:
    """The TF_CONFIG of one task: ``build({"worker": [a, b]}, "worker:1")``."""
    task_type, index = parse_task(task) if isinstance(task, str) else task
    return validate({"cluster": dict(cluster), "task": {"type": task_type, "index": index}},
                    strategy=strategy)


def cluster_tasks(cluster: Mapping[str, Iterable[str]]) -> list[str]:
    """Names of every task in ``cluster`` in the kit's order (chief, workers, ps, evaluator)."""
    return [task_name(t, i) for t in TASK_TYPES for i, _ in enumerate(cluster.get(t, []))]


def free_ports(count: int, host: str = "") -> list[int]:
    """``count`` different TCP ports free on this machine right now: bound at once on ``host`` (all interfaces by
    default), then released. Run it where the processes will listen (on an engine, for its private network).

    Free *now*: another process may take one later, so check again just before use.
    """
    sockets = [socket.socket(_family(host), socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "") -> int:
    """One TCP port free on this machine right now (:func:`free_ports`)."""
    return free_ports(1, host)[0]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
