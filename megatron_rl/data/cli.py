"""``megatron-rl data``: make the papers' data sets (``generate``: synthetic sets, ``generate_cli.py``)."""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from megatron_rl.data.generate_cli import add_generate_parser, run_generate
    from megatron_rl.usage import OneLineParser

    p = OneLineParser(prog="megatron-rl data", description=__doc__)
    sub = p.add_subparsers(dest="action", metavar="{generate}", required=True)
    add_generate_parser(sub)
    a = p.parse_args(argv)
    a.argv = argv
    if a.action == "generate":
        return run_generate(a)
    return 2
