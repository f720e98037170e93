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
from megatron_rl.runtime.diskspace import DiskSpaceError, check_writable
from megatron_rl.runtime.out_dir import atomic_dir, out_entries, refuse_foreign

MANIFEST = "manifest.json"
#: the share of a size's distinct puzzles the generator is asked for at most: rejection sampling slows
#: as the unseen ones run out (3 people: 80000 of 90116 in 42 s, 85000 in 90 s; it stalls near 86000)
MAX_SHARE = (9, 10)


def _sizes(text: str) -> list[int]:
    """``4-8`` or ``9,10,11`` (LO <= HI, no size twice)."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            sizes = list(range(lo, hi + 1))
        else:
            sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes as LO-HI or a comma list, got {text!r}") from None
    if "-" in text and lo > hi:
        raise argparse.ArgumentTypeError(f"LO-HI needs LO <= HI, got {text!r} (did you mean {hi}-{lo}?)")
    twice = sorted({s for s in sizes if sizes.count(s) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{twice[0]} given twice in {text!r}")
    return sizes


def _show(sizes: list[int]) -> str:
    """Sizes as the user writes them: ``4-8`` for a run of three or more, else ``5,6``."""
    s = sorted(sizes)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ",".join(map(str, sizes))


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
    """Write the splits of :func:`plan_splits` and the manifest into a temp dir beside ``--out``, renamed
    onto it when all is written (as ``data prepare``: a failed or interrupted run leaves nothing there);
    returns the manifest."""
    import pyarrow as pa  # lazy: defers pyarrow to the call
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    from megatron_rl.data.kk_logic import (  # lazy: defers numpy to the call
        generate,
        to_row,
    )

    seen: set = set()
    files = {}
    with atomic_dir(a.out, a.force, _check_out) as tmp:
        for rel, (split, sizes) in plan_splits(a).items():
            rng = random.Random(f"kk/{a.seed}/{rel}")
            order = list(sizes)
            rng.shuffle(order)
            puzzles = [generate(n, rng, seen) for n in tqdm(order, desc=rel, unit="puzzle", leave=False)]
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist([to_row(p, split, i) for i, p in enumerate(puzzles)]), path)
            files[rel] = {"rows": len(puzzles), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                          "people": sorted(set(sizes))}
        manifest = {"source": "kk", "generator": "megatron_rl.data.kk_logic", "seed": a.seed, "files": files,
                    "command": "megatron-rl data " + " ".join(getattr(a, "argv", None) or sys.argv[2:]),
                    "megatron_rl": __version__}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
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


def check_request(a) -> None:
    """Everything that would fail after minutes, refused before a puzzle is drawn (one ``ValueError``
    line): counts >= 1; sizes within the name pool; OOD sizes outside the train sizes; the solver's
    memory (2^n assignments) within half of what this host has available; per size, no more puzzles
    than :data:`MAX_SHARE` of the distinct unique-solution ones (``kk_logic.distinct_puzzles``);
    ``--out`` writable and ours to write."""
    from megatron_rl.data.kk_logic import NAMES  # lazy: defers numpy to the call

    for flag, v in (("--train-per-size", a.train_per_size), ("--test-per-size", a.test_per_size),
                    ("--ood-count", a.ood_count)):
        if v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v} (every split is written; the counts are per size)")
    for flag, sizes in (("--train-sizes", a.train_sizes), ("--ood-sizes", a.ood_sizes)):
        bad = [s for s in sizes if not 2 <= s <= len(NAMES)]
        if bad:
            raise ValueError(f"{flag} {_show(sizes)}: people per puzzle must be in 2..{len(NAMES)} (the name pool), "
                             f"got {bad[0]}")
    both = sorted(set(a.train_sizes) & set(a.ood_sizes))
    if both:
        raise ValueError(f"--ood-sizes {_show(a.ood_sizes)} overlap --train-sizes {_show(a.train_sizes)} "
                         f"({', '.join(map(str, both))}): an out-of-distribution size must not be a train size; "
                         f"choose OOD sizes above {max(a.train_sizes)}")
    _check_memory(a)
    _check_counts(a)
    check_writable(a.out, "--out")
    _check_out(Path(a.out), a.force)


def _check_memory(a) -> None:
    from megatron_rl.data.kk_logic import solver_bytes  # lazy: defers numpy to the call
    from megatron_rl.runtime.diskspace import human  # lazy: only for the message
    import psutil  # lazy: only this check reads the host's memory

    budget = psutil.virtual_memory().available // 2
    for flag, sizes in (("--train-sizes", a.train_sizes), ("--ood-sizes", a.ood_sizes)):
        n = max(sizes)
        if solver_bytes(n) > budget:
            fit = max(k for k in range(2, n) if solver_bytes(k) <= budget)
            raise ValueError(f"{flag} {_show(sizes)}: the solver checks all 2^{n} assignments of a {n}-person puzzle, "
                             f"about {human(solver_bytes(n))} of memory; this host has {human(2 * budget)} available "
                             f"(half of it may go to the solver): sizes up to {fit} fit here")


def _check_counts(a) -> None:
    from megatron_rl.data.kk_logic import distinct_puzzles  # lazy: defers numpy to the call

    for n in sorted({*a.train_sizes, *a.ood_sizes}):
        distinct = distinct_puzzles(n)
        if distinct is None:
            continue
        parts = ([("train", a.train_per_size), ("test", a.test_per_size)] if n in a.train_sizes
                 else [("OOD", a.ood_count)])
        asked, cap = sum(k for _, k in parts), distinct * MAX_SHARE[0] // MAX_SHARE[1]
        if asked > cap:
            raise ValueError(f"{n} people: {asked} puzzles asked ({' + '.join(f'{k} {w}' for w, k in parts)}), but only "
                             f"{distinct} distinct unique-solution puzzles of {n} people exist (the generator draws "
                             f"at most {cap}, {MAX_SHARE[0]}/{MAX_SHARE[1]} of them): lower the counts or use larger "
                             "sizes")


def run_generate(a) -> int:
    """Check the request, generate, print one line per file; errors are one line (2: the request; 1: a
    full disk)."""
    try:
        check_request(a)
        m = generate_kk(a)
    except DiskSpaceError as e:
        print(f"megatron-rl data generate kk: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileExistsError, PermissionError, NotADirectoryError) as e:
        print(f"megatron-rl data generate kk: error: {e}", file=sys.stderr)
        return 2
    for rel, f in m["files"].items():
        print(f"{Path(a.out) / rel}: {f['rows']} puzzles, {f['people'][0]}-{f['people'][-1]} people")
    return 0
