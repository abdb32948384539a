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

The computations themselves (the Gram recursion, the closure and the depth-2
cumulants) are in :mod:`similarity._tensor_inner`; this module resolves the
method, validates, compiles and vmaps them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._linalg import pow2_at
from funsim.similarity._precision import full_precision, sum_of_products
from funsim.similarity._tensor_inner import KERNEL_METRICS, inner_core
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
    return program, np.int32(KERNEL_METRICS.index(metric))


def _by_metric(code, program: str, depth: int, body):
    """``body(kernel)`` for the traced metric ``code``: one ``lax.switch`` over the kernels that
    share the ``"kernel"`` program (three at depth 1, where the Gaussian metric is one of them,
    else two), or ``body(None)`` for the other programs. Branching once around the whole
    computation, not per node, leaves XLA free to schedule what is inside."""
    if program != "kernel":
        return body(None)
    return jax.lax.switch(code, [functools.partial(body, k) for k in range(3 if depth == 1 else 2)])



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
    body = lambda k: inner_core(net_a, net_b, k, program, outputs)  # noqa: E731
    return _by_metric(code, program, network_depth(net_a), body)


@functools.partial(jax.jit, static_argnames=("program", "outputs"))
def _similarity_jit(net_a, net_b, code, program, outputs):
    def body(k):
        ab = inner_core(net_a, net_b, k, program, outputs)
        aa = inner_core(net_a, net_a, k, program, outputs, same=True)
        bb = inner_core(net_b, net_b, k, program, outputs, same=True)
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
            return jax.vmap(lambda net_j: inner_core(net_i, net_j, k, program, outputs))(stacked)

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
    na, nb = sum_of_products(va, va), sum_of_products(vb, vb)
    cause = "all weights are zero, so the cosine is undefined."
    check_positive_result(na, "||net_a weights||^2", cause)
    check_positive_result(nb, "||net_b weights||^2", cause)
    return sum_of_products(va, vb) / jnp.sqrt(na * nb)


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
    return jnp.mean(sum_of_products(ya, yb, axis=-1) / (na * nb))


@full_precision
def behavioral_similarity(net_a, net_b, x: ArrayLike, /) -> jax.Array:
    """Deprecated spelling of :func:`behavioural_similarity` (the same function); it will be removed."""
    warn_at_caller("behavioral_similarity is deprecated: use behavioural_similarity (the same function).",
                   DeprecationWarning)
    return behavioural_similarity(net_a, net_b, x)

