"""``megatron-rl data generate kk``: the RLCSD / Logic-RL Knights & Knaves splits from one command.

    megatron-rl data generate kk --out data/kk --seed 0

writes ``OUT/train.parquet`` (4–8 people), ``OUT/kk_4_8/test.parquet`` (in-distribution test),
``OUT/kk_9/test.parquet``, ``OUT/kk_10/test.parquet``, ``OUT/kk_11/test.parquet`` (out-of-distribution)
and ``OUT/manifest.json`` (row counts, sha256 of each file, the command, the seed). The default counts
are the K&K dataset's per size (900 train / 100 test) and 100 per OOD size (RLCSD's 800-item logic
validation set = 500 + 100 + 100 + 100). No puzzle appears twice in or across the splits (the
canonical statements are deduplicated); each split has its own seeded stream, so the test sets do
not change when only the train count does. ``eval --benchmarks kk --data-dir OUT`` reads the test sets.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

from tqdm import tqdm

from megatron_rl import __version__
from megatron_rl.runtime.out_dir import out_entries, refuse_foreign

MANIFEST = "manifest.json"


def _sizes(text: str) -> list[int]:
    """``4-8`` or ``9,10,11``."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes as LO-HI or a comma list, got {text!r}") from None


def add_generate_parser(sub) -> None:
    """``data generate {kk}`` and its options."""
    k = sub.add_parser("generate", help="generate a synthetic data set (kk: Logic-RL's Knights & Knaves)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    k.add_argument("task", choices=("kk",), help="the data set: kk (Knights & Knaves in Logic-RL's format, RLCSD's splits)")
    k.add_argument("--out", required=True, help="output dir (new or empty; or an earlier kk output with --force)")
    k.add_argument("--seed", type=int, default=0, help="generation seed (the same seed gives the same files)")
    k.add_argument("--train-sizes", type=_sizes, default=_sizes("4-8"), help="people per train puzzle (default 4-8)")
    k.add_argument("--train-per-size", type=int, default=900, help="train puzzles per size (default 900)")
    k.add_argument("--test-per-size", type=int, default=100,
                   help="in-distribution test puzzles per train size, written to kk_LO_HI (default 100)")
    k.add_argument("--ood-sizes", type=_sizes, default=_sizes("9,10,11"), help="OOD test sizes, one kk_N each (default 9,10,11)")
    k.add_argument("--ood-count", type=int, default=100, help="puzzles per OOD size (default 100)")
    k.add_argument("--force", action="store_true", help="replace an earlier `data generate kk` output in --out")


def plan_splits(a) -> dict[str, tuple[str, list[int]]]:
    """``{file (relative to OUT): (split name, [people per puzzle, one entry per puzzle])}`` in
    generation order (the tests first: their content does not depend on the train count)."""
    lo, hi = min(a.train_sizes), max(a.train_sizes)
    out = {f"kk_{lo}_{hi}/test.parquet": ("test", [s for s in a.train_sizes for _ in range(a.test_per_size)])}
    for s in a.ood_sizes:
        out[f"kk_{s}/test.parquet"] = ("test", [s] * a.ood_count)
    out["train.parquet"] = ("train", [s for s in a.train_sizes for _ in range(a.train_per_size)])
    return out


def generate_kk(a) -> dict:
    """Write the splits of :func:`plan_splits` and the manifest; returns the manifest."""
    import pyarrow as pa  # lazy: defers pyarrow to the call
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    from megatron_rl.data.kk_logic import (  # lazy: defers numpy to the call
        generate,
        to_row,
    )

    out = Path(a.out)
    _check_out(out, a.force)
    seen: set = set()
    files = {}
    for rel, (split, sizes) in plan_splits(a).items():
        rng = random.Random(f"kk/{a.seed}/{rel}")
        order = list(sizes)
        rng.shuffle(order)
        puzzles = [generate(n, rng, seen) for n in tqdm(order, desc=rel, unit="puzzle", leave=False)]
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([to_row(p, split, i) for i, p in enumerate(puzzles)]), path)
        files[rel] = {"rows": len(puzzles), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                      "people": sorted(set(sizes))}
    manifest = {"source": "kk", "generator": "megatron_rl.data.kk_logic", "seed": a.seed, "files": files,
                "command": "megatron-rl data " + " ".join(getattr(a, "argv", None) or sys.argv[2:]),
                "megatron_rl": __version__}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _check_out(out: Path, force: bool) -> None:
    """``--out`` is new or empty, or (with ``--force``) an earlier kk output: nothing else is overwritten."""
    out, entries = out_entries(out)
    if not entries:
        return
    mine = (out / MANIFEST).is_file() and json.loads((out / MANIFEST).read_text()).get("source") == "kk"
    if not mine:
        refuse_foreign(out, entries, "a `data generate kk` output", "an earlier kk output")
    if not force:
        raise FileExistsError(f"--out {out} already holds a `data generate kk` output; pass --force to replace it")


def run_generate(a) -> int:
    """Check the counts, generate, print one line per file."""
    for flag, v in (("--train-per-size", a.train_per_size), ("--test-per-size", a.test_per_size),
                    ("--ood-count", a.ood_count)):
        if v < 0:
            print(f"megatron-rl data generate kk: error: {flag} must be >= 0, got {v}", file=sys.stderr)
            return 2
    from megatron_rl.data.kk_logic import NAMES  # lazy: defers numpy to the call

    bad = [s for s in (*a.train_sizes, *a.ood_sizes) if not 2 <= s <= len(NAMES)]
    if bad:
        print(f"megatron-rl data generate kk: error: people per puzzle must be in 2..{len(NAMES)}, got {bad[0]}",
              file=sys.stderr)
        return 2
    try:
        m = generate_kk(a)
    except FileExistsError as e:
        print(f"megatron-rl data generate kk: error: {e}", file=sys.stderr)
        return 2
    for rel, f in m["files"].items():
        print(f"{Path(a.out) / rel}: {f['rows']} puzzles, {f['people'][0]}-{f['people'][-1]} people")
    return 0
