"""Checkpoint x checkpoint matrices: one call for all output slices, and the baselines in one call.

Run: ``python -m benchmarks.bench_checkpoint_similarity [--quick]``. Prints and
returns a Markdown report. float32 checkpoints of the forgetting experiment's
model (embedding -> one bilinear layer -> head, no biases), each a perturbed
copy of the previous one. Timings are steady state (median of warm calls); the
first call (compile + run) is reported separately. References:

* tensor similarity with its per-class slices: ``similarity_matrix`` for the
  whole network plus one ``similarity_matrix(outputs=[c])`` per class (each slice
  recomputes the hidden-unit kernel), against
  ``similarity.checkpoints.tensor_matrices``, which vmaps the slices so
  the kernel is computed once per pair;
* the baselines (behavioural similarity, linear CKA of the logits, matrix
  cosine): a loop over the ``n(n-1)/2`` pairs of the pairwise ``similarity``
  functions, against one call each over all checkpoints.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._timing import first_and_warm, fmt_seconds
from funsim import similarity
from funsim.similarity import checkpoints as cs


def _checkpoints(n, d, m, h, o, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s) / np.sqrt(s[-1]), jnp.float32)
    net = (similarity.LinearLayer(f(m, d)), similarity.BilinearLayer(f(h, m), f(h, m), f(m, h)), similarity.LinearLayer(f(o, m)))
    nets = [net]
    for _ in range(n - 1):
        nets.append(jax.tree.map(lambda a: a + 0.1 * jnp.asarray(rng.normal(size=a.shape), a.dtype) * jnp.std(a), nets[-1]))
    return nets


def bench_slices(n, sizes, rows):
    d, m, h, o = sizes
    nets = _checkpoints(n, d, m, h, o)
    stacked = cs.stack_networks(nets)
    first, ours = first_and_warm(lambda: cs.tensor_matrices(stacked, metrics=["gaussian"]), repeats=3)

    def loop():
        full = similarity.similarity_matrix(stacked)
        return [full] + [similarity.similarity_matrix(stacked, outputs=[c]) for c in range(o)]

    first_ref, ref = first_and_warm(loop, repeats=1)
    mine = cs.tensor_matrices(stacked, metrics=["gaussian"])
    got = loop()
    err = max(np.abs(mine["tensor/gaussian"] - np.asarray(got[0])).max(),
              *(np.abs(mine["tensor/gaussian/outputs"][c] - np.asarray(got[c + 1])).max() for c in range(o)))
    rows.append(f"| tensor similarity + {o} class slices, {n} checkpoints (d={d}, embed {m}, h={h}, o={o}) | "
                f"{fmt_seconds(ours)} (first call {fmt_seconds(first)}) | {o + 1} similarity_matrix calls: {fmt_seconds(ref)} "
                f"(first {fmt_seconds(first_ref)}; {ref / ours:.1f}x) | max abs difference {err:.1e} |")


def bench_baselines(n, sizes, n_inputs, rows):
    d, m, h, o = sizes
    nets = _checkpoints(n, d, m, h, o, seed=1)
    stacked = cs.stack_networks(nets)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(n_inputs, d)), jnp.float32)

    def ours_fn():
        y = cs.network_outputs(stacked, x)
        return cs.behavioural_matrix(y), cs.cka_matrix(y), cs.weight_cosine_matrix(stacked)

    first, ours = first_and_warm(ours_fn, repeats=3)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]

    def loop():
        out = []
        for i, j in pairs:
            out.append(similarity.behavioral_similarity(nets[i], nets[j], x))
            out.append(similarity.cka(similarity.apply_network(nets[i], x), similarity.apply_network(nets[j], x)))
            out.append(similarity.weight_cosine(nets[i], nets[j]))
        return out

    first_ref, ref = first_and_warm(loop, repeats=1)
    b, k, w = ours_fn()
    got = loop()
    i, j = pairs[-1]
    err = max(abs(b[i, j] - float(got[-3])), abs(k[i, j] - float(got[-2])), abs(w[i, j] - float(got[-1])))
    rows.append(f"| behavioural + CKA of the logits + matrix cosine, {n} checkpoints, {n_inputs} inputs | "
                f"{fmt_seconds(ours)} (first call {fmt_seconds(first)}) | loop over {len(pairs)} pairs of the pairwise functions: "
                f"{fmt_seconds(ref)} ({ref / ours:.0f}x) | last pair's difference {err:.1e} |")


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args(argv)
    rows = []
    if args.quick:
        bench_slices(6, (16, 8, 8, 10), rows)
        bench_baselines(6, (16, 8, 8, 10), 50, rows)
    else:
        bench_slices(24, (784, 128, 256, 10), rows)
        bench_baselines(24, (784, 128, 256, 10), 1000, rows)
    dev = jax.devices()[0]
    header = [
        f"Checkpoint-similarity benchmark ({'quick' if args.quick else 'full'} sizes), float32, "
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
