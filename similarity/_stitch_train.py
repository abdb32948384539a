"""The pure training loop of task-loss stitchers: one step, a ``lax.scan`` chunk, a loop.

Everything that changes from call to call is traced data: the stitchers'
parameters, the data, the tail's parameters and the optimiser's
hyperparameters. The static arguments are hashable values (the tail's apply
function, which callers make hashable by value, e.g. an NNX graphdef plus a
layer name; the family, loss and optimiser *names*; the step counts), so a
second call with the same shapes compiles nothing.

:func:`fit_loop` trains a ``(M tails, K stitchers)`` batch, per loop group (a width bucket of
affine stitchers, or of orthogonal ones) vmapped twice: each stitcher runs :func:`_train_one`, a
``lax.while_loop`` over chunks of
``chunk`` steps (each a ``lax.scan`` of :func:`train_step`), with the held-out
evaluation and early stopping between chunks done on the device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from funsim.similarity._stitch_param import apply_channels, constraint_error, materialise

LOSSES = ("ce", "kl")
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop", "adagrad", "lion")


def loss_from_logits(logits: jax.Array, y: jax.Array, teacher: jax.Array | None, loss: str,
                     groups: jax.Array | None = None):
    """Mean cross-entropy with ``y`` (``"ce"``) or KL(teacher || model) (``"kl"``), in nats.

    With ``groups`` (``"ce"`` only), the cross-entropy of a coarser task: class ``c`` of the
    logits belongs to coarse class ``groups[c]``, the label of row ``i`` is ``groups[y[i]]``, and
    its probability is the summed softmax of its classes. The identity grouping gives the plain
    cross-entropy, value and gradient to the bit (one finite term in the log-sum-exp).

    Args:
      logits: ``(n, C)``; y: ``(n,)`` int; teacher: ``(n, C)`` logits or ``None``.
      loss: ``"ce"`` or ``"kl"``.
      groups: ``(C,)`` int or ``None``.

    Returns:
      ``()``.
    """
    logp = jax.nn.log_softmax(logits, axis=-1)
    if loss == "ce" and groups is not None:
        same = groups[None, :] == groups[y][:, None]  # (n, C): the classes of each row's coarse label
        return -jnp.mean(jax.nn.logsumexp(jnp.where(same, logp, -jnp.inf), axis=-1))
    if loss == "ce":
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))
    logq = jax.nn.log_softmax(teacher, axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(logq) * (logq - logp), axis=-1))


def objective(params, consts, z, y, teacher, tail_params, groups=None, *, tail_apply, family, loss):
    """Task loss of one padded stitcher and its constraint error ``max |U^T U - I|`` (its frame ``U``).

    Args:
      params, consts: one stitcher (see :mod:`similarity._stitch_param`).
      z: ``(n, ..., D)`` padded source; y: ``(n,)``; teacher: ``(n, C)`` or ``None``.
      tail_params: the tail's parameter pytree.
      groups: ``(C,)`` coarse class of each class, or ``None`` (see :func:`loss_from_logits`).
      tail_apply: ``tail_apply(tail_params, h) -> logits (n, C)``.
      family, loss: names.

    Returns:
      ``(loss (), constraint_error ())``.
    """
    weight, scale, bias, frame = materialise(params, consts, family=family)
    h = apply_channels(z, weight[: z.shape[-1]], scale, bias)
    value = loss_from_logits(tail_apply(tail_params, h), y, teacher, loss, groups)
    return value, constraint_error(frame, value.dtype, consts)


def make_optimizer(name: str, hyper: dict[str, jax.Array], static: tuple) -> optax.GradientTransformation:
    """``optax.<name>(**hyper, **dict(static))``; ``hyper`` may hold tracers (it is data)."""
    return getattr(optax, name)(**hyper, **dict(static))


def train_step(params, opt_state, consts, key, step, live, z, y, teacher, tail_params, groups=None, *,
               tail_apply, opt, family, loss, batch_size):
    """One optimiser step of one stitcher on a minibatch (or the full batch).

    The minibatch is ``batch_size`` indices drawn uniformly with replacement
    from ``fold_in(key, step)``. Where ``live`` is false the state is returned
    unchanged (steps past the end of a chunk).

    Returns:
      ``(params, opt_state, loss_before_step, constraint_error)``.
    """
    if batch_size is not None:
        idx = jax.random.randint(jax.random.fold_in(key, step), (batch_size,), 0, z.shape[0])
        z, y = z[idx], y[idx]
        teacher = None if teacher is None else teacher[idx]
    grad_fn = jax.value_and_grad(
        functools.partial(objective, tail_apply=tail_apply, family=family, loss=loss), has_aux=True
    )
    (value, err), grads = grad_fn(params, consts, z, y, teacher, tail_params, groups)
    updates, new_state = opt.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = functools.partial(jax.tree.map, lambda a, b: jnp.where(live, a, b))
    return keep(new_params, params), keep(new_state, opt_state), value, err


def _train_one(params, consts, key, z, z_eval, groups, tail_params, teacher, t_eval, y, y_eval, hyper, *,
               tail_apply, optimizer, opt_static, family, loss, batch_size, steps, chunk, patience):
    """Train one stitcher into one tail; returns its final map and its history."""
    opt = make_optimizer(optimizer, hyper, opt_static)
    n_chunks = -(-steps // chunk)
    dtype = params["bias"].dtype
    has_eval = z_eval is not None
    step_kw = dict(tail_apply=tail_apply, opt=opt, family=family, loss=loss, batch_size=batch_size)
    obj = functools.partial(objective, tail_apply=tail_apply, family=family, loss=loss)

    def evaluate(p):
        return obj(p, consts, z_eval, y_eval, t_eval, tail_params, groups)[0]

    def run_chunk(c, p, s):
        def body(carry, i):
            p, s = carry
            step = c * chunk + i
            p, s, value, err = train_step(p, s, consts, key, step, step < steps, z, y, teacher,
                                          tail_params, groups, **step_kw)
            return (p, s), (value, err)

        return jax.lax.scan(body, (p, s), jnp.arange(chunk))

    nan = jnp.full((n_chunks * chunk,), jnp.nan, dtype)
    ev0 = evaluate(params) if has_eval else jnp.zeros((), dtype)
    state = dict(
        c=jnp.zeros((), jnp.int32), params=params, opt_state=opt.init(params), best=params,
        best_loss=ev0, best_step=jnp.zeros((), jnp.int32), stale=jnp.zeros((), jnp.int32),
        train_loss=nan, constraint_error=nan,
        eval_loss=jnp.full((n_chunks + 1 if has_eval else 0,), jnp.nan, dtype).at[:1].set(ev0),
    )

    def cond(st):
        go = st["c"] < n_chunks
        return go if patience is None else go & (st["stale"] < patience)

    def body(st):
        c = st["c"]
        (p, s), (values, errs) = run_chunk(c, st["params"], st["opt_state"])
        st = dict(st, c=c + 1, params=p, opt_state=s,
                  train_loss=jax.lax.dynamic_update_slice(st["train_loss"], values, (c * chunk,)),
                  constraint_error=jax.lax.dynamic_update_slice(st["constraint_error"], errs,
                                                                (c * chunk,)))
        if has_eval:
            ev = evaluate(p)
            better = ev < st["best_loss"]
            st = dict(
                st, eval_loss=st["eval_loss"].at[c + 1].set(ev),
                best=jax.tree.map(lambda a, b: jnp.where(better, a, b), p, st["best"]),
                best_loss=jnp.where(better, ev, st["best_loss"]),
                best_step=jnp.where(better, jnp.minimum((c + 1) * chunk, steps), st["best_step"]),
                stale=jnp.where(better, 0, st["stale"] + 1),
            )
        return st

    st = jax.lax.while_loop(cond, body, state)
    steps_run = jnp.minimum(st["c"] * chunk, steps)
    final = st["best"] if patience is not None else st["params"]
    weight, scale, bias, _ = materialise(final, consts, family=family)
    history = dict(
        train_loss=st["train_loss"][:steps], constraint_error=st["constraint_error"][:steps],
        eval_loss=st["eval_loss"], steps_run=steps_run,
        best_step=st["best_step"] if patience is not None else steps_run,
    )
    return (weight[: z.shape[-1]], bias, scale), history


_STATIC = ("tail_apply", "optimizer", "opt_static", "family", "loss", "batch_size", "steps",
           "chunk", "patience")


@functools.partial(jax.jit, static_argnames=_STATIC)
def fit_loop(params, consts, members, keys, z, y, teacher, z_eval, y_eval, t_eval, tail_params, hyper, groups=None,
             *, tail_apply: Callable[[Any, jax.Array], jax.Array], optimizer: str, opt_static: tuple,
             family: tuple[str, ...], loss: str, batch_size: int | None, steps: int, chunk: int,
             patience: int | None):
    """Train ``M x K`` stitchers: K padded sources into each of M stacked tails, in loop groups.

    Each group (one loop family, affine or the orthogonal families merged, and one padded width) trains as
    its own vmapped loop inside this one program, so an affine stitcher never pays for an orthogonal map
    and a narrow source never pays for a wide one's padding.

    Args:
      params, consts: per group, ``(M, K_g, ...)`` pytrees from :func:`similarity._stitch_param.init_params`
        (merged by :func:`similarity._stitch_param.merge_families`).
      members: per group, ``(K_g,)`` int, its stitchers' indices among the K (traced: another assignment
        of the same group sizes compiles nothing).
      keys: ``(K,)`` keys (shared by the tails).
      z: per group, ``(K_g, n, ..., D_g)`` padded sources (shared by the tails); y: ``(n,)``.
      teacher: ``(M, n, C)`` or ``None``.
      z_eval, y_eval, t_eval: held-out ``(K_g, n_e, ..., D_g)`` per group, ``(n_e,)``, ``(M, n_e, C)``, or ``None``.
      tail_params: pytree with a leading ``M`` axis.
      hyper: optimiser hyperparameters, ``{name: ()}`` arrays.
      groups: ``(K, C)`` int, each stitcher's grouping of the tail's classes into the labels of its
        task (the identity for the fine task), or ``None`` (every stitcher on the fine task).
      tail_apply, optimizer, opt_static, family (per group), loss, batch_size, steps, chunk,
        patience: static (hashable) options.

    Returns:
      ``(fitted, histories)``, one entry per group: ``fitted[g] = (weight (M, K_g, D_g, d_tgt), bias
      (M, K_g, d_tgt), scale (M, K_g))`` and ``histories[g]`` a dict of ``(M, K_g, ...)`` arrays:
      ``train_loss`` and ``constraint_error`` ``(steps,)`` (NaN after an early stop), ``eval_loss``
      ``(n_evals,)``, ``steps_run`` and ``best_step`` ``()``.
    """
    fitted, hists = [], []
    for g, (fam, p, c, idx) in enumerate(zip(family, params, consts, members)):
        one = functools.partial(
            _train_one, tail_apply=tail_apply, optimizer=optimizer, opt_static=opt_static,
            family=fam, loss=loss, batch_size=batch_size, steps=steps, chunk=chunk,
            patience=patience,
        )
        over_sources = jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, None, None, None, None, None, None))
        over_tails = jax.vmap(over_sources, in_axes=(0, 0, None, None, None, None, 0, 0, 0, None, None, None))
        at = idx
        f, h = over_tails(p, c, keys[at], z[g], None if z_eval is None else z_eval[g],
                          None if groups is None else groups[at], tail_params, teacher, t_eval, y, y_eval, hyper)
        fitted.append(f)
        hists.append(h)
    return tuple(fitted), tuple(hists)
