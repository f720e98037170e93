"""LoRA on the Megatron policy against ``peft`` + ``transformers`` (the oracle nobody here wrote), at TP=1.

A random PEFT adapter (A and B random: the adapters move the logits by O(1)) on a tiny random Qwen3 (GQA 4/2,
q/k norms, untied head) is loaded into Megatron's fused linears (``models/lora.py``) and must give PEFT's
logits, PEFT's base logits with the adapters off (the KL reference without a second model), and PEFT's adapter
gradients; the PEFT export must load in PEFT with the same logits and the same tensors bit for bit, and the
merged HF export (W + s·B·A) must give them without PEFT. Tolerances: ``tests/helpers/lora_oracle.py`` (fp32
reduction-order bounds). The Megatron side runs in a subprocess (megatron's global parallel state stays out
of the test process); TP=2 with and without sequence parallelism: ``tests/distributed/test_lora.py``.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from tests.helpers import lora_oracle as L


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    oracle = L.make_oracle(root)
    return oracle, L.run_worker(oracle, root / "tp1", tp=1), root / "tp1"


def test_logits_equal_peft(tp1):
    oracle, res, _ = tp1
    ref = oracle["ref"]
    assert (ref["logits"] - ref["base"]).abs().max() > 1.0          # the adapters matter
    assert (res["logits"] - ref["logits"]).abs().max() <= L.logits_atol(ref["logits"])


def test_adapters_off_give_the_base(tp1):
    oracle, res, _ = tp1
    assert (res["base"] - oracle["ref"]["base"]).abs().max() <= L.logits_atol(oracle["ref"]["base"])


def test_only_adapters_train_and_their_grads_equal_peft(tp1):
    oracle, res, _ = tp1
    grads = oracle["ref"]["grads"]
    assert res["frozen_grads"] == []
    assert sorted(res["grads"]) == sorted(grads) and len(grads) == 2 * 7 * L.LAYERS
    assert res["trainable"] == sum(g.numel() for g in grads.values())
    for k, g in grads.items():
        assert (res["grads"][k] - g).abs().max() <= L.grad_rtol() * g.abs().max(), k


def test_peft_export_loads_in_peft(tp1):
    from safetensors.torch import load_file

    oracle, _, out = tp1
    got, want = load_file(str(out / "peft" / "adapter_model.safetensors")), load_file(
        str(oracle["peft"] / "adapter_model.safetensors"))
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    conf = L.adapter_config(out / "peft")
    assert (conf["r"], conf["lora_alpha"], sorted(conf["target_modules"])) == (L.RANK, L.ALPHA, sorted(L.TARGETS))
    logits = L.peft_logits(oracle["hf"], out / "peft", oracle["ref"]["ids"])
    assert (logits - oracle["ref"]["logits"]).abs().max() <= L.logits_atol(oracle["ref"]["logits"])


def test_merged_export_gives_the_adapted_logits(tp1):
    oracle, _, out = tp1
    logits = L.hf_logits(out / "merged", oracle["ref"]["ids"])
    assert (logits - oracle["ref"]["logits"]).abs().max() <= L.logits_atol(oracle["ref"]["logits"])
