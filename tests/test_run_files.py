"""Run folders and the files in them: config mistakes, fast subcommand help, the one changed-config
check, run locks, checkpoint checksums and damaged result files."""

import ast
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from funsim.experiments import cli
from funsim.experiments import io as xio
from funsim.experiments.config import load_config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _status(capsys, argv):
    """``funsim ARGV``'s exit status and stderr (argparse's own errors exit through SystemExit)."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


# ----------------------------------------------------------------------------- config mistakes

# every driver that reads --config: (subcommand, an integer field of its config)
CONFIG_DRIVERS = [("zoo", "n_checkpoints"), ("similarity-study", "n_rows"), ("forgetting", "seed"),
                  ("backdoor", "seed"), ("grokking", "seed"), ("language", "seed")]


@pytest.mark.parametrize("command,int_field", CONFIG_DRIVERS)
def test_config_mistakes_print_the_real_error_with_the_file_name(tmp_path, capsys, command, int_field):
    cases = {
        "typo.json": ('{"base": "smoke", "not_a_field": 1}' if command in ("zoo", "similarity-study")
                      else '{"not_a_field": 1}', ["not_a_field"]),
        "broken.json": ('{"seed": 1', ["not valid JSON", "line 1"]),
        "wrongtype.json": (json.dumps({int_field: "12"}), [f"'{int_field}'", "must be an integer", '"12"']),
        "fraction.json": (json.dumps({int_field: 1.7}), [f"'{int_field}'", "must be an integer", "1.7"]),
        "notanobject.json": ("[1, 2]", ["JSON object"]),
    }
    for name, (text, expected) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        rc, err = _status(capsys, [command, "--config", str(path), "--root", str(tmp_path / "results")])
        assert rc == 2, (name, err)
        assert str(path) in err and "Traceback" not in err and "invalid parse value" not in err, (name, err)
        for e in expected:
            assert e in err, (name, e, err)
    assert not (tmp_path / "results").exists()  # nothing was run, nothing written


# every driver whose config has a learning rate, and that field's name
LEARNING_RATES = [("forgetting", "learning_rate"), ("backdoor", "learning_rate"), ("grokking", "learning_rate"),
                  ("language", "learning_rate"), ("similarity-study", "stitch_learning_rate")]


@pytest.mark.parametrize("command,field", LEARNING_RATES)
@pytest.mark.parametrize("value", [-1, 0.0])
def test_a_learning_rate_must_be_positive(tmp_path, capsys, command, field, value):
    """``learning_rate: -1`` was accepted, trained (diverging), then advised a lower learning rate."""
    path = tmp_path / "bad.json"
    base = {"base": "smoke"} if command == "similarity-study" else {}
    path.write_text(json.dumps({**base, field: value}))
    rc, err = _status(capsys, [command, "--config", str(path), "--root", str(tmp_path / "results")])
    assert rc == 2, err
    assert str(path) in err and f"field '{field}' must be a finite number > 0" in err and "Traceback" not in err, err
    assert not (tmp_path / "results").exists()


def test_a_nested_learning_rate_is_checked_too():
    from funsim.experiments import zoo

    with pytest.raises(xio.ConfigError, match=r"field 'train.learning_rate' must be a finite number > 0, got -0.5"):
        zoo.config_from_dict({"base": "smoke", "train": {"learning_rate": -0.5}})


def test_ctrl_c_prints_one_line_saying_how_to_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C during a run printed a 62-line traceback; now one line with the command that resumes
    it, and exit status 130 (128 + SIGINT)."""
    from funsim.experiments import grokking

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(grokking, "main", interrupted)
    argv = ["grokking", "--config", "smoke", "--root", str(tmp_path / "my results")]
    rc, err = _status(capsys, argv)
    assert rc == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "interrupted" in lines[0] and "resume" in lines[0], err
    assert lines[0].endswith(f"funsim grokking --config smoke --root '{tmp_path / 'my results'}'"), err


