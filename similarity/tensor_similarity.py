"""Inner products and similarities of multilinear networks, from weights alone.

docs/design.md §4. A network (a tuple of :class:`~similarity.BilinearLayer` and
:class:`~similarity.LinearLayer`) is folded into lifted pure bilinear nodes
(:func:`~similarity.multilinear.fold_network`); its depth is the number of
bilinear layers. Every inner product is summed over the network's real outputs
(or the slice ``outputs``); the lifted constant output coordinate never counts.

What each (metric, method) computes:

=============  ===========  ==============================================================
metric         method       what it is
=============  ===========  ==============================================================
``frobenius``  ``gram``     exact Frobenius inner product of the global tree tensors (lifted
                            coordinates), any depth. Not invariant to swapping left/right.
``symmetric``  ``gram``     exact inner product of the per-node symmetrised tree tensors,
                            any depth. At depth >= 2 it depends on the parametrisation, not
                            only on the input-output polynomial.
``gaussian``   ``exact``    ``E_{x~N(0,I)} <f_a(x), f_b(x)>``, exact at depth 0, 1 (closed
                            Gram form, O(h_a h_b d)) and 2 (cumulants of Gaussian quadratic
                            forms, O(h_a h_b d^3)). A function of the polynomial only.
``gaussian``   ``closure``  second-moment propagation (the tensor-similarity authors'
                            algorithm); exact at depth <= 1, an approximation beyond.
=============  ===========  ==============================================================

How far off the closure is at depth 2 (measured with ``tensor_inner`` against
``method="exact"``, which matches quadrature to 1e-8, on six random float64
two-layer networks, d=4, h=6, o=3, biases, half with a residual first layer):
the closure's self inner product ``<A|A>`` was 0.27-0.74 times the exact one
(so up to ~3.7x too small), and the similarity of two independent networks was
off by up to 0.17 in absolute value (e.g. exact 0.040 vs closure -0.127, exact
0.217 vs closure 0.079). Treat it as a cheap kernel, not as the Gaussian metric.

``method="auto"`` picks ``gram`` for frobenius/symmetric and ``exact`` for
gaussian; for gaussian at depth >= 3 it raises, because no exact polynomial
method is offered there (exactness is exponential in depth): pass
``method="closure"`` for the approximation or use
:func:`similarity.validate_numerics.monte_carlo_inner`.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._gaussian_forms import set_partitions
from funsim.similarity._linalg import pow2_at
from funsim.similarity._precision import full_precision
from funsim.similarity._validate import (
    check_bool,
    check_choice,
    check_positive_result,
    check_rep,
    is_concrete,
    warn_at_caller,
)
from funsim.similarity.multilinear import (
    BilinearLayer,
    LinearLayer,
    apply_network,
    fold_network,
    network_depth,
    resolve_outputs,
    validate_network,
    validate_network_pair,
)

METRICS = ("gaussian", "symmetric", "frobenius")
METHODS = ("auto", "exact", "gram", "closure")

__all__ = [
    "METRICS",
    "METHODS",
    "tensor_inner",
    "tensor_similarity",
    "similarity_matrix",
    "stack_networks",
    "weight_cosine",
    "behavioural_similarity",
    "behavioral_similarity",
]


# ---------------------------------------------------------------------------
# Argument handling
# ---------------------------------------------------------------------------


def _resolve_method(metric: str, method: str, depth: int) -> str:
    """Return the concrete method ("gram", "exact", "closure", "linear") or raise."""
    check_choice(metric, "metric", METRICS)
    check_choice(method, "method", METHODS)
    if depth == 0:
        return "linear"  # every metric and method coincide on an affine network
    if metric in ("frobenius", "symmetric"):
        if method == "closure":
            raise ValueError(
                f"method='closure' propagates Gaussian second moments and exists only for "
                f"metric='gaussian', not metric={metric!r}. Use method='gram' (exact for "
                f"{metric!r} at any depth)."
            )
        return "gram"  # 'auto', 'gram' and 'exact' are the same exact recursion
    if method == "gram":
        raise ValueError(
            "method='gram' is the recursion for metric='frobenius' or 'symmetric'. For "
            "metric='gaussian' use method='exact' (depth <= 2) or method='closure' (any depth)."
        )
    if method in ("auto", "exact") and depth >= 3:
        raise ValueError(
            f"metric='gaussian' has an exact method only up to depth 2, but the networks have "
            f"depth {depth} (bilinear layers); exact evaluation is exponential in depth. "
            "Options: method='closure' (the second-moment approximation, exact at depth 1), "
            "funsim.similarity.monte_carlo_inner (unbiased, with a standard error), or "
            "metric='symmetric' / 'frobenius' (exact Gram recursion at any depth)."
        )
    if depth == 1:
        return "exact"  # the closure is exact at depth 1: same computation, one compilation
    return "exact" if method == "auto" else method


def _select(down: jax.Array, outputs: tuple | None) -> jax.Array:
    """Rows of a lifted ``D~ (o+1, H)`` for the real outputs (or the slice)."""
    if outputs is None:
        return down[1:]
    return down[np.asarray(outputs, dtype=np.int64) + 1]


# ---------------------------------------------------------------------------
# Gram recursion (frobenius, symmetric) and the Gaussian closure
# ---------------------------------------------------------------------------


def _pairs(la, ra, lb, rb, g, same=False):
    """The four cross products ``(La G Lb^T, Ra G Rb^T, La G Rb^T, Ra G Lb^T)``.

    ``g`` is ``(d+1, d+1)`` or None for the identity. One matrix product; with
    ``same`` (a network with itself, ``g`` symmetric) ``Ra G La^T`` is the
    transpose of ``La G Ra^T``, so two products compute three quarters of the blocks.
    """
    if same:
        a = jnp.concatenate([la, ra], 0)
        a = a if g is None else a @ g
        h = la.shape[0]
        p = jnp.einsum("ui,vi->uv", a, la)  # (La; Ra) G La^T
        ll, rl = p[:h], p[h:]
        return ll, _product(ra, ra, g), rl.T, rl
    ha = la.shape[0]
    hb = lb.shape[0]
    a = jnp.concatenate([la, ra], 0)
    b = jnp.concatenate([lb, rb], 0)
    if g is not None:
        a = a @ g
    p = jnp.einsum("ui,vi->uv", a, b)
    return p[:ha, :hb], p[ha:, hb:], p[:ha, hb:], p[ha:, :hb]


def _product(a, b, g):
    """``a G b^T`` (``g`` None: the identity)."""
    return jnp.einsum("ui,vi->uv", a if g is None else a @ g, b)


def _frobenius_kernel(node_a, node_b, g, same=False):
    """``(La G Lb^T) * (Ra G Rb^T)``: two products, not the four blocks of :func:`_pairs`."""
    return _product(node_a.left, node_b.left, g) * _product(node_a.right, node_b.right, g)


def _symmetric_kernel(node_a, node_b, g, same=False):
    ll, rr, lr, rl = _pairs(node_a.left, node_a.right, node_b.left, node_b.right, g, same)
    return (ll * rr + lr * rl) / 2


def _gaussian_kernel(node_a, node_b, g, same=False):
    """The first node's Gaussian kernel (``x ~ N(0, I)``; ``g`` is the identity there)."""
    return _closure_kernel(node_a, node_b, g, None, None, same)


