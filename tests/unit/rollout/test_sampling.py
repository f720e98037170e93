"""Truncated sampling (temperature, min-p, top-k, top-p) on the HF engine, against closed forms on a
fixed distribution, and which log-prob the engine reports (``rollout/hf_sampler.py``). The vLLM side of
the same checks runs on the engines of ``tests/e2e/test_rollout_vllm.py``."""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms.sampling import processed_logits
from megatron_rl.rollout.engine import SamplingParams

# probabilities 0.5, 0.25, 0.15, 0.06, 0.04 (logits = log p, temperature 1)
P = torch.tensor([0.5, 0.25, 0.15, 0.06, 0.04])
Z = P.log()


def _kept(z: torch.Tensor) -> set[int]:
    return {i for i, v in enumerate(z.tolist()) if v != float("-inf")}


@pytest.mark.parametrize(("kw", "kept"), [
    pytest.param({"top_k": 2}, {0, 1}, id="top_k=2-two-most-likely"),
    pytest.param({"top_k": 1}, {0}, id="top_k=1-argmax"),
    # ascending cumulative mass: .04, .10, .25, .50, 1.0; drop where <= 1 - p
    pytest.param({"top_p": 0.7}, {0, 1}, id="top_p=0.7-needs-0.5+0.25"),
    pytest.param({"top_p": 0.75}, {0, 1}, id="top_p=0.75-exactly-reached"),
    pytest.param({"top_p": 0.76}, {0, 1, 2}, id="top_p=0.76-one-more"),
    pytest.param({"top_p": 0.3}, {0}, id="top_p=0.3-top-token-only"),
    pytest.param({"top_p": 0.95}, {0, 1, 2, 3}, id="top_p=0.95"),
    # min-p: keep p_i >= 0.25 * 0.5 = 0.125 (0.3 would put 0.15 on the boundary, decided by fp32 rounding)
    pytest.param({"min_p": 0.25}, {0, 1, 2}, id="min_p=0.25"),
    # top-p is taken over the top-k-renormalized distribution: {.5,.25,.15}/.9 -> cum .167,.444,1
    pytest.param({"top_k": 3, "top_p": 0.8}, {0, 1}, id="top_k=3-then-top_p=0.8"),
    pytest.param({}, {0, 1, 2, 3, 4}, id="off"),
])
def test_truncation_keeps_the_specified_set(kw, kept):
    z = processed_logits(Z, 1.0, **kw)
    assert _kept(z) == kept
    renorm = P[sorted(kept)] / P[sorted(kept)].sum()
    torch.testing.assert_close(z.log_softmax(-1)[sorted(kept)], renorm.log())


def test_temperature_comes_before_truncation():
    # at T=0.5 the probabilities become p^2 / sum p^2: .6897, .1724, .0621, ... -> top_p 0.8 keeps two
    assert _kept(processed_logits(Z, 0.5, top_p=0.8)) == {0, 1}
    assert _kept(processed_logits(Z, 1.0, top_p=0.8)) == {0, 1, 2}


def test_bad_settings_fail_clearly():
    for kw, words in (({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p")):
        with pytest.raises(ValueError, match=words):
            SamplingParams(**kw)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from tests.helpers.tiny_model import save_tiny_qwen3

    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny_hf_sampling"))


PROMPT = [1, 5, 6, 7]


def _first_token_dist(eng, prompt):
    with torch.no_grad():
        return eng.model(torch.tensor([prompt])).logits[0, -1].float()


@pytest.mark.parametrize("mode", ["processed", "full"])
def test_hf_engine_samples_the_truncated_distribution(tiny_hf, mode):
    """top_k=2: only the two most likely first tokens appear; top_p: only the nucleus; the reported
    log-prob is that of the renormalized truncated distribution (processed) or of the full softmax
    at T (full)."""
    from megatron_rl.rollout.hf_engine import HFEngine

    eng = HFEngine(str(tiny_hf), logprobs=mode)
    z = _first_token_dist(eng, PROMPT)
    full = (z / 0.8).log_softmax(-1)
    top2 = set(full.topk(2).indices.tolist())
    comps = eng.generate([PROMPT], SamplingParams(n=24, temperature=0.8, top_k=2, max_tokens=1, seed=3))
    firsts = [c.response_ids[0] for c in comps]
    assert set(firsts) <= top2 and len(set(firsts)) == 2, (firsts, top2)
    for c in comps:
        t = c.response_ids[0]
        want = full[t] - torch.logsumexp(full[sorted(top2)], 0) if mode == "processed" else full[t]
        assert math.isclose(c.logprobs[0], float(want), abs_tol=1e-5)
    # top_p just under the mass of the 3 most likely tokens (above that of 2): exactly those 3 are kept
    order = full.exp().sort(descending=True)
    p3 = float(order.values[:3].sum()) - 1e-4
    assert p3 > float(order.values[:2].sum())
    comps = eng.generate([PROMPT], SamplingParams(n=40, temperature=0.8, top_p=p3, max_tokens=1, seed=4))
    assert {c.response_ids[0] for c in comps} == set(order.indices[:3].tolist())
