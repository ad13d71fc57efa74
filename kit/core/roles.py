"""Roles: how a TFCluster gives each engine its TF task, one way for every kind of engines.

For each task, on the engine the :class:`kit.core.engines.Engines` object assigned it: check the engine
(TensorFlow not imported yet, tf_keras there if asked for), pick a port on the engine's own host (or
network namespace), listen on it there (a port taken meanwhile is picked again), check that every task
reaches every other, then set the task's environment, TF_CONFIG included, before TensorFlow is imported,
and check what the engine reports back. The functions run in the kernel; they call
:mod:`kit.core._remote` on the engines.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import ipyparallel as ipp

from . import _remote, limits, tfconfig
from .errors import ClusterError
from .options import KERAS_CHOICES, ClusterOptions, TaskInfo

#: How often a port taken since it was picked is picked again before start-up gives up.
PORT_TRIES = 3
#: The longest one start-up round (a call on every engine at once) may take, in seconds: an engine
#: importing TensorFlow in the background answers within a second or two (docs/performance.md, change 17).
ROUND_TIMEOUT = 60.0


def check_engines(reports: dict[str, dict], keras: str) -> None:
    """Refuse engines whose TF_CONFIG could not take effect, or that lack the Keras asked for."""
    used = [n for n, r in reports.items() if r["tensorflow_imported"] and not r["tensorflow_preloaded"]]
    if used:
        raise ClusterError(f"the engines of {', '.join(used)} imported TensorFlow before TF_CONFIG was set, "
                           "so it cannot take effect. Fix: remove TensorFlow from the engines' start-up "
                           "(a sitecustomize or startup file), or restart those engines", used)
    if keras == "tf-keras":
        lacking = [n for n, r in reports.items() if not r["has_tf_keras"]]
        if lacking:
            raise ClusterError(f"{', '.join(lacking)} has no tf_keras package, which keras='tf-keras' needs",
                               lacking, fix="pip install tf-keras (same minor version as tensorflow)")


def on_each(client: ipp.Client, engine_ids: dict[str, int], fn: Callable, args: dict[str, tuple] | None = None,
            timeout: float | None = None) -> dict[str, Any]:
    """``fn(*args[name])`` on every task's engine at once; the results by task name.

    One round trip for all tasks instead of one per task: while a local engine imports TensorFlow in the
    background (``ClusterOptions.preload``) each round trip waits for the engine's turn at the GIL, so the
    rounds, not the tasks, are what start-up pays for (docs/performance.md, change 17).
    """
    timeout = ROUND_TIMEOUT if timeout is None else timeout
    args = args or {}
    pending = {name: client[engine_id].apply_async(fn, *args.get(name, ())) for name, engine_id in engine_ids.items()}
    deadline = time.monotonic() + timeout
    results, late = {}, []
    for name, result in pending.items():
        try:
            results[name] = result.get(timeout=max(0.0, deadline - time.monotonic()))
        except ipp.error.TimeoutError:
            late.append(name)
    if late:
        raise ClusterError(f"{', '.join(late)} did not answer {getattr(fn, '__name__', fn)} within {timeout:g}s "
                           "during start-up", late,
                           fix="see the task's engine log (a busy or stopped engine), then start the cluster again")
    return results


def _ids(reports: dict[str, dict], names=None) -> dict[str, int]:
    return {n: reports[n]["engine_id"] for n in (reports if names is None else names)}


def pick_ports(client: ipp.Client, reports: dict[str, dict], host_of: Callable[[dict], str]) -> dict[str, int]:
    """A free port for each training task, picked on its own engine, none twice on one host."""
    servers = [n for n in reports if not n.startswith("evaluator")]  # the evaluator runs no server
    picked = on_each(client, _ids(reports, servers), tfconfig.free_port)
    ports: dict[str, int] = {}
    taken: set[tuple[str, int]] = set()
    for name in servers:
        host, port = host_of(reports[name]), picked[name]
        while (host, port) in taken:  # two tasks of one host drew the same port: draw again
            port = client[reports[name]["engine_id"]].apply_sync(tfconfig.free_port)
        taken.add((host, port))
        ports[name] = port
    return ports


def open_ports(client: ipp.Client, reports: dict[str, dict], ports: dict[str, int], hosts: dict[str, str],
               log: logging.Logger) -> dict[str, int]:
    """Listen on each task's port on its engine (the proof that it is free there, until
    :func:`set_environments` closes it); a port taken since it was picked is picked again."""
    ports, pending = dict(ports), list(ports)
    for _ in range(PORT_TRIES):
        opened = on_each(client, _ids(reports, pending), _remote.open_probe, {n: (ports[n],) for n in pending})
        taken = [n for n in pending if not opened[n]]
        if not taken:
            return ports
        log.warning("ports taken since they were picked: %s; picking new ones", taken)
        used = {(hosts[n], p) for n, p in ports.items()}
        for name in taken:
            port = ports[name]
            while (hosts[name], port) in used:
                port = client[reports[name]["engine_id"]].apply_sync(tfconfig.free_port)
            used.add((hosts[name], port))
            ports[name] = port
        pending = taken
    _close_probes(client, reports)
    raise ClusterError(f"could not find free ports for {', '.join(taken)} in {PORT_TRIES} tries", taken,
                       fix="something on those hosts is taking ports as fast as they are picked: stop it, "
                           "or start the cluster again")


def check_reachability(client: ipp.Client, reports: dict[str, dict], configs: dict[str, dict]) -> None:
    """Every task connects to every training task's address (open: :func:`open_ports`). The listening
    probes stay open for :func:`set_environments`, which closes them, unless a task cannot reach another."""
    addresses = {n: address(configs[n]) for n in reports if address(configs[n])}
    try:
        failed = on_each(client, _ids(reports), _remote.probe,
                         {name: ({n: a for n, a in addresses.items() if n != name},) for name in reports})
    except BaseException:
        _close_probes(client, reports)
        raise
    problems = [(name, target, reason) for name in reports for target, reason in failed[name].items()]
    if problems:
        _close_probes(client, reports)
        lines = "; ".join(f"{src} cannot reach {dst} at {why}" for src, dst, why in problems)
        raise ClusterError(f"{lines}. Fix: let the engines' hosts reach each other on these "
                           "addresses (routes, firewall), or start the engines on hosts that can",
                           sorted({p[0] for p in problems}))


def set_environments(client: ipp.Client, reports: dict[str, dict], envs: dict[str, dict[str, str]],
                     configs: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """Set every task's environment and TF_CONFIG on its engine (closing its port probe first); return
    each engine's new report, checked."""
    now = on_each(client, _ids(reports), _remote.set_environment,
                  {n: ({**envs[n], "TF_CONFIG": tfconfig.dumps(configs[n])},) for n in reports})
    return {name: _checked(name, reports[name], now[name], configs[name]) for name in reports}


