"""similarity.phases: accuracy landmarks, phase boundaries beside them, and common checkpoint grids of two runs."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from funsim.experiments.configs.grokking import PAPER
from funsim.similarity import phases


def test_accuracy_events_and_boundaries():
    steps = [0, 10, 20, 40, 80, 160, 320]
    train = [0.0, 0.3, 0.6, 1.0, 1.0, 1.0, 1.0]
    val = [0.0, 0.0, 0.01, 0.1, 0.6, 0.995, 1.0]
    loss = [4.0, 4.5, 6.0, 5.0, 2.0, 0.1, 0.01]
    ev = phases.accuracy_events(steps, train, val, loss)
    assert ev == {"train accuracy >= 0.5": 20, "train accuracy >= 0.99": 40, "val loss peak": 20,
                  "val accuracy >= 0.5": 80, "val accuracy >= 0.99": 160, "val accuracy = 1": 320}
    assert set(ev) == set(PAPER["events"])
    rows = phases.compare_boundaries([0, 3, 5], steps, ev)
    assert rows == [
        {"start_step": 40, "after_step": 20, "nearest_event": "train accuracy >= 0.99", "event_step": 40, "checkpoints_apart": 0},
        {"start_step": 160, "after_step": 80, "nearest_event": "val accuracy >= 0.99", "event_step": 160, "checkpoints_apart": 0},
    ]
    none = phases.accuracy_events(steps, train, [0.0] * 7, loss)
    assert none["val accuracy >= 0.5"] is None and none["val accuracy = 1"] is None
    assert phases.compare_boundaries([0, 2], steps, {"x": None})[0]["nearest_event"] is None


def _mnn_reference(a, b):
    """Brute force: pairs (i, j) where each is the other's nearest (ties to the earlier index)."""
    def nearest(x, ys):
        d = [abs(x - y) for y in ys]
        return d.index(min(d))
    return [(i, j) for i in range(len(a)) for j in range(len(b)) if nearest(a[i], b) == j and nearest(b[j], a) == i]


steps_strategy = st.lists(st.integers(0, 5000), min_size=1, max_size=40, unique=True).map(sorted)


@given(a=steps_strategy, b=steps_strategy)
def test_mutual_nearest_against_brute_force(a, b):
    ia, ib = phases.mutual_nearest(a, b)
    assert list(zip(ia.tolist(), ib.tolist())) == _mnn_reference(a, b)
    assert np.all(np.diff(ia) > 0) and np.all(np.diff(ib) > 0)  # one-to-one and order-preserving
    ia2, ib2 = phases.mutual_nearest(a, a)
    assert ia2.tolist() == ib2.tolist() == list(range(len(a)))


def test_matched_grid_errors():
    with pytest.raises(ValueError, match="strictly increasing"):
        phases.matched_grid([0, 5, 5], [0, 3])
    with pytest.raises(ValueError, match="horizon 2 lies before"):
        phases.matched_grid([3, 5], [0, 3], horizon=2)


def test_transition_ratio_is_max_over_median_adjacent_change():
    s = np.array([[1, .9, .8, .1], [.9, 1, .9, .2], [.8, .9, 1, .3], [.1, .2, .3, 1]])
    assert phases.transition_ratio(s) == pytest.approx(0.7 / 0.1)
    assert phases.transition_ratio(np.eye(2)) is None  # one adjacent pair
    assert phases.transition_ratio(np.ones((4, 4))) is None  # no change at all: the median is 0
