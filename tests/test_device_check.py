"""benchmarks/device_check.sh (the prepared accelerator check) and benchmarks/bench_compile.py (cold/warm rows)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks import bench_compile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"


def test_the_script_parses_and_is_executable():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    assert os.access(SCRIPT, os.X_OK)


def test_the_script_brings_back_at_most_eight_files():
    """The device tool returns at most 8 files from $OUT: the logs the script names."""
    text = SCRIPT.read_text()
    names = set(re.findall(r'"\$OUTDIR/([\w.]+)"', text)) | {"summary.txt"}
    assert len(names) <= 8, names


def test_the_table_reports_every_workload_and_failures():
    ok = dict(first=12.0, second=0.004, programs_first=24, compile_s_first=10.5, programs_second=0,
              sizes=[64, 2000, [32, 64, 128, 256]], jax="0.0", backend="gpu", device="H200", n_devices=1)
    text = bench_compile.table({"fit_mixed": ok, "grid_six": {"error": "timed out after 60 s"}}, "cmd")
    assert "JAX 0.0, backend gpu (H200, 1 device(s))" in text and "Command: `cmd`" in text
    row = next(line for line in text.splitlines() if line.startswith("| `fit_mixed`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:] == ["12.00", "0.004", "3,000x", "24", "10.5", "0"]
    assert "64 problems, affine, widths 32/64/128/256, n = 2,000" in cells[0]
    assert "| `grid_six` | timed out after 60 s |" in text


@pytest.mark.slow
def test_bench_compile_cold_process_compiles_and_the_warm_call_does_not(tmp_path):
    out = tmp_path / "compile.md"
    text = bench_compile.main(["--quick", "--only", "fit_same", "--output", str(out)])
    assert out.read_text().strip() == text.strip()
    cells = [c.strip() for c in next(r for r in text.splitlines() if r.startswith("| `fit_same`")).split("|")]
    first, second, programs, programs_warm = float(cells[2]), float(cells[3]), int(cells[5]), int(cells[7])
    assert programs >= 1 and programs_warm == 0 and first > second > 0


@pytest.mark.slow
def test_the_short_cpu_mode_runs_end_to_end(tmp_path):
    env = {**os.environ, "DEVICE_CHECK_SHORT": "1", "PYTHON": sys.executable, "DEVICE_CHECK_BUDGET": "900"}
    run = subprocess.run([str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    for step in ("float32 leg: ok", "x64 suite: ok", "bench_cka: ok", "bench_rsa: ok", "bench_grid", "bench_compile"):
        assert step in summary, summary
    assert re.search(r"== x64 tests\n\d+ passed", summary) and "== cold and warm calls" in summary
    assert "| `fit_same`" in summary and "| `grid_cka`" in summary
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["summary.txt", "f32.log", "x64.log", "bench_cka.log", "bench_rsa.log", "bench_grid.log", "compile.log",
         "compile.md"])
