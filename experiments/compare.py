"""``funsim compare``: every representational measure on two saved representation matrices.

Run::

    funsim compare A.npy B.npy                       # every registered measure, as a table
    funsim compare A.npz:layer3 B.npz:layer3 --json  # a named array in an .npz
    funsim compare A.npy B.npy --measures cka/linear svcca "shape/angular/alpha=0.5"
    funsim compare --example                         # demo on scikit-learn's digits (offline)

Rows of A and B are the same inputs in the same order; columns are features.
Measures that cannot be computed for this data (e.g. CCA when d >= n) are
listed with the reason instead of a value; when no measure can be computed
(or ``--measures ""`` names none) the exit status is 1, with the reason.
Kendall-tau RSA costs O(n^4): above the library's limit
(``similarity.rsa.KENDALL_MAX_ENTRIES`` RDM entries, n of about 630) it is
skipped unless named with ``--measures`` (which then reports the library's error).

Exit status: 0 when at least one measure was computed, 1 when none was,
2 for bad arguments or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from funsim.data import load_representation, sklearn_digits_arrays
from funsim.experiments.io import write_atomic, write_json_atomic
from funsim.similarity import list_measures, measure
from funsim.similarity.rsa import KENDALL_MAX_ENTRIES


class CompareError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def kendall_max_n() -> int:
    """The largest n whose RDM (``n (n - 1) / 2`` entries) Kendall's tau-a accepts."""
    n = 2
    while (n + 1) * n // 2 <= KENDALL_MAX_ENTRIES:
        n += 1
    return n


def _select(names_arg: list[str] | None, n: int) -> tuple[list[str], list[str]]:
    if names_arg is not None:
        names = [s.strip() for item in names_arg for s in item.split(",") if s.strip()]
        if not names:
            raise CompareError("--measures names no measure; give at least one (see --list), or drop it for all.")
        for name in names:
            measure(name)  # raises with close-name suggestions
        return names, []
    names = list_measures()
    skipped = []
    if n > kendall_max_n():
        skipped = [m for m in names if m.endswith("/kendall")]
        names = [m for m in names if m not in skipped]
    return names, skipped


def compare(x: np.ndarray, y: np.ndarray, names: list[str]) -> list[dict]:
    """Evaluate each named measure; failures are recorded with their reason."""
    rows = []
    for name in names:
        m = measure(name)
        row = {"measure": name, "kind": m.kind, "symmetric": m.symmetric, "value": None, "error": None}
        t0 = time.perf_counter()
        try:
            row["value"] = float(m(x, y))
        except ValueError as e:
            row["error"] = str(e)
        row["seconds"] = round(time.perf_counter() - t0, 4)
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """An aligned plain-text table."""
    head = ("measure", "kind", "sym", "value")
    body = []
    for r in rows:
        val = f"{r['value']:.6f}" if r["value"] is not None else "n/a: " + r["error"].split(". ")[0]
        body.append((r["measure"], r["kind"], "yes" if r["symmetric"] else "no", val))
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(3)]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]
    rule = "  ".join("-" * w for w in widths) + "  " + "-" * 8
    return "\n".join([fmt(head), rule, *(fmt(r) for r in body)])


def principal_components(x: np.ndarray, k: int) -> np.ndarray:
    """``(n, k)``: the centred ``x (n, d)`` projected on its top ``k`` principal axes.

    Each axis's sign makes its largest-magnitude loading positive (scikit-learn's ``PCA``
    convention since 1.5), so this equals ``PCA(k).fit_transform(x)`` without importing
    scikit-learn (about 2 s).
    """
    c = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(c, full_matrices=False)
    vt = vt[:k]
    vt = vt * np.sign(vt[np.arange(len(vt)), np.argmax(np.abs(vt), axis=1)])[:, None]
    return c @ vt.T


def make_example(out: Path, *, seed: int = 0) -> tuple[Path, Path]:
    """Two views of the same 1797 digits: pixels, and random tanh features of a 16-D PCA.

    Pixels that are 0 for every digit are dropped (they carry nothing and make
    CCA undefined). Writes ``pixels.npy`` and ``random_features.npy`` under ``out``.
    """
    images, _ = sklearn_digits_arrays()
    pixels = images.reshape(len(images), -1).astype(np.float64)
    pixels = pixels[:, pixels.std(axis=0) > 0]
    rng = np.random.default_rng(seed)
    pcs = principal_components(pixels, 16)
    pcs /= pcs.std(axis=0)
    feats = np.tanh(pcs @ rng.normal(size=(16, 48)) / 4.0)
    paths = out / "pixels.npy", out / "random_features.npy"
    for p, arr in zip(paths, (pixels, feats)):
        write_atomic(p, lambda f, arr=arr: np.save(f, arr))  # a file object: no ".npy" appended
    return paths


def main(args: argparse.Namespace) -> int:
    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    try:
        if args.list:
            for name in list_measures():
                m = measure(name)
                print(f"{name:34s} {m.kind:8s} {'symmetric' if m.symmetric else 'directed':9s} {m.description}")
            return 0
        if args.example:
            if args.a or args.b:
                raise CompareError("--example builds its own inputs; drop the file arguments.")
            a_path, b_path = make_example(args.out)
            args.a, args.b = str(a_path), str(b_path)
            if not args.json:
                print(f"digits example: {a_path} vs {b_path}")
        if not args.a or not args.b:
            raise CompareError("give two files (A.npy B.npy), or --example.")
        dtype = np.float32 if args.float32 else np.float64
        x = load_representation(args.a, args.key).astype(dtype)
        y = load_representation(args.b, args.key).astype(dtype)
        if x.shape[0] != y.shape[0]:
            raise CompareError(
                f"{args.a} has shape {x.shape} and {args.b} has shape {y.shape}: the number of "
                "rows (samples) must match, same inputs in the same order."
            )
        for spec, arr in ((args.a, x), (args.b, y)):
            bad = int(np.size(arr) - np.isfinite(arr).sum())
            if bad:
                raise CompareError(f"{spec}: {bad} NaN/Inf values; remove or impute them first.")
        names, skipped = _select(args.measures, x.shape[0])
    except (CompareError, ValueError) as e:
        print(f"funsim compare: error: {e}", file=sys.stderr)
        return 2

    rows = compare(x, y, names)
    kmax = kendall_max_n()
    result = {
        "a": {"path": args.a, "shape": list(x.shape)},
        "b": {"path": args.b, "shape": list(y.shape)},
        "dtype": np.dtype(dtype).name,
        "skipped": {name: f"O(n^4) for n={x.shape[0]} > {kmax}; name it with --measures" for name in skipped},
        "measures": rows,
    }
    if args.example:
        write_json_atomic(args.out / "metrics.json", result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"A: {args.a} {x.shape}   B: {args.b} {y.shape}   ({np.dtype(dtype).name})")
        print(format_table(rows))
        if skipped:
            print(f"skipped {len(skipped)} Kendall-tau RSA measures: O(n^4) for n={x.shape[0]} > {kmax}; "
                  "name them with --measures.")
        if args.example:
            print(f"wrote {args.out / 'metrics.json'}")
    if not any(r["value"] is not None for r in rows):
        reasons = "; ".join(f"{r['measure']}: {r['error'].split('. ')[0]}" for r in rows[:3])
        print(f"funsim compare: no measure could be computed for these inputs ({reasons}"
              f"{'; ...' if len(rows) > 3 else ''}).", file=sys.stderr)
        return 1
    return 0
