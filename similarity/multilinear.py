"""Bilinear and linear layers as pure pytrees, and their evaluation.

A network is a tuple of :class:`BilinearLayer` and :class:`LinearLayer`
applied in order (docs/design.md §4).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funsim.similarity._precision import full_precision
from funsim.similarity._validate import check_bool, check_finite, compute_dtype, warn_float64_without_x64


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BilinearLayer:
    """One bilinear layer ``f(x) = down @ ((left x + lb) * (right x + rb)) + db [+ x]``.

    Attributes:
      left: ``(h, d)``.
      right: ``(h, d)``.
      down: ``(o, h)``.
      left_bias: ``(h,)`` or None.
      right_bias: ``(h,)`` or None.
      down_bias: ``(o,)`` or None.
      residual: static bool; adds the input to the output (requires ``o == d``).
    """

    left: jax.Array
    right: jax.Array
    down: jax.Array
    left_bias: Optional[jax.Array] = None
    right_bias: Optional[jax.Array] = None
    down_bias: Optional[jax.Array] = None
    residual: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def d_in(self) -> int:
        return self.left.shape[-1]

    @property
    def d_hidden(self) -> int:
        return self.left.shape[-2]

    @property
    def d_out(self) -> int:
        return self.down.shape[-2]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearLayer:
    """An affine layer ``f(x) = weight @ x + bias``.

    Attributes:
      weight: ``(o, d)``.
      bias: ``(o,)`` or None.
    """

    weight: jax.Array
    bias: Optional[jax.Array] = None

    @property
    def d_in(self) -> int:
        return self.weight.shape[-1]

    @property
    def d_out(self) -> int:
        return self.weight.shape[-2]


Layer = Union[BilinearLayer, LinearLayer]
Network = tuple  # tuple[Layer, ...]


class Node(NamedTuple):
    """A lifted pure bilinear node ``y~_o = x~^T (sum_u down[o, u] left[u] right[u]^T) x~``.

    Attributes:
      left: ``(H, d+1)``, the lifted left factors ``L~``.
      right: ``(H, d+1)``, the lifted right factors ``R~``.
      down: ``(o+1, H)``, the lifted output map ``D~`` (row 0: the constant output).
    """

    left: jax.Array
    right: jax.Array
    down: jax.Array


@full_precision
def apply_layer(layer: Layer, x: ArrayLike) -> jax.Array:
    """Evaluate one layer on a batch.

    Args:
      layer: a :class:`BilinearLayer` or :class:`LinearLayer`.
      x: ``(n, d)``.

    Returns:
      ``(n, o)``.
    """
    x = jnp.asarray(x)
    if isinstance(layer, LinearLayer):
        y = jnp.einsum("od,nd->no", layer.weight, x)
        return y if layer.bias is None else y + jnp.asarray(layer.bias)[None, :]
    if isinstance(layer, BilinearLayer):
        a = jnp.einsum("hd,nd->nh", layer.left, x)
        b = jnp.einsum("hd,nd->nh", layer.right, x)
        if layer.left_bias is not None:
            a = a + jnp.asarray(layer.left_bias)[None, :]
        if layer.right_bias is not None:
            b = b + jnp.asarray(layer.right_bias)[None, :]
        y = jnp.einsum("oh,nh->no", layer.down, a * b)
        if layer.down_bias is not None:
            y = y + jnp.asarray(layer.down_bias)[None, :]
        if layer.residual:
            y = y + x
        return y
    raise TypeError(
        f"Expected a BilinearLayer or LinearLayer, got {type(layer).__name__}."
    )


@full_precision
def apply_network(net: Network, x: ArrayLike) -> jax.Array:
    """Evaluate a network (a tuple of layers applied in order).

    Args:
      net: tuple of :class:`BilinearLayer` / :class:`LinearLayer`.
      x: ``(n, d)``.

    Returns:
      ``(n, o)``: the network's outputs.

    Examples:
      >>> import jax.numpy as jnp
      >>> layer = BilinearLayer(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((1, 2)))
      >>> apply_network((layer,), jnp.ones((1, 3))).tolist()
      [[18.0]]
    """
    if isinstance(net, (BilinearLayer, LinearLayer)):
        net = (net,)
    for layer in net:
        x = apply_layer(layer, x)
    return x


# ---------------------------------------------------------------------------
# Lifting, interaction tensors, differences and network validation
# ---------------------------------------------------------------------------


def _lift_input(x: jax.Array, dtype) -> jax.Array:
    """Prepend a zero column: the map ``x~ -> x`` acting on lifted inputs."""
    return jnp.concatenate([jnp.zeros(x.shape[:-1] + (1,), dtype), x.astype(dtype)], axis=-1)


@full_precision
def lift(layer: BilinearLayer) -> Node:
    """Lift a bilinear layer to a pure bilinear node on ``x~ = (1, x)``.

    Every lifted output coordinate is a quadratic form of the lifted input,
    ``y~_o = x~^T (sum_u D~[o, u] L~[u] R~[u]^T) x~``, with ``y~_0 = 1``
    (docs/design.md §4). The hidden units of the lifted node are, in order:

    * the layer's ``h`` units, ``L~ = [left_bias | left]``, ``R~ = [right_bias | right]``
      (a missing bias is 0), feeding ``D~[1:] = down``;
    * one constant unit ``L~ = R~ = e0``, feeding ``D~[0] = 1`` (the constant
      output coordinate) and ``D~[1:] = down_bias`` (0 when absent);
    * if ``residual``, ``d`` units ``L~ = [0 | I]``, ``R~ = e0``, ``D~[1:] = I``.

    Args:
      layer: a :class:`BilinearLayer` with ``left, right: (h, d)``, ``down: (o, h)``.

    Returns:
      :class:`Node` ``(left=L~, right=R~, down=D~)`` with shapes ``(H, d+1)``,
      ``(H, d+1)``, ``(o+1, H)``, where ``H = h + 1 + (d if residual else 0)``.

    Raises:
      TypeError: if ``layer`` is not a :class:`BilinearLayer` (use :func:`lift_linear`).

    Examples:
      >>> import jax.numpy as jnp
      >>> layer = BilinearLayer(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((1, 2)))
      >>> [a.shape for a in lift(layer)]
      [(3, 4), (3, 4), (2, 3)]
    """
    if not isinstance(layer, BilinearLayer):
        raise TypeError(
            f"lift expects a BilinearLayer, got {type(layer).__name__}; "
            "use lift_linear for a LinearLayer."
        )
    dtype = jnp.result_type(layer.left, layer.right, layer.down)
    h, d = layer.left.shape[-2:]
    o = layer.down.shape[-2]

    def col(bias):
        return jnp.zeros((h, 1), dtype) if bias is None else jnp.asarray(bias, dtype)[:, None]

    e0 = jnp.zeros((1, d + 1), dtype).at[0, 0].set(1)
    left = jnp.concatenate([col(layer.left_bias), layer.left.astype(dtype)], axis=1)
    right = jnp.concatenate([col(layer.right_bias), layer.right.astype(dtype)], axis=1)
    db = jnp.zeros((o,), dtype) if layer.down_bias is None else jnp.asarray(layer.down_bias, dtype)
    const_col = jnp.concatenate([jnp.ones((1,), dtype), db])[:, None]  # (o+1, 1)
    down = jnp.concatenate([jnp.zeros((1, h), dtype), layer.down.astype(dtype)], axis=0)
    ls, rs, ds = [left, e0], [right, e0], [down, const_col]
    if layer.residual:
        eye = jnp.eye(d, dtype=dtype)
        ls.append(_lift_input(eye, dtype))
        rs.append(jnp.tile(e0, (d, 1)))
        ds.append(jnp.concatenate([jnp.zeros((1, d), dtype), eye], axis=0))
    return Node(jnp.concatenate(ls, 0), jnp.concatenate(rs, 0), jnp.concatenate(ds, 1))


@full_precision
def lift_linear(layer: LinearLayer) -> jax.Array:
    """Lift an affine layer to ``block_diag(1, weight)`` with the bias in column 0.

    Args:
      layer: a :class:`LinearLayer` with ``weight: (o, d)``, ``bias: (o,)`` or None.

    Returns:
      ``W~``: ``(o+1, d+1)`` with ``W~ @ (1, x) = (1, weight @ x + bias)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> lift_linear(LinearLayer(jnp.array([[2.0]]), jnp.array([3.0]))).tolist()
      [[1.0, 0.0], [3.0, 2.0]]
    """
    if not isinstance(layer, LinearLayer):
        raise TypeError(f"lift_linear expects a LinearLayer, got {type(layer).__name__}.")
    w = jnp.asarray(layer.weight)
    o, d = w.shape[-2:]
    b = jnp.zeros((o,), w.dtype) if layer.bias is None else jnp.asarray(layer.bias, w.dtype)
    top = jnp.zeros((1, d + 1), w.dtype).at[0, 0].set(1)
    return jnp.concatenate([top, jnp.concatenate([b[:, None], w], axis=1)], axis=0)


@full_precision
def interaction_tensor(layer: BilinearLayer, *, symmetric: bool = True) -> jax.Array:
    """Materialise the lifted interaction tensor ``B[o, i, j]`` of one layer.

    ``y~_o = sum_ij B[o, i, j] x~_i x~_j`` with ``x~ = (1, x)``; ``B[0]`` is the
    constant output coordinate (``e0 e0^T``) and ``B[1:]`` are the layer's real
    outputs. With ``symmetric`` each slice is symmetrised, ``(B_o + B_o^T) / 2``.

    This costs ``O(o h d^2)`` time and ``O(o d^2)`` memory: it is meant for tests
    and small models only. The similarity functions never build it.

    Args:
      layer: a :class:`BilinearLayer` (``left: (h, d)``, ``down: (o, h)``).
      symmetric: symmetrise each slice over its two input legs.

    Returns:
      ``(o+1, d+1, d+1)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> layer = BilinearLayer(jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 1.0]]), jnp.ones((1, 1)))
      >>> interaction_tensor(layer)[1].tolist()   # x1 * x2
      [[0.0, 0.0, 0.0], [0.0, 0.0, 0.5], [0.0, 0.5, 0.0]]
    """
    symmetric = check_bool(symmetric, "symmetric")
    left, right, down = lift(layer)
    b = jnp.einsum("ou,ui,uj->oij", down, left, right)
    if symmetric:
        b = (b + jnp.swapaxes(b, -1, -2)) / 2
    return b


@full_precision
def difference(layer_new: BilinearLayer, layer_old: BilinearLayer, /) -> BilinearLayer:
    """The bilinear layer computing ``layer_new(x) - layer_old(x)``.

    The hidden units are concatenated, ``down = [down_new, -down_old]``. When both
    layers are residual the skip connections cancel; when only one is, the skip
    ``x_i = x_i * 1`` is written as ``d`` extra hidden units (``left = I``,
    ``right = 0``, ``right_bias = 1``, ``down = ±I``). The result is never
    residual. For two networks that share every layer but the last,
    ``prefix + (difference(last_new, last_old),)`` computes exactly the difference
    of the two networks.

    Args:
      layer_new: ``left, right: (h1, d)``, ``down: (o, h1)``.
      layer_old: ``left, right: (h2, d)``, ``down: (o, h2)``.

    Returns:
      A :class:`BilinearLayer` with ``h1 + h2`` hidden units (``+ d`` when exactly
      one input is residual).

    Raises:
      ValueError: if the input or output widths differ.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = BilinearLayer(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((1, 2)))
      >>> diff = difference(a, a)
      >>> diff.d_hidden, apply_network((diff,), jnp.ones((1, 3))).tolist()
      (4, [[0.0]])
    """
    for nm, lay in (("layer_new", layer_new), ("layer_old", layer_old)):
        if not isinstance(lay, BilinearLayer):
            raise TypeError(f"{nm} must be a BilinearLayer, got {type(lay).__name__}.")
        validate_network((lay,), nm)
    if (layer_new.d_in, layer_new.d_out) != (layer_old.d_in, layer_old.d_out):
        raise ValueError(
            f"difference needs layers with the same input and output widths, got "
            f"layer_new (d={layer_new.d_in}, o={layer_new.d_out}) and layer_old "
            f"(d={layer_old.d_in}, o={layer_old.d_out})."
        )
    dtype = jnp.result_type(layer_new.left, layer_old.left, layer_new.down, layer_old.down)
    d, o = layer_new.d_in, layer_new.d_out

    def bias(v, n):
        return jnp.zeros((n,), dtype) if v is None else jnp.asarray(v, dtype)

    parts = [
        (layer_new.left, layer_new.right, layer_new.down, layer_new.left_bias, layer_new.right_bias),
        (layer_old.left, layer_old.right, -jnp.asarray(layer_old.down), layer_old.left_bias,
         layer_old.right_bias),
    ]
    if layer_new.residual != layer_old.residual:
        sign = 1.0 if layer_new.residual else -1.0
        eye = jnp.eye(d, dtype=dtype)
        parts.append((eye, jnp.zeros((d, d), dtype), sign * eye, None, jnp.ones((d,), dtype)))
    any_lb = any(p[3] is not None for p in parts)
    any_rb = any(p[4] is not None for p in parts)
    left = jnp.concatenate([jnp.asarray(p[0], dtype) for p in parts], 0)
    right = jnp.concatenate([jnp.asarray(p[1], dtype) for p in parts], 0)
    down = jnp.concatenate([jnp.asarray(p[2], dtype) for p in parts], 1)
    lb = jnp.concatenate([bias(p[3], p[0].shape[0]) for p in parts]) if any_lb else None
    rb = jnp.concatenate([bias(p[4], p[0].shape[0]) for p in parts]) if any_rb else None
    db = None
    if layer_new.down_bias is not None or layer_old.down_bias is not None:
        db = bias(layer_new.down_bias, o) - bias(layer_old.down_bias, o)
    return BilinearLayer(left, right, down, lb, rb, db, residual=False)


@full_precision
def network_depth(net: Network) -> int:
    """Number of bilinear layers in a network (linear layers fold in and do not count)."""
    if isinstance(net, (BilinearLayer, LinearLayer)):
        net = (net,)
    return sum(isinstance(layer, BilinearLayer) for layer in net)


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


@full_precision
def validate_network(net, name: str = "net", *, batch_ndim: int = 0) -> tuple:
    """Check a network's structure, shapes and values; return it as a tuple of layers.

    Checks: the network is a non-empty tuple of :class:`BilinearLayer` /
    :class:`LinearLayer`; every weight has the documented rank and shape;
    consecutive widths match; a residual layer has ``o == d`` and a bool
    ``residual``; concrete weights hold no NaN/Inf (skipped under tracing, see
    :mod:`similarity._validate`).

    Dtypes follow the package's policy (:mod:`similarity._validate`): every leaf
    is cast to the network's common compute dtype, so integer and boolean
    weights become the default float dtype, float16/bfloat16 become float32, and
    complex weights raise a ``TypeError``.

    Args:
      net: a layer or a tuple of layers.
      name: the argument name used in error messages.
      batch_ndim: number of leading stacking axes on every leaf (0 for one network,
        1 for a stack of checkpoints).

    Returns:
      The network as a tuple of layers, every leaf a ``jax.Array`` of one float dtype.

    Raises:
      TypeError: for something that is not a layer or a tuple of layers, or
        complex / non-numeric weights.
      ValueError: for an empty network, inconsistent shapes or non-finite weights.
    """
    if isinstance(net, (BilinearLayer, LinearLayer)):
        net = (net,)
    if not isinstance(net, (tuple, list)):
        raise TypeError(
            f"{name} must be a BilinearLayer, a LinearLayer or a tuple of them, "
            f"got {type(net).__name__}."
        )
    net = tuple(net)
    if len(net) == 0:
        raise ValueError(
            f"{name} is an empty network (no layers); pass a tuple with at least one "
            "BilinearLayer or LinearLayer."
        )
    bd = batch_ndim
    batch = None
    prev_out = None
    dtypes: list = []
    for i, layer in enumerate(net):
        where = f"{name}[{i}]"
        if isinstance(layer, BilinearLayer):
            fields = dict(left=2, right=2, down=2, left_bias=1, right_bias=1, down_bias=1)
        elif isinstance(layer, LinearLayer):
            fields = dict(weight=2, bias=1)
        else:
            raise TypeError(
                f"{where} must be a BilinearLayer or LinearLayer, got {type(layer).__name__}."
            )
        shapes = {}
        for field, rank in fields.items():
            value = getattr(layer, field)
            if value is None:
                continue
            shp = _shape(value)
            if len(shp) != rank + bd:
                raise ValueError(
                    f"{where}.{field} must have rank {rank + bd} "
                    f"({'stack axis + ' if bd else ''}{'matrix' if rank == 2 else 'vector'}), "
                    f"got shape {shp}."
                )
            if batch is None:
                batch = shp[:bd]
            elif shp[:bd] != batch:
                raise ValueError(
                    f"{where}.{field} has stacking shape {shp[:bd]}, but other leaves have "
                    f"{batch}; stack every checkpoint the same way."
                )
            dt = jnp.dtype(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)
            dtypes.append(compute_dtype(dt, f"{where}.{field}"))
            shapes[field] = shp[bd:]
        if isinstance(layer, BilinearLayer):
            check_bool(layer.residual, f"{where}.residual")
            h, d = shapes["left"]
            o = shapes["down"][0]
            expect = dict(right=(h, d), down=(o, h), left_bias=(h,), right_bias=(h,),
                          down_bias=(o,))
            for field, shp in expect.items():
                if field in shapes and shapes[field] != shp:
                    raise ValueError(
                        f"{where}.{field} has shape {shapes[field]}, expected {shp} for a "
                        f"layer with left {(h, d)} (h={h} hidden units, d={d} inputs) and "
                        f"{o} outputs."
                    )
            if layer.residual and o != d:
                raise ValueError(
                    f"{where} is residual but maps d={d} inputs to o={o} outputs; a residual "
                    "layer adds its input to its output and needs o == d. Set residual=False "
                    "or make down of shape (d, h)."
                )
        else:
            o, d = shapes["weight"]
            if "bias" in shapes and shapes["bias"] != (o,):
                raise ValueError(
                    f"{where}.bias has shape {shapes['bias']}, expected {(o,)} for weight "
                    f"{(o, d)}."
                )
        if prev_out is not None and d != prev_out:
            raise ValueError(
                f"{name}[{i - 1}] outputs {prev_out} features but {where} expects d={d} "
                "inputs; consecutive layer widths must match."
            )
        prev_out = o
    return _cast_network(net, functools.reduce(jnp.promote_types, dtypes), name)


def _cast_network(net: tuple, dtype, name: str, *, check: bool = True) -> tuple:
    """Every leaf as a ``jax.Array`` of ``dtype``; with ``check``, NaN/Inf-checked when concrete.

    float64 while JAX's x64 mode is off is float32, with the package's ``PrecisionWarning``
    (once per process), not JAX's generic dtype-truncation warning."""
    if jnp.dtype(dtype) == jnp.dtype(jnp.float64) and not jax.config.jax_enable_x64:
        warn_float64_without_x64(name)
        dtype = jnp.float32
    out = []
    for i, layer in enumerate(net):
        cast = {}
        for f in dataclasses.fields(layer):
            value = getattr(layer, f.name)
            if f.name == "residual" or value is None:
                continue
            value = jnp.asarray(value)
            if check:
                check_finite(value, f"{name}[{i}].{f.name}")
            cast[f.name] = value if value.dtype == dtype else value.astype(dtype)
        out.append(dataclasses.replace(layer, **cast))
    return tuple(out)


