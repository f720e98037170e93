"""Per-token versions in the update (``trainer/pipeline/sequences.behaviour``, read by ``rows.py`` and ``logprobs.py``; partial rollouts): a sample's
staleness is its oldest token's, so a response spanning a push gets the decoupled weight on every token
against its own engine log-prob; the mismatch metrics' ``_fresh`` / ``_stale`` parts are split per token.
Oracle: the formulas recomputed by hand on a 2-sample batch."""
from __future__ import annotations

import math
import types

import torch

from megatron_rl.rollout.rollouts import Rollouts
from megatron_rl.trainer.pipeline.logprobs import mismatch_inputs
from megatron_rl.trainer.pipeline.rows import off_policy_inputs
from megatron_rl.trainer.pipeline.sequences import behaviour


def _batch():
    # sample 0: tokens by versions 1, 2, 2 (spans the push 1 -> 2); sample 1: all by 2
    lp = [[-1.0, -2.0, -0.5], [-0.3, -0.7]]
    ro = Rollouts.from_lists([None, None], [[1, 2], [1, 3]], [[5, 6, 7], [8, 9]], lp, ["stop", "stop"], [0, 0],
                             token_versions=torch.tensor([1, 2, 2, 2, 2], dtype=torch.int32))
    return ro, lp


def test_sample_staleness_is_its_oldest_token():
    ro, _ = _batch()
    beh = behaviour(ro, torch.zeros(2, 4), step=3)
    assert beh.stale.tolist() == [1, 0]     # trainer holds version 2 at step 3
    assert beh.token_stale.tolist() == [[1, 0, 0, 0], [0, 0, 0, 0]]
    torch.testing.assert_close(beh.logp, torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -0.7, 0.0, 0.0]]))


def test_decoupled_weight_on_every_token_of_a_spanning_response():
    ro, lp = _batch()
    old = torch.tensor([[-1.2, -1.9, -0.5, 0.0], [-0.3, -0.7, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    cfg = types.SimpleNamespace(algo=types.SimpleNamespace(off_policy="decoupled", tis_cap=2.0))
    w, m = off_policy_inputs(cfg, old, mask, behaviour(ro, mask, step=3))
    want0 = [min(math.exp(old[0, t].item() - lp[0][t]), 2.0) for t in range(3)]
    assert torch.allclose(w[0, :3], torch.tensor(want0), atol=1e-6) and w[0, 3] == 0
    assert w[1].tolist() == [1.0, 1.0, 0.0, 0.0]               # a fresh sample: exactly 1 on its tokens
    assert m["offpolicy/stale_frac"] == 0.5


def test_mismatch_split_per_token():
    ro, lp = _batch()
    old = torch.tensor([[-1.2, -1.9, -0.5, 0.0], [-0.3, -0.7, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    cfg = types.SimpleNamespace(rollout=types.SimpleNamespace(max_staleness=0),
                                algo=types.SimpleNamespace(correction=None, tis_cap=2.0))
    res = mismatch_inputs(cfg, old, mask, behaviour(ro, mask, step=3))
    fresh = [(old[0, 1].item(), lp[0][1]), (old[0, 2].item(), lp[0][2]), (old[1, 0].item(), lp[1][0]),
             (old[1, 1].item(), lp[1][1])]
    # token_mult_prob_error = mean exp(|train - gen|) over the fresh tokens (NeMo-RL's, algorithms/mismatch.py)
    want = sum(math.exp(abs(a - b)) for a, b in fresh) / len(fresh)
    assert abs(res["rollout/token_mult_prob_error_fresh"] - want) < 1e-6, res
    assert abs(res["rollout/token_mult_prob_error_stale"] - math.exp(abs(-1.2 + 1.0))) < 1e-6, res
