"""The comparison grid vs a Python loop over pairs, and an all-pairs linear-CKA grid vs NumPy and ckatorch.

Run::

    python -m benchmarks.bench_grid            # full sizes
    python -m benchmarks.bench_grid --quick    # tiny sizes, seconds
    python -m benchmarks.bench_grid --only cka --rounds 5   # one part

On a shared machine, pin both sides to one thread so that neither JAX's nor
OpenBLAS's thread pool is starved by other jobs (OpenBLAS's spinning threads
collapse under oversubscription), and read the CPU-time ratio::

    OPENBLAS_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
        python -m benchmarks.bench_grid --only cka --rounds 5

Part 1: ``similarity.compare_grid`` over 12 x 12 layers with the moment
measures (the three stitching families held out and in sample, with
``reverse=True`` for both directions, linear CKA, NBS, Procrustes) against a
Python loop that calls the public pairwise functions (``reconstruction_score``
both ways, ``measure(name)``) on every pair; then the same for the other
measures (debiased CKA, CCA, SVCCA, PWCCA, regression, RSA).

Part 2: all-pairs linear CKA over 12 x 12 layers of ``(5000, 256)`` float32
activations: ``compare_grid(measures=["cka/linear"])`` against a NumPy loop
over pairs (feature-space formula, centring inside the loop) and against
``ckatorch.cka_base`` (Gram form, float64, as that library does it) on a few
pairs, extrapolated to the 144 pairs (stated in the table). Ours and the NumPy
loop run in alternating rounds; each is the minimum over the rounds, in wall
time and in CPU time (``time.process_time``, which a loaded machine does not inflate).

Part 3: compilations for a second architecture pair. A grid of one pair of
architectures, then a grid of another pair whose layer widths and counts fall in
the same size buckets: the programs the second call compiles (``jax.monitoring``
events) and its time, with the size buckets and without (``buckets=False``).

Part 4: layers wider than the rows (4 x 4 layers of 2,048 down to 256 features on
600 rows), the moment measures in the rows' span against the layers' own features
(``buckets=False``).

Part 5: RDMs over the memory budget. RSA on many rows keeps an ``n x n`` RDM per
layer; when all of them exceed ``stats_budget`` the grid computes them a block of
layers at a time. The same grid with every RDM in memory, in blocks of 4 layers,
and once per pair (a budget below one layer per side).

Part 6: a study-like square grid over the budget: one side with itself (every
layer of every model against every other), layers of mixed widths in two width
groups, RSA. Blocks of RDMs span the width groups, and each pair of blocks is held
once for both orders of its pairs; every RDM in memory against blocks of 4 layers.

Part 7: symmetric measures of one side with itself (a study's square grid): the
grid computes each unordered pair once and mirrors it. SVCCA, debiased linear CKA,
RBF CKA and RSA over 24 layers of mixed widths, the square call
``compare_grid(layers)`` against the same layers passed as two sides
(``compare_grid(layers, list(layers))``: every ordered pair, and each layer's
statistics once per side); and a study's moment measures (every ordered pair either
way: the square call shares only the per-layer moments).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import jax
import numpy as np

import funsim.similarity as sim
from benchmarks._timing import alternating, first_and_warm, timed
from funsim.runtime.compile_count import CompileCounter
from funsim.similarity.grid import compare_grid

GRID_MEASURES = [
    "stitch/affine",
    "stitch/affine/in_sample",
    "stitch/scaled_orthogonal",
    "stitch/scaled_orthogonal/in_sample",
    "stitch/orthogonal",
    "stitch/orthogonal/in_sample",
    "cka/linear",
    "nbs",
    "procrustes",
]
# Measures without shared per-layer moments: the grid maps them over the pairs
# of each width group inside one compiled program (timed in their own table).
GENERIC_MEASURES = [
    "cka/linear/debiased",
    "cca/mean",
    "svcca",
    "pwcca",
    "regression/r2",
    "rsa/correlation/pearson",
]


def _pair_loop(a, b, measures=GRID_MEASURES):
    out = []
    for x in a:
        for y in b:
            for m in measures:
                if m.endswith("/in_sample"):
                    continue  # reconstruction_score returns both figures
                if m.startswith("stitch/"):
                    fam = m.split("/")[1]
                    out.append(sim.reconstruction_score(x, y, family=fam))
                    out.append(sim.reconstruction_score(y, x, family=fam))
                else:
                    out.append(sim.measure(m)(x, y))
    return out


def _numpy_cka_loop(a, b):
    out = np.empty((len(a), len(b)))
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            xc, yc = x - x.mean(0), y - y.mean(0)
            num = np.sum((yc.T @ xc) ** 2)
            out[i, j] = num / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    return out


def _architectures(r, n, widths, dtype=np.float32):
    base = r.normal(size=(n, 8))
    return [np.tanh(base @ r.normal(size=(8, d)) + 0.5 * r.normal(size=(n, d))).astype(dtype) for d in widths]


def _buckets_part(r, quick: bool) -> list[str]:
    """Part 3: what a second architecture pair of the same size buckets compiles."""
    n = 200 if quick else 1000
    # widths of model A's and model B's layers; the second pair has other widths and 6 instead of 5
    # layers in A's 64-wide bucket, all in the same buckets
    first = [(60, 64, 64, 62, 58, 120, 10), (64, 64, 128, 10)]
    second = [(56, 64, 64, 60, 52, 50, 128, 11), (60, 60, 100, 12)]
    measures = GRID_MEASURES[:2] + GRID_MEASURES[4:]  # held-out and in-sample stitching, CKA, NBS, Procrustes
    rows = []
    for buckets in (True, False):
        _say(f"part 3: buckets={buckets}: first pair, then a second pair")
        a1, b1 = (_architectures(r, n, w) for w in first)
        a2, b2 = (_architectures(r, n, w) for w in second)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with CompileCounter() as c1:
                _, t1 = timed(lambda: compare_grid(a1, b1, measures=measures, reverse=True, buckets=buckets))
            with CompileCounter() as c2:
                _, t2 = timed(lambda: compare_grid(a2, b2, measures=measures, reverse=True, buckets=buckets))
        rows.append(f"| buckets={buckets} | {c1.lowered} programs, {t1:.1f} s | **{c2.lowered} programs**, "
                    f"{c2.seconds:.1f} s compiling, {t2:.1f} s in all |")
    return [
        f"**A second architecture pair** (n = {n}; layer widths {list(map(list, first))}, then "
        f"{list(map(list, second))}: other widths and layer counts, the same buckets; measures: "
        f"{', '.join(measures)}, reverse=True).",
        "",
        "| | first pair: compiled, wall time | second pair: compiled, compile time, wall time |",
        "|---|---|---|",
        *rows,
        "",
    ]


def _say(msg: str) -> None:
    """Progress on stderr (the full-size run takes minutes; the table prints at the end)."""
    print(f"[bench_grid {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("all", "grid", "cka", "buckets", "wide", "blocks", "square", "symmetric"),
                    default="all", help="grid: part 1; cka: part 2; buckets: part 3; wide: part 4; blocks: part 5; "
                                        "square: part 6; symmetric: part 7")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds in part 2")
    args = ap.parse_args(argv)
    r = np.random.default_rng(0)
    if args.quick:
        L, n, widths, n2, d2, reps, ck_pairs = 3, 200, (16, 32), 300, 32, 2, 1
    else:
        L, n, widths, n2, d2, reps, ck_pairs = 12, 2000, (64, 128), 5000, 256, 3, 2
    dev = jax.devices()[0]
    lines = [f"Device: {dev.platform} ({len(jax.devices())} device(s)); float32 activations.", ""]
    if args.only in ("all", "grid"):
        lines += _grid_part(r, L, n, widths, reps)
    if args.only in ("all", "cka"):
        lines += _cka_part(r, L, n2, d2, reps, ck_pairs, args.rounds)
    if args.only in ("all", "buckets"):
        lines += _buckets_part(r, args.quick)
    if args.only in ("all", "wide"):
        lines += _wide_part(r, args.quick)
    if args.only in ("all", "blocks"):
        lines += _blocks_part(r, args.quick)
    if args.only in ("all", "square"):
        lines += _square_part(r, args.quick)
    if args.only in ("all", "symmetric"):
        lines += _symmetric_part(r, args.quick)
    table = "\n".join(lines)
    print(table)
    return table


def _grid_part(r, L, n, widths, reps) -> list[str]:
    lines = []

    # Part 1: every measure, grid vs loop over pairs.
    a = [jax.device_put(r.normal(size=(n, widths[k % len(widths)])).astype(np.float32)) for k in range(L)]
    b = [jax.device_put(np.tanh(x[:, : widths[0]] @ r.normal(size=(widths[0], widths[(k + 1) % len(widths)]))).astype(np.float32)) for k, x in enumerate(a)]
    _say(f"part 1: {L} x {L} grid, n = {n}, moment measures: compare_grid ({reps} warm calls)")
    first, ours = first_and_warm(lambda: compare_grid(a, b, measures=GRID_MEASURES, reverse=True), reps)
    _say(f"part 1: {ours:.2f} s warm; the loop over pairwise functions (compiling, then one timed pass)")
    jax.block_until_ready(_pair_loop(a, b))  # compile every pair shape once
    _, loop = first_and_warm(lambda: _pair_loop(a, b), 1)
    lines += [
        f"**Grid of {L} x {L} layers, n = {n}, widths {list(widths)}, measures: "
        f"{', '.join(GRID_MEASURES)} (reverse=True: stitching in both directions).**",
        "",
        "| | ours: compare_grid (s, warm) | compile (s) | loop over pairwise functions (s, warm) | speed-up |",
        "|---|---|---|---|---|",
        f"| moment measures | {ours:.2f} | {first - ours:.1f} | {loop:.2f} | **{loop / ours:.1f}x** |",
    ]
    _say(f"part 1: {loop:.2f} s; other measures: compare_grid")
    gfirst, gours = first_and_warm(lambda: compare_grid(a, b, measures=GENERIC_MEASURES).tables, 1)
    _say(f"part 1: {gours:.2f} s warm; other measures: the loop over pairwise functions")
    jax.block_until_ready(_pair_loop(a, b, GENERIC_MEASURES))
    _, gloop = first_and_warm(lambda: _pair_loop(a, b, GENERIC_MEASURES), 1)
    lines += [
        f"| other measures: {', '.join(GENERIC_MEASURES)} | {gours:.2f} | {gfirst - gours:.1f} | {gloop:.2f} "
        f"| **{gloop / gours:.1f}x** |",
        f"| everything above | {ours + gours:.2f} | {first - ours + gfirst - gours:.1f} | {loop + gloop:.2f} "
        f"| **{(loop + gloop) / (ours + gours):.1f}x** |",
        "",
    ]
    return lines


def _cka_part(r, L, n2, d2, reps, ck_pairs, rounds) -> list[str]:
    # Part 2: linear CKA grid.
    a2 = [r.normal(size=(n2, d2)).astype(np.float32) for _ in range(L)]
    b2 = [(x @ r.normal(size=(d2, d2)) * 0.1 + r.normal(size=(n2, d2))).astype(np.float32) for x in a2]
    a2j, b2j = [jax.device_put(x) for x in a2], [jax.device_put(x) for x in b2]
    _say(f"part 2: {L} x {L} linear-CKA grid of ({n2} x {d2}): compare_grid and the NumPy loop, {rounds} "
         "alternating rounds, then ckatorch")
    _, first2 = timed(lambda: compare_grid(a2j, b2j, measures=["cka/linear"]).tables)
    best = alternating({"ours": lambda: compare_grid(a2j, b2j, measures=["cka/linear"]).tables,
                         "numpy": lambda: _numpy_cka_loop(a2, b2)}, rounds)
    (ours2, ours_cpu), (np_loop, np_cpu) = best["ours"], best["numpy"]
    ref = _numpy_cka_loop(a2, b2)
    got = np.asarray(compare_grid(a2j, b2j, measures=["cka/linear"]).tables["cka/linear"])
    err = float(np.max(np.abs(got - ref)))
    rows2 = [
        f"| NumPy loop over pairs (float32) | {np_loop:.2f} (CPU {np_cpu:.2f}) | **{np_loop / ours2:.2f}x** "
        f"(CPU time: **{np_cpu / ours_cpu:.2f}x**) | measured, {L * L} pairs, min of {rounds} alternating rounds |",
    ]
    try:
        import ckatorch
        import torch

        torch.set_num_threads(max(1, torch.get_num_threads()))
        t0 = time.perf_counter()
        for k in range(ck_pairs):
            ckatorch.cka_base(torch.from_numpy(a2[k]), torch.from_numpy(b2[k]))
        per_pair = (time.perf_counter() - t0) / ck_pairs
        ck = per_pair * L * L
        rows2.append(
            f"| ckatorch.cka_base (Gram form, float64) | {ck:.0f} (extrapolated) | **{ck / ours2:.0f}x** "
            f"| {ck_pairs} pair(s) timed, {per_pair:.2f} s each, x {L * L} |"
        )
    except ImportError:  # pragma: no cover
        rows2.append("| ckatorch | not installed | | |")
    return [
        f"**All-pairs linear CKA, {L} x {L} layers of ({n2} x {d2}).** ours: {ours2:.3f} s warm "
        f"(CPU {ours_cpu:.3f} s), compile {first2 - ours2:.1f} s; max |ours - NumPy| = {err:.1e}.",
        "",
        "| reference | time (s) | ours is faster by | note |",
        "|---|---|---|---|",
        *rows2,
        "",
    ]


def _wide_part(r, quick: bool) -> list[str]:
    """Part 4: layers wider than the rows, in the rows' span against their own features."""
    n, widths = (60, (256, 128, 64, 32)) if quick else (600, (2048, 1024, 512, 256))
    a, b = (_architectures(r, n, widths) for _ in range(2))
    measures = GRID_MEASURES + ["stitch/affine/ridge=0.001", "stitch/affine/in_sample/ridge=0.001"]
    times = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fits of sources wider than the train rows are undefined
        for buckets in (True, False):
            _say(f"part 4: {len(widths)} x {len(widths)} layers {list(widths)} on n = {n} rows, buckets={buckets}")
            first, warm = first_and_warm(lambda: compare_grid(a, b, measures=measures, reverse=True,
                                                              buckets=buckets).tables, 1)
            times[buckets] = (first, warm)
        got = np.asarray(compare_grid(a, b, measures=["cka/linear"]).tables["cka/linear"])

    def cka64(x, y):
        x, y = (z.astype(np.float64) - z.astype(np.float64).mean(0) for z in (x, y))
        return np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))

    err = float(np.max(np.abs(got - np.array([[cka64(x, y) for y in b] for x in a]))))
    (f1, w1), (f0, w0) = times[True], times[False]
    return [
        f"**Layers wider than the rows** ({len(widths)} x {len(widths)} layers of widths {list(widths)}, n = {n}; "
        f"measures: {', '.join(measures)}; reverse=True). Linear CKA: max |ours - float64 NumPy| = {err:.1e}.",
        "",
        "| | first call (s) | warm (s) | warm speed-up |",
        "|---|---|---|---|",
        f"| ours: layers wider than the rows in the rows' span | {f1:.1f} | {w1:.2f} | **{w0 / w1:.1f}x** |",
        f"| the same grid in the layers' own features (buckets=False) | {f0:.1f} | {w0:.2f} | 1x |",
        "",
    ]


