"""funsim installs as one namespace and runs outside the checkout.

The repository keeps three top-level folders (``similarity/``, ``models/``,
``experiments/``); the wheel must install them as ``funsim.similarity``,
``funsim.models`` and ``funsim.experiments`` and nothing else at the top level, so
that funsim never shadows a user's own ``models`` or ``experiments`` package.

The wheel and the sdist are built offline from this checkout (no build isolation).
The wheel is installed, without its dependencies, into a fresh virtual environment
whose only other entry on ``sys.path`` is the test environment's site-packages (for
jax, flax, ...). Its console script and the README's first example then run from a
directory outside the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from tests.test_readme import README, python_blocks

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("similarity", "data", "runtime", "models", "experiments")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and the sdist, built from a copy of the sources (the checkout stays clean)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    code = f"from setuptools import build_meta as b; b.build_wheel({str(out)!r}); b.build_sdist({str(out)!r})"
    _run([sys.executable, "-c", code], cwd=src)
    return out


def test_the_wheel_installs_one_namespace(dist):
    (wheel,) = dist.glob("funsim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"funsim"}, f"the wheel installs top-level names {sorted(tops)}; only 'funsim' is allowed"
    for pkg in PACKAGES:
        assert f"funsim/{pkg}/__init__.py" in names, f"funsim/{pkg} is missing from the wheel"
        # every module, subpackages too (a subpackage missing from pyproject's list is left out silently)
        shipped = {n.split("/", 2)[2] for n in names if n.startswith(f"funsim/{pkg}/") and n.endswith(".py")}
        source = {p.relative_to(ROOT / pkg).as_posix() for p in (ROOT / pkg).rglob("*.py")
                  if "__pycache__" not in p.parts}
        assert shipped == source, f"funsim/{pkg} in the wheel differs from {pkg}/: {sorted(shipped ^ source)}"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "funsim = funsim.experiments.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_sdist_carries_the_sources(dist):
    (sdist,) = dist.glob("funsim-*.tar.gz")
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for required in ("pyproject.toml", "README.md", *(f"{p}/__init__.py" for p in PACKAGES)):
        assert required in names, f"{required} is missing from {sdist.name}"


def test_installed_wheel_runs_outside_the_checkout(dist, tmp_path):
    (wheel,) = dist.glob("funsim-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the dependencies (jax, flax, ...) come from the test environment; its editable funsim
    # finder is a .pth file, which Python processes only in site directories, not here
    (purelib / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)])

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    where = _run([str(py), "-c", "import funsim.similarity as s; print(s.__file__)"], cwd=outside, env=env).stdout
    assert Path(where.strip()).is_relative_to(purelib), f"funsim was imported from {where.strip()}, not the wheel"
    for bare in PACKAGES:  # nothing installed under the bare names
        probe = _run([str(py), "-c", f"import importlib.util as u; print(u.find_spec({bare!r}))"], cwd=outside, env=env)
        assert probe.stdout.strip() == "None", f"a top-level {bare!r} is importable: {probe.stdout}"

    helped = _run([str(env_dir / "bin" / "funsim"), "--help"], cwd=outside, env=env).stdout
    assert "usage: funsim" in helped

    line, code, _ = next(b for b in python_blocks(README.read_text()) if b[2] is None)
    (outside / "example.py").write_text(code)
    _run([str(py), "example.py"], cwd=outside, env=env)
