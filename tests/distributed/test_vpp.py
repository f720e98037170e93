"""``parallel.vpp``: interleaved 1F1B (Megatron's own schedule, 2 virtual stages per rank) at PP=2 on gloo
reproduces the non-interleaved run: the loss and grad norm of a step (4 micro-batches, a single one, and a
packed one: fewer micro-batches than stages are made up by zero-mask fillers),
the log-probs before and after, and every HF tensor the weight sync streams (its owner-stage rule follows
Megatron's interleaved layer placement). ``workers/vpp.py``; real megatron-core, 2 ranks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun

WORKER = Path(__file__).resolve().parent / "workers" / "vpp.py"


@pytest.fixture(scope="module")
def recs(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("vpp") / "rec.json"
    torchrun(WORKER, out, nproc=2, timeout=600)
    return json.loads(out.read_text())


def test_interleaved_layers_follow_megatron(recs):
    assert [r["layers_vpp1"] for r in recs] == [[[1, 2]], [[3, 4]]]
    assert [r["layers_vpp2"] for r in recs] == [[[1], [3]], [[2], [4]]]     # chunk v of rank r: layer 2v + r + 1


def test_vpp2_reproduces_loss_grad_norm_and_weights(recs):
    for r in recs:
        for key in ("loss", "grad_norm", "loss_one_mb", "grad_norm_one_mb", "loss_packed", "grad_norm_packed"):
            a, b = r[key]
            assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (key, a, b)
        assert r["logp_before_diff"] <= 1e-5 and r["logp_after_diff"] <= 1e-5 and r["packed_logp_diff"] <= 1e-5, r
        assert r["weights_same_names"] and r["weights_diff"] <= 1e-5, r