def _blocks_part(r, quick: bool) -> list[str]:
    """Part 5: generic per-layer statistics over the budget: all at once, in blocks, per pair."""
    n, count, width = (300, 6, 16) if quick else (3000, 12, 64)
    a = {f"a{k}": r.normal(size=(n, width)).astype(np.float32) for k in range(count)}
    b = {f"b{k}": r.normal(size=(n, width)).astype(np.float32) for k in range(count)}
    measures = ["rsa/correlation/spearman", "rsa/correlation/pearson"]
    core = sim.measure(measures[0]).core  # both measures' statistics: the condensed RDM (ranks or centred)
    shapes = jax.eval_shape(core.layer, jax.ShapeDtypeStruct((n, width), np.float32),
                            jax.ShapeDtypeStruct((), np.int32), tuple(jax.ShapeDtypeStruct((), np.float32)
                                                                      for _ in core.opts))
    one = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    budgets = {"every layer's RDM in memory (default budget)": 2.0 * 2**30,
               "blocks of 4 layers per side": 8 * one,
               "each pair's two RDMs (budget below one layer per side)": 0}
    times, tables = {}, {}
    for label, budget in budgets.items():
        _say(f"part 5: {count} x {count} layers ({n} x {width}), {label}")
        first, warm = first_and_warm(lambda budget=budget: compare_grid(a, b, measures=measures,
                                                                        stats_budget=budget).tables, 1)
        times[label] = (first, warm)
        tables[label] = compare_grid(a, b, measures=measures, stats_budget=budget).tables
    ref = next(iter(tables.values()))
    diff = max(float(np.max(np.abs(np.asarray(t[m]) - np.asarray(ref[m])))) for t in tables.values() for m in measures)
    base = times[list(budgets)[-1]][1]
    out = [f"**RDMs over the memory budget** ({count} x {count} layers of ({n}, {width}); {', '.join(measures)}; "
           f"one layer's statistics {one / 2**20:.1f} MiB; the tables agree within {diff:.1e}).", "",
           "| statistics | first call (s) | warm (s) | warm speed-up over per pair |", "|---|---|---|---|"]
    out += [f"| {label} | {f:.1f} | {w:.2f} | **{base / w:.1f}x** |" for label, (f, w) in times.items()]
    return out + [""]


