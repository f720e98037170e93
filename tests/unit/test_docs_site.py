"""The docs site's generated references and its rules (``make docs`` builds it strictly, link and
anchor validation included, as part of ``make test``):

* the config reference (``tools/docs_reference.py``, added to the site by ``tools/mkdocs_hooks.py``)
  lists every key a run config accepts, each with a description, walked here from the dataclasses;
* the CLI reference lists every flag of every parser of ``megatron-rl`` and its commands' owners;
* every runnable block of the docs is run by a test that reads its page, or marked as a template;
* no shipped file cites a document users do not have (``../shared``, "spec §").
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import typing
from pathlib import Path

import pytest

from tests.helpers.tools import load_tool

REPO = Path(__file__).resolve().parents[2]
ref = load_tool("docs_reference")

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _keys(cls, prefix: str) -> set[str]:
    out = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints.get(f.name)):
            out |= _keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.add(f"{prefix}{f.name}")
    return out


def test_config_reference_lists_every_key_with_a_description():
    from megatron_rl import config as C
    from megatron_rl.algorithms import ALGO_KINDS

    keys = set()
    for f in dataclasses.fields(C.Config):
        cls = typing.get_type_hints(C.Config)[f.name]
        if not dataclasses.is_dataclass(cls):
            keys.add(f.name)
        elif f.name == "algo":
            keys |= _keys(C.AlgoConfig, "algo.") - {"algo.hparams"}
            for kind, spec in ALGO_KINDS.items():
                keys |= _keys(spec.hparams, f"algo.{kind}.")
        else:
            keys |= _keys(cls, f"{f.name}.")
    page = ref.config_reference()
    listed = set(re.findall(r"^\| `([\w.]+)` \|", page, re.MULTILINE))
    assert keys - listed == set(), f"config keys missing from the generated reference: {sorted(keys - listed)}"
    sections = {k for k, default, _ in ref.config_rows() if default == "(section)"}   # a sub-section's own row
    assert listed - keys - sections == set(), f"the reference lists keys the config lacks: {sorted(listed - keys - sections)}"
    assert "rollout.partial" in sections, sections
    undocumented = sorted(k for k, _, doc in ref.config_rows() if not doc.strip())
    assert not undocumented, f"config keys without a description in the code: {undocumented}"
    assert len(keys) > 150 and "grpo" in ALGO_KINDS


def test_keep_last_zero_is_documented_in_the_reference():
    row = next(r for r in ref.config_rows() if r[0] == "trainer.keep_last")
    assert "0 = keep all" in row[2], row


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings if s not in ("-h", "--help")}


def _owner(specs):
    """The first importable owner module with a ``build_parser`` (``cli.PASSTHROUGH`` lists candidates)."""
    for spec in specs:
        try:
            mod = importlib.import_module(spec.split(":")[0])
        except ImportError:
            continue
        if hasattr(mod, "build_parser"):
            return mod
    raise AssertionError(f"no owner of {specs} has build_parser()")


def test_cli_reference_lists_every_flag_of_every_command():
    from megatron_rl import cli

    page = ref.cli_reference()
    seen = 0
    top = cli.build_parser()
    parsers = [("megatron-rl", top)]
    for name in cli.COMMANDS:
        if name in cli.PASSTHROUGH:
            p = _owner(cli.PASSTHROUGH[name]).build_parser()
        else:
            p = top._subparsers._group_actions[0].choices[name]
        parsers.append((f"megatron-rl {name}", p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                parsers += [(f"megatron-rl {name} {sub}", sp) for sub, sp in a.choices.items()]
    for line, p in parsers:
        head = f"## `{line}`\n"
        assert head in page, f"{line} missing from the CLI reference"
        section = page[page.index(head):].split("\n## ", 1)[0]
        missing = sorted(f for f in _flags(p) if f"`{f}`" not in section)
        assert not missing, f"{line}: flags missing from the CLI reference: {missing}"
        seen += len(_flags(p))
    assert seen > 40


def _blocks(text: str):
    """(marker lines before the fence, block body) of every ```bash / ```sh block."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if re.match(r"^```(bash|sh)\s*$", lines[i]):
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            before, k = [], i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            while k >= 0 and lines[k].strip():   # the paragraph (or marker) right above the fence
                before.insert(0, lines[k])
                k -= 1
            heading = next((ln for ln in reversed(lines[:i]) if ln.startswith("#")), "")
            out.append(("\n".join(before), heading, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return out


@pytest.mark.parametrize("path", DOC_FILES, ids=[p.relative_to(REPO).as_posix() for p in DOC_FILES])
def test_every_runnable_block_is_tested_or_a_template(path):
    """A ```bash block is either a template (it has ``<UPPERCASE>`` placeholders and its paragraph or
    heading says "template"), or it is marked ``<!-- tested: TEST_FILE -->`` by a test that reads this page."""
    rel = path.relative_to(REPO).as_posix()
    for n, (before, heading, body) in enumerate(_blocks(path.read_text())):
        if rel == "README.md" and n == 0:   # nothing may precede the two commands: tests/unit/test_docs.py checks them
            before = "<!-- tested: tests/unit/test_docs.py -->"
        placeholder = re.search(r"<[A-Z][A-Z_]*>", body)
        marker = re.search(r"<!-- tested: (\S+) -->", before)
        if placeholder:
            assert "template" in (before + heading).lower(), f"{rel}: a block with placeholders not marked a template:\n{body}"
            continue
        assert marker, f"{rel}: a runnable block neither tested nor a template:\n{body}"
        test = REPO / marker.group(1)
        assert test.is_file(), f"{rel}: {marker.group(1)} does not exist"
        name = "README.md" if rel == "README.md" else rel
        assert name in test.read_text(), f"{marker.group(1)} does not read {name}"


SHIPPED = ["megatron_rl", "examples", "README.md", "docs"]


def test_no_shipped_file_cites_documents_users_do_not_have():
    bad = []
    for top in SHIPPED:
        root = REPO / top
        for f in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            if f.suffix in (".pyc", ".png", ".parquet", ".safetensors"):
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if "../shared" in line or "spec §" in line:
                    bad.append(f"{f.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not bad, f"{len(bad)} citations of ../shared or 'spec §' in shipped files:\n" + "\n".join(bad[:40])
