"""The engine registry, strict at both ends, and a new engine as one module plus its registration:
``tests/unit/workers/toy_engine.py``, copied outside the repository and loaded through ``plugins:``
(the command of docs/contributing.md, "Adding a rollout engine"), drives a ``megatron-rl train`` step
and receives the trainer's weights through the transport its class declares (``ray``), with no vLLM
imported on the trainer's driver."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_rl.rollout import EngineCaps, engine_class, register_engine
from megatron_rl.rollout.registry import engine_names
from megatron_rl.rollout.transport import (
    TRANSPORTS,
    backend_names,
    register_transport,
    resolve_backend,
)

ROOT = Path(__file__).resolve().parents[3]


def test_registry_is_strict_at_both_ends():
    with pytest.raises(ValueError, match=r"rollout engine 'vllm' is already registered \(by VLLMEngine\)"):
        register_engine("vllm")(type("Again", (), {"CAPS": EngineCaps(transports={"ray": "x"})}))
    with pytest.raises(ValueError, match=r"unknown engine 'sglang'; registered: hf, vllm"):
        engine_class("sglang")
    with pytest.raises(TypeError, match="CAPS must be an EngineCaps"):
        register_engine("no_caps")(type("NoCaps", (), {}))
    with pytest.raises(ValueError, match="at least one weight transport"):
        EngineCaps(transports={})
    with pytest.raises(ValueError, match="sleep must be one of always|cuda|never"):
        EngineCaps(transports={"ray": "x"}, sleep="sometimes")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['kv_cache'\]"):
        EngineCaps(transports={"ray": "x"}, options=frozenset({"kv_cache"}))
    assert engine_names() == sorted(engine_names()) and {"hf", "vllm"} <= set(engine_names())
    assert "no_caps" not in engine_names()   # a refused registration leaves nothing behind


def test_transport_is_chosen_from_the_engine_class():
    """auto takes the first transport of the machine's preference the class accepts; a transport the
    class does not declare is refused naming what it accepts."""
    assert engine_class("hf").CAPS.transports.keys() == {"ray"}
    assert [resolve_backend("auto", "vllm", cuda, w, p) for cuda, w, p in
            [(False, 1, None), (True, 1, "separate"), (True, 1, "colocated"), (True, 2, "colocated")]] == \
        ["gloo", "nccl", "ipc", "ray"]
    assert resolve_backend("auto", "hf", True, 1, "colocated") == "ray"
    with pytest.raises(ValueError, match=r"rollout.sync_backend=nccl: the hf engine accepts only ray \(or auto\)"):
        resolve_backend("nccl", "hf", True, 1, "separate")
    with pytest.raises(ValueError, match="weight transport 'ray' is already registered"):
        register_transport(TRANSPORTS["ray"])
    assert backend_names() == ("auto", "ray", "gloo", "nccl", "ipc")


def _doc_train_args() -> list[str]:
    """The ``train`` arguments of the plugin-engine command in docs/contributing.md."""
    text = (ROOT / "docs/contributing.md").read_text()
    block = re.search(r"```bash\n(PYTHONPATH=\S+ megatron-rl train [^`]*?plugins=\[toy_engine\][^`]*?)\n```", text).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    return argv[argv.index("train") + 1:]


def test_plugin_engine_trains_one_step_and_holds_the_pushed_weights(tmp_path):
    from safetensors.torch import load_file

    from megatron_rl.cli.demo import prepare

    plug, out = tmp_path / "plug", tmp_path / "engine_out"
    plug.mkdir()
    out.mkdir()
    shutil.copy(ROOT / "tests/unit/workers/toy_engine.py", plug / "toy_engine.py")   # outside the repository
    paths, _, hf = prepare(tmp_path / "assets", seed=0)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(plug)]), "TOY_ENGINE_OUT": str(out),
           "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline"}
    p = subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", *_doc_train_args(), f"model.hf_path={hf}",
                        f"data.train={paths['train']}", "data.val=", f"trainer.run_dir={run_dir}", "trainer.steps=1",
                        "trainer.ckpt_every=0", "data.prompts_per_step=4", "rollout.n=4", "trainer.micro_batch_size=16",
                        "optim.weight_decay=0.1", "logging.progress=false", "logging.wandb_mode=disabled"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["memory/gpu_peak_allocated_gib"] == rows[0]["memory/gpu_peak_reserved_gib"] == 0.0   # no CUDA here
    # the start-up push, then step 1's (verified bit for bit by rollout.verify_sync=first, or the run stops)
    assert sorted(f.name for f in out.glob("push_*.safetensors")) == ["push_1.safetensors", "push_2.safetensors"]
    initial, first, last = load_file(str(hf / "model.safetensors")), load_file(str(out / "push_1.safetensors")), \
        load_file(str(out / "push_2.safetensors"))
    trained = load_file(str(run_dir / "hf" / "model.safetensors"))   # the trainer's own export after step 1
    assert first.keys() == last.keys() and first.keys() <= trained.keys()
    assert all(torch.equal(first[k], initial[k]) for k in first)   # step 0's weights = the model dir's
    assert all(torch.equal(last[k], trained[k]) for k in last)     # the engine holds the trainer's step-1 weights
    assert sum(not torch.equal(first[k], last[k]) for k in first) >= len(first) // 2   # weight decay moved them
    reports = [json.loads(f.read_text()) for f in out.glob("modules_*.json")]
    driver = [r for r in reports if "train" in r["argv"]]
    assert len(driver) == 1 and driver[0]["vllm"] is False, reports   # the driver imported no engine library
