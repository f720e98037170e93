"""``megatron-rl data``: make the papers' data sets (``prepare``: a downloaded dataset -> verl parquet,
``data/prepare/cli.py``; ``generate``: synthetic sets, ``generate_cli.py``)."""
from __future__ import annotations

import sys

from megatron_rl.data.generate_cli import add_generate_parser, run_generate
from megatron_rl.data.prepare.cli import add_prepare_parser, run_prepare
from megatron_rl.runtime.diskspace import DiskSpaceError
from megatron_rl.runtime.usage import OneLineParser, error_status


def build_parser():
    """The ``megatron-rl data`` parser: one sub-command per action."""
    p = OneLineParser(prog="megatron-rl data", description="Make the papers' data sets: prepare a downloaded dataset "
                      "(verl parquet with the paper's prompt and reward, and a manifest), or generate a synthetic one.")
    sub = p.add_subparsers(dest="action", metavar="{prepare,generate}", required=True)
    add_prepare_parser(sub)
    add_generate_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    a.argv = argv   # the command line, for the manifest
    if a.action == "generate":
        return run_generate(a)
    return _run_prepare(a)


def _run_prepare(a) -> int:
    """``prepare``: its errors as one line (2: arguments or input files; 1: a full disk)."""
    try:
        return run_prepare(a)
    except DiskSpaceError as e:
        print(f"megatron-rl data prepare: error: {e}", file=sys.stderr)
        return 1
    except (FileExistsError, FileNotFoundError, NotADirectoryError, KeyError, ValueError, PermissionError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"megatron-rl data prepare: error: {msg}", file=sys.stderr)
        return error_status()


if __name__ == "__main__":
    sys.exit(main())
