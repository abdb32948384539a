"""The drivers' one config path: a named config or a JSON file, then ``--set key=value`` overrides.

Every experiment subcommand of ``funsim`` reads its config the same way
(:func:`add_arguments`, then :func:`from_args` in its ``main``):

* ``--config NAME`` picks one of the driver's named configs (``smoke``, ``default``,
  ``paper``, ...); ``--config FILE.json`` reads a JSON object of the config's fields
  (:func:`load_config`). Fields a file leaves out keep their defaults, or the values of
  the named config it names as ``"base"``. A run's saved ``config.json`` loads back into
  an equal config, so it can be rerun or resumed.
* ``--set key=value`` (repeatable) then replaces one field (:func:`apply_overrides`). The
  text is read as the field's annotation asks (:func:`parse_value`): integers, numbers,
  ``true``/``false``, strings as written, ``null`` (or ``none``) where None is allowed,
  lists as ``1,2,3`` or JSON ``[1, 2, 3]``, objects as JSON; a dotted key (``train.steps=100``)
  reaches into a field that is itself an object.
* Every value is then checked against the annotations (:func:`coerce_fields`), and the
  config class's own checks run (its ``__post_init__``; :class:`RuledConfig` checks the
  verdict rules). A mistake is a :class:`ConfigError` naming the file or the ``--set``
  option, the field and what it must be; an unknown field names the nearest valid one. The
  ``funsim`` command prints it as one line (exit status 2).
* ``--print-config`` prints the resulting config as JSON and runs nothing; saved to a
  file, that JSON is a valid ``--config``.

This module imports no JAX, so that ``funsim COMMAND --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import pathlib
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from funsim.experiments import verdict as verdict_lib

__all__ = ["ConfigError", "RuledConfig", "coerce_fields", "load_config", "from_dict", "parse_value",
           "apply_overrides", "run_name", "add_arguments", "from_args", "config_json"]


# ----------------------------------------------------------------------------- checking values by annotation


class ConfigError(ValueError):
    """A config that cannot be used: broken JSON, an unknown field or a value of the wrong type.

    The message names the file (when there is one) and the field. The ``funsim``
    command prints it without a traceback (exit status 2).
    """


def _type_name(tp: Any) -> str:
    """How a JSON value of annotation ``tp`` is described in an error message."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is dict or origin is dict:
        return "an object ({...})"
    if tp is tuple or tp is list:
        return "a list"
    if origin in (tuple, list):
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            plural = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(args[0])
            return f"a list of {plural}" if plural else f"a list, each {_type_name(args[0])}"
        return f"a list of {len(args)}: " + ", ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if dataclasses.is_dataclass(tp):
        return f"an object with {tp.__name__} fields"
    return getattr(tp, "__name__", str(tp))


def _show(value: Any) -> str:
    """A value as the user wrote it in JSON, with its kind."""
    kind = {str: "the string", bool: "the boolean", int: "the integer", float: "the number", list: "the list",
            tuple: "the list", dict: "the object", type(None): "null"}.get(type(value), type(value).__name__)
    if value is None:
        return "null"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return f"{kind} {text[:80]}"


