"""Notebook 04's pipelines and policies (its cells tagged ``sharding``), and kit.train.sharding: MNIST as TFRecord
files and the pure helpers the notebook tabulates and asserts with."""

import numpy as np
import pytest

import kit
from conftest import REPO
from kit.tools import cells
from kit.train import sharding

#: Notebook 04's cells tagged "sharding": `load_mnist`, `write_tfrecords`, `read_ids`, `ids_per_step`, `with_policy`,
#: `what_each_worker_sees`, `shard_by_hand`, `sharded_ids` (and `parse_id`, `first_line`, `task_name`). Every
#: function takes the worker's strategy and the global batch as arguments.
LESSON_04 = REPO / "notebooks" / "04-dataset-sharding.ipynb"


def lesson():
    """04's tagged cells, run in a namespace of their own."""
    return cells.run_tagged(LESSON_04, "sharding", {"__name__": "__main__"})


def small_npz(path, n=12):
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 255, (n, 28, 28), dtype=np.uint8), y_train=np.arange(n) % 10,
             x_test=rng.integers(0, 255, (2, 28, 28), dtype=np.uint8), y_test=np.arange(2))
    return path


def test_block_ids_cut_consecutive_ids_into_near_equal_files():
    assert sharding.block_ids(10, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [i for block in sharding.block_ids(48, 4) for i in block] == list(range(48))
    with pytest.raises(ValueError):
        sharding.block_ids(2, 3)


def test_files_of_worker_deals_files_round_robin():
    files = ["f0", "f1", "f2", "f3", "f4"]
    assert sharding.files_of_worker(files, 0, 2) == ["f0", "f2", "f4"]
    assert sharding.files_of_worker(files, 1, 2) == ["f1", "f3"]


def test_compact_writes_ranges():
    assert sharding.compact([5, 0, 1, 2, 7, 8, 8]) == "0-2, 5, 7-8"
    assert sharding.compact([]) == ""


def test_ownership_counts_and_owner_codes():
    counts = sharding.ownership([[0, 1, 1], [1, 3]], 5)
    assert counts.tolist() == [[1, 2, 0, 0, 0], [0, 1, 0, 1, 0]]
    # 0: worker 0 only, 1: both (code 2 = several), 2: nobody (-1), 3: worker 1 only
    assert sharding.owner_codes(counts).tolist() == [0, 2, -1, 1, -1]


def test_tfrecords_round_trip_ids_images_and_labels(tmp_path):
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    npz = small_npz(tmp_path / "m.npz")
    code = lesson()  # 04's cells, run once
    files = code["write_tfrecords"](str(tmp_path / "records"), 3, 10, str(npz))  # 04's own writer
    assert [f.rsplit("/", 1)[-1] for f in files] == [f"mnist-0{i}-of-03.tfrecord" for i in range(3)]
    assert [int(i) for i in code["read_ids"](files).as_numpy_iterator()] == list(range(10))  # 04's reader
    assert [[int(i) for i in code["read_ids"]([f]).as_numpy_iterator()] for f in files] == \
        sharding.block_ids(10, 3)  # the ids of notebook 04's table, file by file
    with np.load(npz) as archive:
        for record in tf.data.TFRecordDataset(files).as_numpy_iterator():
            feature = tf.train.Example.FromString(record).features.feature
            i = feature["id"].int64_list.value[0]
            assert feature["label"].int64_list.value[0] == int(archive["y_train"][i])
            image = np.frombuffer(feature["image"].bytes_list.value[0], dtype=np.uint8).reshape(28, 28)
            assert np.array_equal(image, archive["x_train"][i])


def test_the_lessons_in_memory_ids_and_policies():
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    code = lesson()
    read_ids, with_policy = code["read_ids"], code["with_policy"]
    assert [int(i) for i in read_ids(examples=6).as_numpy_iterator()] == list(range(6))
    policy = tf.data.experimental.AutoShardPolicy
    for name in ("FILE", "DATA", "OFF"):
        dataset = with_policy(tf.data.Dataset.range(3), name)
        assert dataset.options().experimental_distribute.auto_shard_policy == getattr(policy, name)
    assert with_policy(tf.data.Dataset.range(3), "AUTO").options().experimental_distribute.auto_shard_policy \
        == policy.AUTO


def test_plot_ownership_draws_one_strip_per_case(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig = sharding.plot_ownership({"FILE": [[0, 1], [2, 3]], "OFF": [[0, 1, 2, 3], [0, 1, 2, 3]]}, 4,
                                  path=tmp_path / "own.png")
    assert (tmp_path / "own.png").stat().st_size > 0
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["FILE", "OFF"]


@pytest.mark.slow
def test_policies_on_two_workers(make_cluster, tmp_path):
    """04's own functions on two workers: FILE gives each worker its files, OFF everything, manual sharding
    every second id with the InputContext of its pipeline."""
    cluster = make_cluster(workers=2)
    code, ids_seen = lesson(), sharding.ids_seen
    files = cluster.with_options(tasks=["worker:0"], stream=False).run(
        code["write_tfrecords"], str(tmp_path), 4, 16, str(kit.train.data.mnist_path()))[0]
    seeing = code["what_each_worker_sees"]
    strategy = kit.OnTask(kit.train.strategies.build_strategy, "multi_worker_mirrored")  # as 04 does: one per process
    file_policy = cluster.with_options(stream=False).run(seeing, strategy, "FILE", 4, files=files)
    assert [ids_seen(r) for r in file_policy] == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    assert [r["worker"] for r in file_policy] == [0, 1] and not any(r["error"] for r in file_policy)
    assert [r["task"] for r in file_policy] == ["worker:0", "worker:1"]  # from TF_CONFIG
    off = cluster.with_options(stream=False).run(seeing, strategy, "OFF", 4, examples=8)
    assert all(ids_seen(r) == list(range(8)) for r in off)
    manual = cluster.with_options(stream=False).run(code["shard_by_hand"], strategy, 8, 4)
    assert [ids_seen(r) for r in manual] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert manual[1]["input_context"] == {"num_input_pipelines": 2, "input_pipeline_id": 1, "per_replica_batch": 2}
