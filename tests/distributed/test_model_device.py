"""Every model the trainer builds lives on the trainer's device (``megatron_rl/runtime/device.py``).

Issue 30: the reference policy was built on the host and never moved, so its first forward on a GPU
mixed host weights with device inputs; only the distributed optimizer's buffers carried the actor
there. One worker process (``workers/model_device.py``, real megatron-core, gloo) builds the policy
with the distributed optimizer on and off (fp32 and bf16), the reference (from the HF dir and from
the actor), and the teacher's snapshot / EMA shadow weights, and lists every tensor off the device.
On this CPU machine the device is ``cpu``; ``tests/gpu/test_model_device_cuda.py`` runs the same
worker on CUDA.
"""
from __future__ import annotations

import pytest

from tests.helpers.model_device import CASES, run_worker


@pytest.fixture(scope="module")
def devices(tmp_path_factory) -> dict:
    return run_worker(tmp_path_factory.mktemp("device"), env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("case", CASES)
def test_every_tensor_is_on_the_trainer_device(case, devices):
    from megatron_rl.runtime.device import default_device

    assert devices["device"] == str(default_device()) == "cpu"
    rec = {r["case"]: r for r in devices["records"]}[case]
    assert rec["checked"] > 0
    assert rec["n_off"] == 0, rec["off_device"]
    if "use_cpu_initialization" in rec:      # the host build is the CPU path only (the GPU test asserts False)
        assert rec["use_cpu_initialization"] is True


def test_reference_forward_runs(devices):
    rec = {r["case"]: r for r in devices["records"]}["reference[load_hf]"]
    assert rec["logp_sum"] < 0
