"""Linear CKA at n = 10,000, d = 512, float32: funsim vs NumPy (feature space and Gram form) vs ckatorch.

Run::

    python -m benchmarks.bench_cka            # full size (about a minute)
    python -m benchmarks.bench_cka --quick    # n = 1,000, d = 64, seconds

Timing: the first call (compile + run) is reported separately; steady state is
the median of several warm calls, each ended with ``block_until_ready``.

A second table times the public ``cka`` (value checks inside the program) against
NumPy in alternating rounds in one process, for linear CKA (n = 10,000, d = 512)
and debiased linear CKA (n = 2,000, d = 256), in wall time and in CPU time
(``time.process_time``, all threads: the fair measure on a loaded machine). NumPy's
``xc.T @ xc`` is a symmetric rank-k update (BLAS ``syrk``, half the flops of a
general product); XLA has no such kernel, so the table also times NumPy with
general products for the Gram matrices (``xc.T @ xc.copy()``), the same arithmetic
as ours. Run it single-threaded for per-core efficiency::

    OPENBLAS_NUM_THREADS=1 XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python -m benchmarks.bench_cka --ratios-only
The naive Gram form is O(n^2 d): it runs at a reduced n and is extrapolated by
(n / n_reduced)^2, and the table says so. ckatorch runs at the full size when
its extrapolated time is at most ``--ckatorch-budget`` seconds, otherwise it is
extrapolated the same way.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time

import numpy as np

from benchmarks._timing import alternating, median_time, timed


def numpy_features(x, y):
    xc, yc = x - x.mean(0), y - y.mean(0)
    return np.sum((yc.T @ xc) ** 2) / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))


def numpy_features_gemm(x, y):
    """As :func:`numpy_features` with general products for the Gram matrices (no ``syrk``)."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    return np.sum((yc.T @ xc) ** 2) / (np.linalg.norm(xc.T @ xc.copy()) * np.linalg.norm(yc.T @ yc.copy()))


def _unbiased(c, a, b, n):
    return (c - n / (n - 2) * (a @ b) + a.sum() * b.sum() / ((n - 1) * (n - 2))) / (n * (n - 3))


def numpy_debiased(x, y, *, syrk=True):
    """Debiased linear CKA in feature space (Song et al. 2012's unbiased HSIC), float32 NumPy."""
    n = x.shape[0]
    xc, yc = x - x.mean(0), y - y.mean(0)
    kx, ky = np.einsum("ij,ij->i", xc, xc), np.einsum("ij,ij->i", yc, yc)
    gx = xc.T @ (xc if syrk else xc.copy())
    gy = yc.T @ (yc if syrk else yc.copy())
    hxy = _unbiased(np.sum((xc.T @ yc) ** 2), kx, ky, n)
    return hxy / np.sqrt(_unbiased(np.sum(gx**2), kx, kx, n) * _unbiased(np.sum(gy**2), ky, ky, n))


