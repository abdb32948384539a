"""Training steps per second: the compiled loop of ``models.train`` against one jitted step per Python dispatch.

Run: ``python -m benchmarks.bench_train [--quick] [--rounds R]``. Prints and returns a Markdown report.

* **after**: ``models.train.train`` as it is, with an evaluation only at step 0 and at the end
  (no workdir): the steps run in one compiled ``lax.while_loop`` with the parameters and the
  optimiser state donated and a finiteness check of every step's loss and parameters.
* **before** (the reference, kept here): the loop ``models.train`` ran until this change, one
  jitted step per Python call, nothing donated, the same two evaluations. Same minibatches
  (``fold_in(key, step)``), same optimiser, same model.

Workloads: the grokking model (``experiments.grokking``: p = 113, hidden 64, AdamW) at full batch
(3,831 pairs) and at batch 512, and the default zoo's CNN (channels 16/32/64) on mnist5k at batch 64
(evaluated on 500 test and 1,000 training images). One more row: batch 512 with
``TrainConfig(sampling="epochs")`` (one shuffle per epoch instead of one per step; other minibatches,
so its parameters differ from the reference's) against the same per-step reference. On XLA's CPU backend a convolutional model runs
step by step in both columns (see ``models.train``), so its row measures the donation and the
finiteness check, not the loop.
Rounds alternate before/after in one process (the machine is shared); the table gives the
minimum over rounds of the time for ``steps`` steps, compilation excluded (one warm-up call each),
as wall time and as the process's CPU time (less disturbed by other jobs on a shared machine).
"""

from __future__ import annotations

import argparse
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks._timing import alternating

# ----------------------------------------------------------------------------- the reference loop


def _loss(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "batch_size"))
def _legacy_step(graphdef, tx, batch_size, params, rest, opt_state, key, xs, ys, step):
    """The per-step program ``models.train`` dispatched from Python before the compiled loop."""
    k_step = jax.random.fold_in(key, step)
    idx = jax.random.choice(k_step, xs.shape[0], (batch_size,), replace=False)
    xb, yb = xs[idx], ys[idx]
    loss, grads = jax.value_and_grad(lambda p: _loss(nnx.merge(graphdef, p, rest)(xb), yb))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _legacy_eval(graphdef, params, rest, x, y):
    logits = nnx.merge(graphdef, params, rest)(x)
    return _loss(logits, y), (jnp.argmax(logits, -1) == y).mean()


def legacy_train(model, x_train, y_train, x_test, y_test, *, steps, batch_size, tx, eval_train_size, seed=0):
    """The old loop: evaluate (test split and a train subset), ``steps`` dispatches of the jitted step, evaluate."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)
    xs, ys, xt, yt = (jnp.asarray(a) for a in (x_train, y_train, x_test, y_test))
    xe, ye = xs[:eval_train_size], ys[:eval_train_size]
    key = jax.random.PRNGKey(seed)
    evaluate = lambda p: [float(v) for x, y in ((xt, yt), (xe, ye)) for v in _legacy_eval(graphdef, p, rest, x, y)]  # noqa: E731
    first = evaluate(params)
    for step in range(steps):
        params, opt_state, _ = _legacy_step(graphdef, tx, batch_size, params, rest, opt_state, key, xs, ys,
                                            jnp.asarray(step, jnp.uint32))
    last = evaluate(params)
    return first, last, params


# ----------------------------------------------------------------------------- workloads


def _workloads(quick: bool):
    from funsim import data, grokking, models

    p = 31 if quick else 113
    gcfg = grokking.GrokkingConfig(p=p)
    tok = data.modular_addition(p=p, train_fraction=0.3)
    n = len(tok.x_train)
    mnist = data.load("digits" if quick else "mnist5k")
    out = []
    for label, batch, sampling in ((f"grokking model, full batch ({n:,})", n, "independent"),
                                   ("grokking model, batch 512", min(512, n), "independent"),
                                   ("grokking model, batch 512; after: `sampling=\"epochs\"`", min(512, n), "epochs")):
        out.append(dict(
            name=label, make=lambda: grokking.make_model(gcfg, 0), data=(tok.x_train, tok.y_train, tok.x_test, tok.y_test),
            batch=batch, lr=1e-3, optimizer="adamw", wd=0.3, steps=60 if quick else 400, eval_train=n, sampling=sampling,
        ))
    out.append(dict(
        name=f"zoo CNN 16/32/64 on {mnist.name}, batch 64",
        make=lambda: models.CNN(mnist.input_shape, mnist.n_classes, channels=(16, 32, 64), rngs=nnx.Rngs(0)),
        data=(mnist.x_train, mnist.y_train, mnist.x_test[:500], mnist.y_test[:500]),
        batch=64, lr=3e-3, optimizer="adamw", wd=0.0, steps=20 if quick else 120, eval_train=1000,
        sampling="independent",
    ))
    return out


def bench_training(quick: bool, rounds: int) -> list[str]:
    from funsim.models.train import TrainConfig, train

    lines = ["| workload | steps | before: per-step dispatch (steps/s, wall) | after: compiled loop (steps/s, wall) | "
             "after / before (wall) | after / before (CPU time) | max abs diff of the final parameters |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for w in _workloads(quick):
        x_tr, y_tr, x_te, y_te = w["data"]
        cfg = TrainConfig(steps=w["steps"], batch_size=w["batch"], learning_rate=w["lr"], optimizer=w["optimizer"],
                          weight_decay=w["wd"], eval_every=w["steps"], eval_train_size=w["eval_train"],
                          sampling=w["sampling"])
        tx = optax.adamw(w["lr"], weight_decay=w["wd"])

        def before():
            return legacy_train(w["make"](), x_tr, y_tr, x_te, y_te, steps=cfg.steps, batch_size=cfg.batch_size, tx=tx,
                                eval_train_size=cfg.eval_train_size)[2]

        def after():
            m = w["make"]()
            train(m, x_tr, y_tr, x_te, y_te, config=cfg, progress=False)
            return nnx.state(m, nnx.Param)

        pa, pb = before(), after()  # warm-up: compiles both
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)))
        t = alternating({"before": before, "after": after}, rounds)
        (b, cb), (a, ca) = t["before"], t["after"]
        lines.append(f"| {w['name']} | {cfg.steps} | {cfg.steps / b:.0f} | {cfg.steps / a:.0f} | {b / a:.2f}x | "
                     f"{cb / ca:.2f}x | {diff:.1e} |")
    return lines


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5, --quick 2)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    load = os.getloadavg()
    lines = ["## Training: steps per second, compiled loop vs per-step dispatch", "",
             f"Command: `python -m benchmarks.bench_train{' --quick' if args.quick else ''}`; load average at start "
             f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; {rounds} alternating rounds, minimum of each; "
             "float32, default JAX device, each run including its two evaluations.", ""]
    lines += bench_training(args.quick, rounds)
    load = os.getloadavg()
    lines += ["", f"Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}."]
    text = "\n".join(lines) + "\n"
    print(text)
    return text


if __name__ == "__main__":
    main()
