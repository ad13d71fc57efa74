"""Emulated links between hosts (kit.core.links): parsing, the ring model, and, as root, a shaped cluster."""

import os

import pytest

import kit
from kit.core import links
from kit.core.errors import OptionError
from kit.core.options import ClusterOptions


def test_a_link_is_parsed_in_tc_units_and_bad_ones_name_the_field():
    assert links.Link.parse("100mbit") == links.Link(100e6)
    assert links.Link.parse("1gbit 2ms") == links.Link(1e9, 0.002)
    assert links.Link.parse("2.5gbit 100us").delay_s == pytest.approx(1e-4)
    assert str(links.Link.parse("10gbit 2ms")) == "10gbit 2ms"
    for bad in ("fast", "100", "100mbit 2", "100mbit 2ms extra", "0bit", 5):
        with pytest.raises(OptionError, match="link"):
            links.Link.parse(bad)
    with pytest.raises(OptionError, match="delay"):
        links.Link(1e9, delay_s=60)


def test_cluster_options_take_a_link_and_refuse_it_where_it_cannot_work():
    assert ClusterOptions(link="1gbit").link == links.Link(1e9)
    with pytest.raises(OptionError, match="link"):
        ClusterOptions(link="1gbit", isolation="none")
    with pytest.raises(OptionError, match="link"):
        ClusterOptions(link="1gbit", engines="some/ipcontroller-client.json")
    assert kit.Link is links.Link


def test_the_ring_model():
    gradient = 2_770_634 * 4
    # 2 workers: each sends and receives the whole gradient once, S / b
    assert links.ring_all_reduce_seconds(gradient, 2, 1e9) == pytest.approx(gradient * 8 / 1e9)
    # N workers: 2(N-1)/N S / b, approaching 2 S / b; plus 2(N-1) latencies
    assert links.ring_all_reduce_seconds(gradient, 8, 1e9, latency_s=1e-3) == \
        pytest.approx(2 * 7 / 8 * gradient * 8 / 1e9 + 14e-3)
    # the host's own cost adds in series
    assert links.ring_all_reduce_seconds(gradient, 2, 1e9, host_bps=1e9) == \
        pytest.approx(2 * links.ring_all_reduce_seconds(gradient, 2, 1e9))
    assert links.ring_all_reduce_seconds(gradient, 1, 1e9) == 0
    # a token bucket lets `burst` bytes of each message through at once; a fixed cost per call adds
    assert links.ring_all_reduce_seconds(gradient, 2, 1e9, burst=gradient) == 0
    assert links.ring_all_reduce_seconds(gradient, 2, 1e9, burst=gradient / 4, host_s=0.5) == \
        pytest.approx(gradient * 8 / 1e9 / 2 + 0.5)
    assert links.burst_bytes(100e6) == 2 * links.SMALL_GSO_BYTES and links.burst_bytes(10e9) == 1_250_000
    assert links.burst_bytes(1e9) == 2 * links.GSO_BYTES


def _root_or_skip(link=None):
    why = links.available(link)
    if why and os.environ.get("CI"):
        pytest.fail(f"CI runs as root on Debian, where emulated links must work: {why}")
    if why:
        pytest.skip(why)


@pytest.mark.slow
def test_a_shaped_link_makes_the_all_reduce_follow_the_ring_model(make_cluster):
    """2 workers behind 100 Mbit/s links: each at its own address, the all-reduce of the seeds' CNN's gradient
    no faster than the ring model allows (plus the host's own cost, measured unshaped), the link and not the host
    setting its time, and nothing left. How close to the model it comes is measured by `kit bench --only links`
    (its ratio column): an upper bound is a timing target, which load on the machine can break."""
    _root_or_skip()
    from kit.tools.cells import lesson

    time_all_reduce = lesson("10b-noise-scale-and-links", "links")["time_all_reduce"]  # one strategy per cluster
    host = make_cluster(workers=2, threads=1)
    rows = [task[0] for task in host.with_options(stream=False).run(time_all_reduce, [2_770_634], 3)]
    unshaped = max(min(r["seconds"]) for r in rows)
    host.stop()
    cluster = make_cluster(workers=2, threads=1, link="100mbit")
    assert [t.address.rpartition(":")[0] for t in cluster.tasks] == ["10.88.0.1", "10.88.0.2"]
    holders = [h.pid for h in [*cluster.engines.linked.holders.values(), cluster.engines.linked.switch]]
    rows = [task[0] for task in cluster.with_options(stream=False).run(time_all_reduce, [2_770_634], 3)]
    assert [r["sum"] for r in rows] == [3.0, 3.0]
    nbytes, measured = rows[0]["bytes"], max(min(r["seconds"]) for r in rows)   # fastest: least disturbed
    host_bps = nbytes * 8 / unshaped
    predicted = links.ring_all_reduce_seconds(nbytes, 2, 100e6, host_bps=host_bps, burst=links.burst_bytes(100e6))
    assert measured / predicted > 0.75, (measured, predicted, unshaped)  # load can slow it, never speed it up
    assert measured > 5 * unshaped   # the link, not the host, sets the time at 100 Mbit/s
    cluster.stop()
    assert not [pid for pid in holders if os.path.exists(f"/proc/{pid}")], "a namespace holder outlived the cluster"


@pytest.mark.slow
def test_a_delay_without_netem_is_refused_at_start_saying_why(make_cluster):
    _root_or_skip()
    why = links.available(links.Link(1e9, 0.001))
    if why is None:
        pytest.skip("this kernel has netem: a delay works here")
    with pytest.raises(kit.ClusterError, match="netem"):
        make_cluster(workers=2, link="1gbit 1ms")