def test_types_are_checked_against_the_config_annotations():
    from funsim.experiments import similarity_study, zoo

    for bad, msg in [({"seeds": "12"}, r"field 'seeds' must be a list of integers, got the string \"12\""),
                     ({"seeds": [1.7]}, r"field 'seeds\[0\]' must be an integer, got the number 1.7"),
                     ({"seeds": [True]}, r"field 'seeds\[0\]' must be an integer, got the boolean true"),
                     ({"download": "yes"}, r"field 'download' must be true or false"),
                     ({"datasets": [{"name": "digits", "n_train": "5"}]},
                      r"field 'datasets\[0\].n_train' must be an integer or null"),
                     ({"datasets": [{"name": "digits", "n_trian": 5}]},
                      r"unknown DataSpec fields \['n_trian'\] in 'datasets\[0\]'"),
                     ({"models": "mlp"}, r"field 'models' must be a list, each an object with ModelSpec fields"),
                     ({"train": [1]}, r"field 'train' must be an object")]:
        with pytest.raises(xio.ConfigError, match=msg):
            zoo.config_from_dict({"base": "smoke", **bad})
    cfg = zoo.config_from_dict({"base": "smoke", "seeds": [3, 4], "datasets": [{"name": "digits", "n_train": None}]})
    assert cfg.seeds == (3, 4) and cfg.datasets == (zoo.DataSpec("digits"),)
    # a number field takes an integer; a list of strings becomes a tuple; null where None is allowed
    s = similarity_study.config_from_dict({"base": "smoke", "split": 1, "measures": ["cka/linear"], "datasets": None})
    assert s.split == 1 and s.measures == ("cka/linear",) and s.datasets is None
    with pytest.raises(xio.ConfigError, match=r"field 'measures\[1\]' must be a string, got the integer 3"):
        similarity_study.config_from_dict({"base": "smoke", "measures": ["cka/linear", 3]})
    # the training options of a zoo are checked against TrainConfig when the zoo is set up
    bad = zoo.config_from_dict({"base": "smoke", "train": {"steps": "16"}})
    with pytest.raises(xio.ConfigError, match=r"Training options of the zoo config.*field 'steps' must be an integer"):
        zoo._train_config(bad, bad.datasets[0], bad.models[0], 0)


def test_load_config_round_trips_a_saved_config_and_names_the_file(tmp_path):
    from funsim.experiments import forgetting

    cfg = forgetting.CONFIGS["smoke"]
    path = tmp_path / "saved.json"
    xio.write_json_atomic(path, cfg)  # how config.json is written
    assert load_config(forgetting.ForgettingConfig, {}, str(path)) == cfg  # nested tuples come back
    path.write_text(json.dumps({"curriculum": "base"}))
    with pytest.raises(xio.ConfigError, match=rf"{path}: field 'curriculum' must be a list"):
        load_config(forgetting.ForgettingConfig, {}, str(path))


