"""kit.train.outcomes: a worker's outcome, written whole before its process ends, read back with a bounded wait."""

from __future__ import annotations

import json
import time

from kit.train import outcomes


def test_record_writes_one_whole_json_file_per_process(tmp_path):
    path = outcomes.record({"task": "worker:1", "error": None}, tmp_path)
    assert path.parent == tmp_path and path.name.startswith("worker-1-") and path.suffix == ".json"
    assert json.loads(path.read_text()) == {"task": "worker:1", "error": None}
    assert not list(tmp_path.glob("*.tmp")), "the temporary file was left behind"


def test_collect_returns_once_enough_are_there(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"task": "worker:0"}))
    (tmp_path / "b.json").write_text(json.dumps({"task": "worker:1"}))
    (tmp_path / "c.tmp").write_text("{half")  # being written: not read
    started = time.monotonic()
    found = outcomes.collect(tmp_path, at_least=2, wait_seconds=30)
    assert [o["task"] for o in found] == ["worker:0", "worker:1"]
    assert time.monotonic() - started < 5


def test_collect_gives_up_after_its_wait_with_what_there_is(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"task": "worker:0"}))
    started = time.monotonic()
    assert [o["task"] for o in outcomes.collect(tmp_path, at_least=2, wait_seconds=0.5)] == ["worker:0"]
    assert 0.4 < time.monotonic() - started < 5
