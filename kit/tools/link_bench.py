"""``kit bench --only links``: the all-reduce and the scaling efficiency over emulated links between hosts.

For each bandwidth, a 2-worker MultiWorkerMirroredStrategy cluster whose tasks sit behind shaped links
(:mod:`kit.core.links`, root only) times the all-reduce of one step's gradient of two models (TensorFlow's tutorial's CNN,
2.77 M parameters, and its pooled variant, 11,850) in float32 and float16, and trains each (float32 and float16
sums) to measure examples/s: notebook 10b's own ``time_all_reduce`` and ``train_on_link`` (its cells tagged
``links``). Efficiency = the 2 workers' examples/s ÷ (2 × one process's, one thread each, same per-worker
batch). The same on the cluster's loopback (no link) gives the host's own cost of an all-reduce, a cost per
byte and a cost per call (:func:`host_cost`), which the model adds in series
(:func:`kit.core.links.ring_all_reduce_seconds`): at 10 Gbit/s the host, not the link, is the limit here
(docs/performance.md). Each time is the fastest of ``repeats`` calls, the least disturbed by the machine.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from ..core.errors import KitError

LESSON = "10b-noise-scale-and-links"
BANDWIDTHS = ("100mbit", "1gbit", "10gbit")
DTYPES = ("float32", "float16")
#: parameters of each of 10b's ``build_cnn`` architectures, checked against the workers' count at run time
PARAMETERS = {"dense": 2_770_634, "pooled": 11_850}
COLUMNS = ["strategy", "model", "parameters", "dtype", "link", "bandwidth_bps", "workers", "bytes", "all_reduce_s",
           "all_reduce_median_s", "host_s", "model_link_only_s", "model_s", "ratio", "examples_per_second",
           "efficiency"]


def _timings(link: str | None, repeats: int) -> dict[tuple[str, str], dict[str, Any]]:
    from ..core.cluster import TFCluster
    from .cells import lesson

    time_all_reduce = lesson(LESSON, "links")["time_all_reduce"]
    out = {}
    with TFCluster(workers=2, threads=1, link=link) as cluster:
        for dtype in DTYPES:
            if dtype != DTYPES[0]:
                cluster.restart()  # the lesson makes its strategy: one per process
            tasks = cluster.with_options(stream=False).run(time_all_reduce, list(PARAMETERS.values()), repeats, dtype)
            for model, rows in zip(PARAMETERS, zip(*tasks)):  # each task's row of that model
                if any(r["sum"] != 3.0 for r in rows):
                    raise KitError(f"the all-reduce of 1 + 2 gave {[r['sum'] for r in rows]}",
                                   fix="the collective is broken on these workers: run tests/test_links.py")
                # the fastest call: the least disturbed by whatever else the 2 cores run
                out[model, dtype] = {"bytes": rows[0]["bytes"], "seconds": max(min(r["seconds"]) for r in rows),
                                     "median": max(statistics.median(r["seconds"]) for r in rows)}
    return out


def _speed(workers: int, link: str | None, model: str, dtype: str, batch: int, steps: int) -> float:
    """Examples/s of 10b's ``train_on_link`` on the first task, as ``kit.Progress`` measures it."""
    from ..core.cluster import TFCluster
    from ..train.data import mnist_path
    from ..train.progress import Progress
    from .cells import lesson

    train_on_link = lesson(LESSON, "links")["train_on_link"]
    with TFCluster(workers=workers, threads=1, link=link) as cluster:
        parameters = cluster.with_options(stream=False).run(train_on_link, model, dtype, batch, steps,
                                                            str(mnist_path()), callbacks=[Progress(batch * workers)])
        measured = [m["examples_per_second"] for m in cluster.last_view.measurements().values()]
    if parameters[0] != PARAMETERS[model]:
        raise KitError(f"{model} has {parameters[0]} parameters, not {PARAMETERS[model]}",
                       fix=f"update link_bench.PARAMETERS to notebook {LESSON}'s build_cnn")
    return measured[0]


def host_cost(host: dict[tuple[str, str], dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """The host's own cost of an all-reduce, per dtype, from the unshaped timings of the two models: a rate
    (bit/s, the per-byte part) and seconds per call (the rest), the line through (bytes moved, seconds)."""
    out = {}
    for dtype in DTYPES:
        (big_bytes, big_s), (small_bytes, small_s) = [(host[m, dtype]["bytes"] * 8, host[m, dtype]["seconds"])
                                                      for m in ("dense", "pooled")]
        per_byte = (big_bytes - small_bytes) / max(big_s - small_s, 1e-9)
        out[dtype] = (per_byte, max(0.0, small_s - small_bytes / per_byte))
    return out


def measure(bandwidths=BANDWIDTHS, repeats: int = 10, batch: int = 64, steps: int = 20,
            log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every row of the links table (see :data:`COLUMNS`); raises ClusterError where links cannot be made."""
    from ..core.links import Link, burst_bytes, ring_all_reduce_seconds

    host = _timings(None, repeats)
    single = {m: _speed(1, None, m, "float32", batch, steps) for m in PARAMETERS}
    log("host (loopback): " + ", ".join(f"{m} {d} {v['seconds'] * 1e3:.1f} ms" for (m, d), v in host.items()))
    cost = host_cost(host)
    rows = []
    for text in bandwidths:
        link = Link.parse(text)
        timed = _timings(text, repeats)
        for (model, dtype), t in timed.items():
            per_byte, per_call = cost[dtype]
            predicted = ring_all_reduce_seconds(t["bytes"], 2, link.bandwidth_bps, host_bps=per_byte,
                                                host_s=per_call, burst=burst_bytes(link.bandwidth_bps))
            speed = _speed(2, text, model, dtype, batch, steps)
            rows.append({"strategy": "multi_worker_mirrored", "model": model, "parameters": PARAMETERS[model],
                         "dtype": dtype, "link": str(link), "bandwidth_bps": link.bandwidth_bps, "workers": 2,
                         "bytes": t["bytes"], "all_reduce_s": t["seconds"], "all_reduce_median_s": t["median"],
                         "host_s": host[model, dtype]["seconds"],
                         "model_link_only_s": ring_all_reduce_seconds(t["bytes"], 2, link.bandwidth_bps),
                         "model_s": predicted, "ratio": t["seconds"] / predicted, "examples_per_second": speed,
                         "efficiency": speed / (2 * single[model])})
            r = rows[-1]
            log(f"{text:>7} {model:6} {dtype}: all-reduce {r['all_reduce_s'] * 1e3:8.1f} ms, model "
                f"{r['model_s'] * 1e3:8.1f} ms (link only {r['model_link_only_s'] * 1e3:8.1f}), ratio {r['ratio']:.2f}; "
                f"{speed:.0f} examples/s, efficiency {r['efficiency']:.2f}")
    return rows


def section(report: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """The bench's links section: ``report["links"]`` (rows), or ``report["links_skipped"]`` saying why."""
    from ..core.links import available

    why = available()
    if why:
        log(f"links: skipped, {why}")
        report["links_skipped"] = why
    else:
        report["links"] = measure(log=log)


def save_csv(rows: list[dict[str, Any]], path) -> None:
    import pandas as pd

    from ..core.files import write_atomic

    write_atomic(path, pd.DataFrame(rows, columns=COLUMNS).to_csv(index=False))
