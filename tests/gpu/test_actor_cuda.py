"""The actor on CUDA (skipped without a GPU: ``requires_gpus`` marker of tests/conftest.py).

Builds the policy on one GPU with the local layer spec, and with the Transformer Engine spec (bf16,
and fp8 e4m3) where Transformer Engine is installed; runs one train step; compares the log-probs of
a fixed batch with the CPU build of the same weights (same worker, ``CUDA_VISIBLE_DEVICES=""``).
Not run on the development machine (CPU only); docs/gpu-status.md.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.stack_probe import TE, needs
from tests.helpers.dist import torchrun

WORKERS = Path(__file__).resolve().parents[1] / "distributed" / "workers"


def _run(tmp_path: Path, settings: str, cpu: bool) -> dict:
    from tests.helpers.actor_common import make_tiny_hf

    hf = tmp_path / "hf"
    if not hf.exists():
        make_tiny_hf(hf)
    out = tmp_path / f"{'cpu' if cpu else 'cuda'}_{settings.replace(',', '_').replace(':', '-')}.json"
    torchrun(WORKERS / "actor_backend.py", hf, out, settings, nproc=1, timeout=600,
             env={"CUDA_VISIBLE_DEVICES": ""} if cpu else None)
    return json.loads(out.read_text())


def _close(a: list, b: list, tol: float) -> float:
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert len(a) == len(b) and worst <= tol, f"max |dlogp| {worst} > {tol}"
    return worst


@pytest.mark.requires_gpus(1)
def test_local_spec_on_cuda_matches_cpu(tmp_path):
    cuda = _run(tmp_path, "local", cpu=False)["local"]
    cpu = _run(tmp_path, "local", cpu=True)["local"]
    assert cuda["backend"] == "local" and cuda["linear_qkv"] == "ColumnParallelLinear"
    _close(cuda["logp_before"], cpu["logp_before"], 1e-3)     # fp32; TF32 matmuls allowed
    _close(cuda["logp_after"], cpu["logp_after"], 5e-3)


@pytest.mark.requires_gpus(1)
@needs(TE)
def test_te_spec_and_fp8_on_cuda(tmp_path):
    rec = _run(tmp_path, "te,auto,te:e4m3", cpu=False)
    cpu = _run(tmp_path, "local", cpu=True)["local"]
    for s in ("te", "auto", "te:e4m3"):
        assert rec[s].get("backend") == "te", rec[s]
        assert rec[s]["linear_qkv"].startswith("TE"), rec[s]          # e.g. TELayerNormColumnParallelLinear
        _close(rec[s]["logp_before"], cpu["logp_before"], 0.05 if s == "te" else 0.5)