# The hidden-unit kernels that share one recursion: frobenius and symmetric at any depth,
# and the Gaussian metric at depth 1, where it is the first node's closure kernel. The
# compiled entry points take the metric as data and branch once, at the top, with
# ``lax.switch`` over these (see :func:`_by_metric`): one program for every metric.
_KERNEL_METRICS = ("frobenius", "symmetric", "gaussian")
_KERNELS = (_frobenius_kernel, _symmetric_kernel, _gaussian_kernel)


def _gram_inner(nodes_a, nodes_b, kernel: int, outputs, same=False):
    """The Gram recursion with the static kernel ``_KERNELS[kernel]``; ``same``: ``nodes_a is nodes_b``
    (a self inner product, which saves a quarter of the products)."""
    g = None
    last = len(nodes_a) - 1
    for i, (na, nb) in enumerate(zip(nodes_a, nodes_b)):
        k = _KERNELS[kernel](na, nb, g, same=same)
        if i == last:
            return jnp.einsum("pu,uv,pv->", _select(na.down, outputs), k, _select(nb.down, outputs))
        g = jnp.einsum("pu,uv,qv->pq", na.down, k, nb.down)


def _closure_kernel(node_a, node_b, m_ab, m_aa, m_bb, same=False):
    """Hidden kernel of ``E[q_u q_v]`` for jointly Gaussian lifted inputs.

    For ``x~_a, x~_b`` jointly Gaussian (constant coordinate included) with second
    moments ``M_ab = E[x~_a x~_b^T]`` (``M_xx`` likewise; None means the identity,
    i.e. ``x ~ N(0, I)``) and means ``mu = M[:, 0]``:
    ``E[q_u q_v] = tr(S_u M_aa) tr(T_v M_bb) + 2 tr(S_u M_ab T_v M_ba) - 2 (mu_a S_u mu_a)(mu_b T_v mu_b)``,
    which is Isserlis' theorem with the non-Gaussian constant corrected.
    """
    la, ra, lb, rb = node_a.left, node_a.right, node_b.left, node_b.right
    ll, rr, lr, rl = _pairs(la, ra, lb, rb, m_ab, same)
    k = ll * rr + lr * rl

    def own(left, right, m):
        if m is None:
            return jnp.einsum("ui,ui->u", left, right), left[:, 0] * right[:, 0]
        mu = m[:, 0]
        return jnp.einsum("ui,ij,uj->u", left, m, right), (left @ mu) * (right @ mu)

    ua, ma = own(la, ra, m_aa)
    ub, mb = own(lb, rb, m_bb)
    return k + ua[:, None] * ub[None, :] - 2 * ma[:, None] * mb[None, :]


