"""docs/: every `docs/design.md §n` pointer lands on a section, and docs/api.md is current and complete.

(The code blocks of docs/*.md run in tests/test_readme.py.)
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
API = ROOT / "docs" / "api.md"
SECTIONS = {
    1: "Layout and layering",
    2: "Representational similarity",
    3: "Stitching and usable information",
    4: "Multilinear networks and tensor similarity",
    5: "Data",
    6: "Policies: dtype, gradients, scales, errors",
}
POINTER = re.compile(r'docs/design\.md §(\d)(?:-(\d))?(?:, "([^"]+)")?')


def _design_sections() -> dict[int, tuple[str, list[str]]]:
    """``{n: (title, [subsection titles])}`` from the ``## §n`` and ``###`` headings."""
    out: dict[int, tuple[str, list[str]]] = {}
    current = None
    for line in DESIGN.read_text().splitlines():
        if m := re.match(r"## §(\d) (.+)$", line):
            current = int(m.group(1))
            out[current] = (m.group(2).strip(), [])
        elif (m := re.match(r"### (.+)$", line)) and current is not None:
            out[current][1].append(m.group(1).strip())
    return out


def _pointers() -> list[tuple[str, int, int | None, str | None]]:
    found = []
    for folder in ("similarity", "models", "experiments", "tests", "benchmarks", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".md") or path == DESIGN:
                continue
            for m in POINTER.finditer(path.read_text()):
                hi = int(m.group(2)) if m.group(2) else None
                found.append((path.relative_to(ROOT).as_posix(), int(m.group(1)), hi, m.group(3)))
    return found


def test_design_has_the_six_sections_in_order():
    got = _design_sections()
    assert list(got) == list(SECTIONS)
    assert {n: t for n, (t, _) in got.items()} == SECTIONS


def test_every_design_pointer_in_the_code_lands_on_a_section():
    sections = _design_sections()
    pointers = _pointers()
    assert len(pointers) >= 20  # the code does point here
    bad = []
    for where, lo, hi, sub in pointers:
        for n in range(lo, (hi or lo) + 1):
            if n not in sections:
                bad.append(f"{where}: §{n} does not exist")
        if sub is not None and sub not in sections.get(lo, ("", []))[1]:
            bad.append(f"{where}: §{lo} has no subsection {sub!r} (it has {sections.get(lo, ('', []))[1]})")
    assert not bad, "\n".join(bad)


def test_no_pointer_to_documents_outside_the_repository():
    """Code and docs cite docs/design.md, never working notes outside the repository or issue numbers."""
    bad = []
    patterns = re.compile(r"(?<!docs/)(?<![a-z])DESIGN\.md|STYLE\.md|\.\./shared|\bissue #\d+|\(#\d+\)")
    for folder in ("similarity", "models", "experiments", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md"):
                for i, line in enumerate(path.read_text().splitlines(), 1):
                    if patterns.search(line):
                        bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def _gen_api():
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "docs" / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_current():
    """docs/api.md is what docs/gen_api.py writes from the code now: rerun it after an API change."""
    gen = _gen_api()
    assert API.read_text() == gen.render(), "docs/api.md is not current: run `python docs/gen_api.py`"


@pytest.mark.parametrize("package", ["funsim.similarity", "funsim.models", "funsim.experiments"])
def test_every_public_name_is_in_the_api_reference(package):
    gen = _gen_api()
    text = API.read_text()
    pkg = importlib.import_module(package)
    missing = [n for n in gen.namespace_names(pkg) if f"`{n}`" not in text and f"`{n}(" not in text]
    for modname in gen.public_modules(package):
        module = importlib.import_module(modname)
        if f"### `{modname}`" not in text and gen.public_names(module):
            missing.append(modname)
        for n in gen.public_names(module):
            if not re.search(rf"`(class )?{re.escape(n)}[(` =]", text):
                missing.append(f"{modname}.{n}")
    assert not missing, f"not in docs/api.md (run `python docs/gen_api.py`): {missing}"


def test_the_benchmark_docs_agree_on_where_benchmarks_ran():
    """benchmarks/RESULTS.md is the record: each accelerator section it has ("## On a GPU: <device>")
    is named in docs/benchmarks.md and docs/gpu.md, and neither says that no benchmark ran there."""
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    bench, gpu = ((ROOT / "docs" / f).read_text() for f in ("benchmarks.md", "gpu.md"))
    devices = re.findall(r"^## On a GPU: NVIDIA (\S+)", results, flags=re.M)
    for text, name in ((bench, "benchmarks.md"), (gpu, "gpu.md")):
        denial = re.search(r"no benchmark[^.]*\bGPU|never[^.]*\bon a GPU|not run on a GPU", text, flags=re.I)
        if devices:
            assert denial is None, (name, denial.group(0))
            for d in devices:
                assert d in text, (name, d)
