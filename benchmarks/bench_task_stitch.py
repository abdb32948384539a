"""Benchmark: K task-loss stitchers into one target layer, vmapped vs one by one.

Run: ``python -m benchmarks.bench_task_stitch [--quick]``.

Setup: a frozen target "tail" (d_tgt -> 64 tanh -> 10 logits) and K = 16
different sources (each a random linear view of a shared latent plus noise),
trained with the task cross-entropy, Adam, minibatches. ``train_stitchers``
trains all K in one vmapped, jitted ``lax.scan`` loop; the baseline calls
``train_stitcher`` K times (same shapes, so it compiles once and reuses the
compiled loop). Compile time (first call minus a warm call) is reported
separately from steady-state time (median of warm calls, results blocked).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from similarity import train_stitcher, train_stitchers


def _problem(k, n, d, seed=0):
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, d))
    w1, w2 = rng.normal(size=(d, 64)) / np.sqrt(d), rng.normal(size=(64, 10)) / 8.0
    tail_w1, tail_w2 = jnp.asarray(w1, jnp.float32), jnp.asarray(w2, jnp.float32)

    def tail(h):
        return jnp.tanh(h @ tail_w1) @ tail_w2

    y = np.asarray(jnp.argmax(tail(jnp.asarray(latent, jnp.float32)), axis=1)).astype(np.int32)
    srcs = [
        jnp.asarray(latent @ rng.normal(size=(d, d)) / np.sqrt(d) + 0.1 * rng.normal(size=(n, d)),
                    jnp.float32)
        for _ in range(k)
    ]
    return srcs, jnp.asarray(y), tail


def _timed(fn, repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        warm.append(time.perf_counter() - t0)
    med = statistics.median(warm)
    return first, med


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args(argv)
    k = 16
    if args.quick:
        configs, steps, repeats = [(256, 8, 32), (256, 16, 64)], 40, 1
    else:
        configs, steps, repeats = [(512, 8, 32), (2048, 32, 128)], 300, 2
    rows = []
    for (n, d, batch), family in itertools.product(configs, ("affine", "orthogonal")):
        srcs, y, tail = _problem(k, n, d)
        kw = dict(init="random", target_shape=(d,), steps=steps, batch_size=batch,
                  eval_every=100, progress=False)
        keys = jax.random.split(jax.random.key(0), k)

        def batched():
            sts, _ = train_stitchers(srcs, y, tail, families=family, keys=keys, **kw)
            return [s.weight for s in sts]

        def sequential():
            return [train_stitcher(s, y, tail, family=family, key=kk, **kw)[0].weight
                    for s, kk in zip(srcs, keys)]

        b_first, b_warm = _timed(batched, repeats)
        s_first, s_warm = _timed(sequential, repeats)
        # sanity: the two agree (float32 rounding only)
        err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(batched(), sequential()))
        rows.append((f"{n} / {d} / {batch}", family, b_warm, s_warm, s_warm / b_warm,
                     b_first - b_warm, s_first - s_warm, err))
    head = (
        f"K={k} stitchers into one target layer, {steps} Adam steps each, float32, "
        f"{jax.devices()[0].platform.upper()} ({jax.device_count()} device)\n\n"
        "| n / d_src=d_tgt / batch | family | vmapped (s) | sequential (s) | speed-up "
        "| compile vmapped (s) | compile sequential (s) | max abs diff |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {c} | {f} | {b:.3f} | {s:.3f} | {r:.1f}x | {cb:.2f} | {cs:.2f} | {e:.1e} |\n"
        for c, f, b, s, r, cb, cs, e in rows
    )
    table = head + body
    print(table)
    return table


if __name__ == "__main__":
    main()
