"""Notebook 04's lesson as the learner's ``main.py`` (``kit export``), run as a cluster runs it: two plain
``python main.py`` processes with their own TF_CONFIG, no kit. The script trains notebook 01's model on the lesson's
TFRecord files under the auto-shard policy ``--policy`` names. The lesson's probe ``sharded_ids`` stays in the
notebook (main() never calls it, so the script leaves it out): run from the notebook's cells as a plain script, under
FILE sharding each worker sees the ids of its own files, every example once, exactly as the same function shows on a
``kit.TFCluster``."""

import json
import math
import os
import subprocess
import sys

from pathlib import Path

import pytest

from kit.tools import cells
from kit.tools.export import lesson_cells
from take_home import MNIST, NOTEBOOKS, export, run_tasks

#: Small: 16 examples in 4 files, a global batch of 4 (two steps per worker).
OPTIONS = {"policy": "FILE", "num_files": 4, "examples": 16, "global_batch": 4}
(LESSON_04,) = NOTEBOOKS.glob("04-*.ipynb")


def arguments(data_dir, **more) -> list[str]:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in {**OPTIONS, **more}.items()]
    return [*flags, f"--data-dir={data_dir}", f"--mnist-path={MNIST}"]


def test_the_exported_script_trains_with_the_policy_as_an_option(tmp_path):
    """main.py is a training script: its help lists --policy (and what it is), and it holds no probe."""
    script = export("04-dataset-sharding", tmp_path / "take-home")
    source = script.read_text()
    assert "import kit" not in source and "KIT_" not in source
    assert "def train(" in source and "model.fit(" in source and "def sharded_ids(" not in source
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "--policy" in shown.stdout and "FILE, DATA, OFF or AUTO" in " ".join(shown.stdout.split()), shown.stdout


def probe_script(folder: Path) -> Path:
    """The notebook's cells tagged ``lesson`` as a plain script that prints ``sharded_ids(**options)`` (options as
    JSON in argv[1]): what main.py was before it trained, so that the probe still runs as a cluster runs a job."""
    nb = json.loads(LESSON_04.read_text())
    path = folder / "probe.py"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text('import os\nos.environ.setdefault("TF_USE_LEGACY_KERAS", "1")\n\n' + "\n\n\n".join(lesson_cells(nb))
                    + "\n\n\nimport json\nimport sys\nprint(json.dumps(sharded_ids(**json.loads(sys.argv[1]))))\n")
    return path


@pytest.mark.slow
def test_the_lessons_probe_as_a_script_shards_as_the_notebooks_workers_do(tmp_path, make_cluster, monkeypatch):
    probe = probe_script(tmp_path / "probe")
    options = {**OPTIONS, "data_dir": str(tmp_path / "plain-data"), "mnist_path": MNIST}
    plain = run_tasks(probe, {"worker": 2}, [json.dumps(options)], timeout=240)

    # each worker its own files (FILE: worker w reads files w, w + 2), each example once
    assert [r["task"] for r in plain] == ["worker:0", "worker:1"], plain
    assert not any(r["error"] for r in plain), plain
    seen = [sorted(i for step in r["steps"] for i in step) for r in plain]
    assert seen == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]], f"ids seen by each worker: {seen}"
    assert all(len(step) == 2 for r in plain for step in r["steps"]), f"2 ids per replica per step: {plain}"
    assert sorted(os.listdir(tmp_path / "plain-data" / "4-files")) == \
        [f"mnist-0{i}-of-04.tfrecord" for i in range(4)], "the files, written whole (no temporary left)"

    # the same lesson function on the kit's workers, from the notebook's cells
    namespace = cells.run_tagged(LESSON_04, "lesson", {"__name__": "__main__"})
    monkeypatch.setenv("KIT_VIEW", "text")
    cluster = make_cluster(workers=2)
    on_kit = cluster.with_options(stream=False, timeout=240).run(
        namespace["sharded_ids"], **OPTIONS, data_dir=str(tmp_path / "kit-data"), mnist_path=MNIST)
    assert on_kit == plain, f"the kit's workers saw {on_kit}, the plain processes {plain}"


@pytest.mark.slow
def test_the_exported_script_trains_on_two_plain_workers_under_the_policy(tmp_path):
    script = export("04-dataset-sharding", tmp_path / "take-home")
    results = run_tasks(script, {"worker": 2}, arguments(tmp_path / "data", epochs=2), timeout=300)
    assert [r["task"] for r in results] == ["worker:0", "worker:1"], results
    assert all(r["policy"] == "FILE" for r in results), results
    losses = [r["loss"] for r in results]
    assert all(len(loss) == 2 and all(math.isfinite(v) for v in loss) for loss in losses), losses
    assert losses[1] == pytest.approx(losses[0], rel=1e-6), f"every worker logs the global mean loss: {losses}"
    assert sorted(os.listdir(tmp_path / "data" / "4-files")) == \
        [f"mnist-0{i}-of-04.tfrecord" for i in range(4)], "the files, written whole (no temporary left)"
