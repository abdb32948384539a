"""The import rules of funsim's own packages, read from the source (AST, nothing is imported).

1. Every import of funsim's packages is absolute and namespaced: ``funsim.similarity``,
   ``funsim.models``, ``funsim.experiments``; never the bare ``similarity`` / ``models`` /
   ``experiments`` (the repository folders) and never a relative import.
2. No module uses an underscore name of another module: not ``from funsim.x.m import _f``,
   not ``m._f`` on an imported funsim module. What is shared is public, or lives in a
   private module of the *same* package (``funsim.similarity._validate`` inside
   ``funsim.similarity``), imported by its public names.
3. Layering: similarity <- models <- experiments <- benchmarks, and data, runtime <- experiments; no
   package imports a later one or one of its own layer (similarity, data and runtime import no other
   funsim package),
   and none imports ``tests``. ``benchmarks/`` follows rules 1, 2 and 4 too: it may use the public
   names of the three packages (and its own modules' public names, ``benchmarks._timing``'s
   included), never a private name of theirs nor a test helper.
4. One tree API: ``jax.tree.map`` / ``leaves`` / ``structure``, not ``jax.tree_util.tree_*``
   (``jax.tree_util.register_*`` has no ``jax.tree`` spelling and stays).

Tests may poke privates; the rules are for the packages. ``ALLOWED`` lists offences known
to be removed on other branches, each with who removes it: the list must only shrink.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"similarity": "funsim.similarity", "data": "funsim.data", "runtime": "funsim.runtime",
            "models": "funsim.models", "experiments": "funsim.experiments"}
#: a package imports only packages of a lower layer: similarity, data and runtime (layer 0) import no other
#: package of funsim, models imports similarity (and may import data or runtime), experiments all of them
LAYER = {"funsim.similarity": 0, "funsim.data": 0, "funsim.runtime": 0, "funsim.models": 1, "funsim.experiments": 2}

#: (module, offence) pairs known on other branches; the integrator empties this at merge.
ALLOWED: set = set()


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGES[parts[0]], *parts[1:]])


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in PACKAGES for p in sorted((ROOT / folder).rglob("*.py"))}


MODULES = modules()


BENCHMARKS = {f"benchmarks.{p.stem}": p for p in sorted((ROOT / "benchmarks").glob("*.py"))}
#: the top-level names no module of the packages or the benchmarks may import (besides the layering)
FORBIDDEN = {"tests": "a test helper", "benchmarks": "the benchmarks"}


def package_of(module: str) -> str:
    return "benchmarks" if module.split(".")[0] == "benchmarks" else ".".join(module.split(".")[:2])


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def offences(module: str, source: str) -> list[str]:
    """Every breach of rules 1-4 in one module's source, as readable strings."""
    tree = ast.parse(source)
    pkg = package_of(module)
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> funsim module it is bound to

    def check_module_path(target: str, text: str) -> None:
        parts = target.split(".")
        if parts[0] in FORBIDDEN and parts[0] != pkg:
            found.append(f"{text}  ({FORBIDDEN[parts[0]]}: {pkg} may not import {parts[0]})")
            return
        if parts[0] in PACKAGES:
            found.append(f"{text}  (bare import: use funsim.{target})")
            return
        if parts[0] != "funsim" or len(parts) < 2:
            return
        target_pkg = ".".join(parts[:2])
        if target_pkg in LAYER and LAYER[target_pkg] > LAYER.get(pkg, len(LAYER)):
            found.append(f"{text}  (upward import: {pkg} may not import {target_pkg})")
        elif target_pkg in LAYER and target_pkg != pkg and LAYER[target_pkg] == LAYER.get(pkg):
            found.append(f"{text}  (same layer: {pkg} may not import {target_pkg})")
        if target_pkg != pkg and any(is_private(p) for p in parts[2:]):
            found.append(f"{text}  (a private module of another package)")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                check_module_path(a.name, f"import {a.name}")
                if a.name in MODULES:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(f"from {'.' * node.level}{node.module or ''} import ...  (relative import)")
                continue
            src = node.module or ""
            for a in node.names:
                text = f"from {src} import {a.name}"
                check_module_path(f"funsim.{a.name}" if src == "funsim" else src, text)
                full = f"{src}.{a.name}"
                if full in MODULES:  # a module imported by name
                    aliases[a.asname or a.name] = full
                    if is_private(a.name) and package_of(full) != pkg:
                        found.append(f"{text}  (a private module of another package)")
                elif is_private(a.name) and src.split(".")[0] in ("funsim", "benchmarks", *PACKAGES):
                    found.append(text)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base = aliases.get(node.value.id)
            if base is not None and base != module and is_private(node.attr):
                found.append(f"{node.value.id}.{node.attr}  ({base}.{node.attr} is private)")
    # rule 4, on the dotted text of every attribute chain
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("tree_") and isinstance(node.value, ast.Attribute):
            if node.value.attr == "tree_util" and isinstance(node.value.value, ast.Name) and node.value.value.id == "jax":
                found.append(f"jax.tree_util.{node.attr}")
    return sorted(set(found))


def _key(offence: str) -> str:
    return offence.split("  (")[0]


