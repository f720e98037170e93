"""Smoke test of ``benchmarks/bench_packing.py --quick``: the goals that do not depend on the machine.

The quick batch (64 sequences, prompts 8..24, responses log-normal median 14 with the longest 128
tokens, seed 0) through both paths of the real actor, each in its own subprocess. Asserted: the packed
plan's padding <= 5 % (the padded batch wastes > 50 %), the DP=2 plan's token imbalance <= 1.1, and the
numerics of the two paths (per-token log-probs to 1e-4, the first train step's loss and grad norm to
1e-5 relative). Timings and peak RSS are printed by the benchmark, not asserted (shared 2-core host).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_packing_quick(tmp_path):
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/bench_packing.py"), "--quick", "--json", str(out)],
                       check=False, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    x = json.loads(out.read_text())
    assert x["n"] == 64 and x["resp_max_over_median"] >= 8
    assert x["pad_frac"]["padded"] > 0.5
    assert x["pad_frac"]["packed"] <= 0.05, x["pad_frac"]
    assert x["rows"]["packed"] < x["rows"]["padded"] / 3
    assert x["dp2_imbalance"] <= 1.1, x["dp2_imbalance"]
    assert x["logp_max_diff"] <= 1e-4, x["logp_max_diff"]
    assert x["loss_rel_diff"] <= 1e-5 and x["grad_norm_rel_diff"] <= 1e-5, (x["loss_rel_diff"], x["grad_norm_rel_diff"])
    for p in ("padded", "packed"):
        assert x[p]["old_logprob"] > 0 and x[p]["train"] > 0 and x[p]["rss_kb"] >= x[p]["rss_loaded_kb"] > 0
    assert "goals:" in r.stdout
