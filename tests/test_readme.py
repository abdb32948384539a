"""Every ```python block in README.md and in docs/*.md runs as written, so the docs cannot drift.

Each block runs in a fresh namespace, from the repository root, as its own test named after
its file and line (``README.md:262``, ``docs/design.md:90``), here with x64 on;
tests/test_float32.py runs the same blocks with x64 off, the users' default. Shell blocks (```bash) are commands
to type, not run here. A statement that is a bare expression with a number as its comment, e.g.

    similarity.cka(X, Y)                        # 0.55761  linear CKA

is also checked: the value must round to that number at the digits shown.

Markers, in an HTML comment on the line just before the opening fence (use sparingly):

* ``<!-- readme-test: slow -->``: runs only under ``-m slow`` (``make test-slow``).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: docs whose python blocks are whole programs run by their own test, not in-process here
TESTED_ELSEWHERE = {
    "distributed.md": "tests/test_multiprocess.py runs each program in one process and on two",
}
DOCS = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in TESTED_ELSEWHERE)
MARKER = re.compile(r"<!--\s*readme-test:\s*(\w+)\s*-->")
NUMBER = re.compile(r"#\s*(-?\d+\.\d+|-?\d+)\b")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(first code line number, code, marker)`` of every ```python fenced block."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            marker = None
            if i > 0 and (m := MARKER.search(lines[i - 1])):
                marker = m.group(1)
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            blocks.append((i + 2, "\n".join(lines[i + 1 : j]), marker))
            i = j
        i += 1
    return blocks


def _params():
    out = []
    for path in (README, *DOCS):
        name = path.relative_to(ROOT).as_posix()
        for line, code, marker in python_blocks(path.read_text()):
            if marker not in (None, "slow"):
                raise ValueError(f"{name}:{line}: unknown readme-test marker {marker!r}")
            marks = [pytest.mark.slow] if marker == "slow" else []
            out.append(pytest.param(f"{name}:{line}", code, id=f"{name}:{line}", marks=marks))
    return out


def test_harness_finds_the_blocks():
    blocks = python_blocks("intro\n<!-- readme-test: slow -->\n```python\nx = 1\n```\n```bash\nls\n```\n")
    assert blocks == [(4, "x = 1", "slow")]
    assert len(python_blocks(README.read_text())) >= 3  # one example per family


def _run(code: str, where_block: str) -> None:
    """Execute ``code`` statement by statement; check expressions that carry a number comment."""
    name, _, line = where_block.rpartition(":")
    line = int(line)
    tree = ast.parse(code, filename=where_block)
    src = code.splitlines()
    ns: dict = {"__name__": "__readme__"}
    for stmt in tree.body:
        where = f"{name}:{line + stmt.lineno - 1}"
        comment = src[stmt.end_lineno - 1].partition("#")[2]
        m = NUMBER.match("#" + comment) if comment else None
        if isinstance(stmt, ast.Expr) and m:
            value = eval(compile(ast.Expression(stmt.value), where, "eval"), ns)
            want = m.group(1)
            digits = len(want.partition(".")[2])
            assert float(value) == pytest.approx(float(want), abs=0.5 * 10.0**-digits), (where, float(value))
        else:
            exec(compile(ast.Module([stmt], type_ignores=[]), where, "exec"), ns)


def test_the_docs_have_python_blocks():
    assert DOCS and sum(len(python_blocks(p.read_text())) for p in DOCS) >= 3


@pytest.mark.parametrize("where, code", _params())
def test_readme_block_runs(where, code, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # snippets run from the repository root, as the README says
    monkeypatch.setenv("MPLBACKEND", "Agg")
    assert os.getcwd() == str(ROOT)
    _run(code, where)


# ------------------------------------------------------------------ the README's table of measures
def _expand(pattern: str) -> list[str]:
    """``a/{b,c}/d`` -> ``["a/b/d", "a/c/d"]`` (every brace group, left to right)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [q for alt in m.group(1).split(",") for q in _expand(pattern[: m.start()] + alt + pattern[m.end():])]


def _measure_table() -> list[tuple[list[str], str, bool]]:
    """``(name patterns, kind cell, differentiable)`` of each row of the README's measure table."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| registered names |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names, kind, grad = (c.strip() for c in line.strip("|").split(" | "))
        patterns = [q for tok in re.findall(r"`([^`]+)`", names) for q in _expand(tok)]
        rows.append((patterns, kind, grad.startswith("yes")))
    return rows


def test_the_readme_measure_table_is_the_registry():
    """Every registered measure is in exactly one row of the README's table, with its kind and
    with "yes" under `jax.grad` exactly when the registry says it is differentiable; every row
    names a registered measure (no stale rows)."""
    from fnmatch import fnmatchcase

    from funsim import similarity

    rows = _measure_table()
    assert len(rows) >= 5
    names = similarity.list_measures()
    for name in names:
        m = similarity.measure(name)
        hits = [r for r in rows if any(fnmatchcase(name, p) for p in r[0])]
        assert len(hits) == 1, (name, [r[0] for r in hits])
        patterns, kind, grad = hits[0]
        assert m.kind in kind, (name, m.kind, kind)
        assert grad == m.differentiable, (name, m.differentiable, m.gradient)
    for patterns, _, _ in rows:
        for p in patterns:
            assert any(fnmatchcase(n, p) for n in names), f"README measure table: {p!r} names no registered measure"


def test_relative_links_in_the_docs_resolve():
    """Every relative link of README.md, docs/*.md and the benchmark results points at a file of the
    repository (and a heading of it, for a ``#fragment`` into a Markdown file)."""
    bad = []
    results = [ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "benchmarks" / "results").glob("*.md"))]
    for path in (README, *sorted((ROOT / "docs").glob("*.md")), *results):
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target) or not re.search(r"[./#]", target):
                continue  # http(s), mailto; ``[x](y)`` in a formula
            file, _, frag = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.name}: {target}")
            elif frag and dest.suffix == ".md":
                slugs = {re.sub(r"[^\w\- ]", "", h.strip("# ").lower()).replace(" ", "-")
                         for h in dest.read_text().splitlines() if h.startswith("#")}
                if frag not in slugs:
                    bad.append(f"{path.name}: {target} (no such heading)")
    assert not bad, bad
