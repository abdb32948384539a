"""Verdict rules: the label is computed from the rule, the number and (optionally) its interval."""

import dataclasses
import math
import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from funsim.experiments import verdict
from funsim.experiments.io import to_jsonable
from funsim.experiments.verdict import Rule

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(direction=st.sampled_from(verdict.DIRECTIONS), threshold=finite, value=finite)
def test_judge_agrees_with_the_comparison(direction, threshold, value):
    r = Rule("claim", "x", direction, threshold, labels=("yes", "no"))
    v = r.judge(value)
    expected = OPS[direction](value, threshold)
    assert v.outcome == ("pass" if expected else "fail")
    assert v.label == ("yes" if expected else "no")
    assert v.value == value and v.reason is None


@given(direction=st.sampled_from(verdict.DIRECTIONS), threshold=finite, a=finite, b=finite)
def test_judge_is_monotone_in_the_value(direction, threshold, a, b):
    """If a value passes, every value further on the passing side passes too."""
    r = Rule("claim", "x", direction, threshold)
    lo, hi = min(a, b), max(a, b)
    better, worse = (hi, lo) if direction in (">", ">=") else (lo, hi)
    if r.judge(worse).outcome == "pass":
        assert r.judge(better).outcome == "pass"


def test_threshold_equality_follows_the_direction():
    assert Rule("c", "x", ">=", 3).judge(3).outcome == "pass"
    assert Rule("c", "x", ">", 3).judge(3).outcome == "fail"
    assert Rule("c", "x", "<=", 0.9).judge(0.9).outcome == "pass"
    assert Rule("c", "x", "<", 0.9).judge(0.9).outcome == "fail"


@pytest.mark.parametrize("value", [None, float("nan")])
def test_undefined_statistic_is_inconclusive_never_a_pass_or_fail(value):
    r = Rule("c", "x", "<", 0.9)
    v = r.judge(value, reason="held-out accuracy never reached 1")
    assert v.outcome == "undefined" and v.value is None
    assert v.label == "inconclusive (held-out accuracy never reached 1)"
    assert r.judge(value).label == "inconclusive (statistic undefined)"


def test_interval_rule_needs_the_whole_interval():
    r = Rule("coarse above fine", "deficit_difference", ">", 0.0, interval=True, labels=("yes", "no"))
    assert r.judge(0.05, interval=(0.01, 0.09)).label == "yes"
    assert r.judge(-0.05, interval=(-0.09, -0.01)).label == "no"
    straddle = r.judge(0.02, interval=(-0.01, 0.05))
    assert straddle.outcome == "undefined" and straddle.label == "inconclusive (interval straddles the threshold)"
    assert r.judge(0.0, interval=(0.0, 0.1)).outcome == "undefined"  # 0 does not pass "> 0"
    with pytest.raises(ValueError, match="interval=True.*pass interval"):
        r.judge(0.05)
    with pytest.raises(ValueError, match="low <= high"):
        r.judge(0.05, interval=(0.1, 0.0))
    assert r.judge(0.05, interval=(float("nan"), 0.1)).outcome == "undefined"
    # a point rule ignores the interval for the decision but reports it
    p = Rule("c", "x", ">", 0.0).judge(0.05, interval=(-0.01, 0.1))
    assert p.outcome == "pass" and p.interval == (-0.01, 0.1)


def test_precondition_makes_the_verdict_inconclusive():
    ceiling = Rule("design below the ceiling", "share_below", ">=", 0.2, labels=("unsaturated", "ceiling"))
    r = Rule("coarse upper-bounds fine", "deficit_difference", ">", 0.0, requires=(ceiling,))
    v = r.judge(0.3, context={"share_below": 0.05, "deficit_difference": 0.3})
    assert v.outcome == "undefined" and v.label == "inconclusive (ceiling)"
    assert "share_below = 0.050" in v.reason
    assert r.judge(0.3, context={"share_below": 0.4}).label == "reproduced"
    assert r.judge(-0.3, context={"share_below": 0.4}).label == "not reproduced"
    und = r.judge(0.3, context={"share_below": {"value": None, "reason": "no task-loss pairs"}})
    assert und.label == "inconclusive (no task-loss pairs)"
    with pytest.raises(ValueError, match="requires 'share_below'"):
        r.judge(0.3)


