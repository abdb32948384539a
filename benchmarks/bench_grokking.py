"""The grokking experiment's two hot spots: the training step and the change-point segmentation.

Run: ``python -m benchmarks.bench_grokking [--quick]``. Prints and returns a
Markdown report; float32 for training, float64 for segmentation, default JAX device.

* **Training step** (p = 113, hidden 64, full batch of 3,831 pairs, AdamW):
  ``models.TokenPairs`` (gathers the two one-hot columns) against
  the same :class:`models.BilinearMLP` fed the one-hot matrix. Both are one
  jitted step; identical functions and gradients (tested in
  ``tests/test_models.py``).
* **Segmentation** of an ``n x n`` similarity matrix into K = 5 segments:
  ``similarity.change_points`` (jitted, vectorised DP) against two NumPy
  references that compute the same optimum: the straightforward triple loop
  (segment costs from block sums, then ``for k, for b, for a``), as public
  code writes it, and a vectorised NumPy DP over the same cost table.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._timing import first_and_warm


def _step_fn(model):
    import optax
    from flax import nnx

    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(1e-3, weight_decay=0.3)

    @jax.jit
    def step(params, opt_state, x, y):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, p)(x), y).mean()

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step, params, tx.init(params)


def bench_training(p: int, repeats: int) -> list[str]:
    from funsim.data import modular_addition
    from funsim.experiments import grokking

    cfg = grokking.GrokkingConfig(p=p)
    tok = modular_addition(p=p, train_fraction=0.3)
    oh = modular_addition(p=p, train_fraction=0.3, onehot=True)
    rows = []
    times = {}
    for name, model, x in (("TokenPairs (gather two columns)", grokking.make_model(cfg, 0), tok.x_train),
                           ("BilinearMLP on the one-hot matrix", grokking.make_model(cfg, 0).model, oh.x_train)):
        step, params, opt = _step_fn(model)
        x, y = jnp.asarray(x), jnp.asarray(tok.y_train)
        first, warm = first_and_warm(lambda: step(params, opt, x, y), repeats=repeats)
        times[name] = warm
        rows.append((name, warm, first))
    base = rows[0][1]
    out = [f"Training step: p = {p}, hidden 64, full batch of {len(tok.x_train):,} pairs, AdamW, float32.", "",
           "| model | step (ms, warm median) | first call (s) | time / TokenPairs |", "|---|---:|---:|---:|"]
    out += [f"| {n} | {w * 1e3:.2f} | {f:.2f} | {w / base:.1f}x |" for n, w, f in rows]
    return out


def _np_costs(s):
    """(n, n+1) pairwise segment costs from 2-D prefix sums (NumPy float64)."""
    n = len(s)
    s = 0.5 * (s + s.T)
    pre = np.zeros((n + 1, n + 1))
    pre[1:, 1:] = np.cumsum(np.cumsum(s, 0), 1)
    dpre = np.concatenate([[0.0], np.cumsum(np.diag(s))])
    a = np.arange(n)[:, None]
    b = np.arange(n + 1)[None, :]
    block = pre[b, b] - pre[a, b] - pre[b, a] + pre[a, a]
    m = (b - a).astype(float)
    c = 0.5 * m * (m - 1) - 0.5 * (block - (dpre[b] - dpre[a]))
    return np.where(m > 0, c, np.inf)


def np_loop_dp(s, k):
    """Segment starts by the textbook triple loop over (segments, end, start)."""
    c = _np_costs(s)
    n = len(s)
    f = np.full((k + 1, n + 1), np.inf)
    arg = np.zeros((k + 1, n + 1), int)
    f[1] = c[0]
    for kk in range(2, k + 1):
        for b in range(kk, n + 1):
            for a in range(kk - 1, b):
                v = f[kk - 1, a] + c[a, b]
                if v < f[kk, b]:
                    f[kk, b], arg[kk, b] = v, a
    starts, b = [], n
    for kk in range(k, 1, -1):
        b = arg[kk, b]
        starts.append(b)
    return [0, *starts[::-1]]


def np_vector_dp(s, k):
    """The same DP with each (segments) step vectorised over (start, end) in NumPy."""
    c = np.vstack([_np_costs(s), np.full((1, len(s) + 1), np.inf)])
    f, args = c[0], []
    for _ in range(k - 1):
        total = f[:, None] + c
        args.append(np.argmin(total, axis=0))
        f = total.min(axis=0)
    starts, b = [], len(s)
    for arg in reversed(args):
        b = int(arg[b])
        starts.append(b)
    return [0, *starts[::-1]]


def bench_segmentation(sizes, k: int, repeats: int) -> list[str]:
    from funsim.similarity import change_points

    out = [f"Segmentation into K = {k} segments (pairwise cost), float64; all three give the same starts.", "",
           "| n | change_points (ms, warm) | compile + first call (s) | NumPy vectorised DP (ms) | NumPy triple loop (ms) | vectorised / ours | loop / ours |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    with jax.enable_x64(True):
        for n in sizes:
            z = np.random.default_rng(n).normal(size=(n, 8)).cumsum(0)  # a drifting trajectory
            z /= np.linalg.norm(z, axis=1, keepdims=True)
            s = z @ z.T
            sj = jnp.asarray(s)
            first, ours = first_and_warm(lambda: change_points(sj, n_segments=k, cost="pairwise").starts, repeats=repeats)
            got = np.asarray(change_points(sj, n_segments=k, cost="pairwise").starts).tolist()
            t0 = time.perf_counter()
            vec = np_vector_dp(s, k)
            t_vec = time.perf_counter() - t0
            t0 = time.perf_counter()
            loop = np_loop_dp(s, k) if n <= 400 else None
            t_loop = time.perf_counter() - t0 if loop is not None else None
            assert got == vec and (loop is None or loop == got), (got, vec, loop)
            loop_cell = f"{t_loop * 1e3:.1f}" if t_loop is not None else "not run (O(K n^2) Python loop)"
            loop_ratio = f"{t_loop / ours:.0f}x" if t_loop is not None else ""
            out.append(f"| {n:,} | {ours * 1e3:.2f} | {first:.2f} | {t_vec * 1e3:.1f} | {loop_cell} | {t_vec / ours:.1f}x | {loop_ratio} |")
    return out


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    args = parser.parse_args(argv)
    p, sizes, repeats = (31, (50,), 3) if args.quick else (113, (101, 400, 2000), 7)
    lines = ["## Grokking: training step and change-point segmentation", "",
             f"Command: `python -m benchmarks.bench_grokking{' --quick' if args.quick else ''}`.", ""]
    lines += bench_training(p, repeats) + [""] + bench_segmentation(sizes, 5, repeats)
    text = "\n".join(lines) + "\n"
    print(text)
    return text


if __name__ == "__main__":
    main()
