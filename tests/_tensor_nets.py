"""Random bilinear networks and NumPy references shared by the tensor tests."""

from __future__ import annotations

import numpy as np

from funsim.similarity.multilinear import BilinearLayer, LinearLayer


def bilinear(rng, d, h, o, *, bias=False, residual=False, scale=1.0):
    """A random float64 BilinearLayer with left, right (h, d) and down (o, h)."""

    def f(*shape):
        return scale * rng.normal(size=shape)

    return BilinearLayer(
        f(h, d), f(h, d), f(o, h),
        f(h) if bias else None, f(h) if bias else None, f(o) if bias else None,
        residual=residual,
    )


def linear(rng, d, o, *, bias=True):
    return LinearLayer(rng.normal(size=(o, d)), rng.normal(size=(o,)) if bias else None)


def deep(rng, d, widths, *, o_out=2, embed=True, head=True, bias=True, residual=True):
    """Embedding (d -> w), bilinear layers of width w (residual), then a head (w -> o_out).

    ``widths`` lists the hidden widths h of each bilinear layer.
    """
    w = 3
    layers = []
    if embed:
        layers.append(linear(rng, d, w))
    d_cur = w if embed else d
    for h in widths:
        layers.append(bilinear(rng, d_cur, h, d_cur, bias=bias, residual=residual, scale=0.7))
    if head:
        layers.append(linear(rng, d_cur, o_out))
    return tuple(layers)


# --------------------------- NumPy tree tensors ---------------------------


def np_lifted_layer(layer):
    """Lifted tensor of one layer built directly from its definition.

    Bilinear: ``(o+1, d+1, d+1)`` with ``B[0] = e0 e0^T`` and, for output p,
    ``B[p+1] = sum_h down[p,h] (lb_h, l_h)(rb_h, r_h)^T + db_p e0 e0^T (+ e_{p+1} e0^T)``.
    Linear: ``(o+1, d+1)`` = ``[[1, 0], [b, W]]``.
    """
    if isinstance(layer, LinearLayer):
        w = np.asarray(layer.weight)
        o, d = w.shape
        out = np.zeros((o + 1, d + 1))
        out[0, 0] = 1
        out[1:, 1:] = w
        if layer.bias is not None:
            out[1:, 0] = np.asarray(layer.bias)
        return out
    left, right, down = (np.asarray(x) for x in (layer.left, layer.right, layer.down))
    h, d = left.shape
    o = down.shape[0]
    lb = np.zeros(h) if layer.left_bias is None else np.asarray(layer.left_bias)
    rb = np.zeros(h) if layer.right_bias is None else np.asarray(layer.right_bias)
    db = np.zeros(o) if layer.down_bias is None else np.asarray(layer.down_bias)
    lt = np.concatenate([lb[:, None], left], 1)
    rt = np.concatenate([rb[:, None], right], 1)
    b = np.zeros((o + 1, d + 1, d + 1))
    b[0, 0, 0] = 1
    for p in range(o):
        b[p + 1] = np.einsum("h,hi,hj->ij", down[p], lt, rt)
        b[p + 1, 0, 0] += db[p]
        if layer.residual:
            b[p + 1, p + 1, 0] += 1
    return b


def np_tree_tensor(net, *, symmetric):
    """The global tree tensor ``T[p, leaf_1, ..., leaf_{2^L}]`` of a network, in NumPy.

    Each bilinear node is symmetrised over its two legs when ``symmetric``.
    A node's leg contracts with the previous tree tensor's output index.
    """
    t = None  # (o+1, leaves...) with each leaf of size d+1
    for layer in net:
        b = np_lifted_layer(layer)
        if isinstance(layer, LinearLayer):
            t = b if t is None else np.tensordot(b, t, axes=(1, 0))
            continue
        if symmetric:
            b = (b + np.swapaxes(b, 1, 2)) / 2
        if t is None:
            t = b
        else:
            n = t.ndim - 1
            left = np.tensordot(b, t, axes=(1, 0))  # (o, b, leaves_left)
            left = np.moveaxis(left, 1, -1)  # (o, leaves_left, b)
            t = np.tensordot(left, t, axes=(left.ndim - 1, 0))  # (o, leaves_left, leaves_right)
            assert t.ndim == 1 + 2 * n
    return t


def np_tree_inner(net_a, net_b, *, symmetric, outputs=None):
    ta = np_tree_tensor(net_a, symmetric=symmetric)[1:]
    tb = np_tree_tensor(net_b, symmetric=symmetric)[1:]
    if outputs is not None:
        ta, tb = ta[list(outputs)], tb[list(outputs)]
    return float(np.sum(ta * tb))
