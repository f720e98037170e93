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


ACTOR_CASES = {"tp2_packed": "2:1:packed:none", "pp2_recompute": "1:2:padded:full", "dp2_packed": "1:1:packed:none"}
ADAPTED = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def actor_runs(tmp_path_factory):
    import json

    from tests.helpers.actor_common import make_tiny_hf
    from tests.helpers.dist import torchrun

    root = tmp_path_factory.mktemp("lora_actor")
    hf = make_tiny_hf(root / "hf")
    torchrun(L.REPO / "tests" / "distributed" / "workers" / "lora_actor.py", str(hf), str(root),
             *(f"{k}:{v}" for k, v in ACTOR_CASES.items()), nproc=2, timeout=900)
    return {k: json.loads((root / f"{k}.json").read_text()) for k in ACTOR_CASES}


@pytest.mark.parametrize("case", list(ACTOR_CASES))
def test_lora_actor_trains_adapters_only_and_resumes_exactly(actor_runs, case):
    """TP=2 / PP=2 (full recompute) / DP=2, packed or padded micro-batches, distributed optimizer: the base stays
    bit for bit, the adapters move, the optimizer holds the adapters only, the adapter-off reference is the base
    bit for bit, the merged weights are pushed for exactly the adapted projections, and a checkpoint resumes the
    next step exactly."""
    r = actor_runs[case]
    assert r["optimizer_params_local"] * r["dp"] == r["adapter_params_local"] > 0   # distributed optimizer: a 1/DP share
    assert r["base_unchanged"] and r["adapters_moved"]
    assert r["off_equals_base"] and r["on_minus_base"] > 1e-4
    assert {n.split(".")[-2] for n in r["merged_differs"]} == set(ADAPTED)
    assert len(r["merged_differs"]) == 2 * len(ADAPTED)
    assert r["resumed_step2"] == r["step2"]
