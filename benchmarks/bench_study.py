"""Throughput of the similarity study's batched grid against a Python loop over the pairwise functions.

Run::

    funsim zoo --config default                  # or --config smoke (then pass --zoo results/zoo/smoke)
    python -m benchmarks.bench_study             # 6 models of results/zoo/default (mnist5k)
    python -m benchmarks.bench_study --quick     # 3 models, the smoke zoo's sizes

The subset: ``--models`` models spread evenly over one data set of a trained zoo (zoo order),
their layers reduced as the default study does (``spatial_mean`` for conv
maps) on ``--rows`` rows. Both sides compute the default study's measures
(:data:`experiments.similarity_study.CONFIGS` ``["default"]``: linear and
debiased CKA, RSA, SVCCA, Procrustes, and the three reconstruction scores held
out and in sample) for every layer pair of two different models, both
directions for the directed measures:

* **batched**: one :func:`similarity.compare_grid` call over all layers (as
  the study does it), first call (compiles) and warm;
* **loop**: ``similarity.measure(name)(x, y)`` (and ``(y, x)``) for every
  pair and measure, first pass (compiles per shape) and warm pass.

Throughput is layer-pair comparisons per second: unordered layer pairs of two
different models, each with every measure in both directions.
"""

from __future__ import annotations

import argparse
import os

import jax
import numpy as np

from benchmarks._timing import timed


def _reps(zoo_dir, dataset, n_models, rows):
    import funsim.models as models_lib
    from funsim.experiments import zoo as zoo_lib

    zoo = zoo_lib.load_zoo(zoo_dir, datasets=(dataset,))
    every = zoo.by_dataset(dataset)
    ms = [every[int(k)] for k in np.unique(np.linspace(0, len(every) - 1, n_models).round())]  # spread over architectures
    ds = zoo_lib.load_zoo_data(zoo_dir, dataset).dataset
    x = np.concatenate([ds.x_test, ds.x_train])[:rows]  # the study's rows: the test rows first, then training rows
    reps, owner = {}, {}
    for m in ms:
        feats = models_lib.compiled(m.model, chunk=1000).features(x, as_numpy=True)
        for layer, z in models_lib.flatten_features(feats, policy="spatial_mean").items():
            reps[f"{m.id}:{layer}"] = np.asarray(z, np.float32)
            owner[f"{m.id}:{layer}"] = m.id
    return ms, reps, owner


def _measures():
    from funsim.experiments import similarity_study as S

    cfg = S.CONFIGS["default"]
    return list(cfg.measures) + list(S.stitch_measure_names(cfg)), cfg


def _batched(reps, measures, cfg):
    from funsim import similarity
    g = similarity.compare_grid(reps, reps, measures=measures, split=cfg.split, key=jax.random.key(cfg.seed))
    return jax.block_until_ready(g.tables)


def _loop(reps, owner, measures):
    from funsim import similarity
    names = list(reps)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if owner[a] == owner[b]:
                continue
            for name in measures:
                m = similarity.measure(name)
                out.append(m(reps[a], reps[b]))
                if not m.symmetric:
                    out.append(m(reps[b], reps[a]))
    return jax.block_until_ready(out)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", default="results/zoo/default")
    p.add_argument("--dataset", default="mnist5k")
    p.add_argument("--models", type=int, default=6)
    p.add_argument("--rows", type=int, default=500)
    p.add_argument("--quick", action="store_true", help="3 models, 96 rows")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.rows = 3, 96
    ms, reps, owner = _reps(args.zoo, args.dataset, args.models, args.rows)
    measures, cfg = _measures()
    sizes = [sum(1 for v in owner.values() if v == m.id) for m in ms]
    pairs = (sum(sizes) ** 2 - sum(s * s for s in sizes)) // 2
    (tables, b_first), (_, b_warm) = timed(_batched, reps, measures, cfg), timed(_batched, reps, measures, cfg)
    (vals, l_first), (_, l_warm) = timed(_loop, reps, owner, measures), timed(_loop, reps, owner, measures)
    from funsim import similarity
    # the loop's values agree with the grid's (same measure, same pair)
    names = list(reps)
    a, b = next((x, y) for x in names for y in names if owner[x] != owner[y])
    i, j = names.index(a), names.index(b)
    dev = max(abs(float(tables[m][i, j]) - float(similarity.measure(m)(reps[a], reps[b]))) for m in measures)
    load = os.getloadavg()[0]
    lines = [
        f"Study subset: {len(ms)} models of {args.dataset} ({', '.join(m.id.split('/')[1] for m in ms)}), "
        f"{len(reps)} layers, {pairs} layer pairs of different models, {args.rows} rows, {len(measures)} measures "
        f"({', '.join(measures)}); JAX {jax.__version__}, {jax.default_backend()}, load average {load:.1f}; "
        f"max |grid - pairwise| on one pair = {dev:.1e} ({len(vals)} loop values).",
        "",
        "| implementation | first call (s) | warm (s) | layer-pair comparisons / s (warm) | loop / batched (warm) |",
        "|---|---:|---:|---:|---:|",
        f"| batched: one `compare_grid` call (the study) | {b_first:.2f} | {b_warm:.2f} | {pairs / b_warm:.1f} | 1.0 |",
        f"| Python loop over `similarity.measure(name)(x, y)` | {l_first:.2f} | {l_warm:.2f} | {pairs / l_warm:.1f} | "
        f"{l_warm / b_warm:.1f} |",
    ]
    text = "\n".join(lines)
    print(text)
    return text

if __name__ == "__main__":
    main()
