"""Parametrisations of trainable stitchers, with exact orthogonality (docs/design.md §3).

A batch of stitchers into one target layer is zero-padded to a common source
width ``D``; the orthogonal families work with frames of ``M = max(D, d_tgt)`` rows and
``R = min(D, d_tgt)`` columns. Each family has its own parameter pytree, and a compiled
training loop sees one of them:

* ``affine``: ``{"weight": (D, d_tgt), "bias": (d_tgt,)}``.
* ``orthogonal``: ``{"gen": (M, R), "bias": (d_tgt,)}``.
* ``scaled_orthogonal``: ``{"gen": (M, R), "log_scale": (), "bias": (d_tgt,)}``.

The orthogonal families also carry constants ``{"mask": (M, R), "tall": ()}`` and the start's
completion, ``{"hh": (M, R), "tt": (R, R), "sign": (R,)}`` where ``2 R < M`` and ``{"q0": (M, M)}``
otherwise (``{}`` for affine). A batch that mixes ``orthogonal`` and
``scaled_orthogonal`` stitchers trains as ``scaled_orthogonal`` (one compiled loop) with one more
constant, ``"free": ()``, 1 for a scaled stitcher and 0 for an orthogonal one: its scale is
``exp(log_scale * free)``, so an orthogonal stitcher's scale is exactly 1 and its ``log_scale`` gets a
zero gradient (and stays at 0). Affine stitchers of the same call train in a loop of their own
within the same compiled program (:func:`similarity._stitch_train.fit_loop`), so they never pay for
an orthogonal map.

A stitcher from ``d_k`` to ``d_tgt`` features is a point ``U`` of the Stiefel manifold ``St(m_k, r_k)``
(``m_k x r_k`` with orthonormal columns, ``m_k = max(d_k, d_tgt)``, ``r_k = min(d_k, d_tgt)``): its
weight when ``d_k >= d_tgt`` (*tall*), its weight's transpose otherwise. With ``Q0`` an orthogonal
completion of its start ``Y0`` (the closed-form, identity or random start: ``Y0`` is ``Q0``'s first
``r_k`` columns)::

    U = Q0 (I - B)^{-1} (I + B) E,   B = [[X_f - X_f^T, -C^T], [C, 0]],

``E`` the first ``r_k`` columns of the identity, ``X_f`` (``r_k x r_k``, the frame's own rotations)
and ``C`` (``(m_k - r_k) x r_k``, its turn into the complement) the generator ``gen`` in ``Q0``'s
coordinates. For a tall stitcher with a closed-form or identity start this is the earlier
full-generator parametrisation ``Q0 cayley(G - G^T)`` (a wide one's weight was the first rows of that
matrix; its transpose is now parametrised as a tall one) with ``G`` kept to its first ``r_k`` columns
and first ``r_k`` rows (not ``G22``): the complement's rotations among themselves, which move ``U`` only at
second order, are left out, and ``C`` keeps its two coordinates per entry (``G[r:, :r]`` and
``G[:r, r:]``) as one coordinate with weight 2 in ``mask``. Adam-type optimisers, whose steps do not
depend on a coordinate's scale, so take the earlier step sizes (to their ``eps``); plain SGD takes twice
the earlier step in ``C``. (A random start's ``Q0`` is now the Householder completion of the random
frame, not the rest of the random orthogonal matrix: another basis of the complement.) The Cayley transform of a
skew-symmetric matrix is orthogonal (``I - B`` has singular values >= 1), hence ``U`` has
orthonormal columns at every step, to rounding; :func:`frame_cayley` computes it with an
``R x R`` solve and ``Q0`` as ``R`` Householder reflectors, ``O(M R^2)`` work, where ``2 R < M`` (the
earlier map solved the padded ``M x M`` system whatever the widths): a wide source into a narrow
layer, or a narrow source into a wide one, costs what its narrow side makes it cost. Nearly square
batches (``2 R >= M``) keep the ``M x M`` solve and a dense ``Q0``, which cost less there. ``mask`` confines the generator to the stitcher's block, so
the padded rows and columns of ``U`` are exactly 0: the padded stitcher equals the unpadded one. At
``gen = 0``, ``U = Y0``, and the derivative spans the manifold's tangent space there: every direction is
reachable from the start. For square maps (``d_k = d_tgt``) the Cayley map reaches every ``Q0 R`` with
``R`` in SO(m) without eigenvalue -1: a reflection is reachable from a closed-form or random start, not
from the identity.

Everything here except :func:`init_params` (host-side set-up) is pure jnp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity._linalg import solve
from funsim.similarity.stitching import fit_stitchers

INITS = ("closed_form", "identity", "random")


def frame_cayley(gen: jax.Array, consts: dict) -> jax.Array:
    """The stitcher's frame ``U = Q0 (I - B)^{-1} (I + B) E``, ``B = X E^T - E X^T``, ``X = gen * mask``.

    ``E`` is the first ``r`` columns of the identity, those of the stitcher's own ``r_k`` (the others
    zero); ``Q0`` is the stitcher's orthogonal completion of its start, whose first ``r_k`` columns are
    the start, identity outside its ``(m_k, m_k)`` block. So ``U = Y0`` at ``gen = 0``. In blocks (frame
    rows first), ``B = [[K, -C^T], [C, 0]]`` with ``K = X_f - X_f^T`` (``X_f`` the frame rows of ``X``) and
    ``C`` the complement rows, and ``(I - B) W = E`` is ``W = [W1; C W1]``, ``(I - K + C^T C) W1 = I``: an
    ``r x r`` system whose symmetric part is at least ``I`` (so ``||W1|| <= 1``), and
    ``(I - B)^{-1} (I + B) E = 2 W - E``. ``Q0`` acts through its ``r`` Householder reflectors. Work
    ``O(m r^2)`` per call, never an ``m x m`` matrix. Where ``2 r >= m`` (nearly square frames) the
    ``m x m`` system ``(I - B) W = E`` and a dense ``Q0`` cost less (no Gram matrix, no rounding to
    clean): the same map, to rounding.

    Args:
      gen: ``(m, r)`` generator, in the coordinates of ``Q0``.
      consts: ``mask`` ``(m, r)`` (0 outside the stitcher's block, 1 on its frame rows ``< r_k``, 2 on the
        complement rows ``r_k .. m_k``); ``Q0``: ``q0`` ``(m, m)`` where ``2 r >= m``, else
        ``(I - hh tt hh^T) diag(sign, 1, ..., 1)`` from ``hh`` ``(m, r)``, ``tt`` ``(r, r)`` and ``sign``
        ``(r,)`` (:func:`_completion`).

    Returns:
      ``(m, r)``, orthonormal on the stitcher's columns (to rounding), zero on the padded rows and columns.

    Examples:
      >>> import jax.numpy as jnp
      >>> consts = {"mask": jnp.array([[1.0], [2.0]]), "hh": jnp.zeros((2, 1)), "tt": jnp.zeros((1, 1)),
      ...           "sign": jnp.ones(1)}
      >>> u = frame_cayley(jnp.array([[0.0], [0.5]]), consts)   # the unit vector (1, 0) turned
      >>> bool(jnp.allclose(u.T @ u, 1.0, atol=1e-6))
      True
    """
    mask = consts["mask"]
    x = gen * mask
    m, r = x.shape
    dtype = x.dtype
    cols = (jnp.max(mask, axis=0) > 0).astype(dtype)  # the stitcher's own r_k columns (= its frame rows)
    if "q0" in consts:  # 2r >= m: the m x m system and the dense Q0 cost less than the reflectors
        e = jnp.eye(m, r, dtype=dtype) * cols[None, :]
        z = jnp.zeros((m, m), dtype).at[:, :r].set(x)
        return consts["q0"] @ (2.0 * solve(jnp.eye(m, dtype=dtype) - (z - z.T), e) - e)
    x_f = cols[:, None] * x[:r]  # (r, r): the frame rows
    c = x - jnp.pad(x_f, ((0, m - r), (0, 0)))  # (m, r): the complement rows
    s = jnp.eye(r, dtype=dtype) - (x_f - x_f.T) + c.T @ c
    w1 = solve(s, jnp.diag(cols))  # zero on the padded columns (there s is the identity)
    v = jnp.pad(2.0 * w1 - jnp.diag(cols), ((0, m - r), (0, 0))) + 2.0 * (c @ w1)
    # Two Newton-Schulz steps, v (3I - v^T v) / 2: the identity on an orthonormal v (and, to first order, on
    # its tangents), each squares the error left by the rounding of c^T c (eps |C|^2, large far from the
    # start): in float32 far from the start, 2.9e-3 -> 1.9e-5 -> 2.6e-7 (one step was not enough there).
    for _ in range(2):
        v = v @ (1.5 * jnp.eye(r, dtype=dtype) - 0.5 * (v.T @ v))
    v = v.at[:r].multiply(consts["sign"][:, None])
    hh = consts["hh"]
    return v - hh @ (consts["tt"] @ (hh.T @ v))


def materialise(params: dict, consts: dict, *, family: str):
    """The map ``z -> scale * z @ weight + bias`` of one padded stitcher.

    Args:
      params: the family's parameter dict (see the module docstring).
      consts: ``mask``, ``tall`` and the start's completion (:func:`frame_cayley`) for the orthogonal
        families, ``{}`` for affine.
      family: one of ``similarity.FAMILIES``.

    Returns:
      ``(weight (D, d_tgt), scale (), bias (d_tgt,), u)`` where ``u`` is the ``(M, R)``
      Stiefel frame (``R = min(D, d_tgt)``) (``None`` for affine) and ``D`` the padded source width (``params["weight"]``'s
      rows, or ``M`` for the orthogonal families: the caller slices the rows it needs).
    """
    bias = params["bias"]
    one = jnp.ones((), bias.dtype)
    if family == "affine":
        return params["weight"], one, bias, None
    u = frame_cayley(params["gen"], consts)
    (m, r), d_tgt = u.shape, bias.shape[0]
    weight = jnp.pad(u[:d_tgt].T, ((0, m - r), (0, 0)))  # a wide stitcher's weight is its frame's transpose
    if r == d_tgt:  # else every source is narrower than the target: no tall stitcher
        weight = jnp.where(consts["tall"] > 0, u, weight)
    if family == "orthogonal":
        scale = one
    elif "free" in consts:  # a batch mixing orthogonal (free = 0: scale exactly 1) and scaled stitchers
        scale = jnp.exp(params["log_scale"] * consts["free"])
    else:
        scale = jnp.exp(params["log_scale"])
    return weight, scale, bias, u


def constraint_error(u: jax.Array | None, dtype, consts: dict) -> jax.Array:
    """``max |U^T U - I|`` over the frame's columns (0 when there is no frame: affine)."""
    if u is None:
        return jnp.zeros((), dtype)
    cols = (jnp.max(consts["mask"], axis=0) > 0).astype(u.dtype)  # 1 on the stitcher's r_k columns
    return jnp.max(jnp.abs(u.T @ u - jnp.diag(cols)))


