"""A function's OpenAI / hermes tool schema from its type hints and docstring, and the check of a call's
arguments against such a schema.

The schema is the one the chat templates of Qwen2.5 / Qwen3 (``tools=`` of ``apply_chat_template``) and
vLLM's hermes parser read::

    {"type": "function", "function": {"name": ..., "description": ...,
     "parameters": {"type": "object", "properties": {...}, "required": [...]}}}

Type hints map to JSON-schema types: ``str`` string, ``int`` integer, ``float`` number, ``bool`` boolean,
``list[T]`` / ``tuple[T, ...]`` array of ``T``, ``dict`` object, ``Literal["a", "b"]`` an enum,
``T | None`` / ``Optional[T]`` the type of ``T``. A parameter with a default is optional. The description
is the docstring's text before its ``Args:`` section; a parameter's description is its line (and the
indented lines under it) in ``Args:`` (Google style: ``name: text`` or ``name (type): text``).
"""
from __future__ import annotations

import inspect
import re
import types
import typing

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _json_type(hint, where: str) -> dict:
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in (str, int):
            raise TypeError(f"{where}: Literal values must be all str or all int, got {args!r}")
        return {"type": _SIMPLE[next(iter(kinds))], "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _json_type(rest[0], where)
        raise TypeError(f"{where}: a union other than Optional[T] has no JSON-schema type here: {hint!r}")
    if origin in (list, tuple) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise TypeError(f"{where}: only tuple[T, ...] maps to an array, got {hint!r}")
        return {"type": "array", "items": _json_type(args[0], where)}
    if origin is dict:
        return {"type": "object"}
    raise TypeError(f"{where}: type hint {hint!r} has no JSON-schema type (use str, int, float, bool, list[T], "
                    "dict, Literal[...] or Optional[T])")


_ARGS_HEAD = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_PARAM_LINE = re.compile(r"^(\s*)(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SECTION = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?):\s*$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` of a Google-style docstring (module docstring)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    desc, params, i = [], {}, 0
    while i < len(lines) and not _ARGS_HEAD.match(lines[i]) and not _SECTION.match(lines[i]):
        desc.append(lines[i])
        i += 1
    if i < len(lines) and _ARGS_HEAD.match(lines[i]):
        i += 1
        current, indent = None, None
        while i < len(lines) and not _SECTION.match(lines[i]):
            m = _PARAM_LINE.match(lines[i])
            lead = len(lines[i]) - len(lines[i].lstrip())
            if m and (indent is None or lead <= indent):
                indent, current = lead, m.group(2).lstrip("*")
                params[current] = m.group(4).strip()
            elif current and lines[i].strip():
                params[current] = (params[current] + " " + lines[i].strip()).strip()
            i += 1
    return " ".join(" ".join(desc).split()), params


def function_schema(fn, name: str | None = None) -> dict:
    """The OpenAI function-tool schema of ``fn`` (module docstring); ``TypeError`` naming the parameter when
    a hint is missing or has no JSON type, ``ValueError`` when the docstring is missing."""
    name = name or fn.__name__
    description, docs = parse_docstring(fn.__doc__)
    if not description:
        raise ValueError(f"tool {name!r}: the function needs a docstring (its first lines are the tool's description)")
    hints = typing.get_type_hints(fn)
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        where = f"tool {name!r}, parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{where}: *args / **kwargs have no schema; name each parameter")
        if p.name not in hints:
            raise TypeError(f"{where}: no type hint (the schema is derived from the hints)")
        prop = _json_type(hints[p.name], where)
        if p.name in docs:
            prop["description"] = docs[p.name]
        props[p.name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


def _type_ok(value, prop: dict) -> bool:
    t = prop.get("type")
    if "enum" in prop and value not in prop["enum"]:
        return False
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list) and all(_type_ok(v, prop.get("items", {})) for v in value)
    return True   # no type given: anything


def check_arguments(schema: dict, arguments) -> str | None:
    """``None`` when ``arguments`` fit the schema's parameters, else the one-line reason (what the model reads)."""
    fn = schema["function"]
    params = fn.get("parameters", {})
    if not isinstance(arguments, dict):
        return f"{fn['name']}: arguments must be a JSON object, got {type(arguments).__name__}"
    props = params.get("properties", {})
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"{fn['name']}: missing required argument(s) {missing}; expected {sorted(props)}"
    unknown = sorted(k for k in arguments if k not in props)
    if unknown:
        return f"{fn['name']}: unknown argument(s) {unknown}; expected {sorted(props)}"
    for k, v in arguments.items():
        if not _type_ok(v, props[k]):
            want = props[k].get("type", "?") + (f" in {props[k]['enum']}" if "enum" in props[k] else "")
            return f"{fn['name']}: argument {k!r} must be {want}, got {v!r:.60}"
    return None
