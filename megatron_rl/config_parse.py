"""Typed reading of config values (the machinery of ``config.py``): a command-line override's raw text,
field annotations, strict scalar typing with errors naming the key, building a section dataclass and
setting dotted keys; reading a config file's YAML (a key given twice refused). Imports nothing of the project (``config.py`` stays the leaf above it)."""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml


class Override(str):
    """A command-line override's raw text (``a.b=TEXT``): parsed as a YAML scalar for its field."""


def field_type(typ) -> tuple[Any, bool]:
    """(base type, accepts None) of a field annotation such as ``int``, ``str | None``."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), type(None) in args
    return typing.get_origin(typ) or typ, False


def typed(key: str, value: Any, typ) -> Any:
    """``value`` checked against the field type; ``ValueError`` naming ``key`` otherwise.

    Strict: an int field takes integers only (not ``3.7``, not ``true``), a bool field only
    true/false, a float field numbers (not booleans), a str field text (numbers are kept as their
    text); ``null`` only where the field is optional. Overrides are parsed as YAML scalars first.
    """
    base, optional = field_type(typ)
    if isinstance(value, Override):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = str(value)
        if base is str and not isinstance(parsed, str) and not (parsed is None and optional):
            parsed = str(value)          # a text field keeps the text as typed (``data.val=`` is "")
        value = parsed
    if value is None:
        if optional or base is Any:
            return None
        raise ValueError(f"{key}: must be set (null given)")
    kind = type(value).__name__
    if base is bool and not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r} ({kind})")
    if base is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key}: expected an integer, got {value!r} ({kind})")
    if base is float:
        if isinstance(value, str):   # PyYAML (YAML 1.1) reads 1e-3 (no dot) as text
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}: expected a number, got {value!r} ({kind})")
        return float(value)
    if base is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r} ({kind})")
    if base is dict and not isinstance(value, dict):
        raise ValueError(f"{key}: expected a mapping, got {value!r} ({kind})")
    if base is dict:   # entries set one by one (``reward.by_source.SRC=NAME``) are overrides' raw text
        value = {k: typed(f"{key}.{k}", v, Any) if isinstance(v, Override) else v for k, v in value.items()}
    return value


def section_mapping(data: Any) -> Any:
    """A section given whole on the command line (``algo.correction={upper: 3}``) as the mapping its YAML
    flow text reads as; anything else unchanged."""
    if isinstance(data, Override):
        try:
            parsed = yaml.safe_load(data)
        except yaml.YAMLError:
            return data
        return parsed if isinstance(parsed, dict) else data
    return data


def build(cls, data: dict, where: str):
    data = section_mapping(data)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of keys (a section), got {str(data)!r}")  # noqa: TRY004 (user error: one CLI line)
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {sorted(names)}")
    hints = typing.get_type_hints(cls)
    kw = {k: _sub_section(hints[k], v, f"{where}.{k}") if dataclasses.is_dataclass(hints[k])
          else typed(f"{where}.{k}", v, hints[k]) for k, v in data.items()}
    try:
        return cls(**kw)
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None
    except ValueError as e:   # a section's own rule: named by its section when its words do not name it
        raise (e if where in str(e) else ValueError(f"{where}: {e}")) from None


def _sub_section(cls, data: Any, where: str):
    """A sub-section (a field whose type is a dataclass, ``rollout.partial``) from its mapping; an empty one
    (``partial:`` with nothing under it) is its defaults."""
    return build(cls, {} if data is None else data, where)


def set_dotted(tree: dict, key: str, value: str) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {key}: {p} is not a section")  # noqa: TRY004
    node[parts[-1]] = value


def _unique_key_loader():
    class UniqueKeyLoader(yaml.SafeLoader):
        """``yaml.SafeLoader`` that refuses a mapping key given twice (PyYAML keeps the last one
        silently: a section written twice lost every key of the first)."""

        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for k_node, _ in node.value:
                k = self.construct_object(k_node, deep=deep)
                if isinstance(k, (str, int, float, bool)) and k in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {k!r} appears twice in one mapping (first at line {seen[k] + 1}); "
                        "merge the two", k_node.start_mark)
                seen.setdefault(k, k_node.start_mark.line)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def read_yaml(p: Path) -> dict:
    """The YAML mapping of a config file; a syntax error is one line naming ``file:line:column``."""
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a UTF-8 text file (byte {e.start}); a config is a YAML text file") from None
    try:
        tree = yaml.load(text, Loader=_unique_key_loader())   # noqa: S506 (a SafeLoader refusing a key given twice)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        what = e.problem or e.context or "invalid YAML"
        if e.context and e.context_mark is not None and e.problem:
            what += f" ({e.context} at line {e.context_mark.line + 1})"
        raise ValueError(f"{where}: YAML syntax error: {what}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: YAML error: {str(e).splitlines()[0]}") from None
    if tree is None:   # an empty file (or only comments): refused, not silently the defaults
        raise ValueError(f"{p}: the config file is empty; a config is a mapping of sections (model:, data:, trainer:, "
                         "...): start from examples/configs/tiny_cpu_grpo.yaml or `megatron-rl train --print-config`")
    if not isinstance(tree, dict):
        raise ValueError(f"{p}: a config file is a mapping of sections (model:, trainer:, ...), got a "  # noqa: TRY004
                         f"{type(tree).__name__}")
    return tree


#: which log-prob the engines report for a sampled token (``rollout.logprobs``; ``rollout/hf_sampler.py``)
LOGPROB_MODES = ("processed", "full")


def check_truncation(top_p: float, top_k: int, min_p: float, where: str = "") -> None:
    """Raise ``ValueError`` for out-of-range settings (vLLM's own limits: 0 < top_p <= 1,
    top_k = -1/0 (off) or >= 1, 0 <= min_p <= 1); the config's and the engines' check."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{where}top_p must be in (0, 1], got {top_p}")
    if top_k < -1:
        raise ValueError(f"{where}top_k must be -1 (off) or >= 1, got {top_k}")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"{where}min_p must be in [0, 1], got {min_p}")