def test_judge_all_and_missing_statistics():
    rules = (Rule("a", "x", ">=", 3), Rule("b", "y", "<", 0.9, labels=("moves", "settled")))
    out = verdict.judge_all(rules, {"x": 2, "y": {"value": 0.5}})
    assert [v.label for v in out] == ["not reproduced", "moves"]
    assert isinstance(out[0].value, int) and out[0].value_text() == "2"
    with pytest.raises(ValueError, match="needs the statistic 'y'"):
        verdict.judge_all(rules, {"x": 3})
    with pytest.raises(ValueError, match="keys value, interval, reason"):
        verdict.judge_all(rules, {"x": 3, "y": {"val": 0.5}})
    with pytest.raises(ValueError, match="must be a number or None"):
        verdict.judge_all(rules, {"x": "3", "y": 0.5})
    with pytest.raises(ValueError, match="must be a number or None"):
        verdict.judge_all(rules, {"x": True, "y": 0.5})


@pytest.mark.parametrize("kwargs,match", [
    ({"direction": "=>"}, "direction must be one of"),
    ({"threshold": float("nan")}, "finite number"),
    ({"threshold": math.inf}, "finite number"),
    ({"threshold": True}, "finite number"),
    ({"labels": ("same", "same")}, "two different"),
    ({"labels": ("only one",)}, "two different"),
    ({"claim": " "}, "Rule.claim"),
    ({"interval": 1}, "interval must be True or False"),
])
def test_bad_rules_are_refused(kwargs, match):
    base = dict(claim="c", statistic="x", direction=">", threshold=0.5)
    with pytest.raises(ValueError, match=match):
        Rule(**{**base, **kwargs})


def test_rules_round_trip_through_json_and_are_checked():
    ceiling = Rule("design", "share", ">=", 0.2, labels=("ok", "ceiling"))
    rules = (Rule("a", "x", ">", 0.0, interval=True, requires=(ceiling,)), Rule("b", "y", "<", 0.9))
    back = verdict.coerce_rules(to_jsonable(rules))
    assert back == rules and all(isinstance(r, Rule) for r in back)
    assert hash(back) == hash(rules)  # frozen, so a config holding them stays hashable
    with pytest.raises(ValueError, match=r"Unknown Rule fields \['treshold'\]"):
        Rule.from_dict({"claim": "c", "statistic": "x", "direction": ">", "treshold": 1})
    with pytest.raises(ValueError, match="single Rule"):
        verdict.coerce_rules(rules[0])
    verdict.check_rules(rules, {"x", "y", "share"}, owner="Cfg")
    with pytest.raises(ValueError, match="Cfg: the verdict rule 'a' names the statistic 'share'"):
        verdict.check_rules(rules, {"x", "y"}, owner="Cfg")
    with pytest.raises(ValueError, match="two verdict rules decide the claim 'b'"):
        verdict.check_rules((rules[1], dataclasses.replace(rules[1], threshold=0.8)), {"x", "y"}, owner="Cfg")


def test_markdown_table_prints_rule_number_and_computed_label():
    rules = (Rule("reorganisation", "to_final", "<", 0.9),)
    ours = verdict.judge_all(rules, {"to_final": 0.95})
    ref = {v.rule.claim: v for v in verdict.judge_all(rules, {"to_final": 0.718})}
    lines = verdict.markdown_table(ours, reference=ref, reference_name="authors")
    assert lines[0].endswith("authors, same rule |")
    assert lines[2] == ("| reorganisation | `to_final < 0.9 -> reproduced, else not reproduced` | 0.950 | "
                        "**not reproduced** | 0.718 (reproduced) |")
    assert len(verdict.markdown_table(ours)[0].split("|")) == len(lines[0].split("|")) - 1
