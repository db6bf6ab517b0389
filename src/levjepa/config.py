"""Typed, frozen configs and the one way to change them from the command line.

Every component of levjepa takes a frozen dataclass of its own (``EncoderConfig``, ``DataConfig``,
``ObjectiveConfig``, ...). This module holds the machinery they share:

* ``apply_overrides(cfg, ["model.depth=6", "data.num_local=10"])`` returns a new config with dotted
  ``key=value`` overrides applied. Values are parsed by the field's annotation (bool, int, float, str,
  ``Literal`` choices, ``X | None`` and ``tuple[X, ...]`` written ``a,b,c``); an unknown key or a value
  that does not parse raises ``ConfigError`` naming the key and listing the valid choices.
* ``to_dict`` / ``from_dict`` round-trip a config through plain JSON types (the resolved config that every
  run directory stores). ``from_dict`` is strict: unknown keys raise, missing keys take their defaults.
* ``read_config_file(path)`` reads a config file (JSON; TOML; YAML when PyYAML is installed) and
  ``merge_config(cfg, data)`` lays its keys over a config (a run's ``config.json`` is such a file). A string
  in a file takes the command line's forms (``sources = "a,b"``, ``num_local = "3"``); a float must be
  finite wherever it comes from (``inf`` / ``nan`` are refused where they are read).
* ``config_reference(cls)`` lists every key of a config with its type, default and the comment beside its
  field (``levjepa pretrain --help-config``).

Range checks live in each config's ``__post_init__`` so a bad value fails where it is built, whether it
came from a preset, a JSON file or the command line.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

T = TypeVar("T")

__all__ = [
    "OMIT_DEFAULT",
    "MAX_SEED",
    "ConfigError",
    "apply_overrides",
    "check",
    "check_range",
    "field_names",
    "flatten",
    "from_dict",
    "merge_config",
    "read_config_file",
    "to_dict",
]


MAX_SEED = 2**63 - 1  # seeds are non-negative 64-bit integers (torch.manual_seed's range)


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what would be valid."""


def check(condition: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``condition`` holds (used by ``__post_init__`` checks)."""
    if not condition:
        raise ConfigError(message)


def check_range(name: str, value: float, low: float, high: float, unit: str = "") -> None:
    """Raise ``ConfigError`` unless ``low <= value <= high`` (bounded inputs: sizes and counts a typo could make
    enormous), naming the option and the accepted range."""
    if not low <= value <= high:
        raise ConfigError(f"{name} {value}: expected {low}..{high}{' ' + unit if unit else ''}")


def field_names(cfg_or_cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cfg_or_cls)]


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _parse_scalar(text: str, tp: Any, key: str) -> Any:
    optional, inner = _is_optional(tp)
    if optional:
        if text.strip().lower() in ("none", "null", ""):
            return None
        return _parse_scalar(text, inner, key)
    origin = get_origin(inner)
    if origin is Literal:
        choices = get_args(inner)
        for choice in choices:
            if str(choice) == text.strip():
                return choice
        raise ConfigError(f"{key}={text!r}: valid choices are {', '.join(map(str, choices))}")
    if origin is tuple:
        args = get_args(inner)
        parts = [p for p in text.split(",") if p.strip() != ""]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_parse_scalar(p, args[0], key) for p in parts)
        if len(parts) != len(args):
            raise ConfigError(f"{key}={text!r}: expected {len(args)} comma-separated values")
        return tuple(_parse_scalar(p, a, key) for p, a in zip(parts, args, strict=True))
    if inner is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}={text!r}: expected a boolean (true/false)")
    if inner in (int, float, str):
        try:
            value = inner(text.strip()) if inner is not str else text
        except ValueError:
            raise ConfigError(f"{key}={text!r}: expected {inner.__name__}") from None
        return _finite(value, key)
    raise ConfigError(f"{key}: cannot parse a value of type {inner} from the command line")


def _parse_path(cfg: Any, path: list[str], text: str, full_key: str) -> tuple[list[str], Any]:
    """Validate ``path`` against the config tree and parse ``text`` by the field's annotation."""
    node = cfg
    for depth, name in enumerate(path):
        if not dataclasses.is_dataclass(node):
            raise ConfigError(f"{full_key}: {'.'.join(path[:depth])} is not a config section")
        names = field_names(node)
        if name not in names:
            raise ConfigError(f"unknown config key {full_key!r}: valid keys here are {', '.join(sorted(names))}")
        if depth == len(path) - 1:
            current = getattr(node, name)
            if dataclasses.is_dataclass(current):
                subkeys = ", ".join(f"{full_key}.{n}" for n in field_names(current))
                raise ConfigError(f"{full_key} is a section; set one of its keys: {subkeys}")
            return path, _parse_scalar(text, typing.get_type_hints(type(node))[name], full_key)
        node = getattr(node, name)
    raise ConfigError(f"empty config key in {full_key!r}")


def _apply_tree(cfg: Any, tree: dict[str, Any]) -> Any:
    changes = {k: _apply_tree(getattr(cfg, k), v) if isinstance(v, dict) else v for k, v in tree.items()}
    return dataclasses.replace(cfg, **changes)


def apply_overrides(cfg: T, overrides: Sequence[str]) -> T:
    """Return ``cfg`` with each ``dotted.key=value`` in ``overrides`` applied, validated.

    All overrides of one section are applied together, so fields that must agree (``model.dim`` and
    ``model.heads``) can be changed in any order; a later override of the same key wins.
    """
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        path, value = _parse_path(cfg, key.split("."), text, key)
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value
    return _apply_tree(cfg, tree) if tree else cfg


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict (``to_dict``'s output) as dotted keys: ``{"model": {"dim": 8}}`` -> ``{"model.dim": 8}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


OMIT_DEFAULT = "omit_default"  # field metadata: to_dict leaves the field out while it holds its default


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-JSON view of a (nested) config; tuples become lists. A field added later whose metadata says
    :data:`OMIT_DEFAULT` is left out while it holds its default, so a config that does not use it is written
    as before the field existed (and older levjepa versions read it); ``from_dict`` gives it its default back."""

    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {
                f.name: conv(getattr(v, f.name))
                for f in dataclasses.fields(v)
                if not (f.metadata.get(OMIT_DEFAULT) and getattr(v, f.name) == f.default)
            }
        if isinstance(v, tuple | list):
            return [conv(x) for x in v]
        return v

    return conv(cfg)


def _finite(value: Any, key: str) -> Any:
    """A float must be finite: ``inf`` / ``nan`` in a config is refused where it is read, not steps later."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value}: must be a finite number")
    return value


def _scalar_text(inner: Any) -> bool:
    """Whether a string in a config file is parsed as the command line parses it for a field of type
    ``inner`` (a tuple, bool, int or float: ``sources = "vids"`` as ``data.sources=vids``)."""
    return get_origin(inner) is tuple or inner in (bool, int, float)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    optional, inner = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: null is not allowed")
    if isinstance(value, str) and _scalar_text(inner):
        return _parse_scalar(value, tp, key)
    if dataclasses.is_dataclass(inner) and isinstance(inner, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a section (mapping), got {type(value).__name__}")
        return from_dict(inner, value, prefix=f"{key}.")
    origin = get_origin(inner)
    if origin is tuple:
        args = get_args(inner)
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], key) for v in value)
        return tuple(_coerce(v, a, key) for v, a in zip(value, args, strict=True))
    if origin is Literal:
        if value not in get_args(inner):
            choices = ", ".join(map(str, get_args(inner)))
            raise ConfigError(f"{key}={value!r}: valid choices are {choices}")
        return value
    if inner is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if inner in (int, float, str, bool) and not isinstance(value, inner):
        raise ConfigError(f"{key}={value!r}: expected {inner.__name__}")
    return _finite(value, key)