def _closure_inner(nodes_a, nodes_b, outputs):
    m_ab = m_aa = m_bb = None
    last = len(nodes_a) - 1
    for i, (na, nb) in enumerate(zip(nodes_a, nodes_b)):
        k = _closure_kernel(na, nb, m_ab, m_aa, m_bb)
        if i == last:
            return jnp.einsum("pu,uv,pv->", _select(na.down, outputs), k, _select(nb.down, outputs))
        kaa = _closure_kernel(na, na, m_aa, m_aa, m_aa, same=True)
        kbb = _closure_kernel(nb, nb, m_bb, m_bb, m_bb, same=True)
        m_ab = jnp.einsum("pu,uv,qv->pq", na.down, k, nb.down)
        m_aa = jnp.einsum("pu,uv,qv->pq", na.down, kaa, na.down)
        m_bb = jnp.einsum("pu,uv,qv->pq", nb.down, kbb, nb.down)


# ---------------------------------------------------------------------------
# Exact Gaussian inner product at depth 2: cumulants of quadratic forms
# ---------------------------------------------------------------------------


_SIDE = {0: "k", 1: "k", 2: "K", 3: "K"}  # items 0, 1 are (P_k, Q_k); 2, 3 are (P'_K, Q'_K)
_IDX = "pqrstu"


def _bcast(x, letters):
    if letters == "k":
        return x[:, None]
    if letters == "K":
        return x[None, :]
    return x


def _alternating_trace(a1, b1, a2, b2):
    """``tr(a1[k] b1[K] a2[k] b2[K])`` for all (k, K): the one ``O(h_a h_b d^3)`` term.

    Mapped over k so that each step is two ``(d, d) x (h_b, d, d)`` products,
    with ``O(h_b d^2)`` memory (a single einsum would hold two ``h_a h_b d^2``
    intermediates and was 5x slower).
    """

    def one(ak):
        x, y = ak
        u = jnp.einsum("pq,Kqr->Kpr", x, b1)
        v = jnp.einsum("rs,Ksp->Krp", y, b2)
        return jnp.einsum("Kpr,Krp->K", u, v)

    return jax.lax.map(one, (a1, a2))


def _chain(parts, order, closed):
    """``tr(A_o1 ... A_om)`` (closed) or ``b_o1^T A_o2 ... A_o(m-1) b_om``, over (k, K)."""
    specs, ops = [], []
    m = len(order)
    sides = [_SIDE[it] for it in order]
    if closed and m == 4 and sides in (["k", "K", "k", "K"], ["K", "k", "K", "k"]):
        if sides[0] == "K":  # rotate the cycle so that it starts on the a side
            order = order[1:] + order[:1]
        a1, b1, a2, b2 = (parts[it][2] for it in order)
        return _alternating_trace(a1, b1, a2, b2)
    if closed:
        for j, it in enumerate(order):
            specs.append(_SIDE[it] + _IDX[j] + _IDX[(j + 1) % m])
            ops.append(parts[it][2])
    else:
        specs.append(_SIDE[order[0]] + _IDX[0])
        ops.append(parts[order[0]][1])
        for j, it in enumerate(order[1:-1]):
            specs.append(_SIDE[it] + _IDX[j] + _IDX[j + 1])
            ops.append(parts[it][2])
        specs.append(_SIDE[order[-1]] + _IDX[m - 2])
        ops.append(parts[order[-1]][1])
    out = "".join(s for s in "kK" if any(s in sp for sp in specs))
    return _bcast(jnp.einsum(",".join(specs) + "->" + out, *ops), out)


