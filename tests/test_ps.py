"""kit.train.ps: servers on workers and ps, the coordinator's loop and fit on the chief, measured."""

from __future__ import annotations

import pytest

from kit.train import ps
from kit.train.strategies import build_strategy
from kit.core.errors import WorkerError


def test_expected_shards_follow_min_size_partitioner():
    assert ps.expected_shards([21632, 128], min_shard_bytes=256 << 10, max_shards=2) == 2
    assert ps.expected_shards([21632, 128], min_shard_bytes=256 << 10, max_shards=64) == 43
    assert ps.expected_shards([32], min_shard_bytes=256 << 10, max_shards=2) == 1
    assert ps.expected_shards([3, 1000000], min_shard_bytes=1, max_shards=10) == 3  # at most one row each


def test_staleness_counts_updates_in_between():
    steps = [{"worker": 0, "before": 0, "after": 2, "loss": 1.0, "start": 0.0, "end": 2.0},
             {"worker": 1, "before": 0, "after": 1, "loss": 2.0, "start": 0.5, "end": 1.0}]
    rows = ps.summarize_steps(steps)
    assert [(r["version"], r["worker"], r["staleness"]) for r in rows] == [(1, 1, 0), (2, 0, 1)]


def test_timeline_draws_one_bar_per_step(tmp_path):
    steps = [{"worker": w, "before": v, "after": v + 1 + (v == 2), "loss": 1.0, "start": 10.0 + v, "end": 10.5 + v}
             for v, w in enumerate([0, 1, 0, 1])]
    sync = [{"task": f"worker:{i}", "step_start_times": [20.0, 21.0], "step_end_times": [20.9, 21.9]} for i in range(2)]
    fig = ps.timeline(steps, sync, path=tmp_path / "timeline.png")
    top, bottom = fig.axes
    assert len(top.patches) == 4 and len(bottom.patches) == 4 and (tmp_path / "timeline.png").is_file()
    assert sum(p.get_facecolor()[0] > 0.8 for p in top.patches) == 1  # the one stale update is red


@pytest.fixture(scope="module")
def ps_cluster():
    from kit.core.cluster import TFCluster

    with TFCluster(chief=True, workers=2, ps=1) as cluster:
        yield cluster


SERVERS = ["worker:0", "worker:1", "ps:0"]


@pytest.mark.slow
def test_servers_listen_at_their_tf_config_address_and_keep_running(ps_cluster):
    servers = ps_cluster.with_options(tasks=SERVERS, stream=False).run(ps.start_server)
    addresses = {t.name: t.address for t in ps_cluster.tasks}
    assert [s["target"] for s in servers] == [f"grpc://{addresses[n]}" for n in SERVERS]
    assert all(s["inter_op_threads"] >= 2 for s in servers)
    assert ps_cluster.with_options(tasks=SERVERS, stream=False).run(ps.start_server) == servers


@pytest.mark.slow
def test_roles_are_checked(ps_cluster):
    with pytest.raises(WorkerError, match="worker and ps tasks"):
        ps_cluster.with_options(tasks=["chief:0"], stream=False).run(ps.start_server)
    with pytest.raises(WorkerError, match="coordinator runs on the chief"):
        ps_cluster.with_options(tasks=["worker:0"], stream=False).run(build_strategy, "parameter_server")


@pytest.mark.slow
def test_scheduled_steps_each_make_one_update_and_the_big_kernel_is_sharded(ps_cluster):
    ps_cluster.with_options(tasks=SERVERS, stream=False).run(ps.start_server)
    loop = ps_cluster.with_options(tasks=["chief:0"], stream=False).run(ps.train_custom_loop, steps=6,
        per_worker_batch=16, examples=512)[0]
    assert loop["done_after_join"] and loop["final_version"] == 6 and (loop["workers"], loop["ps"]) == (2, 1)
    rows = ps.summarize_steps(loop["steps"])
    assert len(rows) == 6 and all(1 <= r["version"] <= 6 for r in rows)
    assert all(r["worker"] in (0, 1) and r["staleness"] >= 0 and r["end"] >= r["start"] for r in rows)
    for v in loop["variables"]:
        assert len(v["shards"]) == ps.expected_shards(v["shape"]) and all("/job:ps/" in d for d in v["devices"])
    assert [v["variable"] for v in loop["variables"] if v["sharded"]] == ["dense.kernel"]

    fitted = ps_cluster.with_options(tasks=["chief:0"], stream=False).run(ps.train_fit, epochs=1,
        steps_per_epoch=4, per_worker_batch=16, examples=512)[0]
    assert fitted["final_version"] == 4 and len(fitted["epoch_loss"]) == 1
