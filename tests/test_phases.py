"""similarity.phases: accuracy landmarks, phase boundaries beside them, and common checkpoint grids of two runs."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from funsim.experiments.configs.grokking import PAPER
from funsim.models import modular
from funsim.models.train import power_schedule
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


# A known answer: four phases planted in step space, [0, 100), [100, 1000), [1000, 5000), [5000, 12000)
# and a fifth from 12000. Similarity 1 within a phase, 0.3 + 0.1 * (closeness of the phases) across.
PLANTED = (0, 100, 1000, 5000, 12000)


def planted_run(steps, generalise_at=3000):
    """A run in the shape of ``compare_runs``' input: :data:`PLANTED` phases, held-out accuracy 1 from ``generalise_at``."""
    steps = np.asarray(steps)
    phase = np.searchsorted(PLANTED, steps, side="right") - 1
    m = np.where(phase[:, None] == phase[None, :], 1.0, 0.3 + 0.1 / (1 + np.abs(phase[:, None] - phase[None, :])))
    val = (steps >= generalise_at).astype(float)
    return {"steps": steps, "matrices": {"tensor (symmetric)": m, "behavioural": m ** 2}, "val_accuracy": val}


def test_compare_runs_recovers_planted_phases_at_a_matched_horizon():
    a = planted_run([0, *modular.checkpoint_schedule(10_000, 60)])  # the authors' rule, 10k steps
    b = planted_run([0, *power_schedule(20_000, 80, power=2.0)])  # square spacing, twice as long
    c = phases.compare_runs(a, b, n_segments=4)
    assert c["horizon"] == 10_000
    sa, sb = np.array(c["steps"]["ours"]), np.array(c["steps"]["theirs"])
    assert sa[-1] <= 10_000 and sb[-1] <= 10_000 and len(sa) == len(sb) == c["n_grid"]
    first_at = lambda s, t: int(s[np.searchsorted(s, t)])
    for name in ("tensor (symmetric)", "behavioural"):
        ph = c["phases"][name]
        assert ph["ours"] == [0, *(first_at(sa, t) for t in PLANTED[1:4])]
        assert ph["theirs"] == [0, *(first_at(sb, t) for t in PLANTED[1:4])]
        # a grid pair may straddle a planted boundary (e.g. 990 paired with 1010): then one run's phase
        # opens a grid checkpoint later; the offset is exactly that difference in grid positions
        expected = [int(np.searchsorted(sa, t) - np.searchsorted(sb, t)) for t in PLANTED[1:4]]
        assert ph["offsets"] == expected and all(abs(o) <= 1 for o in expected)
        assert ph["within_tolerance"] == 3
    for who, s in (("ours", sa), ("theirs", sb)):
        tf = c["to_final"][who]
        assert tf["from_step"] == first_at(s, 3000) and tf["to_step"] == s[-1]
        assert tf["tensor (symmetric)"] == pytest.approx(0.3 + 0.1 / 2)  # phase 2 vs phase 3
        assert tf["behavioural"] == pytest.approx((0.3 + 0.1 / 2) ** 2)
    # unmatched, the longer run's fourth boundary is the phase beyond the other's horizon
    full = phases.phase_starts(b["matrices"]["tensor (symmetric)"], n_segments=5)
    assert b["steps"][full[-1]] == first_at(b["steps"], 12_000)
    # a run that never generalises has no post-generalisation similarity
    never = dict(b, val_accuracy=np.zeros(len(b["steps"])))
    assert phases.compare_runs(a, never, n_segments=4)["to_final"]["theirs"] is None


def test_reference_protocols_on_planted_phases():
    ref = planted_run([0, *modular.checkpoint_schedule(20_000, 90)])
    ours = [0, *power_schedule(8_000, 50, power=2.0)]
    st = ref["steps"]
    first_at = lambda s, t: int(s[np.searchsorted(s, t)])
    released = phases.reference_protocols(ref, ours, n_segments=5)["as released"]
    assert released["n"] == len(st) and released["horizon"] == 20_000
    assert released["tensor (symmetric)"] == [0, *(first_at(st, t) for t in PLANTED[1:])]
    p = phases.reference_protocols(ref, ours, n_segments=4)  # up to our horizon: four phases
    for name in ("at our horizon", "on our grid", "common grid"):
        row = p[name]
        assert row["horizon"] <= 8_000 + 500  # nearest checkpoints may step a little past our last
        kept = st[st <= row["horizon"]] if name == "at our horizon" else None
        got = row["tensor (symmetric)"]
        assert len(got) == 4 and got[0] == 0 and all(g >= t for g, t in zip(got[1:], PLANTED[1:4]))
        if kept is not None:
            assert got == [0, *(first_at(kept, t) for t in PLANTED[1:4])]
    assert p["on our grid"]["n"] <= len(ours) and p["at our horizon"]["n"] == int(np.sum(st <= 8_000))


def test_transition_ratio_is_max_over_median_adjacent_change():
    s = np.array([[1, .9, .8, .1], [.9, 1, .9, .2], [.8, .9, 1, .3], [.1, .2, .3, 1]])
    assert phases.transition_ratio(s) == pytest.approx(0.7 / 0.1)
    assert phases.transition_ratio(np.eye(2)) is None  # one adjacent pair
    assert phases.transition_ratio(np.ones((4, 4))) is None  # no change at all: the median is 0
