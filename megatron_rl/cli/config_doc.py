"""``megatron-rl train --print-config [--algo KIND]``: every config key, its default and its description.

The descriptions are the ones in the code, read from the source of the dataclasses: the string under a
field (``config_sections.py``, ``config.py``) or its ``#:`` comment (``algorithms/hparams.py``), looked up along the class's
bases so an inherited field keeps its text. The output is YAML with each description as a comment
above its key, so it is both the reference and a loadable starting config (``> my.yaml``). Imports
``config`` and ``algorithms`` only (no ``megatron_rl.trainer``).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import sys
import textwrap
import typing

from megatron_rl.config import AlgoConfig, Config


@functools.cache
def _own_docs(cls) -> dict[str, str]:
    """Field name -> description written in ``cls``'s own body (not its bases)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = src.splitlines()
    body = ast.parse(src).body[0].body
    docs = {}
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[name] = inspect.cleandoc(nxt.value.value)
            continue
        line = lines[node.lineno - 1]
        if "#:" in line:
            docs[name] = line.split("#:", 1)[1].strip()
    return docs


def field_doc(cls, name: str) -> str:
    """The description of field ``name`` of dataclass ``cls`` (its own, else the nearest base's)."""
    for c in cls.__mro__:
        if name in _own_docs(c):
            return _own_docs(c)[name]
    return ""


def field_default(f: dataclasses.Field):
    """A dataclass field's default value (its factory called), None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _scalar(value) -> str:
    """One YAML value (JSON is YAML: strings quoted, null, true/false, lists and maps inline)."""
    return json.dumps(value, default=str, ensure_ascii=False)


def _value(obj, f: dataclasses.Field):
    """``obj``'s value of field ``f`` (dataclasses as mappings), or the default when ``obj`` is None."""
    if obj is None:
        return field_default(f)
    v = getattr(obj, f.name)
    return dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v


def _section(cls, indent: str, skip: tuple = (), values=None) -> list[str]:
    """The annotated YAML lines of dataclass ``cls``'s fields; a sub-section (a field declared as a dataclass,
    ``rollout.partial``) as a nested mapping with its own descriptions."""
    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        doc = field_doc(cls, f.name)
        out += [f"{indent}# {ln}" if ln else f"{indent}#" for ln in doc.splitlines()]
        if dataclasses.is_dataclass(hints.get(f.name)):
            out += [f"{indent}{f.name}:"] + _section(hints[f.name], indent + "  ",
                                                     values=None if values is None else getattr(values, f.name))
            continue
        out.append(f"{indent}{f.name}: {_scalar(_value(values, f))}")
    return out


def render(kind: str | None = None, cfg=None) -> str:
    """The annotated YAML of every key's default; ``kind``: the method whose ``algo.<kind>`` is shown.
    ``cfg`` (a loaded ``Config``: ``--print-config --config X [a.b=c ...]``): its values instead of
    the defaults, same descriptions, its ``algo.kind``."""
    from megatron_rl.algorithms import ALGO_KINDS  # lazy: defers torch to the call

    if cfg is not None:
        if kind and kind != cfg.algo.kind:
            raise ValueError(f"--algo {kind} but the config's algo.kind is {cfg.algo.kind}: drop --algo, or "
                             f"add the override algo.kind={kind}")
        kind = cfg.algo.kind
    kind = kind or AlgoConfig.kind
    if kind not in ALGO_KINDS:
        raise ValueError(f"--algo {kind!r}: unknown method; valid: {sorted(ALGO_KINDS)}")
    hp = ALGO_KINDS[kind].hparams
    flag = f" --algo {kind}" if kind != AlgoConfig.kind else ""
    head = (f"# Every key of a `megatron-rl train` config with its default (megatron-rl train --print-config{flag})."
            if cfg is None else "# Every key of this config with its value (megatron-rl train --print-config --config ...).")
    out = [head,
           f"# Methods (algo.kind): {', '.join(sorted(ALGO_KINDS))}; --print-config --algo KIND shows algo.<KIND>."]
    types = typing.get_type_hints(Config)
    sections = [f for f in dataclasses.fields(Config) if f.name != "plugins"]
    out += [""] + _section(Config, "", skip=tuple(f.name for f in sections), values=cfg)   # plugins: [] (read first)
    for sec in sections:
        cls = types[sec.name]
        vals = None if cfg is None else getattr(cfg, sec.name)
        doc = inspect.cleandoc(cls.__doc__ or "") if sec.name == "teacher" else ""
        out += [""] + [f"# {ln}" for ln in doc.splitlines()] + [f"{sec.name}:"]
        if sec.name != "algo":
            out += _section(cls, "  ", values=vals)
            continue
        out += [f"  # {field_doc(AlgoConfig, 'kind')}", f"  kind: {_scalar(kind)}"]
        out += [f"  # {ln}" for ln in (inspect.cleandoc(hp.__doc__ or "").splitlines())]
        out += [f"  {kind}:"] + _section(hp, "    ", values=None if vals is None else vals.hparams)
        out += _section(AlgoConfig, "  ", skip=("kind", "hparams"), values=vals)
    return "\n".join(out) + "\n"


def print_config(kind: str | None = None, cfg=None) -> None:
    """``train --print-config``: :func:`render` to stdout."""
    sys.stdout.write(render(kind, cfg))