def _checked(name: str, report: dict, now: dict, config: dict) -> dict[str, Any]:
    """The report of task ``name``'s engine after :func:`set_environments`, refused if it did not take."""
    if now["tf_config"] is None or tfconfig.loads(now["tf_config"]) != config:
        raise ClusterError(f"{name} reports TF_CONFIG {now['tf_config']!r}, not the one it was "
                           f"given ({tfconfig.dumps(config)})", [name],
                           fix="remove whatever sets TF_CONFIG in the engine's start-up (a profile, "
                               "a sitecustomize), then start the cluster again")
    if now["task"] != name:
        raise ClusterError(f"the engine given {name} reports KIT_TASK={now['task']!r}", [name],
                           fix="remove whatever sets KIT_TASK in the engine's start-up, then start the "
                               "cluster again")
    return {**report, **now, "engine_id": report["engine_id"]}


def task_environment(options: ClusterOptions, name: str, cores: int | None = None,
                     tasks_here: int | None = None) -> dict[str, str]:
    """Task ``name``'s environment, less TF_CONFIG (:func:`set_environments` sets it with the port).

    Threads: ``options.threads``, else the ``cores`` of its engine's host (default: this process's usable
    cores, :func:`kit.core.limits.read`) shared by the ``tasks_here`` on that host (default: every task).
    """
    tasks_here = tasks_here or sum(options.cluster_layout().values())
    threads = options.threads or max(1, (cores or limits.read().cores) // tasks_here)
    env = {
        "TF_NUM_INTRAOP_THREADS": str(threads),
        # at least 2: with one inter-op thread, ParameterServerStrategy steps hang forever
        "TF_NUM_INTEROP_THREADS": str(max(2, threads)),
        "OMP_NUM_THREADS": str(threads),
        # C++ log lines after TensorFlow's start-up: warnings and errors only, unless tf_logs="all"
        **({"TF_CPP_MIN_LOG_LEVEL": "2"} if options.tf_logs == "quiet" else {}),
        # glibc gives each busy thread its own malloc arena; TensorFlow's many threads then hold
        # on to ~100 MB per worker that two arenas do not (docs/performance.md, change 9)
        "MALLOC_ARENA_MAX": "2",
        **options.env,  # the user's word wins, except for what makes the task a task
        tfconfig.TASK_VARIABLE: name,
        "TF_USE_LEGACY_KERAS": KERAS_CHOICES[options.keras],
    }
    env.pop("TF_CONFIG", None)  # the kit's, with the port picked on the engine, comes after
    return env


def build_configs(names: list[str], ports: dict[str, int], hosts: dict[str, str]) -> dict[str, dict]:
    """Each task's TF_CONFIG: the training tasks at ``hosts[name]:ports[name]``, the evaluator outside."""
    cluster: dict[str, list[str]] = {}
    for name in names:
        if not name.startswith("evaluator"):
            cluster.setdefault(tfconfig.parse_task(name)[0], []).append(f"{hosts[name]}:{ports[name]}")
    strategy = "parameter_server" if "ps" in cluster else None
    return {n: tfconfig.build(cluster, n, strategy=strategy) for n in names}


def task_info(name: str, report: dict, config: dict, isolated: bool) -> TaskInfo:
    """What the cluster tells about one task (``cluster.tasks``)."""
    task, where = config["task"], address(config)
    keras = {v: k for k, v in KERAS_CHOICES.items()}.get(report["legacy_keras"], "keras3")
    port = where.rpartition(":")[2]
    if not where:
        listens_on = ""
    elif isolated:
        listens_on = f"[::]:{port} in the cluster's private network (loopback only)"
    else:
        listens_on = f"[::]:{port}, every interface of {report['hostname']} (reachable from the network)"
    reachable_at = tuple(host_port(ip, port) for ip in report["interfaces"]) if where else ()
    return TaskInfo(name=name, type=task["type"], index=task["index"], address=where,
                    engine_id=report["engine_id"], pid=report["pid"], host=report["hostname"], keras=keras,
                    listens_on=listens_on, reachable_at=reachable_at)


def host_port(ip: str, port: int | str) -> str:
    """``ip:port``, the IPv6 address in brackets (``[fd00::2]:2222``)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def address(config: dict) -> str:
    """The host:port of a TF_CONFIG's own task ("" for the evaluator, which runs no server)."""
    task = config["task"]
    return "" if task["type"] == "evaluator" else config["cluster"][task["type"]][task["index"]]


def _close_probes(client: ipp.Client, reports: dict[str, dict]) -> None:
    client[[r["engine_id"] for r in reports.values()]].apply_sync(_remote.close_probe)
