"""kit.train.ps: notebook 07's servers kept serving (serve); the partitioner's shards; the coordinator's role."""

from __future__ import annotations

import pytest

from conftest import REPO
from kit.tools import cells
from kit.train import ps


def test_expected_shards_follow_min_size_partitioner():
    assert ps.expected_shards([21632, 128], min_shard_bytes=256 << 10, max_shards=2) == 2
    assert ps.expected_shards([21632, 128], min_shard_bytes=256 << 10, max_shards=64) == 43
    assert ps.expected_shards([32], min_shard_bytes=256 << 10, max_shards=2) == 1
    assert ps.expected_shards([3, 1000000], min_shard_bytes=1, max_shards=10) == 3  # at most one row each


@pytest.fixture(scope="module")
def ps_cluster():
    from kit.core.cluster import TFCluster

    with TFCluster(chief=True, workers=2, ps=1) as cluster:
        yield cluster


SERVERS = ["worker:0", "worker:1", "ps:0"]


@pytest.mark.slow
def test_the_lessons_servers_listen_at_their_tf_config_address_and_keep_running(ps_cluster):
    start_server = cells.run_tagged(REPO / "notebooks" / "07-parameter-server.ipynb", "lesson")["start_server"]
    servers = ps_cluster.with_options(tasks=SERVERS, stream=False).run(ps.serve, start_server)
    addresses = {t.name: t.address for t in ps_cluster.tasks}
    assert [s["target"] for s in servers] == [f"grpc://{addresses[n]}" for n in SERVERS]
    assert all(s["inter_op_threads"] >= 2 for s in servers)
    assert ps_cluster.with_options(tasks=SERVERS, stream=False).run(ps.serve, start_server) == servers