def apply_channels(z: jax.Array, weight: jax.Array, scale, bias: jax.Array) -> jax.Array:
    """``scale * z @ weight + bias`` over the last axis of ``z`` (any rank: dense or 1x1 conv)."""
    out = scale * jnp.einsum("...s,st->...t", z, weight)
    return out + bias.reshape((1,) * (out.ndim - 1) + bias.shape)


# ---------------------------------------------------------------------------
# Host-side initialisation
# ---------------------------------------------------------------------------


def _haar(key: jax.Array, m: int) -> np.ndarray:
    q, r = np.linalg.qr(np.asarray(jax.random.normal(key, (m, m)), np.float64))
    return q * np.sign(np.diag(r))


def procrustes_start(x, y, *, scaled: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """The least-squares (scaled) orthogonal map of ``y`` on ``x``, also with fewer rows than features.

    ``W = U V^T`` from the thin SVD ``U S V^T`` of the centred cross-covariance
    ``Xc^T Yc``; ``s = tr(S) / ||Xc||^2`` when ``scaled`` (else 1); ``b = mean(y) -
    s mean(x) W``. With ``n - 1`` below the widths, ``Xc^T Yc`` has rank ``< min(d_x, d_y)``
    and the singular vectors of its zero singular values are any orthonormal
    completion: every such ``W`` has the same residual ``||Yc||^2 - 2 s tr(S) + s^2 ||Xc||^2``,
    the minimum over the family on these rows. Host-side, float64.

    Returns:
      ``(weight (d_x, d_y), bias (d_y,), scale)``; ``weight`` has orthonormal columns
      (``d_x >= d_y``) or rows.

    Examples:
      >>> import numpy as np
      >>> rng = np.random.default_rng(0)
      >>> x = rng.normal(size=(5, 8)); w, b, s = procrustes_start(x, x[:, :3], scaled=False)
      >>> bool(np.allclose(w.T @ w, np.eye(3)))
      True
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    u, sv, vt = np.linalg.svd(xc.T @ yc, full_matrices=False)
    weight = u @ vt
    scale = float(sv.sum() / np.sum(xc * xc)) if scaled else 1.0
    return weight, my - scale * mx @ weight, scale


def _closed_form(family, srcs, z_tgts, ridge, labels=None):
    """``fit_stitchers`` of every (tail m, source k) pair: ``[m][k] -> (weight, bias, scale)``.

    One family's :func:`closed_form_starts`."""
    return closed_form_starts([(family, srcs, labels)], z_tgts, ridge)[0]


def closed_form_starts(jobs, z_tgts, ridge):
    """The closed-form starts of several families in one compiled fit.

    Args:
      jobs: ``(family, srcs, labels)`` triples: K sources ``(n, ..., d_k)`` of one family and
        their labels for the messages (``None``: their indices).
      z_tgts: M target activations ``(n, ..., d_tgt)``.
      ridge: ridge of the affine starts (the orthogonal families have none).

    Returns:
      per job, ``[m][k] -> (weight, bias, scale)`` as NumPy.

    The orthogonal families fall back to :func:`procrustes_start` (their exact optimum on the
    fitting rows) when a source has at least as many features as there are rows, which
    ``fit_stitchers`` refuses. Every other (job, tail, source) problem goes to ONE
    ``fit_stitchers`` call, whatever the families (one compiled program). A source that appears
    several times in a job (the same array object) is fitted once.
    """
    flat = lambda z: z.reshape(-1, z.shape[-1])  # noqa: E731  NHWC: pixels are samples
    out, problems = [], []  # problems: (job, tail m, unique source u, family, label)
    for j, (family, srcs, labels) in enumerate(jobs):
        labels = list(range(len(srcs))) if labels is None else list(labels)
        first = {}
        for k, s_ in enumerate(srcs):
            first.setdefault(id(s_), k)
        uniq = list(first.values())
        n_rows = int(flat(srcs[0]).shape[0])
        fits = [[None] * len(uniq) for _ in z_tgts]
        wide = family != "affine" and max(int(srcs[k].shape[-1]) for k in uniq) > n_rows - 1
        for m, t in enumerate(z_tgts):
            for u, k in enumerate(uniq):
                if wide:
                    w, b, sc = procrustes_start(flat(srcs[k]), flat(t), scaled=family == "scaled_orthogonal")
                    _check_scale(family, sc, labels[k])
                    fits[m][u] = (w, b, sc)
                else:
                    problems.append((j, m, u, family, labels[k]))
        out.append((fits, uniq, srcs))
    if problems:
        names = [f"{lab} -> tail {m} ({fam} start)" for _, m, _, fam, lab in problems]
        try:
            fitted = fit_stitchers(
                [flat(out[j][2][out[j][1][u]]) for j, _, u, _, _ in problems],
                [flat(z_tgts[m]) for _, m, _, _, _ in problems],
                family=[fam for *_, fam, _ in problems],
                ridge=[ridge if fam == "affine" else 0.0 for *_, fam, _ in problems],
                normalise=[fam == "affine" for *_, fam, _ in problems],
                names=names,
            )
        except ValueError as err:
            raise ValueError(
                f"init='closed_form' could not fit a start ({err}) Use init='identity' or 'random', "
                "or pass ridge > 0 for affine."
            ) from err
        for (j, m, u, fam, lab), st in zip(problems, fitted):
            scale = float(st.scale)
            _check_scale(fam, scale, lab)
            out[j][0][m][u] = (np.asarray(st.weight, np.float64), np.asarray(st.bias, np.float64), scale)
    result = []
    for fits, uniq, srcs in out:
        where = {id(srcs[k]): u for u, k in enumerate(uniq)}
        result.append([[row[where[id(s_)]] for s_ in srcs] for row in fits])
    return result


def _check_scale(family: str, scale: float, label) -> None:
    if not scale > 0:
        raise ValueError(
            f"The closed-form {family} fit of source {label} has scale {scale} <= 0 (the source is "
            "constant or uncorrelated with the target); use init='identity' or 'random'.")


def _completion(frame: np.ndarray, m: int, r: int) -> dict:
    """The orthogonal completion of a ``(m_k, r_k)`` frame, embedded in ``m`` rows and ``r`` columns.

    ``Q0`` (identity outside the frame's ``(m_k, m_k)`` block, its first ``r_k`` columns the frame): in
    Householder form ``{"hh", "tt", "sign"}`` (see :func:`frame_cayley`), ``O(m r)`` numbers, where
    ``2 r < m``; else ``{"q0": (m, m)}``. Host-side, float64.
    """
    m_k, r_k = frame.shape
    h, tau = np.linalg.qr(np.asarray(frame, np.float64), mode="raw")  # LAPACK's geqrf, h transposed
    h = h.T
    hh = np.tril(h, -1) + np.eye(m_k, r_k)  # the reflectors' vectors (unit first entry); R on and above the diagonal
    tt = np.zeros((r_k, r_k))
    for i in range(r_k):  # Q = H_1 ... H_k = I - hh tt hh^T (LAPACK's larft, forward, columnwise)
        tt[:i, i] = -tau[i] * tt[:i, :i] @ (hh[:, :i].T @ hh[:, i])
        tt[i, i] = tau[i]
    sign = np.where(np.diag(h) < 0, -1.0, 1.0)  # Q's first columns are the frame's, up to these signs
    if 2 * r >= m:
        q0 = np.eye(m)
        q0[:m_k, :m_k] = np.eye(m_k) - hh @ tt @ hh.T
        q0[:m_k, :r_k] *= sign
        return {"q0": q0}
    out = {"hh": np.zeros((m, r)), "tt": np.zeros((r, r)), "sign": np.ones(r)}
    out["hh"][:m_k, :r_k], out["tt"][:r_k, :r_k], out["sign"][:r_k] = hh, tt, sign
    return out


def init_params(
    family: str,
    init: str,
    srcs: Sequence[jax.Array],
    z_tgts: Sequence[jax.Array] | None,
    *,
    d_tgt: int,
    n_tails: int,
    ridge: float,
    keys: jax.Array,
    dtype,
    pad_to: int | None = None,
    labels: Sequence[int] | None = None,
    fits=None,
):
    """Initial padded parameters and constants of K stitchers into each of M tails.

    Args:
      family: one family for the whole batch.
      init: one of ``INITS``.
      srcs: K sources ``(n, ..., d_k)``, already resized to the target's spatial size.
      z_tgts: M target activations ``(n, ..., d_tgt)`` (needed for ``"closed_form"``).
      d_tgt: target width.
      n_tails: M.
      ridge: ridge of the closed-form affine start.
      keys: ``(K,)`` keys for the random starts (the same for every tail).
      dtype: the working float dtype.
      pad_to: pad the sources to this width instead of their largest (at least that).
      labels: the sources' indices in the caller's list (for messages; default 0..K-1).
      fits: the closed-form starts ``[m][k]``, already fitted (:func:`closed_form_starts`, for
        several families at once); ``None`` fits them here.

    Returns:
      ``(params, consts)``: pytrees of ``(M, K, ...)`` NumPy arrays in ``dtype`` (host-side: the
      caller merges batches and puts them on the device once).
    """
    widths = [int(s.shape[-1]) for s in srcs]
    d_max = max(widths) if pad_to is None else max(max(widths), int(pad_to))
    m_max, r_max = max(d_max, d_tgt), min(d_max, d_tgt)  # an orthogonal stitcher's frame: (m_max, r_max)
    if init == "closed_form" and fits is None:
        fits = _closed_form(family, srcs, z_tgts, ridge, labels)
    elif init != "closed_form":
        fits = None
    plist, clist = [], []
    for m in range(n_tails):
        for k, d_k in enumerate(widths):
            m_k, r_k, tall = max(d_k, d_tgt), min(d_k, d_tgt), d_k >= d_tgt
            weight, bias, scale = np.eye(d_k, d_tgt), np.zeros(d_tgt), 1.0
            if fits is not None:
                weight, bias, scale = fits[m][k]
            elif init == "random":
                if family == "affine":
                    weight = np.asarray(jax.random.normal(keys[k], (d_k, d_tgt)), np.float64)
                    weight = weight / math.sqrt(d_k)
                else:  # a Haar-random orthogonal matrix's (d_k, d_tgt) block
                    weight = _haar(keys[k], m_k)[:d_k, :d_tgt]
            if family == "affine":
                padded = np.zeros((d_max, d_tgt))
                padded[:d_k] = weight
                plist.append(dict(weight=padded, bias=bias))
                clist.append({})
                continue
            mask = np.zeros((m_max, r_max))
            mask[:r_k, :r_k], mask[r_k:m_k, :r_k] = 1.0, 2.0
            p = dict(gen=np.zeros((m_max, r_max)), bias=bias)
            if family == "scaled_orthogonal":
                p["log_scale"] = np.asarray(np.log(scale))
            plist.append(p)
            clist.append(dict(mask=mask, tall=np.asarray(float(tall)),
                              **_completion(weight if tall else weight.T, m_max, r_max)))

    def stack(trees):  # on the host, in the working dtype (a conversion on the device compiles a program)
        return jax.tree.map(
            lambda *a: np.stack(a).reshape(n_tails, len(widths), *np.shape(a[0])).astype(dtype), *trees,
        )

    return stack(plist), (stack(clist) if clist[0] else {})


def merge_families(groups: Sequence[tuple[str, dict, dict]]) -> tuple[str, dict, dict]:
    """One batch, for one loop, from ``(family, params, consts)`` batches of the orthogonal families.

    The batches come from :func:`init_params` with one ``pad_to`` (host arrays of one dtype);
    they are concatenated along the K axis in the order given, on the host. One batch (of any
    family) is returned as it is. The two orthogonal families merge into ``scaled_orthogonal``:
    ``orthogonal`` batches get ``log_scale = 0`` and ``free = 0``, ``scaled_orthogonal`` ones
    ``free = 1`` (see the module docstring). Affine stitchers train in a loop of their own (another
    group of the same compiled program: :func:`similarity._stitch_train.fit_loop`).

    Returns:
      ``(loop family, params, consts)``, pytrees of ``(M, K_total, ...)`` host arrays.

    Raises:
      ValueError: a family that is not a stitcher family, or affine merged with another batch.
    """
    fams = [f for f, _, _ in groups]
    for f in fams:
        if f not in ("affine", "orthogonal", "scaled_orthogonal"):
            raise ValueError(f"merge_families takes stitcher families, got {f!r}.")
    if len(groups) == 1:
        return groups[0]
    if "affine" in fams:
        raise ValueError("merge_families merges the orthogonal families; affine stitchers train in their own loop.")
    ps, cs = [], []
    for family, params, consts in groups:
        lead = params["bias"].shape[:2]  # (M, K)
        full = lambda v, lead=lead, dtype=params["bias"].dtype: np.full(lead, v, dtype)  # noqa: E731
        p, c = dict(params), dict(consts)
        if family == "orthogonal":
            p["log_scale"] = full(0.0)
        c["free"] = full(1.0 if family == "scaled_orthogonal" else 0.0)
        ps.append(p)
        cs.append(c)
    cat = lambda *a: np.concatenate(a, axis=1)  # noqa: E731
    return "scaled_orthogonal", jax.tree.map(cat, *ps), jax.tree.map(cat, *cs)
