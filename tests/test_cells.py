"""kit.tools.cells: a notebook runs another notebook's tagged cells (one copy of a lesson's functions)."""

from __future__ import annotations

import inspect
import json

import pytest

from conftest import REPO
from kit.core.errors import KitError
from kit.tools import cells


def write(path, sources):
    nb = {"cells": [{"cell_type": kind, "id": f"c{n}", "metadata": {"tags": tags}, "source": text}
                    for n, (kind, tags, text) in enumerate(sources)], "metadata": {}, "nbformat": 4,
          "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


def test_run_tagged_runs_only_the_tagged_code_cells_in_order(tmp_path):
    notebook = write(tmp_path / "lesson.ipynb", [
        ("code", ["training"], "def double(x):\n    return 2 * x\n"),
        ("code", [], "raise RuntimeError('not a training cell')\n"),
        ("markdown", ["training"], "not code"),
        ("code", ["training", "other"], ["def quadruple(x):\n", "    return double(double(x))\n"]),
    ])
    namespace = cells.run_tagged(notebook, "training")
    assert namespace["quadruple"](3) == 12 and namespace["__name__"] == "__main__"
    assert namespace["quadruple"].__module__ == "__main__"             # cloudpickle sends it by value
    assert "return double(double(x))" in inspect.getsource(namespace["quadruple"])   # AutoGraph can read it
    mine = {"__name__": "__main__", "kept": 1}
    assert cells.run_tagged(notebook, "other", mine) is mine and "quadruple" in mine and mine["kept"] == 1


def test_a_missing_notebook_or_tag_says_the_fix(tmp_path):
    with pytest.raises(KitError, match="does not exist"):
        cells.run_tagged(tmp_path / "nope.ipynb", "training")
    notebook = write(tmp_path / "lesson.ipynb", [("code", [], "x = 1\n")])
    with pytest.raises(KitError, match="no code cell tagged 'training'.*Fix"):
        cells.run_tagged(notebook, "training")


@pytest.mark.parametrize("lesson, tag, names", [
    ("08-scaling-experiments.ipynb", "training",
     {"mnist_dataset", "build_and_compile_cnn_model", "train", "train_points", "plan"}),
    ("10-critical-batch-size.ipynb", "training", {"init_mlp", "make_loss", "batches", "accumulation_step",
                                                      "with_warmup", "train_to_target"}),
    ("02-mirrored-and-local-strategies.ipynb", "training",
     {"build_toy_model", "mnist_datasets", "build_model", "decay"}),
    ("02b-cross-device-ops-and-other-strategies.ipynb", "training", {"cross_device_ops", "train_with"}),
    ("04-dataset-sharding.ipynb", "sharding", {"load_mnist", "write_tfrecords", "read_ids", "ids_per_step",
                                               "with_policy", "what_each_worker_sees", "shard_by_hand",
                                               "sharded_ids"}),
])
def test_the_lessons_training_cells_only_define(lesson, tag, names):
    namespace = cells.run_tagged(REPO / "notebooks" / lesson, tag)   # no TensorFlow: functions only
    assert names <= {name for name, value in namespace.items() if callable(value)}


def test_06s_lesson_cells_only_define():
    """06's lesson (the cells tagged ``lesson``, its main.py) defines functions and imports no TensorFlow."""
    namespace = cells.run_tagged(REPO / "notebooks" / "06-custom-training-loop.ipynb", "lesson")
    names = {"load_mnist", "mnist_datasets", "build_model", "make_train_step", "evaluate", "write_filepath",
             "make_checkpoint", "custom_loop", "make_strategy", "train", "train_with_fit"}
    assert names <= set(namespace), f"expected 06's lesson to define {sorted(names - set(namespace))}"