def _square_part(r, quick: bool) -> list[str]:
    """Part 6: one side with itself, mixed widths, RDMs over the budget: all in memory against blocks of 4."""
    n, widths = (300, (8,) * 5 + (32,) * 4 + (128,) * 3) if quick else (2000, (32,) * 10 + (256,) * 8 + (1024,) * 6)
    layers = {f"l{k}": r.normal(size=(n, w)).astype(np.float32) for k, w in enumerate(widths)}
    measures = ["rsa/correlation/spearman", "rsa/correlation/pearson"]
    one = 4 * n * (n - 1) // 2  # one layer's condensed float32 RDM
    groups = len(_prepare(layers).groups("a"))
    budgets = {"every layer's RDM in memory (default budget)": 2.0 * 2**30, "blocks of 4 layers": 8 * one}
    times, tables = {}, {}
    for label, budget in budgets.items():
        _say(f"part 6: {len(widths)} layers with themselves ({n} rows, {groups} width groups), {label}")
        first, warm = first_and_warm(lambda budget=budget: compare_grid(layers, measures=measures,
                                                                        stats_budget=budget).tables, 1)
        times[label] = (first, warm)
        tables[label] = compare_grid(layers, measures=measures, stats_budget=budget).tables
    ref = next(iter(tables.values()))
    diff = max(float(np.max(np.abs(np.asarray(t[m]) - np.asarray(ref[m])))) for t in tables.values() for m in measures)
    base = times[list(budgets)[-1]][1]
    out = [f"**A square grid over the memory budget** ({len(widths)} layers with themselves, widths "
           f"{sorted(set(widths))} in {groups} width groups, n = {n}; {', '.join(measures)}; the tables agree "
           f"within {diff:.1e}).", "", "| statistics | first call (s) | warm (s) | warm time over the blocks' |",
           "|---|---|---|---|"]
    out += [f"| {label} | {f:.1f} | {w:.2f} | {w / base:.2f} |" for label, (f, w) in times.items()]
    return out + [""]


