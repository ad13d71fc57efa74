"""kit.train.data: where MNIST comes from, its checksum, and the uint8-until-batched pipeline."""

import numpy as np
import pytest

from kit.train import data
from kit.core.errors import KitError


def test_bundled_file_matches_its_checksum():
    assert data.sha256_of(data.BUNDLED_MNIST) == data.BUNDLED_MNIST_SHA256


def test_load_mnist_gives_uint8_arrays_with_published_label_counts():
    (x_train, y_train), (x_test, y_test) = data.load_mnist()
    assert x_train.shape == (60000, 28, 28) and x_train.dtype == np.uint8
    assert x_test.shape == (10000, 28, 28) and x_test.dtype == np.uint8
    assert np.bincount(y_train).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def small_npz(path, n=8):
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 255, (n, 28, 28), dtype=np.uint8), y_train=np.arange(n) % 10,
             x_test=rng.integers(0, 255, (n, 28, 28), dtype=np.uint8), y_test=np.arange(n) % 10)
    return path


def test_explicit_path_then_env_then_bundled(tmp_path, monkeypatch):
    explicit = small_npz(tmp_path / "explicit.npz", n=4)
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    small_npz(env_dir / "mnist.npz", n=6)
    monkeypatch.setenv("KIT_DATA_DIR", str(env_dir))
    assert len(data.load_mnist(explicit)[0][0]) == 4
    assert len(data.load_mnist()[0][0]) == 6
    monkeypatch.delenv("KIT_DATA_DIR")
    assert data.mnist_path() == data.BUNDLED_MNIST


def test_missing_file_says_where_it_looked(tmp_path):
    with pytest.raises(KitError, match="KIT_DATA_DIR"):
        data.load_mnist(tmp_path / "nope.npz")


def test_file_without_the_arrays_is_rejected(tmp_path):
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((1, 28, 28), np.uint8))
    with pytest.raises(KitError, match="y_train, x_test, y_test"):
        data.load_mnist(tmp_path / "bad.npz")


def test_damaged_bundled_file_is_refused(tmp_path, monkeypatch):
    fake = small_npz(tmp_path / "mnist.npz")
    monkeypatch.setattr(data, "BUNDLED_MNIST", fake)
    with pytest.raises(KitError, match="sha256"):
        data.load_mnist()


def test_dataset_batches_are_float_in_unit_range_and_labels_int64(tmp_path):
    dataset = data.mnist_dataset(32, path=small_npz(tmp_path / "m.npz", n=40), shuffle_seed=1)
    images, labels = next(iter(dataset))
    assert images.shape == (32, 28, 28) and images.dtype.name == "float32"
    assert labels.dtype.name == "int64"
    assert 0.0 <= float(images.numpy().min()) and float(images.numpy().max()) <= 1.0
    # repeated: more batches than the data holds
    assert len(list(dataset.take(5))) == 5


def test_test_split_is_finite_and_ordered(tmp_path):
    batches = list(data.mnist_dataset(3, path=small_npz(tmp_path / "m.npz", n=8), train=False))
    assert [len(labels) for _, labels in batches] == [3, 3, 2]
    assert np.concatenate([labels.numpy() for _, labels in batches]).tolist() == list(range(8))


def test_shuffling_indices_gives_the_batches_shuffling_examples_gave(tmp_path):
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    path = small_npz(tmp_path / "m.npz", n=40)
    (x, y), _ = data.load_mnist(path)
    examples = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(40, seed=7).repeat().batch(16)
    for (images, labels), (raw_images, raw_labels) in zip(data.mnist_dataset(16, path=path, shuffle_seed=7),
                                                          examples.take(6)):  # two and a half epochs
        np.testing.assert_array_equal(labels.numpy(), raw_labels.numpy())
        np.testing.assert_allclose(images.numpy(), raw_images.numpy() / 255.0, rtol=1e-6)


