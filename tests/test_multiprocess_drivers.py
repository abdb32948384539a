"""``funsim zoo`` and ``funsim similarity-study`` on 2 real processes equal 1 process; a killed process resumes.

Every run here is ``funsim launch -n N ...`` (real processes, gloo, the
coordinator on 127.0.0.1), so the one-process reference and the two-process run
take the same code path, in the same kind of process (x64 off, as users run it).
All of it is slow on this 2-core machine (minutes), so all of it is marked slow;
the default suite's multi-process test is in tests/test_multiprocess_grid.py.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from funsim.experiments import cli
from funsim.runtime import launcher

pytestmark = pytest.mark.slow

# A smaller smoke zoo: 4 models (2 per process), a few seconds each.
ZOO = {"base": "smoke", "name": "mp", "models": [{"name": "linear", "arch": "linear"},
                                                {"name": "mlp", "arch": "mlp", "kwargs": {"widths": [16]}}]}
STUDY = {"base": "smoke", "name": "mp", "zoo": "mp", "measures": ["cka/linear", "procrustes"],
         "families": ["affine"], "stitch_steps": 10}


def _configs(tmp: Path) -> tuple[str, str]:
    z, s = tmp / "zoo.json", tmp / "study.json"
    z.write_text(json.dumps(ZOO))
    s.write_text(json.dumps(STUDY))
    return str(z), str(s)


def _launch(capsys, n: int, *argv: str) -> str:
    rc = cli.main(["launch", "-n", str(n), "--timeout", "900", *argv, "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0, f"funsim launch -n {n} {' '.join(argv)}: status {rc}\n{out.out[-4000:]}\n{out.err[-3000:]}"
    return out.out


def _manifest(root: Path) -> dict:
    return json.loads((root / "zoo" / "mp" / "zoo.json").read_text())


def _same_zoo(one: dict, two: dict) -> None:
    assert one["complete"] and two["complete"]
    assert list(one["models"]) == list(two["models"])  # config order, whatever process trained each
    for k, a in one["models"].items():
        b = two["models"][k]
        for q in ("test_accuracy", "test_loss", "train_accuracy", "train_loss"):
            np.testing.assert_allclose(b[q], a[q], rtol=1e-6, err_msg=f"{k} {q}")
        assert a["spec"] == b["spec"] and a["layers"] == b["layers"]


def test_smoke_zoo_and_study_on_two_processes_equal_one(tmp_path, capsys):
    from funsim.experiments.similarity_study import read_table

    zoo_cfg, study_cfg = _configs(tmp_path)
    roots = {n: tmp_path / f"n{n}" for n in (1, 2)}
    logs = {}
    for n, root in roots.items():
        logs[n] = _launch(capsys, n, "zoo", "--config", zoo_cfg, "--root", str(root))
        logs[n] += _launch(capsys, n, "similarity-study", "--config", study_cfg, "--root", str(root))
    _same_zoo(_manifest(roots[1]), _manifest(roots[2]))
    two = logs[2].splitlines()
    # model k by process k mod 2; the merge and the report once, on process 0
    for k, mid in enumerate(_manifest(roots[2])["models"]):
        assert any(ln.startswith(f"[{k % 2}] [p{k % 2}/2]") and f"{mid}: test accuracy" in ln for ln in two), mid
    assert sum("[done]" in ln for ln in two) == 2 and all(ln.startswith("[0]") for ln in two if "[done]" in ln)
    units = sorted(p.relative_to(roots[2]) for p in (roots[2] / "zoo" / "mp" / "units").rglob("*.json"))
    assert len(units) == 4
    a = read_table(roots[1] / "similarity_study" / "mp" / "comparisons.csv")
    b = read_table(roots[2] / "similarity_study" / "mp" / "comparisons.csv")
    assert len(a["value"]) > 0
    for c in a:
        if a[c].dtype.kind == "f":
            np.testing.assert_array_equal(np.isnan(b[c]), np.isnan(a[c]), err_msg=c)
            np.testing.assert_allclose(b[c], a[c], rtol=0, atol=1e-5, equal_nan=True, err_msg=c)
        else:
            np.testing.assert_array_equal(b[c], a[c], err_msg=c)
    assert not (roots[2] / "zoo" / "mp" / "run.lock").exists()  # released by process 0


def test_a_killed_process_is_rerun_and_finishes_only_its_missing_models(tmp_path, capsys):
    """Kill process 1 of 2 after its first model; the launcher stops process 0; a rerun in one process
    trains only the missing models (finished unit files and checkpoints are not rewritten) and the zoo
    equals a zoo trained in one go."""
    zoo_cfg, _ = _configs(tmp_path)
    root = tmp_path / "killed"
    units = root / "zoo" / "mp" / "units" / "digits"
    first_of_p1 = units / "linear_s1.json"  # model 1 of [linear_s0, linear_s1, mlp_s0, mlp_s1]
    killed = {}

    def killer(procs):
        def run():
            end = time.monotonic() + 600
            while not first_of_p1.exists():
                if time.monotonic() > end or any(p.poll() is not None for p in procs):
                    return
                time.sleep(0.05)
            procs[1].send_signal(signal.SIGKILL)
            killed["t"] = time.monotonic()

        killed["thread"] = threading.Thread(target=run, daemon=True)
        killed["thread"].start()

    argv = [sys.executable, "-m", "funsim.experiments.cli", "zoo", "--config", zoo_cfg, "--root", str(root),
            "--no-progress"]
    res = launcher.run_processes(argv, 2, on_start=killer, timeout_s=900, grace_s=5)
    killed["thread"].join(timeout=60)
    assert "t" in killed, res.describe()
    assert res.returncodes[1] == -signal.SIGKILL and res.failed == 1, res.describe()
    assert res.returncodes[0] != 0 and 0 in res.stopped, res.describe()  # fail fast: stopped, not waiting
    assert time.monotonic() - killed["t"] < 120
    manifest = json.loads((root / "zoo" / "mp" / "zoo.json").read_text())
    assert not manifest["complete"]
    before = {p.name: p.stat().st_mtime_ns for p in units.glob("*.json")}
    assert "linear_s1.json" in before and len(before) < 4, before
    ckpts = {p: p.stat().st_mtime_ns for name in before
             for p in (root / "zoo" / "mp" / "models" / "digits" / name[:-5] / "checkpoints").rglob("*") if p.is_file()}

    out = _launch(capsys, 1, "zoo", "--config", zoo_cfg, "--root", str(root))  # rerun alone: one process
    for name in before:
        assert f"digits/{name[:-5]}: done before" in out, out
        assert (units / name).stat().st_mtime_ns == before[name], f"{name} was written again"
    assert all(p.stat().st_mtime_ns == t for p, t in ckpts.items()), "a finished model's checkpoint was rewritten"
    retrained = [ln for ln in out.splitlines() if ": test accuracy" in ln]
    assert len(retrained) == 4 - len(before), out

    ref = tmp_path / "reference"
    _launch(capsys, 1, "zoo", "--config", zoo_cfg, "--root", str(ref))
    _same_zoo(_manifest(ref), _manifest(root))


def test_a_run_folder_in_use_is_refused_by_every_process_at_once(tmp_path):
    """Process 0 cannot lock the study's folder (another run holds it): both processes end with status 1 and a
    clear message, at once (no wait at JAX's shutdown barrier), even without the launcher's fail-fast."""
    from funsim.experiments import io as xio

    zoo_dir = tmp_path / "zoo" / "fake"
    zoo_dir.mkdir(parents=True)
    (zoo_dir / "zoo.json").write_text(json.dumps({"datasets": {}, "models": {}, "complete": True}))
    cfg = tmp_path / "study.json"
    cfg.write_text(json.dumps({"base": "smoke", "name": "locked", "zoo": str(zoo_dir)}))
    folder = tmp_path / "similarity_study" / "locked"
    xio.acquire_run_lock(folder)  # "another run", alive: this test's own process
    try:
        argv = [sys.executable, "-m", "funsim.experiments.cli", "similarity-study", "--config", str(cfg), "--root",
                str(tmp_path), "--no-progress"]
        res = launcher.run_processes(argv, 2, stop_on_failure=False, timeout_s=300, grace_s=5)
    finally:
        xio.release_run_lock(folder)
    assert res.returncodes == [1, 1] and not res.timed_out, res.describe()
    assert res.seconds < 150, res.describe()  # not JAX's 300 s shutdown barrier
    tail0, tail1 = ("".join(t) for t in res.tails)
    assert "is in use by another run" in tail0, tail0
    assert "process 0 of this 2-process run could not open the run folder" in tail1, tail1
    assert "ending this process with status 1" in tail0 and "ending this process with status 1" in tail1
    assert sorted(p.name for p in folder.iterdir()) == []  # nothing written by either process (lock released)
