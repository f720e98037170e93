"""Context parallelism on a real CP group (2 gloo ranks, ``workers/context_parallel.py``): Megatron-core's
groups (DP excludes CP, DP x CP sums the gradients), the token split against Megatron-core's own
``get_batch_on_this_cp_rank``, the CP gather (forward exact, backward each rank's own rows), and the actor's
per-token path on a rank's slice of the logits reproducing the unsplit log-probs, entropy, top-k and
logits gradient. The model half (TE attention over the CP ring) needs 2 GPUs:
``tests/gpu/test_context_parallel_te.py``.

Tolerances from the arithmetic (``tests/helpers/fp32_tolerance.py``): splitting the tokens over CP ranks
changes only how each token's vocabulary reductions (log-sum-exp, entropy: V terms each) are blocked, so a
log-prob or entropy may move by 2·Σγ̃_V (the two reductions) times the magnitudes it is built from (max|z|/T
of the logits plus log V of the log-sum-exp); a logit's gradient is p_v times terms of that size, so p_v's
relative error (the same bound) scales the largest gradient. A slicing mistake (another token's row) moves a
log-prob by O(1): far above ~1e-4."""
from __future__ import annotations

import json
import math
from pathlib import Path

from tests.helpers.dist import torchrun
from tests.helpers.fp32_tolerance import reorder_rtol

WORKER = Path(__file__).resolve().parent / "workers" / "context_parallel.py"


def test_cp_group_gathers_slices_back_to_the_full_frame(tmp_path):
    out = tmp_path / "rec.json"
    torchrun(WORKER, out, nproc=2, timeout=300)
    rec = json.loads(out.read_text())
    assert rec["groups"] == {"info_dp": 1, "info_cp": 2, "cp_rank": 0, "groups_cp": 2, "groups_dp": 1, "dp": 1,
                             "dp_cp": 2}
    assert rec["megatron_split_same"], "our chunk ownership differs from Megatron-core's get_batch_on_this_cp_rank"
    assert rec["gather_exact"] and rec["gather_grad_own_rows"]
    tags = [k for k in rec if k.startswith("packed")] + ["padded"]
    assert len(tags) >= 2
    for tag in tags:
        r = rec[tag]
        assert r["local_tokens"] * 2 == r["total_tokens"], r
        rtol = reorder_rtol([r["vocab"], r["vocab"]])
        tol = rtol * (r["logit_scale"] + math.log(r["vocab"]))
        for key in ("logp", "entropy", "token_logp", "topk_logp"):
            print(f"{tag} {key}: max difference {r[key]:.2e}, bound {tol:.2e}")
            assert r[key] <= tol, (tag, key, r[key], tol)
        assert r["topk_idx_same"] and r["inputs_ok"], tag
        print(f"{tag} grad: max difference {r['grad']:.2e}, bound {tol * r['grad_scale']:.2e}")
        assert r["grad"] <= tol * r["grad_scale"], (tag, r, tol)
