"""Model evaluation in the drivers: compiled feature extraction and vmapped stitched logits, against the eager paths.

Run: ``python -m benchmarks.bench_models [--quick] [--rounds R]``. Prints and returns a Markdown report.

* **Feature extraction**: ``models.compiled(model).features(x)`` (one jitted
  program per architecture, chunks of 1,024 rows) against ``model.features(x)``
  run eagerly in chunks of 1,000 rows (what the similarity study, the quickstart
  and the drivers did), for three default-zoo architectures on mnist5k rows.
* **Stitched evaluation**: ``similarity.stitched_logits`` (what the similarity
  study calls: one compiled ``lax.map`` over K stitchers, M = 2 stacked tails unrolled)
  against the loop it replaced (kept below: per stitcher and tail, an eager
  ``nnx.merge``, tail and host copy), K = 8 sources of different widths into a
  dense and a conv layer of the default zoo's CNN.

Times are warm (each path run once before timing), the minimum over rounds that
alternate the two paths in one process, as wall time and as the process's CPU
time; the largest difference between the two outputs is reported beside them.
"""

from __future__ import annotations

import argparse
import os

import jax
import numpy as np
from flax import nnx

from benchmarks._timing import alternating


def _eager_features(model, x, batch=1000):
    parts = [model.features(x[i:i + batch]) for i in range(0, len(x), batch)]
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}


def bench_features(quick: bool, rounds: int) -> list[str]:
    from funsim import data, models

    ds = data.load("digits" if quick else "mnist5k")
    x = ds.x_train[: 300 if quick else 2000]
    archs = {
        "MLP 256/256/256": lambda: models.MLP(ds.input_shape, 10, widths=(256, 256, 256), rngs=nnx.Rngs(0)),
        "CNN 16/32/64": lambda: models.CNN(ds.input_shape, 10, channels=(16, 32, 64), rngs=nnx.Rngs(0)),
        "ResNet-8 (width 8)": lambda: models.ResNet(ds.input_shape, 10, depth=8, width=8, rngs=nnx.Rngs(0)),
    }
    lines = [f"Feature extraction of every layer, {len(x):,} rows of {ds.name}, float32:", "",
             "| model | eager `model.features` (s, wall) | `models.compiled(model).features` (s, wall) | eager / compiled (wall) | eager / compiled (CPU time) | max abs diff |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, make in archs.items():
        m = make()
        fast = models.compiled(m)
        fns = {"eager": lambda: _eager_features(m, x), "compiled": lambda: fast.features(x, as_numpy=True)}
        a, b = fns["eager"](), fns["compiled"]()
        diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
        t = alternating(fns, rounds)
        (we, ce), (wc, cc) = t["eager"], t["compiled"]
        lines.append(f"| {name} | {we:.3f} | {wc:.3f} | {we / wc:.1f}x | {ce / cc:.1f}x | {diff:.1e} |")
    return lines


def _loop_stitched_logits(tail, tail_params, stitchers, z_test, target_shape):
    """The similarity study's stitched evaluation before it was compiled (the reference)."""
    import jax.numpy as jnp

    from funsim import similarity
    spatial = tuple(target_shape[:2]) if len(target_shape) == 3 else None
    out = []
    for st, z in zip(stitchers, z_test):
        z = z if spatial is not None else z.reshape(z.shape[0], -1)
        per_tail = []
        for mi in range(st.weight.shape[0]):
            s = jax.tree.map(lambda a: a[mi], st)
            params = jax.tree.map(lambda a: a[mi], tail_params)
            per_tail.append(np.asarray(tail(params, similarity.stitch_representation(s, jnp.asarray(z), spatial=spatial))))
        out.append(np.stack(per_tail))
    return np.stack(out)


def bench_stitched(quick: bool, rounds: int) -> list[str]:
    from funsim import models, similarity

    rng = np.random.default_rng(0)
    n, k = (200, 4) if quick else (1000, 8)
    shape = (8, 8, 1) if quick else (28, 28, 1)
    targets = [models.CNN(shape, 10, channels=(16, 32, 64), rngs=nnx.Rngs(s)) for s in (0, 1)]
    fshapes = targets[0].feature_shapes()
    lines = [f"Stitched evaluation: K = {k} stitchers (sources of different widths) into M = 2 stacked CNN tails, "
             f"{n:,} held-out rows, float32:", "",
             "| target layer | loop: eager tail per stitcher and model (s, wall) | one compiled map (s, wall) | loop / compiled (wall) | loop / compiled (CPU time) | max abs diff |",
             "|---|---:|---:|---:|---:|---:|"]
    for layer in ("pool", "conv1"):
        tshape = fshapes[layer]
        if len(tshape) == 3:
            srcs = [rng.normal(size=(n, *tshape[:2], c)).astype(np.float32) for c in rng.integers(8, 64, size=k)]
        else:
            srcs = [rng.normal(size=(n, int(d))).astype(np.float32) for d in rng.integers(16, 256, size=k)]
        t = tshape[-1]
        st = [similarity.Stitcher(rng.normal(size=(2, z.shape[-1], t)).astype(np.float32) / np.sqrt(z.shape[-1]),
                                  np.zeros((2, t), np.float32), np.ones((2,), np.float32), "affine") for z in srcs]
        tail, params = models.stack_tails(targets, layer)
        fns = {"loop": lambda: _loop_stitched_logits(tail, params, st, srcs, tshape),
               "compiled": lambda: similarity.stitched_logits(tail, params, st, srcs, tshape)}
        a, b = fns["loop"](), fns["compiled"]()
        diff = float(np.max(np.abs(a - b)))
        tm = alternating(fns, rounds)
        (wl, cl), (wc, cc) = tm["loop"], tm["compiled"]
        lines.append(f"| {layer} {tshape} | {wl:.3f} | {wc:.3f} | {wl / wc:.1f}x | {cl / cc:.1f}x | {diff:.1e} |")
    return lines


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5, --quick 2)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    load = os.getloadavg()
    lines = ["## Model evaluation: compiled features and stitched logits vs the eager paths", "",
             f"Command: `python -m benchmarks.bench_models{' --quick' if args.quick else ''}`; load average at start "
             f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; {rounds} alternating rounds, minimum of each, warm.", ""]
    lines += bench_features(args.quick, rounds) + [""] + bench_stitched(args.quick, rounds)
    load = os.getloadavg()
    lines += ["", f"Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}."]
    text = "\n".join(lines) + "\n"
    print(text)
    return text


if __name__ == "__main__":
    main()
