"""LoRA on the Megatron policy at TP=2 (torchrun, gloo, 2 processes) against ``peft`` + ``transformers``,
with and without sequence parallelism: the adapters sharded as the base (column B by rows, row A by columns),
the adapters' gradients summed over TP ranks where their factor is replicated, the row adapters reduced
with the base's partial product. Same oracle and tolerances as ``tests/unit/models/test_lora_peft.py``
(``tests/helpers/lora_oracle.py``); the PEFT export gathered over TP must equal PEFT's tensors bit for bit.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from tests.helpers import lora_oracle as L


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    return L.make_oracle(tmp_path_factory.mktemp("lora_tp2"))


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_tp2_equals_peft(oracle, sp, tmp_path):
    from safetensors.torch import load_file

    res = L.run_worker(oracle, tmp_path, tp=2, sp=sp, nproc=2)
    ref = oracle["ref"]
    assert (res["logits"] - ref["logits"]).abs().max() <= L.logits_atol(ref["logits"])
    assert (res["base"] - ref["base"]).abs().max() <= L.logits_atol(ref["base"])
    assert sorted(res["grads"]) == sorted(ref["grads"]) and res["frozen_grads"] == []
    for k, g in ref["grads"].items():
        assert (res["grads"][k] - g).abs().max() <= L.grad_rtol() * g.abs().max(), k
    got, want = load_file(str(tmp_path / "peft" / "adapter_model.safetensors")), load_file(
        str(oracle["peft"] / "adapter_model.safetensors"))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    merged = L.hf_logits(tmp_path / "merged", ref["ids"])
    assert (merged - ref["logits"]).abs().max() <= L.logits_atol(ref["logits"])