def ratios_table(repeats: int) -> str:
    """The public ``cka`` against NumPy, alternating rounds, wall and CPU time, two workloads."""
    import jax

    from funsim.similarity import cka

    lines = ["| workload | implementation | wall (s) | CPU (s) | ours / this (wall) | ours / this (CPU) |",
             "|---|---|---:|---:|---:|---:|"]
    for n, d, debiased in ((10_000, 512, False), (2_000, 256, True)):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(n, d)).astype(np.float32)
        y = (x @ rng.normal(size=(d, d)).astype(np.float32) / np.sqrt(d) + rng.normal(size=(n, d))).astype(np.float32)
        xj, yj = jax.device_put(x), jax.device_put(y)
        ref, gemm = ((functools.partial(numpy_debiased, syrk=True), functools.partial(numpy_debiased, syrk=False))
                     if debiased else (numpy_features, numpy_features_gemm))
        fns = {"funsim `cka`": lambda: cka(xj, yj, debiased=debiased), "NumPy (syrk for the Grams)": lambda: ref(x, y),
               "NumPy, general products": lambda: gemm(x, y)}
        for f in fns.values():
            f()
        assert abs(float(fns["funsim `cka`"]()) - float(ref(x, y))) < 1e-4
        t = alternating(fns, repeats, reduce=statistics.median)
        ow, oc = t["funsim `cka`"]
        what = f"{'debiased' if debiased else 'linear'} CKA, {n:,} x {d}"
        for k, (w, c) in t.items():
            lines.append(f"| {what} | {k} | {w:.4f} | {c:.4f} | {ow / w:.2f} | {oc / c:.2f} |")
    return "\n".join(lines)


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
    parser.add_argument("--ratios-only", action="store_true", help="only the alternating-rounds table")
    args = parser.parse_args(argv)
    load = "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    if args.ratios_only:
        table = ratios_table(max(args.repeats, 9))
        given = sys.argv[1:] if argv is None else argv
        head = (f"Command: `{' '.join(['python -m benchmarks.bench_cka', *given])}` (XLA_FLAGS="
                f"{os.environ.get('XLA_FLAGS', '')!r}, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '')!r}); "
                f"{load}; {time.strftime('%Y-%m-%d %H:%M')}.")
        print(head + "\n\n" + table)
        return head + "\n\n" + table
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
    v_ours, first = timed(ours_jit, xj, yj)
    v_ours = float(v_ours)
    t_ours = median_time(lambda: ours_jit(xj, yj).block_until_ready(), args.repeats)
    rows.append(("funsim `jax.jit(cka)` (feature space)", n, t_ours, f"compile {compile_s:.2f} s; first call {first:.2f} s"))
    t_pub = median_time(lambda: cka(x, y).block_until_ready(), args.repeats)
    rows.append(("funsim `cka` (value checks inside the program, NumPy input)", n, t_pub, ""))

    t_np = median_time(lambda: numpy_features(x, y), args.repeats)
    v_np = float(numpy_features(x, y))
    rows.append(("NumPy feature space", n, t_np, ""))

    gn = min(args.gram_n, n)
    xs, ys = x[:gn], y[:gn]
    t_g = median_time(lambda: numpy_gram(xs, ys), max(1, args.repeats // 3))
    rows.append(("NumPy Gram form (n×n)", gn, t_g * (n / gn) ** 2,
                 f"run at n={gn}: {t_g:.3f} s, extrapolated ×(n/{gn})² (O(n² d))" if gn < n else ""))

    try:
        import torch
        from ckatorch.core import cka_base

        torch.set_num_threads(os.cpu_count() or 1)
        tn = min(args.ckatorch_n, n)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        t_small = median_time(lambda: cka_base(xt[:tn], yt[:tn]), 1)
        est = t_small * (n / tn) ** 2
        if est <= args.ckatorch_budget:
            v_t, t_full = timed(cka_base, xt, yt)
            v_t = float(v_t)
            rows.append(("ckatorch `cka_base` (float64 internally)", n, t_full,
                         f"one run at full size; value agrees to {abs(v_t - v_ours):.1e}"))
        else:
            rows.append(("ckatorch `cka_base` (float64 internally)", tn, est,
                         f"run at n={tn}: {t_small:.3f} s, extrapolated ×(n/{tn})² (full size would exceed "
                         f"{args.ckatorch_budget:.0f} s)"))
    except ImportError as e:  # pragma: no cover - depends on the bench extra
        rows.append(("ckatorch", 0, float("nan"), f"not run: {e}"))

    cmd = "python -m benchmarks.bench_cka" + (" --quick" if args.quick else "")
    ratios = ratios_table(args.repeats) if not args.quick else ""
    lines = [
        "## Representational similarity (CKA)",
        "",
        f"Command: `{cmd}`. Linear CKA, n={n:,}, d={d}, float32 ({platform.machine()}, {os.cpu_count()} CPU cores, "
        f"{load}; {time.strftime('%Y-%m-%d %H:%M')}; JAX {jax.__version__}, backend {jax.default_backend()}). "
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
    if ratios:
        lines += ["", "Alternating rounds, public `cka` (value checks in the program) against NumPy:", "", ratios]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
