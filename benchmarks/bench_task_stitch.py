"""Benchmark: task-loss stitchers, batched vs one by one, a layer-pair sweep's compilations, wide sources.

Run: ``python -m benchmarks.bench_task_stitch [--quick] [--before REV] [--only batched sweep cayley buckets]``.

1. K = 16 stitchers into one target layer (a frozen ``d -> 64 tanh -> 10``
   tail, a module-level function of its weights), each source a random
   linear view of a shared latent plus noise, trained with the task
   cross-entropy, Adam, minibatches: one ``train_stitchers`` call (one
   vmapped, jitted loop) against ``train_stitcher`` K times (same shapes, one
   compilation). Compile time (first call minus a warm call) is reported
   apart from steady-state time (median of warm calls, results blocked).

2. A sweep over layer pairs of one model pair: two Flax NNX MLPs of one
   architecture (4 hidden layers), every source layer of one stitched into
   every layer of the other, both ways: 32 stitchers, each the first time it
   runs in a fresh process (wall time includes compilation; the number of XLA
   compilations is counted). "one by one" is 32 ``train_stitcher`` calls
   with ``models.split_tail`` tails; "batched" is 8 ``train_stitchers`` calls
   (the 4 sources into each target layer). With ``--before REV`` the same
   sweep also runs against the old API at git revision ``REV`` (a fresh
   ``lambda`` tail per pair, which compiled every call).

3. Orthogonal stitchers from wide sources into a narrow target (``--only cayley``): sources of 64 to
   1,024 features (a flattened conv map is this wide) into a 64-wide layer of a frozen ``64 -> 64 tanh ->
   10`` tail, closed-form start, full-batch Adam. Each stitcher is a point of a Stiefel manifold moved by
   a Cayley map: a ``64 x 64`` solve per step. With ``--before REV``
   the same call runs at git revision ``REV`` too (a revision whose Cayley map solves the padded
   ``M x M`` system, ``M`` the widest source). Each variant is one fresh process; the first call includes
   compilation, the second is warm; the final training loss and the largest deviation from
   orthonormality show that both train equally well (the two parametrisations take different paths,
   so the stitchers themselves differ). Then the same sources once per family (orthogonal, scaled
   orthogonal, affine: 12 stitchers) in one call, as the similarity study trains them.

4. Width buckets halving or quartering (``--only buckets``): the `authors_protocol` study's dense
   targets on digits, synthetically: 80 sources of the digits zoo's widths (10 to 2,048 features, the
   flattened conv maps among them) into a 256-wide layer of two stacked frozen ``256 -> 10`` tails,
   n = 100, one orthogonal family, closed-form start, full-batch Adam, at 5 and at 25 steps, first call
   and the median of three warm calls each; the time of a step is the warm difference over the 20
   extra steps, and the compile time is the first call minus the warm one. With ``--before REV`` the
   same call runs at git revision ``REV`` too (each in a fresh process): a revision before the CPU's
   halving ladder (611dd9c) quarters (buckets 32, 128, 512, 2,048 here; halving: every power of 2
   from 16).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SWEEP = dict(full=dict(n=1000, width=32, steps=200, batch=128),
             quick=dict(n=256, width=16, steps=20, batch=64))
CAYLEY = dict(full=dict(n=1200, widths=(64, 256, 512, 1024), steps=50),
              quick=dict(n=200, widths=(16, 64, 128), steps=10))
# the digits zoo's layers flattened, as the authors_protocol study stitches them into a dense layer
_DIGITS_WIDTHS = ((2048, 2), (1024, 2), (512, 10), (384, 2), (256, 14), (192, 2), (128, 12), (96, 2), (64, 14),
                  (32, 4), (10, 16))
BUCKETS = dict(full=dict(n=100, widths=tuple(w for w, c in _DIGITS_WIDTHS for _ in range(c)), d_tgt=256, steps=(5, 25)),
               quick=dict(n=60, widths=(256, 128, 64, 64, 32, 10), d_tgt=64, steps=(2, 6)))


# ---------------------------------------------------------------------------
# 1. K stitchers into one layer: vmapped vs sequential
# ---------------------------------------------------------------------------


def _tail(w, h):
    """The frozen tail ``tanh(h @ w1) @ w2``; ``w = (w1, w2)``."""
    return jnp.tanh(h @ w[0]) @ w[1]


def _problem(k, n, d, seed=0):
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, d))
    w1, w2 = rng.normal(size=(d, 64)) / np.sqrt(d), rng.normal(size=(64, 10)) / 8.0
    params = (jnp.asarray(w1, jnp.float32), jnp.asarray(w2, jnp.float32))
    y = np.asarray(jnp.argmax(_tail(params, jnp.asarray(latent, jnp.float32)), axis=1)).astype(np.int32)
    srcs = [
        jnp.asarray(latent @ rng.normal(size=(d, d)) / np.sqrt(d) + 0.1 * rng.normal(size=(n, d)),
                    jnp.float32)
        for _ in range(k)
    ]
    return srcs, jnp.asarray(y), params


def _batched_vs_sequential(quick: bool) -> str:
    from benchmarks._timing import first_and_warm
    from funsim.similarity import train_stitcher, train_stitchers

    k = 16
    if quick:
        configs, steps, repeats = [(256, 8, 32), (256, 16, 64)], 40, 1
    else:
        configs, steps, repeats = [(512, 8, 32), (2048, 32, 128)], 300, 2
    rows = []
    for (n, d, batch), family in itertools.product(configs, ("affine", "orthogonal")):
        srcs, y, params = _problem(k, n, d)
        kw = dict(init="random", target_shape=(d,), steps=steps, batch_size=batch, eval_every=100)
        keys = jax.random.split(jax.random.key(0), k)

        def batched():
            return [s.weight for s, _ in train_stitchers(srcs, y, _tail, params, family=family,
                                                         key=keys, **kw)]

        def sequential():
            return [train_stitcher(s, y, _tail, params, family=family, key=kk, **kw).stitcher.weight
                    for s, kk in zip(srcs, keys)]

        b_first, b_warm = first_and_warm(batched, repeats)
        s_first, s_warm = first_and_warm(sequential, repeats)
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
    return head + "".join(
        f"| {c} | {f} | {b:.3f} | {s:.3f} | {r:.1f}x | {cb:.2f} | {cs:.2f} | {e:.1e} |\n"
        for c, f, b, s, r, cb, cs, e in rows
    )


# ---------------------------------------------------------------------------
# 2. A sweep over layer pairs (each variant in a fresh process)
# ---------------------------------------------------------------------------


def _sweep(variant: str, size: dict) -> dict:
    """Run the 32-stitcher sweep once; returns wall time, compilations and a checksum."""
    from flax import nnx

    from funsim.models import MLP

    # counted by hand, not with funsim.runtime.compile_count: the "old" variant runs against a
    # revision of the tree that predates that module (and benchmarks._timing)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, d, **kw: compiles.append(1) if event.endswith("backend_compile_duration") else None
    )
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(size["n"], 64)), jnp.float32)
    a, b = (MLP(64, 10, widths=(size["width"],) * 4, rngs=nnx.Rngs(s)) for s in (0, 1))
    y = jnp.argmax(a(x), axis=1)
    layers = [f"fc{i}" for i in range(4)]
    feats = {"A": a.features(x), "B": b.features(x)}
    models = {"A": a, "B": b}
    kw = dict(family="affine", steps=size["steps"], batch_size=size["batch"])
    keys = [jax.random.key(i) for i in range(len(layers))]  # source i's key, in every variant
    weights = []
    t0 = time.perf_counter()
    for src, tgt in (("A", "B"), ("B", "A")):
        for lj in layers:
            z_tgt, model = feats[tgt][lj], models[tgt]
            srcs = [feats[src][li] for li in layers]
            if variant == "old":
                from funsim.similarity import train_stitcher

                for i, z in enumerate(srcs):  # a fresh closure per pair, as a sweep writes it
                    s, _ = train_stitcher(z, y, lambda h, m=model, j=lj: m.tail(j, h), z_tgt=z_tgt,
                                          key=keys[i], progress=False, **kw)
                    weights.append(s.weight)
                continue
            from funsim.models import split_tail
            from funsim.similarity import train_stitcher, train_stitchers

            tail_apply, tail_params = split_tail(model, lj)
            if variant == "one_by_one":
                weights += [train_stitcher(z, y, tail_apply, tail_params, z_tgt=z_tgt, key=k,
                                           **kw).stitcher.weight for z, k in zip(srcs, keys)]
            else:
                weights += [s.weight for s, _ in train_stitchers(srcs, y, tail_apply, tail_params,
                                                                 z_tgt=z_tgt, key=jnp.stack(keys),
                                                                 **kw)]
    jax.block_until_ready(weights)
    wall = time.perf_counter() - t0
    return dict(wall=wall, compiles=len(compiles), stitchers=len(weights),
                checksum=float(sum(jnp.sum(jnp.abs(w)) for w in weights)))


def _run_variant(variant: str, quick: bool, pythonpath: Path, shim: Path | None = None) -> dict:
    """One variant in a fresh process run from ``pythonpath``; ``shim``, first on the path, may point
    ``funsim`` at another tree (a package whose ``__path__`` names it)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in (shim, pythonpath) if p is not None))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant]
    out = subprocess.run(cmd + (["--quick"] if quick else []), env=env, cwd=pythonpath,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _checkout(rev: str, tmp: Path) -> tuple[Path, Path]:
    """The tree at git revision ``rev``, extracted into ``tmp/old``, and a directory to put first on
    ``PYTHONPATH`` so that ``import funsim`` finds that tree (a package whose ``__path__`` names it), not
    the installed one: ``(old, shim)``."""
    old = tmp / "old"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    shim = tmp / "shim" / "funsim"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(f"__path__ = [{str(old)!r}]\n")
    return old, shim.parent


def _sweep_table(quick: bool, before: str | None) -> str:
    size = SWEEP["quick" if quick else "full"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if before:
            rows.append((f"before ({before}): 32 `train_stitcher`, fresh `lambda` tails",
                         _run_variant("old", quick, *_checkout(before, Path(tmp)))))
        rows.append(("after: 32 `train_stitcher`, `split_tail` tails",
                     _run_variant("one_by_one", quick, ROOT)))
        rows.append(("after: 8 `train_stitchers` (4 sources per target layer)",
                     _run_variant("batched", quick, ROOT)))
    base = rows[0][1]["wall"]
    head = (
        f"Sweep: two NNX MLPs (64 -> {size['width']} x 4 hidden -> 10), every layer of one "
        f"stitched into every layer of the other, both ways: 32 affine stitchers, closed-form "
        f"init, {size['steps']} Adam steps, batch {size['batch']}, n = {size['n']}, float32. "
        "Each row is one fresh process; wall time includes every compilation; equal checksums (sum of |weights|) mean equal stitchers.\n\n"
        "| variant | wall (s) | XLA compilations | vs first row | checksum |\n|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {name} | {r['wall']:.1f} | {r['compiles']} | {base / r['wall']:.1f}x | {r['checksum']:.4f} |\n"
        for name, r in rows
    )


# ---------------------------------------------------------------------------
# 3. Orthogonal stitchers from wide sources (each variant in a fresh process)
# ---------------------------------------------------------------------------


def _cayley(size: dict) -> dict:
    """Orthogonal ``train_stitchers`` calls, twice each: wall times, final loss and orthogonality; then the
    same sources once per family (orthogonal, scaled orthogonal, affine) in one call."""
    from benchmarks._timing import first_and_warm
    from funsim.similarity import train_stitchers

    rng = np.random.default_rng(0)
    n = size["n"]
    latent = rng.normal(size=(n, 32))
    z_tgt = np.tanh(latent @ rng.normal(size=(32, 64)) / np.sqrt(32))
    params = (jnp.asarray(rng.normal(size=(64, 64)) / 8.0, jnp.float32),
              jnp.asarray(rng.normal(size=(64, 10)) / 8.0, jnp.float32))
    y = jnp.asarray(np.argmax(np.asarray(_tail(params, jnp.asarray(z_tgt, jnp.float32))), axis=1))
    srcs = [jnp.asarray(latent @ rng.normal(size=(32, w)) / np.sqrt(32) + 0.3 * rng.normal(size=(n, w)), jnp.float32)
            for w in size["widths"]]
    fams = ["orthogonal", "scaled_orthogonal", "affine"]
    out = []

    def call(families):
        def run():
            k = len(srcs) * (1 if families == "orthogonal" else len(fams))
            out[:] = train_stitchers(srcs * (k // len(srcs)), y, _tail, params,
                                     family=families if families == "orthogonal" else [f for f in fams for _ in srcs],
                                     z_tgt=jnp.asarray(z_tgt, jnp.float32), steps=size["steps"], batch_size=None,
                                     key=jax.random.split(jax.random.key(0), k))
            return [s.weight for s, _ in out]
        return run

    first, warm = first_and_warm(call("orthogonal"), 1)
    res = dict(first=first, warm=warm, loss=float(np.mean([h.train_loss[-1] for _, h in out])),
               loss0=float(np.mean([h.train_loss[0] for _, h in out])),
               orth=float(max(np.max(h.constraint_error) for _, h in out)))
    res["mixed_first"], res["mixed_warm"] = first_and_warm(call("mixed"), 1)
    return res


def _cayley_table(quick: bool, before: str | None) -> str:
    size = CAYLEY["quick" if quick else "full"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if before:
            rows.append((f"before ({before}): M x M Cayley solve",
                         _run_variant("cayley", quick, *_checkout(before, Path(tmp)))))
        rows.append(("this tree: Stiefel Cayley map", _run_variant("cayley", quick, ROOT)))
    base = rows[0][1]["warm"]
    head = (
        f"Orthogonal stitchers: {len(size['widths'])} sources of {', '.join(map(str, size['widths']))} features "
        f"into a 64-wide layer of a frozen 64 -> 64 tanh -> 10 tail, n = {size['n']}, closed-form start, "
        f"{size['steps']} full-batch Adam steps, float32, {jax.devices()[0].platform.upper()}. Each row one fresh "
        "process.\n\n"
        "| variant | first call (s) | warm call (s) | warm vs first row | train loss start -> end | max orthogonality error "
        "| three families, 12 stitchers: first / warm (s) | warm vs first row |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    mixed = rows[0][1]["mixed_warm"]
    return head + "".join(
        f"| {name} | {r['first']:.2f} | {r['warm']:.2f} | {base / r['warm']:.1f}x | {r['loss0']:.4f} -> {r['loss']:.4f} "
        f"| {r['orth']:.1e} | {r['mixed_first']:.2f} / {r['mixed_warm']:.2f} | {mixed / r['mixed_warm']:.1f}x |\n"
        for name, r in rows)


# ---------------------------------------------------------------------------
# 4. Width buckets: halving against quartering ladders
# ---------------------------------------------------------------------------


def _buckets(size: dict) -> dict:
    """One orthogonal ``train_stitchers`` call of ``size``'s sources into two stacked tails: first and warm
    wall seconds at each step count."""
    from benchmarks._timing import first_and_warm
    from funsim.similarity import train_stitchers

    rng = np.random.default_rng(0)
    n, d = size["n"], size["d_tgt"]
    latent = rng.normal(size=(n, 32))
    z_tgt = np.stack([np.tanh(latent @ rng.normal(size=(32, d)) / np.sqrt(32)) for _ in range(2)])
    w = np.stack([rng.normal(size=(d, 10)) / np.sqrt(d) for _ in range(2)])
    y = jnp.asarray(np.argmax(z_tgt[0] @ w[0], axis=1))
    srcs = [jnp.asarray(latent @ rng.normal(size=(32, k)) / np.sqrt(32) + 0.3 * rng.normal(size=(n, k)), jnp.float32)
            for k in size["widths"]]
    tail = jnp.asarray(w, jnp.float32)
    out = {}
    for steps in size["steps"]:
        out[f"first_{steps}"], out[f"warm_{steps}"] = first_and_warm(lambda steps=steps: [s.weight for s, _ in train_stitchers(
            srcs, y, _linear_tail, tail, family="orthogonal", z_tgt=jnp.asarray(z_tgt, jnp.float32), stacked_tails=True,
            steps=steps, batch_size=None, key=jax.random.split(jax.random.key(0), len(srcs)))], 3)
    return out


def _linear_tail(w, h):
    """The frozen tail ``h @ w``."""
    return h @ w


def _buckets_table(quick: bool, before: str | None) -> str:
    size = BUCKETS["quick" if quick else "full"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if before:
            rows.append((f"before ({before})", _run_variant("buckets", quick, *_checkout(before, Path(tmp)))))
        rows.append(("this tree", _run_variant("buckets", quick, ROOT)))
    lo, hi = size["steps"]
    per = [(v[f"warm_{hi}"] - v[f"warm_{lo}"]) / (hi - lo) for _, v in rows]
    head = (
        f"Width buckets: {len(size['widths'])} sources of {min(size['widths'])}-{max(size['widths'])} features into a "
        f"{size['d_tgt']}-wide layer of two stacked frozen linear tails, n = {size['n']}, orthogonal, closed-form start, "
        f"full batch, float32, {jax.devices()[0].platform.upper()}; each row one fresh process.\n\n"
        f"| variant | first / warm call, {lo} steps (s) | first / warm call, {hi} steps (s) | s per step "
        f"| compile (s, first - warm at {hi} steps) | step vs first row |\n|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {name} | {v[f'first_{lo}']:.2f} / {v[f'warm_{lo}']:.2f} | {v[f'first_{hi}']:.2f} / {v[f'warm_{hi}']:.2f} "
        f"| {p:.3f} | {v[f'first_{hi}'] - v[f'warm_{hi}']:.1f} | {per[0] / p:.2f}x |\n"
        for (name, v), p in zip(rows, per))


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--before", default=None, metavar="REV",
                        help="also run the sweep (and the Cayley and bucket parts) at this git revision")
    parser.add_argument("--only", choices=("batched", "sweep", "cayley", "buckets"), nargs="+", default=None,
                        help="run only these parts (default: all)")
    parser.add_argument("--variant", choices=("old", "one_by_one", "batched", "cayley", "buckets"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant == "buckets":
        print(json.dumps(_buckets(BUCKETS["quick" if args.quick else "full"])))
        return ""
    if args.variant:  # one variant, in this (fresh) process
        size = (CAYLEY if args.variant == "cayley" else SWEEP)["quick" if args.quick else "full"]
        print(json.dumps((_cayley if args.variant == "cayley" else functools.partial(_sweep, args.variant))(size)))
        return ""
    parts = args.only or ["batched", "sweep", "cayley", "buckets"]
    tables = {"batched": lambda: _batched_vs_sequential(args.quick),
              "sweep": lambda: _sweep_table(args.quick, args.before),
              "cayley": lambda: _cayley_table(args.quick, args.before),
              "buckets": lambda: _buckets_table(args.quick, args.before)}
    table = "\n".join(tables[p]() for p in parts)
    print(table)
    return table


if __name__ == "__main__":
    main()