def test_subcommand_help_does_not_import_jax():
    """`funsim COMMAND --help` answers without importing jax, flax or matplotlib (as fast as `funsim --help`)."""
    code = textwrap.dedent("""
        import contextlib, io, sys
        from funsim.experiments import cli
        for name in cli.SUBCOMMANDS:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    cli.main([name, "--help"])
                except SystemExit:
                    pass
            heavy = sorted(m for m in ("jax", "flax", "optax", "orbax", "matplotlib", "funsim.models",
                                       "funsim.similarity") if m in sys.modules)
            print(name, "usage: funsim " + name in buf.getvalue(), heavy)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(cli.SUBCOMMANDS)
    for line in lines:
        assert line.endswith(" True []"), line


# ----------------------------------------------------------------------------- one changed-config check


def test_one_changed_config_check(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Cfg:
        a: int = 1
        b: tuple = ((1, (2, 3)),)
        new: str = "x"

    assert xio.check_run_config(tmp_path, Cfg()) is True
    assert xio.check_run_config(tmp_path, Cfg()) is False
    with pytest.raises(xio.SetupMismatchError, match=r"different config(.|\n)*a: saved 1, now 2(.|\n)*b: saved"):
        xio.check_run_config(tmp_path, Cfg(a=2, b=()))
    # a run saved before a field existed resumes when the field is at its default, and only then
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["new"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert xio.check_run_config(tmp_path, Cfg()) is False
    with pytest.raises(ValueError, match="new: saved 'x', now 'y'"):
        xio.check_run_config(tmp_path, Cfg(new="y"))


def test_no_private_names_imported_across_these_modules():
    """The zoo's and the study's shared helpers are public: no ``module._name`` from another funsim module."""
    for name in ("zoo", "similarity_study", "curriculum", "language", "grokking", "forgetting", "backdoor",
                 "quickstart", "usable_information", "report", "cli", "io"):
        tree = ast.parse((ROOT / "experiments" / f"{name}.py").read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("funsim"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, (name, node.module, private)
                modules |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name.startswith("funsim")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in modules):
                raise AssertionError(f"experiments/{name}.py uses {node.value.id}.{node.attr}")


# ----------------------------------------------------------------------------- run locks

HOLDER = textwrap.dedent("""
    import sys, time
    from funsim.experiments.io import acquire_run_lock
    for d in sys.argv[1:]:
        acquire_run_lock(d)
    print("locked", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def held(tmp_path):
    """Run folders locked by a live second process; yields (folders, process)."""
    names = ("zoo/smoke", "similarity_study/smoke", "forgetting/smoke", "backdoor/smoke", "grokking/smoke",
             "language/smoke", "quickstart/smoke")
    dirs = [tmp_path / n for n in names]
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *map(str, dirs)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield dirs, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_run_into_a_locked_folder_is_refused_before_it_writes_anything(tmp_path, held, capsys):
    from funsim.experiments import backdoor, forgetting, grokking, language, quickstart, similarity_study, zoo
    from funsim.experiments import usable_information as ui

    dirs, proc = held
    # the study reads its zoo's manifest first: give it one
    xio.write_json_atomic(tmp_path / "zoo" / "smoke" / "zoo.json", {"datasets": {}, "models": {}})
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    runs = [(zoo.run, zoo.CONFIGS["smoke"]), (similarity_study.run, similarity_study.CONFIGS["smoke"]),
            (forgetting.run, forgetting.CONFIGS["smoke"]), (backdoor.run, backdoor.CONFIGS["smoke"]),
            (grokking.run, grokking.CONFIGS["smoke"]), (language.run, language.CONFIGS["smoke"]),
            (quickstart.run, quickstart.TINY)]
    for fn, cfg in runs:
        with pytest.raises(xio.RunLockedError, match=rf"in use by another run \(pid {proc.pid} on .*run\.lock"):
            fn(cfg, root=tmp_path, run_name="smoke", progress=False, log=lambda *a: None)
    (dirs[1] / "comparisons.csv").write_text("x\n")
    before[dirs[1] / "comparisons.csv"] = b"x\n"
    with pytest.raises(xio.RunLockedError):
        ui.report(dirs[1], log=lambda *a: None)
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # not one file written, changed or removed (config.json included)
    # through the command line: one line naming the holder and the lock file, exit status 1
    rc, err = _status(capsys, ["zoo", "--config", "smoke", "--root", str(tmp_path), "--no-progress"])
    assert rc == 1 and f"pid {proc.pid}" in err and str(dirs[0] / "run.lock") in err and "Traceback" not in err


def test_a_stale_lock_is_taken_over_with_a_warning_and_locks_are_released(tmp_path):
    d = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(d)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "locked"
    with pytest.raises(xio.RunLockedError):
        xio.acquire_run_lock(d)
    proc.send_signal(signal.SIGKILL)  # killed: its lock file stays behind
    proc.wait()
    assert json.loads((d / "run.lock").read_text())["pid"] == proc.pid
    with pytest.warns(RuntimeWarning, match=rf"Taking over the lock {d / 'run.lock'}.*pid {proc.pid}"):
        xio.acquire_run_lock(d)
    assert json.loads((d / "run.lock").read_text())["pid"] == os.getpid()
    xio.acquire_run_lock(d)  # nests within this process
    xio.release_run_lock(d)
    assert (d / "run.lock").exists()
    xio.release_run_lock(d)
    assert not (d / "run.lock").exists()

    @xio.releases_run_locks
    def run(fail):
        xio.open_run("exp", "r", root=tmp_path)
        assert (tmp_path / "exp" / "r" / "run.lock").exists()
        if fail:
            raise KeyError("boom")

    run(False)
    assert not (tmp_path / "exp" / "r" / "run.lock").exists()
    with pytest.raises(KeyError):
        run(True)
    assert not (tmp_path / "exp" / "r" / "run.lock").exists()
    # a lock released by this process is free for another one at once
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "exp" / "r")], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT)
    try:
        assert other.stdout.readline().strip() == "locked"
    finally:
        other.kill()
        other.wait()


