"""``parallel.vpp``: interleaved 1F1B (Megatron's own schedule, 2 virtual stages per rank) at PP=2 on gloo
reproduces the non-interleaved run: the loss and grad norm of a step (4 micro-batches, a single one, and a
packed one: fewer micro-batches than stages are made up by zero-mask fillers),
the log-probs before and after, and every HF tensor the weight sync streams (its owner-stage rule follows
Megatron's interleaved layer placement). ``workers/vpp.py``; real megatron-core, 2 ranks.

The schedules differ only in the order of fp32 reductions, so the tolerances come from the arithmetic
(``tests/helpers/fp32_tolerance.py``): the s-th step's loss and gradient norm within 2·κ·s·Σγ̃_k over the
4-layer model's forward, backward and token-sum reductions (κ = Σ|terms| / |loss| measured before each step);
log-probs within the forward's bound (relative to max|log-prob| + log V, the log-sum-exp they subtract), after
s steps s + 1 times it; a weight after the three Adam steps within lr·Σ_s (step s's gradient bound) — Adam's
update lr·m/(√v + ε) moves by at most lr times the relative change of its gradient."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun
from tests.helpers.fp32_tolerance import (
    cond,
    reorder_rtol,
    tiny_qwen3_path,
    transformer_forward,
)

WORKER = Path(__file__).resolve().parent / "workers" / "vpp.py"


@pytest.fixture(scope="module")
def recs(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("vpp") / "rec.json"
    torchrun(WORKER, out, nproc=2, timeout=600)
    recs = json.loads(out.read_text())
    cfg = json.loads((out.parent / "hf4" / "config.json").read_text())
    return [{**r, "_hf": cfg} for r in recs]


SEQ, LR = 16, 1e-3      #: ``fixed_batch``'s sequence length; the worker's learning rate
STEPS = (("loss", "grad_norm"), ("loss_one_mb", "grad_norm_one_mb"), ("loss_packed", "grad_norm_packed"))


def _step_tols(r: dict) -> list[float]:
    path = tiny_qwen3_path(r["_hf"], SEQ, r["tokens"], r["params"])
    return [reorder_rtol(path, cond(mag, r[lk][0]), passes=s + 1) for s, (mag, (lk, _)) in enumerate(zip(r["loss_abs"], STEPS))]


def test_interleaved_layers_follow_megatron(recs):
    assert [r["layers_vpp1"] for r in recs] == [[[1, 2]], [[3, 4]]]
    assert [r["layers_vpp2"] for r in recs] == [[[1], [3]], [[2], [4]]]     # chunk v of rank r: layer 2v + r + 1


def test_tolerances_keep_their_power(recs):
    """Each step's bound stays below half of one response token's share of the loss's magnitude."""
    r = recs[-1]
    for tol, mag, (lk, _) in zip(_step_tols(r), r["loss_abs"], STEPS):
        print(f"{lk} {r[lk][0]:.4g}: tolerance {tol:.2e} = {tol * abs(r[lk][0]):.2e} absolute; one token {mag / r['tokens']:.2e}")
        assert tol * abs(r[lk][0]) < mag / (2 * r["tokens"]), (lk, tol, mag)


def test_vpp2_reproduces_loss_grad_norm_and_weights(recs):
    for r in recs:
        tols = _step_tols(r)
        for tol, keys in zip(tols, STEPS):
            for key in keys:
                a, b = r[key]
                print(f"{key}: relative difference {abs(a - b) / abs(a):.2e}, bound {tol:.2e}")
                assert abs(a - b) <= tol * abs(a), (key, a, b, tol)
        fwd = transformer_forward(*(r["_hf"][k] for k in ("hidden_size", "intermediate_size", "head_dim", "num_attention_heads",
                                                            "num_key_value_heads", "num_hidden_layers", "vocab_size")), SEQ)
        scale = r["logp_scale"] + math.log(r["_hf"]["vocab_size"])
        for key, passes in (("logp_before_diff", 1), ("logp_after_diff", 4), ("packed_logp_diff", 4)):
            tol = reorder_rtol(fwd, passes=passes) * scale
            print(f"{key}: {r[key]:.2e}, bound {tol:.2e}")
            assert r[key] <= tol, (key, r[key], tol)
        tol = LR * sum(tols)
        print(f"weights_diff: {r['weights_diff']:.2e}, bound {tol:.2e}")
        assert r["weights_same_names"] and r["weights_diff"] <= tol, (r["weights_diff"], tol)
