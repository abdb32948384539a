"""The drivers' one config path (``funsim.experiments.config``): ``--config``, ``--set`` and ``--print-config``.

Nothing here trains: ``--print-config`` shows the config a command would run, and the
grokking example records the call instead of running it (test_grokking.py).
"""

import dataclasses
import json
import typing

import pytest

from funsim.experiments import cli
from funsim.experiments import config as C
from funsim.experiments.verdict import Rule


@dataclasses.dataclass(frozen=True)
class Inner:
    width: int = 4
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Cfg:
    steps: int = 10
    rate: float = 0.1
    flag: bool = False
    label: str = "x"
    mode: typing.Literal["a", "b"] = "a"
    limit: int | None = 3
    seeds: tuple[int, ...] = (0,)
    pair: tuple[int, str] = (1, "one")
    train: dict = dataclasses.field(default_factory=dict)
    inner: Inner = Inner()


# ----------------------------------------------------------------------------- --set: values read by type


@pytest.mark.parametrize("override,field,value", [
    ("steps=2000", "steps", 2000),
    ("rate=1e-3", "rate", 1e-3),
    ("rate=2", "rate", 2),
    ("flag=true", "flag", True),
    ("flag=False", "flag", False),
    ("label=12", "label", "12"),               # a string is taken as written, even when it looks like a number
    ("label=", "label", ""),
    ("label=a=b", "label", "a=b"),             # only the first '=' separates the key
    ("mode=b", "mode", "b"),
    ("limit=none", "limit", None),
    ("limit=null", "limit", None),
    ("limit=7", "limit", 7),
    ("seeds=1,2,3", "seeds", (1, 2, 3)),
    ("seeds=[4, 5]", "seeds", (4, 5)),
    ("seeds=6", "seeds", (6,)),
    ("seeds=", "seeds", ()),
    ("pair=[2, \"two\"]", "pair", (2, "two")),
    ("train={\"steps\": 5}", "train", {"steps": 5}),
    ("train.steps=5", "train", {"steps": 5}),
    ("train.optimizer=adamw", "train", {"optimizer": "adamw"}),  # not JSON: taken as a string
    ("inner.width=8", "inner", Inner(width=8)),
    ("inner.tags=a,b", "inner", Inner(tags=("a", "b"))),
    ("inner={\"width\": 2}", "inner", Inner(width=2)),
])
def test_set_reads_each_value_as_its_field_type(override, field, value):
    cfg = C.apply_overrides(Cfg(), [override])
    assert getattr(cfg, field) == value
    assert type(getattr(cfg, field)) is type(value)
    others = {f.name for f in dataclasses.fields(Cfg)} - {field}
    assert all(getattr(cfg, f) == getattr(Cfg(), f) for f in others)


def test_set_keeps_the_other_entries_of_an_object_field_and_the_last_override_wins():
    cfg = C.apply_overrides(Cfg(train={"steps": 1, "batch_size": 8}), ["train.steps=5", "steps=1", "steps=2"])
    assert cfg.train == {"steps": 5, "batch_size": 8} and cfg.steps == 2


@pytest.mark.parametrize("override,message", [
    ("steps=two", "--set steps=two: field 'steps' must be an integer, got the string \"two\"."),
    ("steps=2.5", "--set steps=2.5: field 'steps' must be an integer, got the number 2.5."),
    ("steps=true", "--set steps=true: field 'steps' must be an integer, got the boolean true."),
    ("rate=fast", "--set rate=fast: field 'rate' must be a number, got the string \"fast\"."),
    ("flag=maybe", "--set flag=maybe: field 'flag' must be true or false, got the string \"maybe\"."),
    ("flag=1", "--set flag=1: field 'flag' must be true or false, got the integer 1."),
    ("mode=c", "--set mode=c: field 'mode' must be one of \"a\", \"b\", got the string \"c\"."),
    ("limit=many", "--set limit=many: field 'limit' must be an integer or null, got the string \"many\"."),
    ("label=null", "--set label=null: field 'label'"),  # no None for a plain string: taken as the text "null"
    ("seeds=1,x", "--set seeds=1,x: field 'seeds[1]' must be an integer, got the string \"x\"."),
    ("pair=1", "--set pair=1: field 'pair' must be a list of 2: an integer, a string, got the integer 1."),
    ("train=steps", "--set train=steps: field 'train' must be an object ({...}), got the string \"steps\"."),
    ("inner.widht=3", "--set inner.widht=3: Inner has no field 'widht'; did you mean 'width'?"),
    ("steps.x=1", "--set steps.x=1: field 'steps' of Cfg has no fields of its own (it is an integer)"),
    ("train.a.b=1", "--set train.a.b=1: 'train.a' is not an object with fields"),
    ("steps", "--set 'steps': write one field as key=value"),
    ("=3", "--set '=3': write one field as key=value"),
])
def test_bad_set_values_name_the_option_the_field_and_the_type(override, message):
    if override == "label=null":  # a string field takes any text: no error
        assert C.apply_overrides(Cfg(), [override]).label == "null"
        return
    with pytest.raises(C.ConfigError) as e:
        C.apply_overrides(Cfg(), [override])
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_an_unknown_key_names_the_nearest_valid_one():
    for typo, near in [("stepz", "steps"), ("sed", "seeds"), ("rat", "rate"), ("lable", "label")]:
        with pytest.raises(C.ConfigError, match=rf"Cfg has no field '{typo}'; did you mean '{near}'\?$"):
            C.apply_overrides(Cfg(), [f"{typo}=1"])
    # nothing close: every valid field is listed instead
    with pytest.raises(C.ConfigError, match=r"Cfg has no field 'xyzzy'; valid: steps, rate, flag, .*, inner\.$"):
        C.apply_overrides(Cfg(), ["xyzzy=1"])
    # the same suggestion for a JSON config and a base config name
    with pytest.raises(C.ConfigError, match=r"unknown Cfg fields \['stepz'\] \(did you mean 'steps'\?\); valid"):
        C.from_dict(Cfg, {}, {"stepz": 1})
    with pytest.raises(C.ConfigError, match=r"unknown base config 'smok'; did you mean 'smoke'\?"):
        C.from_dict(Cfg, {"smoke": Cfg()}, {"base": "smok"})


