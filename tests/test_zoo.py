"""`funsim zoo`: the smoke zoo end to end, resumption per model, loading, data sets, the paper config on mock data."""

import dataclasses
import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import funsim.models.train  # noqa: F401  (loads the submodule that models.train names below)
from funsim import models
from funsim.experiments import cli, data, zoo
from funsim.experiments.io import read_json, to_jsonable
from tests.conftest import NEEDS_TFDS

PNG = b"\x89PNG\r\n\x1a\n"


class Crash(Exception):
    """A simulated interruption (a killed process) in the middle of a zoo."""


def _counting_train(monkeypatch, fail_at=None):
    """Patch models.train.train to record the workdirs it trains in (and to crash at call ``fail_at``)."""
    calls, real = [], models.train.train

    def wrapped(model, *args, workdir=None, **kw):
        calls.append(workdir.name)
        if fail_at is not None and len(calls) == fail_at:
            raise Crash("simulated interruption")
        return real(model, *args, workdir=workdir, **kw)

    monkeypatch.setattr(models.train, "train", wrapped)
    return calls


def test_smoke_zoo_end_to_end_interrupted_and_resumed(tmp_path, monkeypatch):
    cfg = zoo.CONFIGS["smoke"]
    args = ["zoo", "--config", "smoke", "--root", str(tmp_path), "--no-progress"]
    out = tmp_path / "zoo" / "smoke"  # the run name defaults to the config's name

    calls = _counting_train(monkeypatch, fail_at=3)
    with pytest.raises(Crash):
        cli.main(args)
    partial = read_json(out / "zoo.json")
    assert not partial["complete"] and list(partial["models"]) == ["digits/linear_s0", "digits/linear_s1"]
    with pytest.raises(ValueError, match="incomplete \\(2 models so far\\)"):
        zoo.load_zoo(out)
    assert set(zoo.load_zoo(out, allow_incomplete=True).models) == set(partial["models"])
    stamps = {p: p.stat().st_mtime_ns for p in (out / "models" / "digits" / "linear_s0").rglob("*") if p.is_file()}

    calls = _counting_train(monkeypatch)
    assert cli.main(args) == 0
    # finished models are not retrained; the interrupted one and the rest are
    assert calls == ["mlp_s0", "mlp_s1", "cnn_s0", "cnn_s1"]
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())

    manifest = read_json(out / "zoo.json")
    ids = [f"digits/{m.name}_s{s}" for m in cfg.models for s in cfg.seeds]
    assert manifest["complete"] and list(manifest["models"]) == ids
    for png in ["accuracy_digits.png", "training_digits.png", *(f"models/{i}/training.png" for i in ids)]:
        blob = (out / png).read_bytes()
        assert blob[:8] == PNG and len(blob) > 5000, png
    metrics = read_json(out / "metrics.json")
    assert metrics["n_models"] == 6 and metrics["datasets"] == {"digits": "ok"}
    assert metrics["architectures"] == ["cnn", "linear", "mlp"]
    summary = (out / "summary.md").read_text()
    assert "| digits | trained | 256 / 96 | parity, magnitude |" in summary and summary.count("| mlp | mlp |") == 1
    assert to_jsonable(zoo.config_from_dict(read_json(out / "config.json"))) == to_jsonable(cfg)
    assert not list(out.rglob("*.tmp*"))  # atomic writes leave nothing behind

    # load_zoo rebuilds every model; its accuracy, recomputed here, is the manifest's
    loaded = zoo.load_zoo(out)
    zd = zoo.load_zoo_data(out, "digits")
    assert loaded.datasets == ("digits",) and [m.id for m in loaded.by_dataset("digits")] == ids
    for mid, m in loaded.models.items():
        e = manifest["models"][mid]
        acc = float((np.asarray(m.model(zd.dataset.x_test)).argmax(-1) == zd.dataset.y_test).mean())
        assert acc == pytest.approx(e["test_accuracy"], abs=1e-6)
        feats = m.model.features(zd.dataset.x_test[:3])
        assert list(feats) == e["layers"] == list(m.layers)
        depths = [m.relative_depth[k] for k in m.layers]
        assert depths == sorted(depths) and depths[-1] == 1 and 0 < depths[0]
        assert {k: list(v.shape[1:]) for k, v in feats.items()} == e["feature_shapes"]
        assert e["n_params"] == sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(m.model, nnx.Param)))
    first = zoo.load_zoo(out, step=manifest["models"]["digits/cnn_s0"]["checkpoint_steps"][0], datasets=("digits",))
    assert not np.allclose(first.models["digits/cnn_s0"].model(zd.dataset.x_test), loaded.models["digits/cnn_s0"].model(zd.dataset.x_test))

    # the data the study reads: the same rows, plus the documented coarse groupings
    ref = data.load("digits").subset(256, 96)
    np.testing.assert_array_equal(zd.dataset.x_test, ref.x_test)
    np.testing.assert_array_equal(zd.coarse["parity"].y_test, ref.y_test % 2)
    np.testing.assert_array_equal(zd.coarse["magnitude"].y_train, ref.y_train >= 5)

    # a rerun trains nothing; a changed setup under the same run name is refused
    calls = _counting_train(monkeypatch)
    assert cli.main(args) == 0 and calls == []
    changed = dataclasses.replace(cfg, train={**cfg.train, "learning_rate": 2e-2})
    with pytest.raises(ValueError, match="digits/linear_s0 was trained with a different setup:\n.*learning_rate: saved 0.01, now 0.02"):
        zoo.run(changed, root=tmp_path, progress=False, log=lambda m: None)
    assert read_json(out / "config.json")["train"]["learning_rate"] == cfg.train["learning_rate"]  # refused up front