def _symmetric_part(r, quick: bool) -> list[str]:
    """Part 7: symmetric measures of one side with itself, against the same layers as two sides."""
    # widths below n: no undefined cell (CCA needs more samples than features)
    n, widths = (200, (8,) * 4 + (32,) * 3 + (64,) * 2) if quick else (1000, (32,) * 10 + (256,) * 8 + (768,) * 6)
    layers = [r.normal(size=(n, w)).astype(np.float32) for w in widths]
    moments = ["cka/linear", "procrustes", *(f"stitch/{f}{s}" for f in ("orthogonal", "scaled_orthogonal", "affine")
                                             for s in ("", "/in_sample"))]
    measures = {m: [m] for m in ["svcca", "cka/linear/debiased", "cka/rbf", "rsa/correlation/spearman"]}
    measures[f"the {len(moments)} moment measures of a study (CKA, Procrustes, the stitching scores)"] = moments
    out = [f"**Symmetric measures of one side with itself** ({len(widths)} layers, widths {sorted(set(widths))}, "
           f"n = {n}; each measure alone; the square call computes {len(widths) * (len(widths) + 1) // 2} of the "
           f"{len(widths) ** 2} pairs of a symmetric generic measure; the moment measures compute every ordered "
           "pair either way).", "",
           "| measure | square: first (s) | square: warm (s) | two sides: warm (s) | two sides over square (warm) | "
           "max difference |", "|---|---|---|---|---|---|"]
    for label, ms in measures.items():
        _say(f"part 7: {label}, {len(widths)} layers with themselves, square and as two sides")
        f_sq, w_sq = first_and_warm(lambda ms=ms: compare_grid(layers, measures=ms).tables, 2)
        _, w_two = first_and_warm(lambda ms=ms: compare_grid(layers, list(layers), measures=ms).tables, 2)
        sq, two = compare_grid(layers, measures=ms).tables, compare_grid(layers, list(layers), measures=ms).tables
        diff = max(float(np.max(np.abs(np.asarray(sq[m]) - np.asarray(two[m])))) for m in ms)
        out.append(f"| {label} | {f_sq:.1f} | {w_sq:.2f} | {w_two:.2f} | {w_two / w_sq:.2f} | {diff:.1e} |")
    return out + [""]


def _prepare(layers):
    from funsim.similarity.grid import layers as L

    return L.prepare(layers, layers, buckets=True)


if __name__ == "__main__":
    main()
