"""``megatron-rl data prepare | generate``: the data command group. Each subcommand's parser and run
live in its own module (``data/prepare/cli.py``); this file only groups them."""
from __future__ import annotations

import sys

from megatron_rl.runtime.usage import OneLineParser


def build_parser() -> OneLineParser:
    from megatron_rl.data.prepare.cli import add_prepare_parser

    p = OneLineParser(prog="megatron-rl data", description="Datasets: prepare (a downloaded dataset -> verl parquet with the paper's prompt, reward and a manifest).")
    sub = p.add_subparsers(dest="action", required=True)
    add_prepare_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv   # the command line, for the manifest
    from megatron_rl.runtime.diskspace import DiskSpaceError
    from megatron_rl.runtime.usage import error_status

    try:
        return args.run(args)
    except DiskSpaceError as e:
        print(f"megatron-rl data {args.action}: error: {e}", file=sys.stderr)
        return 1
    except (FileExistsError, FileNotFoundError, NotADirectoryError, KeyError, ValueError, PermissionError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"megatron-rl data {args.action}: error: {msg}", file=sys.stderr)
        return error_status()


if __name__ == "__main__":
    sys.exit(main())
