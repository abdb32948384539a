"""Results on disk: ``results/<experiment>/<run>/`` directories, and the atomic writers.

The atomic JSON/file writers live in :mod:`models.io` (so that :mod:`models.train`
need not import :mod:`experiments`: the layering is similarity <- models <- experiments);
they are re-exported here.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
from collections.abc import Callable, Mapping

from funsim.models.io import read_json as read_json
from funsim.models.io import to_jsonable as to_jsonable
from funsim.models.io import write_atomic as write_atomic
from funsim.models.io import write_json_atomic as write_json_atomic

__all__ = ["to_jsonable", "write_atomic", "write_json_atomic", "write_text_atomic", "read_json", "results_dir",
           "config_type", "config_overrides", "load_config"]


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_atomic`), e.g. a run's ``summary.md``.

    Examples:
      >>> import tempfile, pathlib
      >>> p = write_text_atomic(pathlib.Path(tempfile.mkdtemp()) / "s.md", "# Ω")
      >>> p.read_text(encoding="utf-8"), sorted(x.name for x in p.parent.iterdir())
      ('# Ω', ['s.md'])
    """
    data = text.encode()
    return write_atomic(path, lambda f: f.write(data))


def results_dir(experiment: str, run: str | None = None, *, root: str | os.PathLike = "results") -> pathlib.Path:
    """Create and return ``root/experiment/run`` (run defaults to a UTC timestamp)."""
    run = run or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    d = pathlib.Path(root) / experiment / run
    d.mkdir(parents=True, exist_ok=True)
    return d


def config_type(configs: Mapping[str, object], from_dict: Callable[[dict], object]) -> Callable[[str], object]:
    """An argparse ``type`` for ``--config``: a name in ``configs``, or a ``.json`` file read by ``from_dict``.

    A JSON file without a ``"name"`` is named after the file's stem.
    """

    def parse(value: str):
        if value in configs:
            return configs[value]
        path = pathlib.Path(value)
        if path.suffix == ".json" and path.is_file():
            d = json.loads(path.read_text())
            d.setdefault("name", path.stem)
            return from_dict(d)
        raise argparse.ArgumentTypeError(
            f"--config must be one of {', '.join(configs)} or an existing .json file, got {value!r}."
        )

    return parse


def config_overrides(d: Mapping[str, object], cls: type, what: str) -> tuple[dict, str | None]:
    """``(fields, base)``: a JSON config ``d`` split into its ``"base"`` name and the other fields.

    Raises:
      ValueError: a field that ``cls`` (a dataclass) does not have, naming the valid ones.
    """
    d = dict(d)
    base = d.pop("base", None)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ValueError(f"Unknown {what} config fields {unknown}; valid fields: {sorted(fields)} (and 'base').")
    return d, base


def load_config(cls: type, configs: Mapping[str, object], name_or_path: str):
    """A driver config: a name in ``configs`` or a JSON file of the dataclass ``cls``'s fields.

    Lists in the JSON become tuples (nested lists: tuples of tuples), so a saved
    ``config.json`` loads back into an equal config.

    Raises:
      ValueError: neither a known name nor a file, or a field ``cls`` does not have (naming the valid ones).
    """
    if name_or_path in configs:
        return configs[name_or_path]
    path = pathlib.Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"--config {name_or_path!r} is neither one of {', '.join(configs)} nor a JSON file."
        )
    raw = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ValueError(f"{path}: unknown {cls.__name__} fields {unknown}; valid fields: {sorted(fields)}.")

    def tup(v):
        return tuple(tup(u) for u in v) if isinstance(v, list) else v

    return cls(**{k: tup(v) for k, v in raw.items()})
