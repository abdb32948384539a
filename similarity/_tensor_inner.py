"""The inner products of two folded multilinear networks: the Gram recursion and the Gaussian forms.

The pure, unvalidated computations behind :mod:`similarity.tensor_similarity` (whose module
docstring says what each metric and method computes): the Gram recursion over lifted bilinear
nodes with a Frobenius, symmetric or Gaussian (first-node closure) hidden kernel, the Gaussian
second-moment closure at any depth, and the exact Gaussian inner product at depth 2 from the
cumulants of quadratic forms. :func:`inner_core` dispatches on the program
:mod:`similarity.tensor_similarity` resolves.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from funsim.similarity._gaussian_forms import set_partitions
from funsim.similarity._precision import sum_of_products
from funsim.similarity.multilinear import fold_network


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
# ``lax.switch`` over these (see :func:`similarity.tensor_similarity._by_metric`): one program for every metric.
KERNEL_METRICS = ("frobenius", "symmetric", "gaussian")
_KERNELS = (_frobenius_kernel, _symmetric_kernel, _gaussian_kernel)


def _gram_inner(nodes_a, nodes_b, kernel: int, outputs, same=False):
    """The Gram recursion with the static kernel ``_KERNELS[kernel]``; ``same``: ``nodes_a is nodes_b``
    (a self inner product, which saves a quarter of the products)."""
    g = None
    last = len(nodes_a) - 1
    for i, (na, nb) in enumerate(zip(nodes_a, nodes_b)):
        k = _KERNELS[kernel](na, nb, g, same=same)
        if i == last:
            return sum_of_products(_select(na.down, outputs), _select(nb.down, outputs) @ k.T)
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
            return sum_of_products(left, right, axis=-1), left[:, 0] * right[:, 0]
        mu = m[:, 0]
        return sum_of_products(left, right @ m.T, axis=-1), (left @ mu) * (right @ mu)

    ua, ma = own(la, ra, m_aa)
    ub, mb = own(lb, rb, m_bb)
    return k + ua[:, None] * ub[None, :] - 2 * ma[:, None] * mb[None, :]


def _closure_inner(nodes_a, nodes_b, outputs):
    m_ab = m_aa = m_bb = None
    last = len(nodes_a) - 1
    for i, (na, nb) in enumerate(zip(nodes_a, nodes_b)):
        k = _closure_kernel(na, nb, m_ab, m_aa, m_bb)
        if i == last:
            return sum_of_products(_select(na.down, outputs), _select(nb.down, outputs) @ k.T)
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
        return sum_of_products(u, jnp.swapaxes(v, -1, -2), axis=(-2, -1))

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
    return sum_of_products(_select(nodes_a[1].down, outputs), _select(nodes_b[1].down, outputs) @ e4.T)


# ---------------------------------------------------------------------------
# One inner product, by program
# ---------------------------------------------------------------------------


def inner_core(net_a, net_b, kernel, program, outputs, same=False):
    """Unvalidated inner product of two (unbatched) networks; ``program`` as
    :mod:`similarity.tensor_similarity` resolves it (``_resolved``), ``kernel`` the static index
    into :data:`_KERNELS` (the ``"kernel"`` program; the metric is a traced switch there, see
    ``_by_metric``); ``same``: ``net_b`` is ``net_a`` (a self inner product, with symmetric
    products to exploit)."""
    nodes_a = fold_network(net_a)
    nodes_b = nodes_a if same else fold_network(net_b)
    if program == "linear":
        wa, wb = nodes_a[0], nodes_b[0]
        return sum_of_products(_select(wa, outputs), _select(wb, outputs))
    if program == "kernel":
        return _gram_inner(nodes_a, nodes_b, kernel, outputs, same)
    if program == "closure":
        return _closure_inner(nodes_a, nodes_b, outputs)
    return _gaussian_exact2(nodes_a, nodes_b, outputs)
