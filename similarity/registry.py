"""Measures by name, with what each one promises (docs/design.md §1-2).

>>> from funsim import similarity
>>> m = similarity.measure("cka/linear/debiased")
>>> m.kind, m.symmetric, sorted(m.invariances)
('score', True, ['isotropic_scale', 'permutation', 'rotation', 'translation'])

Names are ``family/variant[/option]``; parametrised families take
``name=value`` as the last component, e.g. ``"shape/angular/alpha=0.5"``.
:func:`list_measures` lists every fixed name plus a few instances of each
parametrised family; :func:`measure` builds any other value on demand.

**Invariance vocabulary** (:data:`INVARIANCES`). A measure ``f(x, y)`` is
invariant to a class of maps when ``f(T1(x), T2(y)) == f(x, y)`` for any
maps ``T1``, ``T2`` of that class applied to *either or both* arguments
independently (``x`` is ``(n, d)``, maps act on features):

* ``"translation"``: ``x -> x + c`` (one vector ``c`` added to every sample);
* ``"rotation"``: ``x -> x Q`` with ``Q`` orthogonal;
* ``"isotropic_scale"``: ``x -> s x`` with ``s > 0``;
* ``"permutation"``: ``x -> x P``, reordering features;
* ``"invertible_linear"``: ``x -> x A`` with ``A`` invertible.

A declared invariance is exact (up to rounding); a class not declared is a
declared *non*-invariance: the tests assert that generic maps of that class
change the value. Later modules add measures with :func:`register` and
:func:`register_family`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterable

import jax

from funsim.similarity import _validate as V
from funsim.similarity.cca import (
    cca_core,
    cca_layer_stats,
    cca_mean,
    cca_r2,
    pwcca,
    pwcca_core,
    pwcca_layer_stats,
    svcca,
    svcca_core,
    svcca_layer_stats,
)
from funsim.similarity.cka import cka, cka_core, cka_layer_stats, linear_cka_moment_stats
from funsim.similarity.moments import MOMENT_KINDS, LayerStats, MomentStats
from funsim.similarity.protocol import Core
from funsim.similarity.regression import linear_regression_r2, regression_core, regression_layer_stats
from funsim.similarity.rsa import COMPARISONS, RDM_METRICS, rsa, rsa_core, rsa_layer_stats
from funsim.similarity.shape import (
    nbs,
    nbs_core,
    nbs_moment_stats,
    procrustes_core,
    procrustes_distance,
    procrustes_moment_stats,
    shape_core,
    shape_distance,
    shape_layer_stats,
    shape_moment_stats,
)

__all__ = [
    "DEGENERACIES",
    "INVARIANCES",
    "KINDS",
    "Measure",
    "measure",
    "make_measure",
    "list_measures",
    "register",
    "register_family",
]

INVARIANCES: dict[str, str] = {
    "translation": "x -> x + c: one vector added to every sample",
    "rotation": "x -> x Q, Q orthogonal",
    "isotropic_scale": "x -> s x, s > 0",
    "permutation": "x -> x P, features reordered",
    "invertible_linear": "x -> x A, A invertible",
}
KINDS = ("score", "distance")
#: Degenerate (but valid) layers on which a measure may be undefined, or depend on an arbitrary choice.
DEGENERACIES: dict[str, str] = {
    "rank_deficient": "linearly dependent features, or more features than rows (numerically)",
    "constant_rows": "a sample whose features are all equal (e.g. all zero after a ReLU)",
}


@dataclasses.dataclass(frozen=True)
class Measure:
    """A registered measure; call it as ``m(x, y)``.

    Attributes:
      name: its registry name.
      fn: ``fn(x, y) -> jax.Array``, shape ``()``.
      kind: "score" (higher is more similar) or "distance" (0 is identical).
      symmetric: whether ``fn(x, y) == fn(y, x)``.
      invariances: a frozenset drawn from :data:`INVARIANCES`.
      description: one line.
      bounds: ``(lo, hi)``, the range of values (``inf`` when unbounded).
      stats: optional :class:`~similarity.LayerStats` ``(layer, pair)``
        with ``fn(x, y) == pair(layer(x), layer(y))``; :func:`similarity.compare_grid`
        uses it to do the per-layer work once per layer instead of once per pair.
      moments: optional :class:`~similarity.MomentStats`: the measure is a
        function of centred second moments (a *moment measure*), and
        :func:`similarity.compare_grid` computes it from per-layer and per-pair
        moments (streamed, sharded, one large matrix product for all pairs).
      differentiable: whether ``jax.grad`` of ``fn`` gives the measure's
        gradient (checked against finite differences for every registered
        measure). A measure that is not differentiable raises a ``ValueError``
        under differentiation, never returns zeros.
      gradient: one line on the gradient: why it is not differentiable and what
        to use instead, or what it is at the measure's kinks (e.g. the
        subgradient 0 at a distance of zero). Empty when there is nothing to say.
      robust_to: the :data:`DEGENERACIES` on which the measure is defined with one
        value: the pairwise call never raises there and makes no arbitrary choice
        (of a basis of a null space, say). Checked for every registered measure
        against the pairwise calls.
      core: the measure's compiled core (:class:`similarity.protocol.Core`):
        ``fn(x, y) == protocol.call(core, x, y)``, and :func:`similarity.compare_grid`
        runs it over all pairs of zero-padded layers and reads each undefined
        cell's reason from ``core.reason``. Every built-in measure has one.
    """

    name: str
    fn: Callable[..., jax.Array]
    kind: str
    symmetric: bool
    invariances: frozenset
    description: str
    bounds: tuple = (-math.inf, math.inf)
    stats: LayerStats | None = dataclasses.field(default=None, compare=False, repr=False)
    moments: MomentStats | None = dataclasses.field(default=None, compare=False, repr=False)
    differentiable: bool = True
    gradient: str = ""
    robust_to: frozenset = frozenset()
    core: Core | None = dataclasses.field(default=None, compare=False, repr=False)

    def __call__(self, x, y, /) -> jax.Array:
        return self.fn(x, y)


_REGISTRY: dict[str, Measure] = {}
# prefix -> (parameter name, builder(value) -> Measure, listed example values)
_FAMILIES: dict[str, tuple[str, Callable[[float], Measure], tuple[float, ...]]] = {}


def make_measure(
    name: str,
    fn: Callable[..., jax.Array],
    *,
    kind: str,
    symmetric: bool,
    invariances: Iterable[str],
    description: str,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    stats: LayerStats | None = None,
    moments: MomentStats | None = None,
    differentiable: bool = True,
    gradient: str = "",
    robust_to: Iterable[str] = (),
    core: Core | None = None,
) -> Measure:
    """Build and validate a :class:`Measure` without registering it (for :func:`register_family` builders).

    Args:
      name: e.g. ``"stitch/affine/r2"``.
      fn: ``fn(x, y) -> ()`` array.
      kind: "score" or "distance".
      symmetric: whether swapping the arguments leaves the value unchanged. Be exact:
        :func:`similarity.compare_grid` computes a symmetric measure once per unordered
        pair of a side with itself and mirrors it (and reuses it for ``reverse``).
      invariances: names from :data:`INVARIANCES` (tested, so be exact). The grid
        relies on ``"rotation"`` for a moment measure: it compares layers wider
        than their rows in the rows' span (see :mod:`similarity.grid`).
      description: one line.
      bounds: ``(lo, hi)``, the range of possible values (tested).
      stats: optional ``LayerStats(layer, pair)`` with ``fn(x, y) ==
        pair(layer(x), layer(y))`` (pure, jit-able), for fast layer grids.
      moments: optional ``MomentStats(moments, finish, ...)`` for a measure
        that is a function of centred second moments (see
        :mod:`similarity.moments`); ``fn`` must equal it.
      differentiable: whether ``jax.grad(fn)`` is the measure's gradient
        (default True: the gradient test then checks it against finite
        differences). Declare False for a measure without a useful gradient and
        make ``fn`` raise under differentiation (e.g. a ``jax.custom_jvp``
        whose rule raises), never return zeros.
      robust_to: names from :data:`DEGENERACIES` on which the measure is defined
        with one value (see :class:`Measure`; default none: the safe choice).
      gradient: one line: required when ``differentiable`` is False (why, and
        what to use instead); otherwise what the gradient is at kinks, if any.
      core: optional :class:`similarity.protocol.Core` with
        ``fn(x, y) == protocol.call(core, x, y)`` (see :class:`Measure`).

    Returns:
      The :class:`Measure`.

    Raises:
      ValueError: an unknown kind, invariance or moment kind; a non-differentiable
        measure without a ``gradient`` note.
      TypeError: ``fn`` not callable, ``stats`` or ``moments`` of the wrong type.

    Examples:
      >>> import jax.numpy as jnp
      >>> make_measure("demo/one", lambda x, y: jnp.ones(()), kind="score", symmetric=True,
      ...              invariances=(), description="always 1").kind
      'score'
    """
    V.check_choice(kind, "kind", KINDS)
    inv = frozenset(invariances)
    for i in inv:
        V.check_choice(i, "invariance", INVARIANCES)
    if not callable(fn):
        raise TypeError(f"fn for measure {name!r} must be callable, got {type(fn).__name__}.")
    lo, hi = (float(b) for b in bounds)
    if stats is not None and not isinstance(stats, LayerStats):
        raise TypeError(f"stats for measure {name!r} must be a LayerStats(layer, pair), got {type(stats).__name__}.")
    if moments is not None:
        if not isinstance(moments, MomentStats):
            raise TypeError(
                f"moments for measure {name!r} must be a MomentStats(moments, finish, ...), got "
                f"{type(moments).__name__}."
            )
        V.check_choice(moments.moments, "MomentStats.moments", MOMENT_KINDS)
    differentiable = V.check_bool(differentiable, "differentiable")
    if not isinstance(gradient, str) or "\n" in gradient:
        raise TypeError(f"gradient for measure {name!r} must be a one-line str, got {gradient!r}.")
    if not differentiable and not gradient:
        raise ValueError(
            f"measure {name!r} is declared not differentiable: say why and what to use instead in "
            "gradient='...' (one line)."
        )
    robust = frozenset(robust_to)
    for r in robust:
        V.check_choice(r, "robust_to", DEGENERACIES)
    if core is not None and not isinstance(core, Core):
        raise TypeError(f"core for measure {name!r} must be a protocol.Core(layer, pair, reason, opts), got "
                        f"{type(core).__name__}.")
    return Measure(name, fn, kind, V.check_bool(symmetric, "symmetric"), inv, description, (lo, hi), stats,
                   moments, differentiable, gradient, robust, core)


def register(name: str, fn: Callable[..., jax.Array], *, overwrite: bool = False, **spec) -> Measure:
    """Add a measure under ``name``: ``make_measure(name, fn, **spec)``.

    Args:
      name: e.g. ``"stitch/affine/r2"``; must not contain ``=``.
      fn: ``fn(x, y) -> ()`` array.
      overwrite: replace an existing entry instead of raising.
      **spec: ``kind``, ``symmetric``, ``invariances``, ``description`` (required),
        ``bounds``, ``stats``, ``moments``, ``differentiable``, ``gradient``, ``robust_to``, ``core``: see
        :func:`make_measure`.

    Returns:
      The registered :class:`Measure`.

    Raises:
      ValueError: a duplicate name, an unknown kind or invariance.

    Examples:
      >>> import jax.numpy as jnp
      >>> m = register("demo/zero", lambda x, y: jnp.zeros(()), kind="distance",
      ...              symmetric=True, invariances=INVARIANCES, description="always 0",
      ...              overwrite=True)
      >>> float(measure("demo/zero")(jnp.ones((2, 1)), jnp.ones((2, 1))))
      0.0
      >>> _ = _REGISTRY.pop("demo/zero")
    """
    if "=" in name:
        raise ValueError(f"measure name {name!r} must not contain '='; use register_family.")
    if name in _REGISTRY and not V.check_bool(overwrite, "overwrite"):
        raise ValueError(f"measure {name!r} is already registered; pass overwrite=True.")
    m = make_measure(name, fn, **spec)
    _REGISTRY[name] = m
    return m


def register_family(
    prefix: str,
    param: str,
    builder: Callable[[float], Measure],
    *,
    examples: Iterable[float] = (),
) -> None:
    """Add a parametrised family: ``measure(f"{prefix}/{param}={value}")`` calls ``builder(value)``.

    Args:
      prefix: e.g. ``"shape/angular"``.
      param: the parameter's name, e.g. ``"alpha"``.
      builder: ``float -> Measure``; raise ``ValueError`` for invalid values.
      examples: values listed by :func:`list_measures`.
    """
    _FAMILIES[prefix] = (param, builder, tuple(float(e) for e in examples))


def _fmt(v: float) -> str:
    return f"{v:g}"


def _family_names() -> list[str]:
    return [f"{p}/{param}={_fmt(v)}" for p, (param, _, ex) in _FAMILIES.items() for v in ex]


def list_measures() -> list[str]:
    """Every registered name, plus example instances of parametrised families (sorted).

    Examples:
      >>> "cka/linear" in list_measures() and "shape/angular/alpha=0.5" in list_measures()
      True
    """
    return sorted([*_REGISTRY, *_family_names()])


_PARAM = re.compile(r"^(?P<prefix>.+)/(?P<param>[A-Za-z_]\w*)=(?P<value>[^/]+)$")


@functools.lru_cache(maxsize=256)
def _build(prefix: str, value: float) -> Measure:
    return _FAMILIES[prefix][1](value)


def measure(name: str) -> Measure:
    """Look up a measure by name.

    Args:
      name: e.g. ``"cka/linear"``, ``"rsa/correlation/spearman"``,
        ``"shape/angular/alpha=0.25"``.

    Returns:
      The :class:`Measure`.

    Raises:
      ValueError: an unknown name (close names are suggested) or a bad parameter.

    Examples:
      >>> measure("shape/angular/alpha=0.25").kind
      'distance'
      >>> measure("cka/linaer")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: Unknown measure name 'cka/linaer'. Did you mean 'cka/linear', ...
    """
    if not isinstance(name, str):
        raise TypeError(f"measure name must be a str, got {type(name).__name__}.")
    if name in _REGISTRY:
        return _REGISTRY[name]
    m = _PARAM.match(name)
    if m and m["prefix"] in _FAMILIES:
        param = _FAMILIES[m["prefix"]][0]
        if m["param"] != param:
            raise ValueError(
                f"measure {name!r}: family {m['prefix']!r} takes {param}=..., not {m['param']}=..."
            )
        try:
            value = float(m["value"])
        except ValueError:
            raise ValueError(f"measure {name!r}: {param}={m['value']!r} is not a number.") from None
        return _build(m["prefix"], value)
    V.check_choice(name, "measure name", list_measures())
    raise AssertionError  # unreachable: check_choice raised


# ------------------------------------------------------------------ built-in entries

_ALL_BUT_LINEAR = frozenset({"translation", "rotation", "isotropic_scale", "permutation"})
_ROBUST = frozenset(DEGENERACIES)
_ROWS_ONLY = frozenset({"constant_rows"})  # the fits and whitened metrics: undefined on rank-deficient layers

for _deb in (False, True):
    for _k in ("linear", "rbf"):
        _suffix = "/debiased" if _deb else ""
        register(
            f"cka/{_k}{_suffix}",
            functools.partial(cka, kernel=_k, debiased=_deb),
            kind="score",
            symmetric=True,
            invariances=_ALL_BUT_LINEAR,
            bounds=(-1.0 if _deb else 0.0, 1.0),
            description=f"{'debiased ' if _deb else ''}{_k} CKA"
            + (" (RBF bandwidth 0.5 x median distance)" if _k == "rbf" else ""),
            stats=cka_layer_stats(kernel=_k, debiased=_deb),
            moments=linear_cka_moment_stats() if (_k, _deb) == ("linear", False) else None,
            gradient="the median bandwidth is differentiated too (it moves with its middle entries)"
            if _k == "rbf" else "",
            robust_to=_ROBUST,
            core=cka_core(kernel=_k, debiased=_deb),
        )

_RDM_INV = {
    "correlation": {"isotropic_scale", "permutation"},
    "euclidean": set(_ALL_BUT_LINEAR),
    "sqeuclidean": set(_ALL_BUT_LINEAR),
    "cosine": {"rotation", "isotropic_scale", "permutation"},
}
_RANKED = ("spearman", "kendall")
for _metric in RDM_METRICS:
    for _cmp in COMPARISONS:
        register(
            f"rsa/{_metric}/{_cmp}",
            functools.partial(rsa, rdm_metric=_metric, compare=_cmp),
            kind="score",
            symmetric=True,
            invariances=_RDM_INV[_metric],
            bounds=(-1.0, 1.0),
            description=f"RSA: {_metric} RDMs compared by {_cmp}"
            + (" (sqeuclidean + cosine_cov = linear CKA)" if _cmp == "cosine_cov" else ""),
            stats=rsa_layer_stats(rdm_metric=_metric, compare=_cmp),
            differentiable=_cmp not in _RANKED,
            gradient="ranks are piecewise constant: grad raises; use compare='pearson', 'cosine' or "
            "'cosine_cov'" if _cmp in _RANKED else "",
            # the correlation (cosine) distance is undefined for a constant (zero) sample
            robust_to=_ROBUST if _metric in ("euclidean", "sqeuclidean") else {"rank_deficient"},
            core=rsa_core(rdm_metric=_metric, compare=_cmp),
        )

register("cca/r2", cca_r2, bounds=(0.0, 1.0), kind="score", symmetric=True,
         invariances=_ALL_BUT_LINEAR | {"invertible_linear"},
         description="mean squared canonical correlation R^2_CCA (needs d < n)",
         stats=cca_layer_stats(reduce="r2"), robust_to=_ROWS_ONLY, core=cca_core(reduce="r2"))
register("cca/mean", cca_mean, bounds=(0.0, 1.0), kind="score", symmetric=True,
         invariances=_ALL_BUT_LINEAR | {"invertible_linear"},
         description="mean canonical correlation (needs d < n)", stats=cca_layer_stats(reduce="mean"),
         robust_to=_ROWS_ONLY, core=cca_core(reduce="mean"))
register("svcca", svcca, bounds=(0.0, 1.0), kind="score", symmetric=True, invariances=_ALL_BUT_LINEAR,
         description="SVCCA: mean CCA of the top-SVD subspaces keeping 99% variance (needs d < n)",
         stats=svcca_layer_stats(),
         gradient="the number of kept directions is held fixed (it changes only in steps)", robust_to=_ROWS_ONLY,
         core=svcca_core())
_PWCCA_INV = {"translation", "isotropic_scale", "permutation"}
_PWCCA_WHAT = "projection-weighted CCA as google/svcca computes it (weights from the narrower side, x on a tie)"
_PWCCA_GRAD = ("where canonical correlations coincide their directions are held fixed: exact when all are 1 "
               "(y = x Q, y = s x)")
register("pwcca", pwcca, bounds=(0.0, 1.0), kind="score", symmetric=False, invariances=_PWCCA_INV,
         description=f"{_PWCCA_WHAT}; needs d < n", stats=pwcca_layer_stats(), gradient=_PWCCA_GRAD,
         robust_to=_ROWS_ONLY, core=pwcca_core())
register("nbs", nbs, bounds=(0.0, 1.0), kind="score", symmetric=True, invariances=_ALL_BUT_LINEAR,
         description="normalised Bures similarity ||Xc^T Yc||_* / (||Xc|| ||Yc||)", moments=nbs_moment_stats(),
         robust_to=_ROBUST, core=nbs_core())
register("procrustes", procrustes_distance, bounds=(0.0, 2.0), kind="distance", symmetric=True,
         invariances=_ALL_BUT_LINEAR,
         description="Ding et al. squared Procrustes distance 2 - 2 NBS on unit-norm data",
         moments=procrustes_moment_stats(), robust_to=_ROBUST, core=procrustes_core())
register("regression/r2", linear_regression_r2, bounds=(0.0, 1.0), kind="score", symmetric=False,
         invariances=_ALL_BUT_LINEAR,
         description="directed linear-regression R^2 of the second argument from the first",
         stats=regression_layer_stats(),
         gradient="directions below the rank tolerance stay in the null space (the rank is held fixed)",
         robust_to=_ROBUST, core=regression_core())


def _pwcca_builder(epsilon: float) -> Measure:
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"pwcca: epsilon must be in [0, 1), got {epsilon!r}.")
    return make_measure(
        f"pwcca/epsilon={_fmt(epsilon)}", functools.partial(pwcca, epsilon=epsilon), kind="score",
        symmetric=False, invariances=_PWCCA_INV, bounds=(0.0, 1.0),
        description=f"{_PWCCA_WHAT}; neurons below epsilon={_fmt(epsilon)} x the largest variance dropped",
        stats=pwcca_layer_stats(epsilon=epsilon), gradient=_PWCCA_GRAD, robust_to=_ROWS_ONLY,
        core=pwcca_core(epsilon=epsilon),
    )


register_family("pwcca", "epsilon", _pwcca_builder, examples=(1e-10,))


def _shape_builder(distance: str) -> Callable[[float], Measure]:
    def build(alpha: float) -> Measure:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"shape/{distance}: alpha must be in [0, 1], got {alpha!r}.")
        inv = {"translation", "rotation", "permutation"}
        if distance == "angular" and alpha in (0.0, 1.0):
            inv.add("isotropic_scale")
        if distance == "angular" and alpha == 0.0:
            inv.add("invertible_linear")
        what = {1.0: "Procrustes", 0.0: "CCA-like, fully whitened"}.get(alpha, "partially whitened")
        return make_measure(
            f"shape/{distance}/alpha={_fmt(alpha)}",
            functools.partial(shape_distance, alpha=alpha, distance=distance),
            kind="distance", symmetric=True, invariances=inv,
            bounds=(0.0, math.pi / 2 if distance == "angular" else math.inf),
            description=f"{distance} shape metric, alpha={_fmt(alpha)} ({what}; equals netrep's LinearMetric)",
            stats=shape_layer_stats(alpha=alpha, distance=distance),
            moments=shape_moment_stats(alpha=alpha, distance=distance),
            gradient="at a distance of zero (y = x Q) the subgradient 0",
            robust_to=_ROBUST if alpha == 1.0 else _ROWS_ONLY,  # alpha = 1: no whitening (Procrustes)
            core=shape_core(alpha=alpha, distance=distance),
        )

    return build


register_family("shape/angular", "alpha", _shape_builder("angular"), examples=(0.0, 0.5, 1.0))
register_family("shape/euclidean", "alpha", _shape_builder("euclidean"), examples=(0.0, 0.5, 1.0))


def _ridge_builder(ridge: float) -> Measure:
    if not ridge >= 0.0:
        raise ValueError(f"regression/r2: ridge must be >= 0, got {ridge!r}.")
    inv = set(_ALL_BUT_LINEAR) if ridge == 0.0 else {"translation", "rotation", "permutation"}
    return make_measure(
        f"regression/r2/ridge={_fmt(ridge)}",
        functools.partial(linear_regression_r2, ridge=ridge),
        kind="score", symmetric=False, invariances=inv, bounds=(0.0, 1.0),
        description=f"directed ridge-regression R^2 (ridge={_fmt(ridge)}, in-sample)",
        stats=regression_layer_stats(ridge=ridge), robust_to=_ROBUST, core=regression_core(ridge=ridge),
    )


register_family("regression/r2", "ridge", _ridge_builder, examples=(1.0,))