def test_images_are_held_once_per_process_in_a_variable():
    """A variable, so that sharding a dataset copies a handle, not 47 MB (the memory itself is measured
    by kit bench, docs/performance.md change 9)."""
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    data.mnist_dataset(64), data.mnist_dataset(128, shuffle_seed=3)
    images, labels = data.resident_arrays(data.BUNDLED_MNIST, True)
    assert isinstance(images, tf.Variable) and images.dtype == tf.uint8 and images.shape == (60000, 28, 28)
    assert isinstance(labels, tf.Variable) and labels.shape == (60000,)
    assert data.resident_arrays(data.BUNDLED_MNIST, True)[0] is images  # both datasets use this one


def test_inside_a_traced_function_or_a_strategy_scope_the_arrays_are_constants(tmp_path):
    from kit.train._tf import import_tensorflow

    tf = import_tensorflow()
    path = small_npz(tmp_path / "m.npz", n=40)
    kinds = []

    @tf.function
    def per_worker_dataset():  # as ParameterServerStrategy traces a dataset function
        kinds.append(type(data.resident_arrays(path, True)[0]).__name__)
        return data.mnist_dataset(8, path=path)

    per_worker_dataset()
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # a variable here would be a mirrored one
        kinds.append(type(data.resident_arrays(path, True)[0]).__name__)
    assert len(kinds) >= 2 and not any("Variable" in kind for kind in kinds)


def test_sharding_by_rank_splits_each_global_batch_between_the_ranks(tmp_path):
    """shard=(size, rank) with one seed: the ranks' batches of one step together are the unsharded batch
    of that step (what Horovod's ranks and MultiWorkerMirroredStrategy's workers each see)."""
    path = tmp_path / "m.npz"
    images = np.zeros((40, 28, 28), dtype=np.uint8)
    np.savez(path, x_train=images, y_train=np.arange(40), x_test=images, y_test=np.arange(40))  # label = id
    whole = data.mnist_dataset(16, path=path, shuffle_seed=5)
    ranks = [data.mnist_dataset(8, path=path, shuffle_seed=5, shard=(2, rank)) for rank in (0, 1)]
    for step, ((_, labels), (_, first), (_, second)) in enumerate(zip(whole.take(5), *ranks)):  # 2 epochs
        assert sorted(labels.numpy()) == sorted([*first.numpy(), *second.numpy()])
        if step < 2:  # within the first epoch (a batch across the epoch's end may hold an example twice)
            assert not set(first.numpy()) & set(second.numpy())


@pytest.mark.parametrize("shard", [(2, 2), (0, 0), (2, -1), [2, 0]])
def test_bad_shard_names_the_fix(shard):
    with pytest.raises(KitError, match="shard=.*hvd.size"):
        data.mnist_dataset(8, shard=shard)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_batch_size(bad):
    with pytest.raises(KitError, match="global_batch_size"):
        data.mnist_dataset(bad)


def test_the_two_models_of_10b_and_the_tutorials_of_01():
    """10b's ``build_cnn`` ("dense") is 01's model, the tutorial's; "pooled" has the parameters 10b's text and
    ``kit bench --only links`` give it."""
    from kit.tools import cells
    from kit.tools.link_bench import PARAMETERS

    build_cnn = cells.lesson("10b-noise-scale-and-links", "links")["build_cnn"]
    tutorial = cells.lesson("01-single-vs-multi-worker")["build_and_compile_cnn_model"]()
    dense, pooled = build_cnn("dense"), build_cnn("pooled")
    kinds = [type(layer).__name__ for layer in tutorial.layers]
    assert kinds == [type(layer).__name__ for layer in dense.layers] == ["Reshape", "Conv2D", "Flatten", "Dense", "Dense"]
    assert tutorial.count_params() == dense.count_params() == 32 * 9 + 32 + 26 * 26 * 32 * 128 + 128 + 128 * 10 + 10
    assert dense.count_params() == PARAMETERS["dense"] and pooled.count_params() == PARAMETERS["pooled"]
    assert [type(layer).__name__ for layer in pooled.layers] == ["Reshape", "Conv2D", "MaxPooling2D", "Flatten", "Dense"]
    assert type(dense.optimizer).__name__ == type(tutorial.optimizer).__name__ == "SGD"