# ----------------------------------------------------------------------------- checkpoints


class Crash(Exception):
    """A simulated interruption (a killed process) in the middle of training."""


ONE_MODEL = {"base": "smoke", "name": "one", "models": [{"name": "linear", "arch": "linear"}], "seeds": [0],
             "n_checkpoints": 4}  # checkpoints at steps 1, 4, 9, 16


def _params(zoo_dir):
    import jax
    from flax import nnx

    from funsim.experiments import zoo

    m = zoo.load_zoo(zoo_dir).models["digits/linear_s0"].model
    return [jax.device_get(a) for a in jax.tree.leaves(nnx.state(m, nnx.Param))]


@pytest.fixture(scope="module")
def reference_zoo(tmp_path_factory):
    """The uninterrupted one-model zoo and its trained parameters."""
    from funsim.experiments import zoo

    root = tmp_path_factory.mktemp("reference")
    zoo.run(zoo.config_from_dict(ONE_MODEL), root=root, progress=False, log=lambda s: None)
    out = root / "zoo" / "one"
    return out, _params(out)


def _damage(step_dir, how):
    """Flip a byte in, or cut, the largest array file of a checkpoint."""
    victim = max((p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    victim.write_bytes(bytes(data))
    return victim


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_damaged_newest_checkpoint_of_an_interrupted_zoo_is_set_aside(tmp_path, monkeypatch, reference_zoo, how):
    """The rerun falls back to the previous good checkpoint, with a warning naming the damaged one, and
    finishes with exactly the uninterrupted run's parameters (it used to resume from the damaged one)."""
    import numpy as np

    import funsim.models.train
    from funsim.experiments import zoo

    real = funsim.models.train.train

    def interrupted(*args, **kw):
        def crash(step, metrics):
            # the callback runs after each compiled chunk (which ends at every checkpoint step):
            # stopping at step 9 leaves checkpoints 1, 4 and 9 on disk
            if step == 9:
                raise Crash("killed")
        return real(*args, callback=crash, **kw)

    cfg = zoo.config_from_dict(ONE_MODEL)
    monkeypatch.setattr(funsim.models.train, "train", interrupted)
    with pytest.raises(Crash):
        zoo.run(cfg, root=tmp_path, progress=False, log=lambda s: None)
    monkeypatch.setattr(funsim.models.train, "train", real)
    wd = tmp_path / "zoo" / "one" / "models" / "digits" / "linear_s0"
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir()) == [1, 4, 9]
    assert all((wd / "checkpoints" / s / "funsim_checksums.json").is_file() for s in ("1", "4", "9"))
    victim = _damage(wd / "checkpoints" / "9", how)
    with pytest.warns(RuntimeWarning, match=rf"Checkpoint {wd / 'checkpoints' / '9'} is damaged: {victim}.*"
                                            rf"damaged_checkpoints.*resuming from step 4"):
        zoo.run(cfg, root=tmp_path, progress=False, log=lambda s: None)
    assert (wd / "damaged_checkpoints" / "9").is_dir()  # kept for inspection, out of the way
    ref_dir, ref_params = reference_zoo
    for a, b in zip(_params(tmp_path / "zoo" / "one"), ref_params):
        np.testing.assert_array_equal(a, b)  # bit for bit the uninterrupted run
    assert read_metrics(tmp_path) == read_metrics(ref_dir.parent.parent)


def read_metrics(root):
    m = xio.read_json(root / "zoo" / "one" / "zoo.json")["models"]["digits/linear_s0"]
    return {k: m[k] for k in ("test_accuracy", "test_loss", "train_accuracy", "train_loss")}


def test_load_zoo_refuses_a_damaged_checkpoint_and_the_zoo_rerun_repairs_it(tmp_path, reference_zoo, capsys):
    import shutil

    import numpy as np

    from funsim.experiments import zoo

    ref_dir, ref_params = reference_zoo
    out = tmp_path / "zoo" / "one"
    shutil.copytree(ref_dir, out)
    wd = out / "models" / "digits" / "linear_s0"
    victim = _damage(wd / "checkpoints" / "16", "flip")
    with pytest.raises(xio.DamagedFileError, match=rf"(?s)Model digits/linear_s0 of the zoo in {out}: Checkpoint "
                                                   rf"{wd / 'checkpoints' / '16'} is damaged: {victim} does not match"
                                                   r".*rerun `funsim zoo --config"):
        zoo.load_zoo(out)
    # an earlier checkpoint still loads; the study's command line reports the damage in one line
    zoo.load_zoo(out, step=9)
    rc, err = _status(capsys, ["similarity-study", "--config", "smoke", "--zoo", str(out), "--root", str(tmp_path),
                               "--no-progress"])
    assert rc == 1 and str(victim) in err and "Traceback" not in err
    # the zoo's rerun retrains the damaged model from its last good checkpoint: the same parameters
    logs = []
    with pytest.warns(RuntimeWarning, match=rf"Checkpoint {wd / 'checkpoints' / '16'} is damaged.*resuming from step 9"):
        zoo.run(zoo.config_from_dict(ONE_MODEL), root=tmp_path, progress=False, log=logs.append)
    assert any("final checkpoint is damaged" in line for line in logs)
    for a, b in zip(_params(out), ref_params):
        np.testing.assert_array_equal(a, b)


def test_a_damaged_zoo_manifest_is_rebuilt_without_retraining(tmp_path, reference_zoo):
    import shutil

    import numpy as np

    from funsim.experiments import zoo

    ref_dir, ref_params = reference_zoo
    out = tmp_path / "zoo" / "one"
    shutil.copytree(ref_dir, out)
    shutil.rmtree(out / zoo.UNITS)  # no per-model unit files either (a zoo written before them): checkpoints only
    (out / "zoo.json").write_bytes((ref_dir / "zoo.json").read_bytes()[:300])
    with pytest.raises(xio.DamagedFileError, match=rf"{out / 'zoo.json'} is not valid JSON"):
        zoo.load_zoo(out)
    logs = []
    zoo.run(zoo.config_from_dict(ONE_MODEL), root=tmp_path, progress=False, log=logs.append)
    assert any(f"{out / 'zoo.json'} is not valid JSON: rebuilding it" in line for line in logs)
    entry = xio.read_json(out / "zoo.json")["models"]["digits/linear_s0"]
    assert entry["resumed_from"] == 16  # loaded from its final checkpoint, not retrained
    assert read_metrics(tmp_path) == read_metrics(ref_dir.parent.parent)
    for a, b in zip(_params(out), ref_params):
        np.testing.assert_array_equal(a, b)


def test_a_damaged_zoo_manifest_is_rebuilt_from_the_unit_files(tmp_path, reference_zoo):
    """The per-model unit files survive a damaged zoo.json: the manifest is rebuilt from them, nothing is trained."""
    import shutil

    import numpy as np

    from funsim.experiments import zoo

    ref_dir, ref_params = reference_zoo
    out = tmp_path / "zoo" / "one"
    shutil.copytree(ref_dir, out)
    unit = out / zoo.UNITS / "digits" / "linear_s0.json"
    written = unit.stat().st_mtime_ns
    (out / "zoo.json").write_bytes((ref_dir / "zoo.json").read_bytes()[:300])
    logs = []
    zoo.run(zoo.config_from_dict(ONE_MODEL), root=tmp_path, progress=False, log=logs.append)
    assert any("digits/linear_s0: done before" in line for line in logs), logs
    assert unit.stat().st_mtime_ns == written  # not written again
    assert xio.read_json(out / "zoo.json")["models"] == xio.read_json(ref_dir / "zoo.json")["models"]
    for a, b in zip(_params(out), ref_params):
        np.testing.assert_array_equal(a, b)


LOAD = textwrap.dedent("""
    import json, sys
    from flax import nnx
    from funsim import models
    from funsim.models.io import DamagedFileError
    from funsim.models.train import load_checkpoint
    build = json.loads(sys.argv[2])
    try:
        load_checkpoint(nnx.eval_shape(lambda: models.get_model(build["arch"], tuple(build["input_shape"]),
                                                                build["n_classes"])), sys.argv[1])
    except DamagedFileError as e:
        print("DamagedFileError:", e)
    else:
        print("loaded")
""")


def test_checkpoints_saved_without_checksums_still_load_and_a_damaged_one_is_named(tmp_path, reference_zoo):
    import shutil

    ref_dir, _ = reference_zoo
    wd = tmp_path / "wd"
    shutil.copytree(ref_dir / "models" / "digits" / "linear_s0", wd)
    for f in wd.rglob("funsim_checksums.json"):
        f.unlink()  # as saved before checksums were recorded
    build = json.dumps(xio.read_json(ref_dir / "zoo.json")["models"]["digits/linear_s0"]["build"])
    load = lambda: subprocess.run([sys.executable, "-c", LOAD, str(wd), build], capture_output=True,  # noqa: E731
                                  text=True, check=True, cwd=ROOT).stdout.strip()
    assert load() == "loaded"
    _damage(wd / "checkpoints" / "16", "truncate")
    # (in a subprocess: orbax leaves the coroutines of its failed read behind)
    out = load()
    assert out.startswith(f"DamagedFileError: Checkpoint {wd / 'checkpoints' / '16'} cannot be read"), out
    assert not list((ref_dir / "models").rglob("checkpoints.incoming/*"))  # every save was moved into place


# ----------------------------------------------------------------------------- result files


def test_cached_arrays_recompute_a_damaged_file(tmp_path):
    import numpy as np

    from funsim.experiments import curriculum as cur

    calls = []

    def compute():
        calls.append(1)
        return {"m": np.arange(1000.0).reshape(10, 100)}

    path = tmp_path / "similarity.npz"
    first = cur.cached_arrays(path, np.arange(3), compute)
    assert cur.cached_arrays(path, np.arange(3), compute)["m"].tolist() == first["m"].tolist() and len(calls) == 1
    good = path.read_bytes()
    for damaged in (good[: len(good) // 2], good[:200] + bytes([good[200] ^ 0xFF]) + good[201:]):
        path.write_bytes(damaged)  # half-written; one byte of an array changed
        with pytest.raises(xio.DamagedFileError, match=rf"{path} is damaged"):
            xio.read_npz(path)
        with pytest.warns(RuntimeWarning, match=rf"{path} is damaged.*Recomputing it"):
            again = cur.cached_arrays(path, np.arange(3), compute)
        np.testing.assert_array_equal(again["m"], first["m"])
        assert path.read_bytes() == good
    assert len(calls) == 3


def test_damaged_json_is_named():
    import tempfile

    path = pathlib.Path(tempfile.mkdtemp()) / "zoo.json"
    path.write_text('{"models": {"a": 1')
    with pytest.raises(xio.DamagedFileError, match=rf"{path} is not valid JSON"):
        xio.read_json(path)
    from funsim.experiments import zoo

    with pytest.raises(xio.DamagedFileError, match=rf"{path} is not valid JSON.*Rerun `funsim zoo --config "
                                                   rf"{path.parent / 'config.json'}.*rebuilds the manifest"):
        zoo.read_manifest(path.parent)


def test_source_version_is_the_code_the_process_loaded(tmp_path):
    """A result records the tree its process started from: an edit during a run does not change the version
    that process reports (its units stay consistent), and a new process reads the edited tree."""
    root = pathlib.Path(__file__).resolve().parents[1]
    tree = tmp_path / "funsim"
    tree.mkdir()
    (tree / "__init__.py").write_text("")
    for pkg in ("similarity", "models", "experiments", "data", "runtime"):
        for f in (root / pkg).rglob("*.py"):
            dest = tree / f.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())
    script = textwrap.dedent(f"""
        import pathlib, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from funsim.models import io
        assert pathlib.Path(io.__file__).resolve().parent.parent == pathlib.Path({str(tree)!r}).resolve()
        first = io.source_version()
        if sys.argv[1] == "edit":
            with open({str(tree / "similarity" / "cka.py")!r}, "a") as f:
                f.write("# an edit while the run goes on\\n")
        print(first, io.source_version())
    """)

    def run(arg):
        out = subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    before, during = run("edit")
    assert before == during  # the process keeps the version of the tree it loaded
    after, again = run("read")
    assert after == again != before  # a new process sees the edit