def _cumulant(parts, block):
    """Joint cumulant of the quadratic forms in ``block``, broadcastable to (h_a, h_b).

    A form is ``q = c + 2 b^T x + x^T A x`` with ``x ~ N(0, I)``. The cumulant
    generating function ``sum t_i c_i - 1/2 log det(I - 2 A(t)) + 2 b(t)^T (I - 2A(t))^{-1} b(t)``
    gives ``kappa_1 = c + tr A`` and, for ``m >= 2`` distinct forms,
    ``2^{m-1} [sum over (m-1)! cyclic orders tr(A...A) + sum over m! orders b^T A...A b]``.
    A and the chains are symmetric under reversal, so each distinct term is
    computed once and doubled.
    """
    if len(block) == 1:
        it = block[0]
        c, _, a = parts[it]
        return _bcast(c + jnp.einsum("uii->u", a), _SIDE[it])
    m = len(block)
    total = 0.0
    first, rest = block[0], block[1:]
    for perm in itertools.permutations(rest):
        if m >= 3 and perm[0] > perm[-1]:
            continue  # the reversed cycle has the same trace
        total = total + (1 if m == 2 else 2) * _chain(parts, (first, *perm), True)
    for perm in itertools.permutations(block):
        if perm[0] > perm[-1]:
            continue  # the reversed chain has the same value
        total = total + 2 * _chain(parts, perm, False)
    return 2 ** (m - 1) * total


def _quadratic_forms(node1, node2):
    """Layer-2 hidden factors as symmetric quadratic forms of ``x~``: ``P, Q: (H2, d+1, d+1)``."""
    l1, r1, d1 = node1.left, node1.right, node1.down
    l2, r2 = node2.left, node2.right
    s = jnp.einsum("au,ui,uj->aij", d1, l1, r1)
    s = (s + jnp.swapaxes(s, -1, -2)) / 2
    p = jnp.einsum("ka,aij->kij", l2, s)
    q = jnp.einsum("ka,aij->kij", r2, s)
    return p, q


def _split(p):
    return p[:, 0, 0], p[:, 1:, 0], p[:, 1:, 1:]


def _fourth_moments(pa, qa, pb, qb):
    """``E[q_Pa[k] q_Qa[k] q_Pb[K] q_Qb[K]]`` for ``x ~ N(0, I)``: ``(h_a, h_b)``.

    The moment is the sum over the 15 set partitions of the four forms of the
    products of their joint cumulants (moment-cumulant formula).
    """
    parts = {0: _split(pa), 1: _split(qa), 2: _split(pb), 3: _split(qb)}
    cache: dict = {}
    total = 0.0
    for partition in set_partitions([0, 1, 2, 3]):
        term = 1.0
        for block in partition:
            key = tuple(block)
            if key not in cache:
                cache[key] = _cumulant(parts, key)
            term = term * cache[key]
        total = total + term
    return jnp.broadcast_to(total, (pa.shape[0], pb.shape[0]))


def _gaussian_exact2(nodes_a, nodes_b, outputs):
    pa, qa = _quadratic_forms(nodes_a[0], nodes_a[1])
    pb, qb = _quadratic_forms(nodes_b[0], nodes_b[1])
    e4 = _fourth_moments(pa, qa, pb, qb)
    return jnp.einsum(
        "pu,uv,pv->", _select(nodes_a[1].down, outputs), e4, _select(nodes_b[1].down, outputs)
    )


# ---------------------------------------------------------------------------
# Cores and public entry points
# ---------------------------------------------------------------------------


def _resolved(metric: str, method: str, depth: int) -> tuple[str, np.int32]:
    """``(program, metric code)``: which compiled program computes ``(metric, method)`` at this depth
    (static), and the metric as data (traced).

    ``"kernel"``: the Gram recursion with the metric as data: frobenius and
    symmetric at any depth, and the Gaussian metric at depth 1, where the closure
    is exact and is that recursion with the Gaussian kernel; one program serves
    every metric. ``"closure"`` and ``"exact2"``: the Gaussian metric at depth
    >= 2. ``"linear"``: depth 0 (every metric coincides).
    """
    method = _resolve_method(metric, method, depth)
    if method == "linear" or method == "gram" or (metric == "gaussian" and depth == 1):
        program = "linear" if method == "linear" else "kernel"
    else:
        program = "closure" if method == "closure" else "exact2"
    return program, np.int32(_KERNEL_METRICS.index(metric))


def _by_metric(code, program: str, depth: int, body):
    """``body(kernel)`` for the traced metric ``code``: one ``lax.switch`` over the kernels that
    share the ``"kernel"`` program (three at depth 1, where the Gaussian metric is one of them,
    else two), or ``body(None)`` for the other programs. Branching once around the whole
    computation, not per node, leaves XLA free to schedule what is inside."""
    if program != "kernel":
        return body(None)
    return jax.lax.switch(code, [functools.partial(body, k) for k in range(3 if depth == 1 else 2)])


