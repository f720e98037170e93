"""``trainer.deterministic`` (``runtime/determinism.py``): each library's own switch is set, in a fresh
process (the switches are process-wide: torch's deterministic algorithms would leak into other tests).
The end-to-end claim — two CPU runs give identical metrics and weights — is measured in the issue-42
note (docs/architecture.md, "Determinism"); the refusal of context parallelism is in
``tests/unit/test_bad_inputs.py``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from megatron_rl.runtime import determinism as D
from tests.helpers.dist import repo_env

CODE = """
import json, os, random
import numpy as np, torch
from megatron_rl.runtime import determinism as D
env = D.set_environment(gpu=True)      # the GPU switches are environment only: settable on CPU too
D.apply(7)
a = (random.random(), float(np.random.rand()), float(torch.rand(())))
D.apply(7)
b = (random.random(), float(np.random.rand()), float(torch.rand(())))
print(json.dumps({"env": {k: os.environ[k] for k in env}, "det": torch.are_deterministic_algorithms_enabled(),
                  "fill": torch.utils.deterministic.fill_uninitialized_memory,
                  "cudnn": [torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark],
                  "tf32": torch.backends.cuda.matmul.allow_tf32, "same_draws": a == b,
                  "engine_cpu": D.engine_env(False), "engine_gpu": D.engine_env(True),
                  "megatron": D.megatron_overrides(True), "off": D.megatron_overrides(False)}))
"""


def _switches() -> dict:
    return json.loads(subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                                     env=repo_env()).stdout.strip().splitlines()[-1])


def test_switches_are_set_and_seeds_repeat():
    out = _switches()
    assert out["env"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
                          "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert out["det"] and out["cudnn"] == [True, False] and out["tf32"] is False and out["same_draws"]
    assert "VLLM_BATCH_INVARIANT" not in out["engine_cpu"] and out["engine_gpu"]["VLLM_BATCH_INVARIANT"] == "1"
    assert out["megatron"] == {"deterministic_mode": True} and out["off"] == {}


def test_apply_turns_deterministic_algorithms_on_and_the_nan_fill_off():
    """Review row S5: ``use_deterministic_algorithms(True)`` turns torch's NaN fill of every uninitialised
    allocation on; ``apply`` turns it off again (run-to-run equality is the goal, not a memset per buffer)
    and leaves deterministic algorithms on."""
    out = _switches()
    assert out["det"] is True and out["fill"] is False


@pytest.mark.parametrize("version,refused", [((2, 29, 6), True), ((2, 29, 7), False), ((2, 30, 0), False),
                                             ((2, 18, 1, "+cuda12.2"), True), (None, False)])
def test_nccl_refusal_below_2_29_7(version, refused):
    """Review row W2: deterministic + the nccl weight sync on NCCL < 2.29.7 is refused in one line naming the
    version found, the minimum and the fixes; 2.29.7 and later, no CUDA (None), another sync backend or the
    switch off: no refusal."""
    why = D.nccl_refusal(True, "nccl", version)
    assert bool(why) is refused and "\n" not in why
    if refused:
        assert f"NCCL {'.'.join(map(str, version[:3]))}" in why and ">= 2.29.7" in why
        assert "rollout.sync_backend=ray" in why and "upgrade NCCL" in why
    assert D.nccl_refusal(False, "nccl", version) == "" and D.nccl_refusal(True, "ray", version) == ""
    assert D.nccl_refusal(True, "gloo", version) == ""


def test_nccl_version_is_none_without_cuda():
    """The version is read only where CUDA is present (this host has none): no refusal on CPU."""
    from megatron_rl.runtime.device import has_cuda

    assert has_cuda() or D.nccl_version() is None
