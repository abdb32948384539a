"""Tensor similarity: speed of the Gram forms against materialising and Monte Carlo.

Run: ``python -m benchmarks.bench_tensor [--quick] [--only symmetric]``. Prints and returns a
Markdown report. Everything is float32 on the default JAX device. Our timings
are steady state (median of warm calls, ``block_until_ready``); the first call
(compile + run) is reported separately. References:

* ``numpy gram``: the same one-layer Gaussian Gram formula written in NumPy.
* ``materialise``: build both symmetric interaction tensors ``(o+1, d+1, d+1)`` in
  NumPy and apply the Isserlis formula slice by slice.
* ``numpy symmetric``: ``tensor_similarity(metric="symmetric")`` written in NumPy, three
  inner products, each one matrix product of the stacked ``[L~; R~]`` factors (the
  same formula); and the same with the self inner products using three of the four
  blocks (``R~ L~^T = (L~ R~^T)^T``), as ours does. Alternating rounds, minimum of
  each, wall and CPU time (``time.process_time``, which other jobs on a shared
  machine do not inflate); ``benchmarks/RESULTS.md`` has the current numbers.
* ``MC 1%``: our jitted Monte Carlo (``monte_carlo_inner``) with the number of
  samples that gives a 1% relative standard error (estimated from a pilot run),
  for a "near checkpoint" (``b = a + 0.3 noise``) and a "far checkpoint"
  (``b = a + 1.0 noise``): the samples needed grow as the inner product shrinks
  relative to the spread of ``f_a . f_b``, while the exact methods cost the same.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._timing import alternating, first_and_warm, fmt_seconds, timed
from funsim.similarity import (
    BilinearLayer,
    monte_carlo_inner,
    similarity_matrix,
    tensor_inner,
    tensor_similarity,
)


def _layer(rng, d, h, o, *, residual=False, bias=True, like=None, noise=0.3):
    """A random float32 bilinear layer; ``like`` gives a perturbed copy (a later checkpoint)."""
    s = 1 / np.sqrt(d)

    def f(name, *shape):
        base = rng.normal(size=shape) * s
        if like is not None:
            base = np.asarray(getattr(like, name)) + noise * base
        return jnp.asarray(base, jnp.float32)

    return BilinearLayer(
        f("left", h, d), f("right", h, d), f("down", o, h),
        f("left_bias", h) if bias else None, f("right_bias", h) if bias else None,
        f("down_bias", o) if bias else None, residual=residual,
    )


def _np_lift(layer):
    left, right, down = (np.asarray(x, np.float32) for x in (layer.left, layer.right, layer.down))
    h, d = left.shape
    o = down.shape[0]
    z = np.zeros(h, np.float32)
    lb = z if layer.left_bias is None else np.asarray(layer.left_bias)
    rb = z if layer.right_bias is None else np.asarray(layer.right_bias)
    db = np.zeros(o, np.float32) if layer.down_bias is None else np.asarray(layer.down_bias)
    lt = np.concatenate([lb[:, None], left], 1)
    rt = np.concatenate([rb[:, None], right], 1)
    return lt, rt, down, db


def numpy_gram_inner(a, b):
    """One-layer Gaussian inner product in Gram form, NumPy (no residual).

    The down bias is one extra unit with ``L~ = R~ = e0``.
    """
    def units(layer):
        lt, rt, down, db = _np_lift(layer)
        e0 = np.zeros((1, lt.shape[1]), np.float32)
        e0[0, 0] = 1
        return (np.concatenate([lt, e0]), np.concatenate([rt, e0]),
                np.concatenate([down, db[:, None]], 1))

    la, ra, da = units(a)
    lb, rb, db = units(b)
    k = (la @ lb.T) * (ra @ rb.T) + (la @ rb.T) * (ra @ lb.T)
    ua, ub = np.einsum("ui,ui->u", la, ra), np.einsum("ui,ui->u", lb, rb)
    ma, mb = la[:, 0] * ra[:, 0], lb[:, 0] * rb[:, 0]
    k += np.outer(ua, ub) - 2 * np.outer(ma, mb)
    return np.einsum("pu,uv,pv->", da, k, db)


def _np_units(layer):
    lt, rt, down, db = _np_lift(layer)
    e0 = np.zeros((1, lt.shape[1]), np.float32)
    e0[0, 0] = 1
    return np.concatenate([lt, e0]), np.concatenate([rt, e0]), np.concatenate([down, db[:, None]], 1)


def _np_symmetric_inner(ua, ub, same=False):
    la, ra, da = ua
    lb, rb, db = ub
    h = la.shape[0]
    if same:  # three of the four blocks: R~ L~^T is the transpose of L~ R~^T
        p = np.concatenate([la, ra]) @ la.T
        ll, rl, rr = p[:h], p[h:], ra @ ra.T
        lr = rl.T
    else:
        p = np.concatenate([la, ra]) @ np.concatenate([lb, rb]).T
        ll, rr, lr, rl = p[:h, :h], p[h:, h:], p[:h, h:], p[h:, :h]
    k = (ll * rr + lr * rl) / 2
    return np.einsum("pu,uv,pv->", da, k, db)


def numpy_symmetric_similarity(a, b, *, same_trick=False):
    """``tensor_similarity(a, b, metric="symmetric")`` of one-layer networks in NumPy."""
    ua, ub = _np_units(a), _np_units(b)
    ab = _np_symmetric_inner(ua, ub)
    aa = _np_symmetric_inner(ua, ua, same=same_trick)
    bb = _np_symmetric_inner(ub, ub, same=same_trick)
    return ab / np.sqrt(aa * bb)


def bench_symmetric(sizes, rows, rounds):
    """The symmetric similarity of a classifier layer against NumPy, side by side."""
    d, h, o = sizes
    rng = np.random.default_rng(5)
    a = _layer(rng, d, h, o)
    b = _layer(rng, d, h, o, like=a)
    ours = lambda: tensor_similarity((a,), (b,), metric="symmetric")  # noqa: E731
    val, first = timed(ours)
    val = float(val)
    best = alternating({"ours": ours, "numpy": lambda: numpy_symmetric_similarity(a, b),
                         "numpy_trick": lambda: numpy_symmetric_similarity(a, b, same_trick=True)}, rounds)
    err = abs(float(numpy_symmetric_similarity(a, b)) - val)
    (w, c), (nw, nc), (tw, tc) = best["ours"], best["numpy"], best["numpy_trick"]
    rows.append(f"| symmetric similarity d={d}, h={h}, o={o} (three inner products) | {fmt_seconds(w)}, CPU {fmt_seconds(c)} "
                f"(first call {fmt_seconds(first)}) | numpy symmetric {fmt_seconds(nw)}, CPU {fmt_seconds(nc)}: **{nw / w:.2f}x** wall, "
                f"**{nc / c:.2f}x** CPU; with the same self-product saving {fmt_seconds(tw)}, CPU {fmt_seconds(tc)}: "
                f"{tw / w:.2f}x wall, {tc / c:.2f}x CPU (min of {rounds} alternating rounds) | "
                f"abs diff {err:.1e} |")


def numpy_materialised_inner(a, b):
    """Build both symmetric lifted tensors and apply Isserlis slice by slice (NumPy)."""
    tensors = []
    for layer in (a, b):
        lt, rt, down, db = _np_lift(layer)
        t = np.einsum("ph,hi,hj->pij", down, lt, rt, optimize=True)
        t = (t + np.swapaxes(t, 1, 2)) / 2
        t[:, 0, 0] += db
        if layer.residual:
            o = down.shape[0]
            t[np.arange(o), np.arange(o) + 1, 0] += 0.5
            t[np.arange(o), 0, np.arange(o) + 1] += 0.5
        tensors.append(t)
    s, t = tensors
    tr_s = np.einsum("pii->p", s)
    tr_t = np.einsum("pii->p", t)
    return tr_s @ tr_t + 2 * np.einsum("pij,pij->", s, t) - 2 * s[:, 0, 0] @ t[:, 0, 0]


def _mc_to_one_percent(a, b, key, *, pilot=20_000, cap=200_000):
    """Samples for a 1% relative SE and the warm time to draw them.

    When more than ``cap`` samples are needed, ``cap`` are timed and the time is
    extrapolated linearly (Monte Carlo cost is linear in the samples).
    Returns ``(n_needed, seconds, note)``.
    """
    est, se = monte_carlo_inner(a, b, n_samples=pilot, key=key)
    sd = float(se) * np.sqrt(pilot)
    n = max(int(np.ceil((sd / (0.01 * abs(float(est)))) ** 2)), 1000)
    m = min(n, cap)
    fn = lambda: monte_carlo_inner(a, b, n_samples=m, key=jax.random.fold_in(key, 1))
    _, warm = first_and_warm(fn, repeats=3)
    if n > m:
        return n, warm * n / m, f"timed {m}, extrapolated"
    est, se = fn()
    return n, warm, f"SE {float(se) / abs(float(est)):.2%}"


def _mc_cell(a, b, b_far, key, ours):
    out = []
    for label, other in (("near checkpoint", b), ("far checkpoint", b_far)):
        n, t, note = _mc_to_one_percent(a, other, key)
        out.append(f"MC 1%, {label}: {n} samples ({note}) {fmt_seconds(t)} ({t / ours:.1f}x)")
    return "; ".join(out)


def bench_classifier(sizes, rows, key):
    d, h, o = sizes
    rng = np.random.default_rng(0)
    a = (_layer(rng, d, h, o),)
    b = (_layer(rng, d, h, o, like=a[0]),)
    first, ours = first_and_warm(lambda: tensor_inner(a, b))
    _, ours_sim = first_and_warm(lambda: tensor_similarity(a, b))
    _, ref_gram = first_and_warm(lambda: numpy_gram_inner(a[0], b[0]))
    _, ref_mat = first_and_warm(lambda: numpy_materialised_inner(a[0], b[0]), repeats=3)
    val = float(tensor_inner(a, b))
    err_g = abs(numpy_gram_inner(a[0], b[0]) - val) / abs(val)
    err_m = abs(numpy_materialised_inner(a[0], b[0]) - val) / abs(val)
    mc = _mc_cell(a, b, (_layer(rng, d, h, o, like=a[0], noise=1.0),), key, ours)
    rows.append(f"| classifier layer d={d}, h={h}, o={o} | {fmt_seconds(ours)} (first call "
                f"{fmt_seconds(first)}; similarity {fmt_seconds(ours_sim)}) | numpy Gram {fmt_seconds(ref_gram)} "
                f"({ref_gram / ours:.1f}x); materialise {fmt_seconds(ref_mat)} ({ref_mat / ours:.1f}x); "
                f"{mc} | agree: gram "
                f"{err_g:.1e}, materialise {err_m:.1e} rel |")


def bench_residual(sizes, reduced, rows):
    d, h = sizes
    rng = np.random.default_rng(1)
    a = (_layer(rng, d, h, d, residual=True),)
    b = (_layer(rng, d, h, d, residual=True, like=a[0]),)
    first, ours = first_and_warm(lambda: tensor_inner(a, b))
    rd, rh = reduced
    ra = (_layer(rng, rd, rh, rd, residual=True),)
    rb = (_layer(rng, rd, rh, rd, residual=True, like=ra[0]),)
    _, ref_small = first_and_warm(lambda: numpy_materialised_inner(ra[0], rb[0]), repeats=3)
    val = float(tensor_inner(ra, rb))
    err = abs(numpy_materialised_inner(ra[0], rb[0]) - val) / abs(val)
    factor = (d / rd) ** 3 * (h / rh)  # building o d^2 entries from h units: o * h * d^2
    ref = ref_small * factor
    mem = (d + 1) ** 3 * 4 * 2 / 2**30
    rows.append(f"| residual layer d=o={d}, h={h} | {fmt_seconds(ours)} (first call {fmt_seconds(first)}) | "
                f"materialise measured at d=o={rd}, h={rh}: {fmt_seconds(ref_small)}, extrapolated by "
                f"o·h·d² (x{factor:.0f}) to {fmt_seconds(ref)} and {mem:.1f} GiB for the two tensors "
                f"({ref / ours:.0f}x) | agree at reduced size: {err:.1e} rel |")


def bench_matrix(n_ckpt, sizes, n_sample_calls, rows):
    d, h, o = sizes
    rng = np.random.default_rng(2)
    ckpts = [(_layer(rng, d, h, o),)]
    for _ in range(n_ckpt - 1):
        ckpts.append((_layer(rng, d, h, o, like=ckpts[-1][0], noise=0.1),))
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *ckpts)
    first, ours = first_and_warm(lambda: similarity_matrix(stacked), repeats=3)
    pairs = [(i, j) for i in range(n_ckpt) for j in range(i + 1, n_ckpt)]
    sample = pairs[:n_sample_calls]
    jax.block_until_ready(tensor_similarity(ckpts[0], ckpts[1]))  # compile once
    t0 = time.perf_counter()
    for i, j in sample:
        jax.block_until_ready(tensor_similarity(ckpts[i], ckpts[j]))
    per_call = (time.perf_counter() - t0) / len(sample)
    total = per_call * len(pairs)
    m = np.asarray(similarity_matrix(stacked))
    check = abs(float(tensor_similarity(ckpts[3], ckpts[7])) - m[3, 7])
    rows.append(f"| {n_ckpt}-checkpoint similarity matrix (d={d}, h={h}, o={o}) | {fmt_seconds(ours)} "
                f"(first call {fmt_seconds(first)}) | {len(pairs)} separate tensor_similarity calls: "
                f"{fmt_seconds(per_call)} each (timed {len(sample)}), {fmt_seconds(total)} in all "
                f"({total / ours:.0f}x) | max entry check {check:.1e} |")


def bench_depth2(sizes, rows, key):
    d, h, o = sizes
    rng = np.random.default_rng(3)
    a = (_layer(rng, d, h, d, residual=True), _layer(rng, d, h, o))
    b = (_layer(rng, d, h, d, residual=True, like=a[0]), _layer(rng, d, h, o, like=a[1]))
    first, ours = first_and_warm(lambda: tensor_inner(a, b), repeats=3)
    far = (_layer(rng, d, h, d, residual=True, like=a[0], noise=1.0),
           _layer(rng, d, h, o, like=a[1], noise=1.0))
    mc = _mc_cell(a, b, far, key, ours)
    est, se = monte_carlo_inner(a, b, n_samples=200_000, key=jax.random.fold_in(key, 7))
    z = abs(float(est) - float(tensor_inner(a, b))) / float(se)
    rows.append(f"| exact Gaussian depth 2, d={d}, h={h}, o={o} (residual first layer) | "
                f"{fmt_seconds(ours)} (first call {fmt_seconds(first)}) | {mc} | abs(MC - exact) = {z:.1f} SE "
                "(200k samples) |")


def bench_scaling(hs, ds, fixed_d, fixed_h, o, rows):
    rng = np.random.default_rng(4)

    def t(d, h):
        a = (_layer(rng, d, h, o),)
        b = (_layer(rng, d, h, o, like=a[0]),)
        return first_and_warm(lambda: tensor_inner(a, b), repeats=3)[1]

    th = [t(fixed_d, h) for h in hs]
    td = [t(d, fixed_h) for d in ds]
    sh = np.polyfit(np.log(hs), np.log(th), 1)[0]
    sd = np.polyfit(np.log(ds), np.log(td), 1)[0]
    rows.append(f"| scaling, one-layer Gaussian, o={o} | time ∝ h^{sh:.2f} (d={fixed_d}, h in "
                f"{hs}: {', '.join(fmt_seconds(x) for x in th)}); time ∝ d^{sd:.2f} (h={fixed_h}, d in "
                f"{ds}: {', '.join(fmt_seconds(x) for x in td)}) | theory O(h² d) | |")


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--only", choices=("all", "symmetric"), default="all")
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds of the symmetric row")
    args = parser.parse_args(argv)
    key = jax.random.key(0)
    rows = []
    if args.only == "symmetric":
        bench_symmetric((32, 16, 4) if args.quick else (784, 512, 10), rows, args.rounds)
    elif args.quick:
        bench_symmetric((32, 16, 4), rows, args.rounds)
        bench_classifier((32, 16, 4), rows, key)
        bench_residual((32, 32), (16, 16), rows)
        bench_matrix(10, (8, 8, 2), 10, rows)
        bench_depth2((8, 8, 2), rows, key)
        bench_scaling([8, 16, 32], [8, 16, 32], 16, 16, 4, rows)
    else:
        bench_symmetric((784, 512, 10), rows, args.rounds)
        bench_classifier((784, 512, 10), rows, key)
        bench_residual((512, 1024), (128, 256), rows)
        bench_matrix(100, (32, 32, 10), 200, rows)
        bench_matrix(100, (64, 64, 10), 200, rows)
        bench_depth2((64, 64, 10), rows, key)
        bench_scaling([128, 256, 512, 1024], [128, 256, 512, 1024], 256, 256, 10, rows)
    dev = jax.devices()[0]
    header = [
        f"Tensor similarity benchmark ({'quick' if args.quick else 'full'} sizes), float32, "
        f"JAX {jax.__version__} on {dev.platform} ({dev.device_kind}).",
        "",
        "| case | ours (steady state) | reference (ratio = reference / ours) | check |",
        "|---|---|---|---|",
    ]
    table = "\n".join(header + rows)
    print(table)
    return table


if __name__ == "__main__":
    main()
