"""``megatron-rl convert hf-to-mcore | mcore-to-hf`` (also ``tools/convert/*.py``).

Runs as one process or under ``torchrun --nproc_per_node=TP*PP`` (each rank converts its shard).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from megatron_rl.runtime.console import quiet_command

#: the log file beside ``--out``: ``OUT.convert.log`` (appended to by every conversion into OUT)
LOG_SUFFIX = ".convert.log"


def build_parser() -> argparse.ArgumentParser:
    from megatron_rl.runtime.usage import OneLineParser

    p = OneLineParser(prog="megatron-rl convert", description=__doc__)
    sub = p.add_subparsers(dest="direction", required=True)
    a = sub.add_parser("hf-to-mcore", help="HF safetensors dir -> Megatron dist checkpoint")
    a.add_argument("--hf", required=True, help="HF model dir (config.json + *.safetensors)")
    a.add_argument("--out", required=True, help="output checkpoint dir")
    a.add_argument("--tp", type=int, default=1, help="tensor parallel size (the checkpoint loads at any TP)")
    a.add_argument("--pp", type=int, default=1, help="pipeline parallel size (the checkpoint loads at any PP)")
    a.add_argument("--force", action="store_true",
                   help="replace a checkpoint megatron-rl wrote earlier in --out (other non-empty dirs are never touched)")
    a.add_argument("--engine", choices=("stream", "model"), default="stream",
                   help="stream: copy tensors chunk by chunk without building a model (default); "
                        "model: build the Megatron model and dist_checkpointing.save it")
    b = sub.add_parser("mcore-to-hf", help="Megatron dist checkpoint -> HF safetensors dir")
    b.add_argument("--ckpt", required=True, help="Megatron checkpoint dir (with COMPLETE and hf/config.json)")
    b.add_argument("--out", required=True, help="output HF dir")
    b.add_argument("--max-shard-gb", type=float, default=2.0, help="max safetensors shard size")
    b.add_argument("--force", action="store_true",
                   help="replace an HF export megatron-rl wrote earlier in --out (other non-empty dirs are never touched)")
    b.add_argument("--hf-config", default=None,
                   help="HF model dir / config.json for checkpoints without hf/config.json (default: CKPT/hf)")
    b.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="dtype of the exported weights, named in config.json (default: the checkpoint's model dtype)")
    for direction in (a, b):
        direction.add_argument("--verbose", action="store_true",
                               help="print Megatron's INFO and the libraries' warnings on the console "
                                    f"instead of OUT{LOG_SUFFIX}")
    return p


def log_path(out: str) -> Path:
    """The conversion's log file, beside ``--out`` (inside it the log would be a foreign file to
    ``--force`` and vanish with the temp dir of a failed conversion)."""
    out_path = Path(out).resolve()
    return out_path.with_name(out_path.name + LOG_SUFFIX)


def check_paths(args) -> None:
    """The input is the kind of directory its flag takes (``path_kind``: an HF dir given to
    ``mcore-to-hf``, a checkpoint or run dir given to ``hf-to-mcore`` say so and what fits), and
    ``--out`` can be written (a read-only place is one line, not a raw ``OSError`` or "no free space")
    -- before the log file beside ``--out`` is opened."""
    from megatron_rl.runtime.diskspace import check_writable
    from megatron_rl.runtime.path_kind import expect_checkpoint, expect_hf

    if args.direction == "hf-to-mcore":
        expect_hf(args.hf, "--hf")
    else:
        expect_checkpoint(args.ckpt, "--ckpt")
    check_writable(args.out, "--out")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from megatron_rl.runtime.diskspace import NotWritableError

    try:
        check_paths(args)
    except (FileNotFoundError, NotADirectoryError, NotWritableError) as e:
        from megatron_rl.runtime.usage import EXIT_USAGE

        print(f"megatron-rl convert: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with quiet_command(log_path(args.out), verbose=args.verbose) as log:   # INFO + library warnings -> OUT.convert.log
        return _convert(args, log)


def _convert(args, log: Path | None) -> int:
    from megatron_rl.convert.checkpoints import hf_to_mcore, mcore_to_hf
    from megatron_rl.runtime.diskspace import DiskSpaceError

    try:
        if args.direction == "hf-to-mcore":
            out = hf_to_mcore(args.hf, args.out, tp=args.tp, pp=args.pp, force=args.force, engine=args.engine)
        else:
            out = mcore_to_hf(args.ckpt, args.out, force=args.force, max_shard_bytes=int(args.max_shard_gb * (1 << 30)),
                              hf_config=args.hf_config, dtype=args.dtype)
    except DiskSpaceError as e:            # a runtime error: not enough space, or ENOSPC mid-write
        print(f"megatron-rl convert: error: {e}", file=sys.stderr)
        return 1
    except (FileExistsError, FileNotFoundError, NotADirectoryError, KeyError, ValueError, PermissionError) as e:
        from megatron_rl.runtime.usage import error_status

        print(f"megatron-rl convert: error: {e}", file=sys.stderr)
        return error_status()   # 2: every error reported here is about the arguments or the input files
    print(f"wrote {out}" + (f" (log: {log})" if log and log.is_file() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
