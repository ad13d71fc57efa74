"""kit.core.tfconfig: every way a TF_CONFIG is rejected, and what a valid one looks like."""

import json

import pytest

from kit.core import tfconfig
from kit.core.errors import TFConfigError

W2 = {"worker": ["localhost:12345", "localhost:23456"]}


def cfg(cluster=None, task_type="worker", index=0):
    return {"cluster": W2 if cluster is None else cluster, "task": {"type": task_type, "index": index}}


def rejected(value, field, strategy=None, fragment=""):
    with pytest.raises(TFConfigError) as info:
        tfconfig.validate(value, strategy=strategy)
    assert info.value.field == field, str(info.value)
    assert "Fix:" in str(info.value)
    assert fragment in str(info.value)
    return info.value


def test_build_gives_each_task_the_same_cluster_and_its_own_task():
    configs = [tfconfig.build(W2, name) for name in tfconfig.cluster_tasks(W2)]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert all(c["cluster"] == W2 for c in configs)
    assert json.loads(tfconfig.dumps(configs[1])) == configs[1]


def test_roles_order_and_evaluator_outside_cluster():
    spec = {"worker": ["w:1"], "chief": ["c:1"], "ps": ["p:1"]}
    assert tfconfig.cluster_tasks(spec) == ["chief:0", "worker:0", "ps:0"]
    assert tfconfig.validate(cfg(spec, "evaluator", 0))["task"]["type"] == "evaluator"
    assert tfconfig.build(spec, "chief", strategy="parameter_server")["task"] == {"type": "chief", "index": 0}


def test_loads_accepts_valid_json_and_optional_keys():
    text = json.dumps({**cfg(), "rpc_layer": "grpc", "environment": "cloud"})
    assert tfconfig.loads(text)["rpc_layer"] == "grpc"


def test_ipv6_address_is_accepted():
    assert tfconfig.parse_address("[::1]:2222") == ("[::1]", 2222)


def test_not_json():
    rejected("{'cluster': {}}", "TF_CONFIG", fragment="not valid JSON")


def test_not_an_object():
    rejected([1, 2], "TF_CONFIG")


@pytest.mark.parametrize("missing", ["cluster", "task"])
def test_cluster_or_task_missing(missing):
    value = cfg()
    del value[missing]
    rejected(value, missing, fragment="missing")


def test_unknown_top_level_key():
    rejected({**cfg(), "custer": {}}, "custer", fragment="spelling")


def test_unknown_task_type_in_cluster():
    rejected(cfg({"workers": ["a:1"]}), "cluster.workers", fragment="unknown task type")


def test_unknown_task_type_in_task():
    rejected(cfg(task_type="master"), "task.type", fragment="unknown task type")


def test_task_type_absent_from_cluster():
    rejected(cfg(task_type="chief"), "task.type", fragment="no addresses")


@pytest.mark.parametrize("role", ["chief", "evaluator"])
def test_more_than_one_chief_or_evaluator(role):
    rejected(cfg({"worker": ["w:1"], role: ["a:1", "b:1"]}), f"cluster.{role}", fragment="only one")


@pytest.mark.parametrize("index, fragment", [("1", "not an integer"), (1.0, "not an integer"),
                                             (True, "not an integer"), (-1, "negative"),
                                             (2, "out of range")])
def test_bad_index(index, fragment):
    rejected(cfg(index=index), "task.index", fragment=fragment)


def test_evaluator_index_out_of_range():
    rejected(cfg(task_type="evaluator", index=1), "task.index", fragment="out of range")


@pytest.mark.parametrize("address, fragment", [("localhost", "not 'host:port'"), (":123", "not 'host:port'"),
                                               ("host:", "not 'host:port'"), ("::1:22", "malformed host"),
                                               ("host:abc", "not a number"), (12345, "not a string"),
                                               ("my host:22", "white space")])
def test_address_not_host_port(address, fragment):
    rejected(cfg({"worker": [address]}), "cluster.worker[0]", fragment=fragment)


@pytest.mark.parametrize("port, fragment", [(0, "port 0"), (65536, "outside 1-65535"), (99999, "outside")])
def test_bad_port(port, fragment):
    rejected(cfg({"worker": [f"localhost:{port}"]}), "cluster.worker[0]", fragment=fragment)


def test_same_address_twice():
    e = rejected(cfg({"chief": ["a:1"], "worker": ["a:1"]}), "cluster.worker[0]", fragment="also used by")
    assert "chief:0" in str(e)


@pytest.mark.parametrize("bad, field", [({"worker": "a:1"}, "cluster.worker"), ({"worker": []}, "cluster.worker"),
                                        ({}, "cluster"), ("worker", "cluster")])
def test_malformed_cluster(bad, field):
    rejected(cfg(bad), field)


def test_task_not_an_object_or_incomplete():
    rejected({"cluster": W2, "task": "worker:0"}, "task")
    rejected({"cluster": W2, "task": {"type": "worker"}}, "task.index", fragment="missing")


def test_ps_with_multi_worker_mirrored():
    value = cfg({"worker": ["a:1"], "ps": ["b:1"]})
    tfconfig.validate(value)  # fine without a strategy
    rejected(value, "cluster.ps", strategy="multi_worker_mirrored", fragment="no parameter servers")


@pytest.mark.parametrize("cluster, missing", [({"worker": ["a:1"], "ps": ["b:1"]}, "chief"),
                                              ({"chief": ["c:1"], "ps": ["b:1"]}, "worker"),
                                              ({"chief": ["c:1"], "worker": ["a:1"]}, "ps")])
def test_parameter_server_needs_chief_worker_and_ps(cluster, missing):
    task_type = next(iter(cluster))
    rejected(cfg(cluster, task_type), f"cluster.{missing}", strategy="parameter_server", fragment="missing")


def test_unknown_strategy():
    rejected(cfg(), "strategy", strategy="mirrored")


@pytest.mark.parametrize("name, expected", [("worker:1", ("worker", 1)), ("chief", ("chief", 0)),
                                            ("evaluator", ("evaluator", 0)), ("ps:0", ("ps", 0))])
def test_parse_task(name, expected):
    assert tfconfig.parse_task(name) == expected


@pytest.mark.parametrize("name, field", [("worker", "task.index"), ("boss:1", "task.type"),
                                         ("worker:x", "task.index"), ("worker:-1", "task.index")])
def test_parse_task_rejects(name, field):
    with pytest.raises(TFConfigError) as info:
        tfconfig.parse_task(name)
    assert info.value.field == field


def test_free_port_is_bindable():
    port = tfconfig.free_port()
    assert 1 <= port <= 65535
