"""The study-vs-older-revision benchmark (benchmarks/study_before.py)'s argument checks and zoo subset (no JAX, milliseconds)."""

import json

import pytest

from benchmarks import study_before as B


def test_defaults_are_one_dataset():
    a = B.parse_args([])
    assert a.models == list(B.DEFAULT_MODELS)
    assert a.before == "02ff8ac" and a.rounds == 1 and a.stitch_train_rows == 200


@pytest.mark.parametrize("argv", [["--models", ""], ["--models", "digits/cnn_s0,mnist5k/cnn_s0"],
                                  ["--models", "cnn_s0"], ["--rounds", "0"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        B.parse_args(argv)
    assert e.value.code == 2
    assert "--models" in capsys.readouterr().err or "--rounds" in " ".join(argv)


def _zoo(tmp_path, sampling="independent"):
    zoo = tmp_path / "zoo"
    models = {}
    for mid in ("d/a_s0", "d/b_s0", "d/c_s0"):
        wd = f"models/{mid}"
        (zoo / wd).mkdir(parents=True)
        (zoo / wd / "train_config.json").write_text(json.dumps({"config": {"steps": 3, "sampling": sampling}}))
        (zoo / wd / "weights.bin").write_bytes(b"x")
        models[mid] = {"dataset": "d", "workdir": wd}
    (zoo / "zoo.json").write_text(json.dumps({"models": models, "datasets": {"d": {}, "e": {}}, "complete": True}))
    return zoo


def test_subset_zoo_keeps_only_the_chosen_models_and_strips_new_keys(tmp_path):
    out = B.subset_zoo(_zoo(tmp_path), ["d/a_s0", "d/c_s0"], tmp_path / "sub")
    manifest = json.loads((out / "zoo.json").read_text())
    assert sorted(manifest["models"]) == ["d/a_s0", "d/c_s0"]
    assert list(manifest["datasets"]) == ["d"]
    assert not (out / "models/d/b_s0").exists()
    tc = json.loads((out / "models/d/a_s0/train_config.json").read_text())
    assert tc == {"config": {"steps": 3}}
    assert (out / "models/d/c_s0/weights.bin").read_bytes() == b"x"


def test_subset_zoo_refuses_unknown_models_and_other_sampling(tmp_path):
    with pytest.raises(SystemExit, match="not in"):
        B.subset_zoo(_zoo(tmp_path), ["d/zzz"], tmp_path / "sub")
    with pytest.raises(SystemExit, match="sampling='epochs'"):
        B.subset_zoo(_zoo(tmp_path / "2", sampling="epochs"), ["d/a_s0"], tmp_path / "sub2")
