"""What the training-dynamics drivers (``forgetting``, ``backdoor``) share besides training
(:mod:`funsim.models.curriculum`) and their run folder (:func:`experiments.io.open_run`): the image
data of the stages, cached result arrays, markdown tables, the files of a finished run, and the
command line (``driver_main``)."""

from __future__ import annotations

import dataclasses
import pathlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funsim import data
from funsim.data import DataNotFoundError
from funsim.experiments import config as config_lib
from funsim.experiments import io as run_io

__all__ = ["to_grayscale", "select_classes", "load_images", "cached_arrays", "markdown_table", "finish_run",
           "driver_main"]


# --------------------------------------------------------------------------- data


def to_grayscale(x: np.ndarray, /) -> np.ndarray:
    """RGB images ``(n, H, W, 3)`` to luminance ``(n, H, W, 1)`` (ITU-R BT.601 weights).

    ``0.2989 R + 0.5870 G + 0.1140 B``, the weights the tensor-similarity
    paper's SVHN experiments used; one-channel input is returned unchanged.

    Examples:
      >>> to_grayscale(np.ones((2, 4, 4, 3), np.float32)).shape
      (2, 4, 4, 1)
    """
    x = np.asarray(x)
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(f"x must be images (n, H, W, 1 or 3), got shape {x.shape}.")
    if x.shape[-1] == 1:
        return x
    w = np.asarray([0.2989, 0.5870, 0.1140], x.dtype)
    return np.einsum("nhwc,c->nhw", x, w)[..., None].astype(x.dtype)


def select_classes(x: np.ndarray, y: np.ndarray, classes: Sequence[int], /) -> tuple[np.ndarray, np.ndarray]:
    """The examples of ``(x, y)`` whose label is in ``classes``, in their original order.

    Examples:
      >>> x, y = select_classes(np.arange(6), np.array([0, 1, 2, 0, 1, 2]), [0, 2])
      >>> x.tolist(), y.tolist()
      ([0, 2, 3, 5], [0, 2, 0, 2])
    """
    y = np.asarray(y)
    keep = np.isin(y, np.asarray(list(classes)))
    return np.asarray(x)[keep], y[keep]


def load_images(name: str, *, grayscale: bool = False, n_train: int | None = None, **kwargs):
    """An image data set from :mod:`funsim.data`, optionally in grayscale and cut to ``n_train``.

    Args:
      name: ``"mnist5k"``, ``"fashion_mnist"``, ``"svhn_cropped"``, ... (any image set of
        :func:`funsim.data.load`).
      grayscale: convert RGB to luminance with :func:`to_grayscale`.
      n_train: keep the first ``n_train`` training examples (None: all).
      **kwargs: passed to the loader (e.g. ``download=False``).

    Returns:
      :class:`funsim.data.Dataset`.
    """
    ds = data.load(name, **kwargs)
    if n_train is not None:
        ds = ds.subset(n_train)
    if grayscale:
        ds = dataclasses.replace(ds, x_train=to_grayscale(ds.x_train), x_test=to_grayscale(ds.x_test),
                                 description=ds.description + "; grayscale (BT.601 luminance)")
    return ds


# --------------------------------------------------------------------------- runs and reports


def cached_arrays(path: str | pathlib.Path, key: np.ndarray, compute: Callable[[], dict], /) -> dict:
    """``compute()`` (a dict of arrays), saved to ``path`` (.npz, atomically) and reused while ``key`` matches.

    ``key`` identifies the inputs (e.g. the checkpoint steps); a file saved for
    another key is recomputed and replaced, and so is a damaged file (truncated, or
    bytes changed), with a warning naming it.
    """
    path = pathlib.Path(path)
    key = np.asarray(key)
    if path.exists():
        try:
            f = run_io.read_npz(path, fix="Recomputing it.")
        except run_io.DamagedFileError as e:
            warnings.warn(str(e), RuntimeWarning, stacklevel=2)
        else:
            if "_key" in f and np.array_equal(f["_key"], key):
                return {k: v for k, v in f.items() if k != "_key"}
    arrays = {k: np.asarray(v) for k, v in compute().items()}
    run_io.write_atomic(path, lambda f: np.savez(f, _key=key, **arrays))  # a file object: no ".npz" appended
    return arrays


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], /) -> str:
    """A GitHub markdown table; floats are written with 3 decimals, None as "n/a".

    Examples:
      >>> print(markdown_table(["a", "b"], [["x", 0.12345], ["y", None]]))
      | a | b |
      |---|---|
      | x | 0.123 |
      | y | n/a |
    """
    def cell(v):
        if v is None:
            return "n/a"
        if isinstance(v, (float, np.floating)):
            return f"{float(v):.3f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def finish_run(out: pathlib.Path, metrics: dict, summary: str, figures: Sequence, log: Callable[[str], None]) -> dict:
    """Write ``metrics.json`` (atomically) and ``summary.md``, print the summary and where the files are.

    Returns ``metrics`` with ``out`` and ``figures`` (paths) added.
    """
    run_io.write_json_atomic(out / "metrics.json", metrics)
    run_io.write_text_atomic(out / "summary.md", summary)
    log(summary)
    log(f"results in {out}/: summary.md, metrics.json, " + ", ".join(pathlib.Path(f).name for f in figures))
    return {**metrics, "out": str(out), "figures": [str(f) for f in figures]}


# --------------------------------------------------------------------------- command line


def driver_main(args, name: str, cls, configs: dict, run: Callable) -> int:
    """Resolve the config and the run name and call ``run``; a missing data set is reported, exit status 1."""
    cfg, run_name = config_lib.from_args(args, cls, configs)
    if args.print_config:
        print(config_lib.config_json(cfg))
        return 0
    try:
        run(cfg, root=args.root, run_name=args.run or run_name, progress=not args.no_progress, authors_dir=args.authors_data)
    except DataNotFoundError as e:
        print(f"funsim {name}: {e}")
        return 1
    return 0
