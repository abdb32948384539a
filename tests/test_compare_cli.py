"""``funsim compare``: loading, the table/JSON output, errors, and the digits example (kept fast)."""

import json

import numpy as np
import pytest

from funsim import similarity
from funsim.experiments.cli import main as cli
from funsim.experiments.compare import format_table, make_example, principal_components
from tests.invariance import invariance_data


@pytest.fixture
def pair(tmp_path):
    x, y = invariance_data(np.random.default_rng(0))  # (16, 4) each: shares compiled code with test_registry
    np.save(tmp_path / "a.npy", x)
    np.save(tmp_path / "b.npy", y)
    np.savez(tmp_path / "both.npz", first=x, second=y)
    return tmp_path, x, y


def run(argv, capsys):
    rc = cli(["compare", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table_of_every_measure(pair, capsys):
    d, x, y = pair
    rc, out, _ = run([str(d / "a.npy"), str(d / "b.npy")], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].split() == ["measure", "kind", "sym", "value"]
    listed = {ln.split()[0] for ln in lines[3:]}
    assert listed == set(similarity.list_measures())  # n = 16 <= 300: Kendall included
    row = next(ln for ln in lines if ln.startswith("cka/linear "))
    assert float(row.split()[-1]) == pytest.approx(float(similarity.cka(x, y)), abs=1e-6)


def test_json_chosen_measures_and_npz(pair, capsys):
    d, x, y = pair
    rc, out, _ = run([f"{d / 'both.npz'}:first", f"{d / 'both.npz'}:second", "--measures",
                      "cka/linear,svcca", "shape/angular/alpha=0.5", "--json"], capsys)
    assert rc == 0
    res = json.loads(out)
    vals = {m["measure"]: m["value"] for m in res["measures"]}
    assert list(vals) == ["cka/linear", "svcca", "shape/angular/alpha=0.5"]
    assert vals["svcca"] == pytest.approx(float(similarity.svcca(x, y)), rel=1e-12)
    assert vals["shape/angular/alpha=0.5"] == pytest.approx(
        float(similarity.shape_distance(x, y, alpha=0.5)), rel=1e-12)
    assert res["a"]["shape"] == [16, 4]


def test_measure_errors_are_reported_not_fatal(tmp_path, capsys):
    rng = np.random.default_rng(1)
    np.save(tmp_path / "w.npy", rng.normal(size=(6, 10)))  # d > n: CCA is undefined
    np.save(tmp_path / "v.npy", rng.normal(size=(6, 3)))
    rc, out, _ = run([str(tmp_path / "w.npy"), str(tmp_path / "v.npy"), "--measures", "cca/r2", "nbs", "--json"], capsys)
    assert rc == 0
    rows = {m["measure"]: m for m in json.loads(out)["measures"]}
    assert rows["cca/r2"]["value"] is None and "more samples than features" in rows["cca/r2"]["error"]
    assert rows["nbs"]["value"] is not None
    assert "n/a: x has shape (6, 10): CCA needs more samples" in format_table(list(rows.values()))


@pytest.mark.parametrize(
    "argv, match",
    [
        (["{d}/missing.npy", "{d}/b.npy"], r"missing\.npy: no such file"),
        (["{d}/both.npz", "{d}/b.npy"], r"holds 2 arrays \(first, second\); pick one"),
        (["{d}/both.npz:third", "{d}/b.npy"], r"has no array 'third'"),
        (["{d}/cube.npy", "{d}/b.npy"], r"expected a 2-D \(n_samples, n_features\) array, got shape \(16, 2, 2\)"),
        (["{d}/short.npy", "{d}/b.npy"], r"shape \(10, 4\) .* shape \(16, 4\): the number of rows"),
        (["{d}/nan.npy", "{d}/b.npy"], r"1 NaN/Inf values"),
        (["{d}/a.npy", "{d}/b.npy", "--measures", "cka/linaer"], r"Did you mean 'cka/linear'"),
        (["{d}/a.npy"], r"give two files"),
    ],
)
def test_errors(pair, capsys, argv, match):
    d, x, _ = pair
    np.save(d / "cube.npy", x.reshape(16, 2, 2))
    np.save(d / "short.npy", x[:10])
    bad = x.copy()
    bad[0, 0] = np.nan
    np.save(d / "nan.npy", bad)
    rc, _, err = run([a.format(d=d) for a in argv], capsys)
    assert rc == 2
    assert err.startswith("funsim compare: error:")
    assert __import__("re").search(match, err), err


def _corrupt_middle(raw: bytes) -> bytes:
    b = bytearray(raw)
    for i in range(len(b) // 2, len(b) // 2 + 40):
        b[i] ^= 0xFF
    return bytes(b)


@pytest.mark.parametrize("name, content", [
    ("empty.npy", lambda npy, npz: b""),  # 0 bytes: numpy raises EOFError
    ("truncated.npy", lambda npy, npz: npy[: len(npy) // 2]),
    ("empty.npz", lambda npy, npz: b""),
    ("truncated.npz", lambda npy, npz: npz[: len(npz) // 2]),  # zipfile.BadZipFile
    ("corrupt.npz", lambda npy, npz: _corrupt_middle(npz)),  # a bad CRC when the member is read
])
def test_unreadable_input_exits_2_naming_the_file(pair, capsys, name, content):
    """Unreadable input is a user error (exit status 2, as documented), one line naming the file,
    never a traceback (a 0-byte .npy gave an EOFError traceback and exit status 1)."""
    import io

    d, x, _ = pair
    npy, npz = io.BytesIO(), io.BytesIO()
    np.save(npy, x)
    np.savez(npz, first=x)
    path = d / name
    path.write_bytes(content(npy.getvalue(), npz.getvalue()))
    rc, _, err = run([str(path), str(d / "b.npy")], capsys)
    assert rc == 2, err
    assert err.startswith(f"funsim compare: error: {path}: cannot read it as .npy/.npz"), err
    assert len(err.strip().splitlines()) == 1, err


def test_list(capsys):
    rc, out, _ = run(["--list"], capsys)
    assert rc == 0 and "pwcca" in out and "directed" in out


def test_example_on_digits(tmp_path, capsys):
    a, b = make_example(tmp_path / "views")
    x, y = np.load(a), np.load(b)
    assert x.shape == (1797, 61) and y.shape == (1797, 48)
    rc, out, _ = run(["--example", "--out", str(tmp_path / "ex"), "--measures", "cka/linear", "nbs"], capsys)
    assert rc == 0 and "digits example" in out
    metrics = json.loads((tmp_path / "ex" / "metrics.json").read_text())
    v = metrics["measures"][0]["value"]
    assert v == pytest.approx(float(similarity.cka(x, y)), rel=1e-10)
    assert 0.3 < v < 0.95  # related but different views


def test_complex_file_is_refused(pair, capsys):
    d, x, _ = pair
    np.save(d / "c.npy", x + 1j)
    rc, _, err = run([str(d / "c.npy"), str(d / "b.npy")], capsys)
    assert rc == 2 and "complex dtype complex128" in err


def test_nothing_computed_exits_non_zero(pair, tmp_path, capsys):
    """A script must be able to tell that no measure was computed."""
    d, _, _ = pair
    rc, _, err = run([str(d / "a.npy"), str(d / "b.npy"), "--measures", ""], capsys)
    assert rc == 2 and "--measures names no measure" in err
    rng = np.random.default_rng(1)
    np.save(tmp_path / "w.npy", rng.normal(size=(6, 10)))  # d > n: every CCA measure is n/a
    np.save(tmp_path / "v.npy", rng.normal(size=(6, 3)))
    rc, out, err = run([str(tmp_path / "w.npy"), str(tmp_path / "v.npy"), "--measures", "cca/r2,pwcca"], capsys)
    assert rc == 1
    assert "n/a" in out and "no measure could be computed" in err and "cca/r2" in err


def test_kendall_skip_follows_the_library_limit():
    """The CLI skips Kendall exactly where the library would refuse it (one limit, not two)."""
    from funsim.experiments.compare import _select, kendall_max_n
    from funsim.similarity.rsa import KENDALL_MAX_ENTRIES

    n = kendall_max_n()
    assert n * (n - 1) // 2 <= KENDALL_MAX_ENTRIES < (n + 1) * n // 2
    assert not _select(None, n)[1]
    assert _select(None, n + 1)[1] and all(m.endswith("/kendall") for m in _select(None, n + 1)[1])


def test_written_files_have_the_usual_mode(tmp_path, capsys):
    """metrics.json and the saved views respect the umask (0644 here), like the figures."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        rc, _, _ = run(["--example", "--out", str(tmp_path / "ex"), "--measures", "cka/linear"], capsys)
    finally:
        os.umask(old)
    assert rc == 0
    for name in ("metrics.json", "pixels.npy", "random_features.npy"):
        assert stat.S_IMODE((tmp_path / "ex" / name).stat().st_mode) == 0o644, name


def test_help_does_not_import_jax():
    """`funsim --help` builds its parser without importing jax or flax (it answers in well under 1 s)."""
    import subprocess
    import sys

    code = ("import sys\nfrom funsim.experiments import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('jax', 'flax', 'funsim.similarity', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "COMMAND" in out and "compare" in out and "quickstart" in out
    assert out.strip().splitlines()[-1] == "[]"


def test_principal_components_equal_scikit_learn_pca():
    from sklearn.decomposition import PCA

    x = np.random.default_rng(3).normal(size=(80, 9)) @ np.diag(np.arange(1.0, 10.0))
    got, ref = principal_components(x, 4), PCA(n_components=4).fit_transform(x)
    # scikit-learn < 1.5 fixed the signs from the scores instead: compare up to each axis's sign
    np.testing.assert_allclose(np.abs(got), np.abs(ref), rtol=1e-10, atol=1e-10)
    sign = np.sign(np.sum(got * ref, axis=0))
    np.testing.assert_allclose(got, ref * sign, rtol=1e-10, atol=1e-10)