def _inner_core(net_a, net_b, kernel, program, outputs, same=False):
    """Unvalidated inner product of two (unbatched) networks; ``program`` from :func:`_resolved`,
    ``kernel`` the static index into :data:`_KERNELS` (the ``"kernel"`` program, see
    :func:`_by_metric`); ``same``: ``net_b`` is ``net_a`` (a self inner product, with symmetric
    products to exploit)."""
    nodes_a = fold_network(net_a)
    nodes_b = nodes_a if same else fold_network(net_b)
    if program == "linear":
        wa, wb = nodes_a[0], nodes_b[0]
        return jnp.einsum("pi,pi->", _select(wa, outputs), _select(wb, outputs))
    if program == "kernel":
        return _gram_inner(nodes_a, nodes_b, kernel, outputs, same)
    if program == "closure":
        return _closure_inner(nodes_a, nodes_b, outputs)
    return _gaussian_exact2(nodes_a, nodes_b, outputs)


def _prepare(net_a, net_b, metric, method, outputs):
    net_a, net_b = validate_network_pair(net_a, net_b)
    depth_a, depth_b = network_depth(net_a), network_depth(net_b)
    if depth_a != depth_b:
        raise ValueError(
            f"net_a has depth {depth_a} but net_b has depth {depth_b} (bilinear layers); "
            "the inner products here compare networks of equal depth. For the Gaussian metric, "
            "append identity bilinear layers to the shallower one (left=I, right=0, "
            "right_bias=1, down=I computes y * 1 = y), or use monte_carlo_inner."
        )
    program, code = _resolved(metric, method, depth_a)
    outputs = resolve_outputs(outputs, net_a[-1].d_out)
    return net_a, net_b, program, code, outputs


@functools.partial(jax.jit, static_argnames=("program", "outputs"))
def _inner_jit(net_a, net_b, code, program, outputs):
    body = lambda k: _inner_core(net_a, net_b, k, program, outputs)  # noqa: E731
    return _by_metric(code, program, network_depth(net_a), body)


@functools.partial(jax.jit, static_argnames=("program", "outputs"))
def _similarity_jit(net_a, net_b, code, program, outputs):
    def body(k):
        ab = _inner_core(net_a, net_b, k, program, outputs)
        aa = _inner_core(net_a, net_a, k, program, outputs, same=True)
        bb = _inner_core(net_b, net_b, k, program, outputs, same=True)
        return ab, aa, bb

    return _by_metric(code, program, network_depth(net_a), body)


@full_precision
def tensor_inner(
    net_a,
    net_b,
    /,
    *,
    metric: str = "gaussian",
    method: str = "auto",
    outputs=None,
) -> jax.Array:
    """Inner product ``<A|M|B>`` of two multilinear networks from their weights.

    See the module docstring for what each metric/method computes and its cost.
    ``gaussian`` is ``E_{x~N(0,I)} sum_p f_a(x)_p f_b(x)_p``: exact at depths 0-2
    (``exact``), approximate beyond depth 1 with ``closure``. ``frobenius`` and
    ``symmetric`` use the exact Gram recursion at any depth.

    Args:
      net_a: a layer or tuple of layers; input width d, o outputs.
      net_b: the same input and output widths and the same depth as ``net_a``.
      metric: ``"gaussian"``, ``"symmetric"`` or ``"frobenius"``.
      method: ``"auto"``, ``"exact"``, ``"gram"`` or ``"closure"``.
      outputs: None (all outputs), a slice, or a sequence of output indices; the
        inner product is summed over those outputs only.

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: for invalid networks, mismatched widths or depths, an unknown
        metric/method, or a method that does not exist at this depth.

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import BilinearLayer
      >>> sq = BilinearLayer(jnp.ones((1, 1)), jnp.ones((1, 1)), jnp.ones((1, 1)))  # x^2
      >>> float(tensor_inner(sq, sq))   # E[x^4]
      3.0
    """
    net_a, net_b, program, code, outputs = _prepare(net_a, net_b, metric, method, outputs)
    return _inner_jit(net_a, net_b, code, program, outputs)


def _max_abs(*arrays) -> jax.Array:
    """``()``: the largest magnitude over the arrays that are not None."""
    return functools.reduce(jnp.maximum, [jnp.max(jnp.abs(a)) for a in arrays if a is not None])


def _div(a, c):
    return None if a is None else a / c


