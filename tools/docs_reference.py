"""The generated pages of the docs site: the config reference and the CLI reference.

One source of truth: the config reference is read from the config dataclasses (``megatron_rl/config.py``, ``config_sections.py`` and ``config_features.py``,
the methods' hyper-parameter dataclasses registered in ``megatron_rl.algorithms.ALGO_KINDS``) with the
descriptions ``megatron-rl train --print-config`` prints (``megatron_rl/cli/config_doc.py``); the CLI reference
from the argparse parsers of ``megatron-rl`` and of the owners of its pass-through commands. The mkdocs
hook (``tools/mkdocs_hooks.py``) adds both pages at build time; nothing generated is committed.
``tests/unit/test_docs_site.py`` checks that every key and flag the code accepts appears here.

    python tools/docs_reference.py config|cli     # print a page
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIG_PAGE = "reference/config.md"
CLI_PAGE = "reference/cli.md"


def _cell(text: str) -> str:
    """Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _rows(cls, prefix: str, skip: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML, description) of every field of dataclass ``cls``, nested ones expanded."""
    from megatron_rl.cli.config_doc import field_default, field_doc

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        key = f"{prefix}{f.name}"
        sub = hints.get(f.name)
        if dataclasses.is_dataclass(sub):
            doc = field_doc(cls, f.name)
            if doc:
                out.append((key, "(section)", doc))
            out += _rows(sub, key + ".")
            continue
        value = field_default(f)
        value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        out.append((key, json.dumps(value, default=str, ensure_ascii=False), field_doc(cls, f.name)))
    return out


def _table(rows) -> list[str]:
    lines = ["| key | default | description |", "|---|---|---|"]
    lines += [f"| `{k}` | `{_cell(d)}` | {_cell(doc) or '—'} |" for k, d, doc in rows]
    return lines


def config_rows() -> list[tuple[str, str, str]]:
    """Every key of a run config (``algo.<kind>.*`` for every registered kind), as the page lists them."""
    from megatron_rl.algorithms import ALGO_KINDS
    from megatron_rl.config import AlgoConfig, Config

    hints = typing.get_type_hints(Config)
    rows = []
    for f in dataclasses.fields(Config):
        cls = hints[f.name]
        if not dataclasses.is_dataclass(cls):
            rows += _rows(Config, "", skip=tuple(g.name for g in dataclasses.fields(Config) if g.name != f.name))
        elif f.name == "algo":
            rows += _rows(AlgoConfig, "algo.", skip=("hparams",))
            for kind, spec in ALGO_KINDS.items():
                rows += _rows(spec.hparams, f"algo.{kind}.")
        else:
            rows += _rows(cls, f"{f.name}.")
    return rows


def config_reference() -> str:
    """The config reference page (markdown)."""
    from megatron_rl.algorithms import ALGO_KINDS
    from megatron_rl.config import AlgoConfig, Config

    hints = typing.get_type_hints(Config)
    out = ["# Config reference", "",
           "Generated at build time from the config dataclasses (`megatron_rl/config.py`, `megatron_rl/config_sections.py`, `megatron_rl/config_features.py`) and the methods'",
           "hyper-parameter dataclasses (`megatron_rl/algorithms/hparams.py`): the same descriptions as",
           "`megatron-rl train --print-config [--algo KIND]`, which prints them as a loadable YAML. A run is one",
           "YAML file with these sections plus dotted overrides on the command line",
           "(`megatron-rl train --config X.yaml algo.kind=dapo trainer.steps=50`). Unknown keys, bad values and",
           "cross-section conflicts fail at start-up with one line naming the key. Where the keys of verl and",
           "NeMo-RL map to these: [Coming from verl or NeMo-RL](coming-from-verl.md).", ""]
    for f in dataclasses.fields(Config):
        cls = hints[f.name]
        if not dataclasses.is_dataclass(cls):
            out += [f"## `{f.name}` (top-level key)", ""]
            out += _table(_rows(Config, "", skip=tuple(g.name for g in dataclasses.fields(Config) if g.name != f.name)))
            out.append("")
            continue
        out += [f"## `{f.name}`", ""]
        doc = inspect.cleandoc(cls.__doc__ or "")
        if doc and not doc.startswith(cls.__name__ + "("):
            out += [doc, ""]
        if f.name != "algo":
            out += _table(_rows(cls, f"{f.name}.")) + [""]
            continue
        out += _table(_rows(AlgoConfig, "algo.", skip=("hparams",))) + [""]
        out += ["Each method's own knobs live under `algo.<kind>` (the kind named by `algo.kind`); the method",
                "pages give the formulas behind them.", ""]
        for kind, spec in ALGO_KINDS.items():
            hp = spec.hparams
            intro = (f"Advantage `{spec.advantage}`, policy loss `{spec.loss}`, data path `{spec.path}`"
                     f" (`{hp.__name__}`). {_cell(inspect.cleandoc(hp.__doc__ or ''))}")
            out += [f"### `algo.{kind}`", "", intro, ""]
            out += _table(_rows(hp, f"algo.{kind}.")) + [""]
    return "\n".join(out)


def _owner_parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser of a ``megatron-rl`` command (the owner's ``build_parser`` for pass-through ones)."""
    from megatron_rl import cli

    if command not in cli.PASSTHROUGH:
        sub = cli.build_parser()._subparsers._group_actions[0].choices
        return sub[command]
    for spec in cli.PASSTHROUGH[command]:
        mod_name = spec.split(":")[0]
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        if hasattr(mod, "build_parser"):
            return mod.build_parser()
    raise RuntimeError(f"megatron-rl {command}: no owner module with build_parser() in {cli.PASSTHROUGH[command]}")


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(``megatron-rl ...`` command line, parser) of the top level, every command and every sub-command."""
    from megatron_rl import cli

    out = [("megatron-rl", cli.build_parser())]
    for command in cli.COMMANDS:
        p = _owner_parser(command)
        out.append((f"megatron-rl {command}", p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [(f"megatron-rl {command} {name}", sp) for name, sp in action.choices.items()]
    return out


def _help(p: argparse.ArgumentParser) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        p.print_help()
    return buf.getvalue()


def _flag_rows(p: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}` (positional)"
        default = "" if a.default is None or a.default is False or a.default == argparse.SUPPRESS else f"`{_cell(a.default)}`"
        choices = f" (one of {', '.join(map(str, a.choices))})" if a.choices and not isinstance(a.choices, dict) else ""
        rows.append(f"| {name} | {default} | {_cell(a.help or '')}{_cell(choices)} |")
    return ["| flag | default | description |", "|---|---|---|", *rows] if rows else []


def cli_reference() -> str:
    """The CLI reference page (markdown): each command's flags table and its ``--help`` text."""
    out = ["# CLI reference", "",
           "Generated at build time from the argparse parsers of `megatron-rl` (`megatron_rl/cli/__init__.py`) and of",
           "the modules that own its commands; the `--help` text below is what the command prints. Exit",
           "statuses and the errors each command reports: [Troubleshooting](../troubleshooting.md).", ""]
    for line, p in parsers():
        out += [f"## `{line}`", ""]
        out += _flag_rows(p) + [""]
        out += ["```text", _help(p).rstrip(), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    page = sys.argv[1] if len(sys.argv) > 1 else "config"
    print(config_reference() if page == "config" else cli_reference())
