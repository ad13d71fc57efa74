"""``kit bench --only links``: the all-reduce and the scaling efficiency over emulated links between hosts.

For each bandwidth, a 2-worker MultiWorkerMirroredStrategy cluster whose tasks sit behind shaped links
(:mod:`kit.core.links`, root only) times the all-reduce of one step's gradient of two models (the seeds' CNN,
2.77 M parameters, and its pooled variant, 11,850: :data:`kit.train.models.ARCHITECTURES`) in float32 and
float16 (:func:`kit.train.links.time_all_reduce`), and trains each (float32 and float16 sums) to measure
examples/s. Efficiency = the 2 workers' examples/s ÷ (2 × one process's, one thread each, same per-worker
batch). The same on the cluster's loopback (no link) gives the host's own cost of an all-reduce, a cost per
byte and a cost per call (:func:`host_cost`), which the model adds in series
(:func:`kit.core.links.ring_all_reduce_seconds`): at 10 Gbit/s the host, not the link, is the limit here
(docs/performance.md). Each time is the fastest of ``repeats`` calls, the least disturbed by the machine.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from ..core.errors import KitError
from ..train.links import DTYPES

BANDWIDTHS = ("100mbit", "1gbit", "10gbit")
#: parameters of each architecture (kit.train.models), checked against the workers' count at run time
PARAMETERS = {"dense": 2_770_634, "pooled": 11_850}
COLUMNS = ["strategy", "model", "parameters", "dtype", "link", "bandwidth_bps", "workers", "bytes", "all_reduce_s",
           "all_reduce_median_s", "host_s", "model_link_only_s", "model_s", "ratio", "examples_per_second",
           "efficiency"]


def _timings(link: str | None, repeats: int) -> dict[tuple[str, str], dict[str, Any]]:
    from ..core.cluster import TFCluster
    from ..train.links import time_all_reduce

    out = {}
    with TFCluster(workers=2, threads=1, link=link) as cluster:
        for model, floats in PARAMETERS.items():
            for dtype in DTYPES:
                rows = cluster.with_options(stream=False).run(time_all_reduce, floats, dtype=dtype, repeats=repeats)
                if any(r["sum"] != 3.0 for r in rows):
                    raise KitError(f"the all-reduce of 1 + 2 gave {[r['sum'] for r in rows]}",
                                   fix="the collective is broken on these workers: run tests/test_links.py")
                # the fastest call: the least disturbed by whatever else the 2 cores run
                out[model, dtype] = {"bytes": rows[0]["bytes"], "seconds": max(min(r["seconds"]) for r in rows),
                                     "median": max(statistics.median(r["seconds"]) for r in rows)}
    return out


def _speed(workers: int, link: str | None, model: str, dtype: str, batch: int, steps: int) -> dict[str, Any]:
    from ..core.cluster import TFCluster
    from ..train.fit import train_mnist

    strategy = "default" if workers == 1 else "multi_worker_mirrored"
    with TFCluster(workers=workers, threads=1, link=link) as cluster:
        rows = cluster.with_options(stream=False).run(
            train_mnist, per_worker_batch=batch, epochs=2, steps_per_epoch=steps, strategy=strategy,
            architecture=model, gradient_compression="fp16" if dtype == "float16" else "none")
    if rows[0]["parameters"] != PARAMETERS[model]:
        raise KitError(f"{model} has {rows[0]['parameters']} parameters, not {PARAMETERS[model]}",
                       fix="update link_bench.PARAMETERS to kit.train.models' architectures")
    return rows[0]


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
    single = {m: _speed(1, None, m, "float32", batch, steps)["examples_per_second"] for m in PARAMETERS}
    log(f"host (loopback): " + ", ".join(f"{m} {d} {v['seconds'] * 1e3:.1f} ms" for (m, d), v in host.items()))
    cost = host_cost(host)
    rows = []
    for text in bandwidths:
        link = Link.parse(text)
        timed = _timings(text, repeats)
        for (model, dtype), t in timed.items():
            per_byte, per_call = cost[dtype]
            predicted = ring_all_reduce_seconds(t["bytes"], 2, link.bandwidth_bps, host_bps=per_byte,
                                                host_s=per_call, burst=burst_bytes(link.bandwidth_bps))
            speed = _speed(2, text, model, dtype, batch, steps)["examples_per_second"]
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