def from_dict(cls: type[T], data: dict[str, Any], *, prefix: str = "") -> T:
    """Build ``cls`` from a plain mapping (e.g. a run's ``config.json``); unknown keys raise."""
    names = field_names(cls)
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + u for u in unknown)}: "
            f"valid keys are {', '.join(prefix + n for n in names)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    return cls(**kwargs)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a config file: ``.json``; ``.toml`` (Python's ``tomllib``, or ``tomli`` on 3.10); ``.yaml`` /
    ``.yml`` (needs PyYAML). :class:`ConfigError` names the file when it is missing, unreadable or not a mapping."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path}: cannot be read ({err})") from None
    try:
        if suffix in (".yaml", ".yml"):
            data = _parser(path, "yaml", "PyYAML (pip install pyyaml), or use JSON").safe_load(text)
        elif suffix == ".toml":
            try:
                toml = importlib.import_module("tomllib")
            except ImportError:  # Python 3.10
                toml = _parser(path, "tomli", "tomli on Python 3.10 (pip install tomli), or use JSON")
            data = toml.loads(text)
        else:
            data = json.loads(text)
    except ConfigError:
        raise
    except Exception as err:  # each parser has its own error type; all mean "not valid <format>"
        raise ConfigError(f"config file {path}: not valid {suffix.lstrip('.') or 'JSON'} ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def _parser(path: Path, module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"config file {path}: reading it needs {what}") from None


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        both_dicts = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both_dicts else value
    return out


def merge_config(cfg: T, data: dict[str, Any]) -> T:
    """``cfg`` with the keys of ``data`` (nested sections, as in ``config.json``) laid over it, validated like
    :func:`from_dict`: a partial file changes only what it names."""
    return from_dict(type(cfg), _merge(to_dict(cfg), data))


_FIELD = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s*(.*))?$")


def _field_comments(cls: type) -> dict[str, str]:
    """The comment of each field of ``cls`` in its source: the one on the field's line, else the comment lines
    just above it."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    above: list[str] = []
    names = set(field_names(cls))
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        match = _FIELD.match(line)
        if match and match.group(1) in names and match.group(1) not in comments:
            comments[match.group(1)] = match.group(2) or " ".join(above)
        above = []
    return comments


def _type_name(tp: Any) -> str:
    text = str(tp).replace("typing.", "")
    return tp.__name__ if isinstance(tp, type) else text


def config_reference(cls: type, prefix: str = "") -> str:
    """Every key of config class ``cls`` (sections recursively), one per line: ``section.key  type  default
    — comment``, the comment taken from the field's source. Generated, so it cannot fall behind the code."""
    rows: list[str] = []
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            rows.append(config_reference(type(value), f"{prefix}{f.name}."))
            continue
        default = json.dumps(to_dict(value)) if not isinstance(value, str) else value
        note = comments.get(f.name, "")
        rows.append(f"{prefix}{f.name} = {default}    [{_type_name(hints[f.name])}]" + (f"  {note}" if note else ""))
    return "\n".join(rows)