def test_authors_mlp_zoo_trains_and_reloads_with_its_batch_statistics(tmp_path):
    """The authors_mlp config: the paper code's five MLP presets with BatchNorm and dropout 0.1, a plain MLP and
    the default CNN, on the default zoo's data and training. Two of its networks on the smoke zoo's data: the
    reloaded models carry their trained running averages (the manifest's test loss, recomputed here)."""
    import optax

    authors, smoke = zoo.CONFIGS["authors_mlp"], zoo.CONFIGS["smoke"]
    assert (authors.datasets, authors.seeds, authors.train) == (zoo.CONFIGS["default"].datasets,
                                                                zoo.CONFIGS["default"].seeds, zoo.CONFIGS["default"].train)
    specs = {m.name: m for m in authors.models}
    assert list(specs) == ["mlp_small", "mlp_medium", "mlp_large", "mlp_deep", "mlp_wide", "mlp_medium_plain", "cnn"]
    assert specs["mlp_large"].kwargs == {"widths": (2048, 1024, 512, 256), "batch_norm": True, "dropout": 0.1}
    assert specs["mlp_medium_plain"].kwargs == {"widths": (1024, 512, 256)}
    cfg = dataclasses.replace(smoke, name="authors", models=(specs["mlp_small"], specs["mlp_medium_plain"]), seeds=(0,),
                              train={**smoke.train, "steps": 4, "eval_every": 4}, n_checkpoints=1)
    with jax.default_matmul_precision("highest"):  # the logged loss against an eager one (on a GPU: not TF32)
        zoo.run(cfg, root=tmp_path, progress=False, log=lambda m: None)
        out = tmp_path / "zoo" / "authors"
        manifest, loaded, zd = read_json(out / "zoo.json"), zoo.load_zoo(out), zoo.load_zoo_data(out, "digits")
        for mid, m in loaded.models.items():
            ce = optax.softmax_cross_entropy_with_integer_labels(m.model(zd.dataset.x_test), zd.dataset.y_test).mean()
            assert float(ce) == pytest.approx(manifest["models"][mid]["test_loss"], abs=1e-5), mid
    bn = loaded.models["digits/mlp_small_s0"].model
    assert bn.batch_norm and bn.dropout == 0.1 and not np.allclose(bn.norms[0].mean[...], 0)
    assert manifest["models"]["digits/mlp_small_s0"]["build"]["kwargs"] == {
        "widths": [512, 256], "batch_norm": True, "dropout": 0.1}
    assert loaded.models["digits/mlp_medium_plain_s0"].model.norms is None


