"""Notebook 04's lesson as the learner's ``main.py`` (``kit export``), run as a cluster runs it: two plain
``python main.py`` processes with their own TF_CONFIG, no kit. Under FILE sharding each sees the ids of its own
files, every example once, exactly as the same lesson function shows on a ``kit.TFCluster``."""

import os

import pytest

from take_home import MNIST, export, run_tasks

#: Small: 16 examples in 4 files, a global batch of 4 (two steps per worker).
OPTIONS = {"policy": "FILE", "num_files": 4, "examples": 16, "global_batch": 4}


def arguments(data_dir) -> list[str]:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in OPTIONS.items()]
    return [*flags, f"--data-dir={data_dir}", f"--mnist-path={MNIST}"]


@pytest.mark.slow
def test_the_exported_script_shards_as_the_notebooks_workers_do(tmp_path, make_cluster, monkeypatch):
    script = export("04-dataset-sharding", tmp_path / "take-home")
    source = script.read_text()
    assert "import kit" not in source and "KIT_" not in source
    plain = run_tasks(script, {"worker": 2}, arguments(tmp_path / "plain-data"), timeout=240)

    # each worker its own files (FILE: worker w reads files w, w + 2), each example once
    assert [r["task"] for r in plain] == ["worker:0", "worker:1"], plain
    assert not any(r["error"] for r in plain), plain
    seen = [sorted(i for step in r["steps"] for i in step) for r in plain]
    assert seen == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]], f"ids seen by each worker: {seen}"
    assert all(len(step) == 2 for r in plain for step in r["steps"]), f"2 ids per replica per step: {plain}"
    assert sorted(os.listdir(tmp_path / "plain-data" / "4-files")) == \
        [f"mnist-0{i}-of-04.tfrecord" for i in range(4)], "the files, written whole (no temporary left)"

    # the same lesson function on the kit's workers, from the same script's source
    namespace = {"__name__": "main_04"}
    exec(compile(source, str(script), "exec"), namespace)
    monkeypatch.setenv("KIT_VIEW", "text")
    cluster = make_cluster(workers=2)
    on_kit = cluster.with_options(stream=False, timeout=240).run(
        namespace["sharded_ids"], **OPTIONS, data_dir=str(tmp_path / "kit-data"), mnist_path=MNIST)
    assert on_kit == plain, f"the kit's workers saw {on_kit}, the plain processes {plain}"
