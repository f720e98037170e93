"""``megatron-rl data``: make the papers' data sets (``generate``: synthetic sets, ``generate_cli.py``)."""
from __future__ import annotations


def build_parser():
    """The ``megatron-rl data`` parser: one sub-command per action."""
    from megatron_rl.data.generate_cli import add_generate_parser
    from megatron_rl.runtime.usage import OneLineParser

    p = OneLineParser(prog="megatron-rl data", description=__doc__)
    sub = p.add_subparsers(dest="action", metavar="{generate}", required=True)
    add_generate_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from megatron_rl.data.generate_cli import run_generate

    a = build_parser().parse_args(argv)
    a.argv = argv
    return run_generate(a) if a.action == "generate" else 2
