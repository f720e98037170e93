"""``megatron-rl data prepare <source> --in PATH --out DIR``: the parser and the run (the ``data``
command group is ``megatron_rl/data/cli.py``)."""
from __future__ import annotations

import argparse
import shlex

from megatron_rl.data.prepare.pipeline import PrepareRequest, prepare
from megatron_rl.data.prepare.registry import get_source, source_names

EPILOG = """sources (upstream dataset -> what is written):
  deepmath_filtered_level5_7|level6_8|level7_10  zwhe99/DeepMath-103K, RLCSD's difficulty band, <= 60000 rows -> train.parquet
  dapo_math_17k              BytedTsinghua-SIA/DAPO-Math-17k, de-duplicated -> train.parquet
  numinamath_20k_stratified  Artemis0430/NuminaMath-20k-Stratified (PAPO) -> train.parquet
  math500 aime24 aime25 amc23 olympiadbench gsm8k gpqa_diamond math   benchmarks -> test.parquet
  rlcsd_math_eval            --in amc23=P --in aime24=P --in aime25=P -> val.parquet (RLCSD's validation)
  verl                       an already-verl parquet (RLCSD's, Logic-RL's K&K), checked and copied
e.g. megatron-rl data prepare math500 --in MATH-500/test.jsonl --out data/math500"""


def _input(text: str) -> tuple[str, str]:
    """``--in``: ``PATH`` or ``NAME=PATH`` (the parts of ``rlcsd_math_eval``)."""
    name, sep, path = text.partition("=")
    if sep and name.isidentifier():
        return name, path
    return "", text


def add_prepare_parser(sub) -> argparse.ArgumentParser:
    """Add ``prepare`` to the ``data`` group's subparsers."""
    p = sub.add_parser("prepare", help="a downloaded dataset -> verl parquet rows with the paper's prompt and reward",
                       description="A downloaded dataset (parquet / JSONL, a file or a directory of shards) -> OUT/<split>.parquet in verl's columns with the paper's prompt and the data_source of its reference reward, plus OUT/manifest.json.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help=f"one of: {', '.join(source_names())}")
    p.add_argument("--in", dest="inputs", action="append", type=_input, required=True, metavar="PATH",
                   help="the downloaded parquet / JSONL / JSON file (.gz too) or a directory of shards; rlcsd_math_eval: NAME=PATH "
                        "once for each of amc23, aime24, aime25")
    p.add_argument("--out", required=True, help="output directory (DIR/<split>.parquet + DIR/manifest.json)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle of train sets and of GPQA's option order")
    p.add_argument("--max-rows", type=int, default=None,
                   help="keep at most N rows after the shuffle (default: the recipe's cap, 60000 for DeepMath; none "
                        "for the others)")
    p.add_argument("--val-rows", type=int, default=0, help="move the first N shuffled rows into val.parquet")
    p.add_argument("--split", default=None, help="name of the output split, a plain name (letters, digits, _ and -): "
                   "OUT/<split>.parquet (default: train for train sets, test for benchmarks, val for rlcsd_math_eval)")
    p.add_argument("--template", default=None, metavar="NAME",
                   help="math benchmarks (math500, aime24, aime25, amc23, olympiadbench): ask in a recipe's format "
                        "instead of the boxed one: boxed, rlcsd_math, papo, or dapo (DAPO's \"Answer:\" turn, "
                        "data_source math_dapo, as DAPO's AIME validation)")
    p.add_argument("--strict", action="store_true",
                   help="refuse a bad row (null / empty field, unparsable answer) with one line naming it, instead "
                        "of skipping and counting it")
    p.add_argument("--force", action="store_true",
                   help="replace what an earlier 'data prepare' wrote in --out (other non-empty dirs are never touched)")
    p.set_defaults(run=run_prepare)
    return p


def run_prepare(args: argparse.Namespace) -> int:
    """Run ``data prepare``; prints the summary line. Errors raise (the group turns them into one line)."""
    get_source(args.source)
    if args.max_rows is not None and args.max_rows < 1:
        raise ValueError(f"--max-rows must be >= 1, got {args.max_rows}")
    req = PrepareRequest(source=args.source, inputs=list(args.inputs), out=args.out, seed=args.seed, force=args.force,
                         strict=args.strict, max_rows=args.max_rows, val_rows=args.val_rows, split=args.split,
                         template=args.template,
                         command=shlex.join(["megatron-rl", "data", *getattr(args, "argv", ["prepare", args.source])]))
    manifest = prepare(req)
    print(manifest["summary"])
    print(f"wrote {args.out} ({', '.join(o['file'] for o in manifest['outputs'].values())}, manifest.json)")
    return 0

