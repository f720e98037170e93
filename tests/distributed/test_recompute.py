"""``model.recompute``: Megatron's selective and full (uniform / block) activation recompute give the
loss and gradients of no recompute bit for bit, at TP=2 with sequence parallelism and at PP=2
(``workers/recompute.py``, real megatron-core, 2 gloo ranks). No tolerance: recompute replays the same
forward ops on the same shapes in the same process (same kernels, same thread count, same reduction
order), so the recomputed activations, hence the loss and every gradient, are identical, not merely close."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).resolve().parent / "workers"


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> dict:
    from tests.helpers.actor_common import make_tiny_hf

    tmp = tmp_path_factory.mktemp("recompute")
    hf = make_tiny_hf(tmp / "hf")
    torchrun(WORKERS / "recompute.py", hf, tmp / "rec.json", nproc=2, timeout=600)
    return json.loads((tmp / "rec.json").read_text())


@pytest.mark.parametrize("layout", ["tp2pp1", "tp1pp2"])
@pytest.mark.parametrize("mode,granularity", [("none", None), ("selective", "selective"), ("full_uniform", "full"),
                                              ("full_block", "full")])
def test_recompute_reproduces_loss_and_gradients(rec, layout, mode, granularity):
    r = rec[f"{layout}/{mode}"]
    assert r["granularity"] == granularity          # the setting reached Megatron's config
    print(f"{layout}/{mode}: |Δloss| {abs(r['loss'] - r['base_loss']):.2e}, |Δgrad_norm| "
          f"{abs(r['grad_norm'] - r['base_grad_norm']):.2e}, max |Δgrad| {r['max_grad_diff']:.2e}")
    assert r["loss"] == r["base_loss"] and r["grad_norm"] == r["base_grad_norm"], r
    assert r["n_grads"] > 0 and r["max_grad_diff"] == 0.0, r
    once = r["base_calls"]                         # the recompute really ran: the recomputed parts ran twice
    twice = {"none": (), "selective": ("core_attn",), "full_uniform": ("core_attn", "mlp"),
             "full_block": ("core_attn", "mlp")}[mode]
    assert r["calls"] == {k: v * (2 if k in twice else 1) for k, v in once.items()}, (r["calls"], once)
