"""kit.train.sharding: MNIST as TFRecord files, policies, and the pure helpers the notebooks assert with."""

import numpy as np
import pytest

from kit.core.errors import OptionError
from kit.train import sharding


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
    npz = small_npz(tmp_path / "m.npz")
    files = sharding.write_mnist_tfrecords(tmp_path / "records", 3, 10, path=npz)
    assert [f.rsplit("/", 1)[-1] for f in files] == [f"mnist-0{i}-of-03.tfrecord" for i in range(3)]
    examples = list(sharding.file_dataset(files).as_numpy_iterator())
    assert [int(e["id"]) for e in examples] == list(range(10))
    with np.load(npz) as archive:
        for e in examples:
            assert int(e["label"]) == int(archive["y_train"][e["id"]])
            assert np.allclose(e["image"], archive["x_train"][e["id"]] / 255.0)


def test_memory_dataset_and_source_choice(tmp_path, monkeypatch):
    npz = small_npz(tmp_path / "mnist.npz")
    monkeypatch.setenv("KIT_DATA_DIR", str(tmp_path))
    ids = [int(e["id"]) for e in sharding.source_dataset(examples=6).as_numpy_iterator()]
    assert ids == list(range(6))
    assert npz.exists()
    with pytest.raises(OptionError, match="files= .* or examples=") as refused:
        sharding.source_dataset()
    assert refused.value.field == "files"


def test_with_policy_sets_the_auto_shard_option():
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    dataset = sharding.with_policy(tf.data.Dataset.range(3), "OFF")
    assert dataset.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    with pytest.raises(OptionError, match="AUTO, FILE, DATA, OFF") as refused:
        sharding.with_policy(dataset, "FILES")
    assert refused.value.field == "policy"


def test_plot_ownership_draws_one_strip_per_case(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig = sharding.plot_ownership({"FILE": [[0, 1], [2, 3]], "OFF": [[0, 1, 2, 3], [0, 1, 2, 3]]}, 4,
                                  path=tmp_path / "own.png")
    assert (tmp_path / "own.png").stat().st_size > 0
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["FILE", "OFF"]


@pytest.mark.slow
def test_policies_on_two_workers(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    files = cluster.with_options(tasks=["worker:0"], stream=False).run(sharding.write_mnist_tfrecords,
        str(tmp_path), 4, 16)[0]
    file_policy = cluster.with_options(stream=False).run(sharding.observe, "FILE", files=files,
        global_batch=4)
    assert [sharding.ids_seen(r) for r in file_policy] == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    off = cluster.with_options(stream=False).run(sharding.observe, "OFF", examples=8, global_batch=4)
    assert all(sharding.ids_seen(r) == list(range(8)) for r in off)
    manual = cluster.with_options(stream=False).run(sharding.observe_manual, examples=8, global_batch=4)
    assert [sharding.ids_seen(r) for r in manual] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert manual[1]["input_context"] == {"num_input_pipelines": 2, "input_pipeline_id": 1, "per_replica_batch": 2}