def test_parse_value_alone():
    assert C.parse_value("1,2", tuple[float, ...]) == [1, 2]
    assert C.parse_value("[1, 2]", list[int]) == [1, 2]
    assert C.parse_value("yes", bool) == "yes"  # not a boolean: left for the type check to name
    assert C.parse_value("{\"a\": 1}", typing.Any) == {"a": 1}
    assert C.parse_value("plain", typing.Any) == "plain"


def test_load_config_names_the_file_and_applies_overrides_after_it(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"base": "short", "seeds": [1, 2]}))
    configs = {"short": Cfg(steps=2)}
    assert C.load_config(Cfg, configs, str(path), ["rate=0.5"]) == Cfg(steps=2, seeds=(1, 2), rate=0.5)
    path.write_text(json.dumps({"steps": "2"}))
    with pytest.raises(C.ConfigError, match=rf"^{path}: field 'steps' must be an integer, got the string \"2\""):
        C.load_config(Cfg, configs, str(path))
    with pytest.raises(C.ConfigError, match=r"^--config 'shrot' is neither one of short nor a JSON file; did you mean"):
        C.load_config(Cfg, configs, "shrot")


def test_run_name_follows_the_overrides():
    assert C.run_name("default", []) == "default"
    assert C.run_name("default", ["steps=2000"]) == "default+steps=2000"
    assert C.run_name("smoke", ["name=mine", "measures=cka/linear"]) == "smoke+measures=cka_linear"
    long = C.run_name("default", [f"train.option_{i}=value" for i in range(9)])
    assert long.startswith("default+set-") and len(long) == len("default+set-") + 12
    assert long == C.run_name("default", [f"train.option_{i}=value" for i in range(9)])
    assert long != C.run_name("default", [f"train.option_{i}=value" for i in range(8)])


# ----------------------------------------------------------------------------- the base class of ruled configs


def test_ruled_configs_share_one_base_class_and_its_check():
    from funsim.experiments import backdoor, forgetting, grokking, language, similarity_study

    drivers = (grokking, forgetting, backdoor, language, similarity_study)
    classes = [grokking.GrokkingConfig, forgetting.ForgettingConfig, backdoor.BackdoorConfig,
               language.LanguageConfig, similarity_study.StudyConfig]
    for module, cls in zip(drivers, classes):
        assert issubclass(cls, C.RuledConfig) and cls.STATISTICS == frozenset(module.STATISTICS)
        # the rules' check lives in the base; grokking and language add checks of their own fields (and call it)
        assert "__post_init__" not in vars(cls) or cls in (grokking.GrokkingConfig, language.LanguageConfig)
        cfg = module.CONFIGS["smoke"]
        assert all(isinstance(r, Rule) for r in cfg.verdict_rules)
        bad = {"claim": "c", "statistic": "no_such_statistic", "direction": ">", "threshold": 0}
        with pytest.raises(C.ConfigError, match=rf"{cls.__name__}: the verdict rule 'c' names the statistic "
                                                r"'no_such_statistic', which this driver does not compute"):
            C.apply_overrides(cfg, [f"verdict_rules={json.dumps([bad])}"])
        rules = C.apply_overrides(cfg, [f"verdict_rules={json.dumps([dataclasses.asdict(cfg.verdict_rules[0])])}"])
        assert rules.verdict_rules == cfg.verdict_rules[:1]