def test_the_scanner_sees_each_kind_of_offence():
    src = "\n".join([
        "import similarity",
        "from models.mlp import MLP",
        "from . import io",
        "from funsim.similarity.cka import _centre",
        "from funsim.similarity import _validate",
        "import funsim.similarity._linalg",
        "from funsim.experiments import plotting",
        "from funsim.models import train as T",
        "x = T._fingerprint",
        "y = jax.tree_util.tree_map(f, t)",
        "z = jax.tree_util.register_dataclass",
        "from funsim.similarity.cka import cka",
    ])
    found = offences("funsim.models.bilinear", src)
    keys = [_key(f) for f in found]
    assert "import similarity" in keys and "from models.mlp import MLP" in keys
    assert any("relative import" in f for f in found)
    assert "from funsim.similarity.cka import _centre" in keys
    assert any(f.startswith("from funsim.similarity import _validate") and "another package" in f for f in found)
    assert any(f.startswith("import funsim.similarity._linalg") for f in found)
    assert any("upward import" in f for f in found)  # models importing experiments
    assert "T._fingerprint" in keys and "jax.tree_util.tree_map" in keys
    assert not any("register_dataclass" in f or f.endswith("import cka") for f in found)
    # the benchmarks: public names of any package, no privates, no test helpers; no package imports them
    bench = "\n".join([
        "from funsim.experiments import similarity_study as S",
        "S._stitched_logits",
        "from funsim.similarity import cka",
        "from tests._compiles import CompileCounter",
        "from benchmarks.bench_tensor import _timeit",
        "from benchmarks._timing import first_and_warm",
    ])
    keys = [_key(f) for f in offences("benchmarks.bench_models", bench)]
    assert "S._stitched_logits" in keys and "from tests._compiles import CompileCounter" in keys
    assert "from benchmarks.bench_tensor import _timeit" in keys
    assert not any(k.endswith("import cka") or k.endswith("first_and_warm") for k in keys)
    assert [_key(f) for f in offences("funsim.experiments.zoo", "import benchmarks.run_all")] == ["import benchmarks.run_all"]
    assert [_key(f) for f in offences("funsim.similarity.cka", "from tests import _compiles")] == ["from tests import _compiles"]
    # the packages of one layer do not import each other
    assert any("same layer" in f for f in offences("funsim.data", "from funsim.similarity import cka"))
    assert any("same layer" in f for f in offences("funsim.similarity.cka", "from funsim import data"))
    assert offences("funsim.experiments.zoo", "from funsim import data") == []
    assert any("upward import" in f for f in offences("funsim.similarity.cka", "from funsim import models"))
    # inside its own package a private module is fine, by its public names
    assert offences("funsim.similarity.cka", "from funsim.similarity import _validate as V\nV.check_finite") == []
    assert offences("funsim.similarity.cka", "from funsim.similarity import _validate as V\nV._helper") != []


@pytest.mark.parametrize("module", sorted(MODULES) + sorted(BENCHMARKS))
def test_imports_follow_the_rules(module):
    found = offences(module, {**MODULES, **BENCHMARKS}[module].read_text())
    new = [f for f in found if (module, _key(f)) not in ALLOWED]
    assert not new, f"{module} breaks funsim's import rules (see this test's docstring):\n  " + "\n  ".join(new)


def test_the_allow_list_only_names_offences_that_still_exist():
    """When an offence is fixed, its entry goes (so the list cannot hide a new one of the same text)."""
    live = {(m, _key(f)) for m, p in {**MODULES, **BENCHMARKS}.items() for f in offences(m, p.read_text())}
    stale = sorted(ALLOWED - live)
    assert not stale, f"remove these from ALLOWED, they are fixed: {stale}"


# ----------------------------------------------------------------------------- declared dependencies

#: Distribution name -> the top-level module it provides, where the two differ.
IMPORT_NAME = {"scikit-learn": "sklearn", "orbax-checkpoint": "orbax", "tensorflow-datasets": "tensorflow_datasets"}


def imported_top_levels() -> set[str]:
    """Every top-level module the three packages import anywhere (function-local imports included)."""
    found = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def declared(extra: str | None = None) -> list[str]:
    """The distribution names of ``[project] dependencies`` (or of one optional extra)."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [re.match(r"[A-Za-z0-9_.-]+", s).group(0).lower() for s in specs]


def test_every_runtime_dependency_is_imported_by_the_package():
    imported = imported_top_levels()
    unused = [d for d in declared() if IMPORT_NAME.get(d, d.replace("-", "_")) not in imported]
    assert not unused, f"declared in pyproject.toml but never imported by the package: {unused}"


def test_scipy_is_a_test_and_benchmark_dependency_only():
    """SciPy is the tests' float64 reference; the package never imports it (not even lazily)."""
    assert "scipy" not in imported_top_levels()
    assert "scipy" not in declared() and "scipy" in declared("test") and "scipy" in declared("bench")


def test_the_library_has_no_progress_bars():
    """Progress bars are the drivers' (``experiments/``): ``similarity/`` reports progress through callbacks."""
    found = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "similarity").rglob("*.py")) if "tqdm" in p.read_text()]
    assert not found, found
    assert any("tqdm" in p.read_text() for p in (ROOT / "experiments").rglob("*.py"))  # the scan can find it
