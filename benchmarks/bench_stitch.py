"""Batched closed-form stitcher fits vs scikit-learn / SciPy loops and our own single fits.

Run::

    python -m benchmarks.bench_stitch            # 64 problems, n = 2,000, widths 32-256 mixed
    python -m benchmarks.bench_stitch --quick    # tiny sizes, seconds

For each family: ``similarity.fit_stitchers`` on the whole batch (first call =
compile + run, reported separately; then the median of warm calls), a Python
loop over ``similarity.fit_stitcher`` (warm), and a Python loop over the
reference: ``sklearn.linear_model.LinearRegression`` (affine) or
``scipy.linalg.orthogonal_procrustes`` on the centred, unit-norm, zero-padded
data (the orthogonal families; plus the optimal scale in NumPy). All inputs are
float32 arrays; the references compute in float64 as their libraries do.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import scipy.linalg
from sklearn.linear_model import LinearRegression

from benchmarks._timing import first_and_warm, timed
from funsim.similarity.stitching import FAMILIES, fit_stitcher, fit_stitchers


def _block(tree):
    return jax.block_until_ready(tree)


def _ref_fit(x, y, family):
    if family == "affine":
        return LinearRegression().fit(x, y).coef_
    xc, yc = x - x.mean(0), y - y.mean(0)
    xc, yc = xc / np.linalg.norm(xc), yc / np.linalg.norm(yc)
    d = max(x.shape[1], y.shape[1])
    xp = np.pad(xc, ((0, 0), (0, d - x.shape[1])))
    yp = np.pad(yc, ((0, 0), (0, d - y.shape[1])))
    q, _ = scipy.linalg.orthogonal_procrustes(xp, yp)
    if family == "scaled_orthogonal":
        return q, np.sum(yp * (xp @ q)) / np.sum(xp * xp)
    return q


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        b, n, widths, reps = 8, 200, (8, 16, 32), 2
    else:
        b, n, widths, reps = 64, 2000, (32, 64, 128, 256), 3
    r = np.random.default_rng(0)
    xs, ys = [], []
    for _ in range(b):
        d1, d2 = r.choice(widths), r.choice(widths)
        x = r.normal(size=(n, d1)).astype(np.float32)
        ys.append((x @ r.normal(size=(d1, d2)) + r.normal(size=(n, d2))).astype(np.float32))
        xs.append(x)
    xs_j = [jax.device_put(x) for x in xs]
    ys_j = [jax.device_put(y) for y in ys]
    rows = []
    for fam in FAMILIES:
        first, ours = first_and_warm(lambda: fit_stitchers(xs_j, ys_j, family=fam), reps)
        for x, y in zip(xs_j, ys_j):  # compile every single-fit shape first
            _block(fit_stitcher(x, y, family=fam))
        _, loop = first_and_warm(lambda: [fit_stitcher(x, y, family=fam) for x, y in zip(xs_j, ys_j)], 1)
        _, ref = timed(lambda: [_ref_fit(x, y, fam) for x, y in zip(xs, ys)])
        ref_name = "sklearn LinearRegression" if fam == "affine" else "scipy orthogonal_procrustes"
        rows.append(
            f"| {fam} | {ours * 1e3:.0f} | {first - ours:.2f} | {loop * 1e3:.0f} | {loop / ours:.1f}x "
            f"| {ref_name}: {ref * 1e3:.0f} | **{ref / ours:.1f}x** |"
        )
    dev = jax.devices()[0]
    table = "\n".join(
        [
            f"Fit {b} stitchers, n = {n}, widths drawn from {list(widths)} for each side, float32 "
            f"inputs; device: {dev.platform} ({len(jax.devices())} device(s)).",
            "",
            "| family | ours, batched (ms, warm) | compile (s) | loop over our single fits (ms) "
            "| batched vs loop | reference loop (ms) | batched vs reference |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    return table


if __name__ == "__main__":
    main()
