"""Linear CKA at n = 10,000, d = 512, float32: funsim vs NumPy (feature space and Gram form) vs ckatorch.

Run::

    python -m benchmarks.bench_cka            # full size (about a minute)
    python -m benchmarks.bench_cka --quick    # n = 1,000, d = 64, seconds

Timing: the first call (compile + run) is reported separately; steady state is
the median of several warm calls, each ended with ``block_until_ready``.
The naive Gram form is O(n^2 d): it runs at a reduced n and is extrapolated by
(n / n_reduced)^2, and the table says so. ckatorch runs at the full size when
its extrapolated time is at most ``--ckatorch-budget`` seconds, otherwise it is
extrapolated the same way.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np


def _median_time(f, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def numpy_features(x, y):
    xc, yc = x - x.mean(0), y - y.mean(0)
    return np.sum((yc.T @ xc) ** 2) / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))


def numpy_gram(x, y):
    n = x.shape[0]
    h = np.eye(n, dtype=x.dtype) - 1.0 / n
    k, l = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    return np.sum(k * l) / (np.linalg.norm(k) * np.linalg.norm(l))


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--gram-n", type=int, default=3_000, help="reduced n for the NumPy Gram form")
    parser.add_argument("--ckatorch-budget", type=float, default=15.0)
    parser.add_argument("--ckatorch-n", type=int, default=5_000, help="reduced n for ckatorch's timing run")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.d, args.gram_n, args.ckatorch_n, args.repeats = 1_000, 64, 500, 500, 3

    import jax

    from funsim.similarity import cka

    n, d = args.n, args.d
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x @ rng.normal(size=(d, d)).astype(np.float32) / np.sqrt(d) + rng.normal(size=(n, d))).astype(np.float32)
    rows = []  # (implementation, n run, seconds at full n, note)

    # ours: the jitted core (no eager checks) and the public function (eager NaN/constant checks)
    xj, yj = jax.device_put(x), jax.device_put(y)
    t0 = time.perf_counter()
    jax.jit(cka).lower(xj, yj).compile()  # trace + compile only, on a fresh wrapper
    compile_s = time.perf_counter() - t0
    ours_jit = jax.jit(cka)
    t0 = time.perf_counter()
    v_ours = float(ours_jit(xj, yj).block_until_ready())
    first = time.perf_counter() - t0
    t_ours = _median_time(lambda: ours_jit(xj, yj).block_until_ready(), args.repeats)
    rows.append(("funsim `jax.jit(cka)` (feature space)", n, t_ours, f"compile {compile_s:.2f} s; first call {first:.2f} s"))
    t_pub = _median_time(lambda: cka(x, y).block_until_ready(), args.repeats)
    rows.append(("funsim `cka` (with eager NaN/Inf and constant checks, NumPy input)", n, t_pub, ""))

    t_np = _median_time(lambda: numpy_features(x, y), args.repeats)
    v_np = float(numpy_features(x, y))
    rows.append(("NumPy feature space", n, t_np, ""))

    gn = min(args.gram_n, n)
    xs, ys = x[:gn], y[:gn]
    t_g = _median_time(lambda: numpy_gram(xs, ys), max(1, args.repeats // 3))
    rows.append(("NumPy Gram form (n×n)", gn, t_g * (n / gn) ** 2,
                 f"run at n={gn}: {t_g:.3f} s, extrapolated ×(n/{gn})² (O(n² d))" if gn < n else ""))

    try:
        import torch
        from ckatorch.core import cka_base

        torch.set_num_threads(os.cpu_count() or 1)
        tn = min(args.ckatorch_n, n)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        t_small = _median_time(lambda: cka_base(xt[:tn], yt[:tn]), 1)
        est = t_small * (n / tn) ** 2
        if est <= args.ckatorch_budget:
            t0 = time.perf_counter()
            v_t = float(cka_base(xt, yt))
            rows.append(("ckatorch `cka_base` (float64 internally)", n, time.perf_counter() - t0,
                         f"one run at full size; value agrees to {abs(v_t - v_ours):.1e}"))
        else:
            rows.append(("ckatorch `cka_base` (float64 internally)", tn, est,
                         f"run at n={tn}: {t_small:.3f} s, extrapolated ×(n/{tn})² (full size would exceed "
                         f"{args.ckatorch_budget:.0f} s)"))
    except ImportError as e:  # pragma: no cover - depends on the bench extra
        rows.append(("ckatorch", 0, float("nan"), f"not run: {e}"))

    cmd = "python -m benchmarks.bench_cka" + (" --quick" if args.quick else "")
    lines = [
        "## Representational similarity (CKA)",
        "",
        f"Command: `{cmd}`. Linear CKA, n={n:,}, d={d}, float32 ({platform.machine()}, {os.cpu_count()} CPU cores, "
        f"shared with other jobs; JAX {jax.__version__}, backend {jax.default_backend()}). "
        f"|ours - NumPy| = {abs(v_ours - v_np):.1e}.",
        "",
        "| implementation | n run | time at full n (s) | reference / ours (jit) | note |",
        "|---|---:|---:|---:|---|",
    ]
    for name, nr, t, note in rows:
        lines.append(f"| {name} | {nr:,} | {t:.4f} | {t / t_ours:.1f} | {note} |")
    lines.append("")
    lines.append(
        f"Ours / NumPy feature space = {t_ours / t_np:.2f} (target ≤ 1.5); "
        f"ckatorch / ours = {rows[-1][2] / t_ours:.0f} (target ≥ 100); "
        f"compile {compile_s:.2f} s (lower + compile), first call {first:.2f} s."
    )
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