# ----------------------------------------------------------------------------- every experiment subcommand

# subcommand -> (a --set override, the field and the value it gives)
EXPERIMENTS = {
    "zoo": ("n_checkpoints=3", "n_checkpoints", 3),
    "similarity-study": ("measures=cka/linear,svcca", "measures", ["cka/linear", "svcca"]),
    "grokking": ("steps=2000", "steps", 2000),
    "forgetting": ("stage_epochs=none", "stage_epochs", None),
    "backdoor": ("poison_rate=0.2", "poison_rate", 0.2),
    "language": ("segments=2,5", "segments", [2, 5]),
    "quickstart": ("seeds=3", "seeds", [3]),
}


def _run(capsys, argv):
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_experiment_subcommand_takes_set(capsys):
    """The subcommands with a config are exactly those above, and each offers --set and --print-config."""
    import importlib

    with_config = set()
    for name, sub in cli.SUBCOMMANDS.items():
        mod = importlib.import_module(sub.arguments)
        rc, out, _ = _run(capsys, [name, "--help"])
        assert rc == 0
        if any(dataclasses.is_dataclass(v) and v.__name__.endswith("Config") for v in vars(mod).values()
               if isinstance(v, type) and v.__module__ == mod.__name__):
            with_config.add(name)
            assert "--set KEY=VALUE" in out and "--print-config" in out, name
    assert with_config == set(EXPERIMENTS)


@pytest.mark.parametrize("command", sorted(EXPERIMENTS))
def test_set_on_each_subcommand(command, capsys, tmp_path):
    override, field, value = EXPERIMENTS[command]
    rc, out, err = _run(capsys, [command, "--set", override, "--print-config", "--root", str(tmp_path)])
    assert rc == 0, err
    shown = json.loads(out)
    assert shown[field] == value
    # what --print-config prints is a config file that gives the same config back
    path = tmp_path / "shown.json"
    path.write_text(out)
    if command != "quickstart":  # quickstart has no --config
        rc, again, err = _run(capsys, [command, "--config", str(path), "--print-config"])
        assert rc == 0, err
        assert json.loads(again) == shown
    # a misspelt field: exit status 2, one line that names the field meant, nothing run or written
    key, _, text = override.partition("=")
    typo = key[:-1] + ("z" if key[-1] != "z" else "y")
    rc, out, err = _run(capsys, [command, "--set", f"{typo}={text}", "--root", str(tmp_path / "results")])
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [f"funsim {command}: error: --set {typo}={text}: "
                                        f"{_class_name(command)} has no field '{typo}'; did you mean '{key}'?"]
    assert not (tmp_path / "results").exists()


def _class_name(command: str) -> str:
    return {"zoo": "ZooConfig", "similarity-study": "StudyConfig", "grokking": "GrokkingConfig",
            "forgetting": "ForgettingConfig", "backdoor": "BackdoorConfig", "language": "LanguageConfig",
            "quickstart": "QuickstartConfig"}[command]


def test_saved_run_configs_load_back_equal(tmp_path):
    """A run's config.json (as the drivers write it) is a --config file that gives back an equal config, so a
    rerun with it resumes (the changed-config check compares them)."""
    from funsim.experiments import backdoor, forgetting, grokking, language, similarity_study, zoo
    from funsim.experiments.io import check_run_config, to_jsonable

    for module, cls in [(grokking, grokking.GrokkingConfig), (forgetting, forgetting.ForgettingConfig),
                        (backdoor, backdoor.BackdoorConfig), (language, language.LanguageConfig),
                        (similarity_study, similarity_study.StudyConfig), (zoo, zoo.ZooConfig)]:
        for name, cfg in module.CONFIGS.items():
            out = tmp_path / cls.__name__ / name
            assert check_run_config(out, cfg) is True
            again = C.load_config(cls, module.CONFIGS, str(out / "config.json"))
            # equal, but for lists inside the untyped option objects of a zoo's models (tuples in the code)
            assert again == cfg or (cls is zoo.ZooConfig and to_jsonable(again) == to_jsonable(cfg)), name
            assert check_run_config(out, again) is False  # the saved run resumes
            changed = C.load_config(cls, module.CONFIGS, str(out / "config.json"), ["seed=12345"]
                                    if "seed" in {f.name for f in dataclasses.fields(cls)} else ["n_checkpoints=99"])
            with pytest.raises(ValueError, match="Refusing to resume"):
                check_run_config(out, changed)