@full_precision
def validate_network_pair(net_a, net_b, /, *, names: tuple[str, str] = ("net_a", "net_b")) -> tuple:
    """Validate two networks that are to be compared; cast both to one dtype.

    Each is checked by :func:`validate_network`; then both must read the same
    input width ``d`` and have the same number of outputs ``o``. Every leaf of
    both is cast to their common compute dtype.

    Args:
      net_a: a layer or a tuple of layers.
      net_b: a layer or a tuple of layers.
      names: the argument names used in error messages.

    Returns:
      ``(net_a, net_b)`` as tuples of layers.

    Raises:
      TypeError, ValueError: as :func:`validate_network`, or different input or
        output widths.

    Examples:
      >>> import numpy as np
      >>> a = LinearLayer(np.ones((2, 3), np.float32))
      >>> b = LinearLayer(np.ones((2, 3), np.float16))  # half precision computes in float32
      >>> [x.dtype.name for x in jax.tree.leaves(validate_network_pair(a, b))]
      ['float32', 'float32']
    """
    na, nb = names
    net_a = validate_network(net_a, na)
    net_b = validate_network(net_b, nb)
    da, db = net_a[0].d_in, net_b[0].d_in
    oa, ob = net_a[-1].d_out, net_b[-1].d_out
    if da != db:
        raise ValueError(
            f"{na} takes d={da} inputs but {nb} takes d={db}; the networks must read the same "
            "input space to be compared."
        )
    if oa != ob:
        raise ValueError(
            f"{na} has {oa} outputs but {nb} has {ob}; compare networks with the same outputs, "
            "or restrict both with a head (LinearLayer) first."
        )
    dt = jnp.promote_types(jax.tree.leaves(net_a)[0].dtype,
                           jax.tree.leaves(net_b)[0].dtype)
    return _cast_network(net_a, dt, na, check=False), _cast_network(net_b, dt, nb, check=False)


