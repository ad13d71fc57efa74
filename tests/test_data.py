"""kit.train.data: where MNIST comes from and its checksum; notebook 10b's two models beside the tutorial's."""

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
