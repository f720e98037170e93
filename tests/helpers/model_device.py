"""The model-device worker (``tests/distributed/workers/model_device.py``) run from a test: on the CPU in
``tests/distributed/test_model_device.py``, on CUDA in ``tests/gpu/test_model_device_cuda.py``."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.actor_common import make_tiny_hf
from tests.helpers.dist import torchrun

WORKERS = Path(__file__).resolve().parents[1] / "distributed" / "workers"
CASES = ["actor[distopt=1,bf16=0]", "actor[distopt=1,bf16=1]", "actor[distopt=0,bf16=0]", "actor[distopt=0,bf16=1]",
         "reference[load_hf]", "reference[from_actor,bf16]", "teacher[snapshot]", "teacher[ema]"]


def run_worker(tmp: Path, env: dict | None = None) -> dict:
    hf = make_tiny_hf(tmp / "hf")
    out = tmp / "devices.json"
    torchrun(WORKERS / "model_device.py", hf, out, nproc=1, timeout=600, env=env)
    return json.loads(out.read_text())
