"""Parallelism invariance of the policy actor (fp32): the same batch and weights give the same
log-probs, loss and gradient norm at TP=1, TP=2(+SP), PP=2 and DP=2 (distributed optimizer and
plain megatron Adam), and for micro-batch sizes 1, 2 and 8.

The layouts run on the same tiny HF checkpoint in two torchrun (gloo) launches, one per world size
(1 process: TP=1 at both micro-batch sizes; 2 processes: the rest), each case with freshly built
megatron groups and actor; three optimizer steps (token-mean, seq-mean-token-mean, token-sum
aggregation) also check the updates agree, and so do two PPO mini-batches through the update
pipeline (``trainer/pipeline/update.py``) on a fresh actor. The ``*_offload_*`` layouts offload and onload the
trainer (``trainer.offload``) before every step and must match their twin without offload exactly.

Tolerances come from the arithmetic (``tests/helpers/fp32_tolerance.py``): the layouts differ only in
the order of their fp32 reductions, so each comparison allows 2·κ·passes·Σγ_k over the reduction lengths
k of the tiny model's forward and backward passes and the token sum (γ_k = k·u/(1 − k·u), u = 2^-24),
κ = Σ|terms| / |loss| as the worker measures it, passes = 1 + the optimizer steps taken before the value.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun
from tests.helpers.fp32_tolerance import cond, reorder_rtol, tiny_qwen3_path, transformer_forward

WORKERS = Path(__file__).parent / "workers"
SEQ = 16                     #: the workers' sequence length (``tests/helpers/actor_common.SEQ``)
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
    out["_hf"] = json.loads((hf / "config.json").read_text())
    return out


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _forward(cfg: dict, tokens: int) -> list[int]:
    """Reduction lengths of a sum of log-probs / entropies over ``tokens`` response tokens (forward only)."""
    dims = (cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["num_hidden_layers"], cfg["vocab_size"], SEQ)
    return transformer_forward(*dims) + [tokens]


def test_tolerances_keep_their_power(results):
    """Each loss bound stays below half of what one lost (or doubly counted) response token would change:
    a token carries loss_abs / tokens of the loss's magnitude, so tol·|loss| < loss_abs / (2·tokens)."""
    ref = results["tp1"]
    cases = [(s["loss"], s["loss_abs"], ref["tokens"], i) for i, s in enumerate(ref["steps"])]
    cases += [(r["actor/loss"], r["loss_abs"], r["tokens"], i) for i, r in enumerate(ref["minibatch_steps"])]
    for loss, mag, tokens, i in cases:
        tol = reorder_rtol(tiny_qwen3_path(results["_hf"], SEQ, tokens, ref["params"]), cond(mag, loss), passes=i + 1)
        print(f"loss {loss:.4g}: tolerance {tol:.2e} relative = {tol * abs(loss):.2e} absolute; one token {mag / tokens:.2e}")
        assert tol * abs(loss) < mag / (2 * tokens), (loss, mag, tokens, tol)


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "tp1"])
def test_same_logprobs_loss_and_grad_norm(results, name):
    ref, got, cfg = results["tp1"], results[name], results["_hf"]
    fwd = reorder_rtol(_forward(cfg, ref["tokens"]))     # log-probs (all < 0) and entropies (all > 0): κ = 1
    assert _rel(got["logp_sum"], ref["logp_sum"]) <= fwd
    assert _rel(got["ent_sum"], ref["ent_sum"]) <= fwd
    path = tiny_qwen3_path(cfg, SEQ, ref["tokens"], ref["params"])
    for i, (r, g) in enumerate(zip(ref["steps"], got["steps"])):
        assert g["ok"] and r["ok"]
        tol = reorder_rtol(path, cond(r["loss_abs"], r["loss"]), passes=i + 1)
        assert _rel(g["loss"], r["loss"]) <= tol, (name, r["mode"], g["loss"], r["loss"], tol)
        assert _rel(g["grad_norm"], r["grad_norm"]) <= tol, (name, r["mode"], g["grad_norm"], r["grad_norm"], tol)
        assert _rel(g["ratio_mean"], r["ratio_mean"]) <= reorder_rtol(_forward(cfg, ref["tokens"]), passes=i + 1)
        assert g["lr"] == r["lr"]
    assert _rel(got["logp_sum_after"], ref["logp_sum_after"]) <= reorder_rtol(_forward(cfg, ref["tokens"]), passes=4)


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "tp1"])
def test_sampling_distribution_logprobs_are_invariant(results, name):
    """log μ (top-k 5, top-p 0.8, min-p 0.01: ``algorithms/sampling.py``) of the same targets at TP=2 (the
    kept set by reductions over the vocabulary shards), PP=2 and DP=2 equals TP=1's: the same kept
    targets, the sum within the forward's reordering bound taken twice (log q, then log M = the kept mass's
    own vocabulary reduction; every term ≤ 0, so κ = 1); asking for μ leaves the full log-probs unchanged."""
    ref, got = results["tp1"], results[name]
    assert got["mu_full_equal"] and got["mu_kept"] == ref["mu_kept"] > 0
    tol = reorder_rtol(_forward(results["_hf"], ref["tokens"]), passes=2)
    assert _rel(got["mu_logp_sum"], ref["mu_logp_sum"]) <= tol, (got["mu_logp_sum"], ref["mu_logp_sum"], tol)
    assert got["mu_logp_sum"] > got["logp_sum"]    # log μ = log q − log M > log q wherever M < 1


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "tp1"])
def test_ppo_mini_batches_are_invariant(results, name):
    """The update pipeline's 2 PPO mini-batches (one optimizer step each): every mini-batch's loss and
    gradient norm agree with TP=1 at 2-row micro-batches across micro-batch sizes (1, 2, 4 rows), DP=2
    (each rank half of the mini-batch, the normaliser global over DP) and TP / PP, within what the
    reordered fp32 reductions allow (module docstring; the second mini-batch after one Adam step)."""
    ref, got = results["tp1"]["minibatch_steps"], results[name]["minibatch_steps"]
    assert [(r["mini_batch"], r["rows"]) for r in got] == [(0, 4), (1, 4)] == [(r["mini_batch"], r["rows"]) for r in ref]
    for i, (r, g) in enumerate(zip(ref, got)):
        path = tiny_qwen3_path(results["_hf"], SEQ, r["tokens"], results["tp1"]["params"])
        tol = reorder_rtol(path, cond(r["loss_abs"], r["actor/loss"]), passes=i + 1)
        assert _rel(g["actor/loss"], r["actor/loss"]) <= tol, (name, r, g, tol)
        assert _rel(g["actor/grad_norm"], r["actor/grad_norm"]) <= tol, (name, r, g, tol)
        assert g["actor/lr"] == r["actor/lr"]
    # on-policy first (ratio exactly 1: old log-probs from the same forward), moved policy second: approx_kl
    # is a mean of k3 terms >= 0, > 0 once any ratio moved (ppo_kl's signed terms could cancel)
    assert ref[0]["actor/approx_kl"] == 0.0 == ref[0]["actor/ppo_kl"] and ref[1]["actor/approx_kl"] > 0.0


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
    # Σ_t |Δ log p| over the batch (a signed sum could cancel): 0 exactly if the weights had not moved (the
    # same forward, layout and host: bit-identical), so > 0 says the three steps moved the policy
    assert r["logp_abs_change"] > 0.0, r["logp_abs_change"]
    assert r["steps"][0]["grad_norm"] > 0