def resolve_outputs(outputs: Any, n_out: int, name: str = "outputs") -> tuple | None:
    """Output indices to sum over, as a tuple of non-negative ints, or None for all.

    Args:
      outputs: None, a slice, an int or a sequence of ints (negative ints count
        from the end).
      n_out: the networks' number of outputs.
      name: the argument name used in error messages.

    Returns:
      A tuple of indices in ``[0, n_out)``, or None.

    Raises:
      ValueError: non-integer, empty or out-of-range indices.

    Examples:
      >>> resolve_outputs([0, -1], 10)
      (0, 9)
    """
    if outputs is None:
        return None
    if isinstance(outputs, slice):
        idx = tuple(range(n_out))[outputs]
    else:
        arr = np.asarray(outputs)
        if arr.ndim == 0:
            arr = arr[None]
        if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
            raise TypeError(
                f"{name} must be None, a slice or a 1-D sequence of int output indices, got "
                f"{outputs!r}."
            )
        idx = tuple(int(i) for i in arr)
    if len(idx) == 0:
        raise ValueError(f"{name}={outputs!r} selects no output; pass at least one index.")
    bad = [i for i in idx if not -n_out <= i < n_out]
    if bad:
        raise ValueError(
            f"{name} has indices {bad} outside [0, {n_out}): the networks have {n_out} outputs."
        )
    return tuple(i % n_out for i in idx)



@full_precision
def fold_network(net: Network) -> list:
    """Fold a network into lifted pure nodes (docs/design.md §4).

    Linear layers are lifted to ``block_diag(1, W)`` (bias in column 0) and
    multiplied into the neighbouring bilinear node: into the next node's ``L~``
    and ``R~``, or, after the last bilinear layer, into its ``D~``.

    Args:
      net: a validated network (tuple of layers), unbatched.

    Returns:
      A list of :class:`Node` ``(left=L~, right=R~, down=D~)``, one per bilinear
      layer; for a network with no bilinear layer, a one-element list ``[W~]``
      with ``W~: (o+1, d+1)``.
    """
    nodes: list = []
    pending = None
    for layer in net:
        if isinstance(layer, LinearLayer):
            w = lift_linear(layer)
            pending = w if pending is None else w @ pending
        else:
            left, right, down = lift(layer)
            if pending is not None:
                left, right = left @ pending, right @ pending
                pending = None
            nodes.append(Node(left, right, down))
    if pending is not None:
        if not nodes:
            return [pending]
        nodes[-1] = nodes[-1]._replace(down=pending @ nodes[-1].down)
    return nodes
