"""``model.backend`` / ``model.fp8`` reach the model builder (issue 10: they were validated, then the
actor built its defaults). On this CPU machine: ``local`` and ``auto`` build megatron's local
(torch) layers and resolve to ``local``; ``te`` and ``fp8`` fail at build time with the start-up
message (``preflight`` gives the same one before anything starts). CUDA: ``tests/gpu/``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).parent / "workers"
LOCAL = {"linear_qkv": "ColumnParallelLinear", "linear_fc1": "ColumnParallelLinear",
         "core_attention": "DotProductAttention"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU expectations; CUDA: tests/gpu/test_actor_cuda.py")
def test_backend_settings_build_the_named_layers(tmp_path):
    from tests.helpers.actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "hf")
    torchrun(WORKERS / "actor_backend.py", hf, tmp_path / "out.json", nproc=1, timeout=300)
    rec = json.loads((tmp_path / "out.json").read_text())
    for s in ("local", "auto"):
        assert rec[s]["backend"] == "local" and {k: rec[s][k] for k in LOCAL} == LOCAL, rec[s]
        assert rec[s]["logp_after"] != rec[s]["logp_before"]       # the built model trains
    assert rec["local"]["logp_before"] == rec["auto"]["logp_before"]
    assert rec["te"]["error"].startswith("model.backend=te needs a CUDA GPU with Transformer Engine")
    for s in ("auto:e4m3", "local:e4m3"):
        assert rec[s]["error"].startswith("model.fp8=e4m3 needs the Transformer Engine backend"), rec[s]
