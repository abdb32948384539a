"""RSA at n = 1,797, d = 64 (the size of scikit-learn's digits): funsim vs SciPy vs rsatoolbox.

Run::

    python -m benchmarks.bench_rsa            # full size (about a minute)
    python -m benchmarks.bench_rsa --quick    # n = 300, seconds

Both representations are ``(n, d)`` (``y`` a noisy nonlinear map of ``x``); each
implementation computes both RDMs and compares their ``n (n - 1) / 2`` entries,
timed end to end from host arrays. Ours is the public :func:`similarity.rsa`
(eager input checks included), warm: the median of several calls after one
compiling call, whose time is reported separately. SciPy: ``pdist`` + ``spearmanr``
/ ``pearsonr``. rsatoolbox: ``calc_rdm`` + ``compare`` (its "euclidean" RDM is
the squared distance divided by d, a monotone map of ours, so Spearman agrees).
"""

from __future__ import annotations

import argparse
import os
import platform

import numpy as np

from benchmarks._timing import median_time, timed


def scipy_rsa(x, y, metric: str, compare: str) -> float:
    from scipy.spatial.distance import pdist
    from scipy.stats import pearsonr, spearmanr

    a, b = pdist(x, metric), pdist(y, metric)
    return float((spearmanr if compare == "spearman" else pearsonr)(a, b).statistic)


def rsatoolbox_rsa(x, y, metric: str, compare: str) -> float:
    import rsatoolbox

    rdms = [rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(v), method=metric) for v in (x, y)]
    method = {"spearman": "spearman", "pearson": "corr"}[compare]
    return float(rsatoolbox.rdm.compare(rdms[0], rdms[1], method=method)[0, 0])


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=1797)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.repeats = 300, 3

    import jax

    jax.config.update("jax_enable_x64", True)  # float64 runs as float64, as in `funsim compare`
    from funsim.similarity import rsa

    n, d = args.n, args.d
    rng = np.random.default_rng(0)
    x64 = rng.normal(size=(n, d))
    y64 = np.tanh(x64 @ rng.normal(size=(d, d)) / np.sqrt(d)) + 0.3 * rng.normal(size=(n, d))
    cases = [("euclidean", "spearman"), ("correlation", "spearman"), ("correlation", "pearson")]
    rows = []  # (case, dtype, ours s, compile s, scipy s, rsatoolbox s, |ours - scipy|)
    for dtype in (np.float32, np.float64):
        x, y = x64.astype(dtype), y64.astype(dtype)
        for metric, compare in cases:
            f = lambda: rsa(x, y, rdm_metric=metric, compare=compare).block_until_ready()
            v, first = timed(f)
            v = float(v)
            t = median_time(f, args.repeats)
            scipy_rsa(x, y, metric, compare)  # warm-up (imports, first-call overheads)
            ts = median_time(lambda: scipy_rsa(x, y, metric, compare), max(1, args.repeats // 2))
            ref = scipy_rsa(x64, y64, metric, compare)
            try:
                rsatoolbox_rsa(x, y, metric, compare)  # warm-up
                tr = median_time(lambda: rsatoolbox_rsa(x, y, metric, compare), max(1, args.repeats // 2))
                if metric == "euclidean":  # a monotone map of our RDM: the same Spearman value
                    assert abs(rsatoolbox_rsa(x64, y64, metric, compare) - ref) < 1e-9
            except ImportError:  # pragma: no cover - the bench extra
                tr = float("nan")
            rows.append((f"{metric} / {compare}", np.dtype(dtype).name, t, first - t, ts, tr, abs(v - ref)))

    cmd = "python -m benchmarks.bench_rsa" + (" --quick" if args.quick else "")
    lines = [
        "## Representational similarity analysis (RSA)",
        "",
        f"Command: `{cmd}`. n={n:,}, d={d} (two RDMs of {n * (n - 1) // 2:,} entries each, compared), "
        f"{platform.machine()}, {os.cpu_count()} CPU cores; JAX {jax.__version__}, backend "
        f"{jax.default_backend()}. Times in seconds, end to end from host arrays; ours is the public "
        "`similarity.rsa` with its eager input checks, warm (compile time apart).",
        "",
        "| RDM / comparison | dtype | funsim (s) | first-call extra (s) | SciPy pdist + stats (s) | SciPy / funsim "
        "| rsatoolbox (s) | rsatoolbox / funsim | abs(funsim - SciPy float64) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, dt, t, comp, ts, tr, err in rows:
        lines.append(f"| {case} | {dt} | {t:.3f} | {comp:.2f} | {ts:.3f} | {ts / t:.1f} | {tr:.3f} | {tr / t:.1f} "
                     f"| {err:.1e} |")
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
