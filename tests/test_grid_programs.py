"""The grid's compile budget: a handful of programs per call, not one per width (issue: compile budget).

Counted with ``jax.monitoring``'s backend-compile event (funsim.runtime.compile_count), after
``jax.clear_caches()`` so that every program of the call is counted. The persistent
compilation cache of the test run does not hide a program from the count (a cache hit
is still handed to the backend).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from funsim import similarity as sim
from funsim.runtime.compile_count import CompileCounter

SIX = ["cka/linear", "rsa/correlation/pearson", "svcca", "stitch/orthogonal", "stitch/scaled_orthogonal",
       "stitch/affine"]


def _layers(widths, n=600, seed=0):
    r = np.random.default_rng(seed)
    base = r.normal(size=(n, 8))
    return {f"l{k}": np.tanh(base @ r.normal(size=(8, d)) / 3 + 0.2 * r.normal(size=(n, d)))
            for k, d in enumerate(widths)}


MIXED = [64, 96, 128, 200] * 2  # the 8 x 8 grid of the issue (n smaller here: programs do not depend on n's value)


def _cold(fn):
    jax.clear_caches()
    with CompileCounter() as c:
        jax.block_until_ready(fn())
    return c


def test_linear_cka_grid_of_mixed_widths_compiles_at_most_four_programs():
    a, b = _layers(MIXED), _layers(MIXED, seed=1)
    c = _cold(lambda: sim.compare_grid(a, b, measures="cka/linear").tables)
    assert c.count <= 4, c.names  # 55 before the shape policy


def test_six_measures_compile_at_most_thirty_programs():
    a, b = _layers(MIXED), _layers(MIXED, seed=1)
    c = _cold(lambda: sim.compare_grid(a, b, measures=SIX, reverse=True).tables)
    assert c.count <= 30, (c.count, c.names)  # 134 before, forward only


@pytest.mark.parametrize("measures", [["cka/linear", "stitch/affine"], ["rsa/correlation/pearson", "svcca"]])
def test_programs_do_not_grow_with_the_number_of_distinct_widths(measures):
    """One width, or four widths in the same bucket: the same programs, as many of them."""
    one = _cold(lambda: sim.compare_grid(_layers([200] * 8), _layers([200] * 8, seed=1), measures=measures).tables)
    four = _cold(lambda: sim.compare_grid(_layers(MIXED), _layers(MIXED, seed=1), measures=measures).tables)
    assert four.count == one.count, (one.names, four.names)
    assert sorted(four.names) == sorted(one.names)


def test_a_grid_of_the_same_buckets_compiles_nothing():
    a, b = _layers(MIXED), _layers(MIXED, seed=1)
    sim.compare_grid(a, b, measures=SIX)
    other = [70, 100, 150, 250, 180, 65, 90, 199]  # other widths, same buckets (widest 250: 256; 8 layers)
    with CompileCounter() as c:
        jax.block_until_ready(sim.compare_grid(_layers(other, seed=2), _layers(other, seed=3), measures=SIX).tables)
    assert c.count == 0, c.names


def test_far_apart_widths_get_their_own_group():
    """Narrow and very wide layers: padding the narrow ones to the widest would cost more than a compile, so the
    wide ones form their own group (and the values are unchanged)."""
    from funsim.similarity.grid import layers as L

    groups = L.make_groups([np.zeros((3, d)) for d in (10, 10, 12, 10, 2048, 2048)], buckets=True)
    assert [g.width for g in groups] == [12, 2048]
    assert [g.idx for g in groups] == [(0, 1, 3, 2), (4, 5)]
    assert L.make_groups([np.zeros((3, d)) for d in MIXED], buckets=True)[0].width == 256
