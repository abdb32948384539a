"""The study report's statistics: the permutation null of R^2 against SciPy and a vmapped JAX shuffle.

Run::

    python -m benchmarks.bench_stats            # full sizes
    python -m benchmarks.bench_stats --quick    # tiny sizes, seconds

The report (``funsim report usable-information``) draws a permutation null of R^2 (2,000
permutations) for every measure, family and split of claim 3: 42 nulls on a 14-model run.
``similarity.statistics.permutation_test`` shuffles on the host (NumPy's Fisher-Yates, a chunk
of permutations at a time) and forms every permuted R^2 with one product per chunk. It runs
side by side with ``scipy.stats.permutation_test`` (``permutation_type="pairings"``, a
vectorised statistic) and with the formulation it replaced: ``jax.random.permutation`` vmapped
over the permutations, jit-compiled (its shuffle is a sort, two rounds at these sizes). Each
time is the median of warm calls; the compiled one's first call is apart.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from benchmarks._timing import first_and_warm


def _jax_vmapped():
    from funsim.similarity.statistics import r2

    return jax.jit(lambda x, y, keys: jax.vmap(lambda k: r2(x, jax.random.permutation(k, y)))(keys))


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import scipy.stats

    from funsim.similarity import statistics as st

    n, perms, reps = (300, 200, 2) if args.quick else (3328, 2000, 5)
    r = np.random.default_rng(0)
    x = r.normal(size=n)
    y = 0.5 * x + r.normal(size=n)
    key = jax.random.key(0)

    def r2_stat(yy, axis=-1):  # SciPy's vectorised statistic: R^2 of x against each permuted y
        xs = (x - x.mean()) / x.std()
        ys = (yy - yy.mean(axis=axis, keepdims=True)) / yy.std(axis=axis, keepdims=True)
        return np.mean(xs * ys, axis=axis) ** 2

    ours = lambda: st.permutation_test(x, y, key=key, n_permutations=perms)  # noqa: E731
    sci = lambda: scipy.stats.permutation_test((y,), r2_stat, permutation_type="pairings", vectorized=True,  # noqa: E731
                                               n_resamples=perms, alternative="greater",
                                               random_state=np.random.default_rng(1))
    vm = _jax_vmapped()
    keys = jax.random.split(key, perms)
    with jax.enable_x64(True):
        xj, yj = jax.numpy.asarray(x), jax.numpy.asarray(y)
        first_vm, t_vm = first_and_warm(lambda: vm(xj, yj, keys), reps)
        null_vm = np.asarray(vm(xj, yj, keys))
    _, t_ours = first_and_warm(ours, reps)
    _, t_sci = first_and_warm(sci, reps)
    res, ref = ours(), sci()
    exact = 1 / (n - 1)  # the permutation distribution's mean of r^2
    lines = [f"**The permutation null of R^2** (n = {n} pairs, {perms} permutations, float64; the null's mean: "
             f"ours {res.null_mean:.3g}, SciPy {np.mean(ref.null_distribution):.3g}, vmapped JAX "
             f"{null_vm.mean():.3g}, exact 1/(n-1) = {exact:.3g}; p-values: ours {res.p_value:.4g}, "
             f"SciPy {ref.pvalue:.4g}).", "",
             "| implementation | warm (s) | its time over ours |", "|---|---|---|",
             f"| funsim `permutation_test` (NumPy shuffle on the host) | {t_ours:.4f} | 1.00 |",
             f"| `scipy.stats.permutation_test` (pairings, vectorised) | {t_sci:.4f} | {t_sci / t_ours:.1f} |",
             f"| `jax.random.permutation` vmapped, jit (the former formulation; first call {first_vm:.2f} s) | "
             f"{t_vm:.4f} | {t_vm / t_ours:.1f} |", ""]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