def pow2_normalised(net: tuple) -> tuple:
    """The same network up to one power-of-two factor on its output, its layers at unit scale (exact).

    Layer by layer, with the input at scale ``s`` (1 for the network's input): a linear layer
    ``W h + b`` becomes ``g (W' h' + b')`` with ``W' = s W / g``, ``b' = b / g`` and ``g`` the
    power of two at their largest magnitude; a bilinear layer's left and right factors are
    normalised the same way (``a``, ``b``), its down projection takes ``a b`` and is divided by
    the new scale ``t`` (the power of two at its largest magnitude, or ``s`` for a residual
    layer, whose input passes through unchanged). Multiplying by powers of two is exact, and
    every metric's normalised inner product is invariant to a factor on either network's
    output, so :func:`tensor_similarity` is unchanged where nothing overflows and defined where
    the raw weights (e.g. scaled by 1e10 or 1e-10 in float32) would overflow or underflow. No
    gradient flows through the factors (they are piecewise constant).

    Args:
      net: a validated network (a tuple of layers, no stacking axis).

    Returns:
      The rescaled network (same structure, shapes and dtype).
    """
    s = None
    out = []
    for layer in net:
        if isinstance(layer, LinearLayer):
            w = layer.weight if s is None else layer.weight * s
            g = pow2_at(_max_abs(w, layer.bias))
            out.append(LinearLayer(w / g, _div(layer.bias, g)))
            s = g
            continue
        assert isinstance(layer, BilinearLayer)
        left = layer.left if s is None else layer.left * s
        right = layer.right if s is None else layer.right * s
        a = pow2_at(_max_abs(left, layer.left_bias))
        b = pow2_at(_max_abs(right, layer.right_bias))
        down = layer.down * (a * b)
        t = (jnp.ones((), down.dtype) if s is None else s) if layer.residual else pow2_at(
            _max_abs(down, layer.down_bias))
        out.append(BilinearLayer(left / a, right / b, down / t, _div(layer.left_bias, a), _div(layer.right_bias, b),
                                 _div(layer.down_bias, t), residual=layer.residual))
        s = t
    return tuple(out)


@full_precision
def tensor_similarity(
    net_a,
    net_b,
    /,
    *,
    metric: str = "gaussian",
    method: str = "auto",
    outputs=None,
) -> jax.Array:
    """Normalised inner product ``<A|M|B> / sqrt(<A|M|A> <B|M|B>)``, a score in [-1, 1].

    The self inner products use the same metric, method and output slice.
    Invariances: ``gaussian`` depends only on the functions (any reparametrisation
    with the same input-output polynomial gives 1). ``symmetric`` is invariant to
    hidden permutations, per-unit rescaling ``(L_h c, R_h / c)``, left/right swaps
    and invertible changes of basis between layers. ``frobenius`` has the same
    invariances except the left/right swap.

    Args:
      net_a: a layer or tuple of layers.
      net_b: a layer or tuple of layers with the same widths and depth.
      metric: see :func:`tensor_inner`.
      method: see :func:`tensor_inner`.
      outputs: see :func:`tensor_inner`.

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: as :func:`tensor_inner`, and when a network has zero norm
        (e.g. all ``down`` weights zero), for which the similarity is undefined.

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import BilinearLayer
      >>> a = BilinearLayer(jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 1.0]]), jnp.ones((1, 1)))
      >>> b = BilinearLayer(jnp.array([[0.0, 2.0]]), jnp.array([[0.5, 0.0]]), jnp.ones((1, 1)))
      >>> round(float(tensor_similarity(a, b)), 6)   # both compute x1 * x2
      1.0
    """
    net_a, net_b, program, code, outputs = _prepare(net_a, net_b, metric, method, outputs)
    # each network at unit scale (exact powers of two): the ratio is unchanged, and weights far
    # from 1 (x 1e10, x 1e-10 in float32) neither overflow nor underflow
    net_a, net_b = pow2_normalised(net_a), pow2_normalised(net_b)
    ab, aa, bb = _similarity_jit(net_a, net_b, code, program, outputs)
    for value, side in ((aa, "net_a"), (bb, "net_b"), (ab, "net_a, net_b")):
        if is_concrete(value) and not np.isfinite(np.asarray(value)):
            raise ValueError(
                f"<{side}|{metric}|...> is not finite in {value.dtype} even with every layer at unit scale: "
                "the network's function spans more orders of magnitude than the dtype holds (e.g. a residual "
                "branch far larger or smaller than the stream it adds to). Use float64 (x64) or rescale the "
                "weights."
            )
    cause = "the network is zero on the selected outputs; its similarity is undefined (0/0)."
    check_positive_result(aa, f"<net_a|{metric}|net_a>", cause)
    check_positive_result(bb, f"<net_b|{metric}|net_b>", cause)
    return ab / jnp.sqrt(aa * bb)


