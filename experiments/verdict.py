"""Verdict rules: each claim's label is computed by code, from a rule written in the driver's config.

A :class:`Rule` names the statistic a driver computes, a direction and a threshold,
and the two labels it gives. It lives in the driver's config (so it is saved in the
run's ``config.json`` and committed with the config before the run that uses it),
and the summary prints the rule, the number and the label :meth:`Rule.judge`
computed::

    rule = Rule("reorganisation after generalisation", "to_final_tensor", "<", 0.9)
    rule.judge(0.86).label        # 'reproduced'

Three refinements keep labels honest:

* a statistic that is undefined (None or NaN: the event never happened, the
  design cannot measure it) gives ``"inconclusive (<reason>)"``, never a pass
  or a fail;
* ``interval=True`` judges a confidence interval instead of the point value:
  the first label only when the whole interval passes, the second only when
  none of it does, ``"inconclusive (interval straddles the threshold)"``
  otherwise;
* ``requires``: preconditions on the design (e.g. enough pairs below the
  ceiling); when one fails, the label is ``"inconclusive (<its second label>)"``
  whatever the main statistic says.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DIRECTIONS", "INCONCLUSIVE", "UNCALIBRATED", "Rule", "Verdict", "coerce_rules", "check_rules",
           "judge_all", "calibrate", "markdown_table"]

DIRECTIONS = (">", ">=", "<", "<=")
INCONCLUSIVE = "inconclusive"
UNCALIBRATED = "uncalibrated"


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A verdict rule: ``labels[0]`` when ``statistic <direction> threshold``, else ``labels[1]``.

    Attributes:
      claim: what the rule decides, in words (printed in the summary).
      statistic: the name of the number the driver computes (a key of the
        statistics it passes to :func:`judge_all`).
      direction: one of :data:`DIRECTIONS`.
      threshold: a finite number.
      labels: ``(label when the rule holds, label when it does not)``.
      interval: judge a confidence interval (see the module docstring).
      requires: preconditions, themselves rules; a failed one makes the verdict inconclusive.

    Examples:
      >>> r = Rule("reorganisation continues", "to_final", "<", 0.9)
      >>> r.judge(0.86).label, r.judge(0.95).label, r.judge(None, reason="never generalised").label
      ('reproduced', 'not reproduced', 'inconclusive (never generalised)')
      >>> r.text()
      'to_final < 0.9 -> reproduced, else not reproduced'
    """

    claim: str
    statistic: str
    direction: str
    threshold: float
    labels: tuple[str, str] = ("reproduced", "not reproduced")
    interval: bool = False
    requires: tuple[Rule, ...] = ()

    def __post_init__(self):
        for name in ("claim", "statistic"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"Rule.{name} must be a non-empty string, got {v!r}.")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"Rule {self.claim!r}: direction must be one of {', '.join(DIRECTIONS)}, "
                             f"got {self.direction!r}.")
        if not _is_number(self.threshold) or not math.isfinite(self.threshold):
            raise ValueError(f"Rule {self.claim!r}: threshold must be a finite number, got {self.threshold!r}.")
        labels = tuple(self.labels)
        if len(labels) != 2 or not all(isinstance(s, str) and s.strip() for s in labels) or labels[0] == labels[1]:
            raise ValueError(f"Rule {self.claim!r}: labels must be two different non-empty strings "
                             f"(label if the rule holds, label if not), got {self.labels!r}.")
        object.__setattr__(self, "labels", labels)
        if not isinstance(self.interval, bool):
            raise ValueError(f"Rule {self.claim!r}: interval must be True or False, got {self.interval!r}.")
        object.__setattr__(self, "requires", coerce_rules(self.requires))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rule:
        """A rule from its JSON form (``dataclasses.asdict``); unknown keys are an error.

        Examples:
          >>> Rule.from_dict({"claim": "c", "statistic": "s", "direction": ">=", "threshold": 3}).threshold
          3
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"Unknown Rule fields {unknown}; valid fields: {sorted(fields)}.")
        d = dict(d)
        if "labels" in d:
            d["labels"] = tuple(d["labels"])
        if "requires" in d:
            d["requires"] = coerce_rules(d["requires"])
        return cls(**d)

    def holds(self, value: float) -> bool:
        """Whether ``value <direction> threshold`` (``value`` a number, not NaN)."""
        t = self.threshold
        return {">": value > t, ">=": value >= t, "<": value < t, "<=": value <= t}[self.direction]

    def text(self) -> str:
        """The rule in one line, as the summaries print it."""
        core = f"{self.statistic} {self.direction} {self.threshold:g}"
        if self.interval:
            core = f"95% interval of {core} (all of it)"
        pre = "".join(f"; requires {r.statistic} {r.direction} {r.threshold:g}" for r in self.requires)
        return f"{core} -> {self.labels[0]}, else {self.labels[1]}{pre}"

    def judge(self, value, *, interval=None, reason: str | None = None,
              context: Mapping[str, Any] | None = None) -> Verdict:
        """The verdict on ``value`` (and on ``interval`` for an interval rule).

        Args:
          value: the statistic (a number; None or NaN when undefined).
          interval: ``(low, high)`` for a rule with ``interval=True``.
          reason: why the value (or, for an interval rule, its interval) is undefined, printed in
            the label; an interval rule given no interval but a reason is inconclusive.
          context: the statistics the preconditions in ``requires`` name.

        Raises:
          ValueError: a value that is not a number, an interval rule without an
            interval or a reason (or a malformed interval), or a precondition whose statistic is missing
            from ``context``.
        """
        if value is not None and not _is_number(value):
            raise ValueError(f"Rule {self.claim!r}: the statistic {self.statistic!r} must be a number or None, "
                             f"got {value!r}.")
        for pre in self.requires:
            if context is None or pre.statistic not in context:
                raise ValueError(f"Rule {self.claim!r} requires {pre.statistic!r}, which is not among the "
                                 f"statistics given ({sorted(context or {})}).")
            v = context[pre.statistic]
            pv, pi, pr = _unpack(v)
            sub = pre.judge(pv, interval=pi, reason=pr)
            if sub.outcome != "pass":
                why = pre.labels[1] if sub.outcome == "fail" else (pr or "precondition undefined")
                return Verdict(self, _float(value), _interval(interval), f"{INCONCLUSIVE} ({why})", "undefined",
                               f"{pre.text()}: {pre.statistic} = {_fmt(pv)}")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            why = reason or "statistic undefined"
            return Verdict(self, None, _interval(interval), f"{INCONCLUSIVE} ({why})", "undefined", why)
        if not self.interval:
            ok = self.holds(value)
            return Verdict(self, _float(value), _interval(interval), self.labels[0 if ok else 1],
                           "pass" if ok else "fail", None)
        iv = _interval(interval)
        if iv is None and reason:  # no interval, for a stated reason (e.g. one model pair): nothing to judge
            return Verdict(self, _float(value), None, f"{INCONCLUSIVE} ({reason})", "undefined", reason)
        if iv is None:
            raise ValueError(f"Rule {self.claim!r} judges an interval (interval=True) but none was given "
                             f"for {self.statistic!r}; pass interval=(low, high).")
        if any(math.isnan(x) for x in iv):
            why = reason or "interval undefined"
            return Verdict(self, _float(value), iv, f"{INCONCLUSIVE} ({why})", "undefined", why)
        lo_ok, hi_ok = self.holds(iv[0]), self.holds(iv[1])
        if lo_ok and hi_ok:
            return Verdict(self, _float(value), iv, self.labels[0], "pass", None)
        if not lo_ok and not hi_ok:
            return Verdict(self, _float(value), iv, self.labels[1], "fail", None)
        return Verdict(self, _float(value), iv, f"{INCONCLUSIVE} (interval straddles the threshold)", "undefined",
                       "interval straddles the threshold")


def _float(v):
    """A number as given (an integer count stays an integer), or None."""
    if v is None:
        return None
    return int(v) if isinstance(v, numbers.Integral) else float(v)


def _interval(iv):
    if iv is None:
        return None
    try:
        lo, hi = (float(x) for x in iv)
    except (TypeError, ValueError):
        raise ValueError(f"An interval must be a pair of numbers (low, high), got {iv!r}.") from None
    if lo > hi:
        raise ValueError(f"An interval must have low <= high, got {iv!r}.")
    return (lo, hi)


def _unpack(v):
    """``(value, interval, reason)`` from a number, None, or ``{"value", "interval", "reason"}`` (and
    ``interval_pairs``, a second interval reported beside, which no rule reads)."""
    if isinstance(v, Mapping):
        extra = sorted(set(v) - {"value", "interval", "reason", "interval_pairs"})
        if extra:
            raise ValueError(f"A statistic given as a dict takes the keys value, interval, reason (interval_pairs); "
                             f"got {extra}.")
        return v.get("value"), v.get("interval"), v.get("reason")
    return v, None, None


def _fmt(v) -> str:
    if v is None:
        return "undefined"
    if isinstance(v, numbers.Integral):
        return f"{v:,}"
    return f"{v:.3f}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3g}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A rule applied to a number.

    Attributes:
      rule: the :class:`Rule`.
      value: the statistic as given (an integer count stays an integer; None when undefined).
      interval: its interval, if one was given.
      label: the label the rule gives (``"inconclusive (...)"`` when undefined).
      outcome: ``"pass"``, ``"fail"`` or ``"undefined"``.
      reason: why the outcome is undefined (None otherwise).
    """

    rule: Rule
    value: float | int | None
    interval: tuple[float, float] | None
    label: str
    outcome: str
    reason: str | None

    def value_text(self) -> str:
        """The number as the summaries print it (with its interval, if any)."""
        s = _fmt(self.value)
        if self.interval is not None:
            s += f" [{_fmt(self.interval[0])}, {_fmt(self.interval[1])}]"
        return s

    def to_json(self) -> dict:
        return {"claim": self.rule.claim, "rule": self.rule.text(), "statistic": self.rule.statistic,
                "value": self.value, "interval": None if self.interval is None else list(self.interval),
                "label": self.label, "outcome": self.outcome, "reason": self.reason}


