"""Context parallelism on a real CP group (2 gloo ranks, ``workers/context_parallel.py``): Megatron-core's
groups (DP excludes CP, DP x CP sums the gradients), the token split against Megatron-core's own
``get_batch_on_this_cp_rank``, the CP gather (forward exact, backward each rank's own rows), and the actor's
per-token path on a rank's slice of the logits reproducing the unsplit log-probs, entropy, top-k and
logits gradient. The model half (TE attention over the CP ring) needs 2 GPUs:
``tests/gpu/test_context_parallel_te.py``."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.dist import torchrun

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
        assert r["logp"] <= 1e-5 and r["entropy"] <= 1e-5 and r["token_logp"] <= 1e-5 and r["topk_logp"] <= 1e-5, (tag, r)
        assert r["topk_idx_same"] and r["inputs_ok"], tag
        assert r["grad"] <= 1e-6 * max(1.0, r["grad_scale"]), (tag, r)
