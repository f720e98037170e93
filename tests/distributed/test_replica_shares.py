"""Each data-parallel replica receives its share of a step's batch (issue 41, ``trainer/pipeline/dispatch.py``):
four real gloo ranks as TP = 2 x DP = 2 (``workers/dispatch.py``). The oracle is the whole batch: every
held row and every sample's metadata arrive bit for bit, each replica holds exactly the rows its passes
run (``step_rows``: the actor's split of the lengths), the engine frame assembled over DP is the whole
batch's, and a path that does not share rows out receives the whole batch as before."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.dist import torchrun

WORKER = Path(__file__).resolve().parent / "workers" / "dispatch.py"


def test_replicas_receive_their_shares(tmp_path):
    out = tmp_path / "rec.json"
    torchrun(WORKER, out, nproc=4, timeout=300)
    recs = json.loads(out.read_text())
    for r in recs:
        assert r["n"] == 24 and r["meta_equal"] and r["rows_equal"] and r["frame_equal"], r
        assert r["held"] == r["expect_held"] and r["owned"] == r["expect_owned"], r
        assert r["whole_when_not_shared"] and r["exception_whole"], r
        assert all(r["dp4"].values()), r                                 # DP = 4: the driver alone in replica 0
    assert recs[2]["held"] == recs[3]["held"] and recs[1]["owned"] == recs[0]["owned"]        # one share per replica
    assert set(recs[1]["held"]) != set(recs[2]["held"])
    assert all(r["texts"] == 0 for r in recs[1:])                       # texts stay on the driver
    # a receiving replica holds about half the token bytes (one mini-batch's split may add a few rows)
    for r in recs[1:]:
        assert r["token_bytes"] < 0.75 * r["whole_token_bytes"], r