def coerce_rules(rules: Iterable[Rule | Mapping[str, Any]]) -> tuple[Rule, ...]:
    """A tuple of :class:`Rule` from rules or their JSON dicts (a config read back from ``config.json``).

    Examples:
      >>> coerce_rules([{"claim": "c", "statistic": "s", "direction": "<", "threshold": 1.0}])[0].direction
      '<'
    """
    if isinstance(rules, (Rule, Mapping, str)):
        raise ValueError(f"Verdict rules must be a sequence of rules, got a single {type(rules).__name__}.")
    out = []
    for r in rules:
        if isinstance(r, Rule):
            out.append(r)
        elif isinstance(r, Mapping):
            out.append(Rule.from_dict(r))
        else:
            raise ValueError(f"A verdict rule must be a Rule or a dict of its fields, got {type(r).__name__}.")
    return tuple(out)


def check_rules(rules: Iterable[Rule], known: Iterable[str], /, *, owner: str) -> None:
    """Refuse rules (or their preconditions) that name a statistic the driver does not compute.

    Raises:
      ValueError: naming the rule, the unknown statistic and the known ones.
    """
    known = set(known)
    claims = set()
    for r in rules:
        if r.claim in claims:
            raise ValueError(f"{owner}: two verdict rules decide the claim {r.claim!r}; give each its own claim.")
        claims.add(r.claim)
        for x in (r, *r.requires):
            if x.statistic not in known:
                raise ValueError(f"{owner}: the verdict rule {r.claim!r} names the statistic {x.statistic!r}, which "
                                 f"this driver does not compute; known statistics: {', '.join(sorted(known))}.")


