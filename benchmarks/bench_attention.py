"""Bilinear-attention similarity: the exact and closure methods against Monte Carlo.

Run: ``python -m benchmarks.bench_attention [--quick]``. Prints and returns a
Markdown report. float32 on the default JAX device, at the size of the
``language`` experiment's default model (V = 97 characters, d = 64, 8 heads of
8, a context of 4 positions, token-space scale 1/sqrt(V)). Our timings are
steady state (median of warm calls, ``block_until_ready``); the first call
(compile + run) is reported separately.

Reference: our jitted Monte Carlo (``attention_monte_carlo_inner``), the only
independent estimator at this size, with the number of samples that gives a 1%
relative standard error (from a pilot run), for a "near" checkpoint
(``b = a + 0.3 noise``) and a "far" one (``b = a + 1.0 noise``). The authors'
implementation (PyTorch + quimb/cotengra tensor networks, CUDA graphs) is not
installable here, so it is not timed.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from benchmarks._timing import first_and_warm, fmt_seconds
from funsim.similarity import (
    AttentionLayer,
    AttentionNetwork,
    attention_inner,
    attention_monte_carlo_inner,
    attention_similarity,
    attention_similarity_matrix,
)


def _net(rng, vocab, d, heads, e, depth, *, like=None, noise=0.3):
    """A float32 network at the BilinearTransformer's initial scales; ``like`` gives a perturbed copy."""

    def f(path, shape, scale):
        base = scale * rng.normal(size=shape)
        if like is not None:
            ref = like
            for p in path:
                ref = ref[p] if isinstance(p, int) else getattr(ref, p)
            base = np.asarray(ref) + noise * base
        return np.asarray(base, np.float32)

    s = d**-0.5
    layers = tuple(
        AttentionLayer(*(f(("layers", i, n), (heads, e, d), s) for n in ("q1", "k1", "q2", "k2", "v")),
                       f(("layers", i, "o"), (d, heads, e), 0.5 / np.sqrt(heads * e)))
        for i in range(depth)
    )
    return AttentionNetwork(f(("embed",), (vocab, d), 1.0), layers, f(("unembed",), (vocab, d), s),
                            f(("pos_embed",), (8, d), 0.1))


def _mc_to_1pct(a, b, context, scale, cap):
    """Samples for a 1% relative SE (from a pilot), and their warm time (extrapolated beyond ``cap``)."""
    pilot, se = attention_monte_carlo_inner(a, b, context=context, scale=scale, n_samples=4096, key=jax.random.key(1))
    n = int(np.ceil(4096 * (float(se) / (0.01 * abs(float(pilot)))) ** 2))
    m = min(n, cap)
    fn = lambda: attention_monte_carlo_inner(a, b, context=context, scale=scale, n_samples=m, key=jax.random.key(2))
    _, warm = first_and_warm(fn, repeats=2)
    est, se = fn()
    note = f"SE {float(se) / abs(float(est)):.2%}" if m == n else f"timed {m}, extrapolated"
    return n, warm * n / m, note


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args(argv)
    vocab, d, heads, e, context, n_ckpt, cap = (97, 64, 8, 8, 4, 21, 2_000_000)
    if args.quick:
        vocab, d, heads, e, context, n_ckpt, cap = (11, 8, 2, 4, 2, 4, 50_000)
    scale = vocab**-0.5
    rng = np.random.default_rng(0)
    rows = []
    for depth, method in ((1, "exact"), (2, "closure")):
        a = _net(rng, vocab, d, heads, e, depth)
        near = _net(rng, vocab, d, heads, e, depth, like=a, noise=0.3)
        far = _net(rng, vocab, d, heads, e, depth, like=a, noise=1.0)
        first, warm = first_and_warm(lambda: attention_inner(a, near, context=context, method=method, scale=scale))
        refs = []
        for name, b in (("near", near), ("far", far)):
            n, t, note = _mc_to_1pct(a, b, context, scale, cap)
            refs.append(f"MC 1%, {name} checkpoint: {n} samples ({note}) {fmt_seconds(t, 1)} ({t / warm:.2g}x)")
        est, se = attention_monte_carlo_inner(a, near, context=context, scale=scale, n_samples=200_000,
                                              key=jax.random.key(3))
        ours = float(attention_inner(a, near, context=context, method=method, scale=scale))
        check = f"abs(MC - ours) = {abs(float(est) - ours) / float(se):.1f} SE (200k samples)"
        rows.append(f"| {method}, {depth} layer{'s' if depth > 1 else ''} | {fmt_seconds(warm, 1)} (first call {fmt_seconds(first, 1)}) | "
                    f"{'; '.join(refs)} | {check} |")
    a = _net(rng, vocab, d, heads, e, 1)
    nets = [_net(rng, vocab, d, heads, e, 1, like=a, noise=0.1 * i) for i in range(n_ckpt)]
    first, warm = first_and_warm(lambda: attention_similarity_matrix(nets, context=context, scale=scale), repeats=1)
    one_first, one = first_and_warm(lambda: attention_similarity(nets[0], nets[1], context=context, scale=scale))
    pairs = n_ckpt * (n_ckpt - 1) // 2
    rows.append(f"| {n_ckpt}-checkpoint matrix, 1 layer exact | {fmt_seconds(warm, 1)} (first call {fmt_seconds(first, 1)}) | "
                f"{pairs} separate attention_similarity calls: {fmt_seconds(one, 1)} each, {fmt_seconds(one * pairs, 1)} in all "
                f"({one * pairs / warm:.1f}x) | |")
    head = [
        f"Bilinear-attention similarity benchmark ({'quick' if args.quick else 'full'} sizes), float32, "
        f"JAX {jax.__version__} on {jax.devices()[0].platform}: V={vocab}, d={d}, {heads} heads of {e}, "
        f"context {context}, scale 1/sqrt(V).",
        "",
        "| case | ours (steady state) | reference (ratio = reference / ours) | check |",
        "|---|---|---|---|",
    ]
    report = "\n".join(head + rows) + "\n"
    print(report)
    return report


if __name__ == "__main__":
    main()
