"""Parallelism invariance of the policy actor (fp32): the same batch and weights give the same
log-probs, loss and gradient norm at TP=1, TP=2(+SP), PP=2 and DP=2 (distributed optimizer and
plain megatron Adam), and for micro-batch sizes 1, 2 and 8.

The layouts run on the same tiny HF checkpoint in two torchrun (gloo) launches, one per world size
(1 process: TP=1 at both micro-batch sizes; 2 processes: the rest), each case with freshly built
megatron groups and actor; three optimizer steps (token-mean, seq-mean-token-mean, token-sum
aggregation) also check the updates agree, and so do two PPO mini-batches through the update
pipeline (``trainer/pipeline/update.py``) on a fresh actor. The ``*_offload_*`` layouts offload and onload the
trainer (``trainer.offload``) before every step and must match their twin without offload exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).parent / "workers"
LAYOUTS = {  # name: (nproc, tp, pp, sp, micro_batch, distributed optimizer[, trainer offload before each step])
    "tp1": (1, 1, 1, 0, 2, 1),
    "tp1_mb8": (1, 1, 1, 0, 8, 1),
    "tp1_offload_all": (1, 1, 1, 0, 2, 1, "all"),
    "tp2_sp": (2, 2, 1, 1, 2, 1),
    "pp2": (2, 1, 2, 0, 2, 1),
    "dp2": (2, 1, 1, 0, 2, 1),
    "dp2_offload_optimizer": (2, 1, 1, 0, 2, 1, "optimizer"),
    "dp2_plain_adam": (2, 1, 1, 0, 1, 0),
}
#: offload layout -> the same layout without offload: every number must be identical
OFFLOAD_TWINS = {"tp1_offload_all": "tp1", "dp2_offload_optimizer": "dp2"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from tests.helpers.actor_common import make_tiny_hf

    d = tmp_path_factory.mktemp("inv")
    hf = make_tiny_hf(d / "hf")
    for nproc in sorted({v[0] for v in LAYOUTS.values()}):
        cases = [":".join(map(str, (name, *v[1:]))) for name, v in LAYOUTS.items() if v[0] == nproc]
        torchrun(WORKERS / "actor_invariance.py", str(hf), str(d), *cases, nproc=nproc, timeout=300 * len(cases))
    out = {name: json.loads((d / f"{name}.json").read_text()) for name in LAYOUTS}
    return out


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "tp1"])
def test_same_logprobs_loss_and_grad_norm(results, name):
    ref, got = results["tp1"], results[name]
    assert _rel(got["logp_sum"], ref["logp_sum"]) <= 1e-5
    assert _rel(got["ent_sum"], ref["ent_sum"]) <= 1e-5
    for r, g in zip(ref["steps"], got["steps"]):
        assert g["ok"] and r["ok"]
        assert _rel(g["loss"], r["loss"]) <= 1e-5, (name, r["mode"], g["loss"], r["loss"])
        assert _rel(g["grad_norm"], r["grad_norm"]) <= 1e-5, (name, r["mode"], g["grad_norm"], r["grad_norm"])
        assert _rel(g["ratio_mean"], r["ratio_mean"]) <= 1e-5
        assert g["lr"] == r["lr"]
    assert _rel(got["logp_sum_after"], ref["logp_sum_after"]) <= 1e-5


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "tp1"])
def test_sampling_distribution_logprobs_are_invariant(results, name):
    """log μ (top-k 5, top-p 0.8, min-p 0.01: ``algorithms/sampling.py``) of the same targets at TP=2 (the
    kept set by reductions over the vocabulary shards), PP=2 and DP=2 equals TP=1's: the same kept
    targets, the sum to 1e-5 as the full log-probs; asking for μ leaves the full log-probs unchanged."""
    ref, got = results["tp1"], results[name]
    assert got["mu_full_equal"] and got["mu_kept"] == ref["mu_kept"] > 0
    assert _rel(got["mu_logp_sum"], ref["mu_logp_sum"]) <= 1e-5, (got["mu_logp_sum"], ref["mu_logp_sum"])
    assert got["mu_logp_sum"] > got["logp_sum"]    # log μ = log q − log M > log q wherever M < 1


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "tp1"])
def test_ppo_mini_batches_are_invariant(results, name):
    """The update pipeline's 2 PPO mini-batches (one optimizer step each): every mini-batch's loss and
    gradient norm agree with TP=1 at 2-row micro-batches — to 1e-6 across micro-batch sizes (1, 2, 4
    rows) and DP=2 (each rank half of the mini-batch, the normaliser global over DP), to 1e-5 across
    TP / PP (their reductions are ordered differently)."""
    ref, got = results["tp1"]["minibatch_steps"], results[name]["minibatch_steps"]
    assert [(r["mini_batch"], r["rows"]) for r in got] == [(0, 4), (1, 4)] == [(r["mini_batch"], r["rows"]) for r in ref]
    tol = 1e-6 if name.startswith(("tp1", "dp2")) else 1e-5
    for r, g in zip(ref, got):
        assert _rel(g["actor/loss"], r["actor/loss"]) <= tol, (name, r, g)
        assert _rel(g["actor/grad_norm"], r["actor/grad_norm"]) <= tol, (name, r, g)
        assert g["actor/lr"] == r["actor/lr"]
    assert ref[0]["actor/ppo_kl"] == 0.0 != ref[1]["actor/ppo_kl"]   # on-policy first, moved policy second


@pytest.mark.parametrize("name", list(OFFLOAD_TWINS))
def test_offload_onload_changes_no_step(results, name):
    """offload -> onload before every step (the worker checks the released storages and the bit-exact
    return) leaves log-probs, losses, grad norms and the trained policy bit-identical."""
    got, ref = results[name], results[OFFLOAD_TWINS[name]]
    assert len(got["offloaded_bytes"]) == 3 and all(n > 0 for n in got["offloaded_bytes"])
    assert got["steps"] == ref["steps"]
    assert (got["logp_sum"], got["logp_sum_after"]) == (ref["logp_sum"], ref["logp_sum_after"])


def test_training_changed_policy_but_not_reference(results):
    r = results["tp1"]
    assert r["ref_unchanged"]
    assert abs(r["logp_sum_after"] - r["logp_sum"]) > 1e-3
    assert r["steps"][0]["grad_norm"] > 0