def _fake_fashion(directory):
    import gzip
    import struct

    rng = np.random.default_rng(0)
    directory.mkdir()
    for split, n in (("train", 40), ("t10k", 20)):
        for kind, arr in (("images-idx3", rng.integers(0, 256, (n, 28, 28))), ("labels-idx1", np.arange(n) % 10)):
            arr = arr.astype(np.uint8)
            head = bytes([0, 0, 8, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
            (directory / f"{split}-{kind}-ubyte.gz").write_bytes(gzip.compress(head + arr.tobytes()))


def test_optional_data_sets_are_skipped_and_present_ones_trained(tmp_path, capsys):
    _fake_fashion(tmp_path / "fashion")
    cfg = zoo.ZooConfig(
        name="two",
        datasets=(
            zoo.DataSpec("fashion_mnist", optional=True, options={"source": "idx", "idx_dir": str(tmp_path / "fashion")}),
            zoo.DataSpec("mnist", optional=True),  # tfds, not prepared in data_dir: skipped
        ),
        models=(zoo.ModelSpec("linear", "linear"),),
        seeds=(0,),
        train={"steps": 2, "batch_size": 8, "eval_every": 2},
        n_checkpoints=1,
        data_dir=str(tmp_path / "tfds"),
    )
    path = tmp_path / "two.json"
    path.write_text(json.dumps(to_jsonable(cfg)))
    assert cli.main(["zoo", "--config", str(path), "--root", str(tmp_path), "--no-progress"]) == 0
    manifest = read_json(tmp_path / "zoo" / "two" / "zoo.json")
    assert manifest["datasets"]["mnist"]["status"] == "skipped"
    # how to get it: prepare it with tfds, or install tfds first where it is absent
    how = "download=True" if importlib.util.find_spec("tensorflow_datasets") else "pip install tensorflow-datasets"
    assert how in manifest["datasets"]["mnist"]["reason"]
    assert list(manifest["models"]) == ["fashion_mnist/linear_s0"]
    assert "| mnist | skipped |" in (tmp_path / "zoo" / "two" / "summary.md").read_text()
    zd = zoo.load_zoo_data(tmp_path / "zoo" / "two", "fashion_mnist")
    np.testing.assert_array_equal(zd.coarse["coarse"].y_train, np.asarray(data.FASHION_COARSE)[zd.dataset.y_train])
    with pytest.raises(ValueError, match=f"'mnist' of the zoo in .* was skipped: .*{how}"):
        zoo.load_zoo_data(tmp_path / "zoo" / "two", "mnist")
    # a required data set that is absent fails with the instructions, and a bad --config is refused
    required = {"base": "smoke", "datasets": [{"name": "mnist"}], "data_dir": str(tmp_path / "tfds")}
    path.write_text(json.dumps(required))
    assert cli.main(["zoo", "--config", str(path), "--root", str(tmp_path), "--no-progress"]) == 1
    assert how in capsys.readouterr().out
    assert cli.main(["zoo", "--config", "huge"]) == 2
    with pytest.raises(ValueError, match="unknown ZooConfig fields \\['steps'\\]"):
        zoo.config_from_dict({"base": "smoke", "steps": 3})
    bad = zoo.config_from_dict({"base": "smoke", "models": [{"name": "m", "arch": "mlp", "train": {"lr": 1}}]})
    with pytest.raises(ValueError, match="Unknown training options \\['lr'\\].*of 'm'"):
        zoo.run(bad, root=tmp_path, progress=False, log=lambda m: None)


def _paper_on_mock(models_, steps=2):
    paper = zoo.CONFIGS["paper"]
    return dataclasses.replace(
        paper, models=models_, seeds=(0,), n_checkpoints=1,
        train={**paper.train, "steps": steps, "batch_size": 8, "eval_every": steps, "eval_train_size": 16,
               "eval_batch_size": 10},
    )


@NEEDS_TFDS
def test_paper_config_runs_on_mock_tfds_data(tmp_path):
    import tensorflow_datasets as tfds

    paper = zoo.CONFIGS["paper"]
    cnn = next(m for m in paper.models if m.name == "cnn")
    cfg = _paper_on_mock((cnn,))
    with tfds.testing.mock_data(num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE):
        zoo.run(cfg, root=tmp_path, progress=False, log=lambda m: None)
        out = tmp_path / "zoo" / "paper"
        manifest = read_json(out / "zoo.json")
        coarse = zoo.load_zoo_data(out, "cifar100").coarse
    classes = {"cifar10": 10, "cifar100": 100, "cifar100_coarse": 20, "svhn_cropped": 10}
    assert {k: d["n_classes"] for k, d in manifest["datasets"].items()} == classes
    assert all(d["input_shape"] == [32, 32, 3] and d["load"]["options"]["download"] is False
               for d in manifest["datasets"].values())
    assert {k: list(d["coarse"]) for k, d in manifest["datasets"].items()} == {
        "cifar10": ["vehicle_animal"], "cifar100": ["coarse"], "cifar100_coarse": [], "svhn_cropped": ["parity", "magnitude"]}
    assert coarse["coarse"].n_classes == 20
    for name in classes:
        e = manifest["models"][f"{name}/cnn_s0"]
        assert e["spec"]["train_config"]["augment"] == ("crop" if name == "svhn_cropped" else "crop_flip")
        assert e["feature_shapes"]["logits"] == [classes[name]] and 0 <= e["test_accuracy"] <= 1
    assert zoo.load_zoo(out).models["cifar100/cnn_s0"].model(jnp.zeros((2, 32, 32, 3))).shape == (2, 100)


def test_paper_architectures_are_the_published_sizes():
    """Every paper-config network builds at CIFAR size; abstractly (DenseNet-40 takes minutes to initialise here)."""
    paper = {m.name: m for m in zoo.CONFIGS["paper"].models}
    x = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
    shapes = {}
    for name, m in paper.items():
        build = lambda m=m: models.get_model(m.arch, (32, 32, 3), 100, **m.kwargs)
        feats = jax.eval_shape(lambda x, build=build: build().features(x), x)
        assert feats["logits"].shape == (1, 100)
        shapes[name] = {k: v.shape[1:] for k, v in feats.items()}
    # ResNet-20/56: 3 stages of 3 / 9 blocks, 16-32-64 channels (He et al. 2016, §4.2)
    assert sum(k.startswith("block") for k in shapes["resnet20"]) == 9
    assert sum(k.startswith("block") for k in shapes["resnet56"]) == 27
    assert shapes["resnet56"]["block2_8"] == (8, 8, 64)
    assert shapes["densenet40"]["dense2"] == (8, 8, 258) and shapes["shufflenet"]["conv5"] == (4, 4, 1024)
    assert shapes["mobilenet"]["sep12"] == (2, 2, 1024)  # 13 separable blocks, 32 -> 2 pixels


@NEEDS_TFDS
@pytest.mark.slow
def test_every_paper_architecture_trains_on_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    cfg = dataclasses.replace(_paper_on_mock(zoo.CONFIGS["paper"].models), datasets=(zoo.DataSpec("cifar10"),))
    with tfds.testing.mock_data(num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE):
        metrics = zoo.run(cfg, root=tmp_path, progress=False, log=lambda m: None)
    assert metrics["n_models"] == len(cfg.models) and all(np.isfinite(list(metrics["accuracy"].values())))