@full_precision
def stack_networks(nets, /) -> tuple:
    """A list of networks with one architecture -> one network whose leaves have a leading axis.

    The stacked network is what :func:`similarity_matrix` and ``jax.vmap`` over
    checkpoints take.

    Args:
      nets: a non-empty sequence of networks (a layer or a tuple of layers each),
        all with the same structure and leaf shapes.

    Returns:
      A tuple of layers whose every leaf is ``(n, ...)``.

    Raises:
      ValueError: an empty list, an invalid network, or a network whose
        structure or shapes differ from the first's (the message names it).

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import BilinearLayer
      >>> nets = [BilinearLayer(jnp.ones((3, 2)) * s, jnp.ones((3, 2)), jnp.ones((1, 3))) for s in (1.0, 2.0)]
      >>> stack_networks(nets)[0].left.shape
      (2, 3, 2)
    """
    nets = [validate_network(n, f"nets[{i}]") for i, n in enumerate(nets)]
    if not nets:
        raise ValueError("nets is empty; pass at least one network.")
    ref = jax.tree.structure(nets[0])
    ref_shapes = [np.shape(x) for x in jax.tree.leaves(nets[0])]
    for i, n in enumerate(nets[1:], 1):
        shapes = [np.shape(x) for x in jax.tree.leaves(n)]
        if jax.tree.structure(n) != ref or shapes != ref_shapes:
            raise ValueError(
                f"nets[{i}] does not have the structure and shapes of nets[0] (leaf shapes "
                f"{shapes} vs {ref_shapes}); checkpoints must share one architecture to be "
                "stacked. Pad hidden units with zeros (zero rows of left/right and zero "
                "columns of down do not change the function)."
            )
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *nets)


@functools.partial(jax.jit, static_argnames=("program", "outputs"))
def _matrix_jit(stacked, code, program, outputs):
    # Row i against every column j at once: with net_i unbatched and net_j vmapped,
    # the first node's cross products become one large matrix product per row
    # (A_i @ [A_1 ... A_n]^T), far faster than n^2 small batched products.
    def body(k):
        def row(net_i):
            return jax.vmap(lambda net_j: _inner_core(net_i, net_j, k, program, outputs))(stacked)

        return jax.lax.map(row, stacked)

    gram = _by_metric(code, program, network_depth(stacked), body)
    return (gram + gram.T) / 2


@full_precision
def similarity_matrix(
    nets,
    /,
    *,
    metric: str = "gaussian",
    method: str = "auto",
    outputs=None,
    return_inner: bool = False,
) -> jax.Array:
    """Similarity matrix over many checkpoints in one jit-compiled, vmapped call.

    The cross inner products ``<A_i|M|A_j>`` are computed in one jit-compiled call:
    a loop over rows i, each row vmapped over all checkpoints j (so the first
    layer's cross products are one large matrix product per row), then the matrix
    is symmetrised and normalised by its own diagonal; no ``n^2`` separate calls.
    Memory is that of one row: n times one pair's working set.

    Args:
      nets: either a Python ``list`` of networks (each a layer or a tuple of
        layers, all with the same architecture), or one stacked network: a layer or
        a tuple of layers whose every leaf has a leading axis of length n.
      metric: see :func:`tensor_inner`.
      method: see :func:`tensor_inner`.
      outputs: see :func:`tensor_inner`.
      return_inner: return the unnormalised inner-product matrix instead.

    Returns:
      ``(n, n)`` symmetric matrix of similarities (ones on the diagonal), or of
      inner products with ``return_inner``.

    Raises:
      ValueError: for invalid or differently shaped checkpoints, and for a
        checkpoint with zero norm.

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import BilinearLayer
      >>> a = BilinearLayer(jnp.array([[1.0, 0.0]]), jnp.array([[1.0, 0.0]]), jnp.ones((1, 1)))
      >>> b = BilinearLayer(jnp.array([[0.0, 1.0]]), jnp.array([[0.0, 1.0]]), jnp.ones((1, 1)))
      >>> import numpy as np
      >>> np.asarray(similarity_matrix([a, b]), float).round(4).tolist()   # x1^2 vs x2^2
      [[1.0, 0.3333], [0.3333, 1.0]]
    """
    return_inner = check_bool(return_inner, "return_inner")
    if isinstance(nets, list):
        stacked = stack_networks(nets)
    else:
        stacked = validate_network(nets, "nets", batch_ndim=1)
    one = jax.tree.map(lambda x: x[0], stacked)
    program, code = _resolved(metric, method, network_depth(one))
    outputs = resolve_outputs(outputs, one[-1].d_out)
    gram = _matrix_jit(stacked, code, program, outputs)
    if return_inner:
        return gram
    diag = jnp.diagonal(gram)
    check_positive_result(
        diag, f"<net_i|{metric}|net_i>",
        "a checkpoint is zero on the selected outputs; its similarity is undefined (0/0).",
    )
    return gram / jnp.sqrt(diag[:, None] * diag[None, :])


