"""benchmarks/run_all.py: a run writes a new dated record under benchmarks/results/ and never edits RESULTS.md.

The benchmark list is stubbed (one module whose ``main`` returns a fixed section), so this takes
milliseconds; the real benchmarks are run by ``make bench``.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from benchmarks import run_all

RESULTS = Path(run_all.__file__).resolve().parent / "RESULTS.md"


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """run_all with one stub benchmark and its records going to tmp_path/results."""
    calls = []

    def main(argv):
        calls.append(list(argv))
        return "## Stub\n\n| case | time |\n|---|---:|\n| stub | 1.0 |\n"

    monkeypatch.setattr(run_all, "discover", lambda: ["stub"])
    monkeypatch.setattr(run_all, "load", lambda topic: types.SimpleNamespace(main=main))
    monkeypatch.setattr(run_all, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(run_all, "host_name", lambda: "testhost")
    return tmp_path / "results", calls


def test_a_run_writes_a_new_dated_file_and_leaves_results_md_alone(stubbed):
    out, calls = stubbed
    before = RESULTS.read_bytes()
    assert run_all.main([]) == 0
    assert run_all.main([]) == 0  # the same day and host: a second file, the first kept
    assert RESULTS.read_bytes() == before
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 2 and files[0].endswith("-testhost-2.md") and files[1].endswith("-testhost.md")
    first = (out / files[1]).read_text()
    assert first.startswith("# Benchmark results") and "| stub | 1.0 |" in first and "Machine: " in first
    assert calls == [[], []]


def test_quick_prints_and_writes_nothing_unless_given_a_directory(stubbed, tmp_path, capsys):
    out, calls = stubbed
    assert run_all.main(["--quick"]) == 0
    assert not out.exists() and "| stub | 1.0 |" in capsys.readouterr().out
    assert run_all.main(["--quick", "--results-dir", str(tmp_path / "smoke")]) == 0
    assert len(list((tmp_path / "smoke").iterdir())) == 1 and calls == [["--quick"], ["--quick"]]


def test_a_failing_benchmark_is_recorded_and_the_run_exits_non_zero(stubbed, monkeypatch):
    out, _ = stubbed

    def broken(argv):
        raise FileNotFoundError("no zoo at results/zoo/default")

    monkeypatch.setattr(run_all, "load", lambda topic: types.SimpleNamespace(main=broken))
    assert run_all.main([]) == 1
    (record,) = out.iterdir()
    assert "**bench_stub failed**: FileNotFoundError: no zoo at results/zoo/default" in record.read_text()


def test_write_record_never_replaces_a_file(tmp_path):
    paths = [run_all.write_record(f"run {k}\n", tmp_path, date="2026-01-02", host="h") for k in range(3)]
    assert [p.name for p in paths] == ["2026-01-02-h.md", "2026-01-02-h-2.md", "2026-01-02-h-3.md"]
    assert [p.read_text() for p in paths] == ["run 0\n", "run 1\n", "run 2\n"]
