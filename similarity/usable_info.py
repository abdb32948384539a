"""Usable (V-)information (Xu et al. 2020; docs/design.md §3).

For a predictive family V, ``H_V(Y|Z) = inf_{f in V} E[-log f[Z](Y)]`` and
``I_V(Z -> Y) = H_V(Y|∅) - H_V(Y|Z)``, in nats. Every quantity here is
estimated on a held-out split by default (fit on the train rows, evaluate the
cross-entropy on the test rows) and also reports its in-sample counterpart
(evaluated on the rows it was fitted on), so the leakage gap is visible.

Families:

* ``"linear"``: multinomial logistic regression on the *whitened* features
  (train mean, Cholesky of the train covariance), with an L2 penalty
  ``l2/2 ||W||^2`` on the weights (not the bias), trained to convergence by
  optax L-BFGS (gradient norm below ``tol`` or ``max_iter`` steps). Whitening
  makes the fitted family, penalty included, invariant to any invertible
  linear map of ``Z``; it needs more train rows than features.
* ``"mlp"``: the linear family plus one hidden layer,
  ``logits = h W + b + relu(h W1 + b1) W2``, initialised at the fitted linear
  solution with ``W2 = 0`` (so it contains the linear family and starts at its
  optimum); the penalty is on ``W`` and ``W2``.
* ``"gaussian_linear"``: regression, ``Y | Z ~ N(W z + b, sigma^2 I)`` with
  isotropic noise; closed form by least squares. In-sample,
  ``I_V = -(k/2) log(1 - R^2)`` with ``R^2 = 1 - SSE/SST`` pooled over the
  ``k`` target dimensions (for ``k = 1`` the familiar ``-½ log(1 - R^2)``).

The empty input (``z=None``) is the family's bias-only member: for
classification the train class frequencies (a class absent from the train
rows but present in the test rows is an error, since its held-out
cross-entropy is infinite); for regression the train mean and variance.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
from jax.typing import ArrayLike

from funsim.similarity import _validate as V
from funsim.similarity._linalg import cholesky as _cholesky
from funsim.similarity._linalg import lstsq as _lstsq
from funsim.similarity._linalg import triangular_solve as _triangular_solve
from funsim.similarity._precision import full_precision
from funsim.similarity.moments import split_weights

V_FAMILIES = ("linear", "mlp", "gaussian_linear")


class VResult(NamedTuple):
    """A V-entropy or V-information estimate, in nats per sample.

    Attributes:
      held_out: ``()`` the estimate on held-out rows (report this).
      in_sample: ``()`` the same quantity on the rows the family was fitted on.
    """

    held_out: jax.Array
    in_sample: jax.Array


class PointwiseVInfo(NamedTuple):
    """Pointwise V-information of every sample.

    Attributes:
      values: ``(n,)`` ``PVI(z_i, y_i) = -log f_∅(y_i) + log f_Z[z_i](y_i)``.
      is_train: ``(n,)`` bool; True for rows the predictors were fitted on
        (their PVI is in-sample), False for held-out rows.
    """

    values: jax.Array
    is_train: jax.Array


# ----------------------------------------------------------------------------- fitting


def _wmean(a, w):
    return jnp.einsum("n,n...->...", w, a) / jnp.sum(w)


def _whiten(z, w):
    mu = _wmean(z, w)
    zc = z - mu[None, :]
    cov = jnp.einsum("n,ni,nj->ij", w, zc, zc) / jnp.sum(w)
    chol = _cholesky(cov)
    return _triangular_solve(chol, zc.T, left_side=True, lower=True).T


def _lbfgs(fun, params, *, max_iter, tol):
    """Minimise ``fun`` with optax L-BFGS until the gradient norm is below ``tol``."""
    opt = optax.lbfgs()
    vg = optax.value_and_grad_from_state(fun)

    def step(carry):
        p, state = carry
        value, grad = vg(p, state=state)
        updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=fun)
        return optax.apply_updates(p, updates), state

    def cond(carry):
        _, state = carry
        k = otu.tree_get(state, "count")
        g = otu.tree_get(state, "grad")
        return (k == 0) | ((k < max_iter) & (otu.tree_norm(g) >= tol))

    params, _ = jax.lax.while_loop(cond, step, (params, opt.init(params)))
    return params


def _log_probs_linear(p, h):
    return jax.nn.log_softmax(jnp.einsum("nd,dk->nk", h, p["w"]) + p["b"][None, :], axis=-1)


def _log_probs_mlp(p, h):
    hid = jax.nn.relu(jnp.einsum("nd,dm->nm", h, p["w1"]) + p["b1"][None, :])
    logits = (
        jnp.einsum("nd,dk->nk", h, p["w"])
        + p["b"][None, :]
        + jnp.einsum("nm,mk->nk", hid, p["w2"])
    )
    return jax.nn.log_softmax(logits, axis=-1)


def _nll_rows(log_probs, y):
    return -jnp.take_along_axis(log_probs, y[:, None], axis=1)[:, 0]


def _fit_classifier(h, y, w_tr, *, family, n_classes, l2, hidden, max_iter, tol, key):
    """Per-row log-likelihoods ``log f[z_i](y_i)`` ``(n,)`` of the fitted classifier."""
    d = h.shape[1]
    dt = h.dtype

    def objective(p, log_probs_fn, penalised):
        ce = jnp.sum(w_tr * _nll_rows(log_probs_fn(p, h), y)) / jnp.sum(w_tr)
        return ce + 0.5 * l2 * sum(jnp.sum(p[k] ** 2) for k in penalised)

    p_lin = {"w": jnp.zeros((d, n_classes), dt), "b": jnp.zeros((n_classes,), dt)}
    p_lin = _lbfgs(
        functools.partial(objective, log_probs_fn=_log_probs_linear, penalised=("w",)),
        p_lin, max_iter=max_iter, tol=tol,
    )
    if family == "linear":
        return -_nll_rows(_log_probs_linear(p_lin, h), y)
    p = dict(
        p_lin,
        w1=jax.random.normal(key, (d, hidden), dt) / jnp.sqrt(jnp.asarray(d, dt)),
        b1=jnp.zeros((hidden,), dt),
        w2=jnp.zeros((hidden, n_classes), dt),
    )
    p = _lbfgs(
        functools.partial(objective, log_probs_fn=_log_probs_mlp, penalised=("w", "w2")),
        p, max_iter=max_iter, tol=tol,
    )
    return -_nll_rows(_log_probs_mlp(p, h), y)


def _null_classifier(y, w_tr, n_classes, dtype):
    counts = jnp.zeros((n_classes,), dtype).at[y].add(w_tr)
    return jnp.log(counts / jnp.sum(w_tr))[y]


def _gaussian_loglik(z, y, w_tr):
    """Per-row Gaussian log-likelihoods under the fitted isotropic linear model ``(n,)``."""
    k = y.shape[1]
    my = _wmean(y, w_tr)
    yc = y - my[None, :]
    if z is None:
        resid = yc
    else:
        mz = _wmean(z, w_tr)
        zc = z - mz[None, :]
        sw = jnp.sqrt(w_tr)[:, None]
        coef = _lstsq(zc * sw, yc * sw)
        resid = yc - jnp.einsum("nd,dk->nk", zc, coef)
    sq = jnp.sum(resid**2, axis=1)
    var = jnp.sum(w_tr * sq) / (jnp.sum(w_tr) * k)
    return -0.5 * k * jnp.log(2 * jnp.pi * var) - sq / (2 * var)


@functools.partial(jax.jit, static_argnames=("family", "n_classes", "hidden", "max_iter", "has_z"))
def _loglik_core(z, y, w_tr, key, l2, tol, *, family, n_classes, hidden, max_iter, has_z):
    """Per-row log-likelihoods; ``l2`` and ``tol`` are traced (a new value compiles nothing)."""
    if family == "gaussian_linear":
        return _gaussian_loglik(z if has_z else None, y, w_tr)
    if not has_z:
        return _null_classifier(y, w_tr, n_classes, w_tr.dtype)
    return _fit_classifier(
        _whiten(z, w_tr), y, w_tr, family=family, n_classes=n_classes, l2=l2, hidden=hidden,
        max_iter=max_iter, tol=tol, key=key,
    )


# ----------------------------------------------------------------------------- validation


class _Prepared(NamedTuple):
    zs: tuple
    y: jax.Array
    w_tr: jax.Array
    w_te: jax.Array
    key: jax.Array
    opts: dict


_BOUNDS = {nm: V.Bound(nm, 0.0, float("inf"), message=nm + " must be a non-negative float, got {value!r}.")
           for nm in ("l2", "tol")}


@jax.custom_jvp
def _no_derivative(v):
    """``v`` itself; differentiating through it raises (the fits are iterative: no derivative is defined here)."""
    return v


@_no_derivative.defjvp
def _no_derivative_jvp(primals, tangents):
    raise TypeError(
        "l2 and tol can be traced (jit, vmap) but not differentiated: the classifier is fitted by an "
        "iterative optimiser (L-BFGS in a while loop), which has no derivative here. Differentiate "
        "a closed-form measure instead (e.g. the stitching or regression ridge), or use finite differences."
    )


def _prepare(zs, y, *, family, split, key, n_classes, l2, hidden, max_iter, tol):
    V.check_choice(family, "family", V_FAMILIES)
    l2, tol = _BOUNDS["l2"].check(l2), _BOUNDS["tol"].check(tol)
    for nm, val in (("hidden", hidden), ("max_iter", max_iter)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{nm} must be a positive int, got {val!r}.")
    if not hasattr(y, "dtype"):
        y = np.asarray(y)
    if family == "gaussian_linear":
        y = V.as_float_array(y, "y")
        if y.ndim == 1:
            y = y[:, None]
        y = V.check_rep(y, "y")
        n_classes = 0
    else:
        if n_classes is None:
            if not V.is_concrete(y):
                raise ValueError("Pass n_classes when y is traced (inside jit/vmap).")
            n_classes = int(np.asarray(y).max()) + 1 if np.asarray(y).size else 0
        if not isinstance(n_classes, int) or n_classes < 2:
            raise ValueError(f"n_classes must be an int >= 2, got {n_classes!r}.")
        y = V.check_int_labels(y, "y", n_classes=n_classes)
    n = y.shape[0]
    out = []
    for i, z in enumerate(zs):
        nm = "z" if sum(v is not None for v in zs) == 1 else f"z{i + 1}"
        if z is None:
            out.append(None)
            continue
        z = V.check_rep(z, nm)
        if z.shape[0] != n:
            raise ValueError(
                f"{nm} and y must have the same number of samples, got {nm}.shape="
                f"{tuple(z.shape)} and y.shape={tuple(y.shape)}."
            )
        out.append(z)
    dt = next((z.dtype for z in out if z is not None), y.dtype if family == "gaussian_linear" else jnp.result_type(float))
    out = [None if z is None else z.astype(dt) for z in out]
    if family == "gaussian_linear":
        y = y.astype(dt)
    key = jax.random.key(0) if key is None else key
    k_split, k_init = jax.random.split(key)
    w_tr, w_te = split_weights(n, split, k_split, dt)
    if V.is_concrete(w_tr, y, *[z for z in out if z is not None]):
        tr = np.asarray(w_tr) > 0
        n_tr = int(tr.sum())
        for i, z in enumerate(out):
            if z is None:
                continue
            d = z.shape[1]
            if n_tr - 1 < d + (family == "gaussian_linear"):
                raise ValueError(
                    f"The train split has {n_tr} rows but the representation has {d} features; "
                    f"the {family!r} family needs more train rows than features (it "
                    "whitens / solves least squares on the train covariance). Use more samples, "
                    "a larger train fraction, or reduce the width (e.g. PCA)."
                )
            V.check_not_constant(np.asarray(z)[tr], "z (train rows)", what="V-information")
        if family != "gaussian_linear":
            yy = np.asarray(y)
            seen = np.unique(yy[tr])
            missing = np.setdiff1d(np.unique(yy[np.asarray(w_te) > 0]), seen)
            if missing.size:
                raise ValueError(
                    f"Classes {missing.tolist()} occur in the test rows but not in the train rows, "
                    "so their held-out cross-entropy is infinite. Use a stratified split "
                    "(split=(train_idx, test_idx)) or more samples."
                )
    opts = dict(family=family, n_classes=n_classes, l2=_option_array(l2, dt), hidden=hidden,
                max_iter=max_iter, tol=_option_array(tol, dt))
    return _Prepared(tuple(out), y, w_tr, w_te, k_init, opts)


def _option_array(value, dtype):
    """A checked ``l2``/``tol`` as a ``()`` array; a traced one passes through :func:`_no_derivative`."""
    return _no_derivative(jnp.asarray(value, dtype)) if V.is_traced(value) else jnp.asarray(value, dtype)


def _loglik(p: _Prepared, z):
    opts = dict(p.opts)
    l2, tol = opts.pop("l2"), opts.pop("tol")
    ll = _loglik_core(z, p.y, p.w_tr, p.key, l2, tol, has_z=z is not None, **opts)
    if V.is_traced(l2) or V.is_traced(tol):  # checked in the program: NaN out of range
        ll = V.nan_unless(_BOUNDS["l2"].ok(l2) & _BOUNDS["tol"].ok(tol), ll)
    if V.is_concrete(ll) and not np.all(np.isfinite(np.asarray(ll))):
        raise ValueError(
            "A log-likelihood is not finite (degenerate fit: perfectly predicted regression "
            "targets or an ill-conditioned covariance). Add noise, use more samples or fewer features."
        )
    return ll


def _entropy(p: _Prepared, ll) -> VResult:
    return VResult(
        held_out=-jnp.sum(p.w_te * ll) / jnp.sum(p.w_te),
        in_sample=-jnp.sum(p.w_tr * ll) / jnp.sum(p.w_tr),
    )


def _concat(*zs):
    return jnp.concatenate(zs, axis=1)


# ----------------------------------------------------------------------------- public API


@full_precision
def v_entropy(
    z: ArrayLike | None,
    y: ArrayLike,
    /,
    *,
    family: str = "linear",
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    n_classes: int | None = None,
    l2: float = 1e-3,
    hidden: int = 32,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> VResult:
    """Predictive V-entropy ``H_V(Y|Z)`` in nats per sample.

    Args:
      z: ``(n, d)`` representation, or None for ``H_V(Y|∅)`` (the label
        entropy under the family's bias-only member).
      y: ``(n,)`` integer labels, or ``(n,)``/``(n, k)`` regression targets.
      family: ``"linear"``, ``"mlp"`` (classification, integer ``y``) or
        ``"gaussian_linear"`` (regression, float ``y`` of shape ``(n,)`` or ``(n, k)``).
      split: train fraction in (0, 1) drawn with ``key``, or ``(train_idx, test_idx)``.
      key: PRNG key for the split and the MLP initialisation (default ``jax.random.key(0)``).
      n_classes: number of classes (inferred from ``y`` when concrete).
      l2: L2 penalty on the weights (classification families; traced: a new value
        compiles nothing, and ``jit`` or ``vmap`` over it work; not differentiable:
        the fit is iterative, and ``grad`` over ``l2`` or ``tol`` raises a ``TypeError``).
      hidden: MLP hidden width.
      max_iter, tol: L-BFGS stopping rule (gradient norm below ``tol``; ``tol`` is traced).

    Returns:
      :class:`VResult` ``(held_out, in_sample)``.

    Raises:
      ValueError: unknown family, labels out of range or not integer, NaN/Inf,
        mismatched samples, a train split too small, classes missing from train.

    Examples:
      >>> import jax.numpy as jnp
      >>> y = jnp.array([0, 1] * 10)
      >>> r = v_entropy(None, y, split=(jnp.arange(10), jnp.arange(10, 20)))
      >>> print(round(float(r.in_sample), 4), round(float(r.held_out), 4))  # log 2
      0.6931 0.6931
    """
    p = _prepare((z,), y, family=family, split=split, key=key, n_classes=n_classes, l2=l2,
                 hidden=hidden, max_iter=max_iter, tol=tol)
    return _entropy(p, _loglik(p, p.zs[0]))


@full_precision
def v_information(
    z: ArrayLike,
    y: ArrayLike,
    /,
    *,
    family: str = "linear",
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    n_classes: int | None = None,
    l2: float = 1e-3,
    hidden: int = 32,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> VResult:
    """Usable information ``I_V(Z -> Y) = H_V(Y|∅) - H_V(Y|Z)`` in nats (a score).

    Args:
      z: ``(n, d)``.
      y: ``(n,)`` integer labels, or ``(n,)``/``(n, k)`` regression targets.
      family, split, key, n_classes, l2, hidden, max_iter, tol: as in :func:`v_entropy`.

    Returns:
      :class:`VResult` ``(held_out, in_sample)``.

    Examples:
      >>> import jax
      >>> z = jax.random.normal(jax.random.key(0), (200, 2))
      >>> y = (z[:, 0] > 0).astype(int)
      >>> print(bool(v_information(z, y).held_out > 0.4))
      True
    """
    p = _prepare((z, None), y, family=family, split=split, key=key, n_classes=n_classes, l2=l2,
                 hidden=hidden, max_iter=max_iter, tol=tol)
    h0 = _entropy(p, _loglik(p, None))
    h1 = _entropy(p, _loglik(p, p.zs[0]))
    return VResult(*(a - b for a, b in zip(h0, h1)))


@full_precision
def conditional_v_information(
    z1: ArrayLike,
    z2: ArrayLike,
    y: ArrayLike,
    /,
    *,
    family: str = "linear",
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    n_classes: int | None = None,
    l2: float = 1e-3,
    hidden: int = 32,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> VResult:
    """``I_V(Z1 -> Y | Z2) = H_V(Y|Z2) - H_V(Y|Z1,Z2)``: what Z1 adds to Z2 (nats).

    ``(Z1, Z2)`` is the feature-wise concatenation. Both entropies use the same split.

    Args:
      z1: ``(n, d1)``.
      z2: ``(n, d2)``.
      y: ``(n,)`` integer labels, or ``(n,)``/``(n, k)`` regression targets.
      family, split, key, n_classes, l2, hidden, max_iter, tol: as in :func:`v_entropy`.

    Returns:
      :class:`VResult` ``(held_out, in_sample)``.

    Examples:
      >>> import jax
      >>> z = jax.random.normal(jax.random.key(0), (100, 2))
      >>> y = (z[:, 0] > 0).astype(int)
      >>> r = conditional_v_information(z[:, 1:], z[:, :1], y)  # z[:, 1] adds nothing
      >>> print(float(r.held_out) < 0.05, float(r.in_sample) >= 0.0)
      True True
    """
    p = _prepare((z1, z2), y, family=family, split=split, key=key, n_classes=n_classes, l2=l2,
                 hidden=hidden, max_iter=max_iter, tol=tol)
    z1, z2 = p.zs
    h2 = _entropy(p, _loglik(p, z2))
    h12 = _entropy(p, _loglik(p, _concat(z1, z2)))
    return VResult(*(a - b for a, b in zip(h2, h12)))


@full_precision
def pointwise_v_information(
    z: ArrayLike,
    y: ArrayLike,
    /,
    *,
    family: str = "linear",
    split: float | tuple[ArrayLike, ArrayLike] = 0.5,
    key: jax.Array | None = None,
    n_classes: int | None = None,
    l2: float = 1e-3,
    hidden: int = 32,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> PointwiseVInfo:
    """Pointwise V-information ``PVI(z_i, y_i) = -log f_∅(y_i) + log f_Z[z_i](y_i)``.

    Both predictors are fitted on the train rows; the mean PVI over the
    held-out rows equals ``v_information(...).held_out``.

    Args:
      z: ``(n, d)``.
      y: ``(n,)`` integer labels, or ``(n,)``/``(n, k)`` regression targets.
      family, split, key, n_classes, l2, hidden, max_iter, tol: as in :func:`v_entropy`.

    Returns:
      :class:`PointwiseVInfo` with ``values (n,)`` and ``is_train (n,)``.

    Examples:
      >>> import jax
      >>> z = jax.random.normal(jax.random.key(0), (60, 2))
      >>> r = pointwise_v_information(z, (z[:, 0] > 0).astype(int))
      >>> r.values.shape, int(r.is_train.sum())
      ((60,), 30)
    """
    p = _prepare((z, None), y, family=family, split=split, key=key, n_classes=n_classes, l2=l2,
                 hidden=hidden, max_iter=max_iter, tol=tol)
    values = _loglik(p, p.zs[0]) - _loglik(p, None)
    return PointwiseVInfo(values=values, is_train=p.w_tr > 0)