# ---------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------


@full_precision
def weight_cosine(net_a, net_b, /) -> jax.Array:
    """Cosine of the flattened weights (every leaf, biases included), a score in [-1, 1].

    A naive baseline: it is *not* invariant to hidden-unit permutations,
    rescalings or left/right swaps, unlike :func:`tensor_similarity`.

    Args:
      net_a: a layer or tuple of layers.
      net_b: a network with exactly the same structure and leaf shapes.

    Returns:
      A scalar ``()``.

    Raises:
      ValueError: for different structures or shapes, or an all-zero network.

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import LinearLayer
      >>> float(weight_cosine(LinearLayer(jnp.array([[1.0, 0.0]])), LinearLayer(jnp.array([[0.0, 2.0]]))))
      0.0
    """
    net_a = validate_network(net_a, "net_a")
    net_b = validate_network(net_b, "net_b")
    la, lb = jax.tree.leaves(net_a), jax.tree.leaves(net_b)
    sa = [np.shape(x) for x in la]
    sb = [np.shape(x) for x in lb]
    if jax.tree.structure(net_a) != jax.tree.structure(net_b) or sa != sb:
        raise ValueError(
            f"weight_cosine needs networks with the same structure and leaf shapes, got {sa} "
            f"and {sb}. Weight cosine is only defined between identical architectures; "
            "use tensor_similarity to compare different ones."
        )
    va = jnp.concatenate([jnp.ravel(x) for x in la])
    vb = jnp.concatenate([jnp.ravel(x) for x in lb])
    dt = jnp.promote_types(va.dtype, vb.dtype)
    va, vb = va.astype(dt), vb.astype(dt)
    na, nb = jnp.vdot(va, va), jnp.vdot(vb, vb)
    cause = "all weights are zero, so the cosine is undefined."
    check_positive_result(na, "||net_a weights||^2", cause)
    check_positive_result(nb, "||net_b weights||^2", cause)
    return jnp.vdot(va, vb) / jnp.sqrt(na * nb)


@full_precision
def behavioural_similarity(net_a, net_b, x: ArrayLike, /) -> jax.Array:
    """Mean over samples of the cosine between the two networks' output vectors.

    Args:
      net_a: a layer or tuple of layers.
      net_b: a network with the same input and output widths.
      x: ``(n, d)`` inputs.

    Returns:
      A scalar ``()`` in [-1, 1].

    Raises:
      ValueError: for mismatched widths, or (eagerly) when a network's output is
        the zero vector on some sample (its cosine is undefined).

    Examples:
      >>> import jax.numpy as jnp
      >>> from funsim.similarity.multilinear import LinearLayer
      >>> a = LinearLayer(jnp.eye(2))
      >>> round(float(behavioural_similarity(a, a, jnp.array([[1.0, 2.0], [3.0, -1.0]]))), 6)
      1.0
    """
    net_a, net_b = validate_network_pair(net_a, net_b)
    x = check_rep(x, "x", min_samples=1)
    if x.shape[1] != net_a[0].d_in:
        raise ValueError(
            f"x has {x.shape[1]} features (shape {tuple(x.shape)}) but the networks take "
            f"d={net_a[0].d_in} inputs."
        )
    ya, yb = apply_network(net_a, x), apply_network(net_b, x)
    na = jnp.linalg.norm(ya, axis=1)
    nb = jnp.linalg.norm(yb, axis=1)
    if is_concrete(na, nb) and not (np.all(np.asarray(na) > 0) and np.all(np.asarray(nb) > 0)):
        raise ValueError(
            "A network outputs the zero vector on some samples of x, where the cosine is "
            "undefined; drop those samples or compare with tensor_similarity."
        )
    return jnp.mean(jnp.einsum("no,no->n", ya, yb) / (na * nb))


@full_precision
def behavioral_similarity(net_a, net_b, x: ArrayLike, /) -> jax.Array:
    """Deprecated spelling of :func:`behavioural_similarity` (the same function); it will be removed."""
    warn_at_caller("behavioral_similarity is deprecated: use behavioural_similarity (the same function).",
                   DeprecationWarning)
    return behavioural_similarity(net_a, net_b, x)

