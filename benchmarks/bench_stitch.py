"""Batched closed-form stitcher fits vs scikit-learn / SciPy loops and our own single fits.

Run::

    python -m benchmarks.bench_stitch            # 64 problems, n = 2,000, widths 32-256 mixed
    python -m benchmarks.bench_stitch --quick    # tiny sizes, seconds
    python -m benchmarks.bench_stitch --wide     # affine starts with more features than rows

``--wide``: 32 affine fits (ridge 1e-4) of 100 rows, sources of 512-2,048 features (flattened conv maps,
as the similarity study's closed-form starts meet them) into 256, padded to one width: ours (in the rows'
span) against the normal equations on the padded features, the path before, run as one vmapped program of
the same kernels (:func:`similarity.stitching.fit_from_moments`), and a loop over scikit-learn's ``Ridge``
(whose Cholesky solver also works in the rows' span when there are more features than rows).

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
from funsim.similarity.stitching import FAMILIES, fit_from_moments, fit_stitcher, fit_stitchers


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


def _wide(quick: bool) -> str:
    """Affine fits with more (padded) features than rows: the rows' span against the normal equations."""
    from sklearn.linear_model import Ridge

    b, n, widths, d2, ridge, reps = (8, 40, (64, 128), 16, 1e-4, 2) if quick else (32, 100, (512, 1024, 2048), 256,
                                                                               1e-4, 3)
    r = np.random.default_rng(0)
    xs = [r.normal(size=(n, int(r.choice(widths)))).astype(np.float32) for _ in range(b)]
    ys = [(x[:, :d2] + 0.5 * r.normal(size=(n, d2))).astype(np.float32) for x in xs]
    width = max(x.shape[1] for x in xs)

    def normed(z, w):
        zc = z - z.mean(0)
        return np.pad(zc / np.linalg.norm(zc), ((0, 0), (0, w - z.shape[1])))

    u = np.stack([normed(x, width) for x in xs])
    v = np.stack([normed(y, d2) for y in ys])
    mask = np.stack([(np.arange(width) < x.shape[1]).astype(np.float32) for x in xs])
    before = jax.jit(jax.vmap(lambda u_, v_, m_: fit_from_moments(
        u_.T @ u_, u_.T @ v_, family="affine", ridge=ridge, mask_src=m_)[0]))
    first, ours = first_and_warm(lambda: fit_stitchers(xs, ys, family="affine", ridge=ridge), reps)
    first_b, normal = first_and_warm(lambda: before(u, v, mask), reps)
    # the same fit: sklearn's Ridge on the centred, normalised rows (alpha = the ridge in those units)
    _, ref = timed(lambda: [Ridge(alpha=ridge, fit_intercept=False, solver="cholesky").fit(u[k, :, :x.shape[1]], v[k])
                            for k, x in enumerate(xs)])
    gap = max(float(np.abs(np.asarray(a) - np.asarray(c)[: a.shape[0]]).max()) for a, c in zip(
        [np.asarray(s.weight) * np.linalg.norm(x - x.mean(0)) / np.linalg.norm(y - y.mean(0))
         for s, x, y in zip(fit_stitchers(xs, ys, family="affine", ridge=ridge), xs, ys)], np.asarray(before(u, v, mask))))
    dev = jax.devices()[0]
    table = "\n".join([
        f"{b} affine fits, ridge {ridge}, n = {n} rows, sources of {list(widths)} features padded to {width}, "
        f"target {d2}, float32; device: {dev.platform}.",
        "",
        "| ours, rows' span (ms, warm) | compile (s) | normal equations on the padded features (ms, warm) | compile (s) "
        "| ratio | sklearn `Ridge` loop, float32 (ms) | ratio | largest weight difference, ours vs normal equations |",
        "|---|---|---|---|---|---|---|---|",
        f"| {ours * 1e3:.0f} | {first - ours:.2f} | {normal * 1e3:.0f} | {first_b - normal:.2f} | **{normal / ours:.1f}x** "
        f"| {ref * 1e3:.0f} | **{ref / ours:.1f}x** | {gap:.1e} |",
    ])
    print(table)
    return table


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--wide", action="store_true", help="affine fits with more features than rows")
    args = ap.parse_args(argv)
    if args.wide:
        return _wide(args.quick)
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
