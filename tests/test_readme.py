"""Every ```python block in README.md and in docs/*.md runs as written, so the docs cannot drift.

Each block runs in a fresh namespace, from the repository root, as its own test named after
its file and line (``README.md:262``, ``docs/design.md:90``). Shell blocks (```bash) are commands
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
    assert len(python_blocks(README.read_text())) >= 5


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