def _deep_tuple(v: Any) -> Any:
    return tuple(_deep_tuple(u) for u in v) if isinstance(v, (list, tuple)) else v


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` (from JSON) as annotation ``tp`` wants it (lists become tuples), or a :class:`ConfigError`.

    ``where`` is the field's path in the config, e.g. ``seeds[0]`` or ``datasets[1].n_train``.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)

    def bad():
        return ConfigError(f"field '{where}' must be {_type_name(tp)}, got {_show(value)}.")

    if tp is Any or tp is object or isinstance(tp, (str, typing.ForwardRef)):
        return _deep_tuple(value)  # not checkable: lists become tuples, as before
    if tp is type(None):
        if value is None:
            return None
        raise bad()
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise bad()
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError:
                continue
        raise bad()
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value in ("inf", "-inf"):  # how to_jsonable writes infinities
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise bad()
        if len(args) == 2:
            return {_coerce(k, args[0], f"{where} (a key)"): _coerce(v, args[1], f"{where}[{k!r}]")
                    for k, v in value.items()}
        return dict(value)
    if tp in (tuple, list) or origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise bad()
        container = list if (tp is list or origin is list) else tuple
        if not args:
            return container(_deep_tuple(v) for v in value)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return container(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise bad()
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is typing.Literal:
        if value in args:
            return value
        raise bad()
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise bad()
        return tp(**coerce_fields(tp, value, path=where))
    return value  # an annotation this checker does not know: taken as given


def _field_types(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # annotations that do not resolve (e.g. a class defined in a function): unchecked
        return {f.name: f.type for f in dataclasses.fields(cls)}


def coerce_fields(cls: type, d: Mapping[str, Any], *, path: str = "") -> dict[str, Any]:
    """The fields ``d`` (from JSON) of the dataclass ``cls``, checked against its annotations.

    Lists become tuples where the annotation is a tuple; nested dataclasses are
    built from objects; an integer is accepted where a number is expected.

    Args:
      cls: a dataclass.
      d: field values (a subset of the fields).
      path: where ``d`` sits in a larger config, for messages (e.g. ``"datasets[0]"``).

    Raises:
      ConfigError: an unknown field (naming the valid ones) or a value of the
        wrong type (naming the field, what it must be and what it is).

    Examples:
      >>> @dataclasses.dataclass
      ... class C:
      ...     seeds: tuple[int, ...] = (0,)
      ...     rate: float = 0.1
      >>> coerce_fields(C, {"seeds": [1, 2], "rate": 1})
      {'seeds': (1, 2), 'rate': 1}
      >>> coerce_fields(C, {"seeds": "12"})
      Traceback (most recent call last):
        ...
      funsim.experiments.config.ConfigError: field 'seeds' must be a list of integers, got the string "12".
      >>> coerce_fields(C, {"seeds": [1.7]})
      Traceback (most recent call last):
        ...
      funsim.experiments.config.ConfigError: field 'seeds[0]' must be an integer, got the number 1.7.
    """
    where = f" in '{path}'" if path else ""
    if not isinstance(d, Mapping):
        raise ConfigError(f"a {cls.__name__} config{where} must be a JSON object ({{\"field\": value, ...}}), "
                          f"got {_show(d)}.")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} fields {unknown}{where}{_did_you_mean(unknown, fields)}; "
                          f"valid fields: {sorted(fields)}.")
    types_ = _field_types(cls)
    out = {k: _coerce(v, types_.get(k, Any), f"{path}.{k}" if path else k) for k, v in d.items()}
    for k, v in out.items():
        _check_value(k, v, f"{path}.{k}" if path else k)
    return out


#: Fields (by the end of their name) whose numbers must be finite and > 0, and why.
POSITIVE_FIELDS = {"learning_rate": "a learning rate is a step size: 0 does not train, and a negative one "
                                    "climbs the loss instead of descending it (e.g. 1e-3)"}


def _check_value(name: str, value: Any, where: str) -> None:
    """The value rules a type cannot say (:data:`POSITIVE_FIELDS`), as a ``ConfigError`` naming the field;
    inside a free-form object (e.g. a zoo's ``train`` overrides) too."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_value(str(k), v, f"{where}.{k}")
        return
    for suffix, why in POSITIVE_FIELDS.items():
        if name.endswith(suffix) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not 0 < value < float("inf"):
            raise ConfigError(f"field '{where}' must be a finite number > 0, got {value!r}: {why}.")


def _read_config_file(path: pathlib.Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config file ({e}).") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}.") from None


def _in_file(path: pathlib.Path, e: Exception) -> ConfigError:
    msg = str(e)
    return ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}")



def _nearest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to ``name`` (difflib), or None when none is close."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return close[0] if close else None


def _did_you_mean(names: Sequence[str], valid: Iterable[str]) -> str:
    """`` (did you mean 'steps'?)`` for the unknown ``names`` that have a near valid name, else ``""``."""
    valid = list(valid)
    hints = [(n, _nearest(n, valid)) for n in names]
    hints = [(n, m) for n, m in hints if m is not None]
    if not hints:
        return ""
    if len(names) == 1:
        return f" (did you mean '{hints[0][1]}'?)"
    return " (did you mean " + ", ".join(f"'{m}' for '{n}'" for n, m in hints) + "?)"


# ----------------------------------------------------------------------------- the base class


class RuledConfig:
    """Base class of the configs whose claims are labelled by verdict rules (:mod:`experiments.verdict`).

    A subclass is a frozen dataclass with a field ``verdict_rules`` (rules, or their JSON
    dicts as read back from ``config.json``) and names the statistics its driver computes
    as a class keyword, ``class GrokkingConfig(RuledConfig, statistics=STATISTICS)``. On
    construction the rules become :class:`~experiments.verdict.Rule` objects, and a rule
    that names a statistic the driver does not compute (or two rules on one claim) is
    refused. A subclass with its own ``__post_init__`` calls ``super().__post_init__()``.

    Examples:
      >>> from funsim.experiments.verdict import Rule
      >>> @dataclasses.dataclass(frozen=True)
      ... class C(RuledConfig, statistics=("x",)):
      ...     verdict_rules: tuple = ({"claim": "c", "statistic": "x", "direction": ">", "threshold": 0},)
      >>> C().verdict_rules[0].text()
      'x > 0 -> reproduced, else not reproduced'
      >>> C(verdict_rules=(Rule("c", "y", ">", 0),))
      Traceback (most recent call last):
        ...
      ValueError: C: the verdict rule 'c' names the statistic 'y', which this driver does not compute; known statistics: x.
    """

    STATISTICS: typing.ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, /, statistics: Iterable[str] = (), **kwargs):
        super().__init_subclass__(**kwargs)
        cls.STATISTICS = frozenset(statistics) or cls.STATISTICS

    def __post_init__(self):
        object.__setattr__(self, "verdict_rules", verdict_lib.coerce_rules(self.verdict_rules))
        verdict_lib.check_rules(self.verdict_rules, self.STATISTICS, owner=type(self).__name__)


# ----------------------------------------------------------------------------- loading


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _unknown_name(what: str, name: str, valid: Sequence[str]) -> str:
    """The message for a name that is not one of ``valid``: the nearest one, or all of them."""
    near = _nearest(name, valid)
    if near is not None:
        return f"{what} {name!r}; did you mean {near!r}?"
    return f"{what} {name!r}; valid: {', '.join(valid)}."


def _build(cls: type, fields: Mapping[str, Any], base: Any = None):
    """``cls(**fields)``, or ``base`` with ``fields`` replaced; the class's own checks become :class:`ConfigError`."""
    try:
        return cls(**fields) if base is None else dataclasses.replace(base, **fields)
    except ConfigError:
        raise
    except TypeError as e:
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in fields
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if base is None and missing:
            raise ConfigError(f"a {cls.__name__} config needs the fields {missing} (or a \"base\" config to start "
                              "from).") from None
        raise ConfigError(str(e)) from None
    except ValueError as e:
        raise ConfigError(str(e)) from None


def from_dict(cls: type, configs: Mapping[str, Any], d: Any):
    """A config of the dataclass ``cls`` from its JSON form: its fields, or ``{"base": name, **fields}``.

    Fields left out keep the class's defaults, or with ``"base"`` the values of the named
    config in ``configs``. Lists become tuples where the annotation is a tuple.

    Raises:
      ConfigError: not an object; an unknown field (naming the nearest valid one); a value of
        the wrong type; an unknown base; a required field missing; a value the class refuses.

    Examples:
      >>> @dataclasses.dataclass(frozen=True)
      ... class C:
      ...     steps: int = 10
      ...     seeds: tuple[int, ...] = (0,)
      >>> from_dict(C, {"short": C(steps=2)}, {"base": "short", "seeds": [1, 2]})
      C(steps=2, seeds=(1, 2))
      >>> from_dict(C, {}, {"stepz": 3})
      Traceback (most recent call last):
        ...
      funsim.experiments.config.ConfigError: unknown C fields ['stepz'] (did you mean 'steps'?); valid fields: ['seeds', 'steps'].
    """
    if not isinstance(d, Mapping):
        raise ConfigError(f"a {cls.__name__} config must be a JSON object ({{\"field\": value, ...}}), got {_show(d)}.")
    d = dict(d)
    base = d.pop("base", None) if "base" not in _fields(cls) else None
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"field 'base' must be a string (a config name), got {_show(base)}.")
        if base not in configs:
            raise ConfigError(_unknown_name("unknown base config", base, list(configs)))
    return _build(cls, coerce_fields(cls, d), None if base is None else configs[base])


def load_config(cls: type, configs: Mapping[str, Any], name_or_path: str, overrides: Sequence[str] = ()):
    """A driver's config: a name in ``configs`` or a JSON file (:func:`from_dict`), then ``overrides``.

    A file that gives no ``"name"`` to a config class with a ``name`` field is named after
    the file's stem.

    Args:
      cls: the config dataclass.
      configs: the driver's named configs.
      name_or_path: a name in ``configs`` or the path of a JSON file.
      overrides: ``"key=value"`` strings, applied in order (:func:`apply_overrides`).

    Raises:
      ConfigError: neither a known name (the nearest is named) nor a file; broken JSON; any
        mistake :func:`from_dict` or :func:`apply_overrides` reports. The message names the
        file or the ``--set`` option.
    """
    if name_or_path in configs:
        cfg = configs[name_or_path]
    else:
        path = pathlib.Path(name_or_path)
        if not path.is_file():
            near = _nearest(name_or_path, configs)
            raise ConfigError(f"--config {name_or_path!r} is neither one of {', '.join(configs)} nor a JSON file"
                              + (f"; did you mean {near!r}?" if near else "."))
        raw = _read_config_file(path)
        if isinstance(raw, dict) and "name" in _fields(cls):
            raw.setdefault("name", path.stem)
        try:
            cfg = from_dict(cls, configs, raw)
        except ConfigError as e:
            raise _in_file(path, e) from None
    return apply_overrides(cfg, overrides)


# ----------------------------------------------------------------------------- --set overrides


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """``(annotation without None, whether None is allowed)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        rest = args[0] if len(args) == 1 else typing.Union[tuple(args)]
        return rest, len(args) < len(typing.get_args(tp))
    return tp, tp is type(None)


def _is_text(tp: Any) -> bool:
    """Whether a value of annotation ``tp`` is taken as written (a string, or a choice of strings)."""
    if tp is str:
        return True
    if typing.get_origin(tp) is typing.Literal:
        return all(isinstance(a, str) for a in typing.get_args(tp))
    return False


def _item_type(tp: Any) -> Any | None:
    """The item annotation of a homogeneous list or tuple annotation, else None."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and args:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def parse_value(text: str, tp: Any) -> Any:
    """A ``--set`` value as JSON would give it for a field of annotation ``tp`` (checked later by its type).

    Strings (and choices of strings) are taken as written; ``null`` or ``none`` is None where
    the annotation allows it; ``true``/``false`` in any case are booleans; a list of items is
    ``a,b,c`` (each item read as its annotation asks; an empty text is the empty list) or
    JSON ``[...]``; numbers and objects are JSON. Text that is none of these is returned
    as it is, so that the type check names the field, what it must be and what it got.

    Examples:
      >>> parse_value("2000", int), parse_value("1e-3", float), parse_value("True", bool)
      (2000, 0.001, True)
      >>> parse_value("0,1,2", tuple[int, ...]), parse_value("cka/linear", tuple[str, ...])
      ([0, 1, 2], ['cka/linear'])
      >>> parse_value("none", int | None), parse_value("12", str), parse_value("two", int)
      (None, '12', 'two')
    """
    inner, nullable = _strip_none(tp)
    if nullable and text.strip().lower() in ("null", "none"):
        return None
    if _is_text(inner):
        return text
    if inner is bool and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    item = _item_type(inner)
    if item is not None and not text.lstrip().startswith("["):
        return [] if not text.strip() else [parse_value(part.strip(), item) for part in text.split(",")]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _split_override(override: str) -> tuple[str, str]:
    key, sep, value = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {override!r}: write one field as key=value, e.g. --set steps=2000.")
    return key.strip(), value


def _override_field(cfg: Any, path: list[str], text: str, override: str) -> Any:
    """``cfg`` (a dataclass instance) with the field at ``path`` set from ``text``."""
    cls = type(cfg)
    names = _fields(cls)
    key = path[0]
    if key not in names:
        raise ConfigError(f"--set {override}: {_unknown_name(f'{cls.__name__} has no field', key, names)}")
    tp = _field_types(cls).get(key, Any)
    where = ".".join(path)
    current = getattr(cfg, key)
    if len(path) == 1:
        value = _coerce(parse_value(text, tp), tp, where)
    elif dataclasses.is_dataclass(current) and not isinstance(current, type):
        value = _override_field(current, path[1:], text, override)
    elif isinstance(current, Mapping):
        if len(path) > 2:
            raise ConfigError(f"--set {override}: '{path[0]}.{path[1]}' is not an object with fields; "
                              f"set it whole as JSON, e.g. --set {path[0]}.{path[1]}='{{...}}'.")
        item_tp = typing.get_args(tp)[1] if len(typing.get_args(tp)) == 2 else Any
        value = {**current, path[1]: _coerce(parse_value(text, item_tp), item_tp, where)}
    else:
        raise ConfigError(f"--set {override}: field '{key}' of {cls.__name__} has no fields of its own "
                          f"(it is {_type_name(tp)}); set it as --set {key}=VALUE.")
    return _build(cls, {key: value}, cfg)


def apply_overrides(cfg: Any, overrides: Sequence[str]) -> Any:
    """``cfg`` with each ``"key=value"`` of ``overrides`` applied in order (the last of a key wins).

    The value is read by :func:`parse_value` and checked against the field's annotation; a
    dotted key reaches into a field that is a dataclass or an object (``train.steps=100``).
    The config class's own checks run on the result.

    Raises:
      ConfigError: naming the ``--set`` option and the field: an unknown field (with the
        nearest valid one), a value of the wrong type (with the type it must be), or a value
        the config class refuses.

    Examples:
      >>> @dataclasses.dataclass(frozen=True)
      ... class C:
      ...     steps: int = 10
      ...     rate: float = 0.1
      ...     seeds: tuple[int, ...] = (0,)
      >>> apply_overrides(C(), ["steps=2000", "seeds=1,2"])
      C(steps=2000, rate=0.1, seeds=(1, 2))
      >>> apply_overrides(C(), ["stepz=2000"])
      Traceback (most recent call last):
        ...
      funsim.experiments.config.ConfigError: --set stepz=2000: C has no field 'stepz'; did you mean 'steps'?
      >>> apply_overrides(C(), ["rate=fast"])
      Traceback (most recent call last):
        ...
      funsim.experiments.config.ConfigError: --set rate=fast: field 'rate' must be a number, got the string "fast".
    """
    for override in overrides:
        key, text = _split_override(override)
        try:
            cfg = _override_field(cfg, key.split("."), text, override)
        except ConfigError as e:
            msg = str(e)
            raise ConfigError(msg if msg.startswith("--set ") else f"--set {override}: {msg}") from None
    return cfg


def run_name(name: str, overrides: Sequence[str]) -> str:
    """The default run name of a config called ``name`` after ``overrides``: a rerun of the same command resumes.

    ``name`` itself without overrides; otherwise ``name`` and the overrides in a form safe
    for a folder name (a short digest of them when that would be long). An override of
    ``name`` is left out: it already names the config.

    Examples:
      >>> run_name("default", []), run_name("default", ["steps=2000", "seeds=0,1"])
      ('default', 'default+steps=2000+seeds=0,1')
    """
    parts = [o.strip() for o in overrides if _split_override(o)[0] != "name"]
    if not parts:
        return name
    suffix = "+".join(re.sub(r"[^A-Za-z0-9._,=-]", "_", p) for p in parts)
    if len(suffix) > 60:
        suffix = "set-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
    return f"{name}+{suffix}"


# ----------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser, cls: type, configs: Mapping[str, Any], *,
                  config: bool = True, run_options: bool = False, authors: bool = False) -> None:
    """Add ``--config`` (unless ``config=False``), ``--set`` and ``--print-config`` to a subcommand's parser.

    With ``run_options``, also the options of a driver that writes a run folder: ``--run`` (default: the
    name :func:`from_args` returns, so that rerunning the command resumes), ``--root`` and ``--no-progress``;
    with ``authors``, ``--authors-data CLONE`` (the tensor-similarity authors' data, ``models.authors``).
    """
    if authors:
        parser.add_argument("--authors-data", metavar="CLONE", help="a clone of tdooms/tensor-similarity to calibrate "
                            "the rules on (default: $FUNSIM_TENSOR_AUTHORS; unset: statistics recorded from it)")
    if config:
        parser.add_argument("--config", default="default", metavar="NAME|FILE.json",
                            help=f"{' | '.join(configs)}, or a JSON file of {cls.__name__} fields, optionally with "
                                 "\"base\": NAME (default: default)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help=f"override one {cls.__name__} field, checked against its type (repeatable), e.g. "
                             "--set seed=1; lists as 1,2,3; a dotted key reaches into an object field")
    parser.add_argument("--print-config", action="store_true",
                        help="print the config (after --set) as JSON and exit; the JSON is a valid --config file")
    if run_options:
        parser.add_argument("--run", default=None,
                            help="run name (default: the config's name and its --set overrides); rerun it to resume")
        parser.add_argument("--root", default="results", help="results root directory (default: results)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")


def from_args(args: argparse.Namespace, cls: type, configs: Mapping[str, Any]) -> tuple[Any, str]:
    """``(config, default run name)`` from the options :func:`add_arguments` added.

    The run name is the config's ``name`` field if it has one, else the named config's name
    or the JSON file's stem, followed by the ``--set`` overrides (:func:`run_name`).
    """
    cfg = load_config(cls, configs, args.config, args.overrides)
    name = getattr(cfg, "name", None) if "name" in _fields(cls) else None
    if name is None:
        name = args.config if args.config in configs else pathlib.Path(args.config).stem
    return cfg, run_name(name, args.overrides)


def config_json(cfg: Any) -> str:
    """A config as the JSON that :func:`load_config` reads back into an equal config (``--print-config``)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Mapping):
            return {str(k): plain(u) for k, u in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(u) for u in v]
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return v

    return json.dumps(plain(cfg), indent=2)
