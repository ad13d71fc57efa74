"""kit.data: where MNIST comes from, its checksum, and the uint8-until-batched pipeline."""

import numpy as np
import pytest

from kit import data
from kit.errors import KitError


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


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_batch_size(bad):
    with pytest.raises(KitError, match="global_batch_size"):
        data.mnist_dataset(bad)


def test_seeds_model_architecture():
    from kit.models import build_and_compile_cnn_model

    model = build_and_compile_cnn_model(learning_rate=0.01)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == ["Reshape", "Conv2D", "Flatten", "Dense", "Dense"]
    assert model.count_params() == 32 * 9 + 32 + 26 * 26 * 32 * 128 + 128 + 128 * 10 + 10
    assert abs(float(model.optimizer.learning_rate.numpy()) - 0.01) < 1e-7
    assert type(model.optimizer).__name__ == "SGD"
