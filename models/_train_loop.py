"""The compiled steps of :func:`models.train.train`: one optimiser step, the loop over steps, evaluation.

One step (:func:`one_step`) draws its minibatch from ``(key, step)`` (or the epoch's shuffle),
augments it (:func:`random_crop_flip`), applies the caller's transform and updates the
parameters and the model's running statistics (``nnx.BatchStat``: BatchNorm's averages; an empty
state for models without), with a flag that the loss and the new state are finite. :func:`train_steps`
runs a chunk of steps as one compiled ``lax.while_loop`` whose trip count is traced;
:func:`run_per_step` dispatches them one program call each, for convolutional models on XLA's
CPU backend (:func:`compiled_loop_is_faster`). :func:`evaluate` and :func:`evaluate_chunked`
give the loss and accuracy of a split.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def random_crop_flip(key: jax.Array, x: jax.Array, /, *, pad: int = 4, flip: bool = True) -> jax.Array:
    """Random crops (of the zero-padded images) and random horizontal flips, per image.

    Each image is padded with ``pad`` zeros on every side and cropped back to
    its size at a uniform offset in ``[0, 2 pad]`` per axis; with ``flip``,
    it is mirrored left-right with probability 1/2 (He et al. 2016, §4.2).

    Args:
      key: a PRNG key.
      x: ``(n, H, W, C)`` images.
      pad: the padding in pixels.
      flip: also flip at random.

    Returns:
      ``(n, H, W, C)``.

    Examples:
      >>> x = jnp.arange(2 * 4 * 4 * 1.0).reshape(2, 4, 4, 1)
      >>> random_crop_flip(jax.random.key(0), x, pad=0, flip=False).tolist() == x.tolist()
      True
    """
    if x.ndim != 4:
        raise ValueError(f"random_crop_flip expects NHWC images (n, H, W, C), got shape {tuple(x.shape)}.")
    n, h, w, c = x.shape
    k_off, k_flip = jax.random.split(key)
    off = jax.random.randint(k_off, (n, 2), 0, 2 * pad + 1)
    padded = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out = jax.vmap(lambda img, o: jax.lax.dynamic_slice(img, (o[0], o[1], 0), (h, w, c)))(padded, off)
    if flip:
        mirror = jax.random.bernoulli(k_flip, 0.5, (n, 1, 1, 1))
        out = jnp.where(mirror, out[:, :, ::-1], out)
    return out


# ---------------------------------------------------------------------------- the compiled loop

#: The most optimiser steps run in one call of the compiled loop between two
#: looks from Python (progress bar, callback). The loop's trip count is traced,
#: so chunks of any length share one compiled program and the numbers do not
#: depend on where the chunks end.
MAX_CHUNK = 500


#: ``fold_in`` tag of the key that draws the epochs' shuffles (steps fold in their own index).
_EPOCH_TAG = 2**32 - 1


def _epoch_permutation(key, epoch, n: int):
    """The shuffle of epoch ``epoch`` (``sampling="epochs"``)."""
    return jax.random.permutation(jax.random.fold_in(jax.random.fold_in(key, _EPOCH_TAG), epoch), n)


_epoch_permutation_jit = jax.jit(_epoch_permutation, static_argnums=2)


def _uses_epochs(sampling: str, batch_size: int, n: int) -> bool:
    return sampling == "epochs" and batch_size < n


def one_step(graphdef, tx, batch_size, augment, sampling, transform, params, stats, rest, opt_state, key, xs, ys,
             step, perm):
    """One optimiser step on the minibatch drawn with ``fold_in(key, step)`` (or ``perm``'s slice for epochs).

    Returns the new parameters, running statistics and optimiser state, the minibatch loss (before
    the update) and whether that loss and every updated parameter and statistic are finite.

    The model's logits are its ``training_logits(xb, fold_in(fold_in(key, step), 2))`` where it
    has that method (every funsim model: BatchNorm on the minibatch, dropout drawn from that key),
    else ``model(xb)``.

    With a ``transform``, that key is split in two: one half draws the
    minibatch, the other is handed to ``transform(key, xb, yb) -> (xb, yb)``
    (applied after the augmentation).
    """
    k_step = jax.random.fold_in(key, step)
    k_idx = k_step
    if transform is not None:
        k_idx, tkey = jax.random.split(k_step)
    if batch_size == xs.shape[0]:  # full batch: every row, in order (the mean loss does not depend on it)
        xb, yb = xs, ys
    elif _uses_epochs(sampling, batch_size, xs.shape[0]):  # slot step % (n // b) of this epoch's shuffle
        slot = step % (xs.shape[0] // batch_size)
        idx = jax.lax.dynamic_slice(perm, (slot * batch_size,), (batch_size,))
        xb, yb = xs[idx], ys[idx]
    else:
        idx = jax.random.choice(k_idx, xs.shape[0], (batch_size,), replace=False)
        xb, yb = xs[idx], ys[idx]
    if augment != "none":
        xb = random_crop_flip(jax.random.fold_in(k_step, 1), xb, flip=augment == "crop_flip")
    if transform is not None:
        xb, yb = transform(tkey, xb, yb)

    def loss_fn(p):
        m = nnx.merge(graphdef, p, stats, rest, copy=True)  # variables of this trace: BatchNorm updates its own
        forward = getattr(m, "training_logits", None)
        logits = m(xb) if forward is None else forward(xb, jax.random.fold_in(k_step, 2))
        # the updated running statistics, in their dtypes (the loop's carry keeps its types)
        new = jax.tree.map(lambda a, b: a.astype(b.dtype), nnx.state(m, nnx.BatchStat), stats)
        return loss_and_accuracy(logits, yb)[0], new

    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    finite = jnp.isfinite(loss)
    for p in jax.tree.leaves((params, stats)):  # a non-finite gradient or update shows here
        finite &= jnp.all(jnp.isfinite(p))
    return params, stats, opt_state, loss, finite


@functools.partial(
    jax.jit, static_argnames=("graphdef", "tx", "batch_size", "augment", "sampling", "transform"),
    donate_argnames=("params", "stats", "opt_state"),
)
def train_steps(graphdef, tx, batch_size, augment, sampling, params, stats, rest, opt_state, key, xs, ys, start, stop,
                transform=None):
    """Optimiser steps ``start .. stop - 1`` in one compiled loop (the trip count is traced).

    Stops after the first step whose loss or updated parameters are not finite. Returns
    ``(params, stats, opt_state, steps_done, loss)``: ``steps_done`` is ``stop`` when
    every step was finite, else the index of the bad step, and ``loss`` is that
    step's loss (else the last step's).
    """

    loss0 = jnp.zeros((), jnp.result_type(float))  # losses are carried at the widest float

    n = xs.shape[0]
    epochs = _uses_epochs(sampling, batch_size, n)
    per_epoch = max(1, n // batch_size)

    def cond(carry):
        step, _, _, _, _, ok, _ = carry
        return (step < stop) & ok

    def body(carry):
        step, params, stats, opt_state, _, _, perm = carry
        if epochs:  # a new shuffle at the first step of each epoch
            perm = jax.lax.cond((step % per_epoch == 0) & (step != start),
                                lambda: _epoch_permutation(key, step // per_epoch, n), lambda: perm)
        params, stats, opt_state, loss, finite = one_step(
            graphdef, tx, batch_size, augment, sampling, transform, params, stats, rest, opt_state, key, xs, ys, step,
            perm)
        return jnp.where(finite, step + 1, step), params, stats, opt_state, loss.astype(loss0.dtype), finite, perm

    perm = _epoch_permutation(key, start // per_epoch, n) if epochs else jnp.zeros((0,), jnp.int32)
    init = (start, params, stats, opt_state, loss0, jnp.asarray(True), perm)
    step, params, stats, opt_state, loss, _, _ = jax.lax.while_loop(cond, body, init)
    return params, stats, opt_state, step, loss


@functools.partial(jax.jit, static_argnames=("graphdef",))
def evaluate(graphdef, params, stats, rest, x_test, y_test, x_train, y_train):
    m = nnx.merge(graphdef, params, stats, rest)
    te = loss_and_accuracy(m(x_test), y_test)
    tr = loss_and_accuracy(m(x_train), y_train)
    return {"test_loss": te[0], "test_accuracy": te[1], "train_loss": tr[0], "train_accuracy": tr[1]}


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _eval_sums(graphdef, params, stats, rest, x, y):
    logits = nnx.merge(graphdef, params, stats, rest)(x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return loss.sum(), (jnp.argmax(logits, axis=-1) == y).sum()


def evaluate_chunked(graphdef, params, stats, rest, chunk, x_test, y_test, x_train, y_train):
    """:func:`evaluate` in chunks of ``chunk`` examples (same numbers up to float rounding)."""
    out = {}
    for split, x, y in (("test", x_test, y_test), ("train", x_train, y_train)):
        loss = correct = 0.0
        for i in range(0, len(x), chunk):
            l, c = _eval_sums(graphdef, params, stats, rest, x[i : i + chunk], y[i : i + chunk])
            loss, correct = loss + float(l), correct + float(c)
        out[f"{split}_loss"], out[f"{split}_accuracy"] = loss / y.size, correct / y.size
    return out


@functools.partial(
    jax.jit, static_argnames=("graphdef", "tx", "batch_size", "augment", "sampling", "transform"),
    donate_argnames=("params", "stats", "opt_state"),
)
def _train_step(graphdef, tx, batch_size, augment, sampling, params, stats, rest, opt_state, key, xs, ys, step, perm,
                transform=None):
    """One step (:func:`one_step`) as its own program, for :func:`run_per_step`."""
    return one_step(graphdef, tx, batch_size, augment, sampling, transform, params, stats, rest, opt_state, key, xs,
                    ys, step, perm)


def run_per_step(graphdef, tx, batch_size, augment, sampling, params, stats, rest, opt_state, key, xs, ys, start,
                 stop, transform):
    """Steps ``start .. stop - 1`` dispatched one by one from Python; returns what :func:`train_steps` does.

    The finiteness flags are read once, after the last step (no sync per step),
    so a few steps may run past a bad one; they are discarded with it.
    """
    losses, flags = [], []
    n = xs.shape[0]
    epochs = _uses_epochs(sampling, batch_size, n)
    per_epoch = max(1, n // batch_size)
    perm = jnp.zeros((0,), jnp.int32)
    for step in range(start, stop):
        if epochs and (step == start or step % per_epoch == 0):
            perm = _epoch_permutation_jit(key, jnp.asarray(step // per_epoch, jnp.uint32), n)
        params, stats, opt_state, loss, finite = _train_step(
            graphdef, tx, batch_size, augment, sampling, params, stats, rest, opt_state, key, xs, ys,
            jnp.asarray(step, jnp.uint32), perm, transform=transform)
        losses.append(loss)
        flags.append(finite)
    flags = np.asarray(jnp.stack(flags))
    bad = int(np.argmin(flags)) if not flags.all() else len(flags) - 1
    return params, stats, opt_state, start + bad + (0 if not flags.all() else 1), losses[bad]


def _has_convolution(graphdef, states, x_shape, x_dtype) -> bool:
    """Whether the model's forward pass convolves (looked up in its jaxpr); ``states``: the model's, split."""
    x = jax.ShapeDtypeStruct((1, *x_shape), x_dtype)
    jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, *s)(x))(tuple(states), x)

    def subjaxprs(value):
        if hasattr(value, "eqns"):  # a Jaxpr
            yield value
        elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # a ClosedJaxpr
            yield value.jaxpr
        elif isinstance(value, (tuple, list)):
            for v in value:
                yield from subjaxprs(v)

    def walk(jx) -> bool:
        for eqn in jx.eqns:
            if eqn.primitive.name == "conv_general_dilated":
                return True
            if any(walk(sub) for v in eqn.params.values() for sub in subjaxprs(v)):
                return True
        return False

    return walk(jaxpr.jaxpr)


def compiled_loop_is_faster(graphdef, states, xs) -> bool:
    """The compiled loop, except for convolutional models on XLA's CPU backend (``states``: the
    model's states as ``nnx.split`` gave them with ``graphdef``).

    There, a convolution's weight gradient inside a ``while`` body is left in a
    layout that XLA:CPU runs with its slow generic emitter (measured 3-40x
    slower per step than the same step compiled on its own, jax 0.9), which
    costs far more than the Python dispatch the loop saves.
    """
    if xs.devices().pop().platform != "cpu":
        return True
    return not _has_convolution(graphdef, states, xs.shape[1:], xs.dtype)


def loss_and_accuracy(logits, y):
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    acc = (jnp.argmax(logits, axis=-1) == y).mean()
    return loss, acc