def judge_all(rules: Iterable[Rule], statistics: Mapping[str, Any], /) -> list[Verdict]:
    """Apply every rule to its statistic.

    Args:
      rules: the config's rules.
      statistics: ``{name: value}``; a value is a number, None (undefined), or
        ``{"value": v, "interval": (lo, hi), "reason": "why undefined"}``.

    Raises:
      ValueError: a rule whose statistic is missing from ``statistics``.

    Examples:
      >>> rules = (Rule("a", "x", ">=", 3), Rule("b", "y", "<", 0.9))
      >>> [v.label for v in judge_all(rules, {"x": 3, "y": {"value": None, "reason": "no event"}})]
      ['reproduced', 'inconclusive (no event)']
    """
    out = []
    for r in rules:
        if r.statistic not in statistics:
            raise ValueError(f"The verdict rule {r.claim!r} needs the statistic {r.statistic!r}; the driver gave "
                             f"{', '.join(sorted(statistics))}.")
        value, interval, reason = _unpack(statistics[r.statistic])
        out.append(r.judge(value, interval=interval, reason=reason, context=statistics))
    return out


def calibrate(rules: Iterable[Rule], metrics: Mapping[str, Any], /) -> tuple[list[Verdict], list[str]]:
    """``(our verdicts, the summary's table)`` from ``metrics["verdict_statistics"]``, calibrated on ``metrics["authors"]``
    (``{"statistics", "source"}``): a rule that fails on the authors' data labels ours "uncalibrated (...)"."""
    theirs = {v.rule.claim: v for v in judge_all(rules, metrics["authors"]["statistics"])}
    ours = []
    for v in judge_all(rules, metrics["verdict_statistics"]):
        if (r := theirs.get(v.rule.claim)) is not None and r.outcome != "pass":
            why = f"{'fails' if r.outcome == 'fail' else 'undefined'} on the authors' data"
            v = dataclasses.replace(v, label=f"{UNCALIBRATED} ({why}; ours: {v.label})", outcome="undefined", reason=why)
        ours.append(v)
    return ours, [f"Calibrated on {metrics['authors']['source']}.", "",
                  *markdown_table(ours, reference=theirs, reference_name="the authors' data")]


def markdown_table(verdicts: Iterable[Verdict], /, *, reference: Mapping[str, Verdict] | None = None,
                   reference_name: str = "reference") -> list[str]:
    """The summary's verdict table: claim, rule, number and label (and the same rule on a reference run).

    Args:
      verdicts: from :func:`judge_all`.
      reference: ``{claim: Verdict}`` of the same rules applied to another run (optional column).
      reference_name: that column's heading.
    """
    ref = reference or {}
    head = "| claim | rule (in the config) | ours | label |"
    sep = "|---|---|---:|---|"
    if ref:
        head += f" {reference_name}, same rule |"
        sep += "---|"
    lines = [head, sep]
    for v in verdicts:
        row = f"| {v.rule.claim} | `{v.rule.text()}` | {v.value_text()} | **{v.label}** |"
        if ref:
            r = ref.get(v.rule.claim)
            row += (" n/a |" if r is None else f" {r.label} |" if r.value is None
                    else f" {r.value_text()} ({r.label}) |")
        lines.append(row)
    return lines
